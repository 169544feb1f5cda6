"""``trajflight up``: start a standing embedded data plane and print how to connect to it.

Runs until SIGTERM or SIGINT (Ctrl-C), then shuts everything down. The first line on stdout is the
address (``grpc://127.0.0.1:PORT``), so scripts can read it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``up``."""
    parser.add_argument("--servers", type=int, default=2, help="storage server processes (default 2)")
    parser.add_argument("--capacity", default="2GiB", help="bytes each server may hold (default 2GiB)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    parser.add_argument("--state-dir", default=None, help="controller journal directory (crash recovery)")


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; returns the exit status."""
    from trajflight._cluster import LocalCluster
    from trajflight.errors import TrajflightError

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cluster = LocalCluster(
            servers=args.servers, capacity=args.capacity, host=args.host, state_dir=args.state_dir
        ).start()
    except TrajflightError as exc:
        print(f"trajflight up: {exc}", file=sys.stderr)
        return 2
    try:
        print(cluster.address, flush=True)
        print(
            f"trajflight data plane up: controller at {cluster.address}, {args.servers} storage servers "
            f"({', '.join(cluster.server_locations)}).\n"
            f"  connect:  client = trajflight.connect({cluster.address!r})\n"
            f"  stats:    trajflight stats {cluster.address}\n"
            "  stop:     Ctrl-C or SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    finally:
        cluster.close()
    return 0
