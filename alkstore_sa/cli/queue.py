"""``alkstore queue pause|resume|limit``: change a queue's settings (SPEC §14), which every
worker process obeys at its next claim; a resume or a changed limit wakes idle workers."""

from __future__ import annotations

import argparse
import math

from .. import _limits
from .. import _validate as v
from ..model import QueueSettings
from ..outbox import listed_queue
from ._common import Once, add_database_options, open_store
from ._errors import UsageError
from ._shown import shown

NONE = "none"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("queue", help="pause, resume or limit a queue (shared by every worker)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    pause = actions.add_parser("pause", help="hand out no jobs until resumed (enqueues still land)")
    resume = actions.add_parser("resume", help="hand out jobs again (wakes idle workers)")
    limit = actions.add_parser(
        "limit", help="set or remove the queue's concurrency and rate limits",
        description="Set the limits of a queue; an option left out keeps its current setting.",
    )
    limit.add_argument(
        "--concurrency", type=_concurrency, action=Once, metavar="N|none",
        help="at most N jobs of the queue running at once, across every worker ('none' removes it)",
    )
    limit.add_argument(
        "--rate", type=_rate, action=Once, metavar="N/SECONDS|none",
        help="at most N jobs handed out in any SECONDS (fractions allowed: 5/0.5); 'none' removes it",
    )
    for a in (pause, resume, limit):
        a.add_argument("queue", help="the queue's name")
        add_database_options(a)
    pause.set_defaults(func=run_pause)
    resume.set_defaults(func=run_resume)
    limit.set_defaults(func=run_limit)


def _concurrency(text: str) -> int | str:
    if text.strip().lower() == NONE:
        return NONE  # not None: that is "option not given"
    try:
        n = v.int_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of jobs or 'none', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"the limit must be at least 1 (or 'none' to remove it), got {n}")
    if n > v.INT32_MAX:  # the library's range, said under the option's name
        raise argparse.ArgumentTypeError(f"the limit must be at most {v.INT32_MAX}, got {n}")
    return n


def _rate(text: str) -> tuple[int, float] | str:
    if text.strip().lower() == NONE:
        return NONE
    limit, slash, seconds = text.partition("/")
    if not slash:
        raise argparse.ArgumentTypeError(f"expected N/SECONDS (e.g. 100/60) or 'none', got {text!r}")
    try:
        n, per = v.int_text(limit), v.float_text(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/SECONDS with a whole N and a number of seconds, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"the rate must allow at least 1 job, got {n}")
    if n > v.INT32_MAX:
        raise argparse.ArgumentTypeError(f"the rate must allow at most {v.INT32_MAX} jobs, got {n}")
    if not math.isfinite(per) or per <= 0:
        raise argparse.ArgumentTypeError(f"the window must be a positive number of seconds, got {seconds!r}")
    if per < v.MIN_LEASE:
        raise argparse.ArgumentTypeError(
            f"the window must be at least {v.MIN_LEASE:g} seconds (timestamps have millisecond "
            f"precision), got {seconds!r}"
        )
    if per > v.MAX_DURATION:
        raise argparse.ArgumentTypeError(f"the window must be at most 100 years, got {seconds!r} seconds")
    return n, per


describe = _limits.describe  # one wording of a queue's settings, shared with the dashboard


def _change(args: argparse.Namespace, **change: object) -> int:
    # validated in full (name, values) before the one transaction that writes them
    params, fields = _limits.change_params(**change)
    store = open_store(args)
    try:
        settings = _limits.update(listed_queue(store, args.queue), params, fields)
    finally:
        store.close()
    print(f"{shown(args.queue)}: {describe(settings) if settings != QueueSettings() else 'no settings'}")
    return 0


def run_pause(args: argparse.Namespace) -> int:
    return _change(args, paused=True)


def run_resume(args: argparse.Namespace) -> int:
    return _change(args, paused=False)


def run_limit(args: argparse.Namespace) -> int:
    change: dict[str, object] = {}
    if args.concurrency is not None:
        change["concurrency"] = None if args.concurrency == NONE else args.concurrency
    if args.rate is not None:
        change["rate_limit"], change["per"] = (None, None) if args.rate == NONE else args.rate
    if not change:
        raise UsageError("give --concurrency N|none and/or --rate N/SECONDS|none (see `alkstore queue limit --help`)")
    return _change(args, **change)
