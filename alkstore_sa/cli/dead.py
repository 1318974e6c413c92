"""``alkstore dead list|show|requeue``: inspect and re-drive dead-lettered jobs."""

from __future__ import annotations

import argparse
from dataclasses import fields
from datetime import datetime
from typing import Any

from .._json_shown import hole, indented, strict, with_payloads
from .._rows import FIELD, job_from_row
from .._validate import decode_payload
from ..outbox import listed_queue
from ._common import Once, add_database_options, open_store
from ._shown import shown


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dead", help="list, show or requeue dead jobs")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = actions.add_parser("list", help="dead jobs of a queue, newest first")
    ls.add_argument("--queue", "-q", required=True, action=Once, hint="list one queue at a time",
                    help="the queue whose dead jobs to list")
    ls.add_argument("--limit", type=int, default=20, help="at most this many jobs (default 20)")
    ls.add_argument("--before", type=int, default=None, help="only ids below this (pagination)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of lines")
    show = actions.add_parser("show", help="one job (live or dead) in full")
    show.add_argument("job_id", type=int)
    requeue = actions.add_parser("requeue", help="enqueue dead jobs afresh (new ids)")
    requeue.add_argument("--queue", "-q", required=True, action=Once, hint="requeue from one queue at a time",
                         help="the queue the dead jobs belong to")
    requeue.add_argument("job_ids", type=int, nargs="+")
    for a in (ls, show, requeue):
        add_database_options(a)
    ls.set_defaults(func=run_list)
    show.set_defaults(func=run_show)
    requeue.set_defaults(func=run_requeue)


def _json(row: tuple[Any, ...], payloads: dict[str, Any]) -> dict[str, Any]:
    """A job row's fields as JSON values: its timestamps (its own and its error entries')
    as ISO 8601. Its payload is a ``hole`` recorded in ``payloads``, for ``_dumps``; a
    stored payload that is not JSON (a row edited by hand, which a worker fails) is null,
    with the text as stored and why it could not be decoded."""
    job = job_from_row(row, None)

    def plain(value: Any) -> Any:
        return value.isoformat() if isinstance(value, datetime) else value

    data = {f.name: plain(getattr(job, f.name)) for f in fields(job)}
    data["errors"] = [{k: plain(v) for k, v in entry.items()} for entry in job.errors]
    text = row[FIELD["payload"]]
    try:
        payload = decode_payload(text)
    except ValueError as exc:
        data.update(payload=None, stored_payload=text, payload_error=str(exc))
        return data
    data["payload"] = place = hole()
    payloads[place] = payload
    return data


def _dumps(rows: list[tuple[Any, ...]] | tuple[Any, ...]) -> str:
    """One job row, or a list of them, as ``json.dumps(..., indent=2)`` writes them, with
    payloads as deep as enqueue accepts (``_json_shown``)."""
    payloads: dict[str, Any] = {}
    document = [_json(r, payloads) for r in rows] if isinstance(rows, list) else _json(rows, payloads)
    return strict(indented(with_payloads(document, payloads)))


def run_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        # rows: the list needs no payload, and one that is not JSON must not hide the others
        rows = listed_queue(store, args.queue)._dead_rows(args.limit, args.before)
    finally:
        store.close()
    if args.json:
        print(_dumps(rows))
        return 0
    for j in (job_from_row(r, None) for r in rows):
        died = j.died_at.isoformat(timespec="seconds") if j.died_at else "-"
        # the handler's message escaped: its tabs and newlines cannot make columns or lines
        print(f"{j.id}\t{died}\tattempts={j.attempts}/{j.max_attempts}\t{shown(j.last_error)}")
    if not rows:
        print("(no dead jobs)")
    return 0


def run_show(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        row = store._job_row(args.job_id)
    finally:
        store.close()
    if row is None:
        print(f"no job {args.job_id}")
        return 1
    print(_dumps(row))
    return 0


def run_requeue(args: argparse.Namespace) -> int:
    store = open_store(args)
    missing = 0
    try:
        q = listed_queue(store, args.queue)
        # each id once, in the order given: a repeat would find its job requeued already
        # and report a failure for a request that was carried out
        for job_id in dict.fromkeys(args.job_ids):
            done = q._requeue_dead(job_id)
            if done is None:
                missing += 1
                print(f"{job_id}: no dead job with this id in {args.queue!r}")
            elif not done.moved:  # nothing written: the dead job stays, and this is not a success
                missing += 1
                print(
                    f"{job_id}: not requeued: live job {done.job_id} holds its unique key "
                    f"'{shown(done.unique_key)}' (the dead job stays)"
                )
            else:
                print(f"{job_id} -> {done.job_id}")
    finally:
        store.close()
    return 1 if missing else 0
