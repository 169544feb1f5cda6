"""Before and after each cut of issue 16's remainder, in one process, interleaved round by round.

``trajflight bench``'s trajflight entry (``LocalCluster(servers=2, processes=True)``, the client's default
transport: shared memory here; the standard workload with its two user columns) runs each figure with
each cut switched off and on, in ABBA order, so that both states see the same machine:

* ``merged``: user columns (``extra=``) of numpy arrays on ``encode_groups``' merged tier; off: the
  merged tier steps aside for them, as before (``_encode_merged._user_names`` answers None);
* ``threads``: ``run_parallel`` on kept threads; off: a ``ThreadPoolExecutor`` per call, as before
  (``trajflight._storage.run_parallel`` replaced by the former function);
* ``placement``: a ``put_many`` batch on one server where one holds it all; off: placed group by group,
  as before (``Grants._batch_server`` answers None).

States: ``before`` (all off), ``+merged``, ``+merged+threads``, ``+merged+threads+placement`` (after).
Figures: ``put_many`` of the groups' columns to READY, ``lease`` of the 64 groups, ``get all``
(``fetch()`` to jagged torch), ``get 2-col``, and the small-group round trip (put one group + lease +
fetch + commit). Timing decides nothing here.

    python bench/bench_cuts16.py [--repeats 9] [--latency-iters 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar
from unittest import mock

from trajflight.bench._drain import drain, summary
from trajflight.bench._stats import timed

T = TypeVar("T")
JOB = "cuts"
SUBSET = ("response_ids", "response_logprobs")
STATES = ("before", "+merged", "+merged+threads", "+merged+threads+placement")


def _pool_per_call(calls: Sequence[Callable[[], T]], *, name: str = "trajflight-call") -> list[T]:
    """``run_parallel`` as it was before the kept threads: a thread pool per call."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix=name) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


@contextlib.contextmanager
def _state(name: str) -> Iterator[None]:
    from trajflight.codec import _encode_merged
    from trajflight.controller._grants import Grants

    with contextlib.ExitStack() as stack:
        if name == "before":
            stack.enter_context(mock.patch.object(_encode_merged, "_user_names", return_value=None))
        if name in ("before", "+merged"):
            stack.enter_context(mock.patch("trajflight._storage.run_parallel", _pool_per_call))
        if name != STATES[-1]:
            stack.enter_context(mock.patch.object(Grants, "_batch_server", return_value=None))
        yield


def main(argv: list[str] | None = None) -> int:
    """Run every state's figures and print the table (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--latency-iters", type=int, default=60)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    import trajflight
    from trajflight.bench._system import encode_with_users, payload_of, user_columns
    from trajflight.workload import make_workload

    torch.set_num_threads(1)
    groups = make_workload(64, 8, seed=0)
    users = [user_columns(g) for g in groups]
    columns = [g.columns(extra=u) for g, u in zip(groups, users, strict=True)]
    batches = [encode_with_users(g, JOB, 1, u) for g, u in zip(groups, users, strict=True)]
    payload, subset = payload_of(groups), payload_of(groups, SUBSET)
    times: dict[str, dict[str, list[float]]] = {
        s: {k: [] for k in ("put_many", "lease", "get_all", "get_subset", "small")} for s in STATES
    }
    load_before = os.getloadavg()
    with trajflight.LocalCluster(servers=args.servers, capacity="8GiB", processes=True) as cluster:
        client = cluster.client()
        client.open_job(JOB, 1)
        writer = client.writer(JOB, 1, writer_id="cuts-writer")
        trainer = client.trainer(JOB, owner="cuts-trainer", ttl=300.0)

        def batch_round(out: dict[str, list[float]] | None) -> None:
            took = {"put_many": timed(functools.partial(writer.put_many, columns))}
            t0 = time.perf_counter()
            lease = trainer.lease(64, wait=30.0, renew=False)
            took["lease"] = time.perf_counter() - t0
            took["get_all"] = timed(lease.fetch)
            took["get_subset"] = timed(functools.partial(lease.fetch, SUBSET))
            lease.commit()
            drain(trainer, cluster, JOB)
            if out is not None:
                for k, v in took.items():
                    out[k].append(v)

        def small_round(out: list[float], iters: int) -> None:
            for i in range(iters):
                t0 = time.perf_counter()
                writer.put(batches[i % len(batches)])
                lease = trainer.lease(1, wait=10.0, renew=False)
                lease.fetch()
                lease.commit()
                out.append(time.perf_counter() - t0)

        for state in STATES:  # warm every path
            with _state(state):
                batch_round(None)
                small_round([], 5)
        for r in range(args.repeats):
            order = STATES if r % 2 == 0 else STATES[::-1]
            for state in order:
                with _state(state):
                    batch_round(times[state])
                    small_round(times[state]["small"], max(1, args.latency_iters // args.repeats))
        client.close()
    report = {
        "servers": args.servers,
        "repeats": args.repeats,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "payload_bytes": payload,
        "states": {s: {k: summary(v) for k, v in d.items()} for s, d in times.items()},
    }
    sizes = {"put_many": payload, "get_all": payload, "get_subset": subset}
    lb, la = load_before[0], report["load_average"]["after"][0]  # type: ignore[index]
    print(f"servers={args.servers}, {args.repeats} rounds, load average {lb:.2f} -> {la:.2f}")
    print("| figure | " + " | ".join(STATES) + " | after / before time |")
    print("|---|" + "---:|" * (len(STATES) + 1))
    for key in ("put_many", "lease", "get_all", "get_subset", "small"):
        cells = []
        for s in STATES:
            st = report["states"][s][key]  # type: ignore[index]
            text = f"{st['median'] * 1e3:.2f} ms [{st['min'] * 1e3:.2f}-{st['max'] * 1e3:.2f}]"
            if key in sizes:
                text += f" {sizes[key] / st['median'] / 1e9:.2f} GB/s"
            cells.append(text)
        ratio = report["states"][STATES[-1]][key]["median"] / report["states"][STATES[0]][key]["median"]  # type: ignore[index]
        print(f"| {key} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
