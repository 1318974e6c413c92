"""The caller's-transaction forms: write or read in the caller's Session, scoped_session or
Connection — or, the ``a``-functions, in an AsyncSession, async_scoped_session or
AsyncConnection. They never commit: a job becomes visible at the caller's commit, and a
rollback leaves no trace.

One implementation serves both: an ``a``-function runs the sync one on the caller's async
connection through ``run_sync`` (SQLAlchemy's bridge: the statements go through the
caller's async driver, in its transaction), and every statement is compiled for the driver
of the connection it runs on (``Backend.for_dialect``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Union

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import InvalidRequestError, PendingRollbackError, UnboundExecutionError
from sqlalchemy.util.concurrency import in_greenlet

from . import _validate as v
from ._backends import backend_for
from ._orm import is_scoped_session, is_session, is_session_like
from ._rows import job_from_row
from .errors import InvalidOptions
from .model import Job
from .queue import DEFAULT_OPTS, Queue, encode_all, enqueue_params
from .schema import DEFAULT_SCHEMA, jobs, notifications, stream_events
from .store import Store, _DefaultStore, store_for

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

SessionLike = Union["Session", "scoped_session[Any]", Connection]
AsyncSessionLike = Union["AsyncSession", "async_scoped_session[Any]", "AsyncConnection"]
T = TypeVar("T")

# What each function asks the session's ``get_bind`` for, as the ``clause`` a statement of
# its own would carry: a session that routes by statement (writes to a primary, reads to a
# replica; ``binds`` keyed by table) sends each call where such a statement would go — the
# writes never to a replica — instead of wherever a call with no context goes.
_CLAUSES: dict[str, Any] = {
    "enqueue": insert(jobs),
    "enqueue_many": insert(jobs),
    "outbox_enqueue": insert(jobs),
    "publish": insert(stream_events),
    "notify": insert(notifications),
    "get_job": select(jobs),
}


def connection_of(session: SessionLike, function: str = "enqueue", owner: str = "alk") -> Connection:
    """The Connection carrying the caller's transaction (begun if it was not yet).
    ``owner.function`` names the caller's function in the error for a wrong argument
    (``alk.enqueue``; ``task.enqueue`` for a Task's)."""
    return _connect(session, bind_of_caller(session, function, owner), function, owner)


def bind_of_caller(session: SessionLike, function: str = "enqueue", owner: str = "alk") -> Engine | Connection:
    """What the caller's session runs on (its Engine, or the Connection it is bound to),
    with everything ``connection_of`` refuses refused — but no connection taken, no
    transaction begun: the store it names (``store_for``) serves validating the call's
    input before any I/O, and ``_connect`` then takes the connection."""
    if isinstance(session, Connection):
        _refuse_outside_run_sync(session.dialect, session, function, owner)
        _refuse_unusable(session, session, f"{owner}.{function}", "a Connection")
        return session
    if is_session_like(session):
        bind = _bind_of(session, function, owner=owner)
        _refuse_outside_run_sync(bind.dialect, session, function, owner)  # before any I/O
        _refuse_unusable(session, bind, f"{owner}.{function}", f"a {type(session).__name__}")
        return bind
    if is_async_session(session):
        raise InvalidOptions(
            f"alk.{function} got an {type(session).__name__}: use `await alk.a{function}(...)`"
        )
    raise InvalidOptions(
        f"alk.{function} expected a Session, scoped_session or Connection, got {type(session).__name__}"
    )


def _connect(session: SessionLike, bind: Engine | Connection, function: str, owner: str) -> Connection:
    """The Connection of ``session`` (``bind_of_caller`` checked both): the session's
    connection taken, and its transaction begun, if it was not yet."""
    if isinstance(session, Connection):
        return session
    try:
        # the bind bind_of_caller checked, not a second get_bind() that may choose another
        return session.connection(bind_arguments={"bind": bind})
    except Exception as exc:
        if _is_concurrent_use(exc):
            raise _concurrent_use(bind.dialect.is_async, session, function, owner) from exc
        if isinstance(exc, InvalidRequestError) and not isinstance(exc, PendingRollbackError):
            # SQLAlchemy refusing the session's state, not the database refusing anything
            # (a transaction a rollback() closed inside its `with session.begin():` block, ...)
            called = f"{owner}.{'a' if bind.dialect.is_async else ''}{function}"
            raise InvalidOptions(
                f"{called} got a session that cannot run a statement now ({exc}): call it in an "
                "open transaction of the session. Nothing was written by this call"
            ) from exc
        # the session's own checkout or begin failed (server down, a pool with none to
        # spare, a transaction SQLAlchemy wants rolled back): an AlkstoreError as well
        raise backend_for(bind.dialect.name, DEFAULT_SCHEMA).translate_error(exc) from exc


def _is_concurrent_use(exc: Exception) -> bool:
    """Whether ``exc`` is SQLAlchemy's refusal of a Session used by two operations at once
    (its "illegal state change" family, code ``isce``: "This session is provisioning a new
    connection; concurrent operations are not permitted", and the like)."""
    return isinstance(exc, InvalidRequestError) and getattr(exc, "code", None) == "isce"


def _concurrent_use(is_async: bool, session: object, function: str, owner: str) -> InvalidOptions:
    """The error for a session another operation is using at this moment: ``asyncio.gather``
    of two calls on one AsyncSession, or a Session shared by threads. Nothing was sent, so
    the caller's transaction is as it was; the call is the caller's to make again, in turn."""
    if is_async:
        return InvalidOptions(
            f"{owner}.a{function} got an AsyncSession already running another operation (as "
            "asyncio.gather of two calls on one session does): an AsyncSession runs one "
            "operation at a time — await the calls one after another, or give each task its "
            "own AsyncSession. Nothing was written by this call"
        )
    return InvalidOptions(
        f"{owner}.{function} got a {type(session).__name__} already running another operation "
        "(in another thread): a Session runs one operation at a time — give each thread its "
        "own Session (a scoped_session does). Nothing was written by this call"
    )


def _bind_of(
    session: Session | scoped_session[Any], function: str, *, is_async: bool = False, owner: str = "alk"
) -> Any:
    """The Engine or Connection the session runs on; InvalidOptions for a session bound to
    none (``session.connection()`` would raise SQLAlchemy's UnboundExecutionError). Binds
    per mapper or table only say nothing either: these functions touch no mapped class.
    The session's ``get_bind`` is asked with the clause of the call's statement
    (``_CLAUSES``): a session that routes writes to a primary by it sends the call there.
    A ``get_bind`` that cannot answer without a mapped class or a shard (a ``ShardedSession``
    asserts it has a mapper; a custom one may read ``mapper.class_``) is refused the same way,
    with its own error as the cause, rather than escaping as an AssertionError or
    AttributeError."""
    kind, conn = ("an AsyncSession", "an AsyncConnection (await ") if is_async else (
        f"a {type(session).__name__}", "a Connection (")
    # a scoped_session's own scope (Flask-SQLAlchemy's app context) raises as it raises
    real = session() if is_scoped_session(session) else session
    try:
        return real.get_bind(clause=_CLAUSES.get(function.removeprefix("a")))
    except UnboundExecutionError:
        raise InvalidOptions(
            f"{owner}.{function} got {kind} with no bind: bind it to an engine, or pass {conn}"
            "session.connection(bind_arguments={'mapper': Model}))"
        ) from None
    except Exception as exc:
        raise InvalidOptions(
            f"{owner}.{function} got {kind} whose get_bind() names no bind for a statement of no "
            f"mapped class ({type(exc).__name__}: {exc}): pass {conn}"
            "session.connection(bind_arguments={'mapper': Model}), or {'shard_id': ...} for a "
            "ShardedSession) of the database that holds alkstore's tables. Nothing was written"
        ) from exc


def sync_given_to_async(session: SessionLike, called: str, instead: str) -> InvalidOptions:
    """The error for a synchronous session given to an ``a``-function (``called``): use
    ``instead`` (the sync form) — unless it is the synchronous facade of an async one
    (``.sync_session``, ``.sync_connection``: its engine's driver is async), which works only
    inside run_sync, so the sync form would refuse it as well: pass the async object itself."""
    kind = type(session).__name__
    try:
        dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    except Exception:  # noqa: BLE001 - unbound, or a scoped_session outside its scope: only the advice depends on it
        dialect = None
    if dialect is not None and dialect.is_async:
        real = "AsyncConnection" if isinstance(session, Connection) else "AsyncSession"
        return InvalidOptions(
            f"{called} got the {kind} of an {real} (its synchronous facade, usable only inside "
            f"run_sync): pass the {real} itself"
        )
    return InvalidOptions(f"{called} got a {kind}: use {instead}")


def _refuse_unusable(session: Any, bind: Any, called: str, given: str, *, is_async: bool = False) -> None:
    """Refuse, before any I/O, what cannot carry the caller's transaction: a closed
    Connection (or a Session bound to one), and a Session made with ``autobegin=False``
    outside ``begin()`` — these functions join the caller's transaction, never begin one.
    SQLAlchemy's own errors for them would come out as a DatabaseError, as if the database
    had refused a statement. ``session``: the Session or Connection (an async one's sync
    facade), ``called``: the function the caller used, ``given``: what they passed ("an
    AsyncSession")."""
    if isinstance(bind, Connection) and bind.closed:
        own = bind is session
        raise InvalidOptions(
            f"{called} got {given} {'that is closed' if own else 'bound to a closed Connection'}: "
            "pass an open one, in the transaction the job is to join"
        )
    real = session() if is_scoped_session(session) else session
    ended = _transaction_ended(real) if is_session(real) else None
    if ended is not None:
        raise InvalidOptions(
            f"{called} got {given} whose transaction has already {ended}: there is no "
            "transaction left for the job to join. Call it in the transaction, before its "
            "commit (a before_commit or after_flush hook, if it must be a hook): the job then "
            "commits with your rows. Nothing was written by this call"
        )
    if is_session(real) and not real.autobegin and not real.in_transaction():
        begin = "async with session.begin():" if is_async else "with session.begin():"
        raise InvalidOptions(
            f"{called} got {given} made with autobegin=False and no transaction begun: "
            f"call it inside `{begin}` (it joins your transaction, never begins one)"
        )


def _transaction_ended(session: Session) -> str | None:
    """How the session's transaction has ended while it is still the session's (None if it
    has not): committed (in an ``after_commit`` hook), or rolled back by a ``rollback()``
    (in an ``after_rollback`` hook). No statement can join it, and the refusal can say why.
    (A transaction a failed flush rolled back is not one of these: its PendingRollbackError
    reports a database failure, and stays a DatabaseError. Other states SQLAlchemy refuses
    statements in, such as a two-phase transaction after ``prepare()``, are refused in
    ``_connect``.)"""
    from sqlalchemy.orm.session import SessionTransactionState  # the caller has the ORM

    tx = session.get_transaction()
    if tx is None or tx.is_active:
        return None
    state = getattr(tx, "_state", None)  # SessionTransactionState: no public accessor
    if state is SessionTransactionState.COMMITTED:
        return "committed (as in an after_commit hook)"
    if state is SessionTransactionState.DEACTIVE and getattr(tx, "_rollback_exception", None) is None:
        return "been rolled back (as in an after_rollback hook)"
    return None


def _refuse_outside_run_sync(dialect: Any, session: object, function: str, owner: str = "alk") -> None:
    """The synchronous facade of an async session or connection (``.sync_session``,
    ``.sync_connection``) works only inside ``run_sync``; called directly, its driver fails
    mid-call and leaves the caller's transaction unusable. Refused before any I/O."""
    if dialect.is_async and not in_greenlet():
        raise InvalidOptions(
            f"{owner}.{function} got a {type(session).__name__} of an async engine ({dialect.driver}) "
            f"outside run_sync: use `await {owner}.a{function}(...)` with the AsyncSession or AsyncConnection"
        )


def is_async_session(session: object) -> bool:
    """Whether ``session`` is one of SQLAlchemy's asyncio objects (imported only here: the
    asyncio extension is not needed by a synchronous application)."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    return isinstance(session, (AsyncSession, AsyncConnection, async_scoped_session))


async def run_in_async_transaction(
    session: AsyncSessionLike, function: str, fn: Callable[..., T], *args: Any, owner: str = "alk", **kw: Any
) -> T:
    """Run the sync form ``fn`` in the async caller's transaction: ``run_sync`` hands it the
    synchronous facade (Session or Connection) of that same transaction. ``owner`` names
    whose ``a``-function was called in errors (``alk``; ``task`` for a Task's)."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    called = f"{owner}.a{function}"
    if isinstance(session, async_scoped_session):
        session = session()  # the AsyncSession of the current scope
    if isinstance(session, AsyncSession):
        bind = _bind_of(session.sync_session, f"a{function}", is_async=True, owner=owner)  # before run_sync names the sync form
        _refuse_unusable(session.sync_session, bind, called, "an AsyncSession", is_async=True)
    if isinstance(session, AsyncConnection):
        if session.sync_connection is None:  # SQLAlchemy's AsyncContextNotStarted is no AlkstoreError
            raise InvalidOptions(
                f"{called} got an AsyncConnection not started (engine.connect() without await): "
                "use `async with engine.connect() as conn:` or `conn = await engine.connect()`"
            )
        sync = session.sync_connection
        _refuse_unusable(sync, sync, called, "an AsyncConnection", is_async=True)
    if isinstance(session, (AsyncSession, AsyncConnection)):
        return await session.run_sync(fn, *args, **kw)
    if isinstance(session, Connection) or is_session_like(session):
        raise sync_given_to_async(session, called, f"`alk.{function}(...)` (no await)")
    raise InvalidOptions(
        f"alk.a{function} expected an AsyncSession, async_scoped_session or AsyncConnection, "
        f"got {type(session).__name__}"
    )


def _target(
    session: SessionLike, queue: str | Queue, function: str, *, allow_reserved: bool = False, owner: str = "alk"
) -> tuple[Engine | Connection, Store | _DefaultStore, str, Any]:
    """The caller's bind (no connection taken yet: see ``bind_of_caller``), the store the
    call writes through, the queue's name and the options it stamps."""
    if isinstance(queue, Queue):
        queue.store._check_open()
        return bind_of_caller(session, function, owner), queue.store, queue.name, queue.opts
    name = v.name(queue, "queue name", allow_reserved=allow_reserved)
    bind = bind_of_caller(session, function, owner)
    return bind, store_for(bind), name, DEFAULT_OPTS


def enqueue(
    session: SessionLike,
    queue: str | Queue,
    payload: Any,
    *,
    delay: v.Duration | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    expires: v.Duration | None = None,
    unique_key: str | None = None,
) -> int:
    """Enqueue one job in the caller's transaction; returns its id. Never commits.

    A queue name stamps the default options; a Queue handle stamps its own. While a live
    job of the queue holds ``unique_key`` (one committed, or earlier in this transaction),
    nothing is written and that job's id is returned; one held by another open transaction
    makes this wait until that transaction ends (SPEC §14).
    """
    return enqueue_as(
        "alk", session, queue, payload, delay=delay, run_at=run_at, priority=priority,
        max_attempts=max_attempts, expires=expires, unique_key=unique_key,
    )


def enqueue_as(
    owner: str,
    session: SessionLike,
    queue: str | Queue,
    payload: Any,
    *,
    delay: v.Duration | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    expires: v.Duration | None = None,
    unique_key: str | None = None,
) -> int:
    """``enqueue``, called as ``owner.enqueue`` (``task`` for a Task's): its refusals of the
    session name the call the caller made."""
    bind, store, name, opts = _target(session, queue, "enqueue", owner=owner)
    params = enqueue_params(
        store, name, opts, delay=delay, run_at=run_at, priority=priority,
        max_attempts=max_attempts, expires=expires, unique_key=unique_key,
    )
    params["payload"] = v.encode_payload(payload, store.max_payload_bytes)
    ex = store.session_executor(_connect(session, bind, "enqueue", owner))
    return ex.backend.enqueue(ex, params)


def enqueue_many(
    session: SessionLike,
    queue: str | Queue,
    payloads: Iterable[Any],
    *,
    delay: v.Duration | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    expires: v.Duration | None = None,
) -> list[int]:
    """Enqueue many jobs in the caller's transaction (one statement); ids in payload order."""
    bind, store, name, opts = _target(session, queue, "enqueue_many")
    params = enqueue_params(
        store, name, opts, delay=delay, run_at=run_at, priority=priority,
        max_attempts=max_attempts, expires=expires,
    )
    texts = encode_all(store, payloads)
    if not texts:
        return []
    ex = store.session_executor(_connect(session, bind, "enqueue_many", "alk"))
    return ex.backend.enqueue_many(ex, params, texts)


def get_job(session: SessionLike, queue: str | Queue, job_id: int) -> Job | None:
    """Read a job of this queue (live or dead) in the caller's transaction."""
    bind, store, name, _ = _target(session, queue, "get_job", allow_reserved=True)
    job_id = v.job_id(job_id)
    if not v.in_int64(job_id):
        return None
    ex = store.session_executor(_connect(session, bind, "get_job", "alk"))
    row = ex.backend.get_job(ex, {"id": job_id, "queue": name}, by_queue=True)
    return None if row is None else job_from_row(row)


def notify(session: SessionLike, channel: str, payload: str = "") -> None:
    """Send a notification in the caller's transaction: delivered only if it commits."""
    from .notify import notify_params

    params = notify_params(channel, payload)
    bind = bind_of_caller(session, "notify")
    store = store_for(bind)
    params["now"] = store.now()
    ex = store.session_executor(_connect(session, bind, "notify", "alk"))
    ex.backend.notify(ex, params)


def outbox_enqueue(session: SessionLike, outbox: str, payload: Any) -> int:
    """Write one outbox message in the caller's transaction; returns its id."""
    from .outbox import OUTBOX_OPTS, backing_queue_name

    name = backing_queue_name(v.name(outbox, "outbox name"))
    bind = bind_of_caller(session, "outbox_enqueue")
    store = store_for(bind)
    params = enqueue_params(
        store, name, OUTBOX_OPTS, delay=None, run_at=None, priority=0, max_attempts=None, expires=None
    )
    params["payload"] = v.encode_payload(payload, store.max_payload_bytes)
    ex = store.session_executor(_connect(session, bind, "outbox_enqueue", "alk"))
    return ex.backend.enqueue(ex, params)


def publish(session: SessionLike, stream: str, payload: Any) -> int:
    """Append an event to ``stream`` in the caller's transaction; returns its offset. The
    stream's counter stays locked until the caller's transaction ends (offsets commit in
    order), so keep such transactions short."""
    name = v.name(stream, "stream name")
    bind = bind_of_caller(session, "publish")
    store = store_for(bind)
    params = {"stream": name, "payload": v.encode_payload(payload, store.max_payload_bytes), "now": store.now()}
    ex = store.session_executor(_connect(session, bind, "publish", "alk"))
    return ex.backend.stream_publish(ex, params)


# -- the async forms (SPEC §13): the same functions, in an async caller's transaction -------


async def aenqueue(
    session: AsyncSessionLike,
    queue: str | Queue,
    payload: Any,
    *,
    delay: v.Duration | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    expires: v.Duration | None = None,
    unique_key: str | None = None,
) -> int:
    """``enqueue`` in an AsyncSession / async_scoped_session / AsyncConnection's transaction;
    returns the job id (a live holder's, for a held ``unique_key``). Never commits."""
    return await run_in_async_transaction(
        session, "enqueue", enqueue, queue, payload, delay=delay, run_at=run_at,
        priority=priority, max_attempts=max_attempts, expires=expires, unique_key=unique_key,
    )


async def aenqueue_many(
    session: AsyncSessionLike,
    queue: str | Queue,
    payloads: Iterable[Any],
    *,
    delay: v.Duration | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    expires: v.Duration | None = None,
) -> list[int]:
    """``enqueue_many`` in an async caller's transaction; ids in payload order."""
    return await run_in_async_transaction(
        session, "enqueue_many", enqueue_many, queue, payloads, delay=delay, run_at=run_at,
        priority=priority, max_attempts=max_attempts, expires=expires,
    )


async def aget_job(session: AsyncSessionLike, queue: str | Queue, job_id: int) -> Job | None:
    """``get_job`` in an async caller's transaction."""
    return await run_in_async_transaction(session, "get_job", get_job, queue, job_id)


async def anotify(session: AsyncSessionLike, channel: str, payload: str = "") -> None:
    """``notify`` in an async caller's transaction: delivered only if it commits."""
    await run_in_async_transaction(session, "notify", notify, channel, payload)


async def aoutbox_enqueue(session: AsyncSessionLike, outbox: str, payload: Any) -> int:
    """``outbox_enqueue`` in an async caller's transaction; returns the message id."""
    return await run_in_async_transaction(session, "outbox_enqueue", outbox_enqueue, outbox, payload)


async def apublish(session: AsyncSessionLike, stream: str, payload: Any) -> int:
    """``publish`` in an async caller's transaction; returns the event's offset."""
    return await run_in_async_transaction(session, "publish", publish, stream, payload)
