"""Prometheus metrics (SPEC §15), an optional extra: ``pip install 'alkstore-sa[metrics]'``.

- ``Collector(store)``: a ``prometheus_client`` collector reading the queues from the
  database at scrape time, in one statement (``registry.register(Collector(store))``):
  ``alkstore_jobs{queue,state}`` (state: ready, scheduled, processing, dead) and
  ``alkstore_oldest_ready_age_seconds{queue}``.
- ``instrument()``: from then on the workers of this process record
  ``alkstore_jobs_processed_total{queue,outcome}`` (outcome: acked, retried, dead, lost),
  ``alkstore_job_duration_seconds{queue}`` (handler run time) and
  ``alkstore_job_wait_seconds{queue}`` (claim time minus ``run_at``) into module-level
  metrics of ``prometheus_client``'s default registry.

``alkstore worker --metrics-port N`` does both and serves them. Importing ``alkstore_sa``
never imports this module or ``prometheus_client``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from . import _validate as v
from .errors import AlkstoreError, InvalidOptions, MissingExtra

try:
    from prometheus_client import REGISTRY, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
except ImportError as exc:
    raise MissingExtra(
        "alkstore_sa.metrics needs prometheus_client: pip install 'alkstore-sa[metrics]'"
    ) from exc

from ._gauges import QueueGauges, read_gauges
from .store import Store
from .worker import observe

if TYPE_CHECKING:
    from .queue import JobHandle

log = logging.getLogger("alkstore_sa")

STATES = ("ready", "scheduled", "processing", "dead")
OUTCOMES = (observe.ACKED, observe.RETRIED, observe.DEAD, observe.LOST)

# Handler run times: from quick calls to hour-long jobs.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# Time from run_at to the claim: a healthy queue stays in the first buckets, a backlog
# climbs through minutes and hours.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)

JOBS_PROCESSED = Counter(
    "alkstore_jobs_processed",  # exposed as alkstore_jobs_processed_total
    "Jobs whose outcome a worker recorded, by how it landed (lost: the claim was gone first).",
    ["queue", "outcome"],
)
JOB_DURATION = Histogram(
    "alkstore_job_duration_seconds", "How long handlers ran, in seconds.", ["queue"],
    buckets=DURATION_BUCKETS,
)
JOB_WAIT = Histogram(
    "alkstore_job_wait_seconds", "From a job's run_at to its claim by a worker, in seconds.", ["queue"],
    buckets=WAIT_BUCKETS,
)


class Collector:
    """The queue gauges of ``store``'s database, read at each scrape in ONE statement that
    counts index entries (see docs/operations.md for its cost).

    A queue seen once keeps being reported (with zeros) after its last job is gone, so a
    drained queue shows 0 rather than vanishing from graphs. A failed read is logged and
    leaves the gauges out of that scrape; the process's other metrics are still served.
    """

    def __init__(self, store: Store) -> None:
        self.store = v.store(store, "Collector(store): store")  # else registered fine, and every scrape failed
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # scrapes may run at once (a threaded HTTP server)

    def describe(self) -> Iterable[Metric]:
        """The metric names, without reading the database (what ``register`` checks)."""
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        try:
            gauges = read_gauges(self.store)
        except AlkstoreError as exc:
            log.warning("metrics: reading the queue gauges failed: %s", exc)
            gauges = None
        jobs, oldest = self._families()
        if gauges is not None:
            with self._lock:
                self._seen.update(gauges)
                seen = sorted(self._seen)
            for queue in seen:
                g = gauges.get(queue, QueueGauges())
                for state, n in zip(STATES, (g.ready, g.scheduled, g.processing, g.dead), strict=True):
                    jobs.add_metric([queue, state], n)
                oldest.add_metric([queue], g.oldest_ready_age)
        yield jobs
        yield oldest

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "alkstore_jobs", "Jobs by queue and state (ready, scheduled, processing, dead).",
                labels=["queue", "state"],
            ),
            GaugeMetricFamily(
                "alkstore_oldest_ready_age_seconds",
                "Seconds since the run_at of the queue's oldest ready job (0 when none is ready).",
                labels=["queue"],
            ),
        )


class _Recorder:
    """The worker observer that records into the module-level metrics."""

    def started(self, claim: JobHandle) -> None:
        JOB_WAIT.labels(claim._queue.name).observe(claim._wait)

    def finished(self, claim: JobHandle, outcome: str, duration: float | None) -> None:
        queue = claim._queue.name
        JOBS_PROCESSED.labels(queue, outcome).inc()
        if duration is not None:
            JOB_DURATION.labels(queue).observe(duration)


def instrument() -> None:
    """Record the jobs the workers of this process run into the module-level metrics
    (idempotent). Serve them with ``prometheus_client`` as usual."""
    if not isinstance(observe.observer, _Recorder):
        observe.install(_Recorder())


def uninstrument() -> None:
    """Stop recording (what was recorded stays in the metrics)."""
    if isinstance(observe.observer, _Recorder):
        observe.install(None)


def serve(store: Store, port: int, addr: str = "127.0.0.1") -> object:
    """Record worker metrics and serve them with ``store``'s gauges at
    ``http://ADDR:PORT/metrics`` from a daemon thread, on the default registry; returns the
    HTTP server (``.shutdown()`` stops it). Once per process: the default registry takes
    one set of alkstore's gauges (a second call is InvalidOptions), and nothing is switched
    on until the port is bound."""
    from prometheus_client import start_http_server

    collector = Collector(store)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        # checked here: the socket layer's own errors for these vary (TypeError, gaierror,
        # OverflowError, OSError) and came after the metrics were switched on
        raise InvalidOptions(f"serve(store, port): port must be an int from 0 to 65535 (0: any free one), got {port!r}")
    if not isinstance(addr, str) or not addr:
        raise InvalidOptions(f"serve(store, port, addr): addr must be a host name or address, got {addr!r}")
    try:
        REGISTRY.register(collector)
    except ValueError:  # prometheus_client's DuplicateTimeseries: the names are taken
        raise InvalidOptions(
            "serve(store, port): the default registry serves alkstore's gauges already (an "
            "earlier serve() in this process, or a Collector registered on it): serve that "
            "registry as it is, or use a registry of your own for a second store"
        ) from None
    try:
        started = start_http_server(port, addr=addr)
    except BaseException:
        REGISTRY.unregister(collector)
        raise
    instrument()  # only now: a serve that failed (a port taken, a host unknown) changed nothing
    # prometheus_client >= 0.19 returns (server, thread); older versions return nothing
    return started[0] if isinstance(started, tuple) else None


__all__ = ["Collector", "instrument", "serve", "uninstrument"]
