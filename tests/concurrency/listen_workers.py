"""Child-process side of the listener tests: spawn-safe functions run by
``tests.concurrency.harness`` (each builds its OWN store from the spec's URL and schema)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from tests.concurrency.workers import open_store

END = "end"  # the payload after the last counted notification


def stalled_listener(spec: dict[str, Any]) -> dict[str, Any]:
    """Listen on the spec's channel, say so through a ``ready`` file (the parent then stops
    this process with SIGSTOP and notifies), and collect every payload until ``END``; the
    library's error log lines come back too."""
    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    logging.getLogger("alkstore_sa").addHandler(Collect(logging.ERROR))
    store = open_store(spec)
    try:
        with store.listen(spec["channel"]) as sub:
            ready = Path(spec["ready"])
            ready.with_suffix(".tmp").write_text(str(os.getpid()))
            os.replace(ready.with_suffix(".tmp"), ready)
            got: list[str] = []
            while True:
                note = sub.get(timeout=spec["wait"])
                if note is None:
                    return {"got": got, "ended": False, "errors": errors}
                if note.payload == END:
                    return {"got": got, "ended": True, "errors": errors}
                got.append(note.payload)
    finally:
        store.close()
