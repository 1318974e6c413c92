"""The operator reads on a big table: the dashboard's pages (its WSGI app called in-process,
no HTTP server) and a Prometheus scrape of ``alkstore_sa.metrics.Collector``, in ms per
request, on one queue of ``rows`` jobs next to ``queues - 1`` small queues.

A page has no raw floor (it renders HTML); beside each figure the report prints, for
context, the ms of each statement the read runs (its count query above all), recorded as
the library sent it and replayed on a raw driver connection in the same loop.

The table is seeded in a few set-based ``INSERT ... SELECT`` statements over a generated
series (``generate_series`` on PostgreSQL, a recursive CTE on SQLite), written with
SQLAlchemy Core against ``alkstore_sa.schema``: the big queue holds 80% ready, 10% scheduled
(far-future ``run_at``), 5% processing and 5% dead jobs; each small queue holds ready jobs.
"""

from __future__ import annotations

import html
import re
import statistics
import time
import wsgiref.util
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import sqlalchemy as sa

from alkstore_sa._conn import Lease
from alkstore_sa.schema import DEFAULT_SCHEMA, dead_jobs, jobs
from benchmarks.env import Env

QUEUE = "bench-dash"
SMALL_QUEUE = "bench-dash-q"  # + a number: the other queues
FAR = 10 * 365 * 86400.0
DEAD_ID_BASE = 10**12  # dead ids apart from every live id (ids are one space across both tables)
PAYLOAD = '{"user_id": 1, "action": "send_welcome_email", "locale": "en"}'
WARM = 1  # untimed requests per measurement first (compiled statements, plans, caches)


def split(rows: int) -> dict[str, int]:
    """The big queue's rows by state."""
    ready, scheduled, processing = rows * 80 // 100, rows * 10 // 100, rows * 5 // 100
    return {"ready": ready, "scheduled": scheduled, "processing": processing,
            "dead": rows - ready - scheduled - processing}


def _series(kind: str, count: int) -> Any:
    """A FROM item of one integer column ``g`` = 1..count."""
    if kind == "postgresql":
        return sa.func.generate_series(1, count).table_valued("g").render_derived(name="s")
    s = sa.select(sa.literal(1).label("g")).cte("s", recursive=True)
    return s.union_all(sa.select(s.c.g + 1).where(s.c.g < count))


def _insert_live(conn: sa.Connection, kind: str, count: int, queue: Callable[[Any], Any], state: str,
                 run_at: Callable[[Any], Any], now: float, claimed: bool = False) -> None:
    """``count`` live rows in one ``INSERT ... SELECT``; ``queue`` and ``run_at`` are
    expressions of the series' ``g``."""
    if count <= 0:
        return
    s = _series(kind, count)
    cols = {
        "state": sa.literal(state), "queue": queue(s.c.g), "payload": sa.literal(PAYLOAD),
        "priority": sa.literal(0), "attempts": sa.literal(1 if claimed else 0), "max_attempts": sa.literal(3),
        "visibility_timeout": sa.literal(300.0), "backoff_base": sa.literal(5.0),
        "created_at": sa.literal(now - 3600.0), "run_at": run_at(s.c.g),
        "claimed_at": sa.literal(now if claimed else None, sa.Double),
        "claim_expires_at": sa.literal(now + FAR if claimed else None, sa.Double),
        "worker_id": sa.literal("bench-worker" if claimed else None, sa.Text),
        "errors": sa.literal("[]"),
    }
    conn.execute(sa.insert(jobs).from_select(list(cols), sa.select(*cols.values()).select_from(s)))


def seed(env: Env, rows: int, queues: int) -> dict[str, Any]:
    """Fill the (emptied) tables; returns what the measurements need: the big queue's
    counts, a deep ready id (half way through its ready jobs) and a deep dead id."""
    env.truncate(env.jobs, env.dead)
    now = time.time()
    n = split(rows)
    small_each = max(1, rows // 1000)
    translate = {DEFAULT_SCHEMA: env.store.backend.target_schema()}

    def past(g: Any) -> Any:  # ready run_at spread over the past hour: "oldest ready" varies
        return sa.literal(now - 3600.0) + g * (3000.0 / max(1, n["ready"]))

    def future(g: Any) -> Any:
        return sa.literal(now + FAR) + g

    def big(g: Any) -> Any:
        return sa.literal(QUEUE)

    def small(g: Any) -> Any:  # the other queues: bench-dash-q0 .. q(queues - 2)
        return sa.literal(SMALL_QUEUE) + sa.cast(g % (queues - 1), sa.Text)

    with env.engine.connect().execution_options(schema_translate_map=translate) as conn:
        _insert_live(conn, env.kind, n["ready"], big, "pending", past, now)
        _insert_live(conn, env.kind, n["scheduled"], big, "pending", future, now)
        _insert_live(conn, env.kind, n["processing"], big, "processing", past, now, claimed=True)
        if queues > 1:
            _insert_live(conn, env.kind, small_each * (queues - 1), small, "pending", past, now)
        s = _series(env.kind, n["dead"])
        cols = {
            "id": s.c.g + DEAD_ID_BASE, "queue": sa.literal(QUEUE), "payload": sa.literal(PAYLOAD), "priority": sa.literal(0),
            "attempts": sa.literal(3), "max_attempts": sa.literal(3), "visibility_timeout": sa.literal(300.0),
            "backoff_base": sa.literal(5.0), "created_at": sa.literal(now - 7200.0),
            "run_at": sa.literal(now - 7200.0), "claimed_at": sa.literal(now - 7000.0),
            "claim_expires_at": sa.literal(now - 6700.0), "worker_id": sa.literal("old-worker"),
            "errors": sa.literal(f'[{{"attempt": 3, "error": "failed", "at": {now - 6000.0!r}}}]'), "last_error": sa.literal("failed"),
            "died_at": sa.literal(now - 6000.0) + s.c.g * 0.001,
        }
        conn.execute(sa.insert(dead_jobs).from_select(list(cols), sa.select(*cols.values()).select_from(s)))
        conn.commit()
        ready_ids = sa.select(jobs.c.id).where(jobs.c.queue == QUEUE, jobs.c.state == "pending",
                                               jobs.c.run_at <= now).order_by(jobs.c.id)
        deep_ready = conn.scalar(ready_ids.offset(n["ready"] // 2).limit(1))
    if env.kind == "postgresql":
        # what autovacuum would do after a bulk load, done now so it cannot start mid-measurement
        for table in (env.jobs, env.dead):
            env.execute(f"VACUUM ANALYZE {table}")
    env.settle()
    return {"counts": n, "deep_ready_id": deep_ready, "deep_dead_id": DEAD_ID_BASE + n["dead"] // 2,
            "small_each": small_each}


def wsgi_get(app: Any, target: str) -> tuple[int, bytes]:
    """One GET through the WSGI app, in-process: (status code, body)."""
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD="GET", PATH_INFO=path, QUERY_STRING=query, SCRIPT_NAME="")
    status: list[str] = []

    def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        status.append(s)
        return lambda _b: None

    result: Iterable[bytes] = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return int(status[0].split()[0]), body


class Recorder:
    """Records the statements the library runs while a read runs (their SQL and parameters,
    as its connection lease hands them to the driver), so they can be replayed on a raw
    driver connection: the queries' own cost, without the library's Python or the page's
    rendering. Benchmark-only: it wraps the internal ``Lease.rows`` during a capture."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def capture(self, read: Callable[[], Any]) -> list[tuple[str, Any]]:
        statements: list[tuple[str, Any]] = []
        original = Lease.rows

        def recording(lease: Lease, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
            statements.append((sql, dict(params)))
            return original(lease, sql, params)

        Lease.rows = recording  # type: ignore[method-assign,assignment]
        try:
            read()
        finally:
            Lease.rows = original  # type: ignore[method-assign]
        return statements

    def name(self, statement: str) -> str:
        """The statement's key in the backend's statement cache (e.g. ``gauges``)."""
        cache = getattr(self.env.store.backend, "_sql", {})
        return next((k for k, sql in cache.items() if sql == statement), "statement")

    def replays(self, read: Callable[[], Any]) -> list[tuple[str, Callable[[], Any]]]:
        """One raw replay per statement ``read`` runs, named."""
        return [(self.name(sql), partial(self.env.execute, sql, params)) for sql, params in self.capture(read)]


def _time_ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def measure(request: Callable[[], Any], raws: list[tuple[str, Callable[[], Any]]], count: int) -> dict[str, Any]:
    """``count`` timed requests, each next to one run of every raw query (the request goes
    first on even rounds, last on odd ones), after WARM untimed rounds: medians in ms."""
    for _ in range(WARM):
        request()
        for _title, fn in raws:
            fn()
    timed: list[list[float]] = [[] for _ in range(1 + len(raws))]
    calls = [request, *(fn for _title, fn in raws)]
    for i in range(count):
        order = list(range(len(calls))) if i % 2 == 0 else list(range(len(calls)))[::-1]
        for k in order:
            timed[k].append(_time_ms(calls[k]))
    return {
        "ms": statistics.median(timed[0]), "all_ms": timed[0],
        "raw": [{"title": title, "ms": statistics.median(ms)} for (title, _fn), ms in zip(raws, timed[1:], strict=True)],
    }


def _page(app: Any, target: str, want: bytes | None = None) -> Callable[[], bytes]:
    def get() -> bytes:
        code, body = wsgi_get(app, target)
        if code != 200:
            raise RuntimeError(f"GET {target} answered {code}: {body[:300]!r}")
        if want is not None and want not in body:
            raise RuntimeError(f"GET {target}: {want!r} not in the page")
        return body

    return get


def next_link(app: Any, target: str) -> str:
    """The page's own "next page" link (the keyset cursor as the dashboard writes it), else
    ``target`` itself."""
    m = re.search(rb'id="next-page"[^>]*href="([^"]+)"|href="([^"]+)"[^>]*id="next-page"', _page(app, target)())
    return html.unescape((m.group(1) or m.group(2)).decode()) if m else target


def run_dashboard(env: Env, rows: int, queues: int, requests: int, log: Any = print) -> dict[str, Any]:
    """Seed, then time each read; the tables are emptied afterwards. A missing dashboard or
    metrics extra is reported as not measured rather than failing the run."""
    t0 = time.perf_counter()
    facts = seed(env, rows, queues)
    log(f"  [{env.kind}] dashboard table seeded: {rows:,} rows in {QUEUE!r}, {queues} queues, "
        f"{time.perf_counter() - t0:.1f}s")
    out: dict[str, Any] = {"rows": rows, "queues": queues, "requests": requests, "reads": [], "missing": []}
    recorder = Recorder(env)
    try:
        reads: list[tuple[str, str, Callable[[], Any]]] = []  # (key, title, the request)
        try:
            from alkstore_sa.dashboard import create_wsgi_app
        except ImportError as exc:
            out["missing"].append(f"dashboard pages: {exc}")
        else:
            app = create_wsgi_app(env.store)
            deep = next_link(app, f"/queues/{QUEUE}?state=ready&after={facts['deep_ready_id']}")
            reads += [
                ("queues_page", "queues page (`GET /`)", _page(app, "/", QUEUE.encode())),
                ("ready_first", "ready jobs of the big queue, first page (`GET /queues/Q?state=ready`)",
                 _page(app, f"/queues/{QUEUE}?state=ready", b"data-job-id")),
                ("ready_deep", "ready jobs, the page after the one half way in (its own next-page link)",
                 _page(app, deep, b"data-job-id")),
                ("dead_deep", "dead letters of the big queue, keyset page half way in (`GET /dead?queue=Q&before=ID`)",
                 _page(app, f"/dead?queue={QUEUE}&before={facts['deep_dead_id']}", b"data-job-id")),
            ]
        try:
            from prometheus_client import CollectorRegistry, generate_latest

            from alkstore_sa.metrics import Collector
        except ImportError as exc:
            out["missing"].append(f"metrics scrape: {exc}")
        else:
            registry = CollectorRegistry()
            registry.register(Collector(env.store))
            reads.append(("metrics_scrape", f"metrics scrape (`Collector`, text exposition, {queues} queues)",
                          partial(generate_latest, registry)))
        for key, title, request in reads:
            request()  # compiles the statements, so the recorder can name them
            m = measure(request, recorder.replays(request), requests)
            out["reads"].append({"key": key, "title": title, **m})
            context = "; ".join(f"{r['title']} {r['ms']:.1f} ms" for r in m["raw"])
            log(f"  [{env.kind}] {key:<15} {m['ms']:>9.1f} ms  (raw: {context})")
        for note in out["missing"]:
            log(f"  [{env.kind}] not measured: {note}")
    finally:
        env.truncate(env.jobs, env.dead)
        env.settle()
    return out
