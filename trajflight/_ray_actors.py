"""The Ray actors of a :class:`~trajflight._ray_plane.RayCluster` and what it ships to them.

* :class:`StorageServerActor`: the body of a storage server actor, a
  :class:`~trajflight.flight_server.StorageServer` on its node's IP address;
* :class:`FlightStorage`: the controller actor's deletes, fences and archive reads, straight to the
  storage servers over Flight;
* :class:`ArchiveFactory`: makes the controller actor's archive in the actor's process;
* :class:`NodeMetrics`: makes the controller actor's Prometheus endpoint on the actor's node.

Each is picklable (Ray ships it by reference to this module); connections, threads and servers are made
in the process that runs them, never pickled. Ray is imported only when an actor is constructed.

It does not guarantee anything about an actor after Ray restarts it: a restarted actor re-runs its
constructor, so what it made (connections, servers, endpoints) is made afresh.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry

from trajflight import logs
from trajflight._archive import Archive
from trajflight._archive_worker import ArchiveWorker
from trajflight._storage import StoragePool
from trajflight.auth import Secret, minted
from trajflight.controller import DeleteOutcome, DeleteWork, FenceWork, import_ray
from trajflight.flight_server import MetricsEndpoint, TlsConfig
from trajflight.keys import Partition

__all__ = ["ArchiveFactory", "FlightStorage", "NodeMetrics", "StorageServerActor", "node_address"]


def node_address() -> str:
    """The IP address of this process's Ray node, as Ray knows it (loopback on a local Ray started by
    :class:`~trajflight._ray_plane.RayCluster`): where an actor's endpoints listen."""
    return str(import_ray().util.get_node_ip_address())


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """The controller actor's ``metrics`` factory: a :class:`~trajflight.flight_server.MetricsEndpoint`
    serving the actor's registry on its node's address (picklable: Ray ships it; the endpoint is made,
    and its port bound, in the actor's process, again when Ray restarts the actor).

    Attributes:
        port: TCP port; 0 picks a free one.
    """

    port: int = 0

    def __call__(self, registry: CollectorRegistry) -> MetricsEndpoint:
        """Serve ``registry`` on ``node_address():port``.

        Raises:
            InvalidRequestError: the port cannot be bound (in use).
        """
        return MetricsEndpoint(registry, node_address(), self.port)


class FlightStorage:
    """The controller actor's hands on the storage servers: its ``deleter`` (:meth:`delete`), its
    ``fencer`` (:meth:`fence`) and its archive's reads and batched deletes (:meth:`read`,
    :meth:`delete_groups`), straight to the servers over Flight.

    Picklable (Ray ships it, or a bound method of it, to the controller actor); the connections are made
    on first use in the process that calls it, and are not pickled. Thread-safe.

    Args:
        timeout: Deadline of each call to a storage server, seconds.
        tls: What the controller actor presents to ``grpc+tls://`` storage servers (see
            :class:`RayCluster`'s ``client_tls``).
        secret: The deployment secret: each call then carries an admin token minted from it.
    """

    def __init__(
        self, timeout: float = 10.0, tls: TlsConfig | None = None, secret: Secret | None = None
    ) -> None:
        self.timeout = timeout
        self.tls = tls
        self.secret = secret
        self._pool: StoragePool | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "tls": self.tls, "secret": self.secret}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["timeout"], state.get("tls"), state.get("secret"))  # type: ignore[misc]

    def _storage(self) -> StoragePool:
        with self._lock:
            if self._pool is None:
                self._pool = StoragePool(
                    timeout=self.timeout,
                    tls=self.tls,
                    credential=minted(
                        None if self.secret is None else self.secret.keyring(), "trajflight-controller"
                    ),
                )
            return self._pool

    def delete_groups(self, work: Sequence[DeleteWork]) -> list[DeleteOutcome]:
        """Delete many groups in one call per server (the controller actor's deletes, archived or not,
        see :meth:`StoragePool.delete_groups`): each item's ``(work, ok, error)`` in order; never
        raises."""
        return self._storage().delete_groups(work)

    def read(self, location: str, keys: list[Partition]) -> pa.Table:
        """Read groups from the server at ``location`` without a token (the archive's reads: no lease,
        generation or state is touched)."""
        return self._storage().client(location).get(keys, timeout=self.timeout)

    def fence(self, work: Sequence[FenceWork]) -> None:
        """Raise the generation of ``work``'s groups (the fences of one location) on their server (see
        :meth:`StoragePool.fence_groups`); raise on failure (the controller retries)."""
        self._storage().fence_groups(work)


class ArchiveFactory:
    """Makes the controller actor's :class:`~trajflight._archive.Archive`, run by an ``ArchiveWorker``,
    in the actor's process (picklable: Ray ships it; the archive's filesystem, connections and thread
    are made where it runs).

    Args:
        location, filesystem, flush_after: As :class:`~trajflight._archive.Archive` takes them.
        storage: The actor's hands on the storage servers (reads and deletes).
    """

    def __init__(self, location: str, filesystem: Any, flush_after: float, storage: FlightStorage) -> None:
        self.location = location
        self.filesystem = filesystem
        self.flush_after = flush_after
        self.storage = storage

    def __call__(self) -> ArchiveWorker:
        """The archive, on a worker thread of its own (the actor's sweeper only queues its deletes)."""
        storage = self.storage
        archive = Archive(
            self.location,
            read=storage.read,
            delete_groups=storage.delete_groups,
            filesystem=self.filesystem,
            flush_after=self.flush_after,
        )
        return ArchiveWorker(archive)


class StorageServerActor:
    """The body of a storage server actor: a :class:`~trajflight.flight_server.StorageServer` serving on
    its node's IP address (``host``), port 0, from the actor's process, with a shared-memory arena on its
    node's tmpfs unless ``shm`` is false (so that writers and trainers on its node take the same-host path,
    chosen by host identity as on an embedded plane; others reach it over Flight).

    Args:
        capacity_bytes: Bytes the server may hold.
        capacity_groups: Groups the server may hold.
        host: Interface to bind; default the node's IP address as Ray knows it (loopback on a local Ray
            started by :class:`RayCluster`).
        shm: Give the server a fresh auto-named arena (``/dev/shm/trajflight-<uuid>``); making one also
            sweeps the arenas killed servers left on the node.
        tls: Serve ``grpc+tls://`` with this material (see :class:`RayCluster`); ``None``: plaintext.
        secret: The deployment secret: the server then authenticates every call.
        insecure: Serve a non-loopback node address without a secret (refused otherwise).
        metrics: Serve the server's Prometheus metrics on a free port of ``host`` (:meth:`describe`
            names the URL).
    """

    def __init__(
        self,
        capacity_bytes: int,
        capacity_groups: int,
        host: str | None = None,
        shm: bool = True,
        tls: TlsConfig | None = None,
        secret: Secret | None = None,
        insecure: bool = False,
        metrics: bool = False,
    ) -> None:
        from trajflight.flight_server import ShmArena, StorageServer, StoreLimits

        logs.setup_from_env()  # the actor's entry: RayCluster(log_level=) sets the environment
        self.node_id: str = import_ray().get_runtime_context().get_node_id()
        self.host = host or node_address()
        limits = StoreLimits(capacity_bytes=capacity_bytes, capacity_groups=capacity_groups)
        arena = ShmArena() if shm else None
        try:
            self.server = StorageServer(
                self.host,
                0,
                limits=limits,
                arena=arena,
                tls=tls,
                keyring=None if secret is None else secret.keyring(),
                insecure=insecure,
                metrics_port=0 if metrics else None,
                metrics_host=self.host,
            )
        except BaseException:
            if arena is not None:
                arena.close()
            raise

    def describe(self) -> dict[str, Any]:
        """``{"location", "node_id", "host", "pid", "shm_dir", "metrics"}`` of this server (``shm_dir``:
        its arena's directory, None without one; ``metrics``: its Prometheus endpoint's URL, None without
        one)."""
        arena = self.server.arena
        return {
            "location": self.server.location,
            "node_id": self.node_id,
            "host": self.host,
            "pid": os.getpid(),
            "shm_dir": None if arena is None else arena.directory,
            "metrics": self.server.metrics_url,
        }

    def close(self, timeout: float = 5.0) -> bool:
        """Stop serving (see :meth:`StorageServer.close`); True when it stopped within ``timeout``."""
        return bool(self.server.close(timeout))
