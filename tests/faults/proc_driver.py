"""A driver of the fault suite: a process that runs the embedded data plane (``LocalCluster``) as a user's
script would, so a scenario can kill it or ask it to close.

It starts ``LocalCluster(servers=N)``, opens job ``--job``, puts ``--groups`` groups through shared memory,
logs ``up`` (address, shared-memory directory) and then waits: until ``--close-file`` exists,
when it logs ``closing``, calls ``LocalCluster.close()`` and logs ``closed``; or until it is killed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _childkit as kit


def main() -> None:
    kit.die_with_parent()
    parser = argparse.ArgumentParser()
    kit.add_fault_arguments(parser)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--job", default="driven")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--close-file", default=None)
    args = parser.parse_args()
    events = kit.Events(args.events)

    import trajflight
    from trajflight.workload import make_workload

    cluster = trajflight.LocalCluster(servers=args.servers, capacity="64MiB", timeout=10.0).start()
    client = cluster.client()
    client.open_job(args.job, 1)
    writer = client.writer(args.job, 1)
    for g in make_workload(args.groups, 4, seed=1, response_median=32):
        writer.put(**g.columns())
    events.emit("up", address=cluster.address, shm_dir=cluster.shm_dir)
    while not (args.close_file and os.path.exists(args.close_file)):
        time.sleep(0.1)
    events.emit("closing")
    cluster.close()
    events.emit("closed")


if __name__ == "__main__":
    main()
    sys.exit(0)
