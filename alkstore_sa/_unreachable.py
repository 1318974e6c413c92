"""Telling a database that cannot be reached (down, wrong host or port, refused login, no
such database or file) from a database that refused a statement: the operator tools
answer the first (and a database that refused the role: ``refusal_advice``) with one line
saying so (the CLI's exit 1, the dashboard's 503), and keep the traceback for the rest,
which may be bugs."""

from __future__ import annotations

import sys
from typing import Any

# psycopg's own connect failures, raised before or around libpq's: libpq's ("connection
# failed: …", "connection is bad: …"), a host name that does not resolve, hosts and ports
# that do not pair up in a multi-host URL
_PSYCOPG_CONNECT_PREFIXES = (
    "connection failed", "connection is bad", "failed to resolve host", "could not match ",
)


def driver_error(exc: BaseException) -> Any:
    """The driver's own exception behind an alkstore ``DatabaseError`` or a SQLAlchemy
    ``DBAPIError`` (``exc`` itself when there is none)."""
    return getattr(exc, "orig", None) or exc


def is_connect_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (an alkstore ``DatabaseError``, a SQLAlchemy ``DBAPIError`` or the
    driver's exception) is a failure to connect. libpq's carry no sqlstate, or one of class
    08 (connection) or 28 (authorization), or 3D000 (no such database); psycopg's own say
    so (above), or are its ``ConnectionTimeout`` (the URL's ``connect_timeout`` ran out: a
    server or network that does not answer); SQLite's says "unable to open database file"."""
    orig = driver_error(exc)
    text = str(orig)
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    return (
        text.startswith(_PSYCOPG_CONNECT_PREFIXES)
        or _is_connect_timeout(orig)
        or sqlstate[:2] in ("08", "28")
        or sqlstate == "3D000"
        or "unable to open database file" in text
    )


def _is_connect_timeout(orig: object) -> bool:
    """psycopg's ConnectionTimeout (psycopg is an optional extra: when it was never
    imported, nothing raised it)."""
    errors = sys.modules.get("psycopg.errors")
    timeout = getattr(errors, "ConnectionTimeout", None)
    return timeout is not None and isinstance(orig, timeout)


# The database refused the role something it may not do: a privilege it was not granted
# (insufficient_privilege), or a write in a read-only session (read_only_sql_transaction: a
# role's default_transaction_read_only, a standby). The role's configuration, not a bug.
PRIVILEGE_REFUSED = "42501"
READ_ONLY_REFUSED = "25006"
# what a role refused a privilege is told, wherever it is told (errors, the CLI, the dashboard)
RUNTIME_GRANTS = 'grant this role the runtime GRANTs of docs/install.md ("A runtime role")'


def refusal_advice(exc: BaseException) -> str | None:
    """For a database that refused the role (above), what to change, for the dashboard's
    page; None for any other error. SQLite's read-only file (SQLITE_READONLY) is the
    second kind."""
    orig = driver_error(exc)
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    if sqlstate == PRIVILEGE_REFUSED:
        return f"{RUNTIME_GRANTS}; a role that may only read serves a read-only dashboard (read_only=True, --read-only)"
    code = getattr(orig, "sqlite_errorcode", None)
    if sqlstate == READ_ONLY_REFUSED or (isinstance(code, int) and code & 0xFF == 8):  # SQLITE_READONLY
        return "this database is read-only to this process: serve a read-only dashboard (read_only=True, --read-only)"
    return None
