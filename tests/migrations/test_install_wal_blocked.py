"""Installing on a SQLite file in rollback-journal mode that another connection is reading
(SQLite only): WAL mode cannot be switched while any other transaction is open on the file,
and the failure is an alkstore error saying so, not sqlite3's own exception."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations


def test_install_while_another_connection_reads_is_a_clear_alkstore_error(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("CREATE TABLE app_orders (id INTEGER PRIMARY KEY)")
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM app_orders").fetchall()  # an app's read transaction: a SHARED lock
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.1})
    try:
        with pytest.raises(alk.DatabaseError, match="WAL") as info:
            migrations.upgrade(engine)
        assert "database is locked" in str(info.value)
        assert "no other connection" in str(info.value)
    finally:
        engine.dispose()
        reader.execute("COMMIT")
    assert reader.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not {r[0] for r in reader.execute("SELECT name FROM sqlite_master")} & {"alkstore_jobs"}
    reader.close()
    store = alk.Store(f"sqlite:///{path}")  # once the reader is done, the install goes through
    store.install()
    store.check_schema()
    store.close()


def test_cli_migrate_while_another_connection_reads_says_why(tmp_path: Path) -> None:
    """`alkstore migrate` on that file: one line, exit 1, saying what failed and what to do
    (it was "unexpected error: OperationalError: database is locked")."""
    path = tmp_path / "app.db"
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("CREATE TABLE app_orders (id INTEGER PRIMARY KEY)")
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM app_orders").fetchall()
    try:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("alkstore")), "migrate", "--url", f"sqlite:///{path}"],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        reader.execute("COMMIT")
        reader.close()
    err = done.stderr.strip()
    assert done.returncode == 1, err
    assert len(err.splitlines()) == 1 and "WAL" in err and "no other connection" in err, err
    assert "unexpected error" not in err


def test_install_on_a_file_opened_read_only_says_it_cannot_write(tmp_path: Path) -> None:
    """A file the install may not write (here opened ``mode=ro``; a read-only file or
    directory alike): the failure was blamed on "another connection's open transaction"
    (the busy case's advice), which no one had. It says the file cannot be written, and
    the CLI's one line does too; nothing changes."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as app:
        app.execute("CREATE TABLE app_orders (id INTEGER PRIMARY KEY)")
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    engine = sa.create_engine(url)
    try:
        with pytest.raises(alk.DatabaseError, match="WAL") as info:
            migrations.upgrade(engine)
    finally:
        engine.dispose()
    message = str(info.value)
    assert "readonly" in message and "no other connection" not in message, message
    assert "writable" in message, message  # what to do about it
    done = subprocess.run([str(Path(sys.executable).with_name("alkstore")), "migrate", "--url", url],
                          capture_output=True, text=True, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "readonly" in err and "no other connection" not in err, err
    with sqlite3.connect(path) as app:
        assert app.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert {r[0] for r in app.execute("SELECT name FROM sqlite_master")} == {"app_orders"}
