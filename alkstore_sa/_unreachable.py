"""Telling a database that cannot be reached (down, wrong host or port, refused login, no
such database or file) from a database that refused a statement: the operator tools
answer the first with one line saying so (the CLI's exit 1, the dashboard's 503), and keep
the traceback for the rest, which may be bugs."""

from __future__ import annotations

from typing import Any


def driver_error(exc: BaseException) -> Any:
    """The driver's own exception behind an alkstore ``DatabaseError`` or a SQLAlchemy
    ``DBAPIError`` (``exc`` itself when there is none)."""
    return getattr(exc, "orig", None) or exc


def is_connect_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (an alkstore ``DatabaseError``, a SQLAlchemy ``DBAPIError`` or the
    driver's exception) is a failure to connect. libpq's carry no sqlstate, or one of class
    08 (connection) or 28 (authorization), or 3D000 (no such database); SQLite's says
    "unable to open database file"."""
    orig = driver_error(exc)
    text = str(orig)
    sqlstate = str(getattr(orig, "sqlstate", None) or "")
    return (
        text.startswith("connection failed")
        or sqlstate[:2] in ("08", "28")
        or sqlstate == "3D000"
        or "unable to open database file" in text
    )
