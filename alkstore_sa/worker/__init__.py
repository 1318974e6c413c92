"""The worker runtime (SPEC §11, §12): one wake-driven claim loop for any number of queues,
feeding handler threads and an event loop.

The parts, wired together by ``Worker.run`` (``runtime.py``):

- the **claimer** (``claimer.py``) claims as many jobs as there are free slots, splitting
  them fairly over the queues that are ready; an idle queue sleeps until a wake-up, its
  next due time or the re-poll, and a queue whose claims fail backs off (capped);
- the **dispatch** (``dispatch.py``) decides what each job runs: the handler, or the task
  its payload names (an unknown task is retried, a payload that is no task call failed);
- the **runner** (``runner.py``) owns the slot count, the threads that run sync calls and
  record outcomes, and the event loop (``loop.py``) that runs ``async def`` ones; a slot
  is taken when a claimed job is handed over and freed only once its outcome was dealt
  with, so ``concurrency`` bounds sync and async jobs together (a handler whose claim
  lapsed still holds its slot);
- the **heartbeater** (``heartbeater.py``) keeps the roster of live claims, keyed by the
  claim (job id + attempt), and extends each one well inside its visibility timeout.

``outcomes.py`` maps what a handler or task did to a queue operation and logs jobs that
go dead.
"""

from __future__ import annotations

from .outcomes import Fail, Retry
from .runtime import Handler, Worker, default_worker_id

__all__ = ["Fail", "Handler", "Retry", "Worker", "default_worker_id"]
