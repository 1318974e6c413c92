"""The job being executed right now, per thread and per asyncio task (``alk.current_job()``).

Internal API for the worker: it runs each handler or task inside ``running(job)``, entered
in the thread or the asyncio task that executes it. A context variable keeps concurrent
jobs apart: every thread has its own context, every asyncio task a copy of its creator's
(so tasks a job spawns see that job too).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .model import Job

_job: ContextVar[Job | None] = ContextVar("alkstore_sa.current_job", default=None)


def current_job() -> Job | None:
    """The ``Job`` being executed in the current handler or task, else ``None``."""
    return _job.get()


@contextmanager
def running(job: Job) -> Iterator[Job]:
    """Make ``job`` the current job until the block exits (nested blocks restore the outer
    job). Enter and exit it in the same thread or asyncio task."""
    token = _job.set(job)
    try:
        yield job
    finally:
        _job.reset(token)
