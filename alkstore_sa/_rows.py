"""Driver rows → Job values (one place that knows the column order)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any

from ._validate import decode_payload
from .model import Job
from .schema import JOB_FIELDS, UNREADABLE_HISTORY

FIELD = {f: i for i, f in enumerate(JOB_FIELDS)}
_I = FIELD
_STATE = len(JOB_FIELDS)


_UTC = timezone.utc
_fromtimestamp = datetime.fromtimestamp
NO_PAYLOAD: Any = object()  # "not decoded yet"
UNREADABLE_SHOWN = 200  # characters of an unreadable stored error history quoted in its entry
UNREADABLE_ENTRY = "the stored error history entry is unreadable: "


_FIRST = datetime.min.replace(tzinfo=_UTC)
_LAST = datetime.max.replace(tzinfo=_UTC)
FIRST_EPOCH = _FIRST.timestamp()
LAST_EPOCH = _LAST.timestamp()


def ts(value: float | None) -> datetime | None:
    """Epoch seconds as stored → an aware UTC datetime. A timestamp column is a float: one
    written by hand may name no date (``1e300``, an infinity, NaN); it reads as the
    calendar's first or last instant instead of failing the read — a claim that took the
    job, a listing of its queue. A value that is no number — NaN, which PostgreSQL stores,
    or text, which SQLite keeps in the column — reads as the last: each database orders
    it above every number, so such a deadline never passes (a claim never lapses, a lock
    is held, a job is never due), and reading it as year 1 showed it long passed."""
    if value is None:
        return None
    try:
        return _fromtimestamp(value, _UTC)
    except (OverflowError, OSError, ValueError):
        return _FIRST if value < 0 else _LAST
    except TypeError:
        return _LAST


def in_calendar(value: float) -> float:
    """Epoch seconds within the dates ``ts`` gives (NaN: the first), for arithmetic on a
    stored timestamp (an age) that must stay a finite number."""
    return FIRST_EPOCH if not value >= FIRST_EPOCH else min(value, LAST_EPOCH)


def number(value: Any) -> float:
    """A stored span (a stamp of seconds) as a float. SQLite keeps the text a hand-written
    UPDATE puts in a REAL column, and ``float()`` of it failed every reader of the job (a
    claim, a listing of its queue): text, naming no number, reads as NaN."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _float(value: float | None) -> float | None:
    return None if value is None else number(value)


def _errors(text: str) -> list[dict[str, Any]]:
    """A job's stored error history as entries. The column is text: one written or edited
    by hand may hold anything, and a read that raised on it failed every reader of the job —
    a worker's claim loop among them (its run() ended, the batch's claims lapsed, at every
    reclaim). A history that is not a JSON array reads as one entry saying so, quoting what
    is stored; in an array, each entry reads on its own (retry and fail append to an array
    as it is: one spoiled entry must not hide the entries written after it)."""
    if text == "[]":
        return []
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError):
        entries = None
    if not isinstance(entries, list):
        return [_unreadable(UNREADABLE_HISTORY, text)]
    return [_entry(e) for e in entries]


def _entry(e: Any) -> dict[str, Any]:
    """One entry of a history that is an array: as written (``attempt`` an int, ``error`` a
    str, ``at`` a number; the first and last null in an entry keeping an unreadable
    history), or else an entry saying it is unreadable, quoting it."""
    if isinstance(e, dict) and e.keys() >= {"attempt", "error", "at"}:
        attempt, error, at = e["attempt"], e["error"], e["at"]
        if (
            isinstance(error, str)
            and (attempt is None or type(attempt) is int)
            and (at is None or type(at) in (int, float))
        ):
            return {"attempt": attempt, "error": error, "at": ts(at)}
    try:
        shown = json.dumps(e, ensure_ascii=False)
    except (ValueError, RecursionError):
        shown = "..."
    return _unreadable(UNREADABLE_ENTRY, shown)


def _unreadable(phrase: str, text: str) -> dict[str, Any]:
    shown = text if len(text) <= UNREADABLE_SHOWN else text[:UNREADABLE_SHOWN] + "..."
    return {"attempt": None, "error": f"{phrase}{shown!r}", "at": None}


def job_from_row(row: tuple[Any, ...], payload: Any = NO_PAYLOAD) -> Job:
    """A row laid out as JOB_FIELDS + state (+ last_error, died_at for dead rows);
    ``payload`` when the caller already decoded it."""
    dead = row[_STATE] == "dead"
    return Job(
        id=row[0],
        queue=row[_I["queue"]],
        state=row[_STATE],
        payload=decode_payload(row[_I["payload"]]) if payload is NO_PAYLOAD else payload,
        priority=row[_I["priority"]],
        attempts=row[_I["attempts"]],
        max_attempts=row[_I["max_attempts"]],
        visibility_timeout=number(row[_I["visibility_timeout"]]),
        backoff_base=number(row[_I["backoff_base"]]),
        dead_letter_retention=_float(row[_I["dead_letter_retention"]]),
        created_at=ts(row[_I["created_at"]]),  # type: ignore[arg-type]
        run_at=ts(row[_I["run_at"]]),  # type: ignore[arg-type]
        claimed_at=ts(row[_I["claimed_at"]]),
        claim_expires_at=ts(row[_I["claim_expires_at"]]),
        worker_id=row[_I["worker_id"]],
        expires_at=ts(row[_I["expires_at"]]),
        errors=_errors(row[_I["errors"]]),
        last_error=row[_STATE + 1] if dead else None,
        died_at=ts(row[_STATE + 2]) if dead else None,
        unique_key=row[_I["unique_key"]],
        trace_context=row[_I["trace_context"]],
    )


_BY_RUN_AT_ID = itemgetter(_I["run_at"], 0)
_BY_PRIORITY = itemgetter(_I["priority"])


def sort_claim_order(rows: list[tuple[Any, ...]]) -> None:
    """Sort claimed rows in place into claim order (priority DESC, run_at, id): RETURNING
    does not promise any order. Two stable sorts on C key functions (a reversed sort keeps
    equal keys in their order) instead of a Python key per row."""
    rows.sort(key=_BY_RUN_AT_ID)
    rows.sort(key=_BY_PRIORITY, reverse=True)
