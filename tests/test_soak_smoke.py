"""Smoke test of the soak benchmark (``python -m benchmarks.soak``, ``make bench-soak``) on
PostgreSQL: a few seconds of it run end to end and its JSON has a row per interval with
throughput and per-table sizes and vacuum counts. It asserts no speed or size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_pg

ROOT = Path(__file__).resolve().parent


def test_short_soak_reports_rows_with_sizes(tmp_path: Path) -> None:
    require_pg()
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--minutes", "0.1", "--interval", "3", "--rate", "40",
         "--retention", "2", "--sweep-every", "1", "--enqueuers", "2", "--workers", "2", "--json", str(out)],
        cwd=ROOT.parent, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "| t (s) | enqueued/s | processed/s |" in proc.stdout
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert len(rows) == 2
    assert rows[-1]["enqueued"] > 0 and rows[-1]["processed"] > 0
    for row in rows:
        jobs = row["tables"]["alkstore_jobs"]
        assert jobs["total"] >= jobs["heap"] > 0 and jobs["indexes"] > 0
        assert {"live", "dead", "autovacuum"} <= set(jobs)
        assert "alkstore_dead_jobs" in row["tables"]
