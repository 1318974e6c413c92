"""``StopToken.stop()`` from a signal handler (SPEC §7, §11): a Python signal handler runs in
the main thread between two bytecodes, possibly while that thread is inside the token's own
code (registering a loop's wake-up, taking it back, waiting) or inside the wake-up the stop
sets. A stop that takes a lock there — the token's ``threading.Lock``, a
``threading.Event``'s condition — deadlocks the process it was meant to stop.

The tests interrupt the code at every line it runs, one line per run, and call ``stop()``
there, in the interrupted thread, as a signal handler would."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

import alkstore_sa as alk

HANG = 30.0  # seconds: only a deadlocked run takes this long


def _interrupted_at(k: int, scenario: Callable[[], Any], handler: Callable[[], None]) -> tuple[bool, bool, Any]:
    """Run ``scenario`` on a thread of its own, calling ``handler`` there at the ``k``-th line
    it executes (in any module: the token's, threading's). (fired, finished, result)."""
    seen, fired, out = [0], [False], []

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not fired[0]:
            seen[0] += 1
            if seen[0] == k:
                fired[0] = True
                handler()
        return trace

    def run() -> None:
        sys.settrace(trace)
        try:
            out.append(scenario())
        finally:
            sys.settrace(None)

    t = threading.Thread(target=run, daemon=True)  # a deadlocked one is left behind
    t.start()
    t.join(HANG)
    return fired[0], not t.is_alive(), out[0] if out else None


def test_a_stop_interrupting_the_tokens_own_code_at_any_line_never_deadlocks_or_loses_a_wake() -> None:
    """The old token took its ``threading.Lock`` in ``stop()``, ``on_stop()`` and the
    callbacks' take-back, and waited on a ``threading.Event``: a stop interrupting the
    thread inside one of those critical sections blocked forever on the lock that thread
    held. Each callback still runs exactly once (unless taken back first), and a wait
    interrupted before it blocks returns True at once."""
    k = 0
    while True:
        k += 1
        token = alk.StopToken()
        ran: list[str] = []
        progress: list[str] = []  # how far the scenario was when the stop came
        stopped_after: list[list[str]] = []

        def scenario(token: alk.StopToken = token, ran: list[str] = ran, progress: list[str] = progress) -> bool:
            token.on_stop(lambda: ran.append("kept"))
            take_back = token.on_stop(lambda: ran.append("taken back"))
            take_back()
            token.wait(0)
            # one line: no line event between the wait's return and the mark
            waited = [token.wait(0.2), progress.append("waited")][0]
            token.on_stop(lambda: ran.append("late"))
            return bool(waited)

        def handler(token: alk.StopToken = token, progress: list[str] = progress,
                    stopped_after: list[list[str]] = stopped_after) -> None:
            stopped_after.append(list(progress))
            token.stop()

        fired, finished, waited = _interrupted_at(k, scenario, handler)
        assert finished, f"a stop at line event {k} deadlocked the thread it interrupted"
        if not fired:
            break  # every line of the scenario was interrupted once
        if "waited" not in stopped_after[0]:  # the stop came before the wait returned: it ends it
            assert waited, f"a stop at line event {k} did not end the wait it came before"
        assert token.stopped
        assert ran.count("kept") == 1 and ran.count("late") == 1, (k, ran)
        assert ran.count("taken back") <= 1, (k, ran)
    assert k > 5  # the sweep did interrupt the scenario


WAKE_CODE = ("threading.py", "alkstore_sa/stop.py")  # where a loop's sleep and its wake-up live


def _interrupted_in_wake_code(k: int, loop: Callable[[alk.StopToken], None]) -> bool:
    """Run ``loop(token)`` on a thread of its own, and stop the token there, as a signal
    handler would, at the ``k``-th line that thread runs in the wake-up code (threading's
    Events and locks, the token's): a loop sleeps there, again and again while idle, so
    every ``k`` comes. Whether the loop ended."""
    token = alk.StopToken()
    seen = [0]

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code.co_filename.endswith(WAKE_CODE) and not token.stopped:
            seen[0] += 1
            if seen[0] == k:
                token.stop()
        return trace

    def run() -> None:
        sys.settrace(trace)
        try:
            loop(token)
        finally:
            sys.settrace(None)

    t = threading.Thread(target=run, daemon=True)  # a deadlocked one is left behind
    t.start()
    t.join(HANG)
    return not t.is_alive()


SWEEP = 40  # line events into the wake-up code: the loop's start and several idle sleeps


@pytest.mark.parametrize("loop", ["worker", "subscription"])
def test_a_stop_interrupting_a_loops_sleep_at_any_line_ends_the_loop(store: alk.Store, qname: str, loop: str) -> None:
    """The worker's claim loop and a stream subscription slept on a ``threading.Event`` that
    the token's stop callback set: a stop from a signal handler that interrupted the loop
    inside ``Event.wait`` (which holds the Event's condition lock between its lines) blocked
    in ``Event.set`` on that lock forever, and with it the process it was meant to stop."""
    def run(token: alk.StopToken) -> None:
        if loop == "worker":
            alk.Worker(store, qname, lambda job: None, poll_interval=0.01).run(token)
        else:
            for _ in store.stream(qname).subscribe("c", token, poll_interval=0.01):
                pass

    for k in range(1, SWEEP + 1):
        assert _interrupted_in_wake_code(k, run), f"a stop at wake-code line {k} deadlocked the {loop}"
