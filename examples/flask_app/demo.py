"""The Flask example in one command (``make example-flask``).

1. ``alembic upgrade head`` with the app's own Alembic env: the app's table and alkstore's;
2. two orders through the app: one paid, one declined after its job was enqueued;
3. one worker drains both task queues ("emails" and "stock"): only the paid order's jobs exist.

SQLite by default; set ALKSTORE_DATABASE_URL to use PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.config import Config
from flask_shop import EMAILS, STOCK, Order, create_app, database_url, db

from alembic import command

HERE = Path(__file__).resolve().parent


def main() -> None:
    print(f"database: {database_url()}")
    command.upgrade(Config(str(HERE / "alembic.ini")), "head")
    print("alembic upgrade head: the app's tables and alkstore's are installed")

    app = create_app()
    client = app.test_client()
    paid = client.post("/orders", json={"email": "ada@example.com", "item": "tea"})
    print(f"paid order     -> {paid.status_code} {paid.get_json()}")
    declined = client.post("/orders", json={"email": "bob@example.com", "item": "cake", "card": "declined"})
    print(f"declined order -> {declined.status_code} (its order and its jobs were rolled back together)")

    store = app.extensions["alkstore"]
    with app.app_context():
        print(f"orders in the database: {db.session.query(Order).count()}")
    print(f"emails pending before the worker: {store.queue(EMAILS).stats().pending}")
    print(f"stock reservations pending before the worker: {store.queue(STOCK).stats().pending}")
    # the worker is its own process, as in production: it finds the jobs through the database
    subprocess.run([sys.executable, str(HERE / "flask_worker.py"), "--drain"], check=True)
    print(f"emails pending after the worker: {store.queue(EMAILS).stats().pending}")
    print(f"stock reservations pending after the worker: {store.queue(STOCK).stats().pending}")
    store.close()


if __name__ == "__main__":
    main()
