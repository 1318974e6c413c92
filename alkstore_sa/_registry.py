"""Which store the by-name transactional functions (``alk.enqueue(session, "name", ...)``,
``alk.notify``, ``alk.publish``, ...) use for a session: the stores registered for the
session's engine (SPEC §4).

The registration belongs to the *engine object*: ``Engine.execution_options()`` copies
resolve to the engine they were made from, and nothing keys on the pool, so
``engine.dispose()`` and a recycled pool change nothing. Engines are held weakly, the
stores strongly until ``close()`` — and an open store keeps its engine alive anyway
(through the connections it keeps checked out), so it is ``close()`` that lets an
engine go (docs/connections.md). When the open stores of one engine would write differently (another schema,
clock or payload limit) a by-name call is ambiguous and raises ``InvalidOptions``; it
never silently picks one. Stores that would write identically are interchangeable, and
the earliest registered one serves.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from ._backends import backend_for
from ._conn import SessionExecutor, session_executor
from .errors import InvalidOptions
from .schema import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from .store import Store

DEFAULT_MAX_PAYLOAD = 1 << 20

# Values are tuples, replaced (never mutated) under the lock, so lookups need no lock.
_registry: weakref.WeakKeyDictionary[Engine, tuple[Store, ...]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_defaults: dict[str, _DefaultStore] = {}


def root_engine(engine: Engine) -> Engine:
    """The engine an ``execution_options()`` copy (of a copy ...) was made from."""
    while True:
        parent = getattr(engine, "_proxied", None)  # OptionEngine keeps its origin here
        if not isinstance(parent, Engine):
            return engine
        engine = parent


def register(store: Store, engine: Engine) -> None:
    """Serve by-name calls on sessions bound to ``engine`` (or any copy of it) from ``store``."""
    key = root_engine(engine)
    with _lock:
        stores = _registry.get(key, ())
        if store not in stores:
            _registry[key] = (*stores, store)


def unregister(store: Store, engines: list[Engine]) -> None:
    """Remove ``store``'s registrations (and only its own)."""
    with _lock:
        for engine in engines:
            key = root_engine(engine)
            stores = _registry.get(key, ())
            if store in stores:
                rest = tuple(s for s in stores if s is not store)
                if rest:
                    _registry[key] = rest
                else:
                    del _registry[key]


def _settings(store: Store) -> tuple[str, Any, int]:
    """What decides how a by-name call writes: where, with which clock, up to what size."""
    return (store.backend.target_schema(), store.clock, store.max_payload_bytes)


def store_for(conn: Connection | Engine) -> Store | _DefaultStore:
    """The store serving by-name calls on this connection's (or engine's) engine, else the
    defaults.

    Raises InvalidOptions when the engine's open stores would write differently."""
    stores = _registry.get(root_engine(conn.engine))
    if stores:
        first = stores[0]
        if len(stores) == 1:
            return first
        wanted = _settings(first)
        if all(_settings(s) == wanted for s in stores[1:]):
            return first
        raise InvalidOptions(_ambiguity(stores))
    name = conn.dialect.name
    default = _defaults.get(name)
    if default is None:
        default = _defaults[name] = _DefaultStore(name)
    return default


def _ambiguity(stores: tuple[Store, ...]) -> str:
    schemas = sorted({s.schema for s in stores})
    if len({s.backend.target_schema() for s in stores}) > 1:
        what = "schemas " + ", ".join(repr(s) for s in schemas)
    elif len({id(s.clock) for s in stores}) > 1:
        what = f"different clocks (schema {schemas[0]!r})"
    else:
        limits = ", ".join(str(n) for n in sorted({s.max_payload_bytes for s in stores}))
        what = f"different max_payload_bytes ({limits})"
    return (
        f"{len(stores)} open stores on this engine with {what}: a call naming its queue, "
        "channel, stream or outbox by name is ambiguous. Pass a Queue handle of the store "
        "you mean (alk.enqueue(session, store.queue(name), ...)); for notify, publish and "
        "outbox_enqueue, make each store on its own Engine object and bind the session to it"
    )


def _reset_after_fork() -> None:
    """A lock held by another thread at fork time stays held in the child: replace it."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


class _DefaultStore:
    """What the transactional functions use for an engine no Store was made for."""

    clock = None
    schema = DEFAULT_SCHEMA
    max_payload_bytes = DEFAULT_MAX_PAYLOAD

    def __init__(self, dialect_name: str) -> None:
        self.backend = backend_for(dialect_name, DEFAULT_SCHEMA)

    def now(self) -> float | None:
        return time.time() if self.backend.name == "sqlite" else None

    def session_executor(self, conn: Connection) -> SessionExecutor:
        """An executor on the caller's connection, with the backend compiled for its driver."""
        return session_executor(conn, self.backend.for_dialect(conn.dialect), unregistered=True)
