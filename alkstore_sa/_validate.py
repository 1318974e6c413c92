"""Argument validation: every check runs in Python before any SQL, so bad input writes nothing."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import InvalidName, InvalidOptions, PayloadError

if TYPE_CHECKING:
    from .stop import StopToken
    from .store import Store

RESERVED_PREFIX = "__alkstore"
MAX_NAME_LENGTH = 200
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
MAX_DURATION = 100 * 365.25 * 86400.0  # "a duration over 100 years" is refused

Duration = int | float | timedelta
T = TypeVar("T")


def _utf8_clean(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def name(value: object, what: str = "name", *, allow_reserved: bool = False) -> str:
    """Validate a user-facing name (queue, outbox, schedule, stream, lock, channel, consumer)."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidName(f"{what} must not contain NUL")
    if not _utf8_clean(value):
        raise InvalidName(f"{what} must be valid Unicode (no lone surrogates)")
    if not allow_reserved and value.startswith(RESERVED_PREFIX):
        raise InvalidName(f"{what} {value!r} starts with the reserved prefix {RESERVED_PREFIX!r}")
    return value


MAX_SCHEMA_BYTES = 63  # PostgreSQL's identifier limit (a longer name would be truncated)


def schema(value: object) -> str:
    """The PostgreSQL schema of alkstore's tables (checked on SQLite too, which ignores it):
    a non-empty str of at most 63 bytes without NUL or '.', in valid Unicode. (PostgreSQL
    takes a dot in a quoted name, but Alembic reads ``a.b`` as database ``a``, schema
    ``b``: the install failed, and such a store could never work. A lone surrogate — what
    Python makes of a command-line argument that is not UTF-8 — cannot be sent at all.)"""
    if (
        not isinstance(value, str) or not value or "\x00" in value
        or len(value.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES
    ):
        raise InvalidOptions(f"schema must be a non-empty str of at most {MAX_SCHEMA_BYTES} bytes without NUL")
    if not _utf8_clean(value):
        raise InvalidOptions("schema must be valid Unicode (no lone surrogates)")
    if "." in value:
        raise InvalidOptions(
            f"schema must not contain '.' ({value!r}): Alembic, which installs the tables, reads "
            "a dotted name as database.schema"
        )
    return value


def worker_id(value: object, what: str = "worker_id") -> str:
    """A claimant label: a non-empty str of at most 200 characters with no NUL."""
    if not isinstance(value, str) or not value:
        raise InvalidOptions(f"{what} must be a non-empty str")
    if len(value) > MAX_NAME_LENGTH or "\x00" in value or not _utf8_clean(value):
        raise InvalidOptions(f"{what} must be at most 200 characters of valid text without NUL")
    return value


def unique_key(value: object) -> str | None:
    """A job's unique key (SPEC §14): None, or a non-empty str of at most 200 characters of
    valid text without NUL."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidOptions("unique_key must be None or a non-empty str")
    if len(value) > MAX_NAME_LENGTH or "\x00" in value or not _utf8_clean(value):
        raise InvalidOptions("unique_key must be at most 200 characters of valid text without NUL")
    return value


def int_text(text: str) -> int:
    """An integer written in ASCII (as ``int()`` reads it otherwise: sign, surrounding
    spaces). ``int()`` alone also reads every other script's decimal digits ('\u0663' is
    3), which no number typed at a command line or into a URL means; ValueError for them."""
    if not text.isascii():
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def float_text(text: str) -> float:
    """A number written in ASCII; ``float()`` alone reads other scripts' digits too
    (``int_text``). ValueError otherwise."""
    if not text.isascii():
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOptions(f"{what} must be a number, got {type(value).__name__}")
    try:
        f = float(value)
    except OverflowError:
        raise InvalidOptions(f"{what} is too large") from None
    if math.isnan(f) or math.isinf(f):
        raise InvalidOptions(f"{what} must be finite")
    return f


def duration(value: object, what: str, *, minimum: float = 0.0) -> float:
    """Seconds (int/float) or a timedelta, finite, within [minimum, 100 years]."""
    f = value.total_seconds() if isinstance(value, timedelta) else _number(value, what)
    if f < minimum:
        raise InvalidOptions(f"{what} must be >= {minimum:g}, got {f!r}")
    if f > MAX_DURATION:
        raise InvalidOptions(f"{what} must not exceed 100 years")
    return f


# The shortest lease (a lock's ttl, the scheduler's lease, a claim's visibility timeout or
# heartbeat extension), rate window, job expiry and loop interval: timestamps are epoch
# seconds with millisecond precision (SPEC §1), and near today's epoch a float steps by
# 2.4e-7 s, so now + 1e-7 is now again: a shorter lease would lapse as it is written, a
# shorter window would hold no claim but the one being made (no limit at all), a shorter
# expiry would make a job that expired as it was enqueued, and a shorter poll interval is a
# busy loop. (Spans where 0 means "now" — a delay, a retention, a grace period — take any
# value >= 0: a sub-millisecond one is just "now".)
MIN_LEASE = 0.001


def claim_lease(stamp: object) -> float:
    """The lease a claim takes from its job's ``visibility_timeout`` stamp: the stamp within
    what the API takes (MIN_LEASE to 100 years). A row written by hand may hold anything: a
    stamp below zero made a claim that had lapsed before it was made, an infinite one a
    deadline past the calendar, and the worker's heartbeats, refused as bad input, were
    logged as a database outage (in a busy loop for a stamp of zero or less). A stamp that
    is no number — NaN, which PostgreSQL stores, or text, which SQLite keeps — is the longest
    lease, as each database orders it above every number (the claim's SQL, ``queue_ops.lease``,
    takes the same bounds)."""
    if (type(stamp) is float or type(stamp) is int) and MIN_LEASE <= stamp <= MAX_DURATION:
        return stamp  # the usual stamp (NaN fails both comparisons; SQLite reads 300.0 as 300)
    if isinstance(stamp, (int, float)) and stamp == stamp:  # NaN is not equal to itself
        return min(max(float(stamp), MIN_LEASE), MAX_DURATION)
    return MAX_DURATION


def _millisecond_or_more(value: object, what: str, why: str) -> float:
    """Seconds or a timedelta, at least MIN_LEASE (timestamps have millisecond precision:
    ``why`` a shorter span is refused), at most 100 years."""
    f = duration(value, what, minimum=-math.inf)
    if f < MIN_LEASE:
        raise InvalidOptions(
            f"{what} must be >= {MIN_LEASE:g} (timestamps have millisecond precision: {why}), got {f!r}"
        )
    return f


def lease(value: object, what: str) -> float:
    """A lease duration or a rate window: seconds or a timedelta, at least MIN_LEASE, at
    most 100 years."""
    return _millisecond_or_more(value, what, "a shorter span cannot be measured")


def optional_lease(value: object, what: str) -> float | None:
    """None, or a span ``lease`` accepts: a job's ``expires`` (a shorter one would make
    ``expires_at`` equal the enqueue instant, a job that expired as it was written)."""
    return None if value is None else lease(value, what)


def interval(value: object, what: str) -> float:
    """How often a loop looks again (a poll interval, the worker registry's refresh): seconds
    or a timedelta, at least MIN_LEASE, at most 100 years. Its deadlines are timestamps of
    millisecond precision too, and a shorter interval is a busy loop against the database."""
    return _millisecond_or_more(value, what, "a shorter interval would query the database in a busy loop")


def optional_duration(value: object, what: str, **kw: Any) -> float | None:
    return None if value is None else duration(value, what, **kw)


def timeout(value: object, what: str = "timeout") -> float | None:
    """How long a call may wait: None (until its event) or a duration >= 0 (0: only look)."""
    return optional_duration(value, what)


def stop_token(value: object, what: str = "stop") -> StopToken:
    """The ``stop`` argument of a loop: an ``alkstore_sa.StopToken`` (nothing else has the
    ``on_stop`` callback the loops wake on)."""
    from .stop import StopToken  # stop.py validates with this module: imported at call time

    if not isinstance(value, StopToken):
        raise InvalidOptions(f"{what} must be an alkstore_sa.StopToken, got {type(value).__name__}")
    return value


def store(value: object, what: str = "store") -> Store:
    """The store a handle, worker or app works on: an ``alkstore_sa.Store``. Anything else
    (a URL or an engine where the store goes, None) would fail only at its first use, with
    an AttributeError from deep inside."""
    from .store import Store  # store.py validates with this module: imported at call time

    if not isinstance(value, Store):
        hint = ""
        if isinstance(value, str) or type(value).__name__ in ("Engine", "AsyncEngine"):
            hint = " (make one with alk.Store(engine_or_url))"
        raise InvalidOptions(f"{what} must be an alk.Store, got {type(value).__name__}{hint}")
    return value


def int32(value: object, what: str, *, minimum: int = INT32_MIN) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptions(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum or value > INT32_MAX:
        raise InvalidOptions(f"{what} must be in [{minimum}, {INT32_MAX}], got {value}")
    return value


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def job_id(value: object) -> int:
    """A job id argument: an int (not a bool). Out-of-range ids are valid input that
    matches no job (see ``in_int64``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptions(f"job id must be an int, got {type(value).__name__}")
    return value


def in_int64(job_id: int) -> bool:
    """Whether an id can exist at all (job ids are signed 64-bit)."""
    return INT64_MIN <= job_id <= INT64_MAX


def max_attempts(value: object) -> int:
    return int32(value, "max_attempts", minimum=1)


def aware_datetime(value: object, what: str) -> float:
    """An aware datetime as epoch seconds: the stored form, which must read back as a
    datetime (the last instant of year 9999 rounds to year 10000, a time before year 1 in
    UTC has none), or every later read of the row would fail."""
    if not isinstance(value, datetime):
        raise InvalidOptions(f"{what} must be a datetime, got {type(value).__name__}")
    try:
        # value.utcoffset(), not tzinfo.utcoffset(): the datetime checks what the tzinfo
        # answers (a timedelta within a day); timestamp() asks it again
        aware = value.tzinfo is not None and value.utcoffset() is not None
        seconds = value.timestamp() if aware else 0.0
    except Exception as exc:  # noqa: BLE001 - the caller's tzinfo raised, or answered no offset
        raise InvalidOptions(
            f"{what} has a tzinfo whose utcoffset() failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not aware:
        raise InvalidOptions(f"{what} must be timezone-aware")
    try:
        datetime.fromtimestamp(seconds, timezone.utc)
    except (OverflowError, ValueError, OSError):
        raise InvalidOptions(
            f"{what} must be within years 1 to 9999 (UTC), got {value.isoformat()}"
        ) from None
    return seconds


# The most of an error text stored (``retry``/``fail``: its history entry, ``last_error``).
# PostgreSQL holds no JSON string past 256 MiB, nor a history past 256 MiB in all: a retry
# or fail carrying one failed in SQL and its outcome was lost (the claim lapsed). At most
# 400 KB an entry (UTF-8), a history reaches that only past 600 attempts.
MAX_STORED_ERROR = 100_000


def cut_text(text: str, most: int) -> str:
    """``text`` up to ``most`` characters, saying how many more there were."""
    if len(text) > most:
        return f"{text[:most]}… [{len(text) - most} more characters]"
    return text


def error_text(value: object, what: str = "error") -> str:
    """An error string as stored: cut at MAX_STORED_ERROR characters; NUL and lone
    surrogates become U+FFFD (databases refuse them)."""
    if not isinstance(value, str):
        raise InvalidOptions(f"{what} must be a str, got {type(value).__name__}")
    value = cut_text(value, MAX_STORED_ERROR)
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if not _utf8_clean(value):
        value = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    return value


def full_depth(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, run again on a fresh thread when it runs out of recursion
    depth. JSON is encoded and decoded recursively, one level per nesting level, within
    the stack the caller already used: a payload is accepted when ``json.dumps`` succeeds
    on the enqueuer's stack, and a reader with a deeper one (a worker's claim loop, a web
    request) would fail on it. A new thread's stack starts empty, so it has the whole
    recursion budget any enqueuer had."""
    try:
        return fn(*args, **kwargs)
    except RecursionError:
        return _on_fresh_stack(fn, *args, **kwargs)


def _on_fresh_stack(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a new thread, whose stack starts empty (``full_depth``)."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # re-raised on the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="alkstore-deep-json", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


# The strict, compact JSON encoders of payloads (with and without ASCII escapes), made once:
# json.dumps with options makes a new JSONEncoder at every call. An encoder keeps only its
# settings (each encode() has its own state), so one is shared by every thread.
_ENCODERS = {
    ascii: json.JSONEncoder(allow_nan=False, ensure_ascii=ascii, separators=(",", ":")) for ascii in (False, True)
}


def _dumps(payload: object, *, ensure_ascii: bool) -> str:
    try:
        # full_depth: whether a payload is accepted does not depend on the caller's stack
        # (a scheduler's fire encodes a schedule's payload again, deeper than schedule())
        return full_depth(_ENCODERS[ensure_ascii].encode, payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not strict JSON: {exc}") from None
    except RecursionError:
        # json.dumps recurses once per nesting level: a payload nested deeper than the
        # interpreter's recursion limit cannot be serialized
        raise PayloadError("payload is nested too deeply to serialize as JSON") from None


def encode_payload(payload: object, max_bytes: int) -> str:
    """Serialize a payload as strict JSON text that any database text column can hold."""
    return encode_sized(payload, max_bytes)[0]


def encode_sized(payload: object, max_bytes: int) -> tuple[str, int]:
    """``encode_payload``, and the text's size in bytes (UTF-8)."""
    text = _dumps(payload, ensure_ascii=False)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # lone surrogates cannot be stored as UTF-8: keep them as JSON \u escapes instead
        text = _dumps(payload, ensure_ascii=True)
        size = len(text)
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes serialized; the limit is {max_bytes}")
    return text, size


# What one enqueue_many carries: its payloads' serialized sizes, each counted BATCH_OVERHEAD
# bytes more, total at most MAX_BATCH_BYTES. The statement sends them all as one value
# (PostgreSQL: a text[]; SQLite: a JSON array of the texts), and the databases take one value
# of about 1 GB at most (PostgreSQL's largest value and protocol message, SQLite's
# SQLITE_MAX_LENGTH of 10^9 bytes): beyond it the server refused the statement, or ended the
# connection, after the whole batch had been built and sent. The drivers' quoting makes the
# value up to twice the texts' size (psycopg's text array: a backslash before each quote and
# backslash) or three times it (SQLite's JSON array: a six-character \u escape for each non-ASCII character),
# plus a few bytes a payload (asyncpg's length words, PostgreSQL's array slots): 256 MiB
# keeps every driver's value well inside the limit.
MAX_BATCH_BYTES = 256 << 20
BATCH_OVERHEAD = 8


def max_payload_bytes(value: object) -> int:
    """A store's ``max_payload_bytes``: an int from 1 to MAX_BATCH_BYTES. A larger limit
    promised payloads one enqueue_many could not carry (and, past about 1 GB, that no
    statement of either database can: each refused one only after it was sent)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_BYTES:
        raise InvalidOptions(
            f"max_payload_bytes must be an int from 1 to {MAX_BATCH_BYTES} (256 MiB, what one "
            f"enqueue_many carries), got {value!r}"
        )
    return value


def batch_room(size: int) -> int:
    """How many payloads of ``size`` serialized bytes one batch carries (``encode_batch``'s
    count): at least one."""
    return max(1, MAX_BATCH_BYTES // (size + BATCH_OVERHEAD))


def encode_batch(payloads: Iterable[object], max_bytes: int) -> list[str]:
    """Every payload's text (``encode_payload``); PayloadError as soon as the batch passes
    MAX_BATCH_BYTES — before any statement, and before the rest is even serialized. A
    batch's first payload always fits (``max_bytes`` is at most MAX_BATCH_BYTES: see
    ``max_payload_bytes``), so ``enqueue_many([x])`` takes every ``x`` ``enqueue`` takes."""
    texts: list[str] = []
    total = 0
    for payload in payloads:
        text, size = encode_sized(payload, max_bytes)
        total += size + BATCH_OVERHEAD
        if total > MAX_BATCH_BYTES and texts:
            at = len(texts)
            texts.clear()  # not kept alive by the traceback's frames as long as the error is
            raise PayloadError(
                f"enqueue_many's payloads total more than {MAX_BATCH_BYTES} bytes serialized (each "
                f"counted {BATCH_OVERHEAD} bytes more) by payload #{at}: split them into "
                "several calls (in your transaction they still commit together)"
            )
        texts.append(text)
    return texts


# the decoder's scanner: an instance attribute typeshed does not declare
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode(text: str) -> Any:
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, TypeError):
        return _loads(text)
    return value if end == len(text) else _loads(text)


def _loads(text: str) -> Any:
    """``json.loads``; stored text that is not JSON (a row written by hand, say) raises
    PayloadError, an AlkstoreError like every error the library raises."""
    try:
        return json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise PayloadError(f"a stored payload is not JSON: {exc}") from None


def decode_payload(text: str) -> Any:
    """A stored payload's value. The payloads this library writes are compact JSON, read
    with the decoder's scanner alone (a claimed job's payload is decoded on the worker's
    hot path); anything else takes ``json.loads``. Malformed text is a PayloadError (a
    ValueError). A payload nested as deeply as an enqueuer could write is decoded too
    (``full_depth``); one still too deep for this process is a PayloadError as well (a
    worker fails such a job instead of ending its run)."""
    try:
        return _decode(text)  # directly: the worker's hot path
    except RecursionError:
        pass
    try:
        return _on_fresh_stack(_decode, text)  # (not full_depth: this stack just failed)
    except RecursionError:
        raise PayloadError("the stored payload is nested too deeply to decode as JSON") from None
