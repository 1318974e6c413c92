"""docs/worker.md's table of ``alkstore worker`` options is the command's: every option the
parser takes is in it (the ones every command shares — ``--url``, ``--schema``,
``--listen-url``, ``-v``, ``--traceback`` — are described once, above it), with the
parser's default where the parser has one, and the table names no option the command
lacks."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from alkstore_sa.cli import build_parser

WORKER_MD = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text(encoding="utf-8")
SHARED = {"-h", "--help", "--url", "--schema", "--listen-url", "-v", "--verbose", "--traceback"}


def _worker_parser() -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["worker"]  # type: ignore[no-any-return]
    raise AssertionError("no subcommands")


def _table_rows() -> dict[str, str]:
    """option string -> the default column, from the worker section's table."""
    section = WORKER_MD.split("### `alkstore worker", 1)[1].split("\n### ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`-"):
            for option in re.findall(r"`(-[-\w]+)", cells[0]):
                rows[option] = cells[1]
    return rows


def test_the_worker_table_lists_every_option_of_the_command_with_its_default() -> None:
    rows = _table_rows()
    taken: set[str] = set()
    for action in _worker_parser()._actions:
        for option in action.option_strings:
            taken.add(option)
            if option in SHARED:
                continue
            assert option in rows, f"alkstore worker {option} is not in docs/worker.md's table"
            if isinstance(action.default, float | int) and not isinstance(action.default, bool):
                assert rows[option].replace("`", "") in (str(action.default), f"{action.default:g}"), (
                    option, rows[option], action.default)
    assert set(rows) <= taken, f"docs/worker.md's table names options the command lacks: {set(rows) - taken}"
