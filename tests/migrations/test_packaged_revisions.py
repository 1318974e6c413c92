"""The packaged revisions are read off their files without Alembic (a worker or an
``alkstore`` command that only checks the schema version does not pay for importing it);
that reading must be Alembic's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.script import ScriptDirectory

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa.migrations import steps


def test_the_files_read_without_alembic_are_alembics_revisions() -> None:
    script = ScriptDirectory.from_config(migrations.alembic_config())
    assert migrations.packaged_revisions() == {r.revision for r in script.walk_revisions()}
    assert migrations.head_revision() == script.get_current_head()
    assert migrations.head_step() == steps.HEAD


def test_checking_the_schema_and_the_status_command_do_not_import_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with alk.Store(url) as store:
        store.install()
    program = f"""
import contextlib, io, sys
import alkstore_sa as alk
from alkstore_sa.cli import main

store = alk.Store({url!r})
store.check_schema()
store.close()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["status", "--url", {url!r}])
print(code, sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic.")))
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "[]"], out.stdout
