"""SQLite wake transport: one watcher thread per store.

It sleeps on inotify (the -wal file changes on every commit; without inotify it polls),
checks ``PRAGMA data_version`` (which moves only when another connection committed), then
reads what is new: notification rows past the last id it saw, fanned out per channel, and
jobs past the last job id, which wake their queue's consumers. Queue wakes therefore cost
an enqueue nothing: the watcher observes committed jobs directly.

Every commit to the file wakes it, a busy worker's own claims and acks included: it looks
at most once per ``MIN_GAP``, so a stream of commits costs a few hundred looks a second,
each covering every commit since the last, instead of one or two per commit (measured: in
a process draining 25k jobs/s in batches of 8, one look per commit halved the drain). A
commit after a quiet spell is looked at at once; one that lands within ``MIN_GAP`` of the
previous look is seen at most that much later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._conn import RawExecutor
from .._fanout import Deliver, FanOut, new_selector
from ..schema import jobs, notifications
from ._inotify import directory_watch
from .sqlite import QUEUE_WAKE_CHANNEL

log = logging.getLogger("alkstore_sa")

POLL_FALLBACK = 0.005  # seconds between data_version checks without inotify
SAFETY_POLL = 1.0  # even with inotify: events can be coalesced or missed
SETTLE_RETRIES = (0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032)
MIN_GAP = 0.002  # seconds between two looks prompted by file events (the module docstring)


class SqliteHub:
    def __init__(self, engine: Engine, backend: Any) -> None:
        self._engine = engine
        self.fanout = FanOut()
        self.queues = FanOut()
        self.streams = FanOut()
        self._stream_offsets: dict[str, int] = {}
        self._backend = backend
        self._sql = backend.sql
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = threading.Event()
        self._proxied = engine.raw_connection()
        self._proxied.detach()
        conn: Any = self._proxied.dbapi_connection
        conn.isolation_level = None  # autocommit reads: each sees the latest commit
        self._conn = conn
        path = engine.url.database or ""
        self._watch = directory_watch(os.path.abspath(path)) if path and path != ":memory:" else None
        self._version = -1
        self._last_note = self._scalar(self._max_note_sql()) or 0
        self._last_job = self._scalar(self._job_seq_sql()) or 0
        self._thread = threading.Thread(target=self._run, name="alkstore-sqlite-watcher", daemon=True)
        self._thread.start()

    # -- statements ----------------------------------------------------------------------

    def _max_note_sql(self) -> str:
        return self._sql("watch:max_note", lambda: sa.select(sa.func.max(notifications.c.id)))

    def _job_seq_sql(self) -> str:
        # sqlite_sequence holds the largest id AUTOINCREMENT ever handed out
        return self._sql(
            "watch:job_seq",
            lambda: sa.select(sa.column("seq")).select_from(sa.table("sqlite_sequence")).where(
                sa.column("name") == sa.literal_column("'alkstore_jobs'")
            ),
        )

    def _scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        row = self._conn.execute(sql, params or {}).fetchone()
        return None if row is None else row[0]

    # -- caller side ---------------------------------------------------------------------

    def subscribe(self, key: str, deliver: Deliver) -> int:
        """Listening from now: only rows committed after this call are delivered."""
        with self._lock:
            start = self._scalar(self._max_note_sql()) or 0

            def after_start(seq: int, payload: str) -> None:
                if seq > start:
                    deliver(seq, payload)

            token, _ = self.fanout.add(key, after_start)
        return token

    def unsubscribe(self, key: str, token: int) -> None:
        self.fanout.remove(key, token)

    def watch_queue(self, key: str, wake: Callable[[], None]) -> int:
        """Call ``wake()`` whenever a job committed into queue ``key``."""
        token, _ = self.queues.add(key, lambda _seq, _payload: wake())
        return token

    def unwatch_queue(self, key: str, token: int) -> None:
        self.queues.remove(key, token)

    def advertise(self, key: str) -> None:
        """Nothing to do: every committed enqueue wakes the watcher (it sees the WAL change
        and reads the new jobs itself), so waiting consumers need not announce themselves."""

    def watch_stream(self, key: str, wake: Callable[[], None]) -> int:
        """Call ``wake()`` whenever an event is committed to stream ``key``."""
        token, _ = self.streams.add(key, lambda _seq, _payload: wake())
        return token

    def unwatch_stream(self, key: str, token: int) -> None:
        self.streams.remove(key, token)

    def close(self) -> None:
        """Stop watching; queue and stream watchers get one last wake so that waiting loops
        notice the closed store now rather than at their next re-poll."""
        if self._closed.is_set():
            return
        self._closed.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        if self._watch is not None:
            self._watch.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        with contextlib.suppress(Exception):
            self._conn.close()
        self.queues.dispatch_all()
        self.streams.dispatch_all()

    # -- watcher thread ------------------------------------------------------------------

    def _run(self) -> None:
        with new_selector() as sel:  # not select(): it fails for descriptors >= 1024
            sel.register(self._wake_r, selectors.EVENT_READ)
            if self._watch is not None:
                sel.register(self._watch.fd, selectors.EVENT_READ)
            self._watch_loop(sel)

    def _watch_loop(self, sel: selectors.BaseSelector) -> None:
        idle = SAFETY_POLL if self._watch else POLL_FALLBACK
        retries: list[float] = []
        looked = float("-inf")  # time.monotonic() of the last look
        while not self._closed.is_set():
            try:
                timeout = retries.pop(0) if retries else idle
                readable = {key.fd for key, _ in sel.select(timeout)}
                if self._closed.is_set():
                    return
                event = self._watch is not None and self._watch.fd in readable
                if event and not self._watch.relevant():  # type: ignore[union-attr]
                    continue
                if event and (gap := looked + MIN_GAP - time.monotonic()) > 0:
                    # commits in quick succession: one look, MIN_GAP after the last, covers
                    # them all (the events meanwhile are drained: this look sees their commits)
                    if self._closed.wait(gap):
                        return
                    self._watch.relevant()  # type: ignore[union-attr]
                looked = time.monotonic()
                with self._lock:
                    changed = self._check()
                if event and not changed:
                    # The -wal write that woke us precedes the commit's publication (the
                    # wal-index update, in shared memory, raises no file event): look again
                    # a few times, briefly, so that commit is not left to the safety poll.
                    retries = list(SETTLE_RETRIES)
                elif changed:
                    retries = []
            except Exception:  # noqa: BLE001 - keep watching; consumers re-poll anyway
                log.exception("alkstore SQLite watcher error")
                self._closed.wait(0.1)

    def _check(self) -> bool:
        """Read what changed since the last look; False when nothing was committed."""
        version = self._scalar("PRAGMA data_version")
        if version == self._version:
            return False
        self._version = version
        self._read_notifications()
        self._read_jobs()
        self._read_streams()
        return True

    def _read_notifications(self) -> None:
        sql = self._sql(
            "watch:notes",
            lambda: sa.select(notifications.c.id, notifications.c.channel, notifications.c.payload)
            .where(notifications.c.id > sa.bindparam("after", type_=sa.Integer))
            .order_by(notifications.c.id),
        )
        rows = self._conn.execute(sql, {"after": self._last_note}).fetchall()
        for note_id, channel, payload in rows:
            if channel == QUEUE_WAKE_CHANNEL:  # a queue wake without a new job (sqlite.py)
                self.queues.dispatch(payload, 0, "")
            self.fanout.dispatch(channel, note_id, payload)
        if rows:
            self._last_note = rows[-1][0]

    def _read_streams(self) -> None:
        if not self.streams.channel_keys():
            return
        offsets = self._backend.stream_offsets(RawExecutor(self._conn, self._backend), {})
        for name, last in offsets.items():
            if last != self._stream_offsets.get(name):
                self._stream_offsets[name] = last
                self.streams.dispatch(name, last, "")

    def _read_jobs(self) -> None:
        seq = self._scalar(self._job_seq_sql()) or 0
        if seq <= self._last_job:
            return
        sql = self._sql(
            "watch:jobs",
            lambda: sa.select(jobs.c.queue)
            .where(jobs.c.id > sa.bindparam("after", type_=sa.Integer))
            .distinct(),
        )
        for (queue,) in self._conn.execute(sql, {"after": self._last_job}).fetchall():
            self.queues.dispatch(queue, 0, "")
        self._last_job = seq

