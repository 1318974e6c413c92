"""Child-process side of the stream ordering test: spawn-safe, importable functions.

Each function takes one JSON-able ``spec`` dict, builds its OWN ``alk.Store(url, schema=...)``
(never an engine inherited from the parent) and returns a JSON-able result;
``tests.concurrency.workers.child_main`` runs it behind the start barrier.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.concurrency.workers import meet_when_ready


def publish_slowly(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``spec["count"]`` events, each in its OWN transaction that sleeps a random
    while *after* ``alk.publish`` and *before* its commit (the out-of-order-commit hazard:
    with a plain sequence, a later offset could commit while this one is still open).

    Every ``rollback_every``-th publish (shifted by ``rollback_offset``) rolls back instead;
    every ``own_tx_every``-th goes through ``Stream.publish`` (its own transaction) instead.
    Reports what committed and what rolled back, with the offset each publish returned,
    and how long each call to publish took (a long one waited for another publisher).
    With ``spec["async"]`` the caller's transactions are AsyncSessions (asyncpg or
    aiosqlite) publishing through ``alk.apublish``.
    """
    if spec.get("async"):
        return asyncio.run(_apublish_slowly(spec))
    store = alk.Store(spec["url"], schema=spec["schema"])
    rng = random.Random(spec["seed"])
    name, who = spec["stream"], spec["publisher"]
    committed: list[list[Any]] = []  # [offset, payload]
    rolled_back: list[list[Any]] = []
    waits: list[float] = []
    try:
        st = store.stream(name)
        store.check_schema()  # connected: ready to publish
        meet_when_ready(spec)
        for i in range(spec["count"]):
            payload = {"publisher": who, "i": i}
            began = time.monotonic()
            if spec["own_tx_every"] and i % spec["own_tx_every"] == spec["own_tx_every"] - 1:
                offset = st.publish(payload)
                waits.append(time.monotonic() - began)
                committed.append([offset, payload])
            else:
                with Session(store.engine) as session:
                    offset = alk.publish(session, name, payload)
                    waits.append(time.monotonic() - began)
                    time.sleep(rng.uniform(0.0, spec["max_hold"]))  # inside the transaction
                    if i % spec["rollback_every"] == spec["rollback_offset"]:
                        session.rollback()
                        rolled_back.append([offset, payload])
                    else:
                        session.commit()
                        committed.append([offset, payload])
            time.sleep(rng.uniform(0.0, spec["max_gap"]))  # between transactions
        return {"publisher": who, "committed": committed, "rolled_back": rolled_back, "waits": waits}
    finally:
        store.close()


async def _apublish_slowly(spec: dict[str, Any]) -> dict[str, Any]:
    """``publish_slowly`` through ``alk.apublish`` in AsyncSessions."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    url = sa.make_url(spec["url"])
    url = url.set(drivername="sqlite+aiosqlite" if url.get_backend_name() == "sqlite" else "postgresql+asyncpg")
    engine = create_async_engine(url)
    store.register(engine)
    rng = random.Random(spec["seed"])
    name, who = spec["stream"], spec["publisher"]
    committed: list[list[Any]] = []
    rolled_back: list[list[Any]] = []
    waits: list[float] = []
    try:
        st = store.stream(name)
        store.check_schema()  # both engines connected: ready to publish
        async with engine.connect():
            pass
        await asyncio.to_thread(meet_when_ready, spec)
        for i in range(spec["count"]):
            payload = {"publisher": who, "i": i}
            began = time.monotonic()
            if spec["own_tx_every"] and i % spec["own_tx_every"] == spec["own_tx_every"] - 1:
                offset = await asyncio.to_thread(st.publish, payload)
                waits.append(time.monotonic() - began)
                committed.append([offset, payload])
            else:
                async with AsyncSession(engine) as session:
                    offset = await alk.apublish(session, name, payload)
                    waits.append(time.monotonic() - began)
                    await asyncio.sleep(rng.uniform(0.0, spec["max_hold"]))  # inside the transaction
                    if i % spec["rollback_every"] == spec["rollback_offset"]:
                        await session.rollback()
                        rolled_back.append([offset, payload])
                    else:
                        await session.commit()
                        committed.append([offset, payload])
            await asyncio.sleep(rng.uniform(0.0, spec["max_gap"]))  # between transactions
        return {"publisher": who, "committed": committed, "rolled_back": rolled_back, "waits": waits}
    finally:
        await engine.dispose()
        store.close()


def follow(spec: dict[str, Any]) -> dict[str, Any]:
    """Poll ``read(after=last_seen)`` continuously (limits drawn from ``spec["limits"]``) and
    record every event seen, in the order seen, until ``spec["expect"]`` events arrived or
    ``spec["max_seconds"]`` passed. A read whose first offset is not ``last_seen + 1`` is
    recorded as a jump (the skip this test exists to catch)."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    rng = random.Random(spec["seed"])
    seen: list[list[Any]] = []  # [offset, payload]
    jumps: list[list[int]] = []  # [last_seen, first offset of the next read]
    reads = nonempty = 0
    try:
        st = store.stream(spec["stream"])
        store.check_schema()  # connected: ready to read
        meet_when_ready(spec)
        last = 0
        deadline = time.monotonic() + spec["max_seconds"]
        while len(seen) < spec["expect"] and time.monotonic() < deadline:
            batch = st.read(after=last, limit=rng.choice(spec["limits"]))
            reads += 1
            if not batch:
                continue
            nonempty += 1
            if batch[0].offset != last + 1:
                jumps.append([last, batch[0].offset])
            for event in batch:
                seen.append([event.offset, event.payload])
            last = batch[-1].offset
        return {"seen": seen, "jumps": jumps, "reads": reads, "nonempty_reads": nonempty}
    finally:
        store.close()


def run_role(spec: dict[str, Any]) -> dict[str, Any]:
    """One entry point for publishers and readers, so all of them share one start barrier."""
    fn = {"publish": publish_slowly, "follow": follow}[spec["role"]]
    return {"role": spec["role"], **fn(spec)}
