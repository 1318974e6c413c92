"""Child-process side of tests/concurrency/test_unique.py: spawn-safe worker functions that
enqueue one shared set of unique keys (own or caller's transactions), and one that claims
and acks those jobs meanwhile (freeing keys while the others enqueue them)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk

PACE_PER_KEY = 0.001  # seconds between transactions, per key they enqueued


def _ready(store: alk.Store, spec: dict[str, Any]) -> None:
    """A second start line, after the store is warm (schema checked, connection open): the
    harness's barrier is passed before that, and a process that is ready first would
    otherwise enqueue every key before the others begin."""
    store.check_schema()
    rendezvous = Path(spec["rendezvous"])
    (rendezvous / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(rendezvous.iterdir())) < spec["parties"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the other processes never got ready")
        time.sleep(0.005)


def enqueue_keys(spec: dict[str, Any]) -> list[list[Any]]:
    """Enqueue every key of ``spec["keys"]`` once, in this process's own shuffled order;
    ``[key, returned id]`` per call. ``mode`` "own": one enqueue per call in its own
    transaction; "callers": sessions of up to ``group`` keys, each taken in key order (two
    transactions waiting on each other's keys in opposite orders would be a deadlock the
    caller made, not one this test is about); "callers-rollback": the same, every other
    session rolled back instead of committed (``[key, id, committed]`` per call); "async": the same through ``alk.aenqueue`` in
    AsyncSessions of an asyncpg or aiosqlite engine (statements compiled for that driver)."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    try:
        q = store.queue(spec["queue"])
        keys: list[str] = list(spec["keys"])
        random.Random(spec["seed"]).shuffle(keys)
        out: list[list[Any]] = []
        _ready(store, spec)
        # a pause between transactions spreads each process's run over ~0.2 s: on two
        # cores with eight processes one of them can be scheduled tens of milliseconds
        # before the rest, and 200 keys unpaced take SQLite less than that — it enqueued
        # every key alone and there was no contention to test
        pace = PACE_PER_KEY
        if spec["mode"] == "own":
            for key in keys:
                out.append([key, q.enqueue({"key": key, "pid": os.getpid()}, unique_key=key)])
                time.sleep(pace)
            return out
        group = spec["group"]
        if spec["mode"] == "async":
            return asyncio.run(_aenqueue_keys(store, spec, keys))
        rollbacks = spec["mode"] == "callers-rollback"
        for i in range(0, len(keys), group):
            chunk = sorted(keys[i : i + group])
            # "callers-rollback": every other transaction (by this process's seed) rolls back
            commit = not rollbacks or (i // group + spec["seed"]) % 2 == 0
            with Session(store.engine) as session:
                ids = [alk.enqueue(session, q, {"key": k, "pid": os.getpid()}, unique_key=k) for k in chunk]
                if commit:
                    session.commit()
                else:
                    session.rollback()
            out += [[k, job_id] + ([commit] if rollbacks else []) for k, job_id in zip(chunk, ids, strict=True)]
            time.sleep(pace * len(chunk))
        return out
    finally:
        store.close()


async def _aenqueue_keys(store: alk.Store, spec: dict[str, Any], keys: list[str]) -> list[list[Any]]:
    url = sa.make_url(spec["url"])
    url = url.set(drivername="sqlite+aiosqlite" if url.get_backend_name() == "sqlite" else "postgresql+asyncpg")
    engine = create_async_engine(url)
    store.register(engine)
    q = store.queue(spec["queue"])
    group = spec["group"]
    out: list[list[Any]] = []
    try:
        for i in range(0, len(keys), group):
            chunk = sorted(keys[i : i + group])
            async with AsyncSession(engine) as session, session.begin():
                ids = [await alk.aenqueue(session, q, {"key": k, "pid": os.getpid()}, unique_key=k) for k in chunk]
            out += [[k, job_id] for k, job_id in zip(chunk, ids, strict=True)]
            await asyncio.sleep(PACE_PER_KEY * len(chunk))
        return out
    finally:
        await engine.dispose()


def ack_while_enqueued(spec: dict[str, Any]) -> list[list[Any]]:
    """Claim and ack the queue's jobs for ``seconds``; ``[id, unique key]`` per ack that
    landed (the record of jobs the final table no longer shows)."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    try:
        q = store.queue(spec["queue"])
        acked: list[list[Any]] = []
        _ready(store, spec)
        deadline = time.monotonic() + spec["seconds"]
        while time.monotonic() < deadline:
            for handle in q.claim_batch(spec["worker_id"], 5):
                key = handle.job.unique_key
                if handle.ack():
                    acked.append([handle.id, key])
        return acked
    finally:
        store.close()
