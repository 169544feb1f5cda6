"""Profile the same-host paths of issue 16 (cProfile), to see where each figure's time goes.

On ``LocalCluster(servers=1, processes=True)`` (``--servers``; one storage server process with its arena,
the controller in this process), with the client's default transport (shared memory on this host), and
the standard workload with its user columns (``extra=``), as ``trajflight bench`` runs it:

* ``put_many``: ``Writer.put_many`` of the groups' columns (encoding inside);
* ``get``: ``LeasedBatch.fetch()`` of every column to jagged torch, of a held lease of the batch;
* ``lease``: ``Trainer.lease`` of the 64 groups just put (fence + open on the server);
* ``small``: one group put + lease + fetch + commit;
* ``rpc``: the handoff's two sides through the control server, in this process, one after the other:
  a client ``trajflight.connect``-ed to ``cluster.address`` puts one group, another leases and fetches it
  (what a writer process and a trainer process each pay; the wait between them is not profiled).

Server-side time does not show here (another process): the figures say what the client pays, which
includes the waits on the server's answers (``{method 'do_action' ...}``, socket reads).

    .venv/bin/python bench/profile_same_host.py [--what put_many,get,lease,small,rpc] [--rounds 20] [--top 20]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import trajflight
from trajflight.bench._drain import drain as drain_job
from trajflight.bench._system import encode_with_users, user_columns
from trajflight.workload import make_workload

JOB = "prof"


def _profile(name: str, fn: Callable[[], Callable[[], None]], rounds: int, top: int) -> None:
    """Profile ``rounds`` calls of what ``fn()`` returns (``fn`` sets each round up, untimed)."""
    prof = cProfile.Profile()
    walls = []
    for _ in range(rounds):
        call = fn()
        t0 = time.perf_counter()
        prof.enable()
        call()
        prof.disable()
        walls.append(time.perf_counter() - t0)
    walls.sort()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    print(f"==== {name}: {rounds} rounds, median {walls[len(walls) // 2] * 1e3:.3f} ms (under the profiler)")
    for order in ("tottime", "cumulative"):
        out.seek(0)
        out.truncate()
        stats.sort_stats(order).print_stats(top)
        text = out.getvalue()
        print(f"---- by {order}")
        print(text[text.find("   ncalls") :], flush=True)


def main(argv: list[str] | None = None) -> int:
    """Profile the operations named by ``--what``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="put_many,get,lease,small,rpc")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--servers", type=int, default=1, help="storage server processes (bench: 2)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    what = set(args.what.split(","))
    groups = make_workload(64, 8, seed=0)
    users = [user_columns(g) for g in groups]
    columns = [g.columns(extra=u) for g, u in zip(groups, users, strict=True)]
    encoded = [encode_with_users(g, JOB, 1, u) for g, u in zip(groups, users, strict=True)]
    with trajflight.LocalCluster(servers=args.servers, capacity="8GiB", processes=True) as cluster:
        client = cluster.client()
        client.open_job(JOB, 1)
        writer = client.writer(JOB, 1, writer_id="prof-writer")
        trainer = client.trainer(JOB, owner="prof-trainer", ttl=300.0)

        def drain() -> None:
            drain_job(trainer, cluster, JOB)

        for _ in range(3):  # warm the arena, the caches, torch's nested tensors
            writer.put_many(columns)
            warm = trainer.lease(64, wait=10.0, renew=False)
            warm.fetch()
            warm.commit()
            drain()

        if "put_many" in what:

            def put_many() -> Callable[[], None]:
                drain()
                return lambda: writer.put_many(columns)

            _profile("put_many (columns, user columns included)", put_many, args.rounds, args.top)
            drain()
        if "lease" in what:
            held: list[Any] = []

            def lease() -> Callable[[], None]:
                while held:
                    held.pop().commit()
                drain()
                writer.put_many(columns)
                return lambda: held.append(trainer.lease(64, wait=10.0, renew=False))

            _profile("lease of 64 groups", lease, args.rounds, args.top)
            while held:
                held.pop().commit()
            drain()
        if "get" in what:
            writer.put_many(columns)
            batch = trainer.lease(64, wait=10.0, renew=False)
            _profile("get all -> jagged torch", lambda: batch.fetch, args.rounds, args.top)
            batch.commit()
            drain()
        if "small" in what:
            state = {"i": 0}

            def small() -> Callable[[], None]:
                state["i"] += 1
                batch = encoded[state["i"] % len(encoded)]

                def run() -> None:
                    writer.put(batch)
                    got = trainer.lease(1, wait=10.0, renew=False)
                    got.fetch()
                    got.commit()

                return run

            _profile("small group put + lease + fetch + commit", small, args.rounds * 5, args.top)
            drain()
        if "rpc" in what:
            wclient = trajflight.connect(cluster.address, timeout=30.0)
            tclient = trajflight.connect(cluster.address, timeout=30.0)
            rwriter = wclient.writer(JOB, 1, writer_id="prof-rpc-writer")
            rtrainer = tclient.trainer(JOB, owner="prof-rpc-trainer", ttl=60.0)
            rwriter.put(encoded[0])
            rtrainer.lease(1, wait=10.0, renew=False).commit()
            state = {"i": 0}

            def put_rpc() -> Callable[[], None]:
                state["i"] += 1
                return lambda: rwriter.put(encoded[state["i"] % len(encoded)])

            _profile(
                "handoff writer side: Writer.put over the control RPC", put_rpc, args.rounds * 5, args.top
            )

            def lease_rpc() -> Callable[[], None]:
                rwriter.put(encoded[0])

                def run() -> None:
                    got = rtrainer.lease(1, wait=10.0, renew=False)
                    got.fetch()
                    got.commit()

                return run

            drain()
            _profile(
                "handoff trainer side: lease + fetch + commit over the control RPC",
                lease_rpc,
                args.rounds * 5,
                args.top,
            )
            wclient.close()
            tclient.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
