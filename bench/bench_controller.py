"""Benchmark of the controller: lease cycles per second (in-process and through Ray) and acquire cost.

Not a test: timing never decides anything here. Every figure is the median over ``--repeats`` runs with
its spread (min..max); a "group transition" is one group moving one step of
``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED`` (five per lease cycle).

* ``ledger``: the sans-IO :class:`~trajflight.controller.Ledger` alone, ``now`` from ``time.monotonic``.
* ``local``: the in-process host (lock, journal off) through ``ControllerClient``; the timing ends when
  its sweeper has confirmed every delete.
* ``flight``: the same host served over Flight on loopback (``trajflight._control``: the embedded data
  plane's controller endpoint) through ``ControllerClient``: one round trip per step, typed JSON both ways.
* ``ray``: the named async Ray actor through ``ControllerClient``: one call per step, each step carrying
  ``--groups-per-lease`` groups (batched calls), plus the whole cycle packed into one round trip after
  acquire (``invoke_many``).
* ``acquire``: the cost of one ``acquire`` of ``--groups-per-lease`` groups with 1,000 vs 100,000 READY
  groups in the job (the index makes it flat: the ratio should be near 1).

``--journal`` also runs ``local`` with a state directory, so that every state-changing call is journaled.
``--reference DIR`` imports the ``controller/`` folder of another tree (say, the commit before a change)
as a package of its own and runs ``ledger`` and ``local`` for it and for this tree alternately in the
same process, printing both and the ratio of each pair (the base modules, ``trajflight.errors`` and
friends, are this tree's). ``--cpu`` times ``ledger``, ``local`` and ``flight`` by this process's CPU
time (all its threads; ``flight``'s server runs in this process too) instead of the wall clock: on a
machine shared with other work it measures what the code costs, not how long it waited for a core.

Usage::

    .venv/bin/python bench/bench_controller.py            # everything
    .venv/bin/python bench/bench_controller.py --no-ray   # skip the Ray actor
    .venv/bin/python bench/bench_controller.py --only ledger,local,flight --repeats 1 --json out.json
    .venv/bin/python bench/bench_controller.py --reference /tmp/before/controller --repeats 10 --cpu
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import trajflight.controller
from trajflight.controller import ControllerClient, JobConfig, Ledger

TRANSITIONS_PER_CYCLE = 5
_timer = time.perf_counter  # --cpu: time.process_time (this process's CPU, threads included)
CONFIG = JobConfig(max_groups_per_lease=4096, default_lease_ttl=300.0, max_lease_ttl=600.0, grant_ttl=600.0)


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):,.0f}  (min {min(values):,.0f} .. max {max(values):,.0f})"


def _fill_ledger(ledger: Ledger, n: int, now: float) -> None:
    for _ in range(n):
        g = ledger.allocate("j", 1, "w0", nbytes=1024, now=now)
        ledger.publish(g.partition, token=g.token, rows=8, nbytes=1024, tokens=4096, policy_version=0,
                       columns=("response_ids",), now=now)  # fmt: skip


def _new_ledger(n_ready: int, ctl: ModuleType = trajflight.controller) -> Ledger:
    ledger = ctl.Ledger()
    now = time.monotonic()
    ledger.register_server("s0", node="n0", location="grpc://127.0.0.1:1", capacity_bytes=1 << 50,
                           capacity_groups=1 << 40, now=now)  # fmt: skip
    ledger.open_job("j", 1, ctl.JobConfig(**CONFIG.to_mapping()), now=now)
    ledger.register_writer("j", 1, "w0", node="n0", now=now)
    _fill_ledger(ledger, n_ready, now)
    return ledger


# ---------------------------------------------------------------------- in-process
def bench_ledger(groups: int, per_lease: int, ctl: ModuleType = trajflight.controller) -> float:
    """Group transitions per second of the bare ledger (acquire..commit, deletes confirmed)."""
    ledger = _new_ledger(groups, ctl)
    clock = time.monotonic
    t0 = _timer()
    done = 0
    batch = 0
    while True:
        lease = ledger.acquire("j", "bench", max_groups=per_lease, now=clock())
        if lease is None:
            break
        token, b = lease.token, f"b{batch}"
        ledger.prepare(token, b, now=clock())
        ledger.start_training(token, b, now=clock())
        ledger.finish_training(token, b, now=clock())
        ledger.commit(token, b, now=clock())
        for work in ledger.take_deletes(now=clock(), limit=per_lease):
            ledger.delete_done(work.partition, ok=True, now=clock())
        done += len(lease.groups)
        batch += 1
    elapsed = _timer() - t0
    return done * TRANSITIONS_PER_CYCLE / elapsed


def _setup_client(client: ControllerClient, groups: int) -> None:
    client.register_server("s0", node="n0", location="grpc://127.0.0.1:1", capacity_bytes=1 << 50,
                           capacity_groups=1 << 40)  # fmt: skip
    client.open_job("j", 1, CONFIG.to_mapping())
    client.register_writer("j", 1, "w0", node="n0")


def _cycles(client: ControllerClient, per_lease: int) -> int:
    done = 0
    while True:
        lease = client.acquire("j", "bench", max_groups=per_lease)
        if lease is None:
            return done
        client.prepare(lease.token, "b")
        client.start_training(lease.token, "b")
        client.finish_training(lease.token, "b")
        client.commit(lease.token, "b")
        done += len(lease.groups)


def bench_local(
    groups: int, per_lease: int, ctl: ModuleType = trajflight.controller, *, journal: bool = False
) -> float:
    """Group transitions per second through LocalController + ControllerClient (``journal``: with a state
    directory, so that every state-changing call is journaled)."""
    with (
        tempfile.TemporaryDirectory() as state,
        ctl.LocalController(state_dir=state if journal else None) as host,
    ):
        client = ctl.ControllerClient(host)
        _setup_client(client, groups)
        with host._cond:  # fill fast, straight into the hosted ledger
            _fill_ledger(host._core.ledger, groups, time.time())
        t0 = _timer()
        done = _cycles(client, per_lease)
        while client.counts("j")["deleted"] < done:  # the sweeper confirms the deletes: count them in
            time.sleep(0.001)
        return done * TRANSITIONS_PER_CYCLE / (_timer() - t0)


def bench_flight(groups: int, per_lease: int) -> float:
    """Group transitions per second through the embedded controller's Flight endpoint (loopback)."""
    from trajflight._control import ControlServer
    from trajflight._control_client import connect_control

    with trajflight.controller.LocalController() as host:
        server = ControlServer(host)
        client = connect_control(server.location, timeout=60.0)
        try:
            _setup_client(client, groups)
            with host._cond:  # fill fast, straight into the hosted ledger
                _fill_ledger(host._core.ledger, groups, time.time())
            t0 = _timer()
            done = _cycles(client, per_lease)
            while client.counts("j")["deleted"] < done:  # the sweeper confirms the deletes: count them in
                time.sleep(0.001)
            return done * TRANSITIONS_PER_CYCLE / (_timer() - t0)
        finally:
            client.transport.close()  # type: ignore[attr-defined]
            server.shutdown()


# ---------------------------------------------------------------------- acquire cost
def bench_acquire(n_ready: int, per_lease: int, samples: int) -> float:
    """Median microseconds of one acquire of ``per_lease`` groups with ``n_ready`` READY groups.

    Each acquired lease is released straight away (outside the timing) so the READY count stays put.
    """
    ledger = _new_ledger(n_ready)
    times = []
    for _ in range(samples):
        now = time.monotonic()
        t0 = time.perf_counter()
        lease = ledger.acquire("j", "bench", max_groups=per_lease, now=now)
        times.append(time.perf_counter() - t0)
        if lease is None:
            raise RuntimeError("no READY group: the benchmark is broken")
        ledger.release(lease.token, now=now)
    return statistics.median(times) * 1e6


# ---------------------------------------------------------------------- Ray
def bench_ray(groups: int, per_lease: int, repeats: int) -> tuple[list[float], list[float]]:
    """Groups per second through the Ray actor: one call per step, and the cycle packed after acquire."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from trajflight.controller import start_ray_controller

    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=4,
             log_to_driver=False)  # fmt: skip
    per_step, packed = [], []
    try:
        for r in range(repeats):
            client = start_ray_controller(name=f"bench-{r}", namespace="trajflight-bench", timeout=60.0)
            _setup_client(client, groups)
            _ray_fill(client, groups)
            t0 = time.perf_counter()
            done = _cycles(client, per_lease)
            per_step.append(done / (time.perf_counter() - t0))
            _ray_fill(client, groups)
            t0 = time.perf_counter()
            done = 0
            while True:
                lease = client.acquire("j", "bench", max_groups=per_lease)
                if lease is None:
                    break
                t = lease.token
                client.transport.invoke_many(
                    [
                        ("prepare", {"token": t, "batch_id": "b", "partitions": None}),
                        ("start_training", {"token": t, "batch_id": "b"}),
                        ("finish_training", {"token": t, "batch_id": "b"}),
                        ("commit", {"token": t, "batch_id": "b"}),
                    ],
                    60.0,
                )
                done += len(lease.groups)
            packed.append(done / (time.perf_counter() - t0))
            ray.kill(client.transport.actor, no_restart=True)
    finally:
        ray.shutdown()
    return per_step, packed


def _ray_fill(client: ControllerClient, groups: int) -> None:
    """Allocate and publish ``groups`` groups in batched actor calls (256 calls per round trip)."""
    transport = client.transport
    left = groups
    while left:
        n = min(256, left)
        grants = transport.invoke_many(
            [("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w0", "nbytes": 1024})] * n, 60.0
        )
        transport.invoke_many(
            [
                (
                    "publish",
                    {
                        "partition": g.partition,
                        "token": g.token,
                        "rows": 8,
                        "nbytes": 1024,
                        "tokens": 4096,
                        "policy_version": 0,
                        "columns": ("response_ids",),
                    },
                )
                for g in grants
            ],
            60.0,
        )
        left -= n


# ---------------------------------------------------------------------- against another tree
def load_reference(folder: str) -> ModuleType:
    """Import another tree's ``controller/`` folder as the package ``reference_controller``."""
    init = Path(folder) / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "reference_controller", init, submodule_search_locations=[folder]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"{folder} is not a controller package (no __init__.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def against(reference: ModuleType, args: Any) -> dict[str, list[float]]:
    """``ledger`` and ``local`` for ``reference`` and this tree, alternating which goes first."""
    this = trajflight.controller
    out: dict[str, list[float]] = {}
    benches: list[tuple[str, Callable[..., float]]] = [("ledger", bench_ledger), ("local", bench_local)]
    if args.journal:
        benches.append(("journaled", lambda *a: bench_local(*a, journal=True)))
    for name, fn in benches:
        ref, new = out[f"{name}_reference"], out[name] = [], []
        for i in range(args.repeats):
            pair = ((reference, ref), (this, new)) if i % 2 == 0 else ((this, new), (reference, ref))
            for ctl, values in pair:
                values.append(fn(args.groups, args.groups_per_lease, ctl))
        ratios = [b / a for a, b in zip(ref, new, strict=True)]
        print(f"{name:8} reference transitions/s  {_spread(ref)}")
        print(f"{name:8} this tree transitions/s  {_spread(new)}")
        print(f"{name:8} this / reference  median of pairs {statistics.median(ratios):.3f}  "
              f"(min {min(ratios):.3f} .. max {max(ratios):.3f})")  # fmt: skip
    return out


# ---------------------------------------------------------------------- main
def _repeat(fn: Callable[[], float], repeats: int) -> list[float]:
    return [fn() for _ in range(repeats)]


BENCHES = ("ledger", "local", "flight", "acquire", "ray")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--groups", type=int, default=20_000, help="groups cycled per in-process run")
    parser.add_argument("--flight-groups", type=int, default=8192, help="groups cycled per Flight run")
    parser.add_argument("--ray-groups", type=int, default=4096, help="groups cycled per Ray run")
    parser.add_argument("--groups-per-lease", type=int, default=64)
    parser.add_argument("--acquire-samples", type=int, default=500)
    parser.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {BENCHES}")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", help="also write every run's figure to this file")
    parser.add_argument("--reference", help="another tree's controller/ folder: ledger and local against it")
    parser.add_argument("--journal", action="store_true", help="also run local with its journal on")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time ledger, local and flight by this process's CPU time (shared machines)",
    )
    args = parser.parse_args(argv)
    if args.cpu:
        global _timer
        _timer = time.process_time
    only = set(args.only.split(","))
    if args.no_ray:
        only.discard("ray")
    per = args.groups_per_lease
    results: dict[str, list[float]] = {}
    print(f"# trajflight controller benchmark  python {sys.version.split()[0]}  cpus {os.cpu_count()}")
    print(f"# repeats={args.repeats} groups={args.groups} groups_per_lease={per}")
    if args.reference:
        results = against(load_reference(args.reference), args)
        only -= {"ledger", "local"}

    if "ledger" in only:
        ledger = results["ledger"] = _repeat(lambda: bench_ledger(args.groups, per), args.repeats)
        print(f"ledger   lease cycles  transitions/s  {_spread(ledger)}   (groups/s = /5)")
    if "local" in only:
        local = results["local"] = _repeat(lambda: bench_local(args.groups, per), args.repeats)
        print(f"local    lease cycles  transitions/s  {_spread(local)}   (target >= 20,000)")
    if "local" in only and args.journal:
        logged = results["journaled"] = _repeat(
            lambda: bench_local(args.groups, per, journal=True), args.repeats
        )
        print(f"local    journaled     transitions/s  {_spread(logged)}")
    if "flight" in only:
        over = results["flight"] = _repeat(lambda: bench_flight(args.flight_groups, per), args.repeats)
        print(f"flight   lease cycles  transitions/s  {_spread(over)}")

    if "acquire" in only:
        small = results["acquire_1k"] = _repeat(
            lambda: bench_acquire(1_000, per, args.acquire_samples), args.repeats
        )
        large = results["acquire_100k"] = _repeat(
            lambda: bench_acquire(100_000, per, args.acquire_samples), args.repeats
        )
        ratio = statistics.median(large) / statistics.median(small)
        print(f"acquire  {per} groups @   1,000 READY  us/acquire  {_spread(small)}")
        print(f"acquire  {per} groups @ 100,000 READY  us/acquire  {_spread(large)}")
        print(f"acquire  cost ratio 100,000 / 1,000 READY = {ratio:.2f}  (flat: near 1)")

    if "ray" in only:
        per_step, packed = bench_ray(args.ray_groups, per, args.repeats)
        results["ray_per_step"], results["ray_packed"] = per_step, packed
        print(f"ray      one call per step   groups/s  {_spread(per_step)}   (target >= 1,000)")
        print(f"ray      cycle in one call   groups/s  {_spread(packed)}")
        print(f"ray      one call per step   transitions/s  median {statistics.median(per_step) * 5:,.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
