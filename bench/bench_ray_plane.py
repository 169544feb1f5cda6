"""The Ray data plane on one node against the embedded plane, same-host figures, in one run (issue 16).

Both planes serve the standard workload (``make_workload(64, 8)`` with its two user columns, passed with
``extra=`` as ``trajflight bench`` passes them) to a client in this process, which reaches its storage
server through shared memory (same host):

* ``embedded``: ``LocalCluster(servers=1, processes=True)``: one storage server process with its arena,
  the controller in this process (called in-process);
* ``ray``: ``RayCluster(servers=1, shm=True)`` on a local Ray runtime started here on loopback
  (``ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=4)``,
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): the storage server is a Ray actor with its arena on this
  node's tmpfs, the controller a Ray actor (called through Ray).

Figures, per plane, the planes interleaved round by round (ABBA order): ``put_many`` of the groups'
columns (encoding inside) to READY; ``lease`` of the 64 groups; ``get all`` (``fetch()`` of every column
to jagged torch, from the lease's return) and ``get 2-col`` (``response_ids``, ``response_logprobs``);
``commit``; and the small-group round trip (put one group, lease it, fetch it, commit), p50 and p99.
The ratio column is ray / embedded time (the target: within 1.2x). Timing decides nothing here.

    python bench/bench_ray_plane.py [--repeats 7] [--latency-iters 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

from trajflight.bench._drain import drain, summary
from trajflight.bench._stats import timed

JOB = "plane"
SUBSET = ("response_ids", "response_logprobs")
FIGURES = ("put_many", "lease", "get_all", "get_subset", "commit")


class Plane:
    """One data plane with a writer and a trainer of the job, and what it measured."""

    def __init__(self, name: str, cluster: Any, client: Any) -> None:
        self.name = name
        self.cluster = cluster
        self.client = client
        client.open_job(JOB, 1)
        self.writer = client.writer(JOB, 1, writer_id=f"{name}-writer")
        self.trainer = client.trainer(JOB, owner=f"{name}-trainer", ttl=300.0)
        self.times: dict[str, list[float]] = {k: [] for k in (*FIGURES, "small")}
        self.shm = client.storage.uses_shm(cluster.server_locations[0])

    def drain(self) -> None:
        """Commit whatever is READY and wait until every delete is confirmed."""
        drain(self.trainer, self.cluster, JOB)

    def round(self, columns: list[dict[str, Any]], record: bool) -> None:
        """One batch through the plane: put_many, lease, get all, get 2-col, commit."""
        took: dict[str, float] = {}
        took["put_many"] = timed(lambda: self.writer.put_many(columns))
        t0 = time.perf_counter()
        lease = self.trainer.lease(len(columns), wait=30.0, renew=False)
        took["lease"] = time.perf_counter() - t0
        if len(lease) != len(columns):
            raise RuntimeError(f"{self.name}: leased {len(lease)} groups, expected {len(columns)}")
        took["get_all"] = timed(lease.fetch)
        took["get_subset"] = timed(functools.partial(lease.fetch, SUBSET))
        took["commit"] = timed(lease.commit)
        del lease
        self.drain()
        if record:
            for k, v in took.items():
                self.times[k].append(v)

    def small(self, batches: list[Any], iters: int, warmup: int = 5) -> None:
        """``iters`` small-group round trips (put one group, lease, fetch, commit) after ``warmup``."""
        for i in range(warmup + iters):
            batch = batches[i % len(batches)]
            t0 = time.perf_counter()
            self.writer.put(batch)
            lease = self.trainer.lease(1, wait=10.0, renew=False)
            lease.fetch()
            lease.commit()
            took = time.perf_counter() - t0
            del lease
            if i >= warmup:
                self.times["small"].append(took)


def _start_ray() -> Any:
    """A local Ray runtime on loopback, as issue 16 asks the figure to run on."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            num_cpus=4,
            log_to_driver=False,
        )
    return ray


def main(argv: list[str] | None = None) -> int:
    """Run both planes and print the table (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--latency-iters", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    ray = _start_ray()
    import torch

    import trajflight
    from trajflight.bench._system import encode_with_users, payload_of, user_columns
    from trajflight.workload import make_workload

    torch.set_num_threads(1)
    groups = make_workload(args.groups, args.samples, seed=args.seed)
    users = [user_columns(g) for g in groups]
    columns = [g.columns(extra=u) for g, u in zip(groups, users, strict=True)]
    batches = [encode_with_users(g, JOB, 1, u) for g, u in zip(groups, users, strict=True)]
    payload, subset = payload_of(groups), payload_of(groups, SUBSET)
    load_before = os.getloadavg()
    started = time.time()
    local = trajflight.LocalCluster(servers=1, capacity="8GiB", processes=True).start()
    remote = trajflight.RayCluster(servers=1, capacity="8GiB", shm=True).start()
    try:
        planes = [Plane("embedded", local, local.client()), Plane("ray", remote, remote.client())]
        for plane in planes:
            if not plane.shm:
                raise RuntimeError(
                    f"{plane.name}: the client does not reach its server through shared memory"
                )
            for _ in range(2):  # warm the arena, the caches, torch's nested tensors
                plane.round(columns, record=False)
        for r in range(args.repeats):
            for plane in planes if r % 4 in (0, 3) else planes[::-1]:
                plane.round(columns, record=True)
        for r in range(4):  # the round trips in blocks, interleaved too
            for plane in planes if r % 2 == 0 else planes[::-1]:
                plane.small(batches, max(1, args.latency_iters // 4))
        report: dict[str, Any] = {
            "workload": {"groups": args.groups, "samples": args.samples, "payload_bytes": payload},
            "repeats": args.repeats,
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "seconds": time.time() - started,
            "ray_version": ray.__version__,
            "planes": {p.name: {k: summary(v) for k, v in p.times.items()} for p in planes},
        }
    finally:
        remote.close()
        local.close()
        ray.shutdown()
    _print(report, payload, subset)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _print(report: dict[str, Any], payload: int, subset: int) -> None:
    emb, ray_ = report["planes"]["embedded"], report["planes"]["ray"]
    sizes = {"put_many": payload, "get_all": payload, "get_subset": subset}
    lb, la = report["load_average"]["before"][0], report["load_average"]["after"][0]
    print(
        f"payload {payload / 1e6:.2f} MB (2-col {subset / 1e6:.2f} MB), {report['repeats']} rounds, "
        f"load average {lb:.2f} -> {la:.2f}, ray {report['ray_version']}"
    )
    print("| figure | embedded ms [min-max] | ray plane ms [min-max] | ray / embedded time | target |")
    print("|---|---:|---:|---:|---|")
    for key in (*FIGURES, "small"):
        e, r = emb[key], ray_[key]

        def cell(s: dict[str, float], key: str = key) -> str:
            text = f"{s['median'] * 1e3:.2f} [{s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f}]"
            if key in sizes:
                text += f" {sizes[key] / s['median'] / 1e9:.2f} GB/s"
            if key == "small":
                text += f" p99 {s['p99'] * 1e3:.2f}"
            return text

        ratio = r["median"] / e["median"]
        target = "<= 1.2" if key != "commit" else "-"
        print(f"| {key} | {cell(e)} | {cell(r)} | {ratio:.2f} | {target} |")


if __name__ == "__main__":
    sys.exit(main())
