"""Prometheus metrics of the controller: the ledger read at scrape time, calls timed on the hot path.

:class:`ControllerMetrics` has its own ``CollectorRegistry`` (several controllers share a process in
tests). It holds:

* :class:`LedgerCollector`, which reads the ledger when Prometheus scrapes (under the host's lock, through
  the ``read`` callable the host gives): groups by job and state, ``UNKNOWN`` groups, bytes and groups held
  against each job's and each storage server's capacity, live leases, the GC and fence backlogs, commits,
  deletes, lost and purged groups, leases ended by reason (``expired`` among them);
* per operation (every command of :mod:`._commands`, the sweeper's included), a latency histogram
  ``trajflight_controller_call_seconds{op}`` and ``trajflight_controller_calls_total{op,outcome}``, kept
  as plain numbers (the host serialises calls) and turned into families at scrape time;
* hot-path counters of what the calls did: ``trajflight_groups_published_total``,
  ``trajflight_leases_granted_total``, ``trajflight_groups_leased_total``;
* ``trajflight_controller_refusals_total{reason}`` (every reason exported from the start);
  :meth:`ControllerMetrics.count_refusal` is the hook credential checks call.

No figure is kept in the ledger for metrics' sake: counters of calls start at zero in each process (a
recovered controller counts again from zero; the ledger's own totals, such as commits, carry over).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import accumulate
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from trajflight.refusals import REFUSAL_REASONS, check_reason, refusal_reason

from ._commands import COMMANDS, Command
from ._ledger import Ledger
from ._records import GroupState

__all__ = ["LATENCY_BUCKETS", "ControllerMetrics", "LedgerCollector"]

R = TypeVar("R")

LATENCY_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5)
"""Upper bounds (seconds) of the controller's call latency: the ledger's own work, 10 us to 0.5 s."""


_PER_JOB: tuple[tuple[str, str, bool, Callable[[dict[str, Any]], Any]], ...] = (
    # (name, help, gauge (else counter), the value in a job's figures of Ledger.figures())
    (
        "trajflight_unknown_groups",
        "Groups UNKNOWN (left by a lease that ended in training).",
        True,
        lambda j: j["counts"].get(GroupState.UNKNOWN.value, 0),
    ),
    ("trajflight_job_bytes", "Bytes a job holds (reserved or stored).", True, lambda j: j["usage"][0]),
    ("trajflight_job_held_groups", "Groups a job holds, not yet deleted.", True, lambda j: j["usage"][1]),
    (
        "trajflight_job_capacity_bytes",
        "A job's byte bound (if it has one).",
        True,
        lambda j: j["capacity"][0],
    ),
    (
        "trajflight_job_capacity_groups",
        "A job's group bound (if it has one).",
        True,
        lambda j: j["capacity"][1],
    ),
    ("trajflight_gc_backlog", "Groups waiting for a confirmed delete.", True, lambda j: j["gc"]),
    ("trajflight_live_leases", "Leases held now.", True, lambda j: j["leases"]),
    (
        "trajflight_kept_groups",
        "Committed groups kept for a restore.",
        True,
        lambda j: j["counts"].get("kept", 0),
    ),
    (
        "trajflight_lost_groups",
        "Groups that can never be offered again.",
        True,
        lambda j: j["counts"].get("lost", 0),
    ),
    (
        "trajflight_groups_committed",
        "Groups committed (ledger total).",
        False,
        lambda j: j["counts"].get("committed_total", 0),
    ),
    (
        "trajflight_groups_deleted",
        "Deletes confirmed (ledger total).",
        False,
        lambda j: j["counts"].get("deleted", 0),
    ),
    ("trajflight_groups_purged", "Groups restores purged.", False, lambda j: j["counts"].get("purged", 0)),
)
"""The per-job families of :class:`LedgerCollector` (besides groups by state)."""


class LedgerCollector(Collector):
    """The ledger's state as gauges and counters, read at scrape time.

    Args:
        read: Returns ``Ledger.figures()`` of the current ledger, read under the host's lock.
    """

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        """One family per figure; per-job ones labelled ``job``, per-server ones ``server``."""
        f = self._read()
        by_state = GaugeMetricFamily(
            "trajflight_groups", "Groups by job and state (ledger).", labels=["job", "state"]
        )
        families = [
            (GaugeMetricFamily if gauge else CounterMetricFamily)(name, doc, labels=["job"])
            for name, doc, gauge, _ in _PER_JOB
        ]
        for job, j in sorted(f["jobs"].items()):
            counts = j["counts"]
            for state in GroupState:
                by_state.add_metric([job, state.value], counts.get(state.value, 0))
            for family, (_, _, _, read) in zip(families, _PER_JOB, strict=True):
                value = read(j)
                if value is not None:  # a job without a capacity bound has no bound to show
                    family.add_metric([job], value)
        yield by_state
        yield from families
        names = (
            ("used_bytes", "Bytes the ledger has reserved or stored on a storage server."),
            ("capacity_bytes", "Bytes a storage server may hold (as registered)."),
            ("used_groups", "Groups the ledger has reserved or stored on a storage server."),
            ("capacity_groups", "Groups a storage server may hold (as registered)."),
        )
        for name, doc in names:
            family = GaugeMetricFamily(f"trajflight_controller_server_{name}", doc, labels=["server"])
            for server in f["servers"]:
                family.add_metric([server.server_id], getattr(server, name))
            yield family
        yield GaugeMetricFamily(
            "trajflight_fence_backlog", "Generation raises waiting for a storage server.", value=f["fences"]
        )
        ends = CounterMetricFamily(
            "trajflight_leases_ended", "Leases ended, by reason (expired among them).", labels=["reason"]
        )
        for reason in ("done", "expired", "fenced", "restart"):
            ends.add_metric([reason], f["lease_ends"].get(reason, 0))
        yield ends


class _Op:
    """One operation's call figures: plain numbers, updated by calls the host serialises."""

    __slots__ = ("buckets", "errors", "refused", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket (not cumulative); the last is +Inf
        self.total = 0.0
        self.refused = 0
        self.errors = 0


class ControllerMetrics:
    """The controller's metrics (see the module docstring). :attr:`registry` is what an endpoint serves.

    The ledger collector is registered by :meth:`watch` (the host knows its lock). :meth:`run` is called
    by calls its host serialises (one lock, or one event loop), so its figures are plain numbers, not
    locked Prometheus children: about half a microsecond a call instead of two. :meth:`count_refusal`
    may be called from any thread (it takes its own lock).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._ops = {name: _Op() for name in COMMANDS}
        self._reasons = dict.fromkeys(REFUSAL_REASONS, 0)  # counted by run (serialised)
        self._hooked = dict.fromkeys(REFUSAL_REASONS, 0)  # counted by count_refusal (any thread)
        self.published = 0
        self.granted = 0
        self.leased = 0
        self._watched = False
        self._lock = threading.Lock()
        self.registry.register(_CallCollector(self))

    def watch(self, read: Callable[[], dict[str, Any]]) -> None:
        """Register the ledger collector over ``read`` (``Ledger.figures()`` under the host's lock);
        once (a second call changes nothing)."""
        with self._lock:
            if not self._watched:
                self.registry.register(LedgerCollector(read))
                self._watched = True

    def count_refusal(self, reason: str) -> None:
        """Count one refused call of ``reason`` (one of :data:`~trajflight.refusals.REFUSAL_REASONS`);
        thread-safe.

        Raises:
            InvalidRequestError: an unknown reason.
        """
        reason = check_reason(reason)
        with self._lock:
            self._hooked[reason] += 1

    def refusals(self) -> dict[str, int]:
        """Refusals so far, by reason (both the calls' own and the hook's)."""
        with self._lock:
            return {r: self._reasons[r] + self._hooked[r] for r in REFUSAL_REASONS}

    def calls(self) -> dict[str, tuple[list[int], float, int, int]]:
        """Per operation: ``(bucket counts, seconds in all, refused, errors)`` (a copy)."""
        return {name: (list(op.buckets), op.total, op.refused, op.errors) for name, op in self._ops.items()}

    def run(self, command: Command[R], ledger: Ledger, now: float) -> R:
        """``command.apply(ledger, now)``, timed and counted (its outcome, a refusal's reason, what it
        published or leased); exceptions propagate. Call it serialised (the host's lock)."""
        op = self._ops[command.name]
        start = time.perf_counter()
        try:
            result = command.apply(ledger, now)
        except BaseException as exc:
            seconds = time.perf_counter() - start
            op.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            op.total += seconds
            reason = refusal_reason(exc)
            if reason is None:
                op.errors += 1
            else:
                op.refused += 1
                self._reasons[reason] += 1
            raise
        seconds = time.perf_counter() - start
        op.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        op.total += seconds
        kind = _COUNTED.get(command.name)
        if kind is not None:
            if kind == "acquire":
                if result is not None:
                    self.granted += 1
                    self.leased += len(result.groups)  # type: ignore[attr-defined]
            elif kind == "publish_ahead":
                self.published += len(result.groups)  # type: ignore[attr-defined]
            else:
                self.published += 1 if kind == "publish" else len(result)  # type: ignore[arg-type]
        return result


_COUNTED = {
    "acquire": "acquire",
    "publish": "publish",
    "publish_many": "publish_many",
    "publish_ahead": "publish_ahead",
}


class _CallCollector(Collector):
    """The figures :meth:`ControllerMetrics.run` keeps, as Prometheus families, at scrape time."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        """The call histogram and outcomes per operation, refusals by reason, publications and leases."""
        m = self._metrics
        latency = HistogramMetricFamily(
            "trajflight_controller_call_seconds",
            "Time the controller spends on an operation (the ledger's work), by operation.",
            labels=["op"],
        )
        outcomes = CounterMetricFamily(
            "trajflight_controller_calls",
            "Controller operations by outcome (ok, refused, error).",
            labels=["op", "outcome"],
        )
        bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
        for name, (buckets, total, refused, errors) in m.calls().items():
            count = sum(buckets)
            if not count:
                continue
            cumulative = list(accumulate(buckets))
            latency.add_metric([name], list(zip(bounds, cumulative, strict=True)), total)
            outcomes.add_metric([name, "ok"], count - refused - errors)
            outcomes.add_metric([name, "refused"], refused)
            outcomes.add_metric([name, "error"], errors)
        yield latency
        yield outcomes
        refusals = CounterMetricFamily(
            "trajflight_controller_refusals", "Operations refused, by reason.", labels=["reason"]
        )
        for reason, n in m.refusals().items():
            refusals.add_metric([reason], n)
        yield refusals
        yield CounterMetricFamily(
            "trajflight_groups_published", "Groups published (made READY) by writers.", value=m.published
        )
        yield CounterMetricFamily("trajflight_leases_granted", "Leases granted.", value=m.granted)
        yield CounterMetricFamily("trajflight_groups_leased", "Groups handed out in leases.", value=m.leased)
