"""``alkstore alembic-revision``: write the application's own Alembic revision that installs
(or upgrades) alkstore's tables inside the app's migration chain.

The call-through model: the generated revision chains to the app's head and calls alkstore's
versioned steps, so the app keeps exactly one head and its plain ``alembic upgrade head`` /
``downgrade`` / ``--sql`` cover alkstore too. (A labelled branch shipped through
``version_locations`` would give the app two heads.) Each generated file carries an
``ALKSTORE_STEPS = (from, to)`` marker, so after a library upgrade the next run writes only
the missing steps.
"""

from __future__ import annotations

import argparse
import configparser
import inspect
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__, _validate, migrations
from ..schema import DEFAULT_SCHEMA
from ._errors import UsageError
from ._shown import shown

if TYPE_CHECKING:  # Alembic is imported when this command runs, not by every alkstore command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

STEPS_MARKER = "ALKSTORE_STEPS"
SCHEMA_MARKER = "ALKSTORE_SCHEMA"
# alembic_version.version_num is a VARCHAR(32): a longer id fails the upgrade that stores it
MAX_REV_ID = 32
_REV_ID = re.compile(rf"[0-9A-Za-z_]{{1,{MAX_REV_ID}}}")


@dataclass(frozen=True)
class Plan:
    """What one generated revision does: move alkstore from one step to another."""

    rev_id: str
    down_revision: str | None
    from_step: int
    to_step: int
    schema: str


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "alembic-revision",
        help="write your app's Alembic revision that installs/upgrades alkstore's tables (one head)",
    )
    p.add_argument("-c", "--config", default=None, help="the app's alembic.ini or pyproject.toml (default: $ALEMBIC_CONFIG, else ./alembic.ini; [tool.alembic] of a pyproject.toml beside it is read too, or alone)")
    p.add_argument("-n", "--name", default="alembic", help="the ini's section to read, as `alembic -n NAME` (default: alembic)")
    p.add_argument("--down-revision", help="app revision to chain to, `base` for none (default: the app's single head)")
    p.add_argument(
        "--from-step", type=int,
        help="alkstore step the app's chain already reaches (default: read from the revisions "
        "this command generated earlier, else 0)",
    )
    head = migrations.head_step()
    p.add_argument("--to-step", type=int, default=head, help=f"target step (default: {head}, this library's)")
    p.add_argument(
        "--schema",
        help=f"PostgreSQL schema of alkstore's tables (default: $ALKSTORE_SCHEMA, else the earlier "
        f"generated revision's, else {DEFAULT_SCHEMA!r}; a schema other than the earlier "
        f"revision's is refused); SQLite ignores it",
    )
    p.add_argument("--version-path", help="directory to write into (default: the app's versions directory)")
    p.add_argument("--rev-id", help="revision id of the new file (default: a random one, as alembic does)")
    p.set_defaults(func=run)


def checked_rev_id(value: str | None) -> str | None:
    """The ``--rev-id`` given (None: not given), refused unless it is 1 to 32 ASCII letters,
    digits or underscores. It starts the file's name and is the revision's literal: a
    ``/`` or ``..`` would write elsewhere, a quote, newline or space a broken file or one
    Alembic's tooling misreads. Checked before anything is read or written."""
    if value is not None and not _REV_ID.fullmatch(value):
        raise UsageError(
            f"--rev-id {value!r}: a revision id is 1 to {MAX_REV_ID} letters, digits or "
            f"underscores (A-Z, a-z, 0-9, _); it names the file written and is stored in "
            f"alembic_version"
        )
    return value


def run(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    checked_rev_id(args.rev_id)
    try:
        args.config = args.config or os.environ.get("ALEMBIC_CONFIG") or "alembic.ini"  # as alembic's own default
        try:
            script = _app_scripts(args.config, args.name)
        except (configparser.Error, ValueError) as exc:  # ValueError: TOML's decode error, bytes not UTF-8
            raise UsageError(
                f"alembic-revision: the app's Alembic configuration ({args.config}, or the "
                f"pyproject.toml read with it) cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
        plan, version_path = _plan(args, script)
    except CommandError as exc:
        raise UsageError(f"alembic-revision: {exc}") from exc
    if plan is None:
        print(f"alkstore is already at step {args.to_step} in this chain: nothing to generate")
        return 0
    version_path.mkdir(parents=True, exist_ok=True)
    path = version_path / f"{plan.rev_id}_alkstore_steps_{plan.from_step}_to_{plan.to_step}.py"
    path.write_text(render(plan), encoding="utf-8")
    print(shown(f"wrote {path} (alkstore steps {plan.from_step} -> {plan.to_step}, revises {plan.down_revision})"))
    return 0


def _app_scripts(config: str, name: str = "alembic") -> ScriptDirectory | None:
    """The app's script directory, or None when it has no Alembic configuration (arguments
    must say all). As ``alembic`` reads it: the ini (its section ``name``, as ``alembic -n
    NAME``), or with none (Alembic >= 1.16) the ``[tool.alembic]`` table of a
    ``pyproject.toml`` — the one ``-c`` names, else the one where the ini would be."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    path = Path(config)
    if path.name != "pyproject.toml" and path.is_file():
        settings = app_config(path, name)
        named = getattr(settings, "get_alembic_option", settings.get_main_option)("script_location")  # ini or toml
        if named is None and not settings.file_config.has_section(name) and not (path.parent / "env.py").is_file():
            # an ini of several environments, run as `alembic -n NAME`: Alembic's own words
            # ("No 'script_location' key found") would not say which section was read
            raise CommandError(
                f"{config} has no [{name}] section"
                + (": give the section your `alembic -n NAME` reads with -n NAME" if name == "alembic" else "")
            )
        if named is None and (path.parent / "env.py").is_file():
            # Flask-Migrate's layout: migrations/alembic.ini names no script_location; `flask
            # db` sets it to the ini's own directory, which holds env.py and versions/
            settings.set_main_option("script_location", str(path.parent).replace("%", "%%"))
        return ScriptDirectory.from_config(settings)
    toml = path if path.name == "pyproject.toml" else path.parent / "pyproject.toml"
    if not toml.is_file() or "toml_file" not in inspect.signature(Config).parameters:
        return None
    settings = Config(toml_file=str(toml))
    if settings.get_alembic_option("script_location") is None:  # a pyproject.toml without [tool.alembic]
        return None
    return ScriptDirectory.from_config(settings)


def app_config(ini: Path, name: str = "alembic") -> Config:
    """The app's Alembic config as the ``alembic`` command reads it: the ini plus the
    ``[tool.alembic]`` table of a ``pyproject.toml`` — the one next to the ini, else the
    current directory's, which is where ``alembic`` looks. Alembic >= 1.16's ``pyproject``
    template keeps ``script_location`` there; older Alembic reads the ini alone."""
    from alembic.config import Config

    if "toml_file" not in inspect.signature(Config).parameters:  # Alembic < 1.16
        return Config(str(ini), ini_section=name)
    toml = next((p for p in (ini.parent / "pyproject.toml", Path("pyproject.toml")) if p.is_file()), None)
    return Config(str(ini), ini_section=name, toml_file=None if toml is None else str(toml))


def _plan(args: argparse.Namespace, script: ScriptDirectory | None) -> tuple[Plan | None, Path]:
    from alembic.util import CommandError, rev_id

    from ..migrations import steps

    if script is None and None in (args.version_path, args.down_revision, args.from_step):
        raise CommandError(
            f"no {args.config} (nor a pyproject.toml with [tool.alembic]): pass -c path/to/alembic.ini, or all of --version-path, "
            "--down-revision (`base` for none) and --from-step"
        )
    down = None if args.down_revision == "base" else args.down_revision
    if args.down_revision is None and script is not None:
        down = _single_head(script)
    elif down is not None and script is not None:
        # raises CommandError when the app has no such revision; the file names the full id of
        # what alembic reads the argument as (`head`, a prefix, `rev@head`): written as given,
        # `down_revision = "head"` is no revision, and every alembic command then failed
        found = script.get_revision(down)
        down = None if found is None else found.revision
    prev_step, prev_schema = previous_alkstore(script, down)
    if args.from_step is None and prev_step > steps.HEAD:
        raise CommandError(
            f"the app's chain already reaches alkstore step {prev_step} (a revision generated by a "
            f"newer alkstore_sa), and this alkstore_sa ({__version__}) ships steps up to {steps.HEAD}: "
            "nothing it could generate; upgrade alkstore_sa"
        )
    from_step = prev_step if args.from_step is None else args.from_step
    # the schema every other command reads from $ALKSTORE_SCHEMA: a revision baking another
    # one would install the tables where the app's workers and commands do not look
    env_schema = os.environ.get("ALKSTORE_SCHEMA") or None
    if args.schema is None and env_schema is not None:
        _validate.schema(env_schema)
    given, source = (args.schema, "--schema") if args.schema is not None else (env_schema, "$ALKSTORE_SCHEMA")
    schema = given if given is not None else prev_schema or DEFAULT_SCHEMA
    if prev_schema is not None and schema != prev_schema:
        raise CommandError(
            f"earlier alkstore revisions use schema {prev_schema!r}; a later step cannot move "
            f"the tables to {schema!r} ({source}"
            + (": unset it, or give the chain's schema with --schema)" if source == "$ALKSTORE_SCHEMA" else ")")
        )
    if not 0 <= from_step <= args.to_step <= steps.HEAD:
        raise CommandError(
            f"need 0 <= from-step ({from_step}) <= to-step ({args.to_step}) <= {steps.HEAD}"
        )
    _check_one_line(script, down)
    version_path = Path(args.version_path) if args.version_path else _versions_dir(script)
    if from_step == args.to_step:
        return None, version_path
    return Plan(rev_id() if args.rev_id is None else args.rev_id, down, from_step, args.to_step, schema), version_path


def _single_head(script: ScriptDirectory) -> str | None:
    """The app's one head (None for an empty chain). With several, the new revision would
    have no single place to go: say what to do (Alembic's own words name its Python API)."""
    from alembic.util import CommandError

    heads = sorted(script.get_heads())
    if len(heads) > 1:
        carrying = sorted({h for rev, _, _ in _generated(script) for h in _heads_above(script, rev)})
        raise CommandError(
            f"the app's migrations have {len(heads)} heads ({', '.join(heads)}): merge them "
            f"first (`alembic merge heads`), or pass --down-revision REV to chain the alkstore "
            f"revision to one of them"
            + (f" (alkstore's revisions continue on {', '.join(carrying)})" if carrying else "")
        )
    return heads[0] if heads else None


def _generated(script: ScriptDirectory) -> list[tuple[str, tuple[int, int], str]]:
    """Every revision of the app's chain this command wrote: (id, its steps, its schema)."""
    out = []
    for rev in script.walk_revisions():
        marker = getattr(rev.module, STEPS_MARKER, None)
        if marker is not None:
            schema = getattr(rev.module, SCHEMA_MARKER, None) or DEFAULT_SCHEMA
            out.append((rev.revision, (int(marker[0]), int(marker[1])), schema))
    return out


def _below(script: ScriptDirectory, rev: str | None) -> set[str]:
    """``rev`` and every revision it descends from."""
    if rev is None:
        return set()
    return {r.revision for r in script.iterate_revisions(rev, "base")}


def _heads_above(script: ScriptDirectory, rev: str) -> list[str]:
    return [h for h in script.get_heads() if rev in _below(script, h)]


def _check_one_line(script: ScriptDirectory | None, down: str | None) -> None:
    """Refuse a revision that would not continue every generated revision of the chain.

    Chained to another branch's head (an app keeping two heads apart, after the several-heads
    refusal asked for --down-revision), or below the earlier revision, the new one could not
    see it: it installed the same tables again from step 0 beside it, so ``alembic upgrade
    heads`` ran it as the missing steps only, and downgrading its branch dropped every alkstore
    table under the other branch's revision (offline, ``--sql`` created them twice). With
    another --schema it started a second line the chain cannot follow: once the heads were
    merged, later runs continued one schema and refused the other ("cannot move the tables").
    One chain carries one line of alkstore revisions, for one schema (docs/install.md: a
    second application's tables belong to its own chain)."""
    from alembic.util import CommandError

    if script is None:
        return
    below = _below(script, down)
    for rev, (from_step, to_step), rev_schema in _generated(script):
        if rev not in below:
            heads = _heads_above(script, rev)
            raise CommandError(
                f"alkstore's revision {rev} (alkstore steps {from_step} -> {to_step}, schema "
                f"{rev_schema!r}) is not below {down or 'base'}: a revision there would start a "
                f"second line of alkstore revisions on another branch (the same tables installed "
                f"twice, or a second schema later runs cannot follow). Pass --down-revision "
                f"{' or '.join(heads) or rev} (which continue from it), or merge the heads first "
                f"(`alembic merge heads`)"
            )


def _versions_dir(script: ScriptDirectory | None) -> Path:
    from alembic.util import CommandError

    assert script is not None  # _plan demands --version-path without a config
    try:
        return Path(script.versions)
    except CommandError as exc:  # several version_locations
        raise CommandError(f"{exc}: pass --version-path") from exc


def previous_alkstore(script: ScriptDirectory | None, down: str | None) -> tuple[int, str | None]:
    """The step and schema of the nearest generated alkstore revision below ``down``."""
    if script is None or down is None:
        return 0, None
    for rev in script.iterate_revisions(down, "base"):
        marker = getattr(rev.module, STEPS_MARKER, None)
        if marker is not None:
            return int(marker[1]), getattr(rev.module, SCHEMA_MARKER, None)
    return 0, None


def render(plan: Plan) -> str:
    """The revision file's text: the steps are baked in (``ALKSTORE_STEPS``), so the file
    does what it did when a later library version ships more steps."""
    return _TEMPLATE.format(
        version=__version__,
        rev_id=plan.rev_id,
        rev_lit=_lit(plan.rev_id),
        down=_lit(plan.down_revision),
        # an unchecked --down-revision (no alembic.ini) inside the docstring: escaped as in
        # a string literal, so a quote or backslash in it cannot end or break the docstring
        down_text=_lit(plan.down_revision)[1:-1] if plan.down_revision else "",
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        from_step=plan.from_step,
        to_step=plan.to_step,
        to_rev=migrations.step_revision(plan.to_step),  # checked here, at generation time
        schema=_lit(plan.schema),
    )


def _lit(value: str | None) -> str:
    """A Python literal in the double quotes formatters prefer (a JSON string is one)."""
    return "None" if value is None else json.dumps(value)


_TEMPLATE = '''\
"""alkstore schema steps {from_step} -> {to_step} (written by `alkstore alembic-revision`, alkstore_sa {version}).

Installs alkstore's tables inside this application's migration chain: it calls alkstore's
versioned steps (frozen once released), then records the schema version alkstore checks
before its first operation ({to_rev}). Steps that version already records (run by
`alkstore migrate`, say) are skipped. Do not edit. After upgrading alkstore_sa, run
`alkstore alembic-revision` again: it continues from ALKSTORE_STEPS below.

Revision ID: {rev_id}
Revises: {down_text}
Create Date: {date}
"""

from __future__ import annotations

from alkstore_sa.alembic_support import downgrade_steps, upgrade_steps

revision = {rev_lit}
down_revision = {down}
branch_labels = None
depends_on = None

# Read by `alkstore alembic-revision` to continue from here: (from step, to step).
ALKSTORE_STEPS = ({from_step}, {to_step})
# alkstore's PostgreSQL schema (on SQLite its tables carry the reserved `alkstore_` prefix).
ALKSTORE_SCHEMA = {schema}


def upgrade() -> None:
    upgrade_steps(*ALKSTORE_STEPS, schema=ALKSTORE_SCHEMA)


def downgrade() -> None:
    downgrade_steps(*ALKSTORE_STEPS, schema=ALKSTORE_SCHEMA)
'''
