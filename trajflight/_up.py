"""``trajflight up``: start a standing embedded data plane and print how to connect to it.

Runs until SIGTERM or SIGINT (Ctrl-C), then shuts everything down. The first line on stdout is the
address (``grpc://127.0.0.1:PORT``), so scripts can read it; stderr gets one line when the data plane
is up and one when it stopped (as ``trajflight server`` does).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from trajflight import logs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``up``."""
    parser.add_argument("--servers", type=int, default=2, help="storage server processes (default 2)")
    parser.add_argument("--capacity", default="2GiB", help="bytes each server may hold (default 2GiB)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    parser.add_argument(
        "--port", type=int, default=0, help="the controller's TCP port; 0 picks a free one (default)"
    )
    parser.add_argument("--state-dir", default=None, help="controller journal directory (crash recovery)")
    parser.add_argument(
        "--archive",
        default=None,
        help="archive committed groups here as Parquet before deleting them (a path or pyarrow.fs URI)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the controller's Prometheus metrics on this port (0: a free one), each storage "
        "server's on a free port of its own; the stderr line names them. Default: off",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="interface of the metrics endpoints (default: loopback)"
    )
    logs.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; returns the exit status."""
    import pyarrow as pa

    from trajflight._cluster import LocalCluster
    from trajflight.errors import TrajflightError

    try:
        logs.setup_from_args(args)
    except TrajflightError as exc:
        print(f"trajflight up: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"trajflight up: --port must be 0..65535, got {args.port}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cluster = LocalCluster(
            servers=args.servers,
            capacity=args.capacity,
            host=args.host,
            port=args.port,
            state_dir=args.state_dir,
            archive=args.archive,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        ).start()
    except TrajflightError as exc:
        print(f"trajflight up: {exc}", file=sys.stderr)
        return 2
    except pa.ArrowException as exc:  # gRPC's bind failure says only "Server did not start properly"
        print(
            f"trajflight up: the controller could not listen on {args.host}:{args.port} ({exc}); "
            "is the port in use? Pick another --port, or 0 for a free one",
            file=sys.stderr,
        )
        return 2
    try:
        print(cluster.address, flush=True)
        print(
            f"trajflight up: serving on {cluster.address} (controller; storage servers "
            f"{', '.join(cluster.server_locations)}){_metrics_note(cluster.metrics_urls)}; stop with Ctrl-C "
            "or SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    finally:
        cluster.close()
    print("trajflight up: stopped", file=sys.stderr, flush=True)
    return 0


def _metrics_note(urls: dict[str, str]) -> str:
    """`` (metrics: controller http://..., server-0 http://...)`` or nothing without metrics."""
    if not urls:
        return ""
    return " (metrics: " + ", ".join(f"{name} {url}" for name, url in urls.items()) + ")"
