"""The caller's-transaction forms: write or read in the caller's Session, scoped_session or
Connection. They never commit: a job becomes visible at the caller's commit, and a
rollback leaves no trace."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Union

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, scoped_session

from . import _validate as v
from ._rows import job_from_row
from .errors import InvalidOptions
from .model import Job
from .queue import DEFAULT_OPTS, Queue, encode_all, enqueue_params
from .store import Store, _DefaultStore, store_for

SessionLike = Union[Session, "scoped_session[Any]", Connection]


def connection_of(session: SessionLike) -> Connection:
    """The Connection carrying the caller's transaction (begun if it was not yet)."""
    if isinstance(session, Connection):
        return session
    if isinstance(session, (Session, scoped_session)):
        return session.connection()
    raise InvalidOptions(
        f"expected a Session, scoped_session or Connection, got {type(session).__name__}"
    )


def _target(
    session: SessionLike, queue: str | Queue, *, allow_reserved: bool = False
) -> tuple[Connection, Store | _DefaultStore, str, Any]:
    if isinstance(queue, Queue):
        queue.store._check_open()
        conn = connection_of(session)
        return conn, queue.store, queue.name, queue.opts
    name = v.name(queue, "queue name", allow_reserved=allow_reserved)
    conn = connection_of(session)
    return conn, store_for(conn), name, DEFAULT_OPTS


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
) -> int:
    """Enqueue one job in the caller's transaction; returns its id. Never commits.

    A queue name stamps the default options; a Queue handle stamps its own.
    """
    conn, store, name, opts = _target(session, queue)
    params = enqueue_params(
        store, name, opts, delay=delay, run_at=run_at, priority=priority,
        max_attempts=max_attempts, expires=expires,
    )
    params["payload"] = v.encode_payload(payload, store.max_payload_bytes)
    return store.backend.enqueue(store.session_executor(conn), params)


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
    conn, store, name, opts = _target(session, queue)
    params = enqueue_params(
        store, name, opts, delay=delay, run_at=run_at, priority=priority,
        max_attempts=max_attempts, expires=expires,
    )
    texts = encode_all(store, payloads)
    if not texts:
        return []
    return store.backend.enqueue_many(store.session_executor(conn), params, texts)


def get_job(session: SessionLike, queue: str | Queue, job_id: int) -> Job | None:
    """Read a job of this queue (live or dead) in the caller's transaction."""
    conn, store, name, _ = _target(session, queue, allow_reserved=True)
    job_id = v.job_id(job_id)
    if not v.in_int64(job_id):
        return None
    row = store.backend.get_job(store.session_executor(conn), {"id": job_id, "queue": name}, by_queue=True)
    return None if row is None else job_from_row(row)


def notify(session: SessionLike, channel: str, payload: str = "") -> None:
    """Send a notification in the caller's transaction: delivered only if it commits."""
    from .notify import notify_params

    params = notify_params(channel, payload)
    conn = connection_of(session)
    store = store_for(conn)
    params["now"] = store.now()
    store.backend.notify(store.session_executor(conn), params)


def outbox_enqueue(session: SessionLike, outbox: str, payload: Any) -> int:
    """Write one outbox message in the caller's transaction; returns its id."""
    from .outbox import OUTBOX_OPTS, backing_queue_name

    name = backing_queue_name(v.name(outbox, "outbox name"))
    conn = connection_of(session)
    store = store_for(conn)
    params = enqueue_params(
        store, name, OUTBOX_OPTS, delay=None, run_at=None, priority=0, max_attempts=None, expires=None
    )
    params["payload"] = v.encode_payload(payload, store.max_payload_bytes)
    return store.backend.enqueue(store.session_executor(conn), params)


def publish(session: SessionLike, stream: str, payload: Any) -> int:
    """Append an event to ``stream`` in the caller's transaction; returns its offset. The
    stream's counter stays locked until the caller's transaction ends (offsets commit in
    order), so keep such transactions short."""
    name = v.name(stream, "stream name")
    conn = connection_of(session)
    store = store_for(conn)
    params = {"stream": name, "payload": v.encode_payload(payload, store.max_payload_bytes), "now": store.now()}
    return store.backend.stream_publish(store.session_executor(conn), params)
