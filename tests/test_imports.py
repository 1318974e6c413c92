"""What importing the package and using it loads (module names, not timings): the ORM and
the PostgreSQL backend are loaded only by applications that use them. ``sqlalchemy.orm``
alone costs about as much CPU at startup as the rest of alkstore_sa, and every ``alkstore``
command and worker process pays its imports before doing anything."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path


def _loaded(code: str, cwd: Path) -> list[str]:
    """The modules loaded in a fresh interpreter after ``code`` ran."""
    script = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout.splitlines()[-1]))


def test_a_sqlite_store_loads_neither_the_orm_nor_the_postgresql_backend(tmp_path: Path) -> None:
    loaded = _loaded(
        f"""
        import alkstore_sa as alk
        store = alk.Store("sqlite:///{tmp_path / 'app.db'}")
        store.install()
        q = store.queue("q")
        q.enqueue({{"n": 1}})
        h = q.claim_one("w")
        h.ack()
        store.close()
        """,
        tmp_path,
    )
    assert "alkstore_sa._backends.sqlite" in loaded  # the check below looks at the right names
    assert not [m for m in loaded if m.startswith("sqlalchemy.orm")]
    assert not [m for m in loaded if m.startswith(("alkstore_sa._backends.postgresql", "alkstore_sa._backends.pg_"))]


def test_a_session_is_still_recognised_once_the_application_imports_the_orm(tmp_path: Path) -> None:
    """The ORM imported after alkstore_sa (a Session made later in the app's startup)."""
    loaded = _loaded(
        f"""
        import alkstore_sa as alk
        import sqlalchemy as sa
        engine = sa.create_engine("sqlite:///{tmp_path / 'app.db'}")
        alk.Store(engine).install()
        from sqlalchemy.orm import Session
        with Session(engine) as session, session.begin():
            job_id = alk.enqueue(session, "q", {{"n": 1}})
        assert alk.Store(engine).get_job(job_id).state == "pending"
        """,
        tmp_path,
    )
    assert "sqlalchemy.orm" in loaded
