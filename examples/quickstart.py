"""Quickstart: enqueue in an ORM transaction, claim, ack, retry to dead, print the dead job.

Runs on a SQLite file by default (``ALKSTORE_DATABASE_URL`` overrides it).
"""

from __future__ import annotations

import os
import tempfile

from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import alkstore_sa as alk
from alkstore_sa.alembic_support import sync_engine


class Base(DeclarativeBase):
    pass


class Order(Base):
    # not "orders": the Flask and FastAPI examples' own table, in a database they may share
    __tablename__ = "quickstart_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]


def main() -> None:
    url = os.environ.get("ALKSTORE_DATABASE_URL") or "sqlite:///" + os.path.join(
        tempfile.mkdtemp(prefix="alkstore-demo-"), "demo.db"
    )
    # read as `alkstore` commands read $ALKSTORE_DATABASE_URL: postgres://, postgresql://,
    # +asyncpg all mean psycopg 3; sqlite+aiosqlite means sqlite3
    engine = sync_engine(url)
    store = alk.Store(engine)
    store.install()  # the packaged Alembic migrations; `alembic upgrade head` does the same
    Base.metadata.create_all(engine)
    print(f"database: {url}")

    # 1. The job commits with the order, or not at all.
    with Session(engine) as session, session.begin():
        order = Order(email="ada@example.com")
        session.add(order)
        session.flush()
        job_id = alk.enqueue(session, "emails", {"order": order.id, "to": order.email})
    print(f"enqueued job {job_id} in the order's transaction")

    try:
        with Session(engine) as session, session.begin():
            session.add(Order(email="nobody@example.com"))
            alk.enqueue(session, "emails", {"order": "never"})
            raise RuntimeError("the request failed")
    except RuntimeError:
        pass
    print(f"after a rolled-back request: {store.queue('emails').stats()}")

    # 2. A worker claims and acks.
    emails = store.queue("emails", max_attempts=2, backoff_base=0)
    handle = emails.claim_one(worker_id="demo-worker")
    assert handle is not None
    print(f"claimed job {handle.id}: {handle.payload} (attempt {handle.job.attempts})")
    handle.ack()
    print("acked: the row is gone ->", emails.get_job(handle.id))

    # 3. A job that keeps failing retries, then dead-letters at its attempt budget.
    failing = emails.enqueue({"order": 7, "to": "bounce@example.com"})
    for attempt in (1, 2):
        h = emails.claim_one("demo-worker")
        assert h is not None and h.id == failing
        h.retry(f"SMTP 550 on attempt {attempt}", delay=0)
    dead = emails.get_job(failing)
    assert dead is not None
    print(f"job {dead.id} is {dead.state}: last_error={dead.last_error!r}")
    for entry in dead.errors:
        print(f"  attempt {entry['attempt']}: {entry['error']} at {entry['at']:%H:%M:%S}")
    print(f"stats: {emails.stats()}")
    store.close()


if __name__ == "__main__":
    main()
