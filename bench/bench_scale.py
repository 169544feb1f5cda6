"""Scale benchmark (issue 16): 4 writer processes and 2 trainer processes on 2 storage servers.

The standard workload (``trajflight.workload``, G=64 groups x K=8 samples, about 9.5 MB of payload) at
1x, 4x and 16x, through the public client of separate processes, as a deployment runs it:

* a :class:`~trajflight.LocalCluster` with 2 storage server processes (shared memory on this host; with
  ``--transport flight``, every client over Flight) and the controller in this process, reached over its
  Flight endpoint by every child (``trajflight.connect``);
* 4 writer processes, each with a quarter of the groups (made before the clock starts), putting them with
  ``Writer.put_many`` of 64 groups at a time (groups encoded beforehand, as a rollout worker holds them);
* 2 trainer processes, each leasing up to 64 groups at a time, fetching every column to jagged torch
  tensors and committing, until every group of the run is trained.

The clock starts when every child is ready and stops when the last group is committed. Figures per scale:
the run's wall time, the time per group, the aggregate put rate (payload over the writers' own wall
time), and the trained rate (payload over the run's wall time). "growth" compares each scale with 1x:
time / (scale x time at 1x) (1.0 is linear; below 1, fixed costs amortise) and each GB/s against 1x's.
Each scale runs ``--repeats`` times in a fresh job on one cluster (figures: median, min..max). Nothing here
decides anything: the targets (time at most linear in the workload; no GB/s down by more than 20% at
16x) are printed beside the figures.

Usage::

    python bench/bench_scale.py [--scales 1,4,16] [--repeats 3] [--transport auto|flight] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import trajflight
from trajflight.codec import decode, encode_groups
from trajflight.workload import make_workload

WRITERS = 4
TRAINERS = 2
PUT_BATCH = 64
LEASE_GROUPS = 64


def _writer(
    address: str,
    transport: str,
    job: str,
    index: int,
    groups: int,
    first: int,
    seed: int,
    ready: Any,
    start: Any,
    out: Any,
) -> None:
    """Put ``groups`` groups (ids from ``first``) in batches of :data:`PUT_BATCH`; report the time."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workload = make_workload(groups, 8, seed=seed + index, first_group_id=first)
    batches = [
        encode_groups(
            job_id=job,
            epoch=1,
            groups=[{**g.columns(), "group_id": g.group_id} for g in workload[i : i + PUT_BATCH]],
        )
        for i in range(0, len(workload), PUT_BATCH)
    ]
    with trajflight.connect(address, transport=transport) as client:
        writer = client.writer(job, 1, writer_id=f"w{index}")
        _warm(client)
        ready.wait()
        start.wait()
        t0 = time.perf_counter()
        for batch in batches:
            writer.put_many(batch, timeout=120)
        out.put(("writer", index, time.perf_counter() - t0, sum(g.payload_bytes for g in workload)))


def _warm(client: trajflight.Client) -> None:
    """Decide the transport to every storage server (a ``health`` call, the same-host socket) before the
    clock starts, as a long-running worker has."""
    for server in client.controller.servers():
        client.storage.uses_shm(server.location)


def _trainer(
    address: str,
    transport: str,
    job: str,
    index: int,
    total: int,
    ready: Any,
    start: Any,
    done: Any,
    out: Any,
) -> None:
    """Lease, fetch (jagged torch, every column) and commit until ``done`` is set; report the count."""
    import torch

    torch.set_num_threads(1)
    with trajflight.connect(address, transport=transport) as client:
        trainer = client.trainer(job, owner=f"t{index}", ttl=60.0)
        _warm(client)
        (group,) = make_workload(1, 2, seed=index, response_median=16)
        decode(group.encode(job, 1))  # the first decode imports torch's nested tensors: not timed
        ready.wait()
        start.wait()
        trained = 0
        while not done.is_set():
            batch = trainer.try_lease(LEASE_GROUPS, wait=0.5, renew=False)
            if batch is None:
                continue
            batch.fetch()
            batch.commit()
            trained += len(batch.handle.groups)
            out.put(("trained", index, len(batch.handle.groups), time.perf_counter()))
        out.put(("trainer", index, trained, 0))


def run_scale(cluster: trajflight.LocalCluster, transport: str, scale: int, rep: int) -> dict[str, Any]:
    """One run of ``scale`` x the standard workload; the figures of :func:`main`'s table."""
    ctx = mp.get_context("spawn")
    total = 64 * scale
    job = f"scale-{scale}-{rep}"
    client = cluster.client()
    client.open_job(job, 1)
    ready = ctx.Barrier(WRITERS + TRAINERS + 1)
    start, done, out = ctx.Barrier(WRITERS + TRAINERS + 1), ctx.Event(), ctx.Queue()
    share = total // WRITERS
    procs = [
        ctx.Process(
            target=_writer,
            args=(cluster.address, transport, job, i, share, i * share, 7 * rep, ready, start, out),
        )
        for i in range(WRITERS)
    ] + [
        ctx.Process(
            target=_trainer, args=(cluster.address, transport, job, i, total, ready, start, done, out)
        )
        for i in range(TRAINERS)
    ]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=300)
        start.wait(timeout=60)
        t0 = time.perf_counter()
        trained, writer_times, payload = 0, [], 0
        deadline = time.monotonic() + 600
        while trained < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"scale {scale}: {trained} of {total} groups trained in 600 s")
            kind, _, value, extra = out.get(timeout=120)
            if kind == "trained":
                trained += value
                t_end = extra
            elif kind == "writer":
                writer_times.append(value)
                payload += extra
        wall = t_end - t0 if trained else float("nan")
        done.set()
        for p in procs:
            p.join(timeout=60)
    finally:
        done.set()
        for p in procs:
            if p.is_alive():
                p.kill()
    while len(writer_times) < WRITERS:  # a writer's report may come after the last commit
        kind, _, value, extra = out.get(timeout=30)
        if kind == "writer":
            writer_times.append(value)
            payload += extra
    idle = cluster.wait_idle(job, timeout=60)
    return {
        "trained": trained,
        "idle": list(idle),
        "groups": total,
        "payload_bytes": payload,
        "wall_s": wall,
        "ms_per_group": 1e3 * wall / total,
        "put_GBps": payload / max(writer_times) / 1e9,
        "trained_GBps": payload / wall / 1e9,
    }


def _med(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="1,4,16", help="comma-separated multiples of the workload")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transport", default="auto", choices=("auto", "flight"))
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",")]
    load = os.getloadavg()
    results: dict[int, list[dict[str, Any]]] = {}
    with trajflight.LocalCluster(servers=2, capacity="8GiB") as cluster:
        for scale in scales:
            results[scale] = []
            for rep in range(args.repeats):
                results[scale].append(run_scale(cluster, args.transport, scale, rep))
                print(f"scale {scale:>3}x run {rep}: {results[scale][-1]['wall_s']:.3f} s", file=sys.stderr)
    base = scales[0]
    print(
        f"{WRITERS} writer and {TRAINERS} trainer processes, 2 storage servers, transport {args.transport};"
        f" load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'scale':>6} {'groups':>7} {'MB':>7} {'wall s':>22} {'ms/group':>9} {'put GB/s':>9} "
        f"{'trained GB/s':>13} {'time growth':>12} {'put vs 1x':>10} {'trained vs 1x':>14}"
    )
    b_wall, b_put, b_trained = (_med(results[base], k)[0] for k in ("wall_s", "put_GBps", "trained_GBps"))
    summary = []
    for scale in scales:
        runs = results[scale]
        wall, lo, hi = _med(runs, "wall_s")
        put, trained = _med(runs, "put_GBps")[0], _med(runs, "trained_GBps")[0]
        growth = wall / (b_wall * scale / base)
        row = {
            "scale": scale,
            "groups": runs[0]["groups"],
            "payload_bytes": runs[0]["payload_bytes"],
            "wall_s": wall,
            "wall_min_s": lo,
            "wall_max_s": hi,
            "ms_per_group": _med(runs, "ms_per_group")[0],
            "put_GBps": put,
            "trained_GBps": trained,
            "time_growth": growth,
            "put_vs_base": put / b_put,
            "trained_vs_base": trained / b_trained,
            "runs": runs,
        }
        summary.append(row)
        print(
            f"{scale:>5}x {row['groups']:>7} {row['payload_bytes'] / 1e6:>7.1f} "
            f"{wall:>8.3f} [{lo:.3f}..{hi:.3f}] {row['ms_per_group']:>9.2f} {put:>9.3f} {trained:>13.3f} "
            f"{growth:>12.2f} {row['put_vs_base']:>10.2f} {row['trained_vs_base']:>14.2f}"
        )
    last = summary[-1]
    print(
        f"targets at {last['scale']}x: time growth <= 1.0: {last['time_growth']:.2f}; "
        f"no GB/s down by more than 20%: put {last['put_vs_base']:.2f}, trained {last['trained_vs_base']:.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transport": args.transport, "load_before": load, "scales": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
