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
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from trajflight.errors import ConfigError

if TYPE_CHECKING:
    from trajflight.flight_server import TlsConfig

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
    from trajflight.auth import add_secret_arguments  # light: the CLI's --help imports nothing heavy

    add_secret_arguments(parser, "the data plane")
    tls = parser.add_argument_group(
        "TLS", "serve every endpoint over grpc+tls:// (clients: trajflight.connect(address, tls=...))"
    )
    tls.add_argument(
        "--tls-cert", default=None, help="PEM certificate chain of every endpoint (with --tls-key)"
    )
    tls.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    tls.add_argument("--tls-ca", default=None, help="PEM CA that signed --tls-cert (the plane's own clients)")
    tls.add_argument(
        "--tls-client-ca", default=None, help="PEM CA client certificates must chain to: mutual TLS"
    )
    tls.add_argument(
        "--tls-client-cert", default=None, help="with --tls-client-ca: the plane's own client certificate"
    )
    tls.add_argument("--tls-client-key", default=None, help="the private key of --tls-client-cert")
    tls.add_argument(
        "--dev-tls",
        default=None,
        metavar="DIR",
        help="make a private CA and certificates in DIR (development only) and serve mutual TLS with them",
    )


def _tls(args: argparse.Namespace) -> tuple[TlsConfig | None, TlsConfig | None]:
    """The servers' and the plane's own clients' TLS material from the ``--tls-*``/``--dev-tls`` options.

    Raises:
        ConfigError: an option without the ones it needs, or a file that cannot be read.
    """
    from trajflight.flight_server import TlsConfig

    given = [
        n
        for n in ("cert", "key", "ca", "client_ca", "client_cert", "client_key")
        if getattr(args, f"tls_{n}")
    ]
    if args.dev_tls is not None:
        if given:
            raise ConfigError(
                "--dev-tls makes its own certificates: drop the --tls-* options", setting="dev-tls"
            )
        from trajflight.devcerts import make_dev_certs

        certs = make_dev_certs(args.dev_tls, hosts=sorted({args.host, "127.0.0.1", "localhost"}))
        return certs.server, certs.client
    if not given:
        return None, None
    if args.tls_cert is None or args.tls_ca is None:
        raise ConfigError(
            "TLS needs --tls-cert, --tls-key and --tls-ca (the CA that signed the certificate, for the "
            "plane's own clients)",
            setting="tls-cert",
        )
    if (args.tls_client_ca is None) != (args.tls_client_cert is None):
        raise ConfigError(
            "mutual TLS needs --tls-client-ca and the plane's own --tls-client-cert/--tls-client-key",
            setting="tls-client-ca",
        )
    server = TlsConfig.from_files(args.tls_cert, args.tls_key, args.tls_client_ca)
    client = TlsConfig.from_files(args.tls_client_cert, args.tls_client_key, args.tls_ca)
    return server, client


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; returns the exit status."""
    import pyarrow as pa

    from trajflight._cluster import LocalCluster
    from trajflight.auth import deployment_secret
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
        tls, client_tls = _tls(args)
        cluster = LocalCluster(
            servers=args.servers,
            capacity=args.capacity,
            host=args.host,
            port=args.port,
            state_dir=args.state_dir,
            archive=args.archive,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            tls=tls,
            client_tls=client_tls,
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
            f"{', '.join(cluster.server_locations)}){_metrics_note(cluster.metrics_urls)}; stop with Ctrl-C "
            "or SIGTERM",
            file=sys.stderr,
            flush=True,
        )
        if args.dev_tls is not None:
            print(
                f"trajflight up: clients connect with tls=TlsConfig.from_files('{args.dev_tls}/client.pem', "
                f"'{args.dev_tls}/client.key', '{args.dev_tls}/ca.pem')",
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


def _metrics_note(urls: dict[str, str]) -> str:
    """`` (metrics: controller http://..., server-0 http://...)`` or nothing without metrics."""
    if not urls:
        return ""
    return " (metrics: " + ", ".join(f"{name} {url}" for name, url in urls.items()) + ")"
