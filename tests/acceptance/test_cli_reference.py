"""docs/worker.md's table of ``alkstore worker`` options is the command's: every option the
parser takes is in it (the ones every command shares — ``--url``, ``--schema``,
``--listen-url``, ``-v``, ``--traceback`` — are described once, above it), with the
parser's default where the parser has one, and the table names no option the command
lacks."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

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


def test_flask_alkstore_worker_takes_the_options_of_alkstore_worker() -> None:
    """``flask alkstore worker`` runs the same worker: it takes every option of ``alkstore
    worker`` (so every one in docs/worker.md's table), with the same defaults and whether
    it is repeatable or a flag — it lacked ``--metrics-port``. Only the database options are
    not its own: it serves the app's Store, which carries the URL, schema and listen_url."""
    pytest.importorskip("flask")
    from flask import Flask

    import alkstore_sa as alk
    from alkstore_sa.flask import init_app

    app = Flask("options")
    store = alk.Store("sqlite:///unused.db")  # never opened: only the command is built
    try:
        init_app(app, alk.Tasks(), store)
        command = app.cli.commands["alkstore"].commands["worker"]  # type: ignore[attr-defined]
    finally:
        store.close()
    flask_options: dict[str, Any] = {}
    for param in command.params:
        for option in param.opts:
            default = getattr(param, "single_default", param.default)
            flask_options[option] = (param.is_flag, param.multiple and not hasattr(param, "single_default"), default)
    cli_options: dict[str, Any] = {}
    for action in _worker_parser()._actions:
        for option in action.option_strings:
            if option not in SHARED:
                repeatable = isinstance(action, argparse._AppendAction)
                cli_options[option] = (action.nargs == 0, repeatable, action.default if action.nargs != 0 else False)
    for option, (flag, repeatable, default) in cli_options.items():
        assert option in flask_options, f"flask alkstore worker lacks {option}"
        assert flask_options[option][:2] == (flag, repeatable), option
        if not repeatable and not flag:  # a flag is off unless given (click's default: unset)
            assert flask_options[option][2] == default, option
    assert set(flask_options) - {"--help"} == set(cli_options), set(flask_options) ^ set(cli_options)
    assert set(_table_rows()) <= set(flask_options)
