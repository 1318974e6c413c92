"""The CLI's SIGTERM/SIGINT handler must never deadlock the process it stops.

A Python signal handler runs in the main thread between two bytecodes — possibly while
that thread holds a lock the handler needs (the StopToken's, an Event's condition, a
logging handler's). The handler therefore only hands the stop to another thread. The
test holds the token's lock in the main thread while the signal arrives: a handler that
stops the token itself blocks on that lock forever; a hand-off finishes once it is released.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from alkstore_sa.cli._common import stop_on_signals

    stop = stop_on_signals()
    with stop._lock:                        # the main thread is inside the token's critical section
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the lock is released
        for _ in range(1000):
            pass                            # give the handler its bytecode boundary
    sys.exit(0 if stop.wait(10) else 3)
    """
)


def test_a_signal_arriving_while_the_main_thread_holds_the_token_lock_still_stops() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20,  # a deadlocked handler never returns
    )
    assert proc.returncode == 0, proc.stderr
