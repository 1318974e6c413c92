"""The job being executed right now, per thread and per asyncio task (``alk.current_job()``).

Internal API for the worker: it runs each handler or task inside ``running(job)``, entered
in the thread or the asyncio task that executes it. A context variable keeps concurrent
jobs apart: every thread has its own context, every asyncio task a copy of its creator's
(so tasks a job spawns see that job too).

The worker passes the job's claim handle rather than a ``Job``: the ``Job`` value (its
datetimes, its error history) is built the first time ``current_job()`` asks for it, so a
task that never asks does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from .model import Job


class _HasJob(Protocol):
    @property
    def job(self) -> Job: ...


_job: ContextVar[Job | _HasJob | None] = ContextVar("alkstore_sa.current_job", default=None)


def current_job() -> Job | None:
    """The ``Job`` being executed in the current handler or task, else ``None``."""
    current = _job.get()
    if current is None or isinstance(current, Job):
        return current
    return current.job


@contextmanager
def running(job: Job | _HasJob) -> Iterator[None]:
    """Make ``job`` (a ``Job``, or a claim handle whose ``.job`` is built on demand) the
    current job until the block exits (nested blocks restore the outer job). Enter and
    exit it in the same thread or asyncio task."""
    token = _job.set(job)
    try:
        yield
    finally:
        _job.reset(token)
