"""docs/api.md stays a reference of the code: every name in ``alkstore_sa.__all__`` appears in
it, and so does every keyword option of the public functions and methods (read from their
signatures), so a new option or name cannot land undocumented; and every signature it writes
is the code's (names, order, keyword-only or not, defaults), for the optional modules too."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa import errors

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


HANDLE_SECTIONS: dict[str, Any] = {
    "Store": lambda store: store, "Queue": lambda store: store.queue("q"),
    "Outbox": lambda store: store.outbox("o"), "Lock": lambda store: store.lock("l"),
    "Stream": lambda store: store.stream("s"), "Subscription": lambda store: store.listen("c"),
    "Worker": lambda store: alk.Worker(store, "q", lambda job: None),
    "Tasks": lambda store: alk.Tasks().task(queue="q", name="t")(lambda: None),
}


@pytest.mark.parametrize("section", sorted(HANDLE_SECTIONS))
def test_every_public_attribute_of_a_handle_is_in_its_section(section: str, tmp_path: Path) -> None:
    """Handles carry public attributes besides their methods (``q.name``, ``q.opts``,
    ``store.schema``, ``worker.poll_interval``): the reference names each in the section of
    its class, so none is public by accident or missing from the reference."""
    store = alk.Store(f"sqlite:///{tmp_path / 'attrs.db'}")
    try:
        store.install()
        handle = HANDLE_SECTIONS[section](store)
        text = _section(section)
        missing = [a for a in vars(handle) if not a.startswith("_") and f"`{a}`" not in text]
        assert not missing, f"{section}: attributes {missing} are not in its section of docs/api.md"
    finally:
        store.close()


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


# -- signatures, mechanically ------------------------------------------------------------------
# Each section of docs/api.md writes the signatures of its owners' members (in a table's first
# column, or starting a line); a signature qualified with `alk.` or
# `alkstore_sa.MODULE.` is read wherever it stands. Every one that parses as a Python
# parameter list must be exactly the code's: names, order, positional or keyword-only,
# defaults. And every public function and method has one.

OPTIONAL = {name: pytest.importorskip(f"alkstore_sa.{name}") for name in ("tracing", "flask", "metrics", "dashboard")}
OWNERS: dict[str, list[object]] = {
    "Store": [alk.Store], "Queue": [alk.Queue], "JobHandle": [alk.JobHandle],
    "Caller's-transaction functions": [alk], "Tasks": [alk.Tasks, alk.Task], "Worker": [alk.Worker],
    "Outbox": [alk.Outbox], "Lock": [alk.Lock], "Stream": [alk.Stream], "Subscription": [alk.Subscription],
    "StopToken": [alk.StopToken], "Data classes": [alk, alk.QueueOpts], "Errors": [alk, errors],
    "Tracing": [OPTIONAL["tracing"]], "Flask": [OPTIONAL["flask"]], "Metrics": [OPTIONAL["metrics"], OPTIONAL["metrics"].Collector],
    "Dashboard": [OPTIONAL["dashboard"]],
}
_SIGNATURE = re.compile(r"`(?:await )?((?:alk\.|alkstore_sa\.[\w.]+\.)?[\w.]+)\(([^`]*?)\)(?: -> [^`]*)?`")
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
    inspect.Parameter.KEYWORD_ONLY: "keyword", inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.VAR_KEYWORD: "**",
}
Params = list[tuple[str, str, object]]


def _written_params(args: str) -> Params | None:
    """``args`` as (name, kind, default) triples; None for prose such as ``name, ...``."""
    try:
        a = ast.parse(f"def f({args}): pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return None
    none = inspect.Parameter.empty
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out: Params = [(p.arg, "positional", none if d is None else ast.literal_eval(d))
                   for p, d in zip(positional, defaults, strict=True)]
    out += [(a.vararg.arg, "*", none)] if a.vararg else []
    out += [(p.arg, "keyword", none if d is None else ast.literal_eval(d))
            for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    out += [(a.kwarg.arg, "**", none)] if a.kwarg else []
    return out


def _code_params(obj: Any) -> Params:
    return [(p.name, _KINDS[p.kind], p.default) for p in inspect.signature(obj).parameters.values()
            if p.name not in ("self", "cls")]


def _written_signatures() -> list[tuple[str, str, Params, list[Any]]]:
    """(section, name as written, its parameters, the members it may name)."""
    found = []
    for chunk in re.split(r"\n(?=## )", API)[1:]:
        title = chunk.split("\n", 1)[0][3:].strip()
        owners = OWNERS.get(title, [])
        for line in re.split(r"\n(?=\|)|\n\n", chunk):
            table_row = line.startswith("|")
            text = line.split(" | ")[0] if table_row else line
            for m in _SIGNATURE.finditer(text):
                name = m[1]
                qualified = name.startswith(("alk.", "alkstore_sa."))
                line_start = m.start() == 0 or text[m.start() - 1] == "\n"
                if not (owners and (table_row or line_start) or qualified):
                    continue
                params = _written_params(m[2])
                if params is None:
                    continue
                short = name.rsplit(".", 1)[-1]
                if name.startswith("alkstore_sa."):
                    module = importlib.import_module(name.rsplit(".", 1)[0])
                    candidates = [getattr(module, short, None)]
                elif name.startswith("alk."):
                    candidates = [getattr(alk, short, None)]
                elif "." in name:  # `QueueOpts.validated(...)`, `store.check_schema()`; not `session.…`
                    head = {"store": alk.Store}.get(name.split(".")[0], getattr(alk, name.split(".")[0], None))
                    if not inspect.isclass(head):
                        continue
                    candidates = [getattr(head, short, None)]
                else:
                    candidates = [getattr(o, short, None) for o in owners]
                found.append((title, name, params, [c for c in candidates if callable(c) and not inspect.ismodule(c)]))
    return found


WRITTEN = _written_signatures()


@pytest.mark.parametrize(("section", "name", "params", "candidates"), WRITTEN,
                         ids=[f"{s}:{n}" for s, n, _, _ in WRITTEN])
def test_every_written_signature_is_the_codes(section: str, name: str, params: Params, candidates: list[Any]) -> None:
    assert candidates, f"{section}: {name} names nothing in the code"
    assert any(_code_params(c) == params for c in candidates), (
        f"{section}: {name}{params} is not the code's {[_code_params(c) for c in candidates]}"
    )


def _public_routines() -> list[tuple[str, Any]]:
    found = []
    for owner_name, owner in [("alk", alk)] + [(n, m) for n, m in OPTIONAL.items()]:
        for name in owner.__all__:
            obj = getattr(owner, name)
            if inspect.isfunction(obj):
                found.append((f"{owner_name}.{name}", obj))
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or attr in INTERNAL or isinstance(member, property):
                        continue
                    func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
                    if inspect.isfunction(func):
                        found.append((f"{owner_name}.{name}.{attr}", getattr(obj, attr)))
    return found


ASYNC_TWINS = {"aenqueue", "aenqueue_many", "aget_job", "anotify", "aoutbox_enqueue", "apublish"}


@pytest.mark.parametrize(("name", "obj"), _public_routines(), ids=[n for n, _ in _public_routines()])
def test_every_public_function_and_method_has_its_signature_written(name: str, obj: Any) -> None:
    short = name.rsplit(".", 1)[-1]
    if name.startswith("alk.") and short in ASYNC_TWINS:  # written `await aenqueue(session, ...)`
        obj = getattr(alk, short[1:])
        assert f"await {short}(" in API, name
    code = _code_params(obj)
    func = getattr(obj, "__func__", obj)  # a classmethod's bound method is made at each access
    assert any(any(getattr(c, "__func__", c) is func for c in cands) and params == code
               for _, _, params, cands in WRITTEN), f"{name}{code} has no signature in docs/api.md"


@pytest.mark.parametrize("name", sorted(ASYNC_TWINS))
def test_an_async_twin_takes_what_its_sync_function_takes(name: str) -> None:
    assert _code_params(getattr(alk, name)) == _code_params(getattr(alk, name[1:]))
