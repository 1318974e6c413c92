"""Fixtures: every conformance test runs once on SQLite (a fresh file per test) and once on
PostgreSQL (a fresh schema per test module). Under CI=true a missing PostgreSQL fails the
run; elsewhere the PostgreSQL half skips with the reason shown."""

from __future__ import annotations

import hashlib

import pytest

from tests.support import (
    IN_CI,
    FakeClock,
    Target,
    drop_pg_schema,
    new_pg_schema,
    pg_available,
    pg_target,
    sqlite_target,
)

ENGINES = ["sqlite", "postgresql"]
_pg_reason: list[str | None] = []


def pg_reason() -> str | None:
    if not _pg_reason:
        _pg_reason.append(pg_available())
    return _pg_reason[0]


def pytest_sessionstart(session: pytest.Session) -> None:
    reason = pg_reason()
    if reason and IN_CI:
        raise pytest.UsageError(f"CI=true and PostgreSQL is required: {reason}")


def require_pg() -> None:
    reason = pg_reason()
    if reason:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def _pg_module_target():
    require_pg()
    target = pg_target(new_pg_schema())
    yield target
    drop_pg_schema(target)


@pytest.fixture(params=ENGINES)
def db(request: pytest.FixtureRequest, tmp_path) -> Target:
    """An installed database on each engine."""
    if request.param == "sqlite":
        target = sqlite_target(str(tmp_path))
        yield target
        target.engine.dispose()
    else:
        yield request.getfixturevalue("_pg_module_target")


@pytest.fixture
def pg_db(_pg_module_target: Target) -> Target:
    """The PostgreSQL database alone, for behaviour only PostgreSQL has (server backends,
    schemas, LISTEN): such tests are not parametrized over SQLite at all, never skipped there."""
    return _pg_module_target


@pytest.fixture
def sqlite_db(tmp_path) -> Target:
    """A fresh SQLite file alone, for behaviour only SQLite has."""
    target = sqlite_target(str(tmp_path))
    yield target
    target.engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db: Target, clock: FakeClock):
    """A store on the injected clock."""
    s = db.store(clock=clock)
    yield s
    s.close()


@pytest.fixture
def dbstore(db: Target):
    """A store on the database's own clock."""
    s = db.store()
    yield s
    s.close()


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test (tests in one PostgreSQL module share a schema)."""
    return "q-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
