"""What a handler or task did, as a queue operation (SPEC §11, §12), and recording it
through the claim.

Returning → ``ack``; raising ``Fail(msg)`` → ``fail(msg)``; raising ``Retry(delay=...)`` →
``retry`` with that delay; raising anything else → ``retry(str(exc))`` on the backoff
curve (``repr(exc)`` when ``str()`` fails, see ``text_of``; a ``SystemExit`` or ``KeyboardInterrupt`` the job raises too, its type named: it
ends neither the worker nor the thread). Sync calls run on a runner thread (``outcome_of``), ``async def`` ones are awaited
on the worker's event loop (``aoutcome_of``); both inside ``running(job)``, so
``alk.current_job()`` is the job in that thread or asyncio task. A sync call whose result
is awaitable (a coroutine, a Future), or a generator or async generator, is never acked:
nothing ran it to completion, so the job is retried with an error saying so.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _validate as v
from .._current import running
from ..errors import InvalidOptions
from ..queue import JobHandle
from .observe import ACKED, DEAD, RETRIED

if TYPE_CHECKING:
    from .dispatch import Work

log = logging.getLogger("alkstore_sa")


# the most of an object's text the worker records or logs: an exception may carry a whole
# response body, which would otherwise be stored in job.errors on every attempt
MAX_ERROR_TEXT = 10_000

# Python 3.11+ (asyncio.TaskGroup raises one); None on 3.10, where nothing in the
# standard library raises a group
_GROUP: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


def text_of(value: object) -> str:
    """``value``'s text for an error or a log line, never raising: ``str(value)``, else
    ``repr(value)`` (when ``str()`` raises or returns no str), else its type's name, and
    for an exception group the exceptions it holds; cut at MAX_ERROR_TEXT characters,
    saying how many more there were (for a group, also how many exceptions were not
    rendered: rendering stops at the cut)."""
    text = _rendered(value)
    unshown = 0
    if _GROUP is not None and isinstance(value, _GROUP):
        # an exception group's own text names none of what failed ('unhandled errors in a
        # TaskGroup (1 sub-exception)'): the exceptions it holds follow, with their types,
        # as many as the cut leaves room for (thousands of children with long messages
        # would otherwise be rendered whole, to be cut away)
        leaves = _leaves(value)
        parts: list[str] = []
        length = len(text)
        for leaf in leaves:
            if length > MAX_ERROR_TEXT:
                break
            parts.append(_named(leaf))
            length += len(parts[-1]) + 2
        unshown = len(leaves) - len(parts)
        text += ": " + "; ".join(parts)
    text = v.cut_text(text, MAX_ERROR_TEXT)
    return f"{text} (and {unshown} more exceptions, not shown)" if unshown else text


def _named(exc: BaseException) -> str:
    """``Type: text`` (``Type`` alone when the text is empty), the text cut as text_of cuts it."""
    text = v.cut_text(_rendered(exc), MAX_ERROR_TEXT)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rendered(value: object) -> str:
    text = type(value).__name__
    for render in (str, repr):
        try:
            rendered = render(value)
        except Exception:  # noqa: BLE001 - a broken __str__/__repr__ must not lose the outcome
            continue
        if isinstance(rendered, str):
            return rendered
    return text


def _message(value: object) -> str | None:
    """What a ``Fail`` or ``Retry`` records for ``value``: a str as given, None as None, any
    other object its text (its type's name when that is empty: ``Fail(ValueError())``)."""
    if value is None or isinstance(value, str):
        return value
    return text_of(value) or type(value).__name__


class Fail(Exception):
    """Raise from a handler to dead-letter the job now, with ``message`` as its last error:
    any object, recorded as its text (``raise alk.Fail(exc)``), or None ("failed")."""

    def __init__(self, message: object = None) -> None:
        text = _message(message)
        super().__init__(text)
        self.message = text

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from what it recorded (a process pool sends it back pickled)
        return (type(self), (self.message,), self.__dict__)


class Retry(Exception):
    """Raise from a handler to retry the job after ``delay`` seconds (None: the backoff
    curve), recording ``error`` (any object, as its text). A bad ``delay`` raises
    InvalidOptions here, at the ``raise``, checked as ``JobHandle.retry`` checks it."""

    def __init__(self, delay: v.Duration | None = None, error: object = "retry requested") -> None:
        v.optional_duration(delay, "Retry delay")
        text = _message(error)
        super().__init__(text)
        self.delay = delay
        self.error = "retry requested" if text is None else text

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its delay and error: the default would pass ``args`` (the error
        # text) as the delay, which the check above refuses — a Retry raised in a process
        # pool's child must come back as itself, not as a BrokenProcessPool
        return (type(self), (self.delay, self.error), self.__dict__)


@dataclass(frozen=True)
class Outcome:
    """The operation a handler's result calls for: ``ack``, ``retry`` or ``fail``."""

    kind: str
    error: str | None = None
    delay: v.Duration | None = None


ACK = Outcome("ack")


def outcome_of(work: Work) -> Outcome:
    """Run a sync handler or task and map what it did to an Outcome (an ``Exception`` from
    it is a retry, never raised here)."""
    call = work.call
    assert call is not None  # set for every Work that is run
    started = time.perf_counter()
    try:
        with running(work.handle):  # alk.current_job() inside the handler
            result = call()
    except BaseException as exc:  # noqa: BLE001 - anything the handler raises is an outcome
        return _raised(work, exc)
    finally:
        work.duration = time.perf_counter() - started  # the handler's run time (metrics)
    if result is not None and (
        inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        message = _discard_unrun(work.what, result)
        log.warning("job %s of %r: %s", work.handle.id, work.handle._queue.name, message, extra=work.context)
        return Outcome("retry", message)
    return ACK


async def aoutcome_of(work: Work) -> Outcome:
    """Await an ``async def`` handler or task (in its own asyncio task on the worker's loop)
    and map what it did to an Outcome. ``CancelledError`` is not an outcome: it propagates
    to the runner, which knows whether the worker cancelled it. Nor is ``GeneratorExit``
    when the coroutine is being closed — a task dropped at shutdown for ignoring its
    cancellation, collected once the worker's loop is gone — and nothing may be recorded
    for it; one the job's own code raises is an outcome like any other."""
    call = work.call
    assert call is not None  # set for every Work that is run
    me = asyncio.current_task()
    started = time.perf_counter()
    try:
        with running(work.handle):  # set in this asyncio task's own context
            result = await call()
    except asyncio.CancelledError:
        raise
    except GeneratorExit as exc:
        if _closed(me):
            raise
        return _raised(work, exc)  # raised by the job's own code, as it ran
    except BaseException as exc:  # noqa: BLE001 - anything else the handler raises is an outcome
        return _raised(work, exc)
    finally:
        work.duration = time.perf_counter() - started  # the handler's run time (metrics)
    if result is not None and (
        inspect.iscoroutine(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        # ``return send(x)`` without ``await``: its work never ran. (A Task or Future it
        # returns is scheduled on the loop and runs by itself: no reason to retry.)
        message = _discard_unrun(work.what, result, awaited=True)
        log.warning("job %s of %r: %s", work.handle.id, work.handle._queue.name, message, extra=work.context)
        return Outcome("retry", message)
    return ACK


def _closed(me: asyncio.Task[Any] | None) -> bool:
    """Whether a GeneratorExit in the job's coroutine is its close — the task dropped at
    shutdown, collected once the loop is gone or while it steps another task — rather than
    an exception the job's code raised while running: a close is never a step of the job's
    own asyncio task."""
    try:
        return asyncio.current_task() is not me
    except RuntimeError:  # no event loop runs in this thread: it is gone
        return True


_UNREADABLE: Any = object()  # "reading the attribute raised"


def _attribute(exc: BaseException, name: str) -> Any:
    """``exc.name`` (None when it has none), or _UNREADABLE when reading it raises: a
    subclass may make it a property, and one that raised here lost the outcome (the
    claim lapsed with nothing recorded)."""
    try:
        return getattr(exc, name, None)
    except Exception:  # noqa: BLE001 - a broken attribute must not lose the outcome
        return _UNREADABLE


def _said(exc: BaseException, name: str) -> str | None:
    """What a ``Fail``'s message or a ``Retry``'s error records: the attribute's text, or
    the exception's own when the attribute cannot be read."""
    value = _attribute(exc, name)
    return (text_of(exc) or type(exc).__name__) if value is _UNREADABLE else _message(value)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, however nested (``exc`` itself when it is
    no group), in order. Walked with a stack of its own, not by recursion: a group nested
    deeper than the recursion limit (a recursive crawl opening a TaskGroup per level, each
    child in its own task) raised RecursionError here, and the job's outcome was lost. A
    group met again (a subclass whose ``exceptions`` leads back to itself) is skipped."""
    if _GROUP is None or not isinstance(exc, _GROUP):
        return [exc]
    found: list[BaseException] = []
    seen: set[int] = set()  # ids of the groups walked (all alive until this returns)
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if isinstance(current, _GROUP):
            if id(current) in seen:
                continue
            seen.add(id(current))
            inner = _attribute(current, "exceptions")
            if inner is not _UNREADABLE and isinstance(inner, tuple):
                stack.extend(reversed(inner))
                continue
        found.append(current)
    return found


def _grouped(exc: BaseException) -> BaseException | None:
    """The outcome an exception group says, as the exception to map: its first ``Fail``
    (the job cannot succeed, whatever else failed beside it), else — when every exception
    it holds is a ``Retry`` — the one with the longest delay (None: the curve); otherwise
    None, the group being an error like any other. A ``Fail`` or ``Retry`` raised in a
    child of an ``asyncio.TaskGroup`` reaches the worker wrapped in such a group."""
    if _GROUP is None or not isinstance(exc, _GROUP):
        return None
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, Fail):
            return leaf
    if not leaves or not all(isinstance(leaf, Retry) for leaf in leaves):
        return None
    return max(leaves, key=_later)


def _later(retry: BaseException) -> float:
    """A Retry's delay in seconds, for choosing the latest; the curve (None, or a delay that
    cannot be read) and a delay its handle would refuse (a subclass that skipped the checks,
    refused as it would be alone) rank above every delay, so they are chosen."""
    delay = _attribute(retry, "delay")
    if delay is None or delay is _UNREADABLE:
        return float("inf")
    try:
        return v.duration(delay, "Retry delay")
    except InvalidOptions:
        return float("inf")


def _raised(work: Work, exc: BaseException) -> Outcome:
    grouped = _grouped(exc)
    if grouped is not None:
        exc = grouped
    if isinstance(exc, Fail):  # attributes read defensively: a subclass may set its own
        return Outcome("fail", _said(exc, "message"))
    if isinstance(exc, Retry):
        delay = _attribute(exc, "delay")  # unreadable: the backoff curve
        return Outcome("retry", _said(exc, "error"), None if delay is _UNREADABLE else delay)
    job = work.job
    text = text_of(exc)  # once, never raising: a broken __str__ must not lose the outcome
    log.warning(
        "job %s of %r raised %s: %s", job.id, job.queue, type(exc).__name__, text,
        extra=work.context, exc_info=exc,
    )
    if not isinstance(exc, Exception):
        # SystemExit, KeyboardInterrupt raised by the job itself (a signal stops the worker
        # on the main thread instead): retried like any error, named, as str(exc) may be "1"
        return Outcome("retry", f"{type(exc).__name__}: {text}".rstrip(": "))
    return Outcome("retry", text or type(exc).__name__)


def _discard_unrun(what: str, result: Any, *, awaited: bool = False) -> str:
    """Close what a call returned that holds its work unrun — a coroutine or awaitable (so it
    never runs, and Python does not warn that it was never awaited), a generator or an async
    generator (whose body never ran: nothing iterates it) — and say what happened.
    ``awaited``: the call was an ``async def`` one, awaited, that returned it."""
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()
    if awaited and inspect.iscoroutine(result):
        return (
            f"{what} returned a coroutine ({type(result).__name__}) it did not await: it was "
            "discarded unrun and the job will be retried (write `return await ...`)"
        )
    if inspect.isawaitable(result):
        return (
            f"{what} returned an awaitable ({type(result).__name__}) but is not an async def "
            "function: it was discarded unawaited and the job will be retried (declare it "
            "`async def` for the worker to await it)"
        )
    kind = "an async generator" if inspect.isasyncgen(result) else "a generator"
    return (
        f"{what} returned {kind} ({type(result).__name__}): its body never ran (nothing "
        "iterates it) and the job will be retried; a task or handler returns when its work "
        "is done, it does not yield"
    )


def landed_as(h: JobHandle, outcome: Outcome) -> str:
    """What ``outcome`` does to the job once it lands: ACKED, RETRIED or DEAD (a ``fail``,
    or a retry at the attempt budget, which ``retry()`` turns into a burial)."""
    if outcome.kind == "ack":
        return ACKED
    if outcome.kind == "fail" or h._attempts >= h._max_attempts:
        return DEAD
    return RETRIED


def refused(outcome: Outcome, exc: InvalidOptions) -> Outcome:
    """The plain retry on the backoff curve recorded when the handle refused ``outcome``'s
    arguments (a Fail or Retry subclass that skipped the constructor's checks): the error
    says what was wrong, and the job is never left to lapse unrecorded."""
    error = "" if outcome.error is None else f": {text_of(outcome.error)}"
    return Outcome("retry", f"{outcome.kind} refused ({exc}); retried on the backoff curve instead{error}")


def settle(
    h: JobHandle, outcome: Outcome, context: dict[str, Any], ack: Callable[[JobHandle], bool] | None = None
) -> str | None:
    """Record ``outcome`` under the job's own claim: how it landed (``landed_as``), or None
    when it was refused. Logs one WARNING when the job went dead through it. ``ack``, when
    given, says what the ack did instead of ``h.ack()`` (the worker's batched acks, acker.py:
    written already, together with others)."""
    landing = landed_as(h, outcome)  # read before the op: the handle's job is as claimed
    if outcome.kind == "ack":
        return landing if (h.ack() if ack is None else ack(h)) else None
    if outcome.kind == "fail":
        landed = h.fail(outcome.error)
        last_error = "failed" if outcome.error is None else outcome.error
    else:
        error = "retry requested" if outcome.error is None else outcome.error
        landed = h.retry(error, outcome.delay)
        last_error = "max attempts exceeded"
    if landed and landing == DEAD:
        # the claim row's own fields: building the Job would decode a payload that may not be
        # JSON (a job failed for that very reason, dispatch.undecodable)
        because = "" if outcome.error in (None, last_error) else f" (last error: {outcome.error})"
        log.warning(
            "job %s of %r is dead after %d/%d attempt(s): %s%s",
            h.id, h._queue.name, h._attempts, h._max_attempts, last_error, because,
            extra={**context, "last_error": last_error},
        )
    return landing if landed else None
