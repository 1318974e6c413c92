"""A reader never skips an event (SPEC §10), across processes.

Four spawned publisher processes publish into one stream at once, each event in its own
transaction that sleeps a random while between ``alk.publish`` and its commit (some roll
back; a few go through ``Stream.publish``'s own transaction; two of the four publish through
``alk.apublish`` in AsyncSessions of asyncpg or aiosqlite). That is the out-of-order-commit
hazard: were offsets taken from a plain sequence, offset n+1 could commit while n is still
open, and a reader polling ``read(after=last_seen)`` would pass n for good. Two reader
processes poll continuously, recording every offset in the order they saw it.

At the end each reader's sequence must be exactly 1..N — no gap, no duplicate, no jump —
with the payload each publisher committed at that offset; rolled-back publishes consume no
offset (the next publisher is handed the same one), so the committed offsets alone are
exactly 1..N too."""

from __future__ import annotations

import hashlib

import pytest

from tests.concurrency import harness, stream_workers, workers
from tests.support import Target

PUBLISHERS = 4
PER_PUBLISHER = 30
ROLLBACK_EVERY = 6  # each publisher rolls back 5 of its 30
OWN_TX_EVERY = 10  # and publishes 3 of them through Stream.publish (own transaction)
MAX_HOLD = 0.02  # seconds slept inside each publishing transaction, at most
MAX_GAP = 0.005  # seconds between a publisher's transactions, at most


def _rolled_back(i: int, shift: int) -> bool:
    own_tx = i % OWN_TX_EVERY == OWN_TX_EVERY - 1
    return not own_tx and i % ROLLBACK_EVERY == shift


@pytest.mark.slow
def test_a_reader_never_skips_an_event(db: Target, tmp_path, request) -> None:
    stream = "order-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    # all six processes start once each is connected: the readers poll while the stream grows
    ready = {"ready_dir": workers.ready_dir(tmp_path), "parties": PUBLISHERS + 2}
    pub_specs = [
        {
            "role": "publish", "url": db.url, "schema": db.schema, "stream": stream,
            "publisher": f"p{p}",
            "count": PER_PUBLISHER, "seed": 7000 + p, "max_hold": MAX_HOLD, "max_gap": MAX_GAP,
            "rollback_every": ROLLBACK_EVERY, "rollback_offset": p % ROLLBACK_EVERY,
            "own_tx_every": OWN_TX_EVERY,
            "async": p % 2 == 1,  # half of them through alk.apublish in AsyncSessions
            **ready,
        }
        for p in range(PUBLISHERS)
    ]
    expect = sum(
        not _rolled_back(i, s["rollback_offset"]) for s in pub_specs for i in range(PER_PUBLISHER)
    )
    reader_specs = [
        {
            "role": "follow", "url": db.url, "schema": db.schema, "stream": stream,
            "expect": expect,
            "max_seconds": 40.0, "seed": 9000 + r, "limits": limits, **ready,
        }
        for r, limits in enumerate([[1000], [1, 2, 3]])
    ]
    results = harness.run(stream_workers.run_role, pub_specs + reader_specs, tmp_path, timeout=90)
    published = [r for r in results if r["role"] == "publish"]
    followed = [r for r in results if r["role"] == "follow"]

    committed = {}
    for r in published:
        offs = [o for o, _ in r["committed"]]
        assert offs == sorted(offs) and len(set(offs)) == len(offs), r  # one process: increasing
        for offset, payload in r["committed"]:
            assert offset not in committed, f"offset {offset} returned to two committed publishes"
            committed[offset] = payload
    rolled = [(o, p) for r in published for o, p in r["rolled_back"]]
    assert len(committed) == expect
    assert len(rolled) == PUBLISHERS * PER_PUBLISHER - expect > 0

    # rolled-back publishes consumed no offset: the committed ones are exactly 1..N, and
    # every offset a rolled-back publish was handed went to a committed publish afterwards
    # (or is N+1, when a rollback was the very last publish)
    assert sorted(committed) == list(range(1, expect + 1))
    assert all(1 <= o <= expect + 1 for o, _ in rolled), rolled
    rolled_payloads = [p for _, p in rolled]
    assert not any(p in rolled_payloads for p in committed.values())

    for r in followed:
        seen_offsets = [o for o, _ in r["seen"]]
        assert r["jumps"] == [], f"a reader passed an offset before it committed: {r['jumps']}"
        assert seen_offsets == list(range(1, expect + 1)), (
            f"reader saw {len(seen_offsets)} of {expect}; first mismatch at "
            f"{next((i for i, (a, b) in enumerate(zip(seen_offsets, range(1, expect + 1), strict=False)) if a != b), None)}"
        )
        assert {o: p for o, p in r["seen"]} == committed
        # it really followed the stream while it grew, not in one read at the end
        assert r["nonempty_reads"] >= 10, r["nonempty_reads"]

    # the publishers really contended: some publish waited for another's open transaction
    waits = [w for r in published for w in r["waits"]]
    assert max(waits) >= MAX_HOLD / 4, sorted(waits)[-5:]

    # and the stored stream agrees with what the readers saw
    store = db.store()
    try:
        events = store.stream(stream).read(after=0, limit=10 * expect)
        assert [(e.offset, e.payload) for e in events] == sorted(committed.items())
    finally:
        store.close()
