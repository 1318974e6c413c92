"""Locks (SPEC §8): leases in a table, each operation one atomic statement.

A lease expires silently at its deadline; anyone may then acquire it. A holder learns that
it lost the lock only from ``renew`` returning False, so work guarded by a lock must renew
well inside the TTL and stop when renewal fails. No advisory locks: they break under
PgBouncer's transaction pooling and vanish with a dropped connection without telling the
holder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _validate as v
from ._rows import ts
from .model import LockInfo

if TYPE_CHECKING:
    from .store import Store


_NO_TTL = object()


class Lock:
    """A handle on the lock ``name``; constructing it writes nothing. The name follows the
    name rules (InvalidName): the reserved ones are alkstore's own (the scheduler's
    leadership lease), which a handle made here must not take or release."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = v.store(store)
        self.name = v.name(name, "lock name")

    @classmethod
    def _reserved(cls, store: Store, name: str) -> Lock:
        """A handle on one of alkstore's own locks, whose reserved name ``Lock()`` refuses."""
        lock = cls.__new__(cls)
        lock.store, lock.name = store, name
        return lock

    def __repr__(self) -> str:
        return f"<alkstore_sa.Lock {self.name!r}>"

    def _params(self, owner: object, ttl: object = _NO_TTL) -> dict[str, object]:
        self.store._check_open()
        params: dict[str, object] = {"name": self.name, "owner": v.worker_id(owner, "owner"), "now": self.store.now()}
        if ttl is not _NO_TTL:  # acquire/renew: ttl=None is as invalid as ttl=-1
            params["ttl"] = v.lease(ttl, "ttl")
        return params

    def acquire(self, owner: str, ttl: v.Duration) -> bool:
        """Take the lease for ``ttl`` seconds if it is free or lapsed (or already ``owner``'s,
        which extends it); True when ``owner`` holds it now."""
        params = self._params(owner, ttl)
        # a repeat after a disconnect is harmless: one that landed made the lease owner's,
        # and the repeat extends it (same answer); ``release`` is never repeated (a repeat
        # of one that landed would answer False for a lease that was given up)
        with self.store.executor(retry=True) as ex:
            return self.store.backend.lock_acquire(ex, params)

    def renew(self, owner: str, ttl: v.Duration) -> bool:
        """Extend ``owner``'s live lease to now + ``ttl``; False once it lapsed or another holds it."""
        params = self._params(owner, ttl)
        with self.store.executor(retry=True) as ex:  # a repeat extends the same live lease again
            return self.store.backend.lock_renew(ex, params)

    def release(self, owner: str) -> bool:
        """Give the lease up; False when ``owner`` did not hold a live lease."""
        params = self._params(owner)
        with self.store.executor() as ex:
            return self.store.backend.lock_release(ex, params)

    def holder(self) -> LockInfo | None:
        """The live holder, or None when the lock is free or its lease lapsed."""
        self.store._check_open()
        with self.store.executor(retry=True) as ex:  # a read
            row = self.store.backend.lock_holder(ex, {"name": self.name, "now": self.store.now()})
        if row is None:
            return None
        owner, acquired_at, expires_at = row
        return LockInfo(self.name, owner, ts(acquired_at), ts(expires_at))  # type: ignore[arg-type]
