"""Timing: both sides of a workload, interleaved in small steps in the same run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.floor import Steps

WARMUP = 200  # jobs per side run once, untimed, before a workload's repetitions
STEPS = 100  # about this many interleaved steps per repetition and side

Prepare = Callable[[Sequence[Any]], Steps]


def chunks(items: Sequence[Any], unit: int, interleave: bool) -> list[Sequence[Any]]:
    """One repetition's steps: about STEPS chunks, each a multiple of ``unit`` (the jobs
    per transaction or per claim), or the whole list when not interleaving."""
    if not interleave:
        return [items]
    size = unit * max(1, len(items) // STEPS // unit)
    return [items[i : i + size] for i in range(0, len(items), size)]


def measure(run_alk: Prepare, run_floor: Prepare, items: Sequence[Any], reps: int,
            unit: int = 1, interleave: bool = True) -> dict[str, Any]:
    """Per repetition: prepare both sides (untimed), then run their steps interleaved,
    alternating which side goes first, so both see the same machine (this one is shared and
    noisy, PostgreSQL's commit latency included). A side's rate = jobs / its summed step
    time; the ratio is the median over repetitions of alkstore / floor of that repetition."""
    alk_rates: list[float] = []
    floor_rates: list[float] = []
    for rep in range(reps):
        prepared = [run_alk(items), run_floor(items)]
        spent = [0.0, 0.0]
        try:
            for i, chunk in enumerate(chunks(items, unit, interleave)):
                for side in ((0, 1) if (rep + i) % 2 == 0 else (1, 0)):
                    t0 = time.perf_counter()
                    own = prepared[side].step(chunk)
                    spent[side] += own if own is not None else time.perf_counter() - t0
        finally:
            for steps in prepared:
                steps.close()
        alk_rates.append(len(items) / spent[0])
        floor_rates.append(len(items) / spent[1])
    ratios = [a / f for a, f in zip(alk_rates, floor_rates, strict=True)]
    return {
        "alkstore": {"median": statistics.median(alk_rates), "rates": alk_rates},
        "floor": {"median": statistics.median(floor_rates), "rates": floor_rates},
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }
