"""The job being executed right now, per thread and per asyncio task (``alk.current_job()``).

Internal API for the worker: it runs each handler or task inside ``running(job)``, entered
in the thread or the asyncio task that executes it. A context variable keeps concurrent
jobs apart: every thread has its own context, every asyncio task a copy of its creator's
(so tasks a job spawns see that job too). The variable holds a one-item cell, emptied
when the job ends: an asyncio task the job left running, or a context copied in it and
run later, then sees no job rather than one that is no longer executing.

The worker passes the job's claim handle rather than a ``Job``: the ``Job`` value (its
datetimes, its error history) is built the first time ``current_job()`` asks for it, so a
task that never asks does not pay for it.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Protocol

from .model import Job


class _HasJob(Protocol):
    @property
    def job(self) -> Job: ...


_Current = Job | _HasJob
_job: ContextVar[list[_Current | None] | None] = ContextVar("alkstore_sa.current_job", default=None)


def current_job() -> Job | None:
    """The ``Job`` being executed in the current handler or task, else ``None``."""
    cell = _job.get()
    current = None if cell is None else cell[0]
    if current is None or isinstance(current, Job):
        return current
    return current.job


class running:
    """Make ``job`` (a ``Job``, or a claim handle whose ``.job`` is built on demand) the
    current job until the block exits (nested blocks restore the outer job). Enter and
    exit it in the same thread or asyncio task. (A class, not a generator: it is entered
    once per job run.)"""

    __slots__ = ("_cell", "_token")

    def __init__(self, job: _Current) -> None:
        self._cell: list[_Current | None] = [job]  # emptied at exit, in every copy of the context
        self._token: Token[list[_Current | None] | None] | None = None

    def __enter__(self) -> None:
        self._token = _job.set(self._cell)

    def __exit__(self, *exc_info: object) -> None:
        self._cell[0] = None  # the job ended: what it left running no longer runs inside it
        if self._token is not None:
            token, self._token = self._token, None
            # ValueError: exited in another context than it was entered — the coroutine of an
            # asyncio task dropped at shutdown, closed when collected; that context is gone
            # (a try, not contextlib.suppress: this runs once per job, and suppress is three
            # Python calls)
            try:  # noqa: SIM105 - see above
                _job.reset(token)
            except ValueError:
                pass
