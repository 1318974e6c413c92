"""Queue handles and job handles: the pinned queue surface of SPEC §5."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from . import _limits
from . import _validate as v
from ._backends.queue_ops import Requeued
from ._backoff import backoff_delay
from ._rows import FIELD, NO_PAYLOAD, job_from_row, number, sort_claim_order
from .errors import HandleConsumed, InvalidOptions, PayloadError
from .model import Job, QueueSettings, QueueStats, SweepResult
from .schema import JOB_FIELDS

_PAYLOAD = FIELD["payload"]  # the claim row's payload column (read once per job)
_ATTEMPTS, _MAX_ATTEMPTS = FIELD["attempts"], FIELD["max_attempts"]
_VISIBILITY_TIMEOUT = FIELD["visibility_timeout"]
_CLAIMED_AT, _RUN_AT = FIELD["claimed_at"], FIELD["run_at"]

if TYPE_CHECKING:
    from .store import Store, _DefaultStore



@dataclass(frozen=True)
class QueueOpts:
    """Per-queue options, stamped onto every job the handle enqueues."""

    visibility_timeout: float = 300.0
    max_attempts: int = 3
    backoff_base: float = 5.0
    dead_letter_retention: float | None = None

    @classmethod
    def validated(
        cls,
        *,
        visibility_timeout: v.Duration = 300,
        max_attempts: int = 3,
        backoff_base: v.Duration = 5,
        dead_letter_retention: v.Duration | None = None,
    ) -> QueueOpts:
        return cls(
            visibility_timeout=v.lease(visibility_timeout, "visibility_timeout"),
            max_attempts=v.max_attempts(max_attempts),
            backoff_base=v.duration(backoff_base, "backoff_base"),
            dead_letter_retention=v.optional_duration(dead_letter_retention, "dead_letter_retention"),
        )


DEFAULT_OPTS = QueueOpts()


def enqueue_params(
    store: Store | _DefaultStore,
    queue: str,
    opts: QueueOpts,
    *,
    delay: v.Duration | None,
    run_at: datetime | None,
    priority: int,
    max_attempts: int | None,
    expires: v.Duration | None,
    unique_key: str | None = None,
) -> dict[str, Any]:
    """Validate the per-call options and resolve them over the stamps (no SQL yet). A
    ``unique_key`` makes the backend's enqueue the unique form (SPEC §14)."""
    # (the None checks are made here, not by calling v.optional_*: this runs per enqueue)
    params = {
        "queue": queue,
        "delay": None if delay is None else v.duration(delay, "delay"),
        "run_at": None if run_at is None else v.aware_datetime(run_at, "run_at"),
        "priority": v.int32(priority, "priority"),
        "max_attempts": opts.max_attempts if max_attempts is None else v.max_attempts(max_attempts),
        "expires": None if expires is None else v.lease(expires, "expires"),
        "visibility_timeout": opts.visibility_timeout,
        "backoff_base": opts.backoff_base,
        "dead_letter_retention": opts.dead_letter_retention,
        "now": store.now(),
        "wake": store.backend.wake_key(queue),
    }
    if unique_key is not None:
        params["unique_key"] = v.unique_key(unique_key)
    return params


def encode_all(store: Store | _DefaultStore, payloads: Iterable[Any]) -> list[str]:
    if isinstance(payloads, (str, bytes, bytearray, dict)):
        raise InvalidOptions("payloads must be an iterable of payloads (a list), not a single payload")
    try:
        items = iter(payloads)
    except TypeError:
        raise InvalidOptions(f"payloads must be an iterable of payloads (a list), got {type(payloads).__name__}") from None
    return v.encode_batch(items, store.max_payload_bytes)


class Queue:
    """A handle on one queue: a name plus the options it stamps. Constructing it writes
    nothing. The name follows the name rules (InvalidName): the reserved ones are the
    backing queues of outboxes, reached through ``store.outbox(name)``."""

    def __init__(self, store: Store, name: str, opts: QueueOpts) -> None:
        if not isinstance(opts, QueueOpts):
            raise InvalidOptions(f"opts must be a QueueOpts, got {type(opts).__name__}")
        self.store = v.store(store)
        self.name = v.name(name, "queue name")
        self.opts = opts

    @classmethod
    def _unchecked(cls, store: Store, name: str, opts: QueueOpts) -> Queue:
        """A handle whose name and options were checked already (a task's, at decoration:
        its every enqueue makes one), or a queue of alkstore's own (an outbox's backing
        queue), whose reserved name ``Queue()`` refuses."""
        queue = cls.__new__(cls)
        queue.store, queue.name, queue.opts = store, name, opts
        return queue

    def __repr__(self) -> str:
        return f"<alkstore_sa.Queue {self.name!r} {self.opts}>"

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
        delay: v.Duration | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
        unique_key: str | None = None,
    ) -> int:
        """Enqueue one job in its own transaction (one statement); returns its id. While a
        live job of this queue holds ``unique_key``, nothing is written and that job's id is
        returned (SPEC §14)."""
        self.store._check_open()
        params = enqueue_params(
            self.store, self.name, self.opts, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, expires=expires, unique_key=unique_key,
        )
        params["payload"] = v.encode_payload(payload, self.store.max_payload_bytes)
        with self.store.executor() as ex:
            return self.store.backend.enqueue(ex, params)

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        delay: v.Duration | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
    ) -> list[int]:
        """Enqueue many jobs with the same options in one transaction (one statement);
        returns their ids in payload order."""
        self.store._check_open()
        params = enqueue_params(
            self.store, self.name, self.opts, delay=delay, run_at=run_at, priority=priority,
            max_attempts=max_attempts, expires=expires,
        )
        texts = encode_all(self.store, payloads)
        if not texts:
            return []
        with self.store.executor() as ex:
            return self.store.backend.enqueue_many(ex, params, texts)

    # -- claim -----------------------------------------------------------------------------

    def claim_one(self, worker_id: str) -> JobHandle | None:
        """Claim the next claimable job, or None."""
        handles = self.claim_batch(worker_id, 1)
        return handles[0] if handles else None

    def claim_batch(self, worker_id: str, n: int) -> list[JobHandle]:
        """Claim up to ``n`` jobs (never more), in claim order; ``n <= 0`` claims nothing.
        The queue's settings may hand out fewer: none while paused, at most what its
        concurrency and rate limits leave room for."""
        self.store._check_open()
        worker_id = v.worker_id(worker_id)
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidOptions(f"n must be an int, got {type(n).__name__}")
        if n <= 0:
            return []
        params = {"queue": self.name, "worker_id": worker_id, "n": min(n, v.INT32_MAX), "now": self.store.now()}
        # Retried once after a disconnect: if the lost first attempt did commit, its claims
        # are unknown to the caller and lapse after the visibility timeout (an attempt is
        # spent) — exactly what the caller's own retry of a failed claim would cause.
        # A queue with settings (paused, limits) hands out at most what they leave room for.
        with self.store.executor(retry=True) as ex:
            rows = _limits.claim_rows(self, ex, params)
        sort_claim_order(rows)
        return [JobHandle(self, r) for r in rows]

    # -- settings (SPEC §14: stored in the database, shared by every process) --------------

    def pause(self) -> QueueSettings:
        """Hand out nothing until ``resume()``; enqueues still land and claimed jobs finish."""
        return _limits.update(self, *_limits.change_params(paused=True))

    def resume(self) -> QueueSettings:
        """Undo ``pause()``, waking the queue's idle workers."""
        return _limits.update(self, *_limits.change_params(paused=False))

    def set_concurrency(self, limit: int | None) -> QueueSettings:
        """At most ``limit`` jobs of this queue under a live claim at once, across every
        process (None: no limit). Claims already live are not revoked by a lower limit."""
        return _limits.update(self, *_limits.change_params(concurrency=limit))

    def set_rate_limit(self, limit: int | None, per: v.Duration | None = None) -> QueueSettings:
        """At most ``limit`` jobs handed out in any window of ``per`` seconds, across every
        process (None: no limit)."""
        return _limits.update(self, *_limits.change_params(rate_limit=limit, per=per))

    def settings(self) -> QueueSettings:
        """This queue's settings as stored (no row: not paused, no limits)."""
        self.store._check_open()
        with self.store.executor(retry=True) as ex:  # a read
            row = self.store.backend.queue_settings_get(ex, {"queue": self.name})
        return _limits.settings_from_row(row)

    # -- other operations ------------------------------------------------------------------

    def ack_batch(self, ids: Iterable[int | JobHandle]) -> int:
        """Ack every id processing under an unexpired claim in this queue; returns how many.

        Items may also be JobHandles: those are acked only under *their own* claim (the
        handle's validity predicate, so a stale handle never acks a reclaimed job) and are
        consumed like ``h.ack()``.
        """
        self.store._check_open()
        if isinstance(ids, (str, bytes)):
            raise InvalidOptions("ids must be an iterable of ints or JobHandles")
        items = list(ids)
        if set(map(type, items)) <= {int}:
            # the common call (plain ids, as claim_batch + ack_batch makes it): checked in
            # C-speed passes, not one call per id
            handles: list[JobHandle] = []
            plain = cast("list[int]", items)
        else:
            handles = [h for h in items if isinstance(h, JobHandle)]
            plain = [v.job_id(i) for i in items if not isinstance(i, JobHandle)]
        if any(h.consumed for h in handles):
            raise HandleConsumed()
        for h in handles:
            h._consume()
        unique = set(plain)
        if unique and not (v.in_int64(min(unique)) and v.in_int64(max(unique))):
            unique = {i for i in unique if v.in_int64(i)}
        wanted = sorted(unique)
        claims = dict(sorted(h._claim for h in handles))
        landed = 0
        # Retried once after a disconnect (see JobHandle): a repeat deletes nothing more.
        with self.store.executor(retry=True) as ex:
            if wanted:
                params = {"queue": self.name, "ids": wanted, "now": self.store.now()}
                landed += self.store.backend.ack_batch(ex, params)
            if claims:
                params = {"queue": self.name, "ids": list(claims), "attempts": list(claims.values()), "now": self.store.now()}
                landed += len(self.store.backend.ack_claims(ex, params))
        return landed

    def _ack_claims(self, handles: list[JobHandle]) -> set[tuple[int, int]]:
        """Ack each handle of this queue under its own claim, in one call (see
        ``ack_claims``)."""
        return ack_claims(self.store, handles, self.name)

    def cancel(self, job_id: int) -> bool:
        """Delete a live job of this queue, pending or processing (not an interrupt)."""
        return self._cancel(job_id, pending_only=False)

    def _cancel(self, job_id: int, *, pending_only: bool) -> bool:
        self.store._check_open()
        job_id = v.job_id(job_id)
        if not v.in_int64(job_id):
            return False
        backend = self.store.backend
        op = backend.cancel_pending if pending_only else backend.cancel
        with self.store.executor(retry=True) as ex:  # a repeat finds nothing to delete
            return op(ex, {"id": job_id, "queue": self.name})

    def get_job(self, job_id: int) -> Job | None:
        """The job with this id (id-global: any queue), live or dead."""
        self.store._check_open()
        job_id = v.job_id(job_id)
        return self.store.get_job(job_id) if v.in_int64(job_id) else None

    def dead_jobs(self, limit: int = 100, before_id: int | None = None) -> list[Job]:
        """Dead jobs of this queue, id descending; only ids below ``before_id`` when given."""
        return [job_from_row(r) for r in self._dead_rows(limit, before_id)]

    def _dead_rows(self, limit: int, before_id: int | None) -> list[tuple[Any, ...]]:
        """The rows of ``dead_jobs``, payloads not decoded (``alkstore dead list``)."""
        self.store._check_open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidOptions("limit must be a non-negative int")
        if before_id is not None:
            before_id = v.job_id(before_id)
            before_id = max(min(before_id, v.INT64_MAX), v.INT64_MIN)
        if limit == 0:
            return []
        params = {"queue": self.name, "limit": min(limit, v.INT32_MAX), "before_id": before_id}
        with self.store.executor(retry=True) as ex:  # a read
            return self.store.backend.dead_jobs(ex, params, before=before_id is not None)

    def requeue_dead(self, job_id: int) -> int | None:
        """Move a dead job of this queue back as a fresh job (new id, this handle's stamps,
        the dead job's payload, priority, unique key and trace context), in one transaction; None if there
        is none. When a live job holds the dead job's key, nothing is written (the dead row
        stays) and the live job's id is returned, as an enqueue with that key would."""
        done = self._requeue_dead(job_id)
        return None if done is None else done.job_id

    def _requeue_dead(self, job_id: int) -> Requeued | None:
        """``requeue_dead``, saying whether the dead job moved or a live job holds its key
        (the operator tools report which; ``requeue_dead`` returns the id either way)."""
        self.store._check_open()
        job_id = v.job_id(job_id)
        if not v.in_int64(job_id):
            return None
        params = enqueue_params(
            self.store, self.name, self.opts, delay=None, run_at=None, priority=0,
            max_attempts=None, expires=None,
        )
        params["id"] = job_id
        with self.store.executor() as ex:
            return self.store.backend.requeue_dead(ex, params)

    def delete_dead(self, job_id: int) -> bool:
        """Delete a dead job of this queue for good (discarding a dead letter); False when
        this queue has no dead job with that id (live jobs are never touched)."""
        self.store._check_open()
        job_id = v.job_id(job_id)
        if not v.in_int64(job_id):
            return False
        with self.store.executor(retry=True) as ex:  # a repeat finds nothing to delete
            return self.store.backend.delete_dead(ex, {"id": job_id, "queue": self.name})

    def sweep_expired(self) -> SweepResult:
        """Move every row past its ``expires_at`` (pending and processing) to dead as
        ``"expired"``, and purge dead rows past their stamped retention."""
        self.store._check_open()
        with self.store.executor(retry=True) as ex:  # a repeat finds nothing left to move
            expired, purged = self.store.backend.sweep(ex, {"queue": self.name, "now": self.store.now()})
        return SweepResult(expired=expired, purged=purged)

    def stats(self) -> QueueStats:
        """Counts for this queue: pending (incl. delayed), ready, processing, dead."""
        self.store._check_open()
        with self.store.executor(retry=True) as ex:  # a read
            pending, ready, oldest, processing, dead, now = self.store.backend.stats(
                ex, {"queue": self.name, "now": self.store.now()}
            )
        age = None if oldest is None else max(0.0, now - oldest)
        return QueueStats(pending=pending, ready=ready, processing=processing, dead=dead, oldest_ready_age=age)


def claim_turns(
    store: Store, worker_id: str, queues: list[Queue], want: int, budget: int
) -> list[tuple[int, list[JobHandle] | None]]:
    """Claim from ``queues`` in turn — each up to ``want`` jobs and what is left of
    ``budget`` — until the budget is spent: one (n claimed with, handles) per queue reached,
    in order (handles None: the queue has settings, claim it with ``claim_batch``). The worker's round when its queues
    outnumber its free slots: a queue with fewer jobs than its share leaves the rest to the
    next one in the same call, one transaction on SQLite. None of the queues may be known to
    have settings (``store._limited_queues``)."""
    store._check_open()
    turns = _turn_params(store, worker_id, queues, want)
    # Retried once after a disconnect, as claim_batch: outside a transaction (PostgreSQL)
    # only the statement that failed runs again; a lost claim lapses after its timeout.
    with store.executor(retry=True) as ex:
        taken = store.backend.claim_turns(ex, turns, budget)
    return _turn_handles(store, queues, taken)


def ack_and_claim_turns(
    store: Store, handles: list[JobHandle], worker_id: str, queues: list[Queue], want: int, budget: int
) -> tuple[set[tuple[int, int]], list[tuple[int, list[JobHandle] | None]]]:
    """``ack_claims(store, handles, None)`` and then ``claim_turns``, in one transaction:
    a worker's batch of acks written with the claim for the slots it frees, where the
    backend says that is cheaper (``acks_ride_claims``). Both land or neither does; the
    handles are consumed only once they did, so after an error they can still be acked
    on their own."""
    store._check_open()
    if any(h._consumed for h in handles):
        raise HandleConsumed()
    acks = _ack_params(store, handles, None)
    turns = _turn_params(store, worker_id, queues, want)
    with store.executor() as ex:  # a transaction: never retried (SQLite cannot lose it anyway)
        landed, taken = store.backend.ack_and_claim_turns(ex, acks, turns, budget)
    for h in handles:  # (checked above: none was consumed; this is their one write)
        h._consumed = True
    return set(landed), _turn_handles(store, queues, taken)


def _turn_params(store: Store, worker_id: str, queues: list[Queue], want: int) -> list[dict[str, Any]]:
    worker_id = v.worker_id(worker_id)
    now, n = store.now(), min(want, v.INT32_MAX)
    return [{"queue": q.name, "worker_id": worker_id, "n": n, "now": now} for q in queues]


def _turn_handles(
    store: Store, queues: list[Queue], taken: list[tuple[int, list[tuple[Any, ...]] | None]]
) -> list[tuple[int, list[JobHandle] | None]]:
    """Each turn's (n, handles); a queue found to have settings is remembered as limited."""
    out: list[tuple[int, list[JobHandle] | None]] = []
    for q, (asked, rows) in zip(queues, taken, strict=False):
        if rows is None:
            store._limited_queues.add(q.name)
            out.append((asked, None))
            continue
        sort_claim_order(rows)
        out.append((asked, [JobHandle(q, r) for r in rows]))
    return out


def cancel_pending(queue: Queue, job_id: int) -> bool:
    """Delete a job of ``queue`` only while it is pending, in one statement: False when it
    is processing (a claim landed first and keeps it), dead, gone or another queue's. The
    dashboard's cancel; ``Queue.cancel`` (SPEC §5.5) also deletes a processing job."""
    return queue._cancel(job_id, pending_only=True)


def ack_claims(store: Store, handles: list[JobHandle], queue: str | None) -> set[tuple[int, int]]:
    """Ack each handle under its own claim, in one call, consuming them; the
    (id, attempt) claims that landed. Only jobs of ``queue`` are acked, or of any queue when
    it is None: the claim alone is what the single ack checks (the worker writes the acks
    of all its queues together). Unlike ``ack_batch`` it says which handles landed, so each
    job's outcome is known exactly."""
    store._check_open()
    if any(h.consumed for h in handles):
        raise HandleConsumed()
    for h in handles:
        h._consume()
    if not handles:
        return set()
    params = _ack_params(store, handles, queue)
    # Retried once after a disconnect, like JobHandle.ack: a repeat can only act on the
    # same claims, so it deletes nothing the first attempt would not have.
    with store.executor(retry=True) as ex:
        return set(store.backend.ack_claims(ex, params))


def _ack_params(store: Store, handles: list[JobHandle], queue: str | None) -> dict[str, Any]:
    claims = sorted({h._claim for h in handles})
    return {"queue": queue, "ids": [c[0] for c in claims], "attempts": [c[1] for c in claims], "now": store.now()}


class JobHandle:
    """One claim of one job. ``ack``/``retry``/``fail`` are one-shot; ``heartbeat`` repeats.

    Every operation succeeds only while the job is processing under *this* claim and the
    claim deadline has not passed; otherwise it returns False and changes nothing.

    That fence is why each is retried once on a fresh connection after a disconnect
    (``store.executor(retry=True)``): a repeat can only act on the same claim, so it never
    does anything the first attempt would not have done. If the first attempt did land
    before the connection died, the claim is over and the repeat returns False (a
    heartbeat's repeat returns True: the claim is still live). So after a disconnect,
    False means "not done by the repeat" — the job may have been acked by the lost first
    attempt; True is always exact. Without the retry, the same ack would be an error and
    the job would run again after its visibility timeout.
    """

    __slots__ = ("_queue", "_row", "_job", "_payload", "_consumed", "_claim")

    def __init__(self, queue: Queue, row: tuple[Any, ...] | Job) -> None:
        self._queue = queue
        # The claim's row; the Job value (payload decoding, datetimes) is built on first use,
        # so a caller that only needs ids (claim_batch + ack_batch) never pays for it.
        if isinstance(row, Job):
            self._job: Job | None = row
            self._row: tuple[Any, ...] = (row.id,) + tuple(getattr(row, f) for f in JOB_FIELDS[1:])
        else:
            self._job, self._row = None, row
        self._payload: Any = NO_PAYLOAD
        self._consumed = False
        # (job id, attempt): this claim of the job, as batched acks and the worker's
        # bookkeeping key it (read several times per job: an attribute, not a property)
        self._claim: tuple[int, int] = (self._row[0], self._row[_ATTEMPTS])

    def __repr__(self) -> str:
        return f"<alkstore_sa.JobHandle id={self.id} queue={self._queue.name!r} attempt={self._attempts}>"

    @property
    def job(self) -> Job:
        """The job as claimed."""
        if self._job is None:
            self._job = job_from_row(self._row, self._payload)
        return self._job

    def _described(self) -> Job:
        """The job as claimed, for what needs only its fields (the worker's span of an
        execution): ``job``, or with payload None when its stored payload cannot be decoded
        (a row edited by hand, which the worker fails)."""
        try:
            return self.job
        except PayloadError:
            return job_from_row(self._row, None)

    @property
    def id(self) -> int:
        return self._row[0]  # type: ignore[no-any-return]

    @property
    def payload(self) -> Any:
        """The job's payload (decoded once, without building the whole Job)."""
        if self._job is not None:
            return self._job.payload
        if self._payload is NO_PAYLOAD:
            self._payload = v.decode_payload(self._row[_PAYLOAD])
        return self._payload

    # The claim row's own fields, for the worker's per-job bookkeeping: reading them does
    # not build the Job (datetimes, errors), which a task that never asks for it skips.

    @property
    def _attempts(self) -> int:
        return self._row[_ATTEMPTS]  # type: ignore[no-any-return]

    @property
    def _max_attempts(self) -> int:
        return self._row[_MAX_ATTEMPTS]  # type: ignore[no-any-return]

    @property
    def _visibility_timeout(self) -> float:
        """The claim's lease (the stamp within the API's range: ``claim_lease``), which the
        worker's heartbeats extend it by."""
        return v.claim_lease(self._row[_VISIBILITY_TIMEOUT])

    @property
    def _wait(self) -> float:
        """Seconds from the job's run_at to this claim (never negative)."""
        return max(0.0, float(self._row[_CLAIMED_AT]) - float(self._row[_RUN_AT]))

    @property
    def consumed(self) -> bool:
        return self._consumed

    def _claim_params(self) -> dict[str, Any]:
        store = self._queue.store
        return {"id": self._row[0], "attempts": self._attempts, "now": store.now()}

    def _consume(self) -> None:
        self._queue.store._check_open()
        if self._consumed:
            raise HandleConsumed()
        self._consumed = True

    def ack(self) -> bool:
        """Finish the job: delete its row."""
        self._consume()
        store = self._queue.store
        with store.executor(retry=True) as ex:
            return store.backend.ack(ex, self._claim_params())

    def retry(self, error: str, delay: v.Duration | None = None) -> bool:
        """Back to pending after ``delay`` (default: the backoff curve); at the attempt budget,
        to dead as ``"max attempts exceeded"``. ``error`` joins the job's error history."""
        self._queue.store._check_open()
        text = v.error_text(error)
        wait = v.optional_duration(delay, "delay")
        self._consume()
        store = self._queue.store
        params = self._claim_params()
        with store.executor(retry=True) as ex:
            params["error"] = ex.storable_text(text)
            attempts = self._attempts
            if attempts >= self._row[FIELD["max_attempts"]]:
                params["last_error"] = "max attempts exceeded"
                return store.backend.bury(ex, params)
            backoff_base = number(self._row[FIELD["backoff_base"]])  # text SQLite keeps: NaN, no wait
            params["delay"] = backoff_delay(backoff_base, attempts) if wait is None else wait
            return store.backend.retry(ex, params)

    def fail(self, error: str | None = None) -> bool:
        """Dead-letter now, with ``last_error = error`` (``"failed"`` when None)."""
        self._queue.store._check_open()
        text = None if error is None else v.error_text(error)
        self._consume()
        store = self._queue.store
        params = self._claim_params()
        with store.executor(retry=True) as ex:
            params["error"] = None if text is None else ex.storable_text(text)
            params["last_error"] = "failed" if text is None else params["error"]
            return store.backend.bury(ex, params)

    def heartbeat(self, extend: v.Duration) -> bool:
        """Reset the claim deadline to now + ``extend`` (absolute, not additive). A late
        heartbeat (deadline already passed) is refused: it never steals the job back."""
        store = self._queue.store
        store._check_open()
        seconds = v.lease(extend, "extend")
        return self._heartbeat(seconds, store.now())

    def _heartbeat(self, extend: float, now: float | None) -> bool:
        """``heartbeat(extend)`` as called at ``now`` (a reading of the store's clock, None
        for the database's): the worker beats the claims due together as called together,
        so a beat sent after another one that waited for SQLite's write lock is judged by
        when it was due, as that one is (``extend`` already checked)."""
        store = self._queue.store
        store._check_open()
        if self._consumed:
            raise HandleConsumed()
        params = {"id": self._row[0], "attempts": self._attempts, "now": now, "extend": extend}
        with store.executor(retry=True) as ex:
            return store.backend.heartbeat(ex, params)

