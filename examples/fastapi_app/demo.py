"""The FastAPI example in one command (``make example-fastapi``).

1. ``alembic upgrade head`` with the app's own Alembic env: the app's table and alkstore's;
2. two orders through the app: one paid, one declined after its job was enqueued;
3. the worker drains the "emails" queue: only the paid order's email exists.

SQLite by default; set ALKSTORE_DATABASE_URL to use PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from fastapi.testclient import TestClient
from fastapi_shop import EMAILS, Order, create_app, database_url

from alembic import command

HERE = Path(__file__).resolve().parent


def main() -> None:
    print(f"database: {database_url()}")
    command.upgrade(Config(str(HERE / "alembic.ini")), "head")
    print("alembic upgrade head: the app's tables and alkstore's are installed")

    app = create_app()
    with TestClient(app) as client:
        paid = client.post("/orders", json={"email": "ada@example.com", "item": "tea"})
        print(f"paid order     -> {paid.status_code} {paid.json()}")
        declined = client.post("/orders", json={"email": "bob@example.com", "item": "cake", "card": "declined"})
        print(f"declined order -> {declined.status_code} (its order and its job were rolled back together)")

        store = app.state.alkstore
        with store.engine.connect() as conn:
            print(f"orders in the database: {conn.scalar(sa.select(sa.func.count()).select_from(Order))}")
        print(f"emails pending before the worker: {store.queue(EMAILS).stats().pending}")
        # the worker is its own process, as in production: it finds the jobs through the database
        subprocess.run([sys.executable, str(HERE / "fastapi_worker.py"), "--drain"], check=True)
        print(f"emails pending after the worker: {store.queue(EMAILS).stats().pending}")


if __name__ == "__main__":
    main()
