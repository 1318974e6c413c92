"""Child-process side of the rogue-ticker test: spawn-safe functions run by
``tests.concurrency.harness`` (each builds its OWN store from the spec's URL and schema)."""

from __future__ import annotations

import time
from typing import Any

from alkstore_sa.scheduler import Scheduler
from tests.concurrency.workers import open_store


def tick_and_reregister(spec: dict[str, Any]) -> dict[str, Any]:
    """Tick every schedule (no leadership lease: a rogue ticker) for ``seconds``; with
    ``reregister``, also re-register each schedule between ticks under the same interval
    (a new payload, the boundary kept). Returns how many jobs this process's ticks fired."""
    store = open_store(spec)
    try:
        scheduler = Scheduler(store)
        fired = ticks = registrations = 0
        deadline = time.monotonic() + spec["seconds"]
        while time.monotonic() < deadline:
            fired += scheduler.tick()
            ticks += 1
            if spec["reregister"]:
                for name, queue in spec["schedules"]:
                    store.schedule(name, "@every 1s", queue, {"registration": registrations})
                    registrations += 1
            time.sleep(0.002)
        return {"fired": fired, "ticks": ticks}
    finally:
        store.close()
