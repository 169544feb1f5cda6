"""The public client: ``connect(address)`` and :class:`Client`, one connection to a data plane.

:class:`Client` opens jobs (fencing older epochs on every storage server), restores and checkpoints
them, and makes the connection's :class:`~trajflight._writer.Writer` (a rollout worker) and
:class:`~trajflight._trainer.Trainer` objects, which share its :class:`~trajflight._session.Session`.

The same code runs against the embedded data plane (``grpc://`` address of its control server) and the
Ray data plane (``ray://namespace/name``). Every call has a deadline.

It does not own the plane: closing a client closes its connections, never a server or the controller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Mapping
from typing import Any

from trajflight._control_client import FlightTransport
from trajflight._ray_connect import SCHEME, connect_ray_plane, current_node_id
from trajflight._renewals import Renewals
from trajflight._session import Session
from trajflight._storage import StoragePool, Transport, env_credential, env_tls
from trajflight._trainer import FENCE_TIMEOUT, Trainer
from trajflight._writer import Writer
from trajflight.auth import Credential, RefreshingCredential
from trajflight.controller import (
    ControllerClient,
    HeldGroup,
    JobConfig,
    LostGroup,
    OldReady,
)
from trajflight.errors import InvalidRequestError, TrajflightError
from trajflight.flight_server import CredentialSource, TlsConfig, host_id
from trajflight.keys import Partition

__all__ = ["Client", "connect"]

log = logging.getLogger("trajflight")


def connect(
    address: str,
    *,
    timeout: float = 30.0,
    transport: Transport = "auto",
    tls: TlsConfig | None = None,
    token: Credential | str | None = None,
) -> Client:
    """Connect to a running data plane.

    Args:
        address: ``grpc://host:port`` of an embedded data plane's control server (what
            ``LocalCluster.address`` and ``trajflight up`` print), or ``ray://NAMESPACE/NAME`` of a Ray data
            plane's controller actor (Ray must be initialised in this process, or reachable).
        timeout: Default deadline of every call, seconds.
        transport: How group data moves to and from storage servers: ``"auto"`` (shared memory with
            servers on this host that have an arena, Flight otherwise), ``"shm"`` or ``"flight"`` (forced).
            Controller calls follow: over the control server's same-host socket where the controller
            runs on this host, except with ``"flight"``, which sends everything over Flight (what a
            process on another node gets).
        tls: For a plane that serves TLS (a ``grpc+tls://`` address, or a Ray plane started with
            ``tls=``): the CA its servers' certificates chain to, and this client's certificate and key
            where the plane demands mutual TLS (the same material reaches the controller, over Flight,
            and every storage server). Default for a ``grpc+tls://`` or a ``ray://`` address: the PEM
            files named by ``TRAJFLIGHT_TLS_CA`` (and ``TRAJFLIGHT_TLS_CERT`` / ``TRAJFLIGHT_TLS_KEY`` for
            mutual TLS), when set.
        token: For a plane with a deployment secret: this process's credential (from the operator's
            ``trajflight token``); default ``TRAJFLIGHT_TOKEN`` from the environment. On an embedded plane
            the client sends it to the controller and gets short-lived storage tokens from it (refreshed
            before they expire); on a Ray plane it is the storage token itself.

    Raises:
        InvalidRequestError: an address of another scheme. UnavailableError / NotFoundError: nothing
        answers there.
    """
    credential = env_credential(token)
    if tls is None and address.startswith(("grpc+tls://", SCHEME)):
        tls = env_tls()  # a Ray plane's grpc+tls:// storage servers too (issue 18: it read only the token)
    if address.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        transport_ = FlightTransport(address, tls, credential, local=transport != "flight")
        storage = (
            None if credential is None else RefreshingCredential(lambda: transport_.storage_token(timeout))
        )
        return Client(
            ControllerClient(transport_, timeout=timeout),
            address=address,
            timeout=timeout,
            transport=transport,
            tls=tls,
            credential=storage,
        )
    if address.startswith(SCHEME):
        controller = connect_ray_plane(address, timeout=timeout)
        # Ray plane servers register under their Ray node ids: writers are placed by this process's.
        return Client(
            controller,
            address=address,
            timeout=timeout,
            transport=transport,
            node=current_node_id(),
            tls=tls,
            credential=credential,
        )
    raise InvalidRequestError(
        f"unknown data plane address {address!r}: use grpc://HOST:PORT (embedded) or ray://NAMESPACE/NAME"
    )


class Client:
    """A connection to one data plane: jobs, writers, trainers, checkpoints and stats.

    Args:
        controller: The controller client (any host).
        address: The address it was reached at (for messages and ``stats``).
        timeout: Default deadline of every call.
        transport: ``"auto"`` (default: shared memory with storage servers on this host, decided by host
            identity; Flight otherwise), ``"shm"`` or ``"flight"`` to force one path.
        node: Where this process runs, for same-node placement of its writers' groups: the Ray node id on
            a Ray data plane (``connect`` and ``RayCluster.client`` pass it), else this host's identity
            (the default; the embedded plane registers its servers under it).
        tls: TLS material for the plane's ``grpc+tls://`` storage servers (see ``connect``).
        credential: The storage token of every storage call (a credential or a callable asked per call);
            None on a plane without a deployment secret.

    Attributes:
        session: What the client's writers, trainers and leases share (controller, storage, renewals).
    """

    def __init__(
        self,
        controller: ControllerClient,
        *,
        address: str = "",
        timeout: float = 30.0,
        transport: Transport = "auto",
        node: str | None = None,
        tls: TlsConfig | None = None,
        credential: Credential | CredentialSource | None = None,
    ) -> None:
        pool = StoragePool(timeout=timeout, transport=transport, tls=tls, credential=credential)
        self.session = Session(controller, pool, Renewals(), timeout)
        self.address = address
        self.node = host_id() if node is None else node
        self._writers: weakref.WeakSet[Writer] = weakref.WeakSet()

    @property
    def controller(self) -> ControllerClient:
        """The controller client."""
        return self.session.controller

    @property
    def storage(self) -> StoragePool:
        """The pool of storage-server connections."""
        return self.session.storage

    @property
    def timeout(self) -> float:
        """Default deadline of every call, seconds."""
        return self.session.timeout

    def close(self) -> None:
        """Close the client's writers (giving back the grants they hold ahead), then storage connections
        and the controller transport."""
        for writer in list(self._writers):
            with contextlib.suppress(TrajflightError):  # best effort: unreturned grants expire anyway
                writer.close()
        self.storage.close()
        close = getattr(self.controller.transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fence_servers(self, job_id: str, epoch: int) -> None:
        self.storage.fence((s.location for s in self.controller.servers()), job_id, epoch)

    def open_job(
        self,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None = None,
        *,
        old_ready: OldReady | str = OldReady.REOFFER,
    ) -> JobConfig:
        """Open ``job_id`` at ``epoch`` (larger than any before) and fence older epochs everywhere.

        The controller refuses older epochs' allocations and leases; every storage server is told to
        refuse their puts too, so a stale rollout worker cannot write.

        Raises:
            StaleFenceError: the epoch is not larger than one seen before. ConfigError: names the setting.
        """
        cfg = self.controller.open_job(job_id, epoch, config, old_ready=old_ready)
        self._fence_servers(job_id, epoch)
        return cfg

    def restore(
        self,
        source: bytes | str | os.PathLike[str],
        *,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None = None,
        old_ready: OldReady | str = OldReady.REOFFER,
    ) -> dict[str, int]:
        """Restart a job from a checkpoint under a larger epoch, fencing the old one on every server.

        Every registered storage server is asked what it holds for the job first, and that decides
        (``Ledger.restore``): groups READY at the checkpoint are offered again (also those the rolled-back
        incarnation committed after it: committed data is kept until a later checkpoint is durable);
        groups the servers hold that the checkpoint does not know are purged (deleted, counted as
        ``purged``); groups READY at the checkpoint that no server holds are reported lost (counted as
        ``lost``, listed by :meth:`lost` and logged). ``old_ready="drop"`` drops the READY groups instead.

        Returns:
            The job's counts after the restore.

        Raises:
            UnavailableError, DeadlineExceededError: a storage server did not list its groups; nothing
                was restored (start it again, or restore with ``ControllerClient.restore`` and an explicit
                ``available`` list).
        """
        held: list[HeldGroup] = []
        min_token = 0
        for server in self.controller.servers():
            storage = self.storage.client(server.location)
            held += [
                HeldGroup(Partition(*g.key), server.server_id, max(0, int(g.nbytes)), tuple(g.schema.names))
                for g in storage.list_groups(job_id)
            ]
            seen = storage.stats()["jobs"].get(job_id, {}).get("max_generation", 0)
            min_token = max(min_token, int(seen))
        out = self.controller.restore(
            source,
            job_id=job_id,
            epoch=epoch,
            config=config,
            old_ready=old_ready,
            available=held,
            min_token=min_token,
        )
        self._fence_servers(job_id, epoch)
        if out.get("lost"):
            lost = self.controller.lost(job_id)
            shown = ", ".join(f"{tuple(x.partition)} ({x.reason})" for x in lost[:10])
            log.warning(
                "restore of job %.100r: %d groups are lost (never to be offered again): %s%s",
                job_id, len(lost), shown, ", ..." if len(lost) > 10 else "",
            )  # fmt: skip
        return out

    def lost(self, job_id: str) -> tuple[LostGroup, ...]:
        """Groups of the job that can never be offered again although they were not trained, each with
        its partition and why (restores and trainers record them; see ``Ledger.lost``)."""
        return self.controller.lost(job_id)

    def checkpoint(self, job_id: str, path: str | os.PathLike[str] | None = None) -> bytes:
        """Checkpoint the job (refused while a group is LEASED..TRAINED); written atomically to ``path``
        by this process when given (never by the controller), and then confirmed durable.

        From a job's first checkpoint on, committed groups stay stored (holding capacity) until a later
        checkpoint is durable, so that a restore from the newest one finds every group it must offer
        again. Without ``path``, keep the bytes safe, then call :meth:`confirm_checkpoint`."""
        return self.controller.checkpoint(job_id, path)

    def confirm_checkpoint(self, job_id: str, checkpoint: bytes | int) -> int:
        """The checkpoint's bytes (taken without a path) are stored safely: the commits it covers are
        deleted from now on. Returns how many kept commits were released."""
        return self.controller.confirm_checkpoint(job_id, checkpoint)

    def writer(
        self,
        job_id: str,
        epoch: int,
        *,
        writer_id: str | None = None,
        policy_version: int = 0,
        put_timeout: float = 60.0,
        node: str | None = None,
        grant_ahead: bool = False,
    ) -> Writer:
        """Register a rollout worker of ``job_id`` at ``epoch`` and return its :class:`Writer`.

        ``node`` is where it runs, for same-node placement (default: the client's, see :class:`Writer`);
        ``grant_ahead``: each put gets the next one's grant with its publication (one controller call
        a steady-state put; the held grant is charged until :meth:`close` or its expiry, see
        :class:`Writer`)."""
        writer = Writer(
            self.session,
            job_id,
            epoch,
            node=self.node if node is None else node,
            writer_id=writer_id,
            policy_version=policy_version,
            put_timeout=put_timeout,
            grant_ahead=grant_ahead,
        )
        self._writers.add(writer)
        return writer

    def trainer(
        self,
        job_id: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        fence_timeout: float = FENCE_TIMEOUT,
    ) -> Trainer:
        """A :class:`Trainer` leasing groups of ``job_id`` (see :class:`Trainer` for the arguments)."""
        return Trainer(self.session, job_id, owner=owner, ttl=ttl, fence_timeout=fence_timeout)

    def stats(self, job_id: str | None = None) -> dict[str, Any]:
        """Counters of the controller host, group counts per state, and every storage server's stats."""
        transport_info = getattr(self.controller.transport, "info", None)
        out: dict[str, Any] = {"address": self.address}
        if transport_info is not None:
            out["controller"] = transport_info(self.timeout)
        out["servers"] = {
            s.server_id: self.storage.client(s.location).stats() for s in self.controller.servers()
        }
        if job_id is not None:
            out["counts"] = self.controller.counts(job_id)
            out["usage_bytes"], out["usage_groups"] = self.controller.usage(job_id)
        return out
