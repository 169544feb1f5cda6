"""The controller of the fault suite in a process of its own, so a scenario can SIGKILL and restart it.

It hosts :class:`~trajflight.controller.LocalController` (with its sweeper, deleting and fencing through
a storage pool, journaling to ``--state-dir`` when given) behind
:class:`~trajflight._control.ControlServer` on ``--port``, registers the storage servers it is given
(``--server ID=LOCATION``, again at every start: the call is idempotent), and prints its address as its
first line, as ``LocalCluster`` wires the embedded plane in one process. Started again on the same state
directory and port, it recovers the ledger from its journal and clients reconnect to the same address;
on a fresh state directory it starts empty (a job is then restored from a checkpoint).

SIGTERM stops it: the control server is shut down with a deadline and the process exits even if a call
(a parked long poll) keeps the shutdown waiting, so a test never hangs on it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

import _childkit as kit


def main() -> None:
    kit.die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--server", action="append", default=[], help="ID=LOCATION")
    parser.add_argument("--capacity", type=int, required=True, help="bytes per server")
    parser.add_argument("--max-groups", type=int, required=True, help="groups per server")
    parser.add_argument("--delete-timeout", type=float, default=3.0)
    args = parser.parse_args()

    from trajflight._control import ControlServer
    from trajflight._storage import StoragePool
    from trajflight.controller import ControllerClient, LocalController, LocalTransport
    from trajflight.flight_server import host_id

    pool = StoragePool(timeout=args.delete_timeout)
    controller = LocalController(deleter=pool.delete, fencer=pool.fence_groups, state_dir=args.state_dir)
    control = ControlServer(controller, host="127.0.0.1", port=args.port)
    local = ControllerClient(LocalTransport(controller), timeout=10.0)
    for spec in args.server:
        server_id, _, location = spec.partition("=")
        local.register_server(
            server_id,
            node=host_id(),
            location=location,
            capacity_bytes=args.capacity,
            capacity_groups=args.max_groups,
        )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(control.location, flush=True)
    print(
        f"fault-suite controller at {control.location}, incarnation {controller.incarnation}",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(0.2):
        pass
    closer = threading.Thread(target=control.shutdown, daemon=True)
    closer.start()
    closer.join(3.0)
    if closer.is_alive():
        print(
            "fault-suite controller: a call kept the shutdown waiting; exiting", file=sys.stderr, flush=True
        )
    else:
        controller.close()
        pool.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
