"""``trajflight up``: start a standing embedded data plane and print how to connect to it.

Runs until SIGTERM or SIGINT (Ctrl-C), then shuts everything down. The first line on stdout is the
address (``grpc://127.0.0.1:PORT``), so scripts can read it; stderr gets one line when the data plane
is up and one when it stopped (as ``trajflight server`` does).

With a deployment secret (``--secret-file`` or ``TRAJFLIGHT_SECRET``) every endpoint authenticates every
call, and the stderr line says how to mint a credential (``trajflight token``); a non-loopback ``--host``
without one is refused unless ``--insecure``.
"""

from __future__ import annotations

import argparse
import logging
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
    parser.add_argument(
        "--port", type=int, default=0, help="the controller's TCP port; 0 picks a free one (default)"
    )
    parser.add_argument("--state-dir", default=None, help="controller journal directory (crash recovery)")
    parser.add_argument(
        "--archive",
        default=None,
        help="archive committed groups here as Parquet before deleting them (a path or pyarrow.fs URI)",
    )
    parser.add_argument("--log-level", default="WARNING", help="Python logging level for stderr (WARNING)")
    from trajflight.auth import add_secret_arguments  # light: the CLI's --help imports nothing heavy

    add_secret_arguments(parser, "the data plane")


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; returns the exit status."""
    import pyarrow as pa

    from trajflight._cluster import LocalCluster
    from trajflight.auth import deployment_secret
    from trajflight.errors import TrajflightError

    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        print(f"trajflight up: unknown --log-level {args.log_level[:40]!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
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
            secret=deployment_secret(None, args.secret_file),
            insecure=args.insecure,
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
            f"{', '.join(cluster.server_locations)}); stop with Ctrl-C or SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        if cluster.keyring is not None:
            source = f"--secret-file {args.secret_file}" if args.secret_file else "(TRAJFLIGHT_SECRET set)"
            print(
                f"trajflight up: authentication on (signing key {cluster.keyring.signing_kid}); clients "
                f"need a credential: trajflight token --role ROLE --job JOB {source} prints one, pass it "
                "as TRAJFLIGHT_TOKEN or connect(..., token=)",
                file=sys.stderr,
                flush=True,
            )
        while not stop.wait(0.5):
            pass
    finally:
        cluster.close()
    print("trajflight up: stopped", file=sys.stderr, flush=True)
    return 0
