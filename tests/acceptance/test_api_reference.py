"""docs/api.md stays a reference of the code: every name in ``alkstore_sa.__all__`` appears in
it, and so does every keyword option of the public functions and methods (read from their
signatures), so a new option or name cannot land undocumented."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

import alkstore_sa as alk

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
INTERNAL = {"executor", "session_executor", "hub"}  # listed as internal, options not documented


def _callables() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name in alk.__all__:
        obj = getattr(alk, name)
        if inspect.isclass(obj):
            found.append((name, obj))
            for attr, member in vars(obj).items():
                if attr.startswith("_") or attr in INTERNAL or isinstance(member, property):
                    continue
                func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
                if callable(func):
                    found.append((f"{name}.{attr}", func))
        elif callable(obj):
            found.append((name, obj))
    return found


@pytest.mark.parametrize("name", alk.__all__)
def test_every_public_name_is_in_the_reference(name: str) -> None:
    assert f"`{name}" in API or f"{name}(" in API or f"## {name}" in API, name


@pytest.mark.parametrize(("name", "obj"), _callables(), ids=[n for n, _ in _callables()])
def test_every_option_is_in_the_reference(name: str, obj: object) -> None:
    if name.split(".")[-1] not in API:
        pytest.fail(f"{name} is not in docs/api.md")
    try:
        params = inspect.signature(obj).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    for p in params:
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        # a keyword option is shown with its default; a dataclass field in its table by name
        keyword = p.default is not p.empty and not dataclasses.is_dataclass(obj)
        shown = f"{p.name}=" if keyword else p.name
        assert shown in API, f"{name}: parameter {shown!r} is not in docs/api.md"


def _section(title: str) -> str:
    start = API.index(f"## {title}\n")
    end = API.find("\n## ", start + 1)
    return API[start:] if end < 0 else API[start:end]


@pytest.mark.parametrize("bad", ["", "x" * 64, "a\x00b", None, 5], ids=repr)
def test_the_reference_names_the_error_a_bad_schema_raises(bad: object) -> None:
    """A schema is an option (SPEC §3 lists it among no names): InvalidOptions, as the CLI
    says, and the reference says so."""
    with pytest.raises(alk.InvalidOptions) as info:
        alk.Store("sqlite:///never-created.db", schema=bad)  # type: ignore[arg-type]
    assert not isinstance(info.value, alk.InvalidName)
    store = _section("Store")
    assert "`InvalidName` (bad `schema`)" not in store
    assert "a bad `schema`" in store.split("Raises `InvalidOptions` (", 1)[1].split(")", 1)[0]


def test_the_reference_says_a_lock_owner_is_no_name() -> None:
    """The code checks an owner as a label (InvalidOptions, no reserved prefix: see
    tests/conformance/test_locks.py); the reference must not call it a name."""
    lock = _section("Lock")
    assert "`owner` a name" not in lock
    assert "`owner` is a label, not a name" in lock and "`InvalidOptions`" in lock


def test_the_reference_says_what_a_failed_transactional_call_leaves() -> None:
    """A caller's-transaction call whose statement fails (NotInstalled, DatabaseError)
    invalidates the caller's transaction on PostgreSQL on purpose — its commit raises
    PendingRollbackError rather than silently rolling back (tests/conformance/test_drivers.py,
    docs/transactional-enqueue.md) — while SQLite's stays usable. The reference said these
    errors were "checked without poisoning your transaction". These calls read no recorded
    schema version: on an older schema only a statement that needs what it lacks raises
    SchemaOutdated, and the reference says so."""
    section = _section("Caller's-transaction functions")
    assert "without poisoning" not in section
    errors = " ".join(section.split("Errors:", 1)[1].split("`current_job()", 1)[0].split())
    for said in ["**PostgreSQL**", "PendingRollbackError", "rollback()", "begin_nested()", "**SQLite**",
                 "transactional-enqueue.md#when-a-call-fails", "raises `SchemaOutdated` naming the command",
                 "store.check_schema()"]:
        assert said in errors, said
