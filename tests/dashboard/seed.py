"""Seeded queues for the dashboard tests: known counts per state, known ids."""

from __future__ import annotations

import re
from dataclasses import dataclass

import alkstore_sa as alk


@dataclass
class Seeded:
    queue: str
    ready: list[int]
    scheduled: list[int]
    processing: list[int]
    dead: list[int]


def seed(store: alk.Store, queue: str, ready: int = 3, scheduled: int = 2, processing: int = 1, dead: int = 2) -> Seeded:
    """``processing + dead`` jobs are claimed first (dead ones then fail), then the ready
    and scheduled ones are enqueued, so each id list is exact."""
    q = store.queue(queue)
    claimed_ids = q.enqueue_many([{"claimed": i} for i in range(processing + dead)])
    handles = q.claim_batch("dash-worker", processing + dead)
    assert sorted(h.id for h in handles) == claimed_ids
    for h in handles[processing:]:
        assert h.fail(f"boom {h.id}")
    ready_ids = q.enqueue_many([{"ready": i} for i in range(ready)]) if ready else []
    later = q.enqueue_many([{"later": i} for i in range(scheduled)], delay=3600) if scheduled else []
    return Seeded(
        queue, ready_ids, later,
        sorted(h.id for h in handles[:processing]), sorted(h.id for h in handles[processing:]),
    )


def row_of(html: str, attr: str, value: str) -> str:
    """The HTML of the table row ``<tr {attr}="{value}">`` (value as it appears escaped)."""
    m = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', html, re.S)
    assert m, f"no row {attr}={value!r}"
    return m.group(1)


def counts_in(row: str) -> dict[str, int]:
    return {s: int(n) for s, n in re.findall(r'<td class="num" data-count="(\w+)">(\d+)</td>', row)}


def job_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)">', html)]


def next_link(html: str) -> str | None:
    m = re.search(r'<a id="next-page" rel="next" href="([^"]+)"', html)
    return None if m is None else m.group(1).replace("&amp;", "&")
