"""What the Prometheus metrics cost on the hot path (issue 18): the same run with metrics on and off.

One embedded data plane (one storage server in this process, so that "off" reaches it too), the standard
workload (G=64, K=8 by default). Rounds alternate between:

* on: as shipped (every storage request timed by ``ServerMetrics.timed``, every controller operation by
  ``ControllerMetrics.run``);
* off: both replaced by pass-throughs (a reusable null context; ``command.apply``), the collectors
  idle (nothing scrapes).

A round of each mode runs back to back (which goes first alternates), so each pair of rounds saw about
the same machine: the per-pair ratio on/off is the figure least moved by other load. Each round measures
``Writer.put_many`` of the workload, ``Trainer.lease`` of it + ``fetch`` (jagged) + commit, and the
small-group round trip (put one group of 8 samples, lease it, fetch it, commit) p50.
Also the two hot-path calls alone, per call. Medians and spread; ratios on/off.

Usage::

    python bench/bench_metrics.py [--repeats 7] [--latency-iters 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import trajflight
from trajflight.controller import ControllerMetrics, Ledger
from trajflight.controller._commands import Counts
from trajflight.flight_server import ServerMetrics
from trajflight.flight_server._store import GroupStore
from trajflight.workload import make_workload

_NULL = contextlib.nullcontext()
_TIMED, _RUN = ServerMetrics.timed, ControllerMetrics.run


def _metrics(on: bool) -> None:
    """Switch the hot-path instrumentation of every server and controller of this process."""
    if on:
        ServerMetrics.timed, ControllerMetrics.run = _TIMED, _RUN  # type: ignore[method-assign]
    else:
        ServerMetrics.timed = lambda self, op: _NULL  # type: ignore[assignment,method-assign]
        ControllerMetrics.run = lambda self, command, ledger, now: command.apply(ledger, now)  # type: ignore[method-assign]


def _per_call() -> dict[str, float]:
    """Nanoseconds per call of the two hot-path wrappers, against a bare call, in this process."""
    metrics, n = ServerMetrics(GroupStore().stats, "bench"), 200_000
    start = time.perf_counter()
    for _ in range(n):
        with _NULL:
            pass
    bare = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        with metrics.timed("do_get"):
            pass
    timed = time.perf_counter() - start
    ledger, command, cm = Ledger(), Counts(job_id="j"), ControllerMetrics()
    ledger.open_job("j", 1, now=0.0)
    start = time.perf_counter()
    for _ in range(n):
        command.apply(ledger, 0.0)
    apply = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        cm.run(command, ledger, 0.0)
    run = time.perf_counter() - start
    return {
        "server_timed_ns": (timed - bare) / n * 1e9,
        "controller_run_ns": (run - apply) / n * 1e9,
    }


def _round(client: Any, groups: list[Any], job: str, latency_iters: int, clock: Any) -> dict[str, float]:
    client.open_job(job, 1)
    writer, trainer = client.writer(job, 1), client.trainer(job)
    start = clock()
    writer.put_many([g.columns() for g in groups])
    put_s = clock() - start
    start = clock()
    with trainer.lease(len(groups), wait=5) as batch:
        batch.fetch()
    get_s = clock() - start
    (small,) = make_workload(1, 8, seed=1)
    columns, samples = small.columns(), []
    for i in range(latency_iters + 10):
        start = clock()
        writer.put(**columns)
        with trainer.lease(1, wait=1) as batch:
            batch.fetch()
        if i >= 10:
            samples.append(clock() - start)
    return {"put_many": put_s, "lease_fetch": get_s, "small_p50": float(np.percentile(samples, 50))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7, help="rounds of each mode after a warm-up pair")
    parser.add_argument("--latency-iters", type=int, default=200)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time by this process's CPU time (every thread: the server and the controller run here too), "
        "not the wall clock: on a shared machine it measures what the code costs, not the wait for a core",
    )
    args = parser.parse_args(argv)
    clock = time.process_time if args.cpu else time.perf_counter

    groups = make_workload(args.groups, args.samples)
    payload = sum(g.payload_bytes for g in groups)
    times: dict[str, dict[str, list[float]]] = {"on": {}, "off": {}}
    with trajflight.LocalCluster(servers=1, capacity="4GiB", processes=False, metrics_port=0) as cluster:
        client = cluster.client()
        for rep in range(args.repeats + 1):  # the first pair warms up
            for mode in ("on", "off") if rep % 2 else ("off", "on"):  # alternate which goes first
                _metrics(mode == "on")
                try:
                    result = _round(client, groups, f"{mode}-{rep}", args.latency_iters, clock)
                finally:
                    _metrics(True)
                cluster.wait_idle(f"{mode}-{rep}")
                if rep:
                    for name, seconds in result.items():
                        times[mode].setdefault(name, []).append(seconds)
    results: dict[str, Any] = {
        "payload_bytes": payload,
        "groups": args.groups,
        "samples": args.samples,
        "clock": "cpu" if args.cpu else "wall",
    }
    print(
        f"payload {payload / 1e6:.1f} MB, {args.groups} groups x {args.samples}, {args.repeats} rounds each, "
        f"{results['clock']} clock"
    )
    for name in ("put_many", "lease_fetch", "small_p50"):
        on, off = (statistics.median(times[m][name]) for m in ("on", "off"))
        pairs = [a / b for a, b in zip(times["on"][name], times["off"][name], strict=True)]
        results[name] = {
            "pair_ratio_median": statistics.median(pairs),
            "pair_ratio_spread": [min(pairs), max(pairs)],
            "on_ms": on * 1e3,
            "off_ms": off * 1e3,
            "on_spread_ms": [min(times["on"][name]) * 1e3, max(times["on"][name]) * 1e3],
            "off_spread_ms": [min(times["off"][name]) * 1e3, max(times["off"][name]) * 1e3],
            "on_over_off": on / off,
        }
        spread = {m: f"[{min(times[m][name]) * 1e3:.2f}..{max(times[m][name]) * 1e3:.2f}]" for m in times}
        print(
            f"{name:<12} on {on * 1e3:8.2f} ms {spread['on']}  off {off * 1e3:8.2f} ms {spread['off']}  "
            f"on/off {on / off:.3f}; per round pair {statistics.median(pairs):.3f} "
            f"[{min(pairs):.2f}..{max(pairs):.2f}]"
        )
    per_call = _per_call()
    results["per_call"] = per_call
    print(
        f"per call: ServerMetrics.timed +{per_call['server_timed_ns']:.0f} ns, "
        f"ControllerMetrics.run +{per_call['controller_run_ns']:.0f} ns"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
