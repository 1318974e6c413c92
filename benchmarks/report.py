"""The markdown table and the JSON file."""

from __future__ import annotations

import json
from typing import Any

ENGINE_TITLES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}

NOTES = [
    "Wake latency: enqueue commit -> handler start of an idle alk.Worker in another process "
    "(poll interval 1 h, so only the wake can deliver), one job at a time with 20 ms gaps; idle "
    "CPU: that worker's utime+stime over 10 s with nothing to do.",
    "Throughput in jobs/s, median over the repetitions. Both sides run interleaved in small "
    "steps (alternating which goes first); ratio = median over the repetitions of "
    "alkstore_sa / floor within the repetition. Read ratios, not absolutes: other processes "
    "share this machine (and its PostgreSQL).",
    "Floor: plain psycopg 3 / sqlite3 on a minimal table with the same columns and id "
    "allocator and only the claim index; same transactions and commit mode.",
    "Rows whose floor says 'not a raw floor' compare two library paths in the same run: "
    "`aenqueue` on an AsyncSession vs the sync `enqueue` on a Session (same database), and the "
    "`Tasks` worker vs the handle drain at the worker's claim size (its ratio is the task "
    "layer's cost; the `claim_batch(8)` row links that drain to the raw floor). The worker "
    "runs throughout a repetition (started and stopped untimed, as in production); each "
    "400-job step enqueues its jobs untimed and is timed from that commit until the last of "
    "their acks landed, the worker's wake-up included.",
]


def rate(x: float) -> str:
    return f"{x:,.0f}/s"


def _target(r: dict[str, Any]) -> str:
    t = r.get("target")
    if t is None:
        return ""
    return f"≥ {t:.2f} {'ok' if r['ratio'] >= t else 'MISSED'}"


def render(report: dict[str, Any]) -> str:
    meta = report["meta"]
    out = ["## alkstore_sa benchmarks", ""]
    out.append(f"- machine: {meta['cpu_count']} cores, {meta['platform']}, Python {meta['python']}")
    libs = ", ".join(f"{k} {v}" for k, v in meta["libraries"].items())
    out.append(f"- libraries: {libs}")
    for kind, version in meta["databases"].items():
        out.append(f"- {ENGINE_TITLES[kind]}: {version}")
    out.append(f"- repetitions: {meta['reps']}{' (--quick)' if meta['quick'] else ''}")
    for kind, reason in meta.get("skipped", {}).items():
        out.append(f"- {ENGINE_TITLES[kind]} skipped: {reason}")
    out.append("")
    for kind in meta["engines"]:
        rows = [r for r in report["results"] if r["engine"] == kind]
        if not rows:
            continue
        out.append(f"### {ENGINE_TITLES[kind]}")
        out.append("")
        out.append("| workload | alkstore_sa | raw floor (same run) | ratio | target |")
        out.append("|---|---:|---|---:|---|")
        for r in rows:
            out.append(
                f"| {r['workload']} ({r['jobs']:,} jobs) | {rate(r['alkstore']['median'])} | "
                f"{rate(r['floor']['median'])} — {r['floor_title']} | {r['ratio']:.2f}× | {_target(r)} |"
            )
        out.append("")
        scaling = report.get("scaling", {}).get(kind)
        if scaling:
            out.append(f"Scaling, {ENGINE_TITLES[kind]}: drain `claim_batch(100)` + `ack_batch` of "
                       f"{scaling[0]['drain_jobs']:,} jobs with a backlog already in the tables "
                       "(target: largest within 20% of smallest)")
            out.append("")
            costs = any(s.get("claim_cost") for s in scaling)
            extra = " claim of 100: buffers / ms, alkstore vs floor |" if costs else ""
            out.append("| rows already in the tables | alkstore_sa | raw floor (same backlog) | ratio "
                       f"| alkstore vs smallest | ratio vs smallest |{extra}")
            out.append("|---:|---:|---:|---:|---:|---:|" + ("---|" if costs else ""))
            for s in scaling:
                cell = ""
                if costs:
                    a, f = s["claim_cost"].get("alkstore"), s["claim_cost"].get("floor")
                    cell = (f" {a['buffers']} / {a['exec_ms']:.2f} vs {f['buffers']} / {f['exec_ms']:.2f} |"
                            if a and f else " |")
                out.append(
                    f"| {s['backlog_rows']:,} | {rate(s['alkstore']['median'])} | {rate(s['floor']['median'])} "
                    f"| {s['ratio']:.2f}× | {s['alkstore_vs_smallest']:.2f}× | {s['ratio_vs_smallest']:.2f}× |{cell}"
                )
            out.append("")
            out.append("Query plans of the library's compiled statements (table scans only):")
            out.append("")
            for s in scaling:
                for key, text in s["plans"].items():
                    out.append(f"- {s['backlog_rows']:,} rows, `{key}`: {text}")
            out.append("")
    latency = report.get("latency") or {}
    if latency:
        out.append("### Wake latency (enqueue commit → handler start, idle worker)")
        out.append("")
        out.append("| engine | alkstore_sa p50 / p99 | raw floor p50 / p99 | idle worker CPU |")
        out.append("|---|---:|---|---:|")
        for kind, r in latency.items():
            a, f = r["alkstore"], r["floor"]
            out.append(
                f"| {ENGINE_TITLES[kind]} | {a['p50_ms']:.2f} / {a['p99_ms']:.2f} ms | "
                f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} ms — {f['title']} | {a['idle_cpu_percent']:.2f}% of a core |"
            )
        out.append("")
    out.extend(render_dashboard(report.get("dashboard") or {}))
    for note in NOTES:
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


def _ms(x: float) -> str:
    return f"{x:,.1f} ms" if x >= 10 else f"{x:.2f} ms"


def render_dashboard(dashboard: dict[str, Any]) -> list[str]:
    """The operator reads on a big table: ms per request, with the raw count query beside it."""
    out: list[str] = []
    for kind, d in dashboard.items():
        out.append(f"### Dashboard and metrics reads, {ENGINE_TITLES[kind]} ({d['rows']:,}-row queue, "
                   f"{d['queues']} queues)")
        out.append("")
        out.append(f"Median ms per request over {d['requests']} requests (the WSGI app called in-process). "
                   "A page has no raw floor: beside it, for context, each statement the read runs (named by "
                   "the library's statement key), replayed with its parameters on a raw driver "
                   "connection in the same loop.")
        out.append("")
        if d["reads"]:
            out.append("| read | alkstore_sa | its statements, raw (same run) |")
            out.append("|---|---:|---|")
            for r in d["reads"]:
                context = "; ".join(f"{q['title']}: {_ms(q['ms'])}" for q in r["raw"])
                out.append(f"| {r['title']} | {_ms(r['ms'])} | {context} |")
            out.append("")
        for note in d["missing"]:
            out.append(f"- not measured: {note}")
        if d["missing"]:
            out.append("")
    return out


def write_json(report: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")
