"""SQLite wake transport: one watcher thread per store.

It sleeps on inotify (the -wal file changes on every commit; without inotify it polls),
checks ``PRAGMA data_version`` (which moves only when another connection committed), then
reads what is new: notification rows past the last id it saw, fanned out per channel, and
jobs past the last job id, which wake their queue's consumers. Queue wakes therefore cost
an enqueue nothing: the watcher observes committed jobs directly.

Every commit to the file would wake it, a busy worker's own claims and acks included
(measured: in a process draining 25k jobs/s in batches of 8, one look per commit halved
the drain). So it watches only while someone needs it:

- **Presence**, as on PostgreSQL (``advertise``): a queue's consumers say when they found
  it empty and now wait for a wake; the next wake of the queue withdraws that, and they
  say it again when they next find it empty. A worker busy on full claims asks for
  nothing. The watcher watches the file only while some queue has presence, or some
  channel or stream has a subscriber; otherwise it stops listening to the file altogether
  (no wake-ups at all). Presence given — and a new subscription — makes it look at once,
  so a job committed while nobody was watching still wakes the queue (the look compares
  the newest job id with the last one it saw, whenever that was).
- **Reading place**: while it has subscriptions, it records how far it has read
  (as a stream consumer's offset, at most once a second or every ``SAVE_ROWS`` rows, and at least
  every ``HEARTBEAT`` seconds), and notify's prune keeps every row past it: a process that
  fell behind (stopped, or busy) reads all it missed once it runs again. A process gone
  for ``NOTIFY_READER_TTL`` seconds holds nothing back; if it comes back, it logs how many
  notifications were pruned before it could read them.
- **Gathering**: while it watches, it looks at most once per ``MIN_GAP`` during a stream
  of commits, each look covering every commit since the last. A commit after a quiet
  spell is looked at at once; one within ``MIN_GAP`` of the previous look is seen at most
  that much later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._conn import RawExecutor
from .._fanout import Deliver, FanOut, new_selector
from .._sqlite import (
    BUSY_TIMEOUT_MS,
    _main_file,
    is_busy,
    leave_pep249_mode,
    refuse_exclusive_locking,
)
from ..schema import jobs, notifications
from ._inotify import directory_watch
from .sql import NOTIFY_READERS
from .sqlite import NOTIFY_KEEP, NOTIFY_READER_TTL, QUEUE_WAKE_CHANNEL

log = logging.getLogger("alkstore_sa")

POLL_FALLBACK = 0.005  # seconds between data_version checks without inotify
SAFETY_POLL = 1.0  # even with inotify: events can be coalesced or missed
SETTLE_RETRIES = (0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032)
MIN_GAP = 0.002  # seconds between two looks prompted by file events (the module docstring)
# The reading place (the module docstring): saved once it moved this many rows, or after
# SAVE_EVERY seconds if it moved at all, and every HEARTBEAT seconds regardless.
SAVE_ROWS = NOTIFY_KEEP // 2
SAVE_EVERY = 1.0
HEARTBEAT = NOTIFY_READER_TTL / 6
# Saving or dropping the reading place waits this long for SQLite's write lock: a save not
# made is tried again at the next look, a place not dropped expires (the watcher thread, and
# a listen() or close() holding it, must not sit out a long write transaction elsewhere).
HEARTBEAT_BUSY_MS = 100

class SqliteHub:
    def __init__(self, engine: Engine, backend: Any, clock: Callable[[], float | None] | None = None) -> None:
        self._engine = engine
        self._clock = clock or time.time
        self._reader = uuid.uuid4().hex  # this watcher's name as a notifications reader
        self._place: tuple[int, float] | None = None  # (saved reading place, monotonic time saved)
        self._since = 0  # the oldest live subscription's start: rows after it are owed
        self.fanout = FanOut()
        self.queues = FanOut()
        self.streams = FanOut()
        self._stream_offsets: dict[str, Any] = {}  # each watched counter as stored (an int, unless written by hand)
        self._backend = backend
        self._sql = backend.sql
        self._lock = threading.Lock()
        # queue keys whose consumers wait for a wake (advertise): withdrawn by its next wake
        self._present: set[str] = set()
        self._wake_r, self._wake_w = os.pipe()  # close(), and "look now" (presence, a new subscriber)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = threading.Event()
        self._proxied = engine.raw_connection()
        self._proxied.detach()
        conn: Any = self._proxied.dbapi_connection
        try:
            refuse_exclusive_locking(conn)  # it would keep the file locked from its first look
        except BaseException:
            self._proxied.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        conn.isolation_level = None  # autocommit reads: each sees the latest commit
        leave_pep249_mode(conn)  # (Python 3.12's autocommit=False ignores isolation_level)
        self._conn = conn
        # The file as SQLite opened it, not the URL's text: a symlink resolved (the -wal sits
        # beside the target), a ``file:`` URI decoded, always absolute; '' when in memory.
        path = _main_file(conn)
        self._watch = directory_watch(path) if path else None
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

    def subscribe(self, key: str, deliver: Deliver, on_close: Callable[[], None] | None = None) -> int:
        """Listening from now: only rows committed after this call are delivered.
        ``on_close`` runs once when the hub closes (the store closed)."""
        with self._lock:
            first = self._place is None  # no subscription yet (the last one dropped the place)
            if first:
                # the reading place is saved before the start is read: from then on the prune
                # keeps every row the new subscription is owed (a later subscription's rows
                # come after it, and the place saved already keeps them)
                try:
                    with self._briefly_waiting():
                        self._save_place()
                except Exception as exc:  # noqa: BLE001 - e.g. a read-only database file
                    if is_busy(exc):  # another connection writes: the next look saves it
                        log.debug("alkstore SQLite watcher: reading place not saved yet (%s)", exc)
                    else:
                        log.warning(
                            "alkstore SQLite watcher: cannot save its reading place (%s); a subscription "
                            "that falls more than %d notifications behind may miss some", exc, NOTIFY_KEEP,
                        )
                    self._place = (-1, float("-inf"))  # not saved: tried again at the next look
            start = self._scalar(self._max_note_sql()) or 0
            if first:
                self._since = start

            def after_start(seq: int, payload: str) -> None:
                if seq > start:
                    deliver(seq, payload)

            token, _ = self.fanout.add(key, after_start, on_close)
        self._poke()  # the watcher may have stopped watching the file: it starts again
        return token

    def unsubscribe(self, key: str, token: int) -> None:
        self.fanout.remove(key, token)
        with self._lock:
            if not self.fanout.has_any() and not self._closed.is_set():
                self._drop_place()

    # -- the reading place -----------------------------------------------------------------

    def _save_place(self) -> None:
        """Record that this process has read every notification up to ``_last_note``."""
        params = {"stream": NOTIFY_READERS, "consumer": self._reader, "offset": self._last_note, "now": self._clock()}
        self._backend.stream_commit(RawExecutor(self._conn, self._backend), params)
        self._place = (self._last_note, time.monotonic())

    def _drop_place(self) -> None:
        """No subscriptions left: this process holds no rows back (best effort; a row left
        behind expires after NOTIFY_READER_TTL)."""
        if self._place is None:
            return
        self._place = None
        try:
            with self._briefly_waiting():
                self._backend.notify_reader_drop(RawExecutor(self._conn, self._backend), {"consumer": self._reader})
        except Exception:  # noqa: BLE001 - the row expires on its own
            log.debug("alkstore SQLite watcher: could not drop its reading place", exc_info=True)

    def _keep_place(self) -> None:
        """Save the reading place when it is due (the module docstring); a busy write lock
        only postpones it to the next look."""
        if self._place is None or not self.fanout.has_any():
            return
        saved, at = self._place
        age = time.monotonic() - at
        moved = self._last_note - saved
        if not ((moved > 0 and (moved >= SAVE_ROWS or age >= SAVE_EVERY)) or age >= HEARTBEAT):
            return
        try:
            with self._briefly_waiting():
                self._save_place()
        except Exception:  # noqa: BLE001 - tried again at the next look, well within the TTL
            log.debug("alkstore SQLite watcher: reading place not saved this time", exc_info=True)

    @contextlib.contextmanager
    def _briefly_waiting(self) -> Iterator[None]:
        """The watcher's connection waits at most ``HEARTBEAT_BUSY_MS`` for the write lock."""
        self._conn.execute(f"PRAGMA busy_timeout = {HEARTBEAT_BUSY_MS}")
        try:
            yield
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    def watch_queue(self, key: str, wake: Callable[[], None]) -> int:
        """Call ``wake()`` whenever a job committed into queue ``key`` while the queue has
        presence: a consumer gives it with ``advertise`` when it finds the queue empty (a
        consumer that starts on a backlog needs no wake until then)."""
        token, _ = self.queues.add(key, lambda _seq, _payload: wake())
        return token

    def unwatch_queue(self, key: str, token: int) -> None:
        self.queues.remove(key, token)

    def advertise(self, key: str) -> None:
        """Say that a consumer of the queue ``key`` found it empty and now waits for a wake
        (the module docstring): the watcher watches the file again if it had stopped, and
        looks at once for jobs committed meanwhile."""
        if key in self._present:
            return
        self._present.add(key)
        self._poke()

    def _poke(self) -> None:
        """Make the watcher thread look again (and reconsider whether to watch the file)."""
        with contextlib.suppress(BlockingIOError, OSError):  # full: a poke is pending anyway; closed: gone
            os.write(self._wake_w, b"x")

    def _needed(self) -> bool:
        """Whether anyone waits for what the file's commits may bring."""
        return bool(self._present) or self.fanout.has_any() or self.streams.has_any()

    def watch_stream(self, key: str, wake: Callable[[], None]) -> int:
        """Call ``wake()`` whenever an event is committed to stream ``key``."""
        token, _ = self.streams.add(key, lambda _seq, _payload: wake())
        self._poke()
        return token

    def unwatch_stream(self, key: str, token: int) -> None:
        self.streams.remove(key, token)

    def close(self) -> None:
        """Stop watching; queue and stream watchers get one last wake so that waiting loops
        notice the closed store now rather than at their next re-poll, and every
        subscription its ``on_close``."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._poke()
        self._thread.join(timeout=5)
        with self._lock:
            self._drop_place()
        if self._watch is not None:
            self._watch.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        with contextlib.suppress(Exception):
            self._conn.close()
        self.queues.dispatch_all()
        self.streams.dispatch_all()
        self.fanout.close()

    # -- watcher thread ------------------------------------------------------------------

    def _run(self) -> None:
        with new_selector() as sel:  # not select(): it fails for descriptors >= 1024
            sel.register(self._wake_r, selectors.EVENT_READ)
            self._watch_loop(sel)

    def _watch_loop(self, sel: selectors.BaseSelector) -> None:
        retries: list[float] = []
        watching = False  # the file's events are registered with the selector
        last_look = time.monotonic()  # the safety check is due SAFETY_POLL after the last look
        while not self._closed.is_set():
            try:
                needed = self._needed()
                if self._watch is not None and needed != watching:
                    if needed:
                        # events queued meanwhile are kept: they make the next select return
                        # at once, so a commit since the last look is never drained unseen
                        sel.register(self._watch.fd, selectors.EVENT_READ)
                    else:
                        sel.unregister(self._watch.fd)
                    watching = needed
                if retries:
                    timeout = retries.pop(0)
                elif needed and self._watch is None:
                    timeout = POLL_FALLBACK  # no file events here: poll while someone waits
                elif needed:
                    # events coalesce or go missing now and then: look by the clock as well
                    timeout = max(0.0, last_look + SAFETY_POLL - time.monotonic())
                else:
                    timeout = SAFETY_POLL  # nobody waits: only a poke matters (or close)
                readable = {key.fd for key, _ in sel.select(timeout)}
                if self._closed.is_set():
                    return
                poked = self._wake_r in readable
                if poked:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 4096):
                            pass
                    if self._closed.is_set():
                        return
                if not self._needed():
                    continue  # nobody waits: nothing to look for (the next turn stops watching)
                event = watching and self._watch.fd in readable  # type: ignore[union-attr]
                # An event of another file in the directory (a log written every 0.2 s) is no
                # reason to look, but must not postpone the safety check either: it is due by
                # the time since the last look, not by a select that timed out.
                due = time.monotonic() - last_look >= SAFETY_POLL
                if event and not self._watch.relevant() and not poked and not due:  # type: ignore[union-attr]
                    continue
                with self._lock:
                    changed = self._check()
                    self._keep_place()
                last_look = time.monotonic()
                if event and not changed:
                    # The -wal write that woke us precedes the commit's publication (the
                    # wal-index update, in shared memory, raises no file event): look again
                    # a few times, briefly, so that commit is not left to the safety poll.
                    retries = list(SETTLE_RETRIES)
                elif changed:
                    retries = []
                    if event and self._closed.wait(MIN_GAP):
                        # More commits may follow (a busy worker's own): the next look waits
                        # MIN_GAP, and covers every commit that came meanwhile, with one wake.
                        return
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
        owed = max(self._last_note, self._since) + 1  # committed ids have no gaps but pruned ones
        if rows and rows[0][0] > owed and self.fanout.has_any():
            log.error(
                "alkstore SQLite watcher: %d notifications were pruned before this process read "
                "them (it was not heard from for over %s s); its subscriptions missed them",
                rows[0][0] - owed, NOTIFY_READER_TTL,
            )
        for note_id, channel, payload in rows:
            if channel == QUEUE_WAKE_CHANNEL:  # a queue wake without a new job (sqlite.py)
                self._wake_queue(payload)
            self.fanout.dispatch(channel, note_id, payload)
        if rows:
            self._last_note = rows[-1][0]

    def _read_streams(self) -> None:
        """Wake the subscribers of each watched stream whose counter moved; only those
        streams' counters are read (and remembered)."""
        watched = self.streams.channel_keys()
        if not watched:
            self._stream_offsets = {}
            return
        offsets = self._backend.stream_offsets_of(RawExecutor(self._conn, self._backend), {"names": json.dumps(watched)})
        known, self._stream_offsets = self._stream_offsets, offsets
        for name, last in offsets.items():
            if last != known.get(name):
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
            self._wake_queue(queue)
        self._last_job = seq

    def _wake_queue(self, key: str) -> None:
        """Wake the queue's consumers; its presence is withdrawn first (an ``advertise``
        that a woken consumer makes is then kept)."""
        self._present.discard(key)
        self.queues.dispatch(key, 0, "")

