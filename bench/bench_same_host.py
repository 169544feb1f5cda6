"""Same-host benchmark (issue 7): trajflight's shared-memory path against Ray's object store and memcpy.

Same run, same machine, the standard workload (``make_workload(64, 8)``, about 9.5 MB of payload):

* references measured here: numpy memcpy of the payload (group by group into a pre-faulted buffer, as
  ``trajflight bench`` does), back to back (hot caches) and after the pause the puts follow (cold); and
  Ray's object store with **one object per batch**: a producer actor ``ray.put``s the whole batch's arrays
  (concatenated per column), the driver ``ray.get``s it and builds jagged torch tensors over the returned
  numpy views (no copy): ``trajflight.bench._peer_ray``'s ``BatchProducer`` and ``batch_to_torch``, which
  ``trajflight bench``'s ``ray`` entry uses too. Ray runs on loopback.
* trajflight, public client over ``LocalCluster(servers=1)`` (one storage server process with its arena,
  the controller in this process), with the transport chosen automatically (shared memory here) and,
  beside it, forced to Flight:

  - put: ``Writer.put`` per group, and ``Writer.put_many`` of the whole batch, from the numpy arrays
    (encoding included) to READY in the controller: given the groups' columns (encoded together,
    ``encode_groups``), and given one ``encode_group`` batch per group (joined by the put); and
    ``put_many`` of groups encoded together beforehand (the data plane alone, as Ray's figure puts
    ready-made arrays);
  - get: ``Trainer.lease`` of every group, then ``LeasedBatch.fetch(columns)`` to jagged torch tensors of
    the six payload columns Ray's object holds (timed from the lease's return: "from lease granted"), for
    the batch put with ``put_many`` and for the groups put one by one; and ``fetch()`` of all 12 stored
    columns (key columns too). The lease is timed too and reported beside it, with "lease + get": a
    lease's fencing call to a same-host server (``shm_open``) also hands over the segments, which the
    get then reads with no call while the server's fence board shows the lease still valid. "commit"
    is the lease's commit, after which it lets go of what its get mapped (timed apart: the kernel frees
    the segment's pages there when the server has unlinked it);
  - small group: put one group of 8 samples, lease it, fetch it to torch: p50 and p99.

Figures are medians with min..max over ``--repeats`` runs (latency: over ``--latency-iters``), with torch
limited to one intra-op thread for every system. "get + read every byte" also sums every payload value
after the get (what a trainer pays to page the data in). Timing never decides anything here; the targets
are printed beside the figures.

Usage::

    python bench/bench_same_host.py [--repeats 7] [--latency-iters 200] [--no-ray] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import trajflight
from trajflight.bench._system import SystemUnavailable
from trajflight.workload import SyntheticGroup, make_workload

# Seconds between a batch's drain and the next put: the server re-creates pre-faulted segments meanwhile.
# The puts start with cold caches after it (the 32 MiB L3 is shared), so memcpy is timed after it too.
PAUSE = 0.3

COLUMNS = ("prompt_ids", "response_ids", "response_logprobs", "loss_mask", "reward", "advantage")


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "median": statistics.median(s),
        "min": s[0],
        "max": s[-1],
        "p99": s[min(len(s) - 1, round(0.99 * (len(s) - 1)))],
        "n": len(s),
    }


def _fmt(st: dict[str, float], payload: int | None = None) -> str:
    text = f"{st['median'] * 1e3:8.3f} ms [{st['min'] * 1e3:.3f}..{st['max'] * 1e3:.3f}]"
    if payload:
        text += f"  {payload / st['median'] / 1e9:6.2f} GB/s"
    return text


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------- memcpy


def bench_memcpy(groups: list[SyntheticGroup], repeats: int) -> dict[str, Any]:
    from trajflight.bench._system import group_arrays

    arrays = [group_arrays(g) for g in groups]
    total = sum(g.payload_bytes for g in groups)
    dst = np.ones(total, dtype=np.uint8)  # pre-faulted

    def copy() -> None:
        pos = 0
        for part in arrays:
            for name in COLUMNS:
                src = part[name].view(np.uint8)
                np.copyto(dst[pos : pos + src.nbytes], src)
                pos += src.nbytes

    copy()
    hot = [_timed(copy) for _ in range(max(repeats, 15))]
    cold = []
    for _ in range(max(repeats, 7)):
        time.sleep(PAUSE)
        cold.append(_timed(copy))
    return {"copy": _stats(hot), "copy_after_pause": _stats(cold)}


# ------------------------------------------------------------------------------------------- Ray


def touch(tensors: dict[str, Any]) -> float:
    """Read every payload byte once (sum the values): what a consumer pays to page the data in."""
    total = 0.0
    for value in tensors.values():
        data = value.values() if getattr(value, "is_nested", False) else value
        total += float(data.sum())
    return total


def bench_ray(args: argparse.Namespace) -> dict[str, Any]:
    from trajflight.bench._peer_ray import BatchProducer, batch_to_torch, ensure_ray, shutdown_ray

    ray = ensure_ray()  # on loopback, as the harness starts it (SystemUnavailable without ray)
    try:
        producer = ray.remote(num_cpus=0)(BatchProducer).remote(
            args.groups, args.samples, args.seed, columns=COLUMNS
        )
        puts, roundtrips, gets, touched = [], [], [], []
        for _ in range(args.repeats + 1):  # the first run warms the object store (page faults)
            t0 = time.perf_counter()
            wrapped, inside = ray.get(producer.put_batch.remote(), timeout=120)
            roundtrips.append(time.perf_counter() - t0)
            puts.append(inside)
            ref = wrapped[0]
            gets.append(_timed(lambda ref=ref: batch_to_torch(ray.get(ref, timeout=60), COLUMNS)))
            touched.append(_timed(lambda ref=ref: touch(batch_to_torch(ray.get(ref, timeout=60), COLUMNS))))
            del ref, wrapped
        return {
            "put_in_actor": _stats(puts[1:]),
            "put_call_roundtrip": _stats(roundtrips[1:]),
            "get_to_torch": _stats(gets[1:]),
            "get_and_touch": _stats(touched[1:]),
        }
    finally:
        shutdown_ray()


# ------------------------------------------------------------------------------------ trajflight


def bench_trajflight(
    groups: list[SyntheticGroup], transport: str, args: argparse.Namespace
) -> dict[str, Any]:
    job = "bench"
    out: dict[str, Any] = {}
    with trajflight.LocalCluster(servers=1, capacity="8GiB", processes=True) as cluster:
        client = cluster.client(transport=transport)  # type: ignore[arg-type]
        client.open_job(job, 1)
        writer = client.writer(job, 1, writer_id="bench-writer")
        trainer = client.trainer(job, owner="bench-trainer", ttl=300.0)
        location = cluster.server_locations[0]
        out["shm"] = client.storage.uses_shm(location)
        columns = [{**g.columns(), "group_id": g.group_id} for g in groups]

        def drain() -> None:
            while (lease := trainer.try_lease(4096, wait=0.0, renew=False)) is not None:
                lease.commit()
            cluster.wait_idle(job, timeout=60.0)
            time.sleep(PAUSE)  # let the server re-create pre-faulted segments in the background

        def one_by_one() -> None:
            for g in groups:
                writer.put(g.encode(job, 1))

        def batched() -> None:  # from the numpy arrays: the groups' columns, encoded together
            writer.put_many([g.columns() for g in groups])

        def batched_groupwise() -> None:  # each group encoded on its own (encode_group), then put together
            writer.put_many([g.encode(job, 1) for g in groups])

        encoded: list[Any] = [None]

        def batched_encoded() -> None:  # the data plane alone: groups encoded (together) before the clock
            writer.put_many(encoded[0])

        keys = (
            "put",
            "put_many",
            "put_many_groupwise",
            "put_many_encoded",
            "lease",
            "lease_and_get",
            "get",
            "get_all_columns",
            "get_one_by_one",
            "get_and_touch",
            "commit",
        )
        results: dict[str, list[float]] = {k: [] for k in keys}
        for rep in range(args.repeats + 1):  # the first run warms the arena and the caches
            plan = (
                ("put", one_by_one, "get_one_by_one"),
                ("put_many", batched, "get"),
                ("put_many_groupwise", batched_groupwise, None),
                ("put_many_encoded", batched_encoded, None),
            )
            for name, put, get_name in plan:
                if name == "put_many_encoded":
                    encoded[0] = trajflight.codec.encode_groups(job_id=job, epoch=1, groups=columns)
                took = _timed(put)
                t0 = time.perf_counter()
                lease = trainer.lease(len(groups), wait=30.0, renew=False)
                leased = time.perf_counter() - t0
                if len(lease) != len(groups):
                    raise RuntimeError(f"leased {len(lease)} groups, expected {len(groups)}")
                got = _timed(lambda lease=lease: lease.fetch(COLUMNS))
                if name == "put_many" and rep:
                    results["lease"].append(leased)
                    results["lease_and_get"].append(leased + got)
                if name == "put_many" and rep:
                    results["get_all_columns"].append(_timed(lease.fetch))
                    results["get_and_touch"].append(
                        _timed(lambda lease=lease: touch(_tensors(lease.fetch(COLUMNS))))
                    )
                t0 = time.perf_counter()
                lease.commit()  # the lease lets go of what it mapped: unmapped here (timed apart)
                del lease
                if name == "put_many" and rep:
                    results["commit"].append(time.perf_counter() - t0)
                drain()
                if rep:
                    results[name].append(took)
                    if get_name is not None:
                        results[get_name].append(got)
        for name, xs in results.items():
            out[name] = _stats(xs)

        small = []
        for i in range(args.latency_iters + 10):
            g = groups[i % len(groups)]
            t0 = time.perf_counter()
            writer.put(g.encode(job, 1))
            lease = trainer.lease(1, wait=10.0, renew=False)
            lease.fetch()
            took = time.perf_counter() - t0
            lease.commit()
            del lease  # outside the timed span, as for the batches
            if i >= 10:
                small.append(took)
        out["small_put_lease_get"] = _stats(small)
        client.close()
    return out


def _tensors(batch: Any) -> dict[str, Any]:
    return {name: batch.tensors[name] for name in COLUMNS}


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--latency-iters", type=int, default=200)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray reference")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    import torch

    # One intra-op thread: on this project's 2-core machines torch's thread pool fights the server process
    # and turns a 1 ms reduction into a 2..30 ms one at random; the same setting holds for every system.
    torch.set_num_threads(1)
    groups = make_workload(args.groups, args.samples, seed=args.seed)
    payload = sum(g.payload_bytes for g in groups)
    report: dict[str, Any] = {
        "workload": {"groups": args.groups, "samples": args.samples, "payload_bytes": payload},
        "repeats": args.repeats,
    }
    print(
        f"workload: {args.groups} groups x {args.samples} samples, payload {payload / 1e6:.2f} MB", flush=True
    )
    report["memcpy"] = bench_memcpy(groups, args.repeats)
    print(f"memcpy of the payload           {_fmt(report['memcpy']['copy'], payload)}")
    print(
        f"memcpy after a {PAUSE:g} s pause      {_fmt(report['memcpy']['copy_after_pause'], payload)}",
        flush=True,
    )
    if not args.no_ray:
        try:
            report["ray"] = bench_ray(args)
        except SystemUnavailable:
            print("ray: not installed (pip install 'trajflight[ray]'); skipped", flush=True)
        else:
            r = report["ray"]
            print(f"ray put (ray.put in the actor)  {_fmt(r['put_in_actor'], payload)}")
            print(f"ray put (actor call round trip) {_fmt(r['put_call_roundtrip'], payload)}")
            print(f"ray get to torch (1 object)     {_fmt(r['get_to_torch'], payload)}")
            print(f"ray get + read every byte       {_fmt(r['get_and_touch'], payload)}", flush=True)
    for transport in ("auto", "flight"):
        t = report[f"trajflight_{transport}"] = bench_trajflight(groups, transport, args)
        label = f"trajflight {'shm' if t['shm'] else 'flight'}"
        print(f"{label} put (one by one)      {_fmt(t['put'], payload)}")
        print(f"{label} put_many (batched)    {_fmt(t['put_many'], payload)}")
        print(f"{label} put_many, group-wise  {_fmt(t['put_many_groupwise'], payload)}")
        print(f"{label} put_many, pre-encoded {_fmt(t['put_many_encoded'], payload)}")
        print(f"{label} lease (64 groups)     {_fmt(t['lease'])}")
        print(f"{label} get to torch          {_fmt(t['get'], payload)}")
        print(f"{label} lease + get           {_fmt(t['lease_and_get'], payload)}")
        print(f"{label} get, all 12 columns   {_fmt(t['get_all_columns'], payload)}")
        print(f"{label} get + read every byte {_fmt(t['get_and_touch'], payload)}")
        print(f"{label} get (put one by one)  {_fmt(t['get_one_by_one'], payload)}")
        print(f"{label} commit (and unmap)    {_fmt(t['commit'])}")
        print(
            f"{label} small put+lease+get   {_fmt(t['small_put_lease_get'])}  p99 "
            f"{t['small_put_lease_get']['p99'] * 1e3:.3f} ms",
            flush=True,
        )

    shm = report["trajflight_auto"]
    memcpy = report["memcpy"]["copy"]["median"]
    targets = {
        "put_many >= 0.5x memcpy": (memcpy / shm["put_many"]["median"], 0.5),
        "small p50 <= 1 ms": (shm["small_put_lease_get"]["median"] * 1e3, 1.0),
    }
    print("\ntargets (same-host path):")
    print(f"  put_many / memcpy throughput: {targets['put_many >= 0.5x memcpy'][0]:.3f} (target >= 0.5)")
    pre = memcpy / shm["put_many_encoded"]["median"]
    print(f"  put_many of pre-encoded batches / memcpy throughput: {pre:.3f}")
    cold = report["memcpy"]["copy_after_pause"]["median"]
    print(
        f"  against memcpy after the puts' pause: put_many {cold / shm['put_many']['median']:.3f}, "
        f"pre-encoded {cold / shm['put_many_encoded']['median']:.3f}"
    )
    if "ray" in report:
        ray_put = report["ray"]["put_in_actor"]["median"]
        print(
            f"  put_many, Ray's put time / trajflight time: {ray_put / shm['put_many']['median']:.2f} "
            f"(pre-encoded {ray_put / shm['put_many_encoded']['median']:.2f})"
        )
    if "ray" in report:
        ratio = report["ray"]["get_to_torch"]["median"] / shm["get"]["median"]
        targets["get >= ray"] = (ratio, 1.0)
        print(f"  get to torch, Ray time / trajflight time: {ratio:.2f} (target >= 1)")
        touch_ratio = report["ray"]["get_and_touch"]["median"] / shm["get_and_touch"]["median"]
        print(f"  get + read every byte, Ray time / trajflight time: {touch_ratio:.2f}")
    print(f"  small put+lease+get p50: {targets['small p50 <= 1 ms'][0]:.3f} ms (target <= 1 ms)")
    report["targets"] = {k: {"value": v, "target": t} for k, (v, t) in targets.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
