"""The CLI's SIGTERM/SIGINT handler must never deadlock the process it stops.

A Python signal handler runs in the main thread between two bytecodes — possibly while
that thread holds a lock the handler needs (the stop's own take none, but a callback the
application registered with ``on_stop`` may, and so does a logging handler). The handler
therefore only hands the stop to another thread. The test holds the lock of an ``on_stop``
callback in the main thread while the signal arrives: a handler that stops the token itself
blocks on that lock forever; a hand-off finishes once it is released.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading
    from alkstore_sa.cli._common import stop_on_signals

    stop = stop_on_signals()
    app_lock = threading.Lock()             # the application's, taken by its stop callback
    def on_stop():
        with app_lock:
            pass
    stop.on_stop(on_stop)
    with app_lock:                          # the main thread is inside the application's critical section
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before the lock is released
        for _ in range(1000):
            pass                            # give the handler its bytecode boundary
    sys.exit(0 if stop.wait(10) else 3)
    """
)


def test_a_signal_arriving_while_the_main_thread_holds_a_stop_callbacks_lock_still_stops() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20,  # a deadlocked handler never returns
    )
    assert proc.returncode == 0, proc.stderr


REPEATED = textwrap.dedent(
    """
    import logging, os, signal, sys, time
    from alkstore_sa.cli._common import COLD_AFTER, stop_on_signals

    logging.basicConfig(level=logging.INFO)
    stop = stop_on_signals()
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: a graceful stop
    os.kill(os.getpid(), signal.SIGINT)  # the same keypress again, forwarded by a wrapper
    os.kill(os.getpid(), signal.SIGTERM)  # and a process manager's SIGTERM
    if not stop.wait(10):
        sys.exit(3)
    time.sleep(0.5)  # the stop threads' log lines are out
    print("still running", flush=True)
    time.sleep(COLD_AFTER)
    os.kill(os.getpid(), signal.SIGINT)  # a second press: exit at once
    time.sleep(10)
    sys.exit(4)
    """
)


def test_a_second_ctrl_c_exits_at_once_but_a_forwarded_duplicate_does_not() -> None:
    """A SIGINT (or SIGTERM) right after the first stop signal is the same stop; a SIGINT
    COLD_AFTER seconds later or more is a second Ctrl-C: exit code 130 at once."""
    proc = subprocess.run([sys.executable, "-c", REPEATED], capture_output=True, text=True, timeout=30)
    assert proc.stdout == "still running\n", (proc.stdout, proc.stderr)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.count("received SIGINT; stopping (Ctrl-C again to exit at once)") == 1, proc.stderr
    assert "exiting now" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
