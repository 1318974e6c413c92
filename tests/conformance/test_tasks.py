"""SPEC §12 tasks, without the worker: decoration rules, the pinned payload, enqueue to a Store
(own transaction) or to the caller's Session / scoped_session / Connection, ``using``,
``aenqueue`` on async engines, dispatch lookup (``Tasks.resolve``) and ``current_job``."""

from __future__ import annotations

import asyncio
import copy
import inspect
import pickle
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import alkstore_sa as alk
from alkstore_sa import _current
from alkstore_sa.tasks import NotATaskPayload, UnknownTask
from tests.support import FakeClock, Target, engine_with_table, sqlite_target


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "task_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str]


@pytest.fixture
def app_engine(db: Target) -> Iterator[sa.Engine]:
    """The application's engine with an ORM table next to alkstore's (on PostgreSQL in the
    test module's schema)."""
    yield from engine_with_table(db, Order.__table__)


def _notes(engine: sa.Engine) -> list[str]:
    with engine.connect() as c:
        return list(c.scalars(sa.select(Order.note).order_by(Order.id)))


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


def _job(store: alk.Store, job_id: int) -> alk.Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def _send_email(order_id: int, *, template: str = "receipt") -> str:
    """Send the email of one order."""
    return f"{order_id}:{template}"


# -- decoration -----------------------------------------------------------------------------


def test_defaults_and_the_look_of_the_function() -> None:
    tasks = alk.Tasks()
    send = tasks.task()(_send_email)
    assert isinstance(send, alk.Task)
    assert send.name == f"{__name__}._send_email"
    assert send.queue == "default" and send.priority == 0
    assert send.opts == alk.QueueOpts(visibility_timeout=300, max_attempts=3, backoff_base=5)
    assert send.__name__ == "_send_email" and send.__doc__ == "Send the email of one order."
    assert send.__wrapped__ is _send_email and send.func is _send_email
    assert send(7, template="x") == "7:x"  # a plain call runs the function here


def test_a_plain_call_passes_every_keyword_to_the_function(store: alk.Store, qname: str) -> None:
    """A task whose function has a parameter named ``self`` (a method registered from its
    class) takes it as a keyword, in a plain call as in ``enqueue``: the Task's own
    ``__call__`` took it for its ``self`` ('got multiple values for argument')."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="takes-self")
    def takes_self(self: int, n: int = 0) -> tuple[int, int]:
        return self, n

    assert takes_self(self=1, n=2) == (1, 2)
    assert takes_self.enqueue(store, self=1, n=2) > 0


_MODULE_TASKS = alk.Tasks()


@_MODULE_TASKS.task(queue="pickled")
def _double(n: int) -> int:
    return 2 * n


def test_a_task_pickles_by_reference_as_its_function_would() -> None:
    """A module-level task goes where its function could: to a process pool
    (``executor.map(task, items)``), through pickle, by reference. Pickling copied its
    attributes, function included — which is no longer its module's attribute (the Task
    is), so pickle refused it ("not the same object as")."""
    assert pickle.loads(pickle.dumps(_double)) is _double
    assert copy.copy(_double) is _double and copy.deepcopy(_double) is _double
    local = alk.Tasks().task(queue="pickled", name="local")(lambda n: n)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(local)  # not importable by name, as for the function itself


def test_bare_decorator_and_options() -> None:
    tasks = alk.Tasks()

    @tasks.task
    def bare() -> int:
        return 1

    @tasks.task(queue="emails", max_attempts=5, visibility_timeout=timedelta(minutes=1),
                backoff_base=2.5, priority=-3, name="send")
    def configured() -> int:
        return 2

    assert bare() == 1 and bare.name.endswith("test_bare_decorator_and_options.<locals>.bare")
    assert configured() == 2 and configured.name == "send" and configured.queue == "emails"
    assert configured.opts == alk.QueueOpts(visibility_timeout=60, max_attempts=5, backoff_base=2.5)
    assert configured.priority == -3


def test_async_task_call_returns_the_coroutine() -> None:
    tasks = alk.Tasks()

    @tasks.task
    async def build(day: str) -> str:
        await asyncio.sleep(0)
        return f"report {day}"

    coro = build("monday")
    assert inspect.iscoroutine(coro)
    assert asyncio.run(coro) == "report monday"
    assert build.is_async and not tasks.task(name="sync")(_send_email).is_async


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": 2**31},
        {"max_attempts": True},
        {"visibility_timeout": 0},
        {"visibility_timeout": float("nan")},
        {"backoff_base": -1},
        {"backoff_base": float("inf")},
        {"priority": 1.5},
        {"priority": True},
        {"priority": -(2**31) - 1},
    ],
    ids=repr,
)
def test_bad_options_raise_at_decoration(options: dict[str, Any]) -> None:
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidOptions):
        tasks.task(**options)(_send_email)
    assert list(tasks) == []


@pytest.mark.parametrize("field", ["queue", "name"])
@pytest.mark.parametrize("value", ["", "__alkstore_x", "x" * 201, "nul\x00", 5])
def test_bad_names_raise_invalid_name(field: str, value: object) -> None:
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidName):
        tasks.task(**{field: value})(_send_email)
    assert list(tasks) == []


def test_duplicate_name_is_invalid_spec() -> None:
    tasks = alk.Tasks()
    first = tasks.task(queue="a")(_send_email)
    with pytest.raises(alk.InvalidSpec) as info:
        tasks.task(queue="b")(_send_email)
    assert info.value.spec == first.name and first.name in str(info.value)
    with pytest.raises(alk.InvalidSpec):
        tasks.task(name="x")(lambda: None)
        tasks.task(name="x")(lambda: None)
    assert tasks[first.name] is first and tasks[first.name].queue == "a"
    assert alk.Tasks().task(queue="b")(_send_email).queue == "b"  # another registry is another namespace


def test_functions_made_by_one_outer_function_need_a_name_each() -> None:
    """A function defined inside another one has the same default name (``module.outer.
    <locals>.inner``) each time the outer function runs: registering a second one is the
    duplicate-name error, which says why and what to do. With a name each, both register;
    a worker finds them in the registry (it never imports a task by its name)."""
    tasks = alk.Tasks()

    def make(kind: str, name: str | None = None) -> alk.Task[[int], str]:
        @tasks.task(queue="made", name=name)
        def run(n: int) -> str:
            return f"{kind}{n}"

        return run

    first = make("a")
    assert first.name.endswith(".make.<locals>.run")
    with pytest.raises(alk.InvalidSpec, match=r"defined inside another function.*name=") as info:
        make("b")
    assert info.value.spec == first.name
    assert make("b", name="made.b")(1) == "b1" and tasks["made.b"].func is not first.func
    tasks.task(lambda: 1)
    with pytest.raises(alk.InvalidSpec, match=r"default name of every lambda defined there; pass name="):
        tasks.task(lambda: 2)


def test_decorating_something_else_is_refused() -> None:
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidOptions, match="keyword"):
        tasks.task("emails")  # type: ignore[call-overload]
    with pytest.raises(alk.InvalidOptions):
        tasks.task()(42)  # type: ignore[arg-type]


def test_a_method_decorated_in_its_class_body_is_refused_naming_what_works() -> None:
    """``@tasks.task`` on a method (``def send(self, n)`` in a class body) registered a task
    whose jobs could never run: the worker calls a task with the job's arguments alone, so
    ``send.enqueue(store, 1)`` was refused for "missing a required argument: 'n'" (the 1 went
    to ``self``). It is refused at decoration, naming the forms that work; a staticmethod in
    either order, a bound method and a nested function with a ``self`` parameter still register."""
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidOptions, match=r"is a method.*self.*staticmethod.*bound method"):

        class Mailer:
            @tasks.task(queue="emails")
            def send(self, n: int) -> None: ...

    assert len(tasks) == 0

    class Fine:
        @tasks.task(queue="emails")
        @staticmethod
        def above(n: int) -> None: ...

        @staticmethod
        @tasks.task(queue="emails")
        def below(n: int) -> None: ...

        def method(self, n: int) -> None: ...

        def outer(self) -> Any:
            @tasks.task(queue="emails", name="inner")
            def inner(self: Any) -> None: ...  # a closure's parameter may be called anything

            return inner

    tasks.task(Fine().method, name="bound")
    Fine().outer()
    assert sorted(t.name.rsplit(".", 1)[-1] for t in tasks) == ["above", "below", "bound", "inner"]


def test_registry_lookup_and_queues() -> None:
    tasks = alk.Tasks()
    a = tasks.task(name="a", queue="q2")(_send_email)
    b = tasks.task(name="b", queue="q1")(_send_email)
    c = tasks.task(name="c", queue="q2")(_send_email)
    assert list(tasks) == [a, b, c] and len(tasks) == 3
    assert "b" in tasks and "z" not in tasks and 5 not in tasks
    assert tasks["c"] is c and tasks.get("z") is None
    with pytest.raises(KeyError):
        tasks["z"]
    assert tasks.queues() == ["q2", "q1"]  # first-registration order, each once
    assert alk.Tasks().queues() == []


# -- dispatch lookup ------------------------------------------------------------------------


def test_resolve_finds_the_task_and_its_arguments(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    send = tasks.task(queue=qname)(_send_email)
    job = _job(store, send.enqueue(store, 42, template="x"))
    task, args, kwargs = tasks.resolve(job.payload)
    assert task is send and args == [42] and kwargs == {"template": "x"}
    assert task(*args, **kwargs) == "42:x"


def test_resolve_unknown_task() -> None:
    with pytest.raises(UnknownTask) as info:
        alk.Tasks().resolve({"task": "shop.gone", "args": [], "kwargs": {}})
    assert str(info.value) == "unknown task 'shop.gone'" and info.value.name == "shop.gone"
    assert isinstance(info.value, alk.AlkstoreError)


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "shop.send",
        ["shop.send", [], {}],
        {"task": "t", "args": []},
        {"task": "t", "kwargs": {}},
        {"args": [], "kwargs": {}},
        {"task": 5, "args": [], "kwargs": {}},
        {"task": "t", "args": {}, "kwargs": {}},
        {"task": "t", "args": [], "kwargs": []},
    ],
    ids=repr,
)
def test_resolve_malformed_payload(payload: object) -> None:
    tasks = alk.Tasks()
    tasks.task(name="t")(_send_email)
    with pytest.raises(NotATaskPayload, match="not a task payload"):
        tasks.resolve(payload)


# -- enqueue: own transaction ---------------------------------------------------------------


def test_enqueue_to_a_store_pins_payload_and_stamps(store: alk.Store, qname: str, clock: FakeClock) -> None:
    tasks = alk.Tasks()
    send = tasks.task(queue=qname, max_attempts=5, visibility_timeout=60, backoff_base=2, priority=4)(_send_email)
    job = _job(store, send.enqueue(store, 42, template="x"))
    assert job.payload == {"task": send.name, "args": [42], "kwargs": {"template": "x"}}
    assert (job.queue, job.state, job.priority) == (qname, "pending", 4)
    assert (job.max_attempts, job.visibility_timeout, job.backoff_base) == (5, 60, 2)
    assert job.run_at == _ts(clock) and job.expires_at is None
    assert _job(store, send.enqueue(store, 1)).payload == {"task": send.name, "args": [1], "kwargs": {}}


def test_enqueue_to_a_closed_store(db: Target, qname: str) -> None:
    store = db.store()
    store.close()
    send = alk.Tasks().task(queue=qname)(_send_email)
    with pytest.raises(alk.StoreClosed):
        send.enqueue(store, 1)


# -- enqueue: the caller's transaction ------------------------------------------------------


def test_session_commit_and_rollback_with_an_orm_row(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname, max_attempts=7, priority=2)(_send_email)
    with Session(app_engine) as session:
        session.add(Order(note="rolled back"))
        lost = send.enqueue(session, 1)
        session.rollback()
    assert store.get_job(lost) is None and _notes(app_engine) == []

    with Session(app_engine) as session, session.begin():
        session.add(Order(note="kept"))
        kept = send.enqueue(session, 2, template="y")
        assert store.queue(qname).stats().pending == 0  # not visible before the commit
    job = _job(store, kept)
    assert job.payload == {"task": send.name, "args": [2], "kwargs": {"template": "y"}}
    assert (job.max_attempts, job.priority, job.visibility_timeout) == (7, 2, 300)
    assert _notes(app_engine) == ["kept"]


def test_scoped_session_and_connection_targets(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname, visibility_timeout=30)(_send_email)
    scoped = scoped_session(sessionmaker(app_engine))
    scoped.add(Order(note="scoped, rolled back"))
    send.enqueue(scoped, 1)
    scoped.rollback()
    scoped.add(Order(note="scoped"))
    kept = [send.enqueue(scoped, 2)]
    scoped.commit()
    scoped.remove()

    with pytest.raises(RuntimeError), app_engine.begin() as conn:
        send.enqueue(conn, 3)
        raise RuntimeError("the request failed")
    with app_engine.begin() as conn:
        conn.execute(sa.insert(Order).values(note="connection"))
        kept.append(send.enqueue(conn, 4))

    claimed = store.queue(qname).claim_batch("w", 10)  # (SQLite may reuse a rolled-back id)
    assert [(h.id, h.payload["args"]) for h in claimed] == [(kept[0], [2]), (kept[1], [4])]
    assert [_job(store, i).visibility_timeout for i in kept] == [30, 30]
    assert _notes(app_engine) == ["scoped", "connection"]


def test_enqueue_never_commits(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname)(_send_email)
    with Session(app_engine) as session:
        send.enqueue(session, 1)
        assert session.in_transaction()
    assert store.queue(qname).stats().pending == 0  # closed without a commit


def test_engine_without_a_store_uses_the_defaults(tmp_path: Any, qname: str) -> None:
    """Like ``alk.enqueue`` by name, a task enqueue on an engine no Store was made for uses
    the default schema and clock, and still stamps the task's options."""
    target = sqlite_target(str(tmp_path))
    bare_engine = sa.create_engine(target.url)  # no Store constructed or registered for it
    send = alk.Tasks().task(queue=qname, max_attempts=6, visibility_timeout=45)(_send_email)
    with Session(bare_engine) as session, session.begin():
        job_id = send.enqueue(session, 1)
    bare_engine.dispose()
    with target.store() as store:
        job = _job(store, job_id)
        assert job.payload["args"] == [1] and (job.max_attempts, job.visibility_timeout) == (6, 45)
    target.engine.dispose()


# -- bad arguments: nothing written ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, {1, 2}), {}), ((float("nan"),), {}), ((1,), {"template": b"bytes"}), ((object(),), {})],
    ids=["set", "nan", "bytes", "object"],
)
def test_args_must_be_strict_json(
    app_engine: sa.Engine, store: alk.Store, qname: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    send = alk.Tasks().task(queue=qname)(lambda *a, **k: None)
    with pytest.raises(alk.PayloadError, match=send.name):
        send.enqueue(store, *args, **kwargs)
    with Session(app_engine) as session, session.begin():
        session.add(Order(note="still usable"))
        with pytest.raises(alk.PayloadError):
            send.enqueue(session, *args, **kwargs)
    assert store.queue(qname).stats().pending == 0
    assert _notes(app_engine) == ["still usable"]  # the caller's transaction went on


def test_payload_limit_applies_to_the_task_payload(db: Target, qname: str) -> None:
    with db.store(max_payload_bytes=100) as store:
        send = alk.Tasks().task(queue=qname, name="t")(lambda text: None)
        send.enqueue(store, "x" * 40)
        with pytest.raises(alk.PayloadError, match="limit"):
            send.enqueue(store, "x" * 100)
        assert store.queue(qname).stats().pending == 1


def test_arguments_are_checked_against_the_signature(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname)(_send_email)
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}),                      # missing order_id
        ((1, "receipt"), {}),          # template is keyword-only
        ((1,), {"templ": "x"}),        # unknown keyword
    ]
    for args, kwargs in bad:
        with pytest.raises(alk.InvalidOptions, match=send.name):
            send.enqueue(store, *args, **kwargs)
        with Session(app_engine) as session, pytest.raises(alk.InvalidOptions):
            send.enqueue(session, *args, **kwargs)
    assert store.queue(qname).stats().pending == 0


def test_wrong_targets_name_what_is_accepted(db: Target, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname)(_send_email)
    for target in (db.engine, "emails", None, store.queue(qname)):
        with pytest.raises(alk.InvalidOptions, match="Store.*Session.*Connection"):
            send.enqueue(target, 1)  # type: ignore[arg-type]
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(alk.InvalidOptions, match="aenqueue"):
        send.enqueue(AsyncSession(engine), 1)  # type: ignore[arg-type]
    with Session(db.engine) as session, pytest.raises(alk.InvalidOptions, match=r"enqueue\(session"):
        asyncio.run(send.aenqueue(session, 1))  # type: ignore[arg-type]
    asyncio.run(engine.dispose())
    assert store.queue(qname).stats().pending == 0


# -- using ----------------------------------------------------------------------------------


def test_using_overrides_per_call(app_engine: sa.Engine, store: alk.Store, qname: str, clock: FakeClock) -> None:
    send = alk.Tasks().task(queue=qname, max_attempts=3, priority=1)(_send_email)
    later = send.using(delay=30, priority=9, max_attempts=8, expires=600)
    job = _job(store, later.enqueue(store, 1))
    assert (job.priority, job.max_attempts) == (9, 8)
    assert job.run_at == _ts(clock, 30) and job.expires_at == _ts(clock, 600)
    assert job.payload == {"task": send.name, "args": [1], "kwargs": {}}

    job = _job(store, send.using(run_at=_ts(clock, 90)).enqueue(store, 2))
    assert job.run_at == _ts(clock, 90) and job.priority == 1  # the task's priority stays

    with Session(app_engine) as session, session.begin():
        in_tx = later.using(priority=-2).enqueue(session, 3)  # chained: later overrides earlier
    job = _job(store, in_tx)
    assert (job.priority, job.max_attempts, job.run_at) == (-2, 8, _ts(clock, 30))


def test_a_later_using_of_the_ready_time_replaces_the_earlier_one(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """``delay`` and ``run_at`` are two ways to say one thing, the ready time: a chained
    ``using()`` giving one replaces the other given before (in one call, or one
    ``enqueue``, ``delay`` wins: SPEC §5)."""
    send = alk.Tasks().task(queue=qname)(_send_email)
    in_30 = send.using(delay=30)
    assert _job(store, in_30.using(run_at=_ts(clock, 90)).enqueue(store, 1)).run_at == _ts(clock, 90)
    at_90 = send.using(run_at=_ts(clock, 90))
    assert _job(store, at_90.using(delay=30).enqueue(store, 2)).run_at == _ts(clock, 30)
    both = send.using(delay=30, run_at=_ts(clock, 90))
    assert _job(store, both.enqueue(store, 3)).run_at == _ts(clock, 30)
    assert _job(store, both.using(priority=2).enqueue(store, 4)).run_at == _ts(clock, 30)  # kept as given


def test_a_run_at_no_job_could_be_read_back_with_is_refused_and_writes_nothing(store: alk.Store, qname: str) -> None:
    """``using(run_at=datetime.max)`` ("some day, maybe"): the ready time is stored as epoch
    seconds, and the last instant of year 9999 rounds to year 10000, which no datetime
    holds. It was written, and every read of the job after that (``get_job``, the
    dashboard, ``alk.get_job``) raised ValueError 'year 10000 is out of range'. Refused with
    InvalidOptions at ``using()`` (and by ``q.enqueue`` / ``alk.enqueue``), writing nothing."""
    send = alk.Tasks().task(queue=qname)(_send_email)
    last = datetime.max.replace(tzinfo=timezone.utc)
    east = datetime.min.replace(tzinfo=timezone(timedelta(hours=5)))  # before year 1 in UTC
    for when in (last, east):
        with pytest.raises(alk.InvalidOptions, match="run_at"):
            send.using(run_at=when)
        with pytest.raises(alk.InvalidOptions, match="run_at"):
            store.queue(qname).enqueue({"x": 1}, run_at=when)
        with Session(store.engine) as session, session.begin(), pytest.raises(alk.InvalidOptions, match="run_at"):
            alk.enqueue(session, qname, {"x": 1}, run_at=when)
    assert store.queue(qname).stats().pending == 0
    year_9999 = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)  # still a datetime: accepted
    assert _job(store, send.using(run_at=year_9999).enqueue(store, 1)).run_at == year_9999


def test_using_never_changes_the_task(store: alk.Store, qname: str, clock: FakeClock) -> None:
    send = alk.Tasks().task(queue=qname, priority=1)(_send_email)
    later = send.using(delay=30, priority=9)
    assert later is not send and later.using(priority=2) is not later
    job = _job(store, send.enqueue(store, 1))
    assert (job.priority, job.max_attempts, job.run_at) == (1, 3, _ts(clock))
    assert _job(store, later.enqueue(store, 1)).priority == 9  # nor does chaining change `later`


@pytest.mark.parametrize(
    "options",
    [
        {"delay": -1},
        {"priority": 1.5},
        {"priority": 2**31},
        {"max_attempts": 0},
        {"expires": 0},
        {"expires": 1e-7},  # under a millisecond: the job would expire as it is enqueued
        {"run_at": datetime(2030, 1, 1)},  # naive
        {"run_at": "tomorrow"},
    ],
    ids=repr,
)
def test_using_validates_at_once(options: dict[str, Any]) -> None:
    send = alk.Tasks().task()(_send_email)
    with pytest.raises(alk.InvalidOptions):
        send.using(**options)


# -- aenqueue on async engines --------------------------------------------------------------


def _async_url(db: Target) -> str:
    return db.url.replace("sqlite:///", "sqlite+aiosqlite:///", 1) if db.kind == "sqlite" else db.url


def test_aenqueue_in_async_sessions(app_engine: sa.Engine, db: Target, store: alk.Store, qname: str) -> None:
    """AsyncSession (aiosqlite / psycopg async), async_scoped_session and AsyncConnection:
    commit → the job and the ORM row; rollback → neither. A Store runs in a thread."""
    send = alk.Tasks().task(queue=qname, max_attempts=4)(_send_email)
    opts: dict[str, Any] = {}
    if db.kind == "postgresql":
        opts["execution_options"] = {"schema_translate_map": {None: db.schema}}

    async def scenario() -> list[int]:
        engine = create_async_engine(_async_url(db), **opts)
        store.register(engine)
        try:
            async with AsyncSession(engine) as session:
                session.add(Order(note="rolled back"))
                await send.aenqueue(session, 0)
                await session.rollback()
            kept = []
            async with AsyncSession(engine) as session, session.begin():
                session.add(Order(note="async"))
                kept.append(await send.using(priority=5).aenqueue(session, 1, template="a"))
            scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
            kept.append(await send.aenqueue(scoped, 2))
            await scoped.commit()
            await scoped.remove()
            async with engine.begin() as conn:
                kept.append(await send.aenqueue(conn, 3))
            kept.append(await send.aenqueue(store, 4))
            return kept
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())
    assert [h.id for h in store.queue(qname).claim_batch("w", 10)] == kept
    first = _job(store, kept[0])
    assert first.payload == {"task": send.name, "args": [1], "kwargs": {"template": "a"}}
    assert (first.priority, first.max_attempts) == (5, 4)
    assert [_job(store, i).payload["args"] for i in kept[1:]] == [[2], [3], [4]]
    assert _notes(app_engine) == ["async"]


def test_aenqueue_bad_args_write_nothing(db: Target, store: alk.Store, qname: str) -> None:
    send = alk.Tasks().task(queue=qname)(_send_email)

    async def scenario() -> None:
        engine = create_async_engine(_async_url(db))
        store.register(engine)
        try:
            async with AsyncSession(engine) as session, session.begin():
                with pytest.raises(alk.PayloadError):
                    await send.aenqueue(session, {1})
                with pytest.raises(alk.InvalidOptions):
                    await send.aenqueue(session)
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert store.queue(qname).stats().pending == 0


# -- current_job ----------------------------------------------------------------------------


def _fake_job(job_id: int) -> alk.Job:
    now = datetime.now(timezone.utc)
    return alk.Job(
        id=job_id, queue="q", state="processing", payload=None, priority=0, attempts=1,
        max_attempts=3, visibility_timeout=300.0, backoff_base=5.0, dead_letter_retention=None,
        created_at=now, run_at=now, claimed_at=now, claim_expires_at=now, worker_id="w",
        expires_at=None,
    )


def test_current_job_is_set_only_while_running() -> None:
    assert alk.current_job() is None
    outer, inner = _fake_job(1), _fake_job(2)
    with _current.running(outer):
        assert alk.current_job() is outer
        with _current.running(inner):
            assert alk.current_job() is inner
        assert alk.current_job() is outer
    assert alk.current_job() is None
    with pytest.raises(RuntimeError), _current.running(outer):
        raise RuntimeError("the task failed")
    assert alk.current_job() is None


def test_current_job_is_per_thread() -> None:
    seen: dict[int, list[alk.Job | None]] = {}
    both_set = threading.Barrier(2, timeout=15)

    def run(job: alk.Job) -> None:
        with _current.running(job):
            both_set.wait()  # both threads are inside running() at once
            seen[job.id] = [alk.current_job()]
            both_set.wait()
        seen[job.id].append(alk.current_job())

    threads = [threading.Thread(target=run, args=(_fake_job(i),)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert {i: [j.id if j else None for j in js] for i, js in seen.items()} == {1: [1, None], 2: [2, None]}
    assert alk.current_job() is None


def test_current_job_is_per_asyncio_task() -> None:
    async def peek() -> alk.Job | None:
        return alk.current_job()

    async def run(job: alk.Job, both_set: asyncio.Event, count: list[int]) -> int:
        with _current.running(job):
            count.append(1)
            if len(count) == 2:
                both_set.set()
            await both_set.wait()  # both tasks are inside running() at once
            assert alk.current_job() is job
            assert await asyncio.create_task(peek()) is job  # a child task inherits it
            return job.id

    async def main() -> list[int]:
        both_set, count = asyncio.Event(), []
        results = await asyncio.gather(run(_fake_job(1), both_set, count), run(_fake_job(2), both_set, count))
        assert alk.current_job() is None
        return results

    assert asyncio.run(main()) == [1, 2]
