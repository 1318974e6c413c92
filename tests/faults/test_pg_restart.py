"""A PostgreSQL restart during a drain (issue 9 items 3 and 4), on a private cluster the test
starts (tests/faults/private_pg.py): the worker rides it out, every job runs, none is lost,
an enqueue right after the restart succeeds on its first try, and the acks of the jobs that
were running across the restart land (a visibility timeout of 10 minutes would leave a lost
ack's job visibly processing)."""

from __future__ import annotations

import threading
from collections import Counter

import sqlalchemy as sa

import alkstore_sa as alk
from tests.faults.private_pg import PrivateCluster, private_pg  # noqa: F401 - the fixture
from tests.support import wait_for

JOBS = 60
CONCURRENCY = 4
DRAIN = 60.0  # generous deadline for the whole drain on a loaded machine


def test_worker_drains_through_a_postgresql_restart(private_pg: PrivateCluster) -> None:  # noqa: F811
    engine = sa.create_engine(private_pg.url)
    store = alk.Store(engine)
    store.install()
    q = store.queue("restart", visibility_timeout=600)
    ids = q.enqueue_many([{"i": i} for i in range(JOBS)])

    ran: Counter[int] = Counter()
    lock = threading.Lock()
    gate = threading.Event()  # closed: handlers hold their jobs (in flight) until it opens
    gate.set()
    held = threading.Semaphore(0)

    def handler(job: alk.Job) -> None:
        with lock:
            ran[job.id] += 1
            if len(ran) == JOBS // 3:
                # closed by the job that makes a third, not by the test once it sees a third
                # have run: a fast worker could run the rest before the test looks
                gate.clear()
        if not gate.is_set():
            held.release()
            gate.wait()

    worker = alk.Worker(store, "restart", handler, concurrency=CONCURRENCY, poll_interval=1.0)
    stop = alk.StopToken()
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            crashed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(ran) >= JOBS // 3, "a third of the jobs to run", timeout=DRAIN)
        for _ in range(CONCURRENCY):  # every slot now holds a job across the restart
            assert held.acquire(timeout=DRAIN), "the worker did not fill its slots"

        private_pg.restart()  # every backend, the store's cached connections included, dies

        after = q.enqueue({"after": "restart"})  # first try: no exception
        gate.set()  # the held jobs finish now: their acks go out after the restart

        everything = {*ids, after}
        wait_for(lambda: set(ran) >= everything, "every job to run", timeout=DRAIN)

        def settled() -> bool:
            stats = q.stats()
            return stats.pending == 0 and stats.processing == 0

        wait_for(settled, "no job left pending or processing (a lost ack stays processing)", timeout=DRAIN)
        assert thread.is_alive() and not crashed, crashed
        assert set(ran) == everything
        assert q.stats().dead == 0
    finally:
        gate.set()
        stop.stop()
        thread.join(DRAIN)
        store.close()
        engine.dispose()
    assert not thread.is_alive()
    assert not crashed, crashed
