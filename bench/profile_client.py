"""Profile trajflight's public client on the standard workload (cProfile), to see where the time goes.

Runs the same operations as ``trajflight bench`` does for trajflight (``Writer.put`` per group, lease +
``LeasedBatch.fetch`` jagged and padded, the small-group round trip) under cProfile, in this process,
against ``LocalCluster(servers=2, processes=True)``, and prints the top functions by cumulative and by
own time for each. Server-side time does not show here (other processes): use ``py-spy record --pid``.

    .venv/bin/python bench/profile_client.py [--what put,get,padded,small] [--rounds 5] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from collections.abc import Callable

from trajflight import LocalCluster
from trajflight.workload import make_workload

JOB = "prof"


def _profile(name: str, fn: Callable[[], None], rounds: int, top: int) -> None:
    prof = cProfile.Profile()
    for _ in range(rounds):
        prof.enable()
        fn()
        prof.disable()
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats(order).print_stats(top)
        print(f"==== {name}: top {top} by {order} ({rounds} rounds)")
        print(out.getvalue().split("\n", 6)[-1] if order == "cumulative" else out.getvalue())


def main(argv: list[str] | None = None) -> int:
    """Profile the operations named by ``--what``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="put,get,padded,small")
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    what = set(args.what.split(","))
    groups = make_workload(args.groups, 8, seed=0)
    with LocalCluster(servers=2, capacity="8GiB", processes=True) as cluster, cluster.client() as client:
        client.open_job(JOB, 1)
        writer = client.writer(JOB, 1)
        trainer = client.trainer(JOB, ttl=120.0)

        def put_all() -> None:
            for g in groups:
                writer.put(g.encode(JOB, 1))

        def drain() -> None:
            while (lease := trainer.try_lease(4096, renew=False)) is not None:
                lease.commit()
            cluster.wait_idle(JOB, timeout=60)

        put_all()  # warm-up
        drain()
        if "put" in what:
            _profile("Writer.put x groups", put_all, args.rounds, args.top)
            drain()
        put_all()
        lease = trainer.lease(len(groups), wait=10, renew=False)
        lease.fetch()
        if "get" in what:
            _profile("LeasedBatch.fetch(jagged)", lambda: lease.fetch(), args.rounds, args.top)
        if "padded" in what:
            _profile("LeasedBatch.fetch(padded)", lambda: lease.fetch(layout="padded"), args.rounds, args.top)
        lease.commit()
        drain()
        if "small" in what:
            state: dict[str, int] = {"i": 0}

            def small() -> None:
                for _ in range(50):
                    state["i"] += 1
                    writer.put(groups[state["i"] % len(groups)].encode(JOB, 1))
                    trainer.lease(1, wait=10, renew=False).fetch()

            _profile("small round trip x50 (put + lease + fetch)", small, 1, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
