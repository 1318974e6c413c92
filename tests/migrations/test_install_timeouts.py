"""PostgreSQL installs serialize on an advisory lock ("concurrent runs serialize",
install.md). A migrating role's lock_timeout or statement_timeout (a DBA's usual guard, so
that a migration's ALTER TABLE never queues behind a long transaction) must not turn the
wait for another deploy's install into a failure: the wait is exempt, and the steps after it
run under the role's timeouts again."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.support import PG_URL, new_pg_schema, wait_for

TIMEOUTS = "-c lock_timeout=50 -c statement_timeout=200"


def _engine() -> sa.Engine:
    return sa.create_engine(PG_URL, connect_args={"options": TIMEOUTS})


def test_an_install_waits_for_another_past_the_roles_timeouts() -> None:
    """Another install holds the lock longer than both timeouts: this one waits, then
    installs (it failed with 'canceling statement due to lock timeout'; three concurrent
    `alkstore migrate` of a fresh database under lock_timeout=50ms: one of them failed)."""
    require_pg()
    schema = new_pg_schema("inst_to")
    admin, engine = sa.create_engine(PG_URL), _engine()
    outcome: list[object] = []
    try:
        with admin.connect() as holder:
            holder.begin()
            migrations.lock_installs(holder)  # another deploy, mid-install

            def install() -> None:
                try:
                    migrations.upgrade(engine, schema=schema)
                    outcome.append("installed")
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    outcome.append(exc)

            runner = threading.Thread(target=install)
            runner.start()
            def waiting() -> object:
                with admin.connect() as c:
                    # the install lock alone (a bigint key: its high half in classid, low in
                    # objid): another session's advisory lock must not stand in for the wait
                    return c.exec_driver_sql(
                        "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND NOT granted"
                        " AND objsubid = 1 AND classid = %(hi)s AND objid = %(lo)s",
                        {"hi": migrations._LOCK_KEY >> 32, "lo": migrations._LOCK_KEY & 0xFFFFFFFF},
                    ).scalar() or outcome

            wait_for(waiting, "the install to wait for the lock")
            time.sleep(0.5)  # well past both timeouts (50 ms, 200 ms)
            holder.rollback()
            runner.join(60)
        assert outcome == ["installed"], outcome
        with admin.connect() as c:
            assert migrations.current_revision(c, schema) == migrations.head_revision()
    finally:
        with admin.begin() as c:
            c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()
        admin.dispose()


def test_the_steps_run_under_the_roles_timeouts_again() -> None:
    """Only the wait is exempt: after the lock, the transaction's timeouts are the session's."""
    require_pg()
    engine = _engine()
    try:
        with engine.connect() as c, c.begin():
            migrations.lock_installs(c)
            assert c.exec_driver_sql("SHOW lock_timeout").scalar() == "50ms"
            assert c.exec_driver_sql("SHOW statement_timeout").scalar() == "200ms"
    finally:
        engine.dispose()
