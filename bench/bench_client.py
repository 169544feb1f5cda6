"""Public-client benchmark (issue 5): what the client layer costs over the bare storage server.

Same run, same machine, the standard workload (G=64, K=8 by default), one storage server process:

* bare: ``StorageClient.put_groups`` of each group (a list of one) straight to the server, then one
  ``get`` of every group and ``decode`` to jagged tensors;
* trajflight: ``Writer.put`` per group (allocate + put + publish through the controller), then
  ``Trainer.lease`` of every group + ``LeasedBatch.fetch`` (jagged) + commit, over Flight (forced) and
  with the default transport (shared memory on this host);
* small-group latency: put one group of 8 samples, lease it, fetch it (p50/p99), with the in-process
  controller client and with a client connected over Flight (another process's view).

Usage::

    python bench/bench_client.py [--repeats 5] [--latency-iters 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

import trajflight
from trajflight.codec import decode
from trajflight.flight_server import StorageClient
from trajflight.keys import Partition
from trajflight.workload import make_workload


def _median_spread(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:8.2f} ms [{min(xs) * 1e3:.2f}..{max(xs) * 1e3:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-iters", type=int, default=200)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    groups = make_workload(args.groups, args.samples)
    payload = sum(g.payload_bytes for g in groups)
    results: dict[str, Any] = {"payload_bytes": payload, "groups": args.groups, "samples": args.samples}
    times: dict[str, dict[str, list[float]]] = {}
    with trajflight.LocalCluster(servers=1, capacity="4GiB") as cluster:
        location = cluster.server_locations[0]
        storage = StorageClient(location)
        clients = {"client, flight": cluster.client(transport="flight"), "client, auto": cluster.client()}
        for rep in range(args.repeats + 1):  # the first round warms up
            job = f"bare-{rep}"
            batches = [g.encode(job, 0) for g in groups]
            start = time.perf_counter()
            for g, b in zip(groups, batches, strict=True):
                storage.put_groups([(Partition(job, 0, g.group_id), b)])
            put_s = time.perf_counter() - start
            start = time.perf_counter()
            decode(storage.get([Partition(job, 0, g.group_id) for g in groups]))
            round_times = {"bare": (put_s, time.perf_counter() - start)}
            storage.fence(job, 1, purge=True)
            for name, client in clients.items():
                job = f"{name[-4:]}-{rep}"
                client.open_job(job, 1)
                writer = client.writer(job, 1)
                fresh = [g.encode(job, 1).drop_columns(["job_id", "epoch", "group_id"]) for g in groups]
                start = time.perf_counter()
                for b in fresh:
                    writer.put(b)
                put_s = time.perf_counter() - start
                start = time.perf_counter()
                with client.trainer(job).lease(args.groups, wait=5) as batch:
                    batch.fetch()
                    round_times[name] = (put_s, time.perf_counter() - start)
                cluster.wait_idle(job)
            if rep:
                for name, (put_s, get_s) in round_times.items():
                    entry = times.setdefault(name, {"put": [], "get": []})
                    entry["put"].append(put_s)
                    entry["get"].append(get_s)

        print(
            f"payload {payload / 1e6:.1f} MB, {args.groups} groups x {args.samples}, repeats {args.repeats}"
        )
        for op in ("put", "get"):
            bare = statistics.median(times["bare"][op])
            for name, entry in times.items():
                median = statistics.median(entry[op])
                results[f"{op} {name}"] = {
                    "ms": median * 1e3,
                    "gb_s": payload / median / 1e9,
                    "ratio": bare / median,
                }
                print(
                    f"{op}  {name:<15} {_median_spread(entry[op])}  {payload / median / 1e9:5.2f} GB/s  "
                    f"{bare / median:.2f}x of bare"
                )

        client = clients["client, auto"]
        (small,) = make_workload(1, 8, seed=1)
        columns = small.columns()
        for i, (name, c) in enumerate(
            (
                ("in-process controller, flight", clients["client, flight"]),
                ("in-process controller, auto", client),
                ("controller over Flight, auto", trajflight.connect(cluster.address)),
            )
        ):
            job = f"latency-{i}"
            c.open_job(job, 1)
            writer, trainer = c.writer(job, 1), c.trainer(job)
            samples = []
            for i in range(args.latency_iters + 10):
                start = time.perf_counter()
                writer.put(**columns)
                with trainer.lease(1, wait=1) as batch:
                    batch.fetch()
                if i >= 10:
                    samples.append(time.perf_counter() - start)
            p50, p99 = np.percentile(samples, [50, 99]) * 1e3
            results[f"latency {name}"] = {"p50_ms": p50, "p99_ms": p99}
            print(f"small group put+lease+get+commit ({name}): p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        storage.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
