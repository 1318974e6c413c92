"""How a failed command ends: ONE line on stderr saying what went wrong and what to do, and
the documented exit code (see EXIT_CODES). ``--traceback`` adds the traceback above it."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import traceback
from typing import Any

import sqlalchemy as sa

from .._unreachable import PRIVILEGE_REFUSED, RUNTIME_GRANTS, driver_error, is_connect_failure
from .._urls import shown_url
from ..errors import AlkstoreError, DatabaseError, NotInstalled
from ._shown import shown

EXIT_CODES = """\
exit codes:
  0  success
  1  the command ran and failed: the database is unreachable or refused an operation
     (e.g. permission denied), a job asked for was not found (`dead show`, `dead requeue`:
     said on stdout, with the other results) or not requeued (its unique key is held),
     or an unexpected error
  2  the command cannot run as given: a usage error, an unusable --url, a handler that
     cannot be imported, a SQLite file that does not exist (only `migrate` creates one, not
     its directory), or tables that are not installed or are outdated (run `alkstore migrate`)
  141  stdout was closed by its reader (`| head`): no message, as other Unix tools end
       (not a worker, run-schedules or dashboard: they keep their own exit code)

An error is one line on stderr; add --traceback to see where it happened."""

TRACEBACK_HINT = "rerun with --traceback to see where it happened"
# what a shell reports for a process that SIGPIPE killed (128 + 13), which is how other
# Unix tools end when their reader goes away; Python ignores SIGPIPE and raises instead
EXIT_STDOUT_CLOSED = 141


class UsageError(AlkstoreError):
    """The command cannot run as given (exit code 2); the message says what to change."""

    default_message = "usage error"


def one_line(text: object) -> str:
    """Any message as a single line (driver messages carry newlines and tabs)."""
    return " ".join(str(text).split())


def report(exc: BaseException, args: argparse.Namespace | None, *, show_traceback: bool) -> int:
    """Print the one-line summary of ``exc`` (after its traceback when asked); return the exit code."""
    code, message = explain(exc, args)
    if show_traceback:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"alkstore: {message}", file=sys.stderr, flush=True)
    return code


def stdout_closed() -> int:
    """End quietly after stdout's reader went away (``| head``): nothing to report, and no
    one to report it to on stdout. Returns the exit code."""
    _stdout_to_devnull()
    return EXIT_STDOUT_CLOSED


def _stdout_to_devnull() -> None:
    """Point stdout at devnull, so later writes and the interpreter's final flush of what is
    still buffered do not fail again (Python's signal docs, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # no file descriptor (replaced in-process, None)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    if devnull != fd:
        os.close(devnull)


def notice(line: str) -> None:
    """Print a line that tells the operator how a long-running command is doing (a worker's
    metrics address and its final count, the dashboard's address) — not the command's
    output: when stdout's reader is gone (``| head -1``, a supervisor's log pipe closed),
    the line is dropped and the command goes on to its own exit code, instead of ending
    with 141 as a command whose output went unread does."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        _stdout_to_devnull()


def explain(exc: BaseException, args: argparse.Namespace | None) -> tuple[int, str]:
    """(exit code, message) for an exception that ended a command; the message is shown
    escaped, as it may quote a handler's exception or a driver's text with a stored value."""
    code, message = _explain(exc, args)
    return code, shown(message)


def _explain(exc: BaseException, args: argparse.Namespace | None) -> tuple[int, str]:
    from alembic.util import CommandError

    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(exc, (UsageError, NotInstalled)):
        return 2, one_line(exc)
    if isinstance(exc, AlkstoreError) and isinstance(exc, ValueError):  # InvalidOptions, InvalidName, …
        return 2, f"{type(exc).__name__}: {one_line(exc)}"
    if isinstance(exc, CommandError):
        return 2, one_line(exc)
    if isinstance(exc, (DatabaseError, sa.exc.DBAPIError)):
        return 1, _database_message(exc, args)
    if isinstance(exc, AlkstoreError):
        return 1, f"{type(exc).__name__}: {one_line(exc)}"
    if isinstance(exc, OSError):
        return 1, one_line(exc)
    return 1, f"unexpected error: {type(exc).__name__}: {one_line(exc)} ({TRACEBACK_HINT})"


def _database_message(exc: BaseException, args: argparse.Namespace | None) -> str:
    """The driver's own message (not SQLAlchemy's wrapper with the SQL), plus what to do."""
    orig: Any = driver_error(exc)
    text = one_line(orig)
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    if is_connect_failure(orig):
        where = _url_shown(args)
        where = f" {where}" if where else ""
        check = "--url" if args is not None else "the database URL"  # None: not our CLI's (flask.py)
        if isinstance(orig, sqlite3.Error):  # no server: the file itself could not be opened
            return (
                f"cannot open the SQLite database{where}: {text} (check {check}: it must name a "
                "database file, not a directory, that this process may open)"
            )
        return f"cannot connect to the database{where}: {text} (check {check} and that the server is running)"
    if sqlstate == PRIVILEGE_REFUSED:
        if getattr(args, "command", None) == "migrate":
            advice = "run this as a role with that privilege, e.g. the owner of the database or schema"
        else:  # the application's role needs grants, not the owner's rights
            advice = RUNTIME_GRANTS
        return f"the database refused: {text} ({advice})"
    if isinstance(exc, DatabaseError) and orig is not exc and not str(exc).startswith(f"{type(orig).__name__}:"):
        # alkstore said what it was doing and what to do (the migrations do): keep that
        return f"database error: {one_line(exc)}"
    return f"database error: {type(orig).__name__}: {text}"


def _url_shown(args: argparse.Namespace | None) -> str:
    url = getattr(args, "url", None)
    if not url:
        return ""
    try:
        return shown_url(sa.engine.make_url(str(url).strip()))
    except Exception:  # noqa: BLE001 - the URL was used already; showing it is best effort
        return ""
