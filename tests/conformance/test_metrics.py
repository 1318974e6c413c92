"""SPEC §15 metrics, on both engines: the collector's gauges against real rows in every
state (with the injected clock and the database's), the worker's outcome counters and
histograms after jobs that ack, retry, go dead and lose their claim, ``alkstore worker
--metrics-port`` serving them from a subprocess, and ``prometheus_client`` staying an
optional extra (never imported by ``import alkstore_sa``; a clear error without it).

Worker metrics live in ``prometheus_client``'s default registry for the whole process, so
each test reads only its own queue's series (queue names are unique per test)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import alkstore_sa as alk
from alkstore_sa._gauges import QueueGauges, read_gauges
from tests.conformance.test_worker import running
from tests.support import IN_CI, WAIT, FakeClock, Target, wait_for

try:
    import prometheus_client
except ImportError:
    if IN_CI:
        raise
    pytest.skip(
        "prometheus_client is not installed (it is in the dev extra: pip install -e '.[dev]')",
        allow_module_level=True,
    )

from alkstore_sa import metrics

ALKSTORE = Path(sys.executable).with_name("alkstore")
STARTUP = 60.0  # a fresh interpreter imports SQLAlchemy (and psycopg) first


def sample(name: str, registry: object = None, **labels: str) -> float | None:
    reg = prometheus_client.REGISTRY if registry is None else registry
    return reg.get_sample_value(name, labels)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def instrumented() -> Iterator[None]:
    metrics.instrument()
    try:
        yield
    finally:
        metrics.uninstrument()


# -- gauges ------------------------------------------------------------------------------------


def _seed(store: alk.Store, qname: str, clock: FakeClock) -> float:
    """Rows in every state, some of them expired but not swept; returns the enqueue time of
    the oldest ready job that is not expired."""
    q = store.queue(qname, max_attempts=3)
    q.enqueue("expired-ready", expires=5)  # older than every ready job: must not count
    q.enqueue_many(["p1", "p2", "f"], priority=5)
    claimed = q.claim_batch("w", 3)  # the priority-5 jobs
    assert sorted(h.job.payload for h in claimed) == ["f", "p1", "p2"]
    assert next(h for h in claimed if h.job.payload == "f").fail("broken") is True
    clock.advance(10)
    oldest = clock()
    q.enqueue("a")
    clock.advance(5)
    q.enqueue_many(["b", "c"])
    q.enqueue_many(["d", "e"], delay=1000)
    q.enqueue("expired-scheduled", delay=1000, expires=20)
    clock.advance(25)  # both expiries passed; no sweep ran
    return oldest


def test_gauges_count_every_state_and_leave_unswept_expired_jobs_out(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    oldest = _seed(store, qname, clock)
    other = store.queue(qname + "-later")
    other.enqueue("later", delay=60)

    gauges = read_gauges(store)
    assert gauges[qname] == QueueGauges(
        ready=3, scheduled=2, processing=2, dead=1, oldest_ready_age=clock() - oldest
    )
    assert gauges[qname].oldest_ready_age == 30.0
    assert gauges[qname + "-later"] == QueueGauges(scheduled=1)  # nothing ready: age 0

    # the sweep moves the two expired jobs to dead; ready and scheduled do not change
    assert store.queue(qname).sweep_expired().expired == 2
    assert read_gauges(store)[qname] == QueueGauges(3, 2, 2, 3, 30.0)

    # time moves: the scheduled jobs come due, the age grows
    clock.advance(1000)
    assert read_gauges(store)[qname] == QueueGauges(5, 0, 2, 3, 1030.0)


def test_collector_exports_the_gauges_and_keeps_a_drained_queue_at_zero(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    oldest = _seed(store, qname, clock)
    registry = prometheus_client.CollectorRegistry()
    registry.register(metrics.Collector(store))

    def jobs(state: str) -> float | None:
        return sample("alkstore_jobs", registry, queue=qname, state=state)

    assert [jobs(s) for s in ("ready", "scheduled", "processing", "dead")] == [3, 2, 2, 1]
    age = sample("alkstore_oldest_ready_age_seconds", registry, queue=qname)
    assert age == clock() - oldest == 30.0

    # a queue whose last job is gone stays in the scrape, at zero
    drained = store.queue(qname + "-drained")
    drained.enqueue("only")
    clock.advance(4)
    assert sample("alkstore_jobs", registry, queue=drained.name, state="ready") == 1
    assert sample("alkstore_oldest_ready_age_seconds", registry, queue=drained.name) == 4.0
    h = drained.claim_one("w")
    assert h is not None and h.ack() is True
    assert drained.name not in read_gauges(store)
    for state in ("ready", "scheduled", "processing", "dead"):
        assert sample("alkstore_jobs", registry, queue=drained.name, state=state) == 0
    assert sample("alkstore_oldest_ready_age_seconds", registry, queue=drained.name) == 0


def test_gauges_on_the_database_clock(dbstore: alk.Store, qname: str) -> None:
    q = dbstore.queue(qname)
    q.enqueue("ready")
    q.enqueue("later", delay=3600)
    g = read_gauges(dbstore)[qname]
    assert (g.ready, g.scheduled, g.processing, g.dead) == (1, 1, 0, 0)
    assert g.oldest_ready_age >= 0.0


def test_collector_registers_without_reading_the_database(store: alk.Store) -> None:
    """``register`` asks ``describe()`` for the names: a closed store is not touched."""
    store.close()
    registry = prometheus_client.CollectorRegistry()
    registry.register(metrics.Collector(store))  # no StoreClosed here
    text = prometheus_client.generate_latest(registry).decode()
    # a scrape that cannot read the database still answers, without the gauge samples
    assert "# TYPE alkstore_jobs gauge" in text and "alkstore_jobs{" not in text


def test_sqlite_gauges_plan_reads_index_entries_only(sqlite_db: Target, clock: FakeClock) -> None:
    """The pending index is walked once; the unswept set is read once through the expiry
    index (never a lookup of each pending job's row); the other counts are index scans. (The
    PostgreSQL plan and the cost at 1M rows on both engines: docs/operations.md.)"""
    store = sqlite_db.store(clock=clock)
    try:
        q = store.queue("plan")
        q.enqueue_many(list(range(20)), expires=5)
        q.enqueue_many(list(range(20)))
        assert q.claim_one("w") is not None
        clock.advance(10)
        read_gauges(store)  # compiles "gauges"
        sql = store.backend._sql["gauges"]
    finally:
        store.close()
    with sqlite_db.engine.connect() as c:
        plan = [row[3] for row in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, {"now": clock()})]
    text = "\n".join(plan)
    assert "SCAN main.alkstore_jobs USING INDEX alkstore_jobs_pending_ix" in plan, text
    assert "MATERIALIZE unswept" in plan, text
    # a skip-scan of the expiry range once the tables are ANALYZEd, a walk of its entries before
    assert any(p.endswith("main.alkstore_jobs USING INDEX alkstore_jobs_expires_ix") or
               "USING INDEX alkstore_jobs_expires_ix (" in p for p in plan), text
    assert "SCAN main.alkstore_jobs USING INDEX alkstore_jobs_processing_ix" in plan, text
    assert "SCAN main.alkstore_dead_jobs USING COVERING INDEX alkstore_dead_jobs_queue_ix" in plan, text
    assert not any("PRIMARY KEY" in p for p in plan), text  # no row read per pending job
    assert not any(p in ("SCAN main.alkstore_jobs", "SCAN main.alkstore_dead_jobs") for p in plan), text


# -- worker outcomes ---------------------------------------------------------------------------


def _handler(q: alk.Queue) -> object:
    def handle(job: alk.Job) -> None:
        do = job.payload
        if do == "ack":
            time.sleep(0.05)
            return
        if do in ("raise", "raise-last"):
            raise RuntimeError("upstream down")
        if do == "fail":
            raise alk.Fail("bad input")
        if do == "lose":
            assert q.cancel(job.id) is True  # the claim is gone under the handler
            return
        raise AssertionError(do)

    return handle


def test_worker_records_outcomes_durations_and_waits(
    store: alk.Store, qname: str, clock: FakeClock, instrumented: None
) -> None:
    q = store.queue(qname, max_attempts=3)
    for do in ("ack", "raise", "fail", "lose"):
        q.enqueue(do)
    q.enqueue("raise-last", max_attempts=1)  # a retry at the budget goes dead
    clock.advance(7)  # every job waited 7 s (the fake clock stands still from here)
    w = alk.Worker(store, q, _handler(q), concurrency=5, poll_interval=0.2)

    def processed(outcome: str) -> float:
        return sample("alkstore_jobs_processed_total", queue=qname, outcome=outcome) or 0.0

    with running(w) as r:
        wait_for(lambda: sum(processed(o) for o in metrics.OUTCOMES) == 5, "five recorded outcomes")
        r.stop_and_join()

    assert {o: processed(o) for o in metrics.OUTCOMES} == {"acked": 1, "retried": 1, "dead": 2, "lost": 1}
    assert sample("alkstore_job_duration_seconds_count", queue=qname) == 5
    assert sample("alkstore_job_duration_seconds_sum", queue=qname) >= 0.05  # the ack slept
    assert sample("alkstore_job_wait_seconds_count", queue=qname) == 5
    assert sample("alkstore_job_wait_seconds_sum", queue=qname) == 35.0
    assert sample("alkstore_job_wait_seconds_bucket", queue=qname, le="5.0") == 0
    assert sample("alkstore_job_wait_seconds_bucket", queue=qname, le="10.0") == 5
    # what the database says agrees
    g = read_gauges(store)[qname]
    assert (g.scheduled, g.processing, g.dead) == (1, 0, 2)


def test_async_handlers_are_timed_too(store: alk.Store, qname: str, instrumented: None) -> None:
    q = store.queue(qname)
    q.enqueue_many([1, 2])

    async def handle(job: alk.Job) -> None:
        return None

    w = alk.Worker(store, q, handle, concurrency=2, poll_interval=0.2)
    with running(w) as r:
        wait_for(lambda: sample("alkstore_jobs_processed_total", queue=qname, outcome="acked") == 2, "two acks")
        r.stop_and_join()
    assert sample("alkstore_job_duration_seconds_count", queue=qname) == 2


def test_an_uninstrumented_worker_records_nothing(store: alk.Store, qname: str) -> None:
    metrics.uninstrument()
    q = store.queue(qname)
    q.enqueue("ack")
    w = alk.Worker(store, q, lambda job: None, concurrency=1, poll_interval=0.2)
    with running(w) as r:
        wait_for(lambda: q.stats().pending == 0 and q.stats().processing == 0, "the job acked")
        r.stop_and_join()
    assert sample("alkstore_jobs_processed_total", queue=qname, outcome="acked") is None
    assert sample("alkstore_job_wait_seconds_count", queue=qname) is None


# -- the CLI -----------------------------------------------------------------------------------

HANDLERS = textwrap.dedent(
    """
    def handle(job):
        if job.payload == "fail":
            import alkstore_sa
            raise alkstore_sa.Fail("no")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _db_args(db: Target) -> list[str]:
    return ["--url", db.url, "--schema", db.schema]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env.update(extra)
    return env


def _scrape(port: int, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()  # type: ignore[no-any-return]
        except OSError:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the worker exited ({proc.returncode}):\n{out}\n{err}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_cli_worker_serves_metrics(db: Target, dbstore: alk.Store, qname: str, tmp_path: Path) -> None:
    (tmp_path / "metrics_cli_jobs.py").write_text(HANDLERS)
    q = dbstore.queue(qname)
    q.enqueue_many(["ok", "ok", "fail"])
    q.enqueue("later", delay=3600)
    port = _free_port()
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "metrics_cli_jobs:handle", "--queue", qname, "--metrics-port", str(port),
         "--poll-interval", "0.5", *_db_args(db)],
        cwd=tmp_path, env=_env(PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: q.stats().ready == 0 and q.stats().processing == 0 and q.stats().dead == 1,
                 "the worker to handle the three due jobs", timeout=STARTUP)

        def scraped() -> str | None:
            text = _scrape(port, proc)
            done = f'alkstore_jobs_processed_total{{outcome="dead",queue="{qname}"}} 1.0'
            return text if done in text else None

        text = wait_for(scraped, "the dead outcome in the scrape")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/metrics" in out
    for line in (
        f'alkstore_jobs_processed_total{{outcome="acked",queue="{qname}"}} 2.0',
        f'alkstore_jobs{{queue="{qname}",state="ready"}} 0.0',
        f'alkstore_jobs{{queue="{qname}",state="scheduled"}} 1.0',
        f'alkstore_jobs{{queue="{qname}",state="processing"}} 0.0',
        f'alkstore_jobs{{queue="{qname}",state="dead"}} 1.0',
        f'alkstore_oldest_ready_age_seconds{{queue="{qname}"}} 0.0',
        f'alkstore_job_duration_seconds_count{{queue="{qname}"}} 3.0',
        f'alkstore_job_wait_seconds_count{{queue="{qname}"}} 3.0',
    ):
        assert line in text, f"{line!r} not in the scrape:\n{text}"


# -- the optional extra ------------------------------------------------------------------------


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=STARTUP, env=_env(**env),
    )


def test_importing_alkstore_sa_does_not_import_prometheus_client() -> None:
    res = _python(
        "import sys, alkstore_sa, alkstore_sa.worker, alkstore_sa.cli, alkstore_sa.cli.worker;"
        "print('prometheus_client' in sys.modules, 'alkstore_sa.metrics' in sys.modules)"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False"]


@pytest.fixture
def without_prometheus(tmp_path: Path) -> str:
    """A PYTHONPATH whose ``prometheus_client`` cannot be imported (as if not installed)."""
    shadow = tmp_path / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('prometheus_client is not installed')\n")
    return str(shadow.parent)


def test_metrics_without_the_extra_is_an_import_error_naming_it(without_prometheus: str) -> None:
    res = _python(
        "import alkstore_sa\n"
        "try:\n"
        "    import alkstore_sa.metrics\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, isinstance(exc, alkstore_sa.AlkstoreError), exc)\n",
        PYTHONPATH=without_prometheus,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("MissingExtra True "), res.stdout
    assert "pip install 'alkstore-sa[metrics]'" in res.stdout


def test_cli_metrics_port_without_the_extra_is_a_usage_error(
    sqlite_db: Target, without_prometheus: str, tmp_path: Path
) -> None:
    (tmp_path / "metrics_cli_jobs.py").write_text(HANDLERS)
    res = subprocess.run(
        [str(ALKSTORE), "worker", "metrics_cli_jobs:handle", "--queue", "q", "--metrics-port", "9999",
         "--burst", *_db_args(sqlite_db)],
        capture_output=True, text=True, timeout=STARTUP, cwd=tmp_path, env=_env(PYTHONPATH=without_prometheus),
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "alkstore: --metrics-port needs prometheus_client: pip install 'alkstore-sa[metrics]'"
    ]


@pytest.mark.parametrize("port", ["0", "65536"])
def test_cli_bad_metrics_port_is_a_usage_error(sqlite_db: Target, tmp_path: Path, port: str) -> None:
    (tmp_path / "metrics_cli_jobs.py").write_text(HANDLERS)
    res = subprocess.run(
        [str(ALKSTORE), "worker", "metrics_cli_jobs:handle", "--queue", "q", "--metrics-port", port,
         "--burst", *_db_args(sqlite_db)],
        capture_output=True, text=True, timeout=STARTUP, cwd=tmp_path, env=_env(), stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "--metrics-port" in res.stderr


@pytest.mark.parametrize("bad", ["sqlite:///app.db", None, object()], ids=["url", "none", "object"])
def test_a_collector_of_something_else_than_a_store_is_refused_when_made(bad: object) -> None:
    """``Collector(url)`` was made, and registered (``describe`` reads nothing): every scrape
    of the registry then failed with an AttributeError, the process's other metrics with it.
    ``serve`` the same, before it records anything or binds a port."""
    before = metrics.observe.observer
    with pytest.raises(alk.InvalidOptions, match="alk.Store"):
        metrics.Collector(bad)  # type: ignore[arg-type]
    with pytest.raises(alk.InvalidOptions, match="alk.Store"):
        metrics.serve(bad, 0)  # type: ignore[arg-type]
    assert metrics.observe.observer is before


@pytest.mark.parametrize("port", ["9108", -1, 70000, True, 1.5, None], ids=repr)
def test_serve_refuses_a_bad_port_before_doing_anything(sqlite_db: Target, port: object) -> None:
    """``serve(store, port)`` with a port that is no TCP port raised whatever the socket
    layer made of it (TypeError, socket.gaierror, OverflowError, OSError "Int or String
    expected"), after it had switched the worker metrics on; it is InvalidOptions, and
    nothing is recorded, registered or bound."""
    before = metrics.observe.observer
    with sqlite_db.store() as store, pytest.raises(alk.InvalidOptions, match="port"):
        metrics.serve(store, port)  # type: ignore[arg-type]
    assert metrics.observe.observer is before
    assert not any(isinstance(c, metrics.Collector) for c in list(prometheus_client.REGISTRY._collector_to_names))


@pytest.mark.parametrize("first", ["serve", "register"])
def test_serve_where_the_gauges_are_registered_already_is_refused(sqlite_db: Target, first: str) -> None:
    """A second ``serve`` in one process, or ``serve`` after the application registered a
    ``Collector`` on the default registry, raised prometheus_client's DuplicateTimeseries
    (a ValueError, no AlkstoreError) after it had switched the worker metrics on; it is
    InvalidOptions saying so, and the second call records, registers and binds nothing."""
    with sqlite_db.store() as store:
        collector = metrics.Collector(store)
        server = None
        if first == "serve":
            server = metrics.serve(store, 0)
        else:
            prometheus_client.REGISTRY.register(collector)
        metrics.uninstrument()
        try:
            with pytest.raises(alk.InvalidOptions, match="already"):
                metrics.serve(store, 0)
            assert metrics.observe.observer is None
            ours = [c for c in list(prometheus_client.REGISTRY._collector_to_names) if isinstance(c, metrics.Collector)]
            assert len(ours) == 1
        finally:
            for c in list(prometheus_client.REGISTRY._collector_to_names):
                if isinstance(c, metrics.Collector):
                    prometheus_client.REGISTRY.unregister(c)
            if server is not None:
                server.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize("was_on", [False, True], ids=["was-off", "was-on"])
@pytest.mark.parametrize("addr", ["127.0.0.1", "not-a-resolvable-host.invalid"], ids=["port-taken", "bad-host"])
def test_a_serve_that_cannot_bind_leaves_everything_as_it_was(sqlite_db: Target, addr: str, was_on: bool) -> None:
    """``serve(store, port)`` on a port another socket holds (or on a host name that does not
    resolve) raised the socket's error — after it had switched the worker metrics on: the
    process's workers recorded into metrics nobody served, although the call failed. A failed
    serve now records, registers and binds nothing, and leaves recording on if it was."""
    metrics.instrument() if was_on else metrics.uninstrument()
    before = metrics.observe.observer
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with sqlite_db.store() as store, pytest.raises(OSError):
                metrics.serve(store, port, addr)
        assert metrics.observe.observer is before
        assert not any(isinstance(c, metrics.Collector) for c in list(prometheus_client.REGISTRY._collector_to_names))
    finally:
        metrics.uninstrument()
