"""The store's own PostgreSQL connections say whose they are in ``pg_stat_activity``
(``application_name``): ``alkstore`` unless the URL or ``PGAPPNAME`` names one. An operator
looking at a busy server can then tell the queue's connections (workers, listener, the
CLI) from the application's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.conftest import require_pg
from tests.support import PG_URL


@pytest.fixture
def stores() -> Iterator[list[alk.Store]]:
    require_pg()
    made: list[alk.Store] = []
    yield made
    for s in made:
        s.close()


def _name(store: alk.Store) -> str:
    with store.engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT pg_catalog.current_setting('application_name')")).scalar())


def test_the_stores_own_connections_are_named_alkstore(stores: list[alk.Store], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    stores.append(alk.Store(PG_URL))
    assert _name(stores[0]) == "alkstore"


def test_a_name_in_the_url_or_the_environment_wins(stores: list[alk.Store], monkeypatch: pytest.MonkeyPatch) -> None:
    sep = "&" if "?" in PG_URL else "?"
    stores.append(alk.Store(f"{PG_URL}{sep}application_name=shop-worker"))
    assert _name(stores[-1]) == "shop-worker"
    monkeypatch.setenv("PGAPPNAME", "from-env")
    stores.append(alk.Store(PG_URL))
    assert _name(stores[-1]) == "from-env"


def test_the_applications_own_engine_is_left_as_it_is(stores: list[alk.Store]) -> None:
    engine = sa.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            before = conn.execute(sa.text("SELECT pg_catalog.current_setting('application_name')")).scalar()
        stores.append(alk.Store(engine))
        assert _name(stores[0]) == before != "alkstore"
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["url-options", "pgoptions"])
def test_a_name_given_as_a_server_option_wins(
    stores: list[alk.Store], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """``options=-c application_name=...`` in the URL, or in ``PGOPTIONS``, names the
    connections as it names any libpq client's. The server applies startup parameters after
    ``options``, so a fallback_application_name sent beside it replaced that name with
    'alkstore'."""
    monkeypatch.delenv("PGAPPNAME", raising=False)
    option = "-c application_name=from-options"
    if where == "pgoptions":
        monkeypatch.setenv("PGOPTIONS", option)
        stores.append(alk.Store(PG_URL))
    else:
        sep = "&" if "?" in PG_URL else "?"
        stores.append(alk.Store(f"{PG_URL}{sep}options={option.replace(' ', '%20').replace('=', '%3D')}"))
    assert _name(stores[-1]) == "from-options"
