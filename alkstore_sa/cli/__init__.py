"""The ``alkstore`` command line. Each subcommand lives in its own module and registers
itself through ``register(subparsers)``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..errors import AlkstoreError, NotInstalled
from . import alembic_revision, dead, migrate, schedules, status, sweep, worker

COMMANDS = [migrate, alembic_revision, worker, status, dead, sweep, schedules]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alkstore",
        description="Durable queues in your own database: migrate, run workers, inspect queues.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alkstore`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except NotInstalled as exc:
        print(f"alkstore: {exc}", file=sys.stderr)
        return 2
    except AlkstoreError as exc:
        print(f"alkstore: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
