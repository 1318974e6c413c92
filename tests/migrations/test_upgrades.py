"""Upgrading an installed database: steps 2 and 3, from the releases that shipped steps 1 and 2.

- Every install path (``store.install()``, ``alkstore migrate``, the checkout's ``alembic
  upgrade head``, an app's chain extended by ``alkstore alembic-revision``) carries an old
  database — created and filled by the OLD library (the last step-1 and the last step-2
  release), with pending, delayed, expiring, processing and dead jobs and a schedule — to
  head with every row intact; then the new code claims, acks and requeues them, and unique
  keys work.
- The app's generator writes exactly the new steps (1 -> head) and the app keeps one head.
- Old code against the new schema: two step-1 states and the last step-2 state of the
  package, exported from git, run their common operations in a subprocess against a
  head database, on both engines, next to jobs of the new code. ab81f3d and 4aa35fe work as
  they are (their version check accepts an additive newer step); the earlier e3cc882
  predates that rule, so its version check refuses (SchemaOutdated), and with the check
  skipped its SQL still works.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa.cli import main as alkstore_main
from alkstore_sa.schema import metadata_for
from tests.conftest import require_pg
from tests.fresh_pg import fresh_pg_database
from tests.migrations.alembic_app import ALEMBIC, ALKSTORE, write_app
from tests.migrations.test_schema import _diff
from tests.support import IN_CI, PG_URL, FakeClock, Target, new_pg_schema

ROOT = Path(__file__).resolve().parents[2]
V1_OPS = Path(__file__).with_name("v1_ops.py")
# Step-1 states of the package: before issue 9 (no schema compatibility rule yet), and the
# last commit before step 2.
V1_COMMITS = {
    "e3cc882": "e3cc8825d9906f618e6c9a1c3e960eb1570a8246",
    "ab81f3d": "ab81f3dbcc6d48a827ad989faddbcddfec910568",
}
NEWEST_V1 = "ab81f3d"
# The last step-2 state of the package (before step 3): its databases must upgrade too, and
# it must keep working against the additive step 3.
V2_COMMITS = {"4aa35fe": "4aa35feb8e217c2eb9af6194cfd8b5f70de501fd"}
OLD_COMMITS = {**V1_COMMITS, **V2_COMMITS}
OLD_HEADS = {"e3cc882": "alkstore_0001", "ab81f3d": "alkstore_0001", "4aa35fe": "alkstore_0002"}
T0 = 1_900_000_000.0  # v1_ops.T0: the clock the old code ran on
LATER_COLUMNS = {"unique_key", "tz", "trace_context"}  # what steps 2 and 3 added to existing tables
KEPT_TABLES = ("alkstore_jobs", "alkstore_dead_jobs", "alkstore_schedules")


@pytest.fixture(scope="session")
def v1_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each step-1 commit's ``alkstore_sa`` exported from git into a directory of its own
    (the directory to put on PYTHONPATH)."""
    out: dict[str, Path] = {}
    for short, commit in OLD_COMMITS.items():
        dest = tmp_path_factory.mktemp(f"alkstore_v1_{short}")
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "alkstore_sa"],
            capture_output=True, timeout=120,
        )
        if proc.returncode != 0:
            reason = f"needs the git history (not a shallow clone): cannot export step-1 commit {short} from git: {proc.stderr.decode().strip()}"
            if IN_CI:  # CI checks out the whole history: missing it there is a broken run
                pytest.fail(reason)
            pytest.skip(reason)
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            tar.extractall(dest, filter="data")
        out[short] = dest
    return out


def _old_env(package_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that must import the OLD package: it comes first on
    sys.path (the editable install's finder sits after the path finder)."""
    return {**os.environ, "PYTHONPATH": str(package_dir), **extra}


def run_v1(package_dir: Path, mode: str, url: str, schema: str, tmp: Path, *extra: str) -> dict[str, Any]:
    """One v1_ops.py run with the old package; its JSON result."""
    proc = subprocess.run(
        [sys.executable, str(V1_OPS), mode, url, schema, str(package_dir), *extra],
        cwd=tmp, env=_old_env(package_dir), capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def snapshot(url: str, schema: str | None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables that existed at step 1, in their step-1 columns."""
    md = metadata_for(schema)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            out = {}
            for name in KEPT_TABLES:
                table = next(t for t in md.tables.values() if t.name == name)
                cols = [c for c in table.c if c.name not in LATER_COLUMNS]
                out[name] = [tuple(r) for r in conn.execute(sa.select(*cols).order_by(*table.primary_key))]
            return out
    finally:
        engine.dispose()


def step2_defaults(url: str, schema: str | None) -> tuple[set[Any], set[Any], set[Any]]:
    """The values the migration gave the rows it found: (jobs' keys, dead keys, schedule zones)."""
    md = metadata_for(schema)
    t = {tb.name: tb for tb in md.tables.values()}
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return (
                set(conn.scalars(sa.select(t["alkstore_jobs"].c.unique_key))),
                set(conn.scalars(sa.select(t["alkstore_dead_jobs"].c.unique_key))),
                set(conn.scalars(sa.select(t["alkstore_schedules"].c.tz))),
            )
    finally:
        engine.dispose()


def recorded(url: str, schema: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return migrations.current_revision(conn, schema)
    finally:
        engine.dispose()


def work_the_migrated_jobs(url: str, schema: str, populated: dict[str, Any]) -> None:
    """The new code on the migrated database: the old rows claim, ack and requeue; the
    schema equals the metadata; unique keys hold."""
    kind = sa.make_url(url).get_backend_name()
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema, clock=FakeClock(T0 + 1000))  # delays over, claims lapsed
    try:
        store.check_schema()
        diff = _diff(Target(kind, url, engine, schema), metadata_for(None if kind == "sqlite" else schema))
        # an app's own tables (SQLite: same file) are not alkstore's business
        assert [d for d in diff if not (d[0] == "remove_table" and d[1].name.startswith("app_"))] == []  # type: ignore[index]
        q = store.queue("mig")
        handles = q.claim_batch("v2", 10)
        assert sorted(h.id for h in handles) == sorted(populated["pending"])
        assert {h.payload["n"] for h in handles} == {1, 2, 3, 4, 5, 6}
        assert all(h.job.unique_key is None for h in handles)
        assert q.ack_batch(handles) == len(handles)
        reclaimed = store.queue("mig-proc").claim_one("v2")
        assert reclaimed is not None and reclaimed.id == populated["processing"]
        assert reclaimed.job.attempts == 2 and reclaimed.ack()
        dead_q = store.queue("mig-dead")
        (dead,) = dead_q.dead_jobs()
        assert dead.id == populated["dead"] and dead.last_error == "boom" and dead.unique_key is None
        again = dead_q.requeue_dead(dead.id)
        handle = dead_q.claim_one("v2")
        assert handle is not None and handle.id == again and handle.ack()
        assert [s.name for s in store.schedules()] == ["mig-sched"]
        assert [q.stats().pending, store.queue("mig-proc").stats().processing, dead_q.stats().dead] == [0, 0, 0]
    finally:
        store.close()
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def v1_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, schema) of an empty database for a v1 install (PostgreSQL: a schema of its own)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'v1.db'}", "alkstore"
        return
    require_pg()
    schema = new_pg_schema("v1up")
    yield PG_URL, schema
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()


def _install(url: str, schema: str) -> None:
    store = alk.Store(url, schema=schema)
    store.install()
    store.close()


def _migrate(url: str, schema: str) -> None:
    out = _ok(subprocess.run(
        [ALKSTORE, "migrate", "--url", url, "--schema", schema],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    ))
    assert f"alkstore schema at {migrations.head_revision()}" in out


def _checkout_alembic(url: str, schema: str) -> None:
    """The checkout's ``alembic upgrade head``; then down to step 1 (the old rows survive
    that too) and up again."""
    def alembic(*args: str) -> str:
        return _ok(subprocess.run(
            [ALEMBIC, "-x", f"url={url}", "-x", f"schema={schema}", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        ))

    alembic("upgrade", "head")
    assert f"{migrations.head_revision()} (head)" in alembic("current")
    before = snapshot(url, None if url.startswith("sqlite") else schema)
    alembic("downgrade", "alkstore_0001")
    assert recorded(url, schema) == "alkstore_0001"
    assert snapshot(url, None if url.startswith("sqlite") else schema) == before
    alembic("upgrade", "head")


PATHS = {"store.install": _install, "alkstore migrate": _migrate, "checkout alembic": _checkout_alembic}


@pytest.mark.parametrize("old", [NEWEST_V1, *V2_COMMITS])
@pytest.mark.parametrize("path", list(PATHS))
def test_install_paths_carry_an_old_database_to_head(
    path: str, old: str, v1_database: tuple[str, str], v1_packages: dict[str, Path], tmp_path: Path
) -> None:
    """A database installed and filled by the last step-1 and the last step-2 release."""
    url, schema = v1_database
    populated = run_v1(v1_packages[old], "install-populate", url, schema, tmp_path)
    assert recorded(url, schema) == OLD_HEADS[old]
    table_schema = None if url.startswith("sqlite") else schema
    before = snapshot(url, table_schema)
    assert len(before["alkstore_jobs"]) == 7 and len(before["alkstore_dead_jobs"]) == 1

    # the new code, before migrating
    with pytest.raises(alk.SchemaOutdated, match="alkstore migrate"), alk.Store(url, schema=schema) as store:
        store.queue("mig").stats()

    PATHS[path](url, schema)
    assert recorded(url, schema) == migrations.head_revision()
    assert snapshot(url, table_schema) == before
    assert step2_defaults(url, table_schema) == ({None}, {None}, {"UTC"})
    work_the_migrated_jobs(url, schema, populated)


@pytest.fixture(params=["sqlite", "postgresql"])
def app_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'app.db'}"
        return
    require_pg()
    with fresh_pg_database("alkstep2") as url:
        yield url


def test_app_chain_gets_exactly_the_new_step(
    app_url: str, v1_packages: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An app that generated its alkstore revision with the OLD library and ran it: after
    the library upgrade, ``alkstore alembic-revision`` writes steps 1 -> 2 only, on top of
    the earlier one (one head), and ``alembic upgrade head`` migrates the filled database."""
    kind = sa.make_url(app_url).get_backend_name()
    schema = "alk_app"
    root = tmp_path / "app"
    root.mkdir()
    app = write_app(root, app_url, kind)
    old = v1_packages[NEWEST_V1]
    # The old library's generator and the app's alembic, both importing the old package.
    _ok(subprocess.run(
        [sys.executable, "-c", "import sys; from alkstore_sa.cli import main; sys.exit(main())",
         "alembic-revision", "-c", str(app.ini), "--schema", schema],
        cwd=root, env=_old_env(old), capture_output=True, text=True, timeout=120,
    ))
    (first,) = [p for p in app.versions.glob("*_alkstore_*.py")]
    assert first.name.endswith("_alkstore_steps_0_to_1.py")
    _ok(subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(app.ini), "upgrade", "head"],
        cwd=root, env=_old_env(old, APP_DATABASE_URL=app_url), capture_output=True, text=True, timeout=120,
    ))
    populated = run_v1(old, "populate", app_url, schema, tmp_path)
    table_schema = None if kind == "sqlite" else schema
    before = snapshot(app_url, table_schema)

    rev = app.generate()  # the new library
    (second,) = [p for p in app.versions.glob(f"{rev}_*.py")]
    assert second.name == f"{rev}_alkstore_steps_1_to_{migrations.steps.HEAD}.py"
    text = second.read_text()
    first_rev = first.name.split("_alkstore_", 1)[0]
    assert f'down_revision = "{first_rev}"' in text and f'ALKSTORE_SCHEMA = "{schema}"' in text
    assert f"ALKSTORE_STEPS = (1, {migrations.steps.HEAD})" in text
    assert "upgrade_steps(*ALKSTORE_STEPS, schema=ALKSTORE_SCHEMA)" in text
    assert _ok(app.alembic("heads")).split() == [rev, "(head)"]
    assert alkstore_main(["alembic-revision", "-c", str(app.ini)]) == 0
    assert "nothing to generate" in capsys.readouterr().out

    _ok(app.alembic("upgrade", "head"))
    assert recorded(app_url, schema) == migrations.head_revision()
    assert snapshot(app_url, table_schema) == before
    assert "No new upgrade operations detected" in _ok(app.alembic("check"))
    work_the_migrated_jobs(app_url, schema, populated)
    _ok(app.alembic("downgrade", first_rev))  # step 2 out again: the app is back at step 1
    assert recorded(app_url, schema) == "alkstore_0001"
    assert snapshot(app_url, table_schema)["alkstore_dead_jobs"] == []  # the one dead job was requeued


@pytest.fixture(params=["sqlite", "postgresql"])
def v2_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, schema) of a database migrated to this library's head."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'v2.db'}"
        _install(url, "alkstore")
        yield url, "alkstore"
        return
    require_pg()
    schema = new_pg_schema("v2old")
    _install(PG_URL, schema)
    yield PG_URL, schema
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()


@pytest.mark.parametrize("commit", list(OLD_COMMITS))
def test_old_code_against_the_new_schema(
    commit: str, v2_database: tuple[str, str], v1_packages: dict[str, Path], tmp_path: Path
) -> None:
    url, schema = v2_database
    with alk.Store(url, schema=schema, clock=FakeClock(T0)) as store:
        shared = store.queue("shared").enqueue({"new": True}, unique_key="held")
    mode = "exercise-statements" if commit == "e3cc882" else "exercise"
    out = run_v1(v1_packages[commit], mode, url, schema, tmp_path, str(shared))
    if mode == "exercise-statements":  # its check knows no newer schema: the refusal of its day
        assert migrations.head_revision() in out["refused"]
    else:
        assert "refused" not in out
    assert out["claimed"] == out["enqueued"] and len(out["claimed"]) == 4  # the rolled-back one is absent
    assert out["acked"] == [True, True] and out["retried"] is True and out["failed"] is True
    assert out["dead"] == out["claimed"][2:]
    assert out["requeued_is_new"] and out["cancelled"]
    assert out["acked_job_gone"] and out["dead_state"] == "dead"
    assert out["stats"] == [0, 0, 1] and "old" in out["queue_stats"]
    assert out["shared_claimed"] and out["shared_acked"]
    assert out["fired"] == 3 and out["fired_jobs"] == 3
    assert out["schedules"] == ["old-sched"] and out["unscheduled"] is True
    assert out["lock"] == [True, False, True]
    assert recorded(url, schema) == migrations.head_revision()  # the old install() changed nothing

    with alk.Store(url, schema=schema, clock=FakeClock(T0 + 500)) as store:
        q = store.queue("shared")
        again = q.enqueue({"new": True}, unique_key="held")  # the old code's ack freed the key
        assert again != shared and q.enqueue({}, unique_key="held") == again
        (dead,) = store.queue("old").dead_jobs()  # moved to dead by the old code: read by the new
        assert dead.id == out["dead"][0] and dead.unique_key is None
        assert dead.last_error == "max attempts exceeded" and dead.errors[-1]["error"] == "again"
