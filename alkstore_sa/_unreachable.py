"""Telling a database that cannot be reached (down, wrong host or port, refused login, no
such database or file) from a database that refused a statement: the operator tools
answer the first with one line saying so (the CLI's exit 1, the dashboard's 503), and keep
the traceback for the rest, which may be bugs."""

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
