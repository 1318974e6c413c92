"""Child process of test_listener's descriptor test: fill every descriptor below 1024, then
make a store whose listener (PostgreSQL) or watcher (SQLite) can only get descriptors
>= 1024, and report whether a listen/notify round trip and a queue wake still work.

Run as ``python -m tests.faults.fd_child URL SCHEMA``; prints one JSON line. A child keeps
the thousand dummy descriptors out of the test process."""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

FILL_TO = 1100  # descriptors opened before the store: every later one is >= 1024
DELIVERY = 10.0


def _fill_descriptors() -> list[int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FILL_TO + 200
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise SystemExit(json.dumps({"error": f"RLIMIT_NOFILE hard limit {hard} < {want}"}))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fds = []
    while True:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd >= FILL_TO:
            os.close(fd)
            return fds
        fds.append(fd)


def main(url: str, schema: str) -> dict[str, object]:
    import alkstore_sa as alk

    fds = _fill_descriptors()
    probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor from now on
    os.close(probe)
    store = alk.Store(url, schema=schema)
    try:
        sub = store.listen("fd-test")
        store.notify("fd-test", "over 1024")
        note = sub.get(timeout=DELIVERY)
        sub.close()

        woke = threading.Event()
        hub = store.hub()
        key = store.backend.wake_key("fd-queue")
        token = hub.watch_queue(key, woke.set)
        # a waiting consumer advertises (PostgreSQL notifies only then; docs/performance.md,
        # "Wakes"); let the presence settle and its claim-once-more wake pass
        hub.advertise(key)
        deadline = time.monotonic() + DELIVERY
        while hasattr(hub, "_held") and not (key in hub._held and key not in hub._unsettled):
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        time.sleep(0.05)  # let a wake dispatched by the watch's own start pass
        woke.clear()
        store.queue("fd-queue").enqueue({"n": 1})
        waked = woke.wait(DELIVERY)
        hub.unwatch_queue(key, token)
        return {
            "lowest_free_fd": probe,
            "payload": None if note is None else note.payload,
            "queue_wake": waked,
        }
    finally:
        store.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
