"""Archive benchmark (issue 17): what archiving costs the commit path, its throughput, and SQL over it.

Same run, same machine:

* commit rate with and without an archive: a ``LocalCluster(servers=1)`` (shared memory on this host),
  the standard workload (``trajflight.workload``, 64 groups x 8 samples) put ``--rounds`` times (16 by
  default: 1024 groups, one full archive file, so that no figure waits on the archive's flush timer) with
  ``Writer.put_many`` of pre-encoded groups, each round leased 64 groups at a time, fetched to torch and
  committed; "commits/s" is groups committed over the time of the lease-fetch-commit loop. The same loop
  runs on a cluster without an archive and on one with ``archive=DIR`` (a local directory), alternating
  which goes first per repeat.
* archive throughput: payload bytes over the time from the first commit until every group is archived
  and deleted (``wait_idle``), on the archiving cluster (Parquet, zstd, the archive's own batching).
* SQL over a large archive: ``--samples`` archived samples (default 1M, short responses so that they fit
  in memory), written in the archive's layout (``job_id=<job>/epoch=<n>/``, zstd Parquet) straight with
  pyarrow, then ``SELECT policy_version, count(*), avg(reward), avg(response_length) FROM trajectories
  GROUP BY 1`` through ``trajflight.analytics.scan(...).to_duckdb()`` (the view ``trajflight sql``
  builds), timed from the scan to the result.

* ``--sustained N``: the sustained loop instead (the honest "keeps up with the commit rate" figure). A
  writer thread puts the standard workload (two user columns) ``N`` times, one ``put_many`` a
  workload, into a ``LocalCluster(servers=1)`` that holds ``--capacity-rounds`` workloads at most (256
  groups by default: the writer waits for capacity, as a rollout fleet does), while a trainer leases 64
  groups at a time, fetches them to torch, sleeps ``--step-seconds`` (a simulated training step) and
  commits. Commit throughput (groups/s, payload GB/s) is the groups over the time from the writer's
  first put to the last commit, without and with an archive (``archive_flush`` ``--archive-flush``),
  alternating which goes first per repeat; the ratio is taken per repeat. Several ``--step-seconds``
  values give the step time above which the ratio reaches 0.9.

Targets (printed beside the figures, never decided here): the archive keeps up with the commit rate
with at most 10% less commit throughput; the 1M-sample aggregate runs in under 2 s.

Usage::

    python bench/bench_archive.py [--rounds 16] [--repeats 3] [--samples 1000000] [--json out.json]
    python bench/bench_archive.py --sustained 24 [--step-seconds 0 0.1 0.2] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import trajflight
from trajflight.analytics import scan
from trajflight.bench._system import user_columns
from trajflight.codec import encode_groups
from trajflight.workload import make_workload


def commit_loop(archive: str | None, rounds: int, seed: int) -> dict[str, float]:
    """Put ``rounds`` x the standard workload, then lease-fetch-commit it all; the loop's figures."""
    groups = make_workload(64, 8, seed=seed)
    payload = sum(g.payload_bytes for g in groups) * rounds
    with trajflight.LocalCluster(servers=1, capacity="8GiB", archive=archive) as cluster:
        client = cluster.client()
        client.open_job("bench", 1)
        writer = client.writer("bench", 1)
        for r in range(rounds):
            first = r * len(groups)
            encoded = encode_groups(
                job_id="bench",
                epoch=1,
                groups=[{**g.columns(), "group_id": first + i} for i, g in enumerate(groups)],
            )
            writer.put_many(encoded)
        trainer = client.trainer("bench", ttl=120.0)
        total, done = 64 * rounds, 0
        start = time.perf_counter()
        while done < total:
            with trainer.lease(64, wait=10, renew=False) as batch:
                batch.fetch()
                done += len(batch.handle.groups)
        loop = time.perf_counter() - start
        idle = cluster.wait_idle("bench", timeout=300)
        settled = time.perf_counter() - start
        if idle != (0, 0):
            raise RuntimeError(f"groups still held after 300 s: {idle}")
    if archive is not None:
        _check_archived(archive, total)
    return {"commits_per_s": total / loop, "loop_s": loop, "settled_s": settled, "payload_bytes": payload}


def _encoded_rounds(rounds: int, seed: int) -> tuple[list[Any], int]:
    """``rounds`` x the standard workload with its two user columns, encoded (group ids in order); and
    the payload bytes of one round."""
    groups = make_workload(64, 8, seed=seed)
    out = []
    for r in range(rounds):
        first = r * len(groups)
        columns = [{**g.columns(extra=user_columns(g)), "group_id": first + i} for i, g in enumerate(groups)]
        out.append(encode_groups(job_id="bench", epoch=1, groups=columns))
    return out, sum(g.payload_bytes for g in groups)


def sustained_loop(
    archive: str | None,
    rounds: int,
    seed: int,
    *,
    capacity_rounds: int,
    step_s: float,
    archive_flush: float,
    retry_after: float = 0.02,
) -> dict[str, float]:
    """A writer thread puts ``rounds`` workloads into a plane that holds ``capacity_rounds`` of them while
    the trainer leases, fetches, steps and commits; the commit throughput of the whole run."""
    encoded, payload = _encoded_rounds(rounds, seed)
    capacity = int(1.5 * capacity_rounds * encoded[0].joined.get_total_buffer_size())
    total = 64 * rounds
    cluster = trajflight.LocalCluster(
        servers=1,
        capacity=capacity,
        max_groups=64 * capacity_rounds,
        archive=archive,
        archive_flush=archive_flush,
    )
    with cluster:
        producer, consumer = cluster.client(), cluster.client()
        producer.open_job("bench", 1, {"capacity_retry_after": retry_after})
        writer = producer.writer("bench", 1)
        trainer = consumer.trainer("bench", ttl=120.0)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                for batch in encoded:
                    writer.put_many(batch, timeout=600)
            except BaseException as exc:  # raised in the main thread below
                failed.append(exc)

        thread = threading.Thread(target=write, name="bench-writer", daemon=True)
        done = 0
        start = time.perf_counter()
        thread.start()
        while done < total and not failed:
            with trainer.lease(64, wait=120, renew=False) as batch:
                batch.fetch()
                if step_s:
                    time.sleep(step_s)
                done += len(batch.handle.groups)
        elapsed = time.perf_counter() - start
        thread.join(600)
        if failed:
            raise RuntimeError(f"the writer failed: {failed[0]!r}") from failed[0]
        idle = cluster.wait_idle("bench", timeout=600)
        if idle != (0, 0):
            raise RuntimeError(f"groups still held after 600 s: {idle}")
        producer.close()
        consumer.close()
    if archive is not None:
        _check_archived(archive, total)
    return {
        "groups_per_s": total / elapsed,
        "GBps": payload * rounds / elapsed / 1e9,
        "elapsed_s": elapsed,
        "step_s": step_s,
        "payload_bytes": payload * rounds,
    }


def _check_archived(archive: str, groups: int) -> None:
    """Untimed: every sample of ``groups`` groups archived exactly once."""
    rows = scan(archive, job="bench", columns=["sample_id"]).to_table().column("sample_id")
    if len(rows) != groups * 8 or len(set(rows.to_pylist())) != groups * 8:
        raise RuntimeError(f"the archive holds {len(rows)} rows, expected {groups * 8} distinct samples")


def write_big_archive(root: Path, samples: int, seed: int) -> int:
    """``samples`` rows in the archive's layout (8 samples a group, responses of ~32 tokens); bytes."""
    rng = np.random.default_rng(seed)
    per_file = 131_072
    written = 0
    for start in range(0, samples, per_file):
        n = min(per_file, samples - start)
        lengths = rng.integers(8, 56, size=n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = rng.integers(0, 150_000, size=int(offsets[-1]), dtype=np.int32)
        logprobs = -rng.exponential(1.0, size=int(offsets[-1])).astype(np.float32)
        table = pa.table(
            {
                "group_id": pa.array((start + np.arange(n)) // 8, pa.int64()),
                "sample_index": pa.array(np.arange(n) % 8, pa.int32()),
                "prompt_ids": pa.ListArray.from_arrays(
                    pa.array(np.arange(n + 1, dtype=np.int32) * 4), pa.array(np.ones(4 * n, np.int32))
                ),
                "response_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                "response_logprobs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(logprobs)),
                "reward": pa.array(rng.random(n).astype(np.float32)),
                "policy_version": pa.array(rng.integers(0, 50, size=n), pa.int64()),
            }
        )
        folder = root / "job_id=big" / "epoch=1"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{start:09d}.parquet"
        pq.write_table(table, path, compression="zstd")
        written += path.stat().st_size
    return written


def sql_over(root: Path, repeats: int) -> list[float]:
    """Seconds of the aggregate through scan -> DuckDB, ``repeats`` times after one warm-up."""
    query = (
        "SELECT policy_version, count(*) AS n, avg(reward) AS reward, avg(response_length) AS length "
        "FROM t GROUP BY 1 ORDER BY 1"
    )
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        relation = scan(
            str(root), job="big", columns=["policy_version", "reward", "response_length"]
        ).to_duckdb()
        rows = relation.query("t", query).fetchall()
        if i:
            times.append(time.perf_counter() - start)
        if len(rows) != 50:
            raise RuntimeError(f"expected 50 policy versions, got {len(rows)}")
    return times


def _spread(xs: list[float], unit: str = "", scale: float = 1.0) -> str:
    return f"{statistics.median(xs) * scale:.3f}{unit} [{min(xs) * scale:.3f}..{max(xs) * scale:.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=16,
        help="standard workloads committed per run (16: one full archive file)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1_000_000, help="archived samples for the SQL run")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--sustained", type=int, metavar="N", help="run the sustained loop of N workloads")
    parser.add_argument(
        "--step-seconds", type=float, nargs="+", default=[0.0], help="simulated training steps (sustained)"
    )
    parser.add_argument(
        "--capacity-rounds", type=int, default=4, help="workloads the plane holds (sustained)"
    )
    parser.add_argument("--archive-flush", type=float, default=0.2, help="archive_flush, seconds (sustained)")
    parser.add_argument(
        "--retry-after",
        type=float,
        default=0.02,
        help="the job's capacity_retry_after: how soon a writer waiting for capacity asks again (sustained)",
    )
    args = parser.parse_args(argv)
    if args.sustained:
        return run_sustained(args)
    load = os.getloadavg()
    plain: list[dict[str, float]] = []
    archived: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="trajflight-archive-bench-") as tmp:
        commit_loop(os.path.join(tmp, "warm-up"), 1, 99)  # imports (torch's nested tensors) and first maps
        for rep in range(args.repeats):
            order = ("plain", "archive") if rep % 2 == 0 else ("archive", "plain")
            for kind in order:
                if kind == "plain":
                    plain.append(commit_loop(None, args.rounds, rep))
                else:
                    archived.append(commit_loop(os.path.join(tmp, f"archive-{rep}"), args.rounds, rep))
                print(f"repeat {rep} {kind} done", file=sys.stderr)
        big = Path(tmp) / "big"
        parquet_bytes = write_big_archive(big, args.samples, 0)
        sql = sql_over(big, args.repeats)
    ratios = [a["commits_per_s"] / p["commits_per_s"] for a, p in zip(archived, plain, strict=True)]
    throughput = [a["payload_bytes"] / a["settled_s"] / 1e9 for a in archived]
    print(
        f"commit loop of {64 * args.rounds} groups ({plain[0]['payload_bytes'] / 1e6:.1f} MB), "
        f"{args.repeats} repeats; load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print(f"  without archive  commits/s {_spread([p['commits_per_s'] for p in plain])}")
    print(f"  with archive     commits/s {_spread([a['commits_per_s'] for a in archived])}")
    print(f"  with/without, per repeat: {_spread(ratios)}   (target >= 0.90)")
    print(f"  archive throughput (first commit to all archived and deleted): {_spread(throughput, ' GB/s')}")
    print(
        f"SQL aggregate over {args.samples:,} archived samples ({parquet_bytes / 1e6:.1f} MB of Parquet): "
        f"{_spread(sql, ' s')}   (target < 2 s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "load_before": load,
                    "plain": plain,
                    "archived": archived,
                    "ratios": ratios,
                    "archive_GBps": throughput,
                    "sql_s": sql,
                    "samples": args.samples,
                    "parquet_bytes": parquet_bytes,
                },
                f,
                indent=1,
            )
    return 0


def run_sustained(args: argparse.Namespace) -> int:
    """The sustained loop for every step time, without and with an archive, alternating; prints and
    optionally writes the figures."""
    load = os.getloadavg()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trajflight-archive-sustained-") as tmp:
        sustained_loop(os.path.join(tmp, "warm-up"), 2, 99, capacity_rounds=1, step_s=0.0, archive_flush=0.2)
        for step in args.step_seconds:
            plain: list[dict[str, float]] = []
            archived: list[dict[str, float]] = []
            for rep in range(args.repeats):
                order = ("plain", "archive") if rep % 2 == 0 else ("archive", "plain")
                for kind in order:
                    where = None if kind == "plain" else os.path.join(tmp, f"archive-{step}-{rep}")
                    got = sustained_loop(
                        where,
                        args.sustained,
                        rep,
                        capacity_rounds=args.capacity_rounds,
                        step_s=step,
                        archive_flush=args.archive_flush,
                        retry_after=args.retry_after,
                    )
                    (plain if where is None else archived).append(got)
                    print(
                        f"step {step:g} s, repeat {rep} {kind}: {got['groups_per_s']:.0f} groups/s",
                        file=sys.stderr,
                    )
            ratios = [a["groups_per_s"] / p["groups_per_s"] for a, p in zip(archived, plain, strict=True)]
            results.append({"step_s": step, "plain": plain, "archived": archived, "ratios": ratios})
    after = os.getloadavg()
    print(
        f"sustained loop: {args.sustained} x the standard workload ({64 * args.sustained} groups), "
        f"plane holds {args.capacity_rounds} workloads, archive_flush {args.archive_flush:g} s, "
        f"capacity_retry_after {args.retry_after:g} s, {args.repeats} repeats; "
        f"load average before {load[0]:.2f}, after {after[0]:.2f}"
    )
    print(
        "| step s | groups/s without | groups/s with | GB/s without | GB/s with | with / without (>= 0.90) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p, a = r["plain"], r["archived"]
        print(
            f"| {r['step_s']:g} | {_spread([x['groups_per_s'] for x in p])} | "
            f"{_spread([x['groups_per_s'] for x in a])} | {_spread([x['GBps'] for x in p])} | "
            f"{_spread([x['GBps'] for x in a])} | {_spread(r['ratios'])} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"load_before": load, "load_after": after, "args": vars(args), "results": results},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
