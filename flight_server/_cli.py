"""``trajflight server``: run one storage server (loopback by default) until SIGTERM or SIGINT.

The first line on stdout is the server's location (``grpc://127.0.0.1:40123``), so a parent process can
read it; everything else goes to stderr. On SIGTERM/SIGINT the server shuts down from a helper thread
with a deadline (``--shutdown-grace``); if a stalled client keeps a call open past it, the process exits
anyway (``os._exit``), so the whole shutdown takes under 5 s with the defaults.

The deployment secret is read from ``--secret-file`` or the ``TRAJFLIGHT_SECRET`` environment variable
(never from the command line, where ``ps`` shows it); with it every call needs a bearer token
(``docs/auth.md``). A non-loopback ``--host`` without a secret is refused unless ``--insecure``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from types import FrameType

from trajflight import logs
from trajflight.auth import add_secret_arguments, load_keyring
from trajflight.errors import ConfigError, TrajflightError
from trajflight.flight_server._tls import TlsConfig
from trajflight.units import format_size, parse_duration, parse_size

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``server`` subcommand's options."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    parser.add_argument("--capacity", default="8GiB", help="bytes held at most, e.g. 8GiB (default)")
    parser.add_argument("--max-groups", type=int, default=1_000_000, help="groups held at most")
    parser.add_argument("--max-group-size", default="2GiB", help="largest single group, e.g. 256MiB")
    parser.add_argument("--retry-after", default="1s", help="retry hint of capacity refusals, e.g. 500ms")
    add_secret_arguments(parser, "the storage server")
    parser.add_argument("--shutdown-grace", default="3s", help="wait this long for in-flight calls on exit")
    logs.add_arguments(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics over HTTP on this port (0: a free one; health names it). Default: off",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="interface of the metrics endpoint (default: loopback)"
    )
    parser.add_argument(
        "--shm-dir",
        default=None,
        help="shared-memory arena for same-node writers and readers: a private directory on tmpfs "
        "(created 0700; orphaned segments of a previous run are swept), or 'auto' for a fresh "
        "/dev/shm/trajflight-<uuid>. Default: none (Flight only)",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop (as on SIGTERM) when the process that started this server exits, even if it is killed "
        "(LocalCluster starts its servers so: a crashed driver leaves no server behind)",
    )
    parser.add_argument(
        "--tls-cert", default=None, help="PEM certificate chain: serve grpc+tls:// (with --tls-key)"
    )
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca",
        default=None,
        help="PEM CA that client certificates must chain to: mutual TLS (clients without one are refused)",
    )
    parser.add_argument("--shm-pool", default="512MiB", help="free pre-faulted segments kept for reuse")
    parser.add_argument("--shm-ttl", default="30s", help="how long a same-node put may take to publish")


def _tls(args: argparse.Namespace) -> TlsConfig | None:
    """The server's TLS material from ``--tls-*`` (None: plaintext).

    Raises:
        ConfigError: a client CA without a certificate, or an unreadable file.
    """
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key", setting="tls-client-ca")
        return None
    return TlsConfig.from_files(args.tls_cert, args.tls_key, args.tls_client_ca)


PARENT_POLL = 0.5
"""Seconds between two checks of ``--exit-with-parent``."""


def _stop_with_parent(stop: threading.Event) -> None:
    """Set ``stop`` once this process's parent is gone (it is re-parented: its parent id changes)."""
    parent = os.getppid()

    def watch() -> None:
        while not stop.wait(PARENT_POLL):
            if os.getppid() != parent:
                print("trajflight server: the process that started it exited; stopping", file=sys.stderr)
                stop.set()

    threading.Thread(target=watch, name="trajflight-parent-watch", daemon=True).start()


_DEPLOYMENT = re.compile(r"trajflight-[0-9a-f]{32}\Z")


def remove_empty_deployment_dir(shm_dir: str | None) -> None:
    """Remove the deployment directory around this server's arena (``LocalCluster``'s layout,
    ``.../trajflight-<uuid>/server-<i>``) once no other server's directory is left in it.

    The last server of a cluster whose driver was killed (``--exit-with-parent``) so leaves nothing
    behind. ``rmdir`` refuses a directory that is not empty, so a deployment with a live server (its
    directory holds that server's) is never touched; a cluster that closes normally removes the
    directory itself, and this finds nothing to do.
    """
    if not shm_dir or shm_dir == "auto":
        return
    parent = os.path.dirname(os.path.abspath(shm_dir))
    if _DEPLOYMENT.match(os.path.basename(parent)):
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status (0 after a clean or deadline-forced stop)."""
    from trajflight.flight_server._server import StorageServer
    from trajflight.flight_server._store import StoreLimits

    try:
        logs.setup_from_args(args)
        limits = StoreLimits(
            capacity_bytes=parse_size(args.capacity, setting="capacity"),
            capacity_groups=args.max_groups,
            max_group_bytes=parse_size(args.max_group_size, setting="max-group-size"),
            retry_after=parse_duration(args.retry_after, setting="retry-after"),
        )
        grace = parse_duration(args.shutdown_grace, setting="shutdown-grace")
        arena = None
        if args.shm_dir:
            from trajflight.flight_server.shm._arena import ShmArena

            arena = ShmArena(
                None if args.shm_dir == "auto" else args.shm_dir,
                pool_bytes=parse_size(args.shm_pool, setting="shm-pool"),
            )
        server = StorageServer(
            args.host,
            args.port,
            limits=limits,
            keyring=load_keyring(args.secret_file),
            insecure=args.insecure,
            arena=arena,
            shm_ttl=parse_duration(args.shm_ttl, setting="shm-ttl"),
            tls=_tls(args),
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        )
    except TrajflightError as exc:
        print(f"trajflight server: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if args.exit_with_parent:
        _stop_with_parent(stop)
    print(server.location, flush=True)
    print(
        f"trajflight server: serving on {server.location} (capacity {format_size(limits.capacity_bytes)}"
        f"{'; metrics ' + server.metrics_url if server.metrics_url else ''}); stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(0.5):  # a timed wait so the main thread runs signal handlers promptly
        pass
    closed = server.close(timeout=grace)  # removes the arena's own directory in either case
    remove_empty_deployment_dir(args.shm_dir)
    if closed:
        print("trajflight server: stopped", file=sys.stderr, flush=True)
        return 0
    # A stalled client keeps gRPC's shutdown waiting; the data is in memory only, nothing to flush.
    print(
        f"trajflight server: in-flight calls still open after {grace:g}s; exiting anyway",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(0)
