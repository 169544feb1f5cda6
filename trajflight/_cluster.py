"""The embedded data plane: the controller in this process, N storage servers as local processes.

:class:`LocalCluster` needs no Ray. It starts ``trajflight server`` processes on loopback (or, with
``processes=False``, servers in this process's threads, quicker to start in tests), hosts the controller
in-process with its sweeper, serves it to other processes over Flight, registers the servers, and tears
everything down on exit. Other processes reach it with ``trajflight.connect(cluster.address)``.

With a deployment secret (``secret=`` or ``TRAJFLIGHT_SECRET``) every endpoint authenticates every call
(``docs/auth.md``): the servers and the control server check bearer tokens, the controller's own storage
calls and this process's clients use admin tokens minted here, and other processes connect with a
credential (:meth:`LocalCluster.mint`, or ``trajflight token``).

Each storage server gets a shared-memory arena by default (``shm=True``): one private deployment
directory ``/dev/shm/trajflight-<uuid>/`` (0700) with a subdirectory per server, so writers and trainers on
this host move group data through shared memory; remote ones use Flight, served from the same memory.

It does not survive the death of this process: the controller's state lives here unless ``state_dir``
is given (journal + snapshots), and the storage servers hold groups in memory. A server killed with
SIGKILL leaves its segment files behind until it is restarted on the same directory (which sweeps them)
or the cluster closes (which removes the deployment directory). When this process dies without closing
the cluster (a crash, SIGKILL), its server processes notice within a second and stop, removing their
segments; the next cluster started on the machine removes the deployment directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from trajflight._archive import Archive
from trajflight._archive_worker import ArchiveWorker
from trajflight._client import Client
from trajflight._control import ControlServer
from trajflight._storage import StoragePool, Transport, check_tls_pair
from trajflight.auth import Credential, Role, Secret, deployment_secret, mint_for_client, minted
from trajflight.controller import ControllerClient, GroupDeletes, LocalController, LocalTransport
from trajflight.errors import ConfigError, UnavailableError
from trajflight.flight_server import TlsConfig, host_id, sweep_dead_arenas
from trajflight.units import parse_size

__all__ = ["LocalCluster"]


def _read_location(proc: subprocess.Popen[str], log: Path, timeout: float) -> str:
    """First stdout line of a starting server (its location), or UnavailableError with its log."""
    found: list[str] = []
    reader = threading.Thread(
        target=lambda: found.append(proc.stdout.readline() if proc.stdout else ""), daemon=True
    )
    reader.start()
    reader.join(timeout)
    line = found[0].strip() if found else ""
    if not line.startswith(("grpc://", "grpc+tls://")):
        proc.kill()
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise UnavailableError(f"a storage server did not start within {timeout:g}s; its log says:\n{detail}")
    return line


class LocalCluster:
    """The embedded data plane, as a context manager.

    Args:
        servers: Storage servers to run.
        capacity: Bytes each server may hold (``"2GiB"`` or an int).
        max_groups: Groups each server may hold.
        processes: Run servers as separate processes (default) or as threads of this process.
        host: Interface everything binds to; loopback by default.
        port: The control server's TCP port (what :attr:`address` names); 0 picks a free one.
        state_dir: Controller journal directory (crash recovery); ``None`` keeps it in memory.
        timeout: Default deadline of client calls.
        shm: Give every storage server a shared-memory arena (same-host zero-copy transport).
        shm_root: Where deployment directories go (default ``/dev/shm``).
        tls: Serve every endpoint (the control server and each storage server) over ``grpc+tls://``
            with this certificate and key; with its ``ca``, demand client certificates it signed (mutual
            TLS). ``trajflight.devcerts.make_dev_certs`` makes a private CA and both sides' material.
        client_tls: What this cluster's own clients (and its controller's deletes and fences) present:
            the CA of the servers' certificate, and a client certificate for mutual TLS. Needed with
            ``tls``; clients elsewhere pass theirs to ``trajflight.connect(address, tls=...)``.
        archive: Where committed groups are archived as Parquet before their data is deleted (a local
            directory or a ``pyarrow.fs`` URI; see :mod:`trajflight._archive`); None keeps no archive.
            An option of the data plane, not of a job: the controller's host writes it, with its own
            filesystem and credentials, for every job (partitioned ``job_id=<job>/epoch=<n>/``).
        archive_filesystem: The filesystem ``archive`` is a path on (an ``S3FileSystem`` with an
            ``endpoint_override``, say); None resolves it from the URI.
        archive_flush: Longest a committed group waits for its archive file (seconds).
        archive_dropped: Archive dropped groups too, marked ``outcome = "dropped"``.
        metrics_port: Serve Prometheus metrics: the controller's on this port (0: a free one), each
            storage server's on a free port of its own; :attr:`metrics_urls` names them all. None (the
            default): no metrics endpoint.
        metrics_host: Interface the metrics endpoints bind; loopback by default.
        secret: The deployment secret (at least 16 bytes; ``KID:SECRET`` lines for a keyring); None reads
            ``TRAJFLIGHT_SECRET``, and without either nothing authenticates (loopback only).
        insecure: Bind a non-loopback ``host`` without a secret (refused otherwise).
    """

    def __init__(
        self,
        servers: int = 2,
        *,
        capacity: str | int = "2GiB",
        max_groups: int = 1_000_000,
        processes: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        shm: bool = True,
        shm_root: str | os.PathLike[str] | None = None,
        tls: TlsConfig | None = None,
        client_tls: TlsConfig | None = None,
        archive: str | os.PathLike[str] | None = None,
        archive_filesystem: Any = None,
        archive_flush: float = 2.0,
        archive_dropped: bool = False,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        secret: Secret | bytes | str | None = None,
        insecure: bool = False,
    ) -> None:
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise ConfigError(
                f"servers: need at least one storage server, got {servers!r}", setting="servers"
            )
        self.num_servers = servers
        self.capacity = parse_size(capacity, setting="capacity")
        self.max_groups = max_groups
        self.processes = processes
        self.host = host
        self.port = port
        self.state_dir = state_dir
        self.timeout = timeout
        self.shm = shm
        root = os.fspath(shm_root) if shm_root is not None else "/dev/shm"
        if not os.path.isdir(root):
            root = tempfile.gettempdir()
        self.shm_dir: str | None = os.path.join(root, f"trajflight-{uuid.uuid4().hex}") if shm else None
        self.node = host_id()
        self.server_locations: list[str] = []
        self._procs: list[subprocess.Popen[str]] = []
        self._parked_looks = 0
        self._threads: list[Any] = []
        self._logs: list[IO[bytes]] = []
        self._logdir: tempfile.TemporaryDirectory[str] | None = None
        check_tls_pair(tls, client_tls)
        self.tls = tls
        self.client_tls = client_tls
        self._secret = deployment_secret(secret)
        self.keyring = None if self._secret is None else self._secret.keyring()
        self.insecure = insecure
        self._pool = StoragePool(
            timeout=timeout, tls=client_tls, credential=minted(self.keyring, "trajflight-controller")
        )
        self.archive_location = archive
        self.archive_filesystem = archive_filesystem
        self.archive_flush = archive_flush
        self.archive_dropped = archive_dropped
        self.archive: Archive | None = None
        self._archive_worker: ArchiveWorker | None = None  # runs ``archive`` off the sweeper's thread
        self.controller: LocalController | None = None
        self._control: ControlServer | None = None
        self._started = False
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self._server_metrics: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalCluster:
        """Start servers, controller and control server, and register the servers (idempotent)."""
        if self._started:
            return self
        self._started = True
        try:
            self._start_servers()
            self._start_controller(port=self.port)
        except BaseException:
            self.close()
            raise
        return self

    def _start_controller(self, port: int) -> None:
        self.archive = self._open_archive()
        self._archive_worker = None if self.archive is None else ArchiveWorker(self.archive)
        self.controller = LocalController(
            fencer=self._pool.fence_groups,
            state_dir=self.state_dir,
            # Without an archive, each sweeper pass's deletes still go in one call per server.
            batch_deleter=self._archive_worker or GroupDeletes(self._pool.delete_groups),
        )
        if self.archive is not None:
            self.archive.timeline = self.controller.timeline
        status = None if self._archive_worker is None else self._archive_worker.status
        self._control = ControlServer(
            self.controller,
            host=self.host,
            port=port,
            archive_status=status,
            tls=self.tls,
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host,
            keyring=self.keyring,
            insecure=self.insecure,
        )
        local = ControllerClient(LocalTransport(self.controller), timeout=self.timeout)
        for i, location in enumerate(self.server_locations):
            local.register_server(
                f"{socket.gethostname()}/server-{i}",
                node=self.node,
                location=location,
                capacity_bytes=self.capacity,
                capacity_groups=self.max_groups,
            )

    def _open_archive(self) -> Archive | None:
        """The archive the controller's deletes go through (a fresh one per controller: it loads the
        manifests a predecessor left, see :mod:`trajflight._archive`)."""
        if self.archive_location is None:
            return None
        pool, timeout = self._pool, self.timeout
        return Archive(
            self.archive_location,
            read=lambda location, keys: pool.client(location).get(keys, timeout=timeout),
            delete_groups=pool.delete_groups,
            filesystem=self.archive_filesystem,
            flush_after=self.archive_flush,
            archive_dropped=self.archive_dropped,
            pressure=self._capacity_refusals,
        )

    def _capacity_refusals(self) -> int:
        """Writers refused for capacity so far (the archive's cue to write its held groups at once), plus
        one for every look that finds a writer parked on the controller until capacity comes back: it is
        refused all the while, but asks again only when capacity is released, which the held groups do."""
        controller = self.controller
        if controller is None:
            return 0
        self._parked_looks += controller.waiting_for_capacity > 0
        refused: int = controller.metrics.refusals()["capacity"]
        return refused + self._parked_looks

    def _close_archive(self) -> None:
        """Stop the archive's worker and pool (what it held stays on the GC list: a successor archives
        it)."""
        if self._archive_worker is not None:
            self._archive_worker.close()
            self._archive_worker = None

    def restart_controller(self) -> None:
        """Replace the controller by a fresh one on the same address (its state is lost unless a
        ``state_dir`` journal recovers it); the storage servers and their data stay. Restore jobs from
        their checkpoints afterwards. Clients of the old controller must be made again (:meth:`client`)."""
        if self._control is None or self.controller is None:
            raise UnavailableError("the cluster is not running")
        port = self._control.port
        if self._control.metrics_endpoint is not None:  # the successor serves on the same port
            self.metrics_port = self._control.metrics_endpoint.port
        self.controller.close()  # first: parked long polls are answered, so the shutdown never waits them out
        self._control.shutdown()
        self._close_archive()
        self._start_controller(port=port)

    def _start_servers(self) -> None:
        if not self.processes:
            from trajflight.flight_server import ShmArena, StorageServer, StoreLimits

            limits = StoreLimits(capacity_bytes=self.capacity, capacity_groups=self.max_groups)
            for i in range(self.num_servers):
                arena = ShmArena(self.server_shm_dir(i)) if self.shm else None
                server = StorageServer(
                    self.host,
                    0,
                    limits=limits,
                    arena=arena,
                    tls=self.tls,
                    metrics_port=None if self.metrics_port is None else 0,
                    metrics_host=self.metrics_host,
                    keyring=self.keyring,
                    insecure=self.insecure,
                )
                self._threads.append(server)
                self.server_locations.append(server.location)
                if server.metrics_url is not None:
                    self._server_metrics.append(server.metrics_url)
            return
        self._logdir = tempfile.TemporaryDirectory(prefix="trajflight-cluster-")
        for i in range(self.num_servers):
            log_path = Path(self._logdir.name) / f"server-{i}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
            self._logs.append(log)
            cmd = [
                sys.executable,
                "-m",
                "trajflight",
                "server",
                "--host",
                self.host,
                "--port",
                "0",
                "--capacity",
                str(self.capacity),
                "--max-groups",
                str(self.max_groups),
                "--exit-with-parent",  # a crashed driver leaves no server (nor its memory) behind
            ]
            shm_dir = self.server_shm_dir(i)
            if shm_dir is not None:
                cmd += ["--shm-dir", shm_dir]
            cmd += self._tls_args()
            if self.metrics_port is not None:
                cmd += ["--metrics-port", "0", "--metrics-host", self.metrics_host]
            if self.insecure:
                cmd.append("--insecure")
            env = {k: v for k, v in os.environ.items() if k != "TRAJFLIGHT_SECRET"}
            if self._secret is not None:  # through the environment: ps shows a command line
                env["TRAJFLIGHT_SECRET"] = self._secret.reveal()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
            self._procs.append(proc)
            self.server_locations.append(_read_location(proc, log_path, timeout=60.0))
        if self.metrics_port is not None:  # each server names its free metrics port in its health
            for location in self.server_locations:
                self._server_metrics.append(
                    self._pool.client(location).health(timeout=self.timeout)["metrics"]
                )

    def _tls_args(self) -> list[str]:
        """``--tls-*`` arguments of a server process: the material written once, 0600, in the log dir."""
        if self.tls is None or self._logdir is None:
            return []
        folder = Path(self._logdir.name)
        files = {"cert": self.tls.cert, "key": self.tls.key, "client-ca": self.tls.ca}
        args = []
        for name, pem in files.items():
            if pem is None:
                continue
            path = folder / f"tls-{name}.pem"
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(pem)
            args += [f"--tls-{name}", str(path)]
        return args

    def close(self) -> None:
        """Stop the controller, the control server and every storage server (idempotent).

        The controller closes first: an acquire parked in it (a trainer's long poll) is answered at once
        with UnavailableError, so that the control server, which waits for its calls, stops promptly."""
        if self.controller is not None:
            self.controller.close()
        if self._control is not None:
            self._control.shutdown()
            self._control = None
        self.controller = None
        self._close_archive()
        self._pool.close()
        for server in self._threads:
            server.close()
        self._threads.clear()
        self._server_metrics.clear()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None
        if self.shm_dir is not None:  # segments of killed servers too; live mappings stay valid
            shutil.rmtree(self.shm_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def metrics_urls(self) -> dict[str, str]:
        """What Prometheus scrapes: ``{"controller": url, "server-<i>": url, ...}`` (empty without
        ``metrics_port``)."""
        out: dict[str, str] = {}
        if self._control is not None and self._control.metrics_url is not None:
            out["controller"] = self._control.metrics_url
        for i, url in enumerate(self._server_metrics):
            out[f"server-{i}"] = url
        return out

    # ------------------------------------------------------------------ access
    def server_shm_dir(self, index: int) -> str | None:
        """The arena directory of storage server ``index`` (None without ``shm``)."""
        if self.shm_dir is None:
            return None
        if not os.path.isdir(self.shm_dir):
            # Servers given a directory sweep nothing beside it: the cluster removes the deployment
            # directories that crashed clusters left here (their servers dead, untouched for a minute).
            sweep_dead_arenas(os.path.dirname(self.shm_dir), keep=self.shm_dir)
            os.makedirs(self.shm_dir, mode=0o700, exist_ok=True)
        return os.path.join(self.shm_dir, f"server-{index}")

    @property
    def address(self) -> str:
        """The control server's location: ``trajflight.connect(address)`` from any local process."""
        if self._control is None:
            raise UnavailableError("the cluster is not running; use it as a context manager or call start()")
        return self._control.location

    def client(self, *, transport: Transport = "auto") -> Client:
        """A client in this process that calls the controller directly (no RPC for control calls).

        ``transport``: ``"auto"`` (shared memory with these servers when they have arenas), ``"shm"`` or
        ``"flight"`` (forced)."""
        if self.controller is None:
            raise UnavailableError("the cluster is not running; use it as a context manager or call start()")
        controller = ControllerClient(LocalTransport(self.controller), timeout=self.timeout)
        return Client(
            controller,
            address=self.address,
            timeout=self.timeout,
            transport=transport,
            tls=self.client_tls,
            credential=minted(self.keyring, "trajflight-local-client"),
        )

    def mint(
        self,
        role: Role | str = Role.ADMIN,
        jobs: list[str] | None = None,
        *,
        ttl: float = 3600.0,
        sub: str = "",
    ) -> Credential:
        """A credential for another process's ``trajflight.connect(address, token=...)`` (see
        :func:`trajflight.auth.mint_for_client`).

        Raises:
            ConfigError: the cluster has no secret (it takes no tokens), or a bad role, job or ttl.
        """
        return mint_for_client(self.keyring, role, jobs, ttl=ttl, sub=sub)

    def kill_server(self, index: int) -> None:
        """Kill storage server ``index`` (SIGKILL) — for fault-injection tests."""
        self._procs[index].kill()
        self._procs[index].wait()

    def wait_idle(self, job_id: str, timeout: float = 10.0) -> tuple[int, int]:
        """Wait until the job holds no bytes and no groups (every delete confirmed); returns the usage."""
        if self.controller is None:
            raise UnavailableError("the cluster is not running")
        deadline = time.monotonic() + timeout
        while True:
            usage: tuple[int, int] = self.controller.call("usage", {"job_id": job_id})
            if usage == (0, 0) or time.monotonic() > deadline:
                return usage
            time.sleep(0.02)
