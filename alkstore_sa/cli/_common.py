"""Options every command shares (the database URL and the PostgreSQL schema), opening the
store, the parser whose options refuse to be repeated, and stopping on signals."""

from __future__ import annotations

import argparse
import concurrent.futures.thread
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from sqlalchemy.engine import URL

from .. import _validate
from .._urls import in_memory_sqlite, parse_url, shown_url, sqlite_path
from ..errors import InvalidOptions
from ..schema import DEFAULT_SCHEMA
from ..stop import StopToken
from ..store import Store
from ._errors import UsageError

log = logging.getLogger("alkstore_sa.cli")


def add_database_options(parser: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """--url, --schema and, for the commands that listen for wake-ups or run a store that
    may (``listen``), --listen-url; ``migrate`` never listens, and an option it would accept
    and ignore would also go unchecked."""
    parser.add_argument(
        "--url",
        default=os.environ.get("ALKSTORE_DATABASE_URL"),
        help="database URL: postgresql://, postgres:// (psycopg 3) or sqlite:///path; driver "
        "options go in its query, e.g. ?prepare_threshold=none (default: $ALKSTORE_DATABASE_URL)",
    )
    parser.add_argument(
        "--schema",
        default=os.environ.get("ALKSTORE_SCHEMA") or DEFAULT_SCHEMA,
        help="PostgreSQL schema of the alkstore tables (default: $ALKSTORE_SCHEMA or 'alkstore')",
    )
    if not listen:
        return
    parser.add_argument(
        "--listen-url",
        default=os.environ.get("ALKSTORE_LISTEN_URL") or None,
        help="PostgreSQL: a direct connection for LISTEN when --url goes through a "
        "transaction-mode pooler (default: $ALKSTORE_LISTEN_URL, else --url); see docs/pgbouncer.md",
    )


ENVIRONMENT = {"url": "ALKSTORE_DATABASE_URL", "schema": "ALKSTORE_SCHEMA", "listen_url": "ALKSTORE_LISTEN_URL"}
"""The environment variable each database option defaults to."""


def from_environment(args: argparse.Namespace, dest: str) -> str | None:
    """``$VARIABLE`` when the value of the option ``dest`` came from the environment (None:
    given on the command line, or the built-in default)."""
    if dest in getattr(args, "given_options", ()) or dest not in ENVIRONMENT:
        return None
    variable = ENVIRONMENT[dest]
    return f"${variable}" if os.environ.get(variable) else None


@contextmanager
def said_of(args: argparse.Namespace, dest: str) -> Iterator[None]:
    """A refusal of an option's value that the environment gave names the variable: the
    command line the operator typed does not hold it (``ALKSTORE_SCHEMA=a.b`` in a unit
    file, an ``ALKSTORE_LISTEN_URL`` meant for another database)."""
    try:
        yield
    except (InvalidOptions, UsageError) as exc:
        variable = from_environment(args, dest)
        if variable is None:
            raise
        option = "--" + dest.replace("_", "-")
        raise type(exc)(f"{variable} (the default of {option}): {exc}") from exc


def check_options(args: argparse.Namespace) -> None:
    """The options several commands share, checked as the library checks them before the
    command runs (and before ``migrate`` creates a file or ``alembic-revision`` writes one):
    a --schema ``Store`` would refuse is refused by every command, in the same words."""
    schema = getattr(args, "schema", None)
    if schema is not None:  # alembic-revision: None when not given (then read from the chain)
        with said_of(args, "schema"):
            _validate.schema(schema)


def database_url(args: argparse.Namespace) -> URL:
    """The database the command works on, parsed. An in-memory SQLite database is refused:
    it would live and die with this one command, unseen by the application and every other
    process (``migrate`` would report an install that is gone when it exits)."""
    if not args.url:
        raise UsageError("no database URL: pass --url URL or set ALKSTORE_DATABASE_URL")
    with said_of(args, "url"):
        url = parse_url(str(args.url))
        if in_memory_sqlite(url):
            raise UsageError(
                f"--url {shown_url(url)} is an in-memory SQLite database, "
                f"gone when this command exits: an alkstore command needs a database file or server "
                f"it can share with the application (e.g. sqlite:///app.db)"
            )
    return url


def open_store(args: argparse.Namespace) -> Store:
    """The store the command works on. The database must exist: only ``migrate`` creates
    one (sqlite3 would otherwise create an empty file for a mistyped path)."""
    url = database_url(args)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise UsageError(
            f"the SQLite database {str(path)!r} does not exist: check --url, or create it with "
            f"`alkstore migrate --url URL`"
        )
    return Store(url, schema=args.schema, listen_url=listen_url(args, url))


def listen_url(args: argparse.Namespace, url: URL) -> URL | None:
    """The --listen-url, checked as ``Store`` checks it but refused under the option's name
    (or its environment variable's) rather than the store's parameter's."""
    given = getattr(args, "listen_url", None)
    if given is None:
        return None
    with said_of(args, "listen_url"):
        if url.get_backend_name() != "postgresql":
            raise InvalidOptions("--listen-url is for PostgreSQL stores (SQLite wakes through its watcher)")
        parsed = parse_url(str(given))
        if parsed.get_backend_name() != "postgresql":
            raise InvalidOptions("--listen-url must be a PostgreSQL URL")
    return parsed


class Once(argparse.Action):
    """An option that takes one value refuses a second: argparse would silently keep the
    last (``--url A --url B`` would target B). ``Parser`` makes this the action of every
    such option; a repeatable one says ``action="append"``. ``hint`` says what to do instead."""

    def __init__(self, *a: Any, hint: str = "", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.hint = hint

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: str | Sequence[Any] | None, option_string: str | None = None,
    ) -> None:
        given: set[argparse.Action] | None = getattr(parser, "_given", None)
        if self.option_strings:  # a positional is consumed once anyway
            if given is None:  # a plain ArgumentParser: an option left at its default of None
                repeated = getattr(namespace, self.dest, None) is not None
            else:
                repeated = self in given
                given.add(self)
            if repeated:
                # the values are not echoed: a --url may carry a password
                hint = self.hint or "it takes a single value"
                raise argparse.ArgumentError(self, f"given more than once; {hint}")
            # which values the command line gave (the others are defaults, some from the
            # environment: from_environment)
            given_options: set[str] = namespace.__dict__.setdefault("given_options", set())
            given_options.add(self.dest)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """The ArgumentParser of ``alkstore`` and each of its subcommands (a subparser is made
    of its parent's class): every option that stores one value refuses a repeat (``Once``
    is the default action), and a usage error is one line on stderr (exit code 2) naming the
    ``--help`` to read instead of printing the whole usage."""

    _given: set[argparse.Action] | None = None

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.register("action", None, Once)
        self.register("action", "store", Once)
        # type=int / type=float read ASCII digits only (int() takes '\u0663' for 3); the
        # usage error still says "invalid int value"
        self.register("type", int, _validate.int_text)
        self.register("type", float, _validate.float_text)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        # the options given in this parse (a default, even one from the environment, is not
        # a first value); a subcommand's parser parses with a set of its own
        outer, self._given = self._given, set()
        try:
            return super().parse_known_args(args, namespace)
        finally:
            self._given = outer

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


STOP_MARGIN = 20.0
"""Seconds a stopping command gets past its own bound (``exit_after``) before it is ended:
the worker's drain takes at most the grace period, its ack writer's 10 s for a write in
progress and the event loop's 6 s to unwind; anything longer is a blocked call."""


COLD_AFTER = 1.0
"""Seconds after the first stop signal from which a SIGINT is a second Ctrl-C (ending the
process at once); one sooner is the same keypress, forwarded by a wrapper."""


class SignalStop(StopToken):
    """The StopToken of ``stop_on_signals``. ``signalled`` is set in the signal handler
    itself, so the main thread sees it as soon as the handler returns; ``stopped`` follows
    once the thread the handler hands the stop to has run."""

    signalled = False


def stop_on_signals(stopping: str = "stopping", *, exit_after: float | None = None) -> SignalStop:
    """A StopToken that SIGTERM and SIGINT stop (graceful shutdown, exit code 0); each
    signal is logged with what happens next (``stopping``).

    A second Ctrl-C — a SIGINT at least COLD_AFTER seconds after the first stop signal —
    ends the process at once with exit code 130, without waiting for what is in flight (a
    worker's jobs: their claims lapse and they are retried, as after SIGKILL), as Celery's
    and RQ's do. A SIGINT sooner than that is the first keypress again, forwarded by a
    wrapper that got it too (a process manager, a shell script); a second SIGTERM changes
    nothing either (process managers send one, then SIGKILL).

    ``exit_after``: the seconds the stop may take (the worker's grace period). A process
    still running ``exit_after + STOP_MARGIN`` seconds after the first signal is blocked in
    a call that no stop can interrupt — a connection to an unresponsive database server,
    which has no timeout of its own — and is ended there with exit code 1 and a line saying
    so, instead of ignoring every SIGTERM and SIGINT until its process manager kills it."""
    stop = SignalStop()
    first_at: list[float] = []  # when the first stop signal came (set in the handler only)

    def stop_after(name: str, first: bool) -> None:
        if first:
            hint = " (Ctrl-C again to exit at once)" if name == "SIGINT" else ""
            log.info("received %s; %s%s", name, stopping, hint)
        else:
            log.info("received %s again; already stopping", name)
        stop.stop()
        if first and exit_after is not None:
            time.sleep(exit_after + STOP_MARGIN)  # a daemon thread: gone if the process ends first
            _force_exit(name, exit_after + STOP_MARGIN)

    def on_signal(signum: int, _frame: Any) -> None:
        # A handler runs in the main thread between two bytecodes, possibly while that thread
        # holds a lock stopping needs (the token's, an Event's, a log handler's): taking it
        # here would deadlock, so the stop (and its log line) happen on a thread of their own.
        # Handlers run one at a time in the main thread, so first_at needs no lock.
        stop.signalled = True
        name = signal.Signals(signum).name
        now = time.monotonic()
        if first_at and signum == signal.SIGINT and now - first_at[0] >= COLD_AFTER:
            _exit_now()
        first = not first_at
        if first:
            first_at.append(now)
        threading.Thread(target=stop_after, args=(name, first), name="alkstore-signal", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_handlers() -> list[Any]:
    """The handlers of the stop signals now (``stop_on_signals``'s, right after it)."""
    return [signal.getsignal(s) for s in STOP_SIGNALS]


def keep_stop_handlers(handlers: list[Any]) -> None:
    """Put ``handlers`` (``stop_handlers()``) back where code run since replaced them: an
    application that installs its own at import would otherwise take SIGTERM from the
    command that imported it, which then never stops."""
    for signum, handler in zip(STOP_SIGNALS, handlers, strict=True):
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


def exit_past_abandoned_jobs(abandoned: int, code: int = 0) -> None:
    """After a worker stopped and ``abandoned`` jobs still ran at the end of its grace period
    (their claims lapse): end the process now with ``code`` when threads would hold up the
    interpreter's exit — threads those jobs started or keep busy (a ``ThreadPoolExecutor``
    of a task's own, whose threads the interpreter joins at exit, daemon or not; a
    non-daemon thread). The abandoned jobs' code dies with the process, as documented for
    their handler threads, instead of keeping it until the blocked-stop guard ends it."""
    if not abandoned:
        return
    holding = _holding_exit()
    if not holding:
        return
    log.info(
        "not waiting for %d thread(s) still busy with the %d abandoned job(s) (%s); exiting",
        len(holding), abandoned, ", ".join(t.name for t in holding),
    )
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()  # flushes every handler
    finally:
        os._exit(code)


def _holding_exit() -> list[threading.Thread]:
    """The threads, other than the caller and the main thread, that the interpreter would
    wait for at exit: non-daemon threads, and the threads of ``concurrent.futures``
    executors (joined at exit, daemon or not)."""
    joined_at_exit = getattr(concurrent.futures.thread, "_threads_queues", {})
    main, me = threading.main_thread(), threading.current_thread()
    return sorted(
        (t for t in threading.enumerate()
         if t is not me and t is not main and t.is_alive() and (not t.daemon or t in joined_at_exit)),
        key=lambda t: t.name,
    )


def _exit_now() -> None:
    """A second Ctrl-C: end the process now (this runs in the signal handler)."""
    _exit(
        "alkstore: received SIGINT again; exiting now, without waiting for what is in flight "
        "- claims of jobs still running lapse and are retried\n",
        130,
    )


def _force_exit(signal_name: str, after: float) -> None:
    """End a process whose stop is blocked — or whose command is done but which the
    interpreter keeps at exit, waiting for threads it joins there (a non-daemon thread of
    the application's, the threads of an executor): then the line names them, since no
    call is blocked and nothing is in flight."""
    if not threading.main_thread().is_alive():  # the main thread finished: the interpreter is exiting
        holding = _holding_exit()
        _exit(
            f"alkstore: still running {after:g}s after {signal_name}: the command is done, but "
            f"the process cannot exit: Python waits for {len(holding)} thread(s) that do not end "
            f"({', '.join(repr(t.name) for t in holding)}: non-daemon threads, or threads of an "
            "executor, which Python joins at exit); exiting with code 1\n",
            1,
        )
    _exit(
        f"alkstore: still running {after:g}s after {signal_name}: blocked in a call a stop cannot "
        "interrupt (an unresponsive database server?); exiting with code 1 - claims of jobs "
        "still in flight lapse and are retried\n",
        1,
    )


def _exit(message: str, code: int) -> None:
    """Write ``message`` to stderr directly and end the process with ``os._exit``: no lock
    is taken (the main thread may hold a logging handler's, or be the signal handler's)."""
    try:
        os.write(2, message.encode())
    finally:
        os._exit(code)


def worker_options(
    *, concurrency: int | None, worker_id: str | None, batch_size: int | None, poll_interval: float, grace: float
) -> dict[str, Any]:
    """``Worker()``'s keyword options from a worker command's, each checked here under the
    option's own name (``Worker()`` would name its parameter: ``shutdown_grace`` for
    ``--grace``), before anything is opened. InvalidOptions naming the option."""
    v = _validate
    return {
        "concurrency": None if concurrency is None else v.int32(concurrency, "--concurrency", minimum=1),
        "worker_id": None if worker_id is None else v.worker_id(worker_id, "--worker-id"),
        "batch_size": None if batch_size is None else v.int32(batch_size, "--batch-size", minimum=1),
        "poll_interval": v.interval(poll_interval, "--poll-interval"),
        "shutdown_grace": v.duration(grace, "--grace"),
    }
