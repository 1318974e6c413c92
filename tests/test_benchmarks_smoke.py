"""Smoke test of the benchmark harness (``python -m benchmarks``): it runs end to end and
its JSON has every workload with positive numbers. It measures nothing and asserts no
speed: timings on a shared machine are the benchmark's business, not the test suite's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQLITE_WORKLOADS = {
    "enqueue_one", "enqueue_session", "enqueue_session_async", "enqueue_many", "drain_batch",
    "drain_one", "drain_batch8", "drain_tasks_sync", "drain_tasks_async", "drain_4proc",
    "drain_4proc_concurrency", "drain_4proc_rate", "drain_many_queues",
    "enqueue_one_traced", "enqueue_many_traced", "drain_worker_traced",
}


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_quick_sqlite_run_writes_every_workload(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--skip-scaling", "--engine", "sqlite", "--json", str(out)],
        # a hang guard only: the quick run takes ~25 s alone and several times that on a
        # loaded 2-core machine (its drains spawn four processes of their own)
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "| workload | alkstore_sa | raw floor" in proc.stdout
    assert "Wake latency" in proc.stdout  # says it is not measured

    report = json.loads(out.read_text())
    meta = report["meta"]
    assert meta["engines"] == ["sqlite"] and meta["quick"] is True and meta["reps"] == 1
    assert _positive(meta["cpu_count"])
    assert {"alkstore_sa", "SQLAlchemy"} <= set(meta["libraries"])
    assert "SQLite" in meta["databases"]["sqlite"]

    results = report["results"]
    assert {r["key"] for r in results} == SQLITE_WORKLOADS
    for r in results:
        assert r["engine"] == "sqlite" and r["jobs"] > 0, r
        for side in ("alkstore", "floor"):
            assert _positive(r[side]["median"]), r
            assert len(r[side]["rates"]) == 1 and all(_positive(x) for x in r[side]["rates"]), r
        assert _positive(r["ratio"]), r
    assert report["scaling"] == {}

    # the delayed-backlog run: both drains, with the quick backlog, against the same drain
    # of a queue holding none
    assert "Delayed backlog, SQLite" in proc.stdout
    delayed = report["delayed"]["sqlite"]
    assert {(r["mode"], r["backlog_rows"]) for r in delayed} == {("drain_one", 5_000), ("drain_batch", 5_000)}
    for r in delayed:
        assert _positive(r["with_backlog"]["median"]) and _positive(r["without"]["median"]), r
        assert _positive(r["ratio"]), r

    # the dashboard pages and the metrics scrape, on the quick run's small table
    assert "Dashboard and metrics reads, SQLite" in proc.stdout
    dashboard = report["dashboard"]["sqlite"]
    assert dashboard["missing"] == [] and dashboard["rows"] <= 10_000
    assert {r["key"] for r in dashboard["reads"]} == {
        "queues_page", "ready_first", "ready_deep", "dead_deep", "metrics_scrape",
    }
    for r in dashboard["reads"]:
        assert _positive(r["ms"]) and r["raw"], r  # each read's statements were recorded and replayed
        assert all(_positive(q["ms"]) for q in r["raw"]), r

    # the concurrent-enqueue run (quick: 1 and 2 processes), against its same-width floor
    procs = report["enqueue_procs"]["sqlite"]
    assert set(procs["levels"]) == {"1", "2"}, procs
    for level in procs["levels"].values():
        assert _positive(level["alk"]) and _positive(level["floor"]) and _positive(level["alk_ratio"]), level
    assert "Concurrent enqueue, SQLite" in proc.stdout
