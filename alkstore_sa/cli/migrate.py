"""``alkstore migrate``: run the packaged migrations (for apps without an Alembic setup)."""

from __future__ import annotations

import argparse

from .. import migrations
from .._urls import engine_from_url, sqlite_path
from ._common import add_database_options, database_url
from ._errors import UsageError
from ._shown import shown


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("migrate", help="install or upgrade the alkstore tables (idempotent; creates a SQLite file)")
    add_database_options(p, listen=False)
    p.add_argument(
        "--revision", default="heads", help="target revision: head, base or an alkstore_NNNN id (default: head)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    url = database_url(args)
    path = sqlite_path(url)
    if path is not None and not path.parent.is_dir():  # sqlite3 creates a file, never its directory
        raise UsageError(
            f"the directory {str(path.parent)!r} of the SQLite database does not exist: check --url, "
            f"or create the directory first"
        )
    engine = engine_from_url(url)  # the one command that may create a SQLite file
    try:
        migrations.upgrade(engine, schema=args.schema, revision=args.revision)
        with engine.connect() as conn:
            current = migrations.current_revision(conn, args.schema)
    finally:
        engine.dispose()
    wanted = migrations.target_revision(args.revision)
    if current is None:  # `--revision base` of a database without alkstore
        print("alkstore schema at base (not installed)")
        return 0
    if current != wanted:
        # upgrade() only upgrades: it reaches the target unless the database is past it
        print(
            f"alkstore schema at {shown(current)}, past the requested {shown(wanted or 'base')}: migrate only "
            "upgrades, so nothing was undone (to go back, alkstore_sa.migrations.downgrade(engine, "
            "schema=..., revision=...))"
        )
        return 0
    print(f"alkstore schema at {shown(current)}")
    return 0
