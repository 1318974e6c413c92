"""Options every command shares: the database URL and the PostgreSQL schema."""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

from ..schema import DEFAULT_SCHEMA
from ..stop import StopToken
from ..store import Store


def add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("ALKSTORE_DATABASE_URL"),
        help="SQLAlchemy database URL (default: $ALKSTORE_DATABASE_URL)",
    )
    parser.add_argument(
        "--schema",
        default=os.environ.get("ALKSTORE_SCHEMA") or DEFAULT_SCHEMA,
        help="PostgreSQL schema of the alkstore tables (default: $ALKSTORE_SCHEMA or 'alkstore')",
    )


def database_url(args: argparse.Namespace) -> str:
    if not args.url:
        raise SystemExit("alkstore: no database URL: pass --url or set ALKSTORE_DATABASE_URL")
    return str(args.url)


def open_store(args: argparse.Namespace) -> Store:
    return Store(database_url(args), schema=args.schema)


def stop_on_signals() -> StopToken:
    """A StopToken that SIGTERM and SIGINT stop (graceful shutdown, exit code 0)."""
    stop = StopToken()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
