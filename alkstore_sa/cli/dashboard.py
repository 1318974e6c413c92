"""``alkstore dashboard``: serve the operations dashboard alone until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import ipaddress
import logging

from ._common import add_database_options, open_store, stop_on_signals
from ._errors import UsageError, notice

log = logging.getLogger("alkstore_sa.cli")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dashboard",
        help="serve the web dashboard (queues, jobs, dead letters, schedules, workers, streams)",
        description="Serve the operations dashboard. It has no login: bind it to localhost "
        "(the default) or put it behind your own authentication (docs/operations.md).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any non-loopback one is warned about)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--read-only", action="store_true", help="show no actions; refuse every POST")
    add_database_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be a TCP port between 0 and 65535, got {args.port}")
    from ..dashboard import create_wsgi_app
    from ..dashboard.server import make_server, serve_until, served_url

    host = args.host
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it
        host = host[1:-1]

    store = open_store(args)
    try:
        store.check_schema()  # a missing or old schema is said now, not on the first page view
        try:
            server = make_server(create_wsgi_app(store, read_only=args.read_only), host, args.port)
        except OSError as exc:  # e.g. the port is taken: the one-line error, exit 1
            raise OSError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from exc
        bound = str(server.server_address[0])  # "" (every interface) is 0.0.0.0 here
        if not _loopback(bound):
            # not refused (a container or a trusted network may want it), but never silent
            log.warning(
                "the dashboard has no login: listening on %s, anyone who reaches it can see "
                "payloads%s; bind to 127.0.0.1 or put authentication in front (docs/operations.md)",
                bound, "" if args.read_only else " and requeue, delete and cancel jobs",
            )
        stop = stop_on_signals("stopping the dashboard")
        mode = " (read-only)" if args.read_only else ""
        notice(f"alkstore dashboard: serving {served_url(server)}{mode}")
        serve_until(server, stop)
    finally:
        store.close()
    return 0


def _loopback(address: str) -> bool:
    """Whether the address the server bound (a host name already resolved) is a loopback
    one: reachable from this machine only."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
