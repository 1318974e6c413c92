"""``alkstore schedules`` (list) and ``alkstore run-schedules`` (a scheduler runner)."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import datetime
from typing import Any

from .._json_shown import strict
from .._validate import decode_payload, lease
from ..cron import zone
from ..errors import AlkstoreError, InvalidOptions, LeadershipLost
from ..model import Schedule
from ._common import add_database_options, open_store, stop_on_signals
from ._errors import UsageError
from ._shown import shown

log = logging.getLogger("alkstore_sa")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ls = sub.add_parser("schedules", help="list the registered schedules")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_database_options(ls)
    ls.set_defaults(func=run_list)
    runner = sub.add_parser("run-schedules", help="fire schedules while leading (run several for failover)")
    runner.add_argument("--lease", type=float, default=30.0, help="leadership lease in seconds (default 30)")
    add_database_options(runner)
    runner.set_defaults(func=run_runner)


def run_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        # as stored: one payload that is not JSON (a row edited by hand) hides no schedule
        schedules = store._scheduler().stored()
    finally:
        store.close()
    if args.json:
        print(strict(json.dumps([_json(s, text) for s, text in schedules], indent=2)))
        return 0
    for s, _ in schedules:
        where = "" if s.tz == "UTC" else f" ({shown(s.tz)})"
        fields = (shown(s.name), shown(s.spec), f"-> {shown(s.queue)}", f"next {local_next(s).isoformat(timespec='seconds')}{where}")
        print("\t".join(fields))
    if not schedules:
        print("(no schedules)")
    return 0


def _json(s: Schedule, text: str) -> dict[str, Any]:
    """A schedule's fields; a stored payload that is not JSON is null, with the text as
    stored and why it could not be decoded."""
    data: dict[str, Any] = {"name": s.name, "spec": s.spec, "tz": s.tz, "queue": s.queue}
    try:
        data["payload"] = decode_payload(text)
    except ValueError as exc:
        data.update(payload=None, stored_payload=text, payload_error=str(exc))
    data.update(
        priority=s.priority, max_attempts=s.max_attempts, expires=s.expires,
        next_fire_at=s.next_fire_at.isoformat(), next_fire_local=local_next(s).isoformat(),
    )
    return data


def local_next(s: Schedule) -> datetime:
    """The next fire as the schedule's zone shows it; in UTC when this host does not know
    the zone, or for a row an older runner parked at the end of year 9999 (docs/scheduler.md)."""
    try:
        return s.next_fire_at.astimezone(zone(s.spec, s.tz))
    except (AlkstoreError, OverflowError, ValueError):
        return s.next_fire_at


def run_runner(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (exit 0). Database outages are ridden out inside
    ``run_schedules``; a lost lease sends this runner back to waiting as a standby. A bad
    ``--lease`` is a usage error naming the option, before the store is opened (as the
    worker's options are)."""
    try:
        seconds = lease(args.lease, "--lease")
    except InvalidOptions as exc:
        raise UsageError(f"{exc}; see alkstore run-schedules --help") from None
    store = open_store(args)
    stop = stop_on_signals()
    try:
        while not stop.stopped:
            try:
                store.run_schedules(stop, lease=seconds)
            except LeadershipLost as exc:
                log.warning("%s; waiting to lead again", exc)
    finally:
        store.close()
    return 0
