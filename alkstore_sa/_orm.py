"""The ORM's session classes, found without importing the ORM.

An object can only be a ``Session`` or a ``scoped_session`` if the application imported
``sqlalchemy.orm`` first, so these checks look the module up where it already is rather
than importing it. Importing it costs as much as the rest of alkstore_sa together: the
CLI, a worker and an application that never makes a Session do not pay for it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, scoped_session

_found: tuple[tuple[type, ...], tuple[type, ...]] | None = None


def _types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """``((Session,), (scoped_session,))``, each ``()`` while the ORM is not imported
    (``isinstance(x, ())`` is False)."""
    global _found
    if _found is not None:
        return _found
    orm = sys.modules.get("sqlalchemy.orm")
    session, scoped = getattr(orm, "Session", None), getattr(orm, "scoped_session", None)
    if session is None or scoped is None:
        return (), ()  # not imported (or still being imported by another thread)
    _found = ((session,), (scoped,))
    return _found


def is_session(obj: object) -> TypeGuard[Session]:
    return isinstance(obj, _types()[0])


def is_scoped_session(obj: object) -> TypeGuard[scoped_session[Any]]:
    return isinstance(obj, _types()[1])


def is_session_like(obj: object) -> TypeGuard[Session | scoped_session[Any]]:
    """Whether ``obj`` is a Session or a scoped_session."""
    session, scoped = _types()
    return isinstance(obj, session + scoped)
