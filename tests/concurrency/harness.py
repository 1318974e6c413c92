"""Parent-side machinery: start spawned worker processes behind a start barrier, join them
with a deadline (a hang fails the test instead of blocking the run), collect their results.

Children never share an engine or a connection with the parent: each one builds its own
``alk.Store(url, schema=...)`` from plain strings (see ``workers.py``)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.concurrency.workers import child_main

SPAWN = mp.get_context("spawn")


@dataclass
class Group:
    procs: list[Any]
    outs: list[Path]
    barrier: Any  # held by the parent until the join: children unpickle it at startup


def start(fn: Callable[[dict[str, Any]], Any], specs: list[dict[str, Any]], out_dir: Path) -> Group:
    """Start one spawned process per spec; they all begin ``fn`` together at a barrier."""
    barrier = SPAWN.Barrier(len(specs))
    procs, outs = [], []
    for i, spec in enumerate(specs):
        out = out_dir / f"{fn.__name__}-{i}-{os.getpid()}-{time.monotonic_ns()}.json"
        proc = SPAWN.Process(
            target=child_main,
            args=(fn, spec, str(out), barrier),
            name=f"{fn.__name__}-{i}",
            daemon=True,
        )
        proc.start()
        procs.append(proc)
        outs.append(out)
    return Group(procs, outs, barrier)


def join_all(procs: list[Any], timeout: float) -> None:
    """Join every process by one shared deadline; on a hang kill them all and fail."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [p.name for p in procs if p.is_alive()]
    if hung:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(5)
        raise AssertionError(f"worker processes still running after {timeout}s (hung?): {hung}")


def collect(procs: list[Any], outs: list[Path]) -> list[Any]:
    """Each child's return value; a child that raised or died fails the test with its story."""
    results, problems = [], []
    for proc, out in zip(procs, outs, strict=True):
        if not out.exists():
            problems.append(f"{proc.name}: exit code {proc.exitcode}, no result written")
            continue
        record = json.loads(out.read_text())
        if "error" in record:
            problems.append(f"{proc.name} raised:\n{record['error']}")
        else:
            results.append(record["result"])
    if problems:
        raise AssertionError("\n\n".join(problems))
    return results


def run(
    fn: Callable[[dict[str, Any]], Any],
    specs: list[dict[str, Any]],
    out_dir: Path,
    *,
    timeout: float,
) -> list[Any]:
    """Run ``fn(spec)`` in one spawned process per spec; return their results in spec order."""
    group = start(fn, specs, out_dir)
    join_all(group.procs, timeout)
    return collect(group.procs, group.outs)
