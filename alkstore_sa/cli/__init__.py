"""The ``alkstore`` command line. Each subcommand lives in its own module and registers
itself through ``register(subparsers)``; how failures end (one line, an exit code) is in
``_errors``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .. import __version__
from . import alembic_revision, dashboard, dead, migrate, queue, schedules, status, sweep, worker
from ._common import Parser, check_options
from ._errors import EXIT_CODES, report, stdout_closed
from ._shown import stderr_handler

COMMANDS = [migrate, alembic_revision, worker, status, queue, dead, sweep, schedules, dashboard]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="alkstore",
        description="Durable queues in your own database: migrate, run workers, inspect queues.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global_flags(parser, default=False)
    parser.add_argument(
        "--version", action="version", version=f"alkstore {__version__}",
        help="print the version of alkstore_sa and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    for child in _subcommand_parsers(parser):
        # accepted after the command too (`alkstore status --traceback`); SUPPRESS keeps a
        # flag given before the command from being reset by the subcommand's default
        _add_global_flags(child, default=argparse.SUPPRESS)
        child.epilog = child.epilog or EXIT_CODES
        child.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _add_global_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log at DEBUG level")
    parser.add_argument(
        "--traceback", action="store_true", default=default,
        help="on failure, print the traceback above the one-line error",
    )


def _subcommand_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield child
                yield from _subcommand_parsers(child)


def _lenient_stdout() -> None:
    """A character the terminal's encoding lacks (an emoji in a queue name, on a latin-1
    locale) is written as a backslash escape, as Python already does on stderr, instead
    of ending the command with UnicodeEncodeError. An error handler the user chose
    (PYTHONIOENCODING=...:replace) is kept."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) == "strict":
        reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alkstore`` console script; returns the exit code."""
    _lenient_stdout()
    parser = build_parser()
    args = parser.parse_args(argv)  # a usage error exits 2 here, in one line
    # stderr: the worker's start/stop lines, the signal it got, its handlers' failures
    # (their messages escaped: a handler's exception text is not the terminal's to obey)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[stderr_handler()])
    if not args.verbose:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        check_options(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `alkstore dead list | head -1`: stdout's reader is gone
        return stdout_closed()
    except (Exception, KeyboardInterrupt) as exc:  # every failure: one line and an exit code
        return report(exc, args, show_traceback=args.traceback)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
