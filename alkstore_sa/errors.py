"""The error family of SPEC §3: every error this library raises derives from AlkstoreError."""

from __future__ import annotations

import shlex


class AlkstoreError(Exception):
    """Base class of every error raised by alkstore_sa."""

    default_message = "alkstore error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message)


class InvalidName(AlkstoreError, ValueError):
    """A queue/outbox/schedule/stream/lock/channel/consumer name is not acceptable."""

    default_message = "invalid name"


class InvalidOptions(AlkstoreError, ValueError):
    """An option is out of range, of the wrong type, NaN/infinite, or otherwise unusable."""

    default_message = "invalid options"


class InvalidSpec(AlkstoreError, ValueError):
    """A schedule spec is not ``@every <n><s|m|h|d>``, a 5-field cron expression or a cron
    alias, or its time zone is unknown."""

    default_message = "invalid schedule spec"

    def __init__(self, spec: object, message: str | None = None) -> None:
        self.spec = spec
        super().__init__(
            message or f"invalid schedule spec {spec!r}: expected '@every <n><s|m|h|d>', "
            "a 5-field cron expression or @hourly/@daily/@weekly/@monthly/@yearly"
        )


class PayloadError(AlkstoreError, ValueError):
    """A payload is not strict JSON, or its serialized form is larger than the store allows."""

    default_message = "payload is not strict JSON"


class StoreClosed(AlkstoreError):
    """The store (or the store behind a handle) was closed."""

    default_message = "the store is closed"


def install_advice(schema: str | None = None, dialect: str = "postgresql") -> str:
    """The commands that install or upgrade the store's tables, each way they can be
    installed; ``--schema`` is in them when the store's PostgreSQL schema is not the default
    (``alkstore migrate`` alone would install into the default one)."""
    from .schema import DEFAULT_SCHEMA

    opt = "" if schema in (None, DEFAULT_SCHEMA) or dialect == "sqlite" else f" --schema {shlex.quote(schema)}"
    return (
        f"run `alkstore migrate --url URL{opt}` (or Store.install()); when your app's own "
        f"Alembic chain installs alkstore, `alkstore alembic-revision{opt}` and then your "
        "`alembic upgrade head`"
    )


class NotInstalled(AlkstoreError):
    """The store's tables are missing from the database."""

    default_message = f"alkstore tables are not installed in this database: {install_advice()}"


class SchemaOutdated(NotInstalled):
    """The database holds an older alkstore schema than this library version needs."""

    default_message = f"the alkstore schema in this database is older than this library needs: {install_advice()}"


class SchemaTooNew(AlkstoreError):
    """The database holds an alkstore schema this library version cannot use: it was migrated
    by a newer alkstore_sa whose later steps older versions must not read (or the recorded
    revision is not one alkstore_sa knows). The cure is upgrading the library, not migrating."""

    default_message = (
        "the alkstore schema in this database was migrated by a newer alkstore_sa that this "
        "version cannot use: upgrade alkstore_sa"
    )


class HandleConsumed(AlkstoreError):
    """A second one-shot operation (ack, retry, fail) was attempted on the same JobHandle."""

    default_message = "this job handle was already consumed by ack, retry or fail"


class LeadershipLost(AlkstoreError):
    """run_schedules lost its leadership lease."""

    default_message = "scheduler leadership lease was lost"


class DatabaseError(AlkstoreError):
    """The database refused a statement; the driver's exception is ``__cause__`` and ``.orig``."""

    default_message = "database error"

    def __init__(self, message: str | None = None, orig: BaseException | None = None) -> None:
        self.orig = orig
        super().__init__(message)


class MissingExtra(AlkstoreError, ImportError):
    """An optional part of the library needs a package that is not installed; the message
    names the extra that installs it (``pip install 'alkstore-sa[EXTRA]'``)."""

    default_message = "an optional dependency is not installed"
