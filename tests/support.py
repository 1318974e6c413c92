"""Shared test machinery: database targets, a controllable clock, raw-SQL helpers."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations

PG_URL = os.environ.get("ALKSTORE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


class FakeClock:
    """The injected clock: epoch seconds that move only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@dataclass
class Target:
    """One database to test against: an engine, the alkstore schema, and its URL."""

    kind: str  # "sqlite" | "postgresql"
    url: str
    engine: sa.Engine
    schema: str

    def store(self, **kw: object) -> alk.Store:
        return alk.Store(self.engine, schema=self.schema, **kw)  # type: ignore[arg-type]

    def table(self, name: str) -> str:
        """A quoted, schema-qualified table name for raw test SQL."""
        if self.kind == "sqlite":
            return f'"{name}"'
        return f'"{self.schema}"."{name}"'

    def scalar(self, sql: str, **params: object) -> object:
        with self.engine.connect() as c:
            return c.execute(sa.text(sql), params).scalar()

    def execute(self, sql: str, **params: object) -> None:
        with self.engine.begin() as c:
            c.execute(sa.text(sql), params)


def engine_with_table(db: Target, table: sa.Table) -> Iterator[sa.Engine]:
    """For an ``app_engine`` fixture: the application's engine with its own ``table`` next to
    alkstore's (on PostgreSQL in the test's schema, so parallel runs never share it), emptied
    afterwards. An ``Engine.execution_options()`` copy on PostgreSQL: the store registered
    for ``db.engine`` must still be found through it."""
    engine = db.engine
    if db.kind == "postgresql":
        engine = engine.execution_options(schema_translate_map={None: db.schema})
    table.create(engine, checkfirst=True)
    yield engine
    with engine.begin() as c:
        c.execute(sa.delete(table))


def pg_available() -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    try:
        eng = sa.create_engine(PG_URL)
        with eng.connect() as c:
            c.execute(sa.text("SELECT 1"))
        eng.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return f"PostgreSQL not reachable at {PG_URL}: {type(exc).__name__}: {exc}"


_template_dir = tempfile.mkdtemp(prefix="alkstore-template-")
_template_path = os.path.join(_template_dir, "template.db")
_template_lock = threading.Lock()


def sqlite_target(directory: str) -> Target:
    """A fresh SQLite file with alkstore installed (copied from a once-migrated template)."""
    with _template_lock:
        if not os.path.exists(_template_path):
            eng = sa.create_engine(f"sqlite:///{_template_path}")
            migrations.upgrade(eng)
            eng.dispose()
    path = os.path.join(directory, f"t-{uuid.uuid4().hex[:8]}.db")
    shutil.copyfile(_template_path, path)
    url = f"sqlite:///{path}"
    return Target("sqlite", url, sa.create_engine(url), "alkstore")


def new_pg_schema(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def pg_target(schema: str) -> Target:
    eng = sa.create_engine(PG_URL, pool_size=10)
    migrations.upgrade(eng, schema=schema)
    return Target("postgresql", PG_URL, eng, schema)


def drop_pg_schema(target: Target) -> None:
    with target.engine.begin() as c:
        c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
    target.engine.dispose()


WAIT = 15.0  # deadline of any single wait in the tests (a hang fails; never a speed claim)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``cond`` until it returns something truthy (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def nested_list(depth: int) -> list[Any]:
    """``[[[...]]]``: ``depth`` lists, each the only item of the one around it."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def list_depth(value: Any) -> int:
    """How deep a ``nested_list`` is, counted without recursion (comparing two values that
    deep with ``==`` would itself run out of recursion depth)."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    return depth


def deepest_accepted(accept: Callable[[Any], Any]) -> tuple[int, Any]:
    """The depth of the most deeply nested ``nested_list`` a payload is accepted at (found
    by bisection with the library's own check, which writes nothing), and what ``accept``
    (a payload API) returned for it, called on a fresh thread: the shallowest stack an
    application can call it from."""
    from alkstore_sa._validate import encode_payload

    def accepted(depth: int) -> bool:
        try:
            encode_payload(nested_list(depth), 1 << 30)
        except alk.PayloadError:
            return False
        return True

    low, high = 1, 10_000  # 10,000 levels are refused (test_bad_input)
    assert accepted(low) and not accepted(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid)
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(accept(nested_list(low))))
    thread.start()
    thread.join()
    assert found, f"a payload {low} levels deep was refused"
    return low, found[0]
