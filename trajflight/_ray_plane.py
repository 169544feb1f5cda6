"""The Ray data plane: the controller as a named Ray actor, storage servers as Ray actors on every node.

:class:`RayCluster` deploys one data plane on a Ray cluster, in its own Ray namespace:

* the controller is the named async actor of :func:`trajflight.controller._ray_host.start_ray_actor`
  (``ray://NAMESPACE/NAME`` is the plane's address), restarted by Ray when it dies; its sweeper deletes
  committed groups through :class:`~trajflight._ray_actors.FlightStorage`, straight from the storage
  servers over Flight, and fences the groups of leases that ended without their holder through it too;
* storage servers are :class:`~trajflight._ray_actors.StorageServerActor` actors pinned to their nodes
  (``NodeAffinitySchedulingStrategy(node_id, soft=False)``), one per node by default, each running a
  :class:`~trajflight.flight_server.StorageServer` on its node's IP address, port 0, registered with the
  controller under its Ray node id, so that writers on a node put to that node's server, with a
  shared-memory arena on its node's tmpfs: a client on the same host takes the same-host path to it (by
  host identity, as on an embedded plane), any other client Flight.

With ``metrics_port`` the controller actor and every storage server actor serve their Prometheus metrics
(the embedded plane's families, ``docs/operations.md``) over HTTP on their node's address, which
:attr:`RayCluster.metrics_urls` names.

Flight or shared memory carries the data; Ray only places and supervises. Other processes reach the plane with
``trajflight.connect(cluster.address)``; in a process where Ray is not initialised,
:func:`~trajflight._ray_connect.connect_ray_plane` joins the running Ray cluster first (``RAY_ADDRESS``,
which :class:`RayCluster` exports to the processes it spawns, or else the cluster last started on this
machine).

Ray is imported only when a Ray plane is started or connected to (``pip install 'trajflight[ray]'``).

With a deployment secret (``RayCluster(secret=)`` or ``TRAJFLIGHT_SECRET``) every storage server
authenticates every call (``docs/auth.md``); the controller actor's deletes and fences and this process's
clients carry admin tokens minted from it, and other processes pass their credential to ``connect``. The
secret reaches the actors as a :class:`~trajflight.auth.Secret` argument (its ``repr`` is hidden; Ray task
and actor names never carry it). Calls to the controller actor itself go through Ray, which
authenticates nothing: anyone who can reach the Ray cluster can drive the controller (docs/auth.md).

It does not guarantee that stored groups survive their storage server: a server actor is not restarted
(its groups lived in its memory; the controller would point at data that is gone), and the controller's
state survives a restart only with ``state_dir`` (journal + snapshots on the controller's node).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from trajflight import logs
from trajflight._client import Client
from trajflight._ray_actors import ArchiveFactory, FlightStorage, NodeMetrics, StorageServerActor
from trajflight._ray_connect import SCHEME, current_node_id, loopback_addresses, parse_ray_address
from trajflight._storage import check_tls_pair
from trajflight.auth import Credential, Role, Secret, deployment_secret, mint_for_client, minted
from trajflight.controller import (
    DEFAULT_NAME,
    BatchDeleter,
    ControllerClient,
    GroupDeletes,
    RayTransport,
    import_ray,
    start_ray_actor,
)
from trajflight.errors import (
    AlreadyExistsError,
    ConfigError,
    InvalidRequestError,
    UnavailableError,
)
from trajflight.flight_server import TlsConfig, remove_dead_arena
from trajflight.units import parse_size

__all__ = ["RayCluster", "RayServer"]


@dataclass(frozen=True, slots=True)
class RayServer:
    """One storage server of a :class:`RayCluster`.

    Attributes:
        server_id: Its id in the controller (``<node id prefix>/server-<i>``).
        node_id: The Ray node it runs on (the controller's ``node`` for placement).
        location: Its Flight location.
        actor_name: Its Ray actor's name in the plane's namespace.
        shm_dir: Its shared-memory arena's directory on its node (None: Flight only).
        metrics_url: Its Prometheus endpoint (None without ``metrics_port``).
    """

    server_id: str
    node_id: str
    location: str
    actor_name: str
    shm_dir: str | None = None
    metrics_url: str | None = None


# ---------------------------------------------------------------------------------------- the plane


class RayCluster:
    """A trajflight data plane on Ray, as a context manager.

    Uses the Ray runtime of this process when ``ray.init`` was called; otherwise starts a local one bound
    to loopback (and shuts it down on :meth:`close`). While it runs it exports ``RAY_ADDRESS`` (unless
    set) so that processes it spawns join the same Ray cluster when they ``trajflight.connect``.

    Args:
        servers: Storage servers in all, spread over the alive nodes (this process's node first); ``None``
            (default) runs one on every alive node.
        capacity: Bytes each server may hold (``"2GiB"`` or an int).
        max_groups: Groups each server may hold.
        namespace: Ray namespace of the deployment; ``None`` makes a fresh unique one, so that two planes
            on one Ray cluster never meet.
        name: The controller actor's name.
        state_dir: Controller journal directory on this process's node (the controller actor is pinned
            there); ``None`` keeps the controller's state in memory only.
        timeout: Default deadline of client calls and of starting actors, seconds.
        num_cpus: CPUs of the local Ray runtime when this starts one (default: Ray's detection).
        shm: Give every storage server a shared-memory arena on its node (default), so that clients on
            that node read and write through it; ``False``: Flight only.
        archive, archive_filesystem, archive_flush: Archive committed groups before their deletes, as
            :class:`~trajflight.LocalCluster` does; the controller actor writes it, so ``archive`` must
            be reachable from the actor's node (a shared path or an object store URI).
        log_level, log_json: Set logging up in the actors' processes (``trajflight.logs``) at this level,
            as JSON lines with ``log_json``; None (default) leaves their logging as Ray sets it.
        tls: Serve every storage server over ``grpc+tls://`` with this certificate and key (valid for
            every node's address; with a ``ca``, mutual TLS: clients must present a certificate signed
            by it). The controller actor is reached through Ray, not Flight: Ray's own transport is not
            covered by this (see the README's Security section).
        client_tls: What this plane's own clients (``client()``, the controller actor's deletes, fences
            and archive reads) present to the storage servers; required with ``tls``. Clients elsewhere
            pass theirs to ``trajflight.connect(address, tls=...)``.
        secret: The deployment secret (see :class:`~trajflight.LocalCluster`); None reads
            ``TRAJFLIGHT_SECRET``; without either the storage servers authenticate nothing, and a server on a
            non-loopback node address refuses to start unless ``insecure``.
        insecure: Serve storage servers on non-loopback node addresses without a secret.
        metrics_port: Serve Prometheus metrics, as :class:`~trajflight.LocalCluster` does: the
            controller actor's on this port of its node (0: a free one), each storage server actor's on
            a free port of its own, each on the address its node's endpoints use (the node's IP address
            as Ray knows it; loopback on a local Ray); :attr:`metrics_urls` names them. The endpoints
            have no authentication and serve no credentials. None (the default): no metrics endpoint.

    Raises:
        ConfigError: a bad setting, naming it.
    """

    def __init__(
        self,
        servers: int | None = None,
        *,
        capacity: str | int = "2GiB",
        max_groups: int = 1_000_000,
        namespace: str | None = None,
        name: str = DEFAULT_NAME,
        state_dir: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        num_cpus: int | None = None,
        shm: bool = True,
        archive: str | os.PathLike[str] | None = None,
        archive_filesystem: Any = None,
        archive_flush: float = 2.0,
        log_level: str | None = None,
        log_json: bool = False,
        tls: TlsConfig | None = None,
        client_tls: TlsConfig | None = None,
        secret: Secret | bytes | str | None = None,
        insecure: bool = False,
        metrics_port: int | None = None,
    ) -> None:
        check_tls_pair(tls, client_tls)
        if metrics_port is not None and (
            isinstance(metrics_port, bool)
            or not isinstance(metrics_port, int)
            or not 0 <= metrics_port < 65536
        ):
            raise ConfigError(
                f"metrics_port: need a TCP port in 0..65535 (0: a free one) or None, got {metrics_port!r}",
                setting="metrics_port",
            )
        if servers is not None and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
            raise ConfigError(
                f"servers: need at least one storage server (or None: one per node), got {servers!r}",
                setting="servers",
            )
        self.num_servers = servers
        self.capacity = parse_size(capacity, setting="capacity")
        self.max_groups = max_groups
        self.namespace = namespace or f"trajflight-{uuid.uuid4().hex[:12]}"
        self.name = name
        try:  # refuse names the address cannot carry
            parse_ray_address(f"{SCHEME}{self.namespace}/{self.name}")
        except InvalidRequestError:
            raise ConfigError(
                f"namespace {self.namespace!r} and name {self.name!r} must be non-empty and made of letters, "
                "digits, '-', '_' and '.'",
                setting="namespace",
            ) from None
        self.state_dir = None if state_dir is None else os.fspath(state_dir)
        self.timeout = timeout
        self.num_cpus = num_cpus
        self.shm = bool(shm)
        self.archive = None if archive is None else os.fspath(archive)
        self.archive_filesystem = archive_filesystem
        self.archive_flush = archive_flush
        self._log_env = logs.env_for(log_level, log_json)  # checked here: a bad level fails early
        self.tls = tls
        self.client_tls = client_tls
        self._secret = deployment_secret(secret)
        self.keyring = None if self._secret is None else self._secret.keyring()
        self.insecure = insecure
        self.metrics_port = metrics_port
        self._controller_metrics: str | None = None
        self.servers: list[RayServer] = []
        self._server_actors: list[Any] = []
        self._controller_actor: Any = None
        self._controller: ControllerClient | None = None
        self._owns_ray = False
        self._set_ray_address = False
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RayCluster:
        """Start the controller and the storage servers and register the servers (idempotent).

        Raises:
            UnavailableError: Ray is missing, or an actor did not start within ``timeout`` (a node lacks
                resources or died), or failed to (its cause in the message: ``metrics_port`` in use,
                say). AlreadyExistsError: a controller of this name runs in this namespace.
        """
        if self._started:
            return self
        self._started = True
        try:
            ray = self._ensure_ray()
            self._start_controller(ray)
            self._start_servers(ray)
            self._register_servers()
        except BaseException:
            self.close()
            raise
        return self

    def _ensure_ray(self) -> Any:
        ray = import_ray()
        if not ray.is_initialized():
            self._init_local_ray(ray)
            self._owns_ray = True
        gcs_address = getattr(ray.get_runtime_context(), "gcs_address", None)  # None under Ray Client
        if "RAY_ADDRESS" not in os.environ and gcs_address:
            os.environ["RAY_ADDRESS"] = gcs_address
            self._set_ray_address = True
        return ray

    def _init_local_ray(self, ray: Any) -> None:
        """Start a local Ray runtime whose every address is loopback."""
        with loopback_addresses(True):
            ray.init(
                address="local",
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                num_cpus=self.num_cpus,
                namespace=self.namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )

    def _start_controller(self, ray: Any) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On this node: checkpoint and state paths name files here. Strictly so with a state_dir (the
        # journal must be where Ray restarts the actor); otherwise Ray may move it if the node dies.
        here = ray.get_runtime_context().get_node_id()
        strategy = NodeAffinitySchedulingStrategy(here, soft=self.state_dir is None)
        storage = FlightStorage(timeout=self.timeout, tls=self.client_tls, secret=self._secret)
        # The actor's batch deleter: the archive's, else each pass's deletes in one call per server.
        batch: Callable[[], BatchDeleter] = functools.partial(GroupDeletes, storage.delete_groups)
        if self.archive is not None:
            batch = ArchiveFactory(self.archive, self.archive_filesystem, self.archive_flush, storage)
        try:
            actor = start_ray_actor(
                name=self.name,
                namespace=self.namespace,
                state_dir=self.state_dir,
                fencer=storage.fence,
                options={"scheduling_strategy": strategy, **self._runtime_env()},
                batch_deleter=batch,
                metrics=None if self.metrics_port is None else NodeMetrics(self.metrics_port),
            )
        except ValueError as exc:  # Ray: the name is already taken
            raise AlreadyExistsError(
                f"a Ray actor named {self.name!r} already runs in namespace {self.namespace!r} ({exc}); "
                f"connect to it with trajflight.connect('{self.address}') or pick another namespace"
            ) from None
        self._controller_actor = actor
        self._controller = ControllerClient(RayTransport(actor), timeout=self.timeout)
        (info,) = self._first_answers(ray, [actor.info.remote()], "the controller actor", [here])
        self._controller_metrics = info["metrics"]

    def _runtime_env(self) -> dict[str, Any]:
        """Actor options that carry the logging set-up (``log_level``) to the actors' processes."""
        return {"runtime_env": {"env_vars": self._log_env}} if self._log_env else {}

    def _placement(self, ray: Any) -> list[str]:
        """Node ids of the servers to start, one entry per server (this node first, then by id)."""
        here = ray.get_runtime_context().get_node_id()
        alive = sorted((n["NodeID"] for n in ray.nodes() if n.get("Alive")), key=lambda n: (n != here, n))
        if not alive:
            raise UnavailableError("the Ray cluster has no alive node to place storage servers on")
        count = len(alive) if self.num_servers is None else self.num_servers
        return [alive[i % len(alive)] for i in range(count)]

    def _start_servers(self, ray: Any) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = ray.remote(StorageServerActor)
        nodes = self._placement(ray)
        names = [f"{self.name}-server-{i}" for i in range(len(nodes))]
        for node_id, actor_name in zip(nodes, names, strict=True):
            self._server_actors.append(
                cls.options(
                    name=actor_name,
                    namespace=self.namespace,
                    num_cpus=0,
                    max_restarts=0,  # its groups lived in its memory: a restarted server would be empty
                    max_concurrency=4,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    **self._runtime_env(),
                ).remote(
                    self.capacity,
                    self.max_groups,
                    shm=self.shm,
                    tls=self.tls,
                    secret=self._secret,
                    insecure=self.insecure,
                    metrics=self.metrics_port is not None,
                )
            )
        refs = [a.describe.remote() for a in self._server_actors]
        described = self._first_answers(ray, refs, "storage server actors", nodes)
        for i, (info, actor_name) in enumerate(zip(described, names, strict=True)):
            node_id = info["node_id"]
            self.servers.append(
                RayServer(
                    f"{node_id[:12]}/server-{i}",
                    node_id,
                    info["location"],
                    actor_name,
                    info["shm_dir"],
                    info["metrics"],
                )
            )

    def _first_answers(self, ray: Any, refs: list[Any], what: str, nodes: list[str]) -> list[Any]:
        """The answers of the first calls to just created actors (``refs``), once they have started.

        Raises:
            UnavailableError: they did not start within ``timeout``, or one failed to (its constructor
                raised: the cause, a metrics port in use say, is in the message).
        """
        try:
            return list(ray.get(refs, timeout=self.timeout))
        except ray.exceptions.GetTimeoutError:
            raise UnavailableError(
                f"{what} did not start within {self.timeout:g}s on nodes {sorted(set(nodes))}; check "
                "`ray status` (a node may be gone) or raise timeout"
            ) from None
        except ray.exceptions.RayActorError as exc:
            # Ray keeps only the text of a creation task's error: its last line names the exception.
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise UnavailableError(f"{what} failed to start: {lines[-1] if lines else exc}") from None

    def _register_servers(self) -> None:
        controller = self._require_controller()
        for server in self.servers:
            controller.register_server(
                server.server_id,
                node=server.node_id,
                location=server.location,
                capacity_bytes=self.capacity,
                capacity_groups=self.max_groups,
            )

    def restart_controller(self) -> None:
        """Kill the controller actor and let Ray restart it (a new incarnation, same address and actor).

        Its state is lost unless a ``state_dir`` journal recovers it; the storage servers and their data
        stay and are registered again. Restore jobs from their checkpoints afterwards. Existing clients
        keep working once it is back (their calls meanwhile raise UnavailableError: retry).

        Raises:
            UnavailableError: the plane is not running, or the controller did not come back in ``timeout``.
        """
        ray = import_ray()
        controller = self._require_controller()
        transport: Any = controller.transport
        before = transport.info(self.timeout)["pid"]
        ray.kill(self._controller_actor, no_restart=False)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                info = transport.info(max(0.1, deadline - time.monotonic()))
                if info["pid"] != before:
                    break
            except UnavailableError:
                pass  # restarting
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"the controller actor did not restart within {self.timeout:g}s; check `ray status`"
                )
            time.sleep(0.1)
        self._controller_metrics = info["metrics"]  # with port 0, the new actor's free port
        self._register_servers()

    def close(self) -> None:
        """Stop the storage servers and the controller actor; shut Ray down if this started it
        (idempotent). Stored groups and in-memory controller state are gone afterwards."""
        ray = sys.modules.get("ray") if self._started else None  # never import it just to close
        if ray is not None and ray.is_initialized():
            if self._controller_actor is not None:  # parked long polls get UnavailableError, not a dead actor
                with contextlib.suppress(Exception):
                    ray.get(self._controller_actor.close.remote(), timeout=5.0)
            stops = [a.close.remote(5.0) for a in self._server_actors]
            if stops:
                ray.wait(stops, num_returns=len(stops), timeout=10.0)
            for actor in [*self._server_actors, self._controller_actor]:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
            for server in self.servers:  # a server that did not stop in time (or was killed) left its arena
                if server.shm_dir is not None:
                    remove_dead_arena(server.shm_dir)
        self._server_actors.clear()
        self.servers.clear()
        self._controller_actor = None
        self._controller = None
        self._controller_metrics = None
        if self._set_ray_address:
            os.environ.pop("RAY_ADDRESS", None)
            self._set_ray_address = False
        if ray is not None and self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
        self._started = False

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ access
    def _require_controller(self) -> ControllerClient:
        if self._controller is None:
            raise UnavailableError(
                "the Ray data plane is not running; use it as a context manager or start()"
            )
        return self._controller

    @property
    def address(self) -> str:
        """``ray://NAMESPACE/NAME``: ``trajflight.connect(address)`` from any process of the Ray cluster."""
        return f"{SCHEME}{self.namespace}/{self.name}"

    @property
    def metrics_urls(self) -> dict[str, str]:
        """What Prometheus scrapes: ``{"controller": url, "server-<i>": url, ...}``, as
        :attr:`LocalCluster.metrics_urls <trajflight.LocalCluster.metrics_urls>` (empty without
        ``metrics_port``, or when the plane is not running). The controller's is that of its actor's
        latest start here or in :meth:`restart_controller`; with port 0, an actor Ray restarted by itself
        serves on another free port (its ``info`` names it)."""
        out: dict[str, str] = {}
        if self._controller_metrics is not None:
            out["controller"] = self._controller_metrics
        for i, server in enumerate(self.servers):
            if server.metrics_url is not None:
                out[f"server-{i}"] = server.metrics_url
        return out

    @property
    def server_locations(self) -> list[str]:
        """Flight locations of the storage servers."""
        return [s.location for s in self.servers]

    def client(self) -> Client:
        """A client in this process, calling the controller actor through Ray."""
        controller = self._require_controller()
        return Client(
            ControllerClient(controller.transport, timeout=self.timeout),
            address=self.address,
            timeout=self.timeout,
            node=current_node_id(),
            tls=self.client_tls,
            credential=minted(self.keyring, "trajflight-ray-client"),
        )

    def mint(
        self,
        role: Role | str = Role.ADMIN,
        jobs: list[str] | None = None,
        *,
        ttl: float = 3600.0,
        sub: str = "",
    ) -> Credential:
        """A storage credential for another process's ``trajflight.connect(address, token=...)`` (see
        :func:`trajflight.auth.mint_for_client`); a Ray task gets it as an argument or in its
        ``runtime_env`` (``TRAJFLIGHT_TOKEN``).

        Raises:
            ConfigError: the plane has no secret (it takes no tokens), or a bad role, job or ttl.
        """
        return mint_for_client(self.keyring, role, jobs, ttl=ttl, sub=sub)

    def kill_server(self, index: int) -> None:
        """Kill storage server ``index``'s actor (not restarted) — for fault-injection tests."""
        ray = import_ray()
        ray.kill(self._server_actors[index], no_restart=True)

    def wait_idle(self, job_id: str, timeout: float = 10.0) -> tuple[int, int]:
        """Wait until the job holds no bytes and no groups (every delete confirmed); returns the usage,
        which is not ``(0, 0)`` when ``timeout`` passed first."""
        controller = self._require_controller()
        deadline = time.monotonic() + timeout
        while True:
            nbytes, groups = controller.usage(job_id)
            if (nbytes, groups) == (0, 0) or time.monotonic() > deadline:
                return int(nbytes), int(groups)
            time.sleep(0.02)
