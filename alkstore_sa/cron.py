"""Cron schedules (SPEC §14): the 5-field grammar with its ``@hourly``… aliases, and the
next fire instant of an expression in an IANA zone under the pinned daylight-saving rules.

The rules, stated on instants: the wall-clock times an expression matches are mapped each
to the **first instant whose wall-clock time in the zone is at or after it**. A normal time
maps to its instant; a time skipped by a spring-forward maps to the first instant after
the gap; a time that occurs twice in a fall-back maps to its first occurrence, so the
repeated hour's second pass fires nothing. The fire instants are the set of those images:
several wall-clock times landing on one instant (the skipped times and the time right
after a gap) are one fire, and each instant fires at most once.

Why not a library: croniter and cronsim both fire a repeated fall-back hour twice for
sub-daily expressions (cronsim follows Debian cron's granularity rule; croniter also fires a
daily 02:30 twice), and both accept syntax outside SPEC §14 (seconds, ``L``, ``W``, ``#``).
The parser is small; the calendar search jumps month → day → hour → minute, so a rare
expression (``0 0 29 2 *``) is found in a few hundred steps, never minute by minute.
"""

from __future__ import annotations

import calendar
import math
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidSpec

ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MONTHS = {m.upper(): i for i, m in enumerate(calendar.month_abbr) if m}  # JAN=1 … DEC=12
_DAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
# (name, lowest, highest, names): day of week accepts 7 as a second Sunday
_FIELDS = (
    ("minute", 0, 59, None), ("hour", 0, 23, None), ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS),
)
_ITEM = re.compile(r"(\*|[0-9A-Za-z]+(?:-[0-9A-Za-z]+)?)(?:/([0-9]+))?", re.ASCII)
_FIELD_SEP = re.compile(r"[ \t]+")
_LONGEST_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February in a leap year
# Zone keys that name the host's own configuration, not a place: two runner hosts would
# disagree on them.
_HOST_KEYS = frozenset({"localtime", "posixrules"})
# A valid expression fires within 8 years (29 Feb); a search this long means a bug, not a wait.
_SEARCH_YEARS = 400
UTC = timezone.utc


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the matching values of each field, sorted, and how the two day
    fields combine (``day_or``: both restricted, so a day matches if either does)."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday (a 7 in the spec is folded into 0)
    day_or: bool

    def day_matches(self, d: date) -> bool:
        dom = d.day in self.days
        dow = d.isoweekday() % 7 in self.weekdays
        return (dom or dow) if self.day_or else (dom and dow)


def is_cron(spec: object) -> bool:
    """Whether ``spec`` is meant as a cron expression (an alias or fields) rather than ``@every``."""
    return isinstance(spec, str) and not spec.startswith("@every")


@lru_cache(maxsize=256)
def parse(spec: str) -> Cron:
    """Parse a 5-field expression or an alias; InvalidSpec (``.spec`` = ``spec``) otherwise."""
    text = ALIASES.get(spec, spec)
    if text.startswith("@"):
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: unknown alias")
    fields = _FIELD_SEP.split(text)
    if len(fields) != 5 or "" in fields:
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: a cron expression has 5 fields")
    values = [_field(spec, text_, *meta) for text_, meta in zip(fields, _FIELDS, strict=True)]
    minutes, hours, days, months, weekdays = values
    weekdays = {d % 7 for d in weekdays}
    # crontab(5): a day field is "restricted" unless it starts with "*" (so */2 is not)
    day_or = not fields[2].startswith("*") and not fields[4].startswith("*")
    if not day_or and not any(min(days) <= _LONGEST_MONTH[m] for m in months):
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: the day of month never occurs in its months")
    return Cron(
        tuple(sorted(minutes)), tuple(sorted(hours)), frozenset(days), tuple(sorted(months)),
        frozenset(weekdays), day_or,
    )


def _field(spec: str, text: str, name: str, lo: int, hi: int, names: dict[str, int] | None) -> set[int]:
    """The values one field matches: a comma list of ``*``, ``a``, ``a-b``, each with an
    optional ``/step`` (``a/step`` runs from ``a`` to the field's end)."""
    out: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: bad {name} {item!r}")
        body, step_text = match.groups()
        top = 6 if name == "day of week" else hi  # "*" and "a/step" run to Saturday, not to 7
        if body == "*":
            first, last = lo, top
        else:
            first_text, _, last_text = body.partition("-")
            first = _value(spec, first_text, name, lo, hi, names)
            last = _value(spec, last_text, name, lo, hi, names) if last_text else (top if step_text else first)
            if first > last:
                raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: {name} range {body!r} runs backwards")
        step = 1 if step_text is None else int(step_text) if len(step_text) <= 2 else 0
        if not 1 <= step <= hi - lo + 1:
            raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: {name} step {step_text!r} out of range")
        out.update(range(first, last + 1, step))
    return out


def _value(spec: str, text: str, name: str, lo: int, hi: int, names: dict[str, int] | None) -> int:
    if text.isdigit() and len(text) <= 2:
        value = int(text)
    elif names is not None and text.upper() in names:
        value = names[text.upper()]
    else:
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: bad {name} {text!r}")
    if not lo <= value <= hi:
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: {name} {value} is outside {lo}-{hi}")
    return value


def zone(spec: object, tz: object) -> tzinfo:
    """The IANA zone ``tz`` (UTC needs no time zone database); InvalidSpec when unknown."""
    if tz == "UTC":
        return UTC
    if not isinstance(tz, str) or tz in _HOST_KEYS:
        raise InvalidSpec(spec, f"invalid schedule time zone {tz!r}: expected an IANA zone name")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # unknown, malformed, unreadable
        raise InvalidSpec(spec, f"unknown schedule time zone {tz!r}: {exc}") from None


def next_wall(cron: Cron, after: datetime) -> datetime:
    """The first matching wall-clock minute strictly after the naive ``after``."""
    t = after.replace(second=0, microsecond=0, fold=0) + timedelta(minutes=1)
    limit = t.year + _SEARCH_YEARS
    while t.year <= limit:
        if t.month not in cron.months:
            i = bisect_left(cron.months, t.month)
            year, month = (t.year, cron.months[i]) if i < len(cron.months) else (t.year + 1, cron.months[0])
            t = datetime(year, month, 1)
            continue
        if not cron.day_matches(t.date()):
            t = datetime(t.year, t.month, t.day) + timedelta(days=1)
            continue
        i = bisect_left(cron.hours, t.hour)
        if i == len(cron.hours):
            t = datetime(t.year, t.month, t.day) + timedelta(days=1)
            continue
        if cron.hours[i] != t.hour:
            t = t.replace(hour=cron.hours[i], minute=0)
        i = bisect_left(cron.minutes, t.minute)
        if i == len(cron.minutes):
            t = t.replace(minute=0) + timedelta(hours=1)
            continue
        return t.replace(minute=cron.minutes[i])
    raise ValueError(f"no match within {_SEARCH_YEARS} years")


def fire_instant(wall: datetime, tz: tzinfo) -> float:
    """The first instant (epoch seconds) whose wall-clock time in ``tz`` is at or after the
    naive ``wall``: its instant, the first occurrence of a repeated time, or the end of the
    gap that skipped it."""
    first = wall.replace(tzinfo=tz, fold=0)  # PEP 495: fold=0 is the earlier of two occurrences
    at = first.timestamp()
    if tz is UTC or datetime.fromtimestamp(at, tz).replace(tzinfo=None, fold=0) == wall:
        return at
    # ``wall`` falls in a gap: the transition lies between its readings by either offset;
    # find the first second whose wall-clock time reaches it (a gap spans hours at most).
    lo, hi = sorted((int(at), int(wall.replace(tzinfo=tz, fold=1).timestamp())))
    while lo < hi:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).replace(tzinfo=None, fold=0) >= wall:
            hi = mid
        else:
            lo = mid + 1
    return float(lo)


def next_fire(cron: Cron, tz: tzinfo, after: float) -> float:
    """The first fire instant strictly after ``after`` (epoch seconds)."""
    # Fire instants are whole seconds (whole minutes, offsets of whole seconds, gaps ended
    # on a second), so the first one after ``after`` is the first one after its second,
    # whose wall-clock time reads exactly: fromtimestamp rounds a fraction to microseconds,
    # and a reading 0.3 µs short of a minute would show that minute and skip its fire.
    after = math.floor(after)
    wall = next_wall(cron, datetime.fromtimestamp(after, tz).replace(tzinfo=None, fold=0))
    # Only a wall time past every wall-clock time already shown can fire after ``after``:
    # after a fall-back the clock shows earlier times again, whose fires are behind us.
    while (at := fire_instant(wall, tz)) <= after:
        wall = next_wall(cron, wall)
    return at
