"""Which alkstore schema revisions a library version accepts (docs/install.md, "Upgrading").

The database's revision (``alkstore_alembic_version``) is compared with this library's
head: equal → fine; an older step → ``SchemaOutdated`` (run the migrations); a newer step
this library does not know → fine when that revision says older readers can use it
(``alkstore_NNNN``: additive steps), and ``SchemaTooNew`` when it says they cannot
(``alkstore_NNNN_rMMMM``: readers need step MMMM) or is not an alkstore revision at all.
``install()`` and ``alkstore migrate`` never try to migrate a database newer than the
library ("Can't locate revision"): against a usable one they do nothing and say so,
against an unusable one they raise/print ``SchemaTooNew``. Both engines: the newer
revisions are stamped into the version table by hand.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa.schema import VERSION_TABLE
from tests.conftest import ENGINES, require_pg
from tests.fresh_pg import fresh_pg_database
from tests.support import PG_URL, Target, drop_pg_schema, new_pg_schema, pg_target, sqlite_target

ALKSTORE = Path(sys.executable).with_name("alkstore")
HEAD = migrations.head_revision()
DOCS = Path(__file__).resolve().parents[2] / "docs"
NEWER_ADDITIVE = "alkstore_9998"  # a later step that says older readers can use it
NEWER_BREAKING = "alkstore_9999_r9999"  # a later step that needs readers of step 9999
FOREIGN = "3f2a91c0d7e4"  # not an alkstore revision id


@pytest.fixture(params=ENGINES)
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A database of its own (the tests rewrite its version table)."""
    if request.param == "sqlite":
        target = sqlite_target(str(tmp_path))
        yield target
        target.engine.dispose()
    else:
        require_pg()
        target = pg_target(new_pg_schema("ver"))
        yield target
        drop_pg_schema(target)


def stamp(db: Target, revision: str) -> None:
    db.execute(f"UPDATE {db.table(VERSION_TABLE)} SET version_num = :r", r=revision)


def recorded(db: Target) -> object:
    return db.scalar(f"SELECT version_num FROM {db.table(VERSION_TABLE)}")


def migrate(db: Target) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ALKSTORE), "migrate", "--url", db.url, "--schema", db.schema],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("revision", "verdict"),
    [
        (HEAD, "ok"),
        ("alkstore_0000", "outdated"),
        ("alkstore_0001", "outdated"),
        ("alkstore_0002", "outdated"),
        ("alkstore_0002_r0001", "outdated"),  # an older step, however its id reads: migrate
        ("alkstore_0003_r0001", "too new"),  # not the shipped id of step 3: unknown
        ("alkstore_0004", "newer"),
        ("alkstore_0004_r0001", "newer"),
        ("alkstore_0007_r0003", "newer"),
        ("alkstore_0007_r0004", "too new"),
        (NEWER_BREAKING, "too new"),
        (FOREIGN, "too new"),
        ("alkstore_1", "too new"),
    ],
)
def test_the_rule(revision: str, verdict: str) -> None:
    """The rule as a table, for this library's head (step 3)."""
    assert HEAD == "alkstore_0003"
    assert migrations.schema_verdict(revision) == verdict


def test_the_docs_name_this_librarys_head() -> None:
    """docs/install.md ("Upgrading") and docs/worker.md (what ``alkstore migrate`` prints)
    name the head revision, so a new step cannot leave them behind (they said 0002, 0001)."""
    install = (DOCS / "install.md").read_text(encoding="utf-8")
    shipped = re.findall(r"up to its \*head\* \(`(alkstore_\w+)` in this\s+release\)", install)
    assert shipped == [HEAD], shipped
    worker = (DOCS / "worker.md").read_text(encoding="utf-8")
    printed = re.findall(r"`alkstore schema at (alkstore_\w+)`", worker)
    assert printed == [HEAD], printed


def test_every_packaged_revision_is_readable_by_its_own_library() -> None:
    """A released revision id must parse, and must not demand a reader newer than itself."""
    for revision in migrations.packaged_revisions():
        parsed = migrations.parse_revision(revision)
        assert parsed is not None, revision
        step, readers_from = parsed
        assert 1 <= readers_from <= step, revision


def test_a_later_step_never_lowers_the_reader_requirement() -> None:
    """Once a step requires readers of step M, every later step does too."""
    from alembic.script import ScriptDirectory

    chain = list(reversed(list(ScriptDirectory.from_config(migrations.alembic_config()).walk_revisions())))
    required = [migrations.parse_revision(r.revision)[1] for r in chain]  # type: ignore[index]
    assert required == sorted(required), [r.revision for r in chain]


def test_newer_additive_schema_is_used_as_it_is(fresh: Target, caplog: pytest.LogCaptureFixture) -> None:
    stamp(fresh, NEWER_ADDITIVE)
    with fresh.store() as store:
        store.check_schema()
        q = store.queue("newer")
        q.enqueue({"n": 1})
        with Session(fresh.engine) as session, session.begin():
            alk.enqueue(session, "newer", {"n": 2})
        h = q.claim_one("w1")
        assert h is not None and h.ack() is True
        alk.Worker(store, q, lambda job: None, poll_interval=0.1).run(burst=True)  # checks the schema
        assert q.stats().pending == 0
        with caplog.at_level(logging.INFO, logger="alkstore_sa"):
            store.install()  # nothing to do, and it says why
    assert recorded(fresh) == NEWER_ADDITIVE
    assert any(NEWER_ADDITIVE in r.getMessage() and "newer" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("revision", [NEWER_BREAKING, FOREIGN])
def test_newer_incompatible_schema_says_upgrade_the_library(fresh: Target, revision: str) -> None:
    stamp(fresh, revision)
    with fresh.store() as store:
        for op in (store.check_schema, lambda: store.queue("q").enqueue(1), store.install):
            with pytest.raises(alk.SchemaTooNew) as info:
                op()
            message = str(info.value)
            assert revision in message and "upgrade alkstore_sa" in message, message
            assert "Can't locate revision" not in message
            # not a NotInstalled: "run alkstore migrate" would be the wrong advice
            assert not isinstance(info.value, alk.NotInstalled)
    assert recorded(fresh) == revision  # nothing was migrated or rewritten


def test_cli_migrate_against_a_newer_usable_schema(fresh: Target) -> None:
    stamp(fresh, NEWER_ADDITIVE)
    res = migrate(fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "Can't locate revision" not in res.stderr
    assert "newer alkstore_sa" in res.stderr, res.stderr
    assert recorded(fresh) == NEWER_ADDITIVE


def test_cli_migrate_against_a_newer_unusable_schema(fresh: Target) -> None:
    stamp(fresh, NEWER_BREAKING)
    res = migrate(fresh)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "Can't locate revision" not in res.stderr, res.stderr
    assert "SchemaTooNew" in res.stderr and "upgrade alkstore_sa" in res.stderr, res.stderr
    assert recorded(fresh) == NEWER_BREAKING


@pytest.mark.parametrize("target", ["alkstore_0001", "base"])
def test_migrate_to_an_older_target_on_a_newer_usable_schema_changes_nothing(fresh: Target, target: str) -> None:
    """A deploy step pinned to a revision (`alkstore migrate --revision R`) of the older
    release, after a newer one migrated the database additively: the database is past R,
    as on an older release's own later step, so nothing is undone and it says so, exit 0
    (was: SchemaTooNew, exit 1, "only releases with schema step 1 or later can use; this
    one ships alkstore_0003: upgrade alkstore_sa", which this release is)."""
    stamp(fresh, NEWER_ADDITIVE)
    migrations.upgrade(fresh.engine, schema=fresh.schema, revision=target)
    res = subprocess.run(
        [str(ALKSTORE), "migrate", "--url", fresh.url, "--schema", fresh.schema, "--revision", target],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"past the requested {target}" in res.stdout and "nothing was undone" in res.stdout, res.stdout
    assert recorded(fresh) == NEWER_ADDITIVE


@pytest.mark.parametrize("revision", [NEWER_ADDITIVE, NEWER_BREAKING])
def test_a_downgrade_of_steps_this_release_does_not_ship_says_which_release_can(fresh: Target, revision: str) -> None:
    """This release cannot undo steps it does not ship, however usable the schema is: the
    refusal names the release that can, rather than "upgrade alkstore_sa" (contradicting
    itself for an additive schema); nothing changes."""
    stamp(fresh, revision)
    with pytest.raises(alk.SchemaTooNew) as info:
        migrations.downgrade(fresh.engine, schema=fresh.schema, revision="alkstore_0001")
    message = str(info.value)
    assert revision in message and "cannot undo" in message and "upgrade alkstore_sa" not in message, message
    assert recorded(fresh) == revision


def test_outdated_schema_still_names_the_migration(fresh: Target) -> None:
    stamp(fresh, "alkstore_0000")
    with fresh.store() as store, pytest.raises(alk.SchemaOutdated, match="alkstore migrate"):
        store.check_schema()


def _advised_migrate(message: str, db: Target) -> list[str]:
    """The `alkstore migrate ...` command line a message advises, with the real URL."""
    m = re.search(r"`(alkstore migrate [^`]*)`", message)
    assert m, message
    return [str(ALKSTORE), *(db.url if arg == "URL" else arg for arg in shlex.split(m.group(1))[1:])]


@pytest.mark.parametrize("kind", ENGINES)
def test_outdated_and_missing_schema_advice_works_as_given(kind: str, tmp_path: Path) -> None:
    """The NotInstalled and SchemaOutdated messages name both install paths (the app's
    Alembic chain with its `alkstore alembic-revision` step), and the `alkstore migrate`
    they name installs or upgrades the store's own schema: `--schema NAME` when it is not
    the default (was: the default schema's command, which left the store's schema as it was)."""
    if kind == "sqlite":
        url, schema = f"sqlite:///{tmp_path / 'advice.db'}", "alkstore"
    else:
        require_pg()
        url, schema = PG_URL, new_pg_schema("advice")
    db = Target(kind, url, sa.create_engine(url), schema)
    try:
        for error, prepare in ((alk.NotInstalled, None), (alk.SchemaOutdated, "alkstore_0001")):
            if prepare is not None:
                migrations.upgrade(db.engine, schema=db.schema, revision=prepare)  # an older step
            with db.store() as store, pytest.raises(error) as info:
                store.check_schema()
            message = str(info.value)
            assert type(info.value) is error
            assert "`alkstore alembic-revision" in message and "`alembic upgrade head`" in message, message
            assert ("--schema" in message) == (kind == "postgresql"), message  # a schema of its own
            if prepare is not None:  # the advice, as given, brings the store's schema to head
                subprocess.run(_advised_migrate(message, db), check=True, capture_output=True, timeout=120)
                with db.store() as store:
                    store.check_schema()
    finally:
        if kind == "postgresql":
            drop_pg_schema(db)
        db.engine.dispose()


def test_a_store_on_the_default_schema_of_a_database_installed_in_another_says_where() -> None:
    """alkstore installed in schema `jobs` (`alkstore alembic-revision --schema jobs`), and a
    store, worker or command made without that schema: NotInstalled said only "run
    `alkstore migrate --url URL`", which installs a second, empty copy in `alkstore` (the
    worker then waits on it while the jobs pile up in `jobs`). It says where the tables are
    and how to name that schema, and still how to install here on purpose."""
    require_pg()
    with fresh_pg_database("alkelsewhere") as url:
        engine = sa.create_engine(url)
        try:
            migrations.upgrade(engine, schema="jobs")
            with alk.Store(engine) as store, pytest.raises(alk.NotInstalled) as info:
                store.check_schema()
            message = str(info.value)
            assert "schema 'alkstore'" in message and "in schema 'jobs'" in message, message
            assert "schema='jobs'" in message and "--schema jobs" in message, message
            assert "`alkstore migrate --url URL`" in message, message  # installing here stays possible
            said = subprocess.run([str(ALKSTORE), "status", "--url", url], capture_output=True, text=True, timeout=120)
            assert said.returncode == 2 and "--schema jobs" in said.stderr, said.stderr
            with alk.Store(engine, schema="jobs") as store:  # the advice, as given
                store.check_schema()
        finally:
            engine.dispose()
