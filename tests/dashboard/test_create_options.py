"""``create_app`` / ``create_wsgi_app`` check what they are given when the app is made: a
URL string where the store goes made an app that failed at its first request (every page a
500, the AttributeError only in the log), a ``str`` secret failed every request in
``hmac``, and an empty secret (an unset environment variable, encoded) was silently
replaced by a random one per process, so a form rendered by one process was refused by the
next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa.dashboard import create_app, create_wsgi_app


@pytest.fixture
def store(tmp_path: Path) -> Iterator[alk.Store]:
    with alk.Store(f"sqlite:///{tmp_path / 'dash.db'}") as s:
        yield s


@pytest.mark.parametrize("make", [create_app, create_wsgi_app])
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"store": "sqlite:///app.db"}, "store must be an alk.Store"),
        ({"store": None}, "store must be an alk.Store"),
        ({"read_only": "no"}, "read_only must be a bool"),
        ({"read_only": None}, "read_only must be a bool"),
        ({"csrf_secret": "not bytes"}, "csrf_secret must be"),
        ({"csrf_secret": b""}, "csrf_secret must be"),
    ],
    ids=["url", "none", "read-only-str", "read-only-none", "secret-str", "secret-empty"],
)
def test_bad_arguments_are_refused_when_the_app_is_made(store: alk.Store, make: Any, bad: dict[str, Any],
                                                         says: str) -> None:
    kwargs: dict[str, Any] = {"store": store, **bad}
    with pytest.raises(alk.InvalidOptions, match=says):
        make(kwargs.pop("store"), **kwargs)


@pytest.mark.parametrize("make", [create_app, create_wsgi_app])
def test_good_arguments_make_an_app(store: alk.Store, make: Any) -> None:
    assert make(store) is not None
    assert make(store, read_only=True, csrf_secret=b"shared by every process") is not None
