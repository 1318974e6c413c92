"""Many queues (issue 11, goal 7): one running ``alk.Worker`` serving 1,000 queues with 10
ready jobs each, against the same worker type on one queue holding the same number of jobs.
Target: the many-queue drain within 20% of the one-queue drain (ratio ≥ 0.8).

Each side's worker runs throughout its repetition (started untimed, with one untimed step
first so its start-up claims are over), with a no-op handler. A step enqueues every job of
the step in **one** transaction (``alk.enqueue_many`` per queue in one Session), so all of
them become claimable at that commit, and is timed from the commit until the handler has
run for the last one. The wake-ups (one per queue) are part of what is measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

import alkstore_sa as alk
from benchmarks.floor import WORKER, Steps

if TYPE_CHECKING:
    from benchmarks.workloads import Alk

PER_QUEUE = 10  # ready jobs per queue in a step
CONCURRENCY = 8  # the worker's concurrency on both sides
POLL_S = 60.0  # re-poll: long, so only wakes drive the worker (an idle re-poll of 1,000 queues is not timed)


class _Done:
    """Handler calls so far, and a wait for a count of them. The waiter is woken once, when
    the count reaches its target: a wake-up per job would put the benchmark's own thread
    switches (on two shared cores, as costly as a short job) into both sides' figures."""

    def __init__(self) -> None:
        self.count = 0
        self._target = 0
        self._changed = threading.Condition()

    def handle(self, job: alk.Job) -> None:
        with self._changed:
            self.count += 1
            if self.count == self._target:
                self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 300.0) -> None:
        with self._changed:
            self._target = count
            if not self._changed.wait_for(lambda: self.count >= count, timeout):
                raise RuntimeError(f"many-queues drain: {self.count} of {count} jobs run after {timeout:g}s")


def drain_queues(alk_side: Alk, items: Sequence[Any], queues: int) -> Steps:
    """A worker on ``queues`` queues (``bench-mq-0000`` ...; one queue: ``bench-mq-one``)
    draining ``len(items)`` jobs per step, spread evenly over them."""
    store = alk_side.store
    names = ["bench-mq-one"] if queues == 1 else [f"bench-mq-{i:04d}" for i in range(queues)]
    done = _Done()
    stop = alk.StopToken()
    worker = alk.Worker(store, names, done.handle, concurrency=CONCURRENCY, poll_interval=POLL_S,
                        worker_id=f"{WORKER}-{queues}")
    thread = threading.Thread(target=worker.run, args=(stop,), name=f"bench-mq-{queues}", daemon=True)
    thread.start()

    def run(chunk: Sequence[Any]) -> float:
        per = -(-len(chunk) // len(names))  # ceil: every job of the chunk lands in some queue
        target = done.count + len(chunk)
        with Session(alk_side.env.engine) as session:
            for i, name in enumerate(names):
                part = chunk[i * per : (i + 1) * per]
                if part:
                    alk.enqueue_many(session, name, part)
            session.commit()
        t0 = time.perf_counter()
        done.wait_for(target)
        return time.perf_counter() - t0

    def close() -> None:
        stop.stop()
        thread.join(60)
        if thread.is_alive():
            raise RuntimeError("many-queues drain: the worker did not stop")

    run(items)  # untimed: start-up claims over, threads started, statements prepared
    alk_side.env.settle()
    return Steps(run, close)
