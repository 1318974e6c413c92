"""The worker registry (SPEC §15): a running Worker records itself and refreshes its row;
``store.workers()`` lists the live ones; a worker that stops refreshing is gone after three
refresh intervals and its row is deleted (not left to grow); a clean stop removes the row."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import alkstore_sa as alk
from alkstore_sa.worker.registry import Registration
from tests.support import FakeClock, Target, sqlite_target

WORKER_SCRIPT = Path(__file__).with_name("registry_worker.py")


def _rows(db: Target) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table('alkstore_workers')}"))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _empty_registry(db: Target) -> None:
    """PostgreSQL's schema is shared by the module's tests: start each with no rows."""
    db.execute(f"DELETE FROM {db.table('alkstore_workers')}")


def _wait(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_running_worker_is_listed_with_its_fields_and_removed_when_it_stops(
    db: Target, clock: FakeClock, qname: str
) -> None:
    store = db.store(clock=clock)
    try:
        worker = alk.Worker(store, [qname, qname + "-b"], lambda job: None, concurrency=3, worker_id="w-listed")
        stop = alk.StopToken()
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            _wait(lambda: store.workers() != [])
            (info,) = store.workers()
            assert info == alk.WorkerInfo(
                id="w-listed", hostname=socket.gethostname(), pid=os.getpid(), queues=(qname, qname + "-b"),
                concurrency=3, started_at=datetime.fromtimestamp(clock.now, timezone.utc),
                last_seen=datetime.fromtimestamp(clock.now, timezone.utc),
            )
        finally:
            stop.stop()
            thread.join(30)
        assert not thread.is_alive()
        assert store.workers() == [] and _rows(db) == 0
    finally:
        store.close()


def test_refresh_moves_last_seen_and_keeps_started_at(db: Target, clock: FakeClock) -> None:
    store = db.store(clock=clock)
    try:
        reg = Registration(store, "w-refresh", ["q"], 2, interval=10.0)
        reg._refresh()
        started = clock.now
        clock.advance(25.0)  # within three intervals of the first write
        (info,) = store.workers()
        assert info.last_seen == datetime.fromtimestamp(started, timezone.utc)
        reg._refresh()
        (info,) = store.workers()
        assert info.started_at == datetime.fromtimestamp(started, timezone.utc)
        assert info.last_seen == datetime.fromtimestamp(started + 25.0, timezone.utc)
    finally:
        store.close()


def test_a_row_taken_over_by_another_process_gets_that_process_start(db: Target, clock: FakeClock) -> None:
    """started_at is kept only while the same process (hostname and pid) refreshes the row:
    another process registering under the same id - a restart on this machine, or the
    same pid on another one - is listed from its own start."""
    store = db.store(clock=clock)
    try:
        first = Registration(store, "w-taken", ["q"], 1, interval=10.0)
        first._refresh()
        for takeover in ({"pid": first._params["pid"] + 1}, {"hostname": "elsewhere"}):
            clock.advance(5.0)
            other = Registration(store, "w-taken", ["q"], 1, interval=10.0)
            other._params.update(takeover)
            other._refresh()
            (info,) = store.workers()
            assert (info.hostname, info.pid) == (other._params["hostname"], other._params["pid"])
            assert info.started_at == info.last_seen == datetime.fromtimestamp(clock.now, timezone.utc)
            clock.advance(5.0)
            other._refresh()  # that process's own refresh keeps its start
            (info,) = store.workers()
            assert info.started_at == datetime.fromtimestamp(clock.now - 5.0, timezone.utc)
    finally:
        store.close()


def test_a_worker_that_stops_refreshing_is_gone_after_three_intervals_and_its_row_deleted(
    db: Target, clock: FakeClock
) -> None:
    store = db.store(clock=clock)
    try:
        silent = Registration(store, "w-silent", ["q"], 1, interval=5.0)
        alive = Registration(store, "w-alive", ["q"], 1, interval=5.0)
        silent._refresh()
        alive._refresh()
        clock.advance(14.9)
        assert [w.id for w in store.workers()] == ["w-alive", "w-silent"]  # same start: by id
        alive._refresh()
        clock.advance(0.1)  # 15 s = three intervals since w-silent's last refresh
        assert [w.id for w in store.workers()] == ["w-alive"]
        assert _rows(db) == 2  # not listed, not yet deleted
        alive._refresh()  # every refresh deletes lapsed rows
        assert _rows(db) == 1
    finally:
        store.close()


@pytest.mark.parametrize("bad", [0, -1, 30.5, float("nan"), "10"])
def test_registry_interval_must_be_positive_and_at_most_30s(db: Target, bad: object) -> None:
    store = db.store()
    try:
        with pytest.raises(alk.InvalidOptions, match="registry_interval"):
            alk.Worker(store, "q", lambda job: None, registry_interval=bad)  # type: ignore[arg-type]
        assert _rows(db) == 0
    finally:
        store.close()


class _Processes:
    """Worker processes (registry_worker.py) of one test; ``close()`` kills what is left."""

    def __init__(self, db: Target, queue: str) -> None:
        self.db, self.queue = db, queue
        self.started: list[subprocess.Popen[str]] = []

    def spawn(self, worker_id: str, interval: float) -> subprocess.Popen[str]:
        db = self.db
        p = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), db.url, db.schema, self.queue, worker_id, str(interval)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.started.append(p)
        return p

    @staticmethod
    def stop(p: subprocess.Popen[str]) -> None:
        """SIGTERM: a clean stop, exit 0."""
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0, p.stderr.read() if p.stderr else ""

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_worker_processes_appear_and_a_killed_one_disappears(db: Target, qname: str) -> None:
    """Across processes, on the database's own clock: both register; after a SIGKILL the
    killed one (which never removes its row) is still listed until three refresh intervals
    pass, then gone, and the survivor's refresh deletes its row; SIGTERM removes the other."""
    interval = 1.0
    store = db.store()
    run = _Processes(db, qname)
    try:
        procs = {wid: run.spawn(wid, interval) for wid in ("reg-a", "reg-b")}
        _wait(lambda: {w.id for w in store.workers()} == {"reg-a", "reg-b"}, timeout=60)
        pids = {w.id: w.pid for w in store.workers()}
        assert pids == {wid: p.pid for wid, p in procs.items()}
        procs["reg-a"].send_signal(signal.SIGKILL)
        procs["reg-a"].wait(30)
        killed_at = time.monotonic()
        _wait(lambda: {w.id for w in store.workers()} == {"reg-b"}, timeout=60)
        # gone no earlier than its last refresh plus three intervals (at most one interval
        # before the kill), and not left in the table: the survivor's refresh deletes it
        assert time.monotonic() - killed_at >= 2 * interval - 0.25
        _wait(lambda: _rows(db) == 1, timeout=30)
        run.stop(procs["reg-b"])
        assert store.workers() == [] and _rows(db) == 0
    finally:
        run.close()
        store.close()


def test_a_restart_under_the_same_id_is_listed_from_its_own_start(db: Target, qname: str) -> None:
    """A worker with a fixed id killed (SIGKILL) and restarted before its row lapsed (a
    systemd or Kubernetes restart): the new process is listed with its own pid and its own
    started_at, not the dead one's; it stops cleanly and removes the row."""
    store = db.store()
    run = _Processes(db, qname)
    try:
        first = run.spawn("w-restarted", 10.0)  # its row lives 30 s past each refresh
        _wait(lambda: [w.pid for w in store.workers()] == [first.pid])
        (dead,) = store.workers()
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        time.sleep(1.0)  # the restart comes a moment later
        second = run.spawn("w-restarted", 10.0)
        _wait(lambda: [w.pid for w in store.workers()] == [second.pid])
        (restarted,) = store.workers()
        assert restarted.id == "w-restarted"
        assert restarted.started_at - dead.started_at >= timedelta(seconds=1.0), (dead, restarted)
        run.stop(second)
        assert store.workers() == [] and _rows(db) == 0
    finally:
        run.close()
        store.close()


def test_a_stop_leaves_the_row_of_another_process_with_the_same_id(db: Target, qname: str) -> None:
    """Two processes under one worker_id share one row (the registry's identity is the id),
    which shows the latest refresher. When the other process stops cleanly it must not
    delete the row the still-running one wrote."""
    store = db.store()
    run = _Processes(db, qname)
    try:
        first = run.spawn("w-shared", 10.0)
        _wait(lambda: [w.pid for w in store.workers()] == [first.pid])
        second = run.spawn("w-shared", 10.0)
        _wait(lambda: [w.pid for w in store.workers()] == [second.pid])  # its start took the row over
        run.stop(first)
        assert [(w.id, w.pid) for w in store.workers()] == [("w-shared", second.pid)]
        run.stop(second)
        assert store.workers() == [] and _rows(db) == 0
    finally:
        run.close()
        store.close()


def test_a_stop_leaves_the_row_of_another_running_worker_of_this_process_with_the_same_id(
    db: Target, qname: str
) -> None:
    """Two workers of one process under one worker_id (same hostname and pid, one row): the
    first to stop leaves the row while the other runs; the last one's stop removes it."""
    store = db.store()
    runs = []
    try:
        for queue in (qname, qname + "-b"):
            worker = alk.Worker(store, queue, lambda job: None, concurrency=1, worker_id="w-twice")
            stop = alk.StopToken()
            thread = threading.Thread(target=worker.run, args=(stop,))
            thread.start()
            runs.append((stop, thread))
            _wait(lambda q=queue: [w.queues for w in store.workers()] == [(q,)])  # type: ignore[misc]
        stop, thread = runs[0]
        stop.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert [(w.id, w.queues) for w in store.workers()] == [("w-twice", (qname + "-b",))]
        stop, thread = runs[1]
        stop.stop()
        thread.join(30)
        assert store.workers() == [] and _rows(db) == 0
    finally:
        for stop, thread in runs:
            stop.stop()
            thread.join(30)
        store.close()


def test_a_stop_removes_its_row_though_a_worker_of_the_same_id_runs_on_another_store(
    db: Target, tmp_path: Path, qname: str
) -> None:
    """The same worker_id on two databases is two rows: the worker running on the other
    store (another SQLite file) does not keep this store's row after this worker's stop."""
    other = sqlite_target(str(tmp_path))
    stores = [db.store(), other.store()]
    runs = []
    try:
        for store in stores:
            worker = alk.Worker(store, qname, lambda job: None, concurrency=1, worker_id="w-two-dbs")
            stop = alk.StopToken()
            thread = threading.Thread(target=worker.run, args=(stop,))
            thread.start()
            runs.append((stop, thread))
            _wait(lambda s=store: [w.id for w in s.workers()] == ["w-two-dbs"])  # type: ignore[misc]
        stop, thread = runs[0]
        stop.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert stores[0].workers() == [] and _rows(db) == 0
        assert [w.id for w in stores[1].workers()] == ["w-two-dbs"]
    finally:
        for stop, thread in runs:
            stop.stop()
            thread.join(30)
        for store in stores:
            store.close()
        other.engine.dispose()


def _run_until_sigterm(worker: alk.Worker) -> None:
    """A forked child's whole life: run the worker it inherited until SIGTERM."""
    stop = alk.StopToken()
    signal.signal(signal.SIGTERM, lambda *_: stop.stop())
    worker.run(stop)


def test_a_worker_run_in_forked_children_takes_a_default_id_in_each(
    db: Target, qname: str, tmp_path: Path
) -> None:
    """A Worker built once and run in forked processes (a pre-fork server, multiprocessing's
    fork start method) without an explicit worker_id: each child registers, claims and is
    listed under an id of its own (its pid, not the parent's), so the registry shows every
    child, one child's clean stop leaves the others' rows, and a job records the id of the
    child that ran it."""
    ran = tmp_path / "ran.txt"

    def handler(job: alk.Job) -> None:
        with open(ran, "a") as f:  # one short append per job: whole lines from any child
            f.write(f"{os.getpid()} {job.worker_id}\n")

    store = db.store()
    worker = alk.Worker(store, qname, handler, concurrency=1, poll_interval=0.2)
    built_as = worker.worker_id
    children = [multiprocessing.get_context("fork").Process(target=_run_until_sigterm, args=(worker,)) for _ in range(3)]
    try:
        for child in children:
            child.start()
        pids = {child.pid for child in children}
        _wait(lambda: {w.pid for w in store.workers()} == pids)
        listed = {w.pid: w.id for w in store.workers()}
        assert len(set(listed.values())) == 3, listed
        for pid, wid in listed.items():
            assert wid.startswith(f"{socket.gethostname()}:{pid}:"), (pid, wid)
        q = store.queue(qname)
        for n in range(6):
            q.enqueue(n)
        _wait(lambda: ran.exists() and len(ran.read_text().splitlines()) == 6)
        for line in ran.read_text().splitlines():
            pid, wid = line.split(" ")
            assert listed[int(pid)] == wid, line  # claimed under the id it is listed by
        children[0].terminate()
        children[0].join(30)
        assert children[0].exitcode == 0
        assert {w.pid: w.id for w in store.workers()} == {c.pid: listed[c.pid] for c in children[1:]}
        assert worker.worker_id == built_as  # the parent's own id is unchanged
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join(30)
        store.close()


def test_status_shows_the_live_workers(db: Target, capsys: pytest.CaptureFixture[str]) -> None:
    from alkstore_sa.cli import main as alkstore_main

    store = db.store()
    try:
        Registration(store, "w-status", ["emails", "reports"], 4, interval=10.0)._refresh()
        db_args = ["--url", db.url, "--schema", db.schema]
        assert alkstore_main(["status", *db_args]) == 0
        _queues, workers = capsys.readouterr().out.split("\n\n")
        header, row = workers.strip().splitlines()
        assert header.split() == ["worker", "hostname", "pid", "queues", "concurrency", "started_at", "last_seen"]
        assert row.split()[:5] == ["w-status", socket.gethostname(), str(os.getpid()), "emails,reports", "4"]
        assert alkstore_main(["status", "--workers", "--json", *db_args]) == 0
        (listed,) = json.loads(capsys.readouterr().out)
        assert listed["id"] == "w-status" and listed["queues"] == ["emails", "reports"] and listed["concurrency"] == 4
        assert datetime.fromisoformat(listed["last_seen"]) == store.workers()[0].last_seen
        db.execute(f"DELETE FROM {db.table('alkstore_workers')}")
        assert alkstore_main(["status", "--workers", *db_args]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1] == "(no workers)"
    finally:
        store.close()
