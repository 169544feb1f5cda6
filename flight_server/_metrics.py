"""Prometheus metrics of a storage server, and the HTTP endpoint that serves a registry.

Each :class:`ServerMetrics` has its own ``CollectorRegistry`` (several servers share a process in tests
and in ``LocalCluster(processes=False)``), holding:

* a collector that reads the store at scrape time (:class:`StoreCollector`): groups and bytes held,
  capacity, reservations, in-flight puts, tombstones, and the store's own counts of groups put, read and
  deleted (counted under the store's lock, whatever the route: Flight, a same-host segment, the socket);
* per request, a latency histogram ``trajflight_server_request_seconds{op}`` and
  ``trajflight_server_requests_total{op,outcome}`` (``ok``, ``refused`` or ``error``), updated on the hot
  path (about a microsecond each);
* ``trajflight_server_refusals_total{reason}``, every reason of
  :data:`~trajflight.refusals.REFUSAL_REASONS` exported from the start; :meth:`ServerMetrics.count_refusal`
  is the hook credential checks call.

A ``do_get`` is timed until its stream is handed to Flight (C++ then streams it): the histogram measures
the server's own work, not the transfer. It does not guarantee that counters survive a restart (they are
process-local, as Prometheus expects).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trajflight.errors import InvalidRequestError
from trajflight.refusals import REFUSAL_REASONS, check_reason, refusal_reason

__all__ = ["LATENCY_BUCKETS", "MetricsEndpoint", "ServerMetrics", "StoreCollector"]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds (seconds) of the latency histograms: 100 us to 2.5 s."""

_OUTCOMES = ("ok", "refused", "error")


class StoreCollector(Collector):
    """Gauges and counters read from a store's ``stats()`` at scrape time (nothing on the hot path)."""

    def __init__(self, stats: Callable[[], dict[str, Any]], server: str) -> None:
        self._stats = stats
        self._server = server

    def collect(self) -> Iterable[Metric]:
        """One sample per figure, labelled with the server's location (and the job, per job)."""
        s = self._stats()
        lab, val = ["server"], [self._server]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"trajflight_server_{name}", doc, labels=lab)
            g.add_metric(val, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"trajflight_server_{name}", doc, labels=lab)
            c.add_metric(val, value)
            return c

        yield gauge("groups", "Groups stored on this server.", s["groups"])
        yield gauge("bytes", "Bytes held: the stored groups' Arrow IPC streams.", s["bytes"])
        yield gauge("reserved_bytes", "Bytes reserved by puts in flight.", s["reserved_bytes"])
        yield gauge("capacity_bytes", "Bytes this server may hold.", s["capacity_bytes"])
        yield gauge("capacity_groups", "Groups this server may hold.", s["capacity_groups"])
        yield gauge("free_bytes", "Capacity left: capacity less held and reserved bytes.", s["free_bytes"])
        yield gauge(
            "pending_puts",
            "Puts in flight (Flight and same-host).",
            s["pending_puts"] + s["pending_shm_puts"],
        )
        yield gauge("pending_appends", "Column appends in flight.", s["pending_appends"])
        tomb = s.get("tombstones") or {}
        yield gauge(
            "tombstone_ranges",
            "Ranges of deleted keys remembered to refuse late puts.",
            tomb.get("ranges", 0),
        )
        yield counter("groups_put", "Groups published, every route.", s["groups_put"])
        yield counter("bytes_put", "Bytes of the groups published.", s["bytes_put"])
        yield counter("groups_read", "Groups handed to readers (do_get or same-host).", s["groups_read"])
        yield counter("bytes_read", "Stored bytes of the groups handed to readers.", s["bytes_read"])
        yield counter("groups_deleted", "Groups deleted or purged.", s["groups_deleted"])
        per_job = GaugeMetricFamily(
            "trajflight_server_job_groups", "Groups stored per job.", labels=["server", "job"]
        )
        per_job_bytes = GaugeMetricFamily(
            "trajflight_server_job_bytes", "Bytes held per job.", labels=["server", "job"]
        )
        for job, figures in sorted(s["jobs"].items()):
            per_job.add_metric([self._server, job], figures["groups"])
            per_job_bytes.add_metric([self._server, job], figures["bytes"])
        yield per_job
        yield per_job_bytes


class ServerMetrics:
    """The metrics of one storage server (see the module docstring).

    Args:
        stats: The store's ``stats()``, read at every scrape.
        server: The server's location, the ``server`` label of every sample.
    """

    def __init__(self, stats: Callable[[], dict[str, Any]], server: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StoreCollector(stats, server))
        self._latency = Histogram(
            "trajflight_server_request_seconds",
            "Time a storage server spends on a request, by operation.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._requests = Counter(
            "trajflight_server_requests",
            "Requests by operation and outcome (ok, refused, error).",
            ["op", "outcome"],
            registry=self.registry,
        )
        self._refusals = Counter(
            "trajflight_server_refusals",
            "Requests refused, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._by_reason = {r: self._refusals.labels(r) for r in REFUSAL_REASONS}
        self._children: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def _child(self, op: str) -> tuple[Any, dict[str, Any]]:
        child = self._children.get(op)
        if child is None:
            with self._lock:
                child = self._children.get(op)
                if child is None:
                    outcomes = {o: self._requests.labels(op, o) for o in _OUTCOMES}
                    child = self._children[op] = (self._latency.labels(op), outcomes)
        return child

    def count_refusal(self, reason: str) -> None:
        """Count one refused request of ``reason`` (one of :data:`~trajflight.refusals.REFUSAL_REASONS`).

        Raises:
            InvalidRequestError: an unknown reason.
        """
        self._by_reason[check_reason(reason)].inc()

    def timed(self, op: str) -> _Timing:
        """A context manager that times its block as a request ``op``; an exception counts as
        ``refused`` (with its reason) or ``error``, and propagates."""
        latency, outcomes = self._child(op)
        return _Timing(latency, outcomes, self._by_reason)


class _Timing:
    """One timed request (see :meth:`ServerMetrics.timed`): a class, not a generator, to stay cheap."""

    __slots__ = ("_by_reason", "_latency", "_outcomes", "_start")

    def __init__(self, latency: Any, outcomes: dict[str, Any], by_reason: dict[str, Any]) -> None:
        self._latency, self._outcomes, self._by_reason = latency, outcomes, by_reason
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._latency.observe(time.perf_counter() - self._start)
        if exc is None:
            self._outcomes["ok"].inc()
            return
        reason = refusal_reason(exc)
        if reason is not None:
            self._by_reason[reason].inc()
        self._outcomes["error" if reason is None else "refused"].inc()


class MetricsEndpoint:
    """A Prometheus HTTP endpoint (``/metrics``) serving one registry, from a daemon thread.

    Args:
        registry: What it serves.
        host: Interface to bind (loopback by default).
        port: TCP port; 0 picks a free one (see :attr:`port`).

    Raises:
        InvalidRequestError: ``port`` is not in 0..65535, or it cannot be bound (in use).
    """

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise InvalidRequestError(f"metrics port must be an int in 0..65535, got {port!r}", field="port")
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise InvalidRequestError(
                f"the metrics endpoint could not listen on {host}:{port} ({exc}); pick another metrics "
                "port, or 0 for a free one",
                field="port",
            ) from exc
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._closed = False

    @property
    def url(self) -> str:
        """``http://host:port/metrics``: what Prometheus scrapes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
