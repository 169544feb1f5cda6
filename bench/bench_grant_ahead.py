"""Controller calls per put and what they cost: grant ahead (issue 16), for one tree at a time.

Runs against whichever ``trajflight`` is first on the path, so the same script measures two trees laid
out as installed (``PYTHONPATH=<layout>``, see BENCHMARKS.md) alternately. On
``LocalCluster(servers=2, processes=True)`` (``trajflight bench``'s setup), the standard workload's
groups with their two user columns, encoded beforehand:

Every writer is made with ``grant_ahead=True`` where the tree has the setting.

* ``calls``: controller operations per steady-state ``Writer.put`` (counted at ``ControllerClient._run``);
* ``put_rpc``: one ``Writer.put`` by a client of the control server (``trajflight.connect``), as a
  rollout worker in another process pays it (the group is then drained, untimed);
* ``small``: one group put + lease + fetch + commit, in-process controller (``bench_cuts16``'s figure);
* ``handoff``: a writer process's put to a trainer process already waiting in ``lease``, holding the
  group as torch tensors (``bench/_handoff.py``, as ``trajflight bench`` measures it).

``--ray`` instead runs, on ``RayCluster(servers=1, shm=True)`` (a local Ray runtime on loopback, the
controller an actor), one writer with ``grant_ahead`` off and one with it on, interleaved round by round
in this process (this tree only): ``put`` of one group, and the small-group round trip.

    python bench/bench_grant_ahead.py [--iters 60] [--handoff 60] [--json out.json]
    python bench/bench_grant_ahead.py --ray [--iters 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time
from typing import Any
from unittest import mock

import trajflight
from trajflight.bench._handoff import trajflight_handoff
from trajflight.bench._stats import percentile
from trajflight.bench._system import encode_with_users, user_columns
from trajflight.workload import make_workload


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "min": min(xs), "max": max(xs)}


def _ray(iters: int) -> dict[str, Any]:
    """Grant ahead off and on, interleaved, on a Ray data plane (see the module docstring)."""
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=4)
    groups = make_workload(64, 8, seed=0)
    times: dict[str, dict[str, list[float]]] = {s: {"put": [], "small": []} for s in ("off", "on")}
    try:
        with trajflight.RayCluster(servers=1, capacity="8GiB", shm=True) as cluster:
            client = cluster.client()
            client.open_job("ga-ray", 1)
            batches = [encode_with_users(g, "ga-ray", 1, user_columns(g)) for g in groups]
            writers = {s: client.writer("ga-ray", 1, grant_ahead=(s == "on")) for s in ("off", "on")}
            trainer = client.trainer("ga-ray", owner="ga-ray-trainer", ttl=300.0)
            for i in range(iters + 5):
                for state in ("off", "on") if i % 2 == 0 else ("on", "off"):
                    t0 = time.perf_counter()
                    writers[state].put(batches[i % 64])
                    put = time.perf_counter() - t0
                    lease = trainer.lease(1, wait=10.0, renew=False)
                    lease.fetch()
                    lease.commit()
                    if i >= 5:
                        times[state]["put"].append(put)
                        times[state]["small"].append(time.perf_counter() - t0)
            client.close()
    finally:
        ray.shutdown()
    return {s: {k: _stats(v) for k, v in d.items()} for s, d in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Measure and print one JSON line (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--handoff", type=int, default=60)
    parser.add_argument("--json", default=None)
    parser.add_argument("--ray", action="store_true")
    args = parser.parse_args(argv)
    if args.ray:
        load = os.getloadavg()
        report = {"load_before": load, "ray": _ray(args.iters), "load_after": os.getloadavg()}
        print(json.dumps(report))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0
    groups = make_workload(64, 8, seed=0)
    load = os.getloadavg()
    out: dict[str, Any] = {"tree": os.path.dirname(trajflight.__file__), "load_before": load}
    # The tree after issue 16's grant ahead has the setting (off by default); the tree before has not.
    ahead = (
        {"grant_ahead": True}
        if "grant_ahead" in inspect.signature(trajflight.Client.writer).parameters
        else {}
    )
    out["grant_ahead"] = bool(ahead)
    with trajflight.LocalCluster(servers=2, capacity="8GiB", processes=True) as cluster:
        client = cluster.client()
        for job in ("ga-small", "ga-rpc", "ga-handoff"):
            client.open_job(job, 1)
        batches = [encode_with_users(g, "ga-small", 1, user_columns(g)) for g in groups]
        writer = client.writer("ga-small", 1, writer_id="ga-writer", **ahead)
        trainer = client.trainer("ga-small", owner="ga-trainer", ttl=300.0)
        counted: list[str] = []
        run = client.controller._run

        def counting(command: Any, timeout: Any) -> Any:
            counted.append(command.name)
            return run(command, timeout)

        small: list[float] = []
        for i in range(args.iters + 5):
            t0 = time.perf_counter()
            if i == 5:
                with mock.patch.object(client.controller, "_run", counting):
                    writer.put(batches[i % 64])
            else:
                writer.put(batches[i % 64])
            lease = trainer.lease(1, wait=10.0, renew=False)
            lease.fetch()
            lease.commit()
            if i >= 5:
                small.append(time.perf_counter() - t0)
        out["calls"] = {"per_put": len(counted), "names": counted}
        out["small"] = _stats(small)

        remote = trajflight.connect(cluster.address, timeout=30.0)
        rbatches = [encode_with_users(g, "ga-rpc", 1, user_columns(g)) for g in groups]
        rwriter = remote.writer("ga-rpc", 1, writer_id="ga-rpc-writer", **ahead)
        rtrainer = client.trainer("ga-rpc", owner="ga-rpc-trainer", ttl=300.0)
        put_rpc: list[float] = []
        rcounted: list[str] = []
        rrun = remote.controller._run

        def rcounting(command: Any, timeout: Any) -> Any:
            rcounted.append(command.name)
            return rrun(command, timeout)

        for i in range(args.iters + 5):
            t0 = time.perf_counter()
            if i < 5:
                rwriter.put(rbatches[i % 64])
            else:
                with mock.patch.object(remote.controller, "_run", rcounting):
                    rwriter.put(rbatches[i % 64])
            took = time.perf_counter() - t0
            with rtrainer.lease(1, wait=10.0, renew=False):
                pass
            if i >= 5:
                put_rpc.append(took)
        out["put_rpc"] = _stats(put_rpc)
        out["put_rpc"]["calls_per_put"] = len(rcounted) / args.iters
        remote.close()
        handoff = trajflight_handoff(cluster.address, "ga-handoff", "auto", groups, args.handoff, **ahead)
        out["handoff"] = _stats(handoff)
        client.close()
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
