"""Internal: database URLs as the store and the CLI accept them (SPEC §4). Not public API.

``postgresql://``, ``postgres://`` and ``postgresql+psycopg://`` all mean psycopg 3: the
forms found in ``DATABASE_URL`` variables work as they are. A URL naming another PostgreSQL
driver (``+psycopg2``, ``+asyncpg``, …) also gets psycopg 3, because the store's own
connections speak psycopg 3's API whatever driver the application uses for its own engine
(as a Store built from an async engine does, SPEC §13); the rest of the URL — user, host,
database, libpq options — means the same to psycopg 3. Driver options in the URL's query
arrive as strings; the ones psycopg takes as Python values are converted here, and anything
psycopg would reject is refused up front as ``InvalidOptions``, before any connection.

A SQLite URL's query may hold only what SQLAlchemy's pysqlite dialect reads (and aiosqlite,
its subclass): anything else it drops without a word. A ``?`` in a file's path starts that
query, so ``sqlite:///what?dir/app.db`` silently meant the file ``what``: refused too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from .errors import InvalidOptions

PSYCOPG = "postgresql+psycopg"
EXAMPLE = "expected e.g. postgresql://user:password@host:5432/dbname or sqlite:///path/to/file.db"
INSTALL_HINT = {
    "psycopg": "psycopg 3 is not installed: pip install 'alkstore-sa[postgres]' (or 'psycopg[binary]')",
}

# libpq options whose values must be integers: psycopg would pass a bad value on and fail
# only at connect time, with a message that does not name the URL.
INT_OPTIONS = frozenset({
    "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout",
})
# SQLAlchemy itself splits these (multi-host URLs), so they are not checked against libpq.
SQLALCHEMY_HANDLED = frozenset({"host", "port"})
# The sqlite3.connect() keywords SQLAlchemy's pysqlite dialect reads from the query
# (SQLiteDialect_pysqlite.create_connect_args); it ignores every other name, except that
# with uri=true it appends them to the file: URI for SQLite itself.
SQLITE_DRIVER_OPTIONS = ("uri", "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements")
# The query parameters SQLite defines for a file: URI (sqlite.org/uri.html; modeof: the unix VFS).
SQLITE_URI_OPTIONS = ("mode", "cache", "vfs", "psow", "nolock", "immutable", "modeof")


APPLICATION_NAME = "alkstore"


def engine_from_url(url: str | URL, **kw: Any) -> Engine:
    """A SQLAlchemy Engine for ``url`` as alkstore reads it: every PostgreSQL URL through
    psycopg 3 with typed driver options, its connections named ``alkstore`` in
    ``pg_stat_activity`` unless the URL, its server options or ``PGAPPNAME`` name them;
    ``kw`` goes to ``sa.create_engine`` (its ``connect_args`` win over the URL's options)."""
    parsed = parse_url(url)
    connect_args: dict[str, Any] = {}
    given = kw.pop("connect_args", None) or {}
    if parsed.get_backend_name() == "postgresql":
        parsed, connect_args = _psycopg_options(parsed)
        options = (parsed.query.get("options"), given.get("options"), os.environ.get("PGOPTIONS"))
        if "fallback_application_name" not in parsed.query and not any(map(_names_application, options)):
            # how pg_stat_activity names the store's connections, unless the URL's
            # application_name or PGAPPNAME says otherwise (libpq's fallback is used only
            # then). Not beside a name given as a server option (options=-c
            # application_name=..., PGOPTIONS): the server applies a startup parameter
            # after those, so the fallback would replace that name
            connect_args["fallback_application_name"] = APPLICATION_NAME
    connect_args.update(given)
    if connect_args:
        kw["connect_args"] = connect_args
    try:
        return sa.create_engine(parsed, **kw)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        driver = parsed.get_driver_name()
        hint = INSTALL_HINT.get(driver, f"the {driver!r} driver of {parsed.drivername!r} is not installed")
        raise InvalidOptions(f"{hint} ({type(exc).__name__}: {exc})") from exc
    except (sa.exc.ArgumentError, TypeError, ValueError) as exc:
        raise InvalidOptions(f"cannot use the database URL {shown_url(parsed)}: {_one_line(exc)}") from exc


def _names_application(options: object) -> bool:
    """Whether libpq ``options`` (``-c application_name=x``, ``--application-name=x``) set
    the session's application_name."""
    return isinstance(options, str) and re.search(r"application[_-]name\s*=", options, re.IGNORECASE) is not None


def parse_url(url: str | URL) -> URL:
    """``url`` parsed, with its PostgreSQL driver set to psycopg 3 (and aiosqlite's to
    pysqlite: the store's own connections are synchronous); InvalidOptions when it is not a
    URL of a database alkstore supports."""
    if isinstance(url, str):
        text = url.strip()
        if not text:
            raise InvalidOptions(f"the database URL is empty: {EXAMPLE}")
        try:
            parsed = make_url(text)
        except (sa.exc.ArgumentError, ValueError):
            # the text is not echoed: it may hold a password we cannot find to mask
            raise InvalidOptions(f"not a database URL: {EXAMPLE}") from None
    elif isinstance(url, URL):
        parsed = url
    else:
        raise InvalidOptions(f"a database URL must be a str or a sqlalchemy URL, not {type(url).__name__}")
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername=PSYCOPG)
    if backend == "sqlite":
        _check_sqlite_options(parsed, url)
        return parsed.set(drivername="sqlite") if parsed.get_driver_name() == "aiosqlite" else parsed
    raise InvalidOptions(f"alkstore_sa supports PostgreSQL (psycopg 3) and SQLite, not {backend!r} ({shown_url(parsed)})")


def sqlite_path(url: URL) -> Path | None:
    """The file a SQLite URL names (relative to the current directory, as sqlite3 opens it),
    or None for an in-memory database or a non-SQLite URL."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if _uri_mode(url) and database.startswith("file:"):
        database, _, options = database.removeprefix("file:").partition("?")
        if "mode=memory" in options or url.query.get("mode") == "memory":
            return None
        if database.startswith("//"):  # file://localhost/abs or file:///abs (an empty authority)
            database = "/" + database[2:].partition("/")[2]
        database = unquote(database)  # SQLite decodes %HH in a URI's path (%3F: a '?')
    if database in ("", ":memory:"):
        return None
    return Path(database)


def in_memory_sqlite(url: URL) -> bool:
    """Whether ``url`` names an in-memory SQLite database (``sqlite://``, ``:memory:``, a
    ``file:`` URI with ``mode=memory``): private to the connection that opens it, so no other
    engine, connection or process can reach it."""
    return url.get_backend_name() == "sqlite" and sqlite_path(url) is None


def shared_cache_sqlite(url: URL) -> bool:
    """Whether ``url`` opens its SQLite database in shared-cache mode (``cache=shared`` in a
    ``file:`` URI, or in the query SQLAlchemy adds to it)."""
    if url.get_backend_name() != "sqlite" or not _uri_mode(url):
        return False
    options = (url.database or "").partition("?")[2]
    return "cache=shared" in options.split("&") or url.query.get("cache") == "shared"


def _uri_mode(url: URL) -> bool:
    """Whether pysqlite opens the database as a URI (``uri=true``, as SQLAlchemy reads it)."""
    value = url.query.get("uri")
    try:
        return isinstance(value, str) and bool(sa.util.asbool(value))
    except ValueError:
        return False


def _check_sqlite_options(url: URL, given: str | URL) -> None:
    """InvalidOptions for a query name SQLite and pysqlite do not read (what SQLAlchemy
    would drop), a URI parameter where no URI is opened, or a repeated option."""
    if isinstance(given, str):
        # SQLAlchemy's own parse drops a query item without '=' (``what?dir/app.db``)
        names = [key for key, _ in parse_qsl(given.strip().partition("?")[2], keep_blank_values=True)]
    else:
        names = list(url.query)
    uri = _uri_mode(url)
    # as given: a SQLite URL holds no password, and the rendered one lacks a '='-less item
    shown = given.strip() if isinstance(given, str) and url.password is None else shown_url(url)
    for name in names:
        if name in SQLITE_DRIVER_OPTIONS:
            continue
        if name in SQLITE_URI_OPTIONS:
            if not uri:
                raise InvalidOptions(
                    f"the URL option {name!r} is a SQLite URI parameter: it applies only to a file: "
                    f"URI with uri=true, e.g. sqlite:///file:app.db?{name}=...&uri=true, and is "
                    f"ignored here ({shown})"
                )
            if not (url.database or "").startswith("file:"):
                raise InvalidOptions(
                    f"the URL option {name!r} needs the database written as a file: URI "
                    f"(sqlite:///file:app.db?{name}=...&uri=true): with a plain path it would "
                    f"become part of the file's name ({shown})"
                )
            continue
        raise InvalidOptions(
            f"the URL option {name!r} is not a SQLite option (the URL may hold "
            f"{', '.join(SQLITE_DRIVER_OPTIONS)}; with uri=true also {', '.join(SQLITE_URI_OPTIONS)}). "
            f"A '?' in the file's path starts the URL's options: write the path as a file: URI "
            f"with the '?' percent-encoded as %3F, e.g. sqlite:///file:what%3Fdir/app.db?uri=true "
            f"({shown})"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidOptions(f"the URL option {repeated[0]!r} is given more than once ({shown})")


def _psycopg_options(url: URL) -> tuple[URL, dict[str, Any]]:
    """Split the query into libpq options (checked, kept in the URL) and the keywords
    psycopg takes as Python values (converted, returned as connect args)."""
    connect_args: dict[str, Any] = {}
    for key, value in url.query.items():
        if key in SQLALCHEMY_HANDLED:
            continue
        if not isinstance(value, str):
            raise InvalidOptions(f"the URL option {key!r} is given more than once ({shown_url(url)})")
        if key == "autocommit":
            # a string here would be truthy ("false" included), and SQLAlchemy and alkstore
            # manage transactions themselves: a driver in autocommit would break both
            raise InvalidOptions(
                f"the URL option 'autocommit' is not allowed: SQLAlchemy and alkstore manage "
                f"transactions themselves ({shown_url(url)})"
            )
        if key == "prepare_threshold":
            connect_args[key] = _prepare_threshold(value, url)
        elif key in INT_OPTIONS and not _is_int(value):
            raise InvalidOptions(f"the URL option {key}={value!r} must be an integer ({shown_url(url)})")
    libpq = {k: v for k, v in url.query.items() if k not in SQLALCHEMY_HANDLED and k not in connect_args}
    _check_libpq_names(libpq, url)
    return url.difference_update_query(connect_args), connect_args


def _prepare_threshold(value: str, url: URL) -> int | None:
    """psycopg's ``prepare_threshold``: an int >= 0 (0 prepares every statement), or
    ``none`` (never prepare — what a transaction-mode pooler such as PgBouncer needs)."""
    if value.lower() == "none":
        return None
    if _is_int(value) and int(value) >= 0:
        return int(value)
    raise InvalidOptions(
        f"the URL option prepare_threshold={value!r} must be an integer >= 0, or none to never "
        f"prepare statements ({shown_url(url)})"
    )


def _check_libpq_names(options: dict[str, Any], url: URL) -> None:
    """Refuse option names libpq does not know (psycopg would refuse them at connect)."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import make_conninfo
    except ImportError:
        return  # create_engine reports the missing driver, with the install hint
    for name, value in options.items():
        try:
            make_conninfo("", **{name: value})
        except ProgrammingError:
            raise InvalidOptions(
                f"the URL option {name!r} is not a libpq connection option or a psycopg "
                f"setting ({shown_url(url)})"
            ) from None


def _is_int(value: str) -> bool:
    text = value.strip()
    return text.lstrip("-").isdigit() and text.isascii()


# libpq options that carry a secret: the password itself, and the SSL client key's
SECRET_OPTIONS = frozenset({"password", "sslpassword"})
_HIDDEN = "alkstorehiddensecret"  # a placeholder the rendering leaves as it is, then replaced


def shown_url(url: URL) -> str:
    """The URL for a message or a repr, its secrets hidden as ``***``: the password of its
    user part, and the options that libpq also takes in the query (``?password=``,
    ``?sslpassword=``)."""
    secret = {key: _HIDDEN for key in url.query if key.lower() in SECRET_OPTIONS}
    if secret:
        url = url.update_query_dict(secret)
    return url.render_as_string(hide_password=True).replace(_HIDDEN, "***")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
