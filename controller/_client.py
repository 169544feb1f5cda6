"""One client interface for both hosts: every call under a deadline, every failure a typed error.

:class:`ControllerClient` has one method per client operation (the commands of route ``CALL`` and ``OWN``
in :mod:`._commands`); each builds its command and hands it to the transport. The ledger's docstrings
(:class:`~trajflight.controller.Ledger`) state each contract, which holds unchanged through the client
except that ``now`` is the host's clock. Two transports carry the calls (:mod:`._transports`):
:class:`~._transports.LocalTransport` (a :class:`~trajflight.controller.LocalController` in this process)
and :class:`~._transports.RayTransport` (the named Ray actor). Errors are the ledger's own classes on
both, plus :class:`~trajflight.errors.DeadlineExceededError` (the call did not complete in time; it may
still run on the Ray host) and :class:`~trajflight.errors.UnavailableError` (the host is gone or
restarting; a call may have run although it failed, as with any Ray actor call).

It does not retry: every operation except ``acquire`` is idempotent when repeated identically, so the
caller may retry after a deadline or an unavailable host; a retried ``acquire`` may lease other groups
(the first lease, if granted, expires on its own).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from trajflight.errors import CapacityExceededError, NotFoundError

from ._checkpoint import checkpoint_seq
from ._commands import (
    Abandon,
    AckPolicy,
    Acquire,
    Allocate,
    AllocateMany,
    AnnouncePolicy,
    Command,
    Commit,
    ConfirmCheckpoint,
    Counts,
    FenceList,
    FinishTraining,
    GcList,
    Group,
    LeaseGroups,
    Lost,
    OpenJob,
    Prepare,
    Publish,
    PublishAhead,
    PublishMany,
    RegisterServer,
    RegisterWriter,
    Release,
    Renew,
    ReportUnusable,
    Resolve,
    Servers,
    StartTraining,
    Usage,
)
from ._commands import PolicyStatus as GetPolicyStatus
from ._entries import check_seconds
from ._files import read_file, write_atomic
from ._host import MAX_WAIT, LocalController
from ._ray_host import import_ray, start_ray_actor
from ._records import (
    DeleteWork,
    FenceWork,
    GroupInfo,
    HeldGroup,
    JobConfig,
    Lease,
    LostGroup,
    OldReady,
    Partition,
    PolicyStatus,
    Publication,
    Published,
    PutGrant,
    ServerInfo,
)
from ._transports import LocalTransport, RayTransport, Transport, poll_window

__all__ = ["ControllerClient", "connect_ray", "start_ray_controller"]

R = TypeVar("R")


def connect_ray(
    name: str = "trajflight-controller", *, namespace: str = "trajflight", timeout: float = 30.0
) -> ControllerClient:
    """A client of the named controller actor (Ray must be initialised in this process).

    Raises:
        NotFoundError: no actor of that name in that namespace.
    """
    ray = import_ray()
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise NotFoundError(
            f"no controller actor {name!r} in Ray namespace {namespace!r}; start one with "
            "start_ray_controller"
        ) from None
    return ControllerClient(RayTransport(actor), timeout=timeout)


def start_ray_controller(*, timeout: float = 30.0, **kwargs: Any) -> ControllerClient:
    """Start the named controller actor (see ``start_ray_actor`` for ``kwargs``: ``name``, ``namespace``,
    ``state_dir``, ``deleter``, ``max_restarts``, ...) and return a client of it. Ray must be initialised.
    """
    return ControllerClient(RayTransport(start_ray_actor(**kwargs)), timeout=timeout)


class ControllerClient:
    """The controller's operations, the same for the in-process and the Ray host.

    Every method takes ``timeout`` (seconds; default the client's) and raises
    :class:`~trajflight.errors.DeadlineExceededError` when the host did not answer in time. The contract
    of each operation is the ledger method of the same name.

    Args:
        transport: :class:`LocalTransport`, :class:`RayTransport`, or a :class:`LocalController`.
        timeout: Default deadline of every call.
    """

    def __init__(self, transport: Transport | LocalController, *, timeout: float = 30.0) -> None:
        if isinstance(transport, LocalController):
            transport = LocalTransport(transport)
        self.transport: Transport = transport
        self.timeout = timeout

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _run(self, command: Command[R], timeout: float | None) -> R:
        out: R = self.transport.invoke(command.name, command.arguments(), self._t(timeout))
        return out

    def call_many(
        self, calls: Sequence[tuple[str, dict[str, Any]]], *, timeout: float | None = None
    ) -> list[Any]:
        """Run several operations in order, in one round trip where the host allows it.

        Each is the operation of the same name with its keyword arguments (for example
        ``("start_training", {"token": t, "batch_id": b})``). The first error is raised; operations after
        it may or may not have run (each is a compare-and-set, so a repeat is safe).
        """
        many = getattr(self.transport, "invoke_many", None)
        if many is not None:
            out: list[Any] = many(list(calls), self._t(timeout))
            return out
        return [self.transport.invoke(method, kwargs, self._t(timeout)) for method, kwargs in calls]

    # ------------------------------------------------------------------ servers, jobs, writers
    def register_server(
        self,
        server_id: str,
        *,
        node: str,
        location: str,
        capacity_bytes: int,
        capacity_groups: int,
        timeout: float | None = None,
    ) -> ServerInfo:
        """Register or update a storage server (``Ledger.register_server``)."""
        return self._run(
            RegisterServer(
                server_id=server_id,
                node=node,
                location=location,
                capacity_bytes=capacity_bytes,
                capacity_groups=capacity_groups,
            ),
            timeout,
        )

    def open_job(
        self,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None = None,
        *,
        old_ready: OldReady | str = OldReady.REOFFER,
        timeout: float | None = None,
    ) -> JobConfig:
        """Open a job at an epoch, fencing older ones (``Ledger.open_job``); ConfigError names the setting."""
        cfg = dict(config) if isinstance(config, Mapping) else config
        return self._run(OpenJob(job_id=job_id, epoch=epoch, config=cfg, old_ready=old_ready), timeout)

    def register_writer(
        self,
        job_id: str,
        epoch: int,
        writer_id: str,
        *,
        node: str,
        policy_version: int | None = None,
        timeout: float | None = None,
    ) -> PolicyStatus:
        """Register a rollout worker of the current epoch (``Ledger.register_writer``)."""
        return self._run(
            RegisterWriter(
                job_id=job_id, epoch=epoch, writer_id=writer_id, node=node, policy_version=policy_version
            ),
            timeout,
        )

    def announce_policy(self, job_id: str, version: int, *, timeout: float | None = None) -> PolicyStatus:
        """Announce new weights (``Ledger.announce_policy``)."""
        return self._run(AnnouncePolicy(job_id=job_id, version=version), timeout)

    def ack_policy(
        self, job_id: str, epoch: int, writer_id: str, version: int, *, timeout: float | None = None
    ) -> PolicyStatus:
        """A writer acknowledges a policy version (``Ledger.ack_policy``)."""
        return self._run(AckPolicy(job_id=job_id, epoch=epoch, writer_id=writer_id, version=version), timeout)

    def policy_status(self, job_id: str, *, timeout: float | None = None) -> PolicyStatus:
        """The announced version and who acknowledged it (``Ledger.policy_status``)."""
        return self._run(GetPolicyStatus(job_id=job_id), timeout)

    # ------------------------------------------------------------------ partitions
    def _waiting(self, command: Command[R], wait: float, timeout: float | None) -> R:
        """Run ``command``, which capacity may refuse, waiting up to ``wait`` seconds for capacity to come
        back: the host parks the call and runs it again whenever capacity is released. ``wait`` is cut to
        the deadline less the reply's time (:func:`~._transports.poll_window`); a host parks one poll for
        at most :data:`~trajflight.controller._host.MAX_WAIT` seconds, and a longer ``wait`` is made of
        several polls. The last refusal is raised when ``wait`` ends; ``wait=0`` asks once.

        It asks first as every call does (wait 0): most asks fit, and only a refused one is parked."""
        check_seconds(wait, "wait")
        t = self._t(timeout)
        start = time.monotonic()
        try:
            return self._run(command, t)
        except CapacityExceededError:
            if not wait:
                raise
        name, kwargs = command.name, command.arguments()
        total, covered = poll_window(wait, t), 0.0
        while True:
            poll = min(total - covered, MAX_WAIT)
            try:
                left = max(0.0, start + t - time.monotonic())
                out: R = self.transport.invoke(name, kwargs, left, wait=poll)
                return out
            except CapacityExceededError:
                covered += poll
                if covered >= total:  # at most ceil(wait / MAX_WAIT) polls
                    raise

    def allocate(
        self,
        job_id: str,
        epoch: int,
        writer_id: str,
        *,
        nbytes: int,
        wait: float = 0.0,
        timeout: float | None = None,
    ) -> PutGrant:
        """Next partition, placed, with capacity reserved (``Ledger.allocate``).

        Args:
            wait: Seconds to wait for capacity when it is full: the host parks the call and grants it as
                soon as capacity is released (cut to the deadline less the reply's time); 0: refuse at once.

        Raises:
            CapacityExceededError: capacity stayed full for ``wait`` (``retry_after`` set: the job's hint).
            InvalidRequestError: ``wait`` is not a finite number of seconds >= 0 (or a bad argument).
        """
        command = Allocate(job_id=job_id, epoch=epoch, writer_id=writer_id, nbytes=nbytes)
        return self._waiting(command, wait, timeout)

    def allocate_many(
        self,
        job_id: str,
        epoch: int,
        writer_id: str,
        *,
        nbytes: Sequence[int],
        wait: float = 0.0,
        timeout: float | None = None,
    ) -> list[PutGrant]:
        """Next partitions for several groups in one controller operation (``Ledger.allocate_many``).

        The grants are those of :meth:`allocate` called once per size in ``nbytes``, in order, stopping at
        the first that does not fit: when capacity runs out after ``k`` groups it returns those ``k``
        grants (a prefix of the groups, each whole) and the caller asks again for the rest later. When not
        even the first group fits it raises :class:`~trajflight.errors.CapacityExceededError` with
        ``retry_after``, as :meth:`allocate` does, and grants nothing.

        Args:
            nbytes: Bytes to reserve for each group; a non-empty list of positive ints.
            wait: Seconds to wait, as :meth:`allocate` waits, while not even the first group fits.

        Returns:
            At least one grant, in the order of ``nbytes``.

        Raises:
            CapacityExceededError: not even the first group fits, and did not within ``wait``
                (``retry_after`` set).
            InvalidRequestError: ``nbytes`` is empty, or a size is not positive or exceeds
                ``max_group_bytes``; nothing was granted.
            StaleFenceError, NotFoundError, InvalidStateError: as for :meth:`allocate`.
        """
        command = AllocateMany(job_id=job_id, epoch=epoch, writer_id=writer_id, nbytes=nbytes)
        return self._waiting(command, wait, timeout)

    def publish(
        self,
        partition: Partition,
        *,
        token: int,
        rows: int,
        nbytes: int,
        tokens: int,
        policy_version: int,
        columns: Iterable[str],
        timeout: float | None = None,
    ) -> GroupInfo:
        """Make a stored group READY (``Ledger.publish``)."""
        return self._run(
            Publish(
                partition=partition,
                token=token,
                rows=rows,
                nbytes=nbytes,
                tokens=tokens,
                policy_version=policy_version,
                columns=tuple(columns),
            ),
            timeout,
        )

    def publish_many(self, items: Sequence[Publication], *, timeout: float | None = None) -> list[GroupInfo]:
        """Make several stored groups READY in one controller operation (``Ledger.publish_many``).

        Each item is published as :meth:`publish` publishes it, in order. All or nothing: when the host
        refuses an item it raises what :meth:`publish` would raise for it and publishes none of the items.
        Repeating a call that succeeded returns the same groups, so it is safe to retry after a deadline.

        Args:
            items: One :class:`~trajflight.controller.Publication` per stored group; a non-empty list.

        Returns:
            One :class:`~trajflight.controller.GroupInfo` per item, in order.

        Raises:
            InvalidRequestError: ``items`` is empty, an item is not a ``Publication``, or as :meth:`publish`.
            StaleFenceError, NotFoundError, LeaseExpiredError, AlreadyExistsError: as :meth:`publish`;
                nothing was published.
        """
        return self._run(PublishMany(items=items), timeout)

    def publish_ahead(
        self,
        items: Sequence[Publication],
        *,
        job_id: str,
        epoch: int,
        writer_id: str,
        ahead: Sequence[int] = (),
        timeout: float | None = None,
    ) -> Published:
        """Publish stored groups and grant the writer's next partitions in one controller operation
        (``Ledger.publish_ahead``).

        The publication is :meth:`publish_many`'s (all or nothing); the grants are those
        :meth:`allocate_many` would make for ``ahead`` right after it, or none where they do not fit:
        asking ahead never makes the publication fail. Each grant stays valid for
        ``expires_at - granted_at`` seconds from when the answer arrived (ledger time is the host's).

        Raises:
            StaleFenceError, NotFoundError, InvalidRequestError, LeaseExpiredError, AlreadyExistsError: as
                :meth:`publish_many` (or the writer is not registered, or ``ahead`` is not a list of
                positive ints); nothing was published.
        """
        return self._run(
            PublishAhead(items=items, job_id=job_id, epoch=epoch, writer_id=writer_id, ahead=ahead), timeout
        )

    def abandon(self, partition: Partition, *, token: int, timeout: float | None = None) -> bool:
        """Give up an unpublished grant now rather than at its expiry (``Ledger.abandon``): ``True`` when
        it was abandoned, ``False`` when it was already published or dropped."""
        return self._run(Abandon(partition=partition, token=token), timeout)

    def group(self, partition: Partition, *, timeout: float | None = None) -> GroupInfo:
        """What the controller knows of one group (``Ledger.group``)."""
        return self._run(Group(partition=partition), timeout)

    # ------------------------------------------------------------------ leases
    def acquire(
        self,
        job_id: str,
        owner: str,
        *,
        max_groups: int,
        wait: float = 0.0,
        ttl: float | None = None,
        max_tokens: int | None = None,
        max_staleness: int | None = None,
        require: Iterable[str] = (),
        lack: Iterable[str] = (),
        timeout: float | None = None,
    ) -> Lease | None:
        """Lease up to ``max_groups`` READY groups, waiting up to ``wait`` seconds for some to appear.

        Returns ``None`` when none was eligible in time; ``wait`` is cut to the deadline. Other callers
        proceed while this one waits (on both hosts). See ``Ledger.acquire`` for the filters.

        A host parks one poll for at most :data:`~trajflight.controller._host.MAX_WAIT` seconds; a longer
        ``wait`` is made of several polls, one after the other, until a lease comes or ``wait`` ends.

        Raises:
            InvalidRequestError: ``wait`` is not a finite number of seconds >= 0 (or a filter is bad).
            UnavailableError: the controller is shutting down (a parked poll is answered with it).
        """
        check_seconds(wait, "wait")
        t = self._t(timeout)
        kwargs = Acquire(
            job_id=job_id, owner=owner, max_groups=max_groups, ttl=ttl, max_tokens=max_tokens,
            max_staleness=max_staleness, require=tuple(require), lack=tuple(lack),
        ).arguments()  # fmt: skip
        start, total, covered = time.monotonic(), min(wait, t), 0.0
        left = t  # the whole call's deadline bounds every poll
        while True:
            poll = min(total - covered, MAX_WAIT)
            lease = self.transport.acquire(kwargs, poll, left)
            covered += poll
            left = start + t - time.monotonic()
            if lease is not None or covered >= total or left <= 0:  # at most ceil(wait / MAX_WAIT) polls
                return lease

    def renew(self, token: int, *, ttl: float | None = None, timeout: float | None = None) -> float:
        """Heartbeat: extend the whole lease; returns the new expiry (host clock)."""
        return self._run(Renew(token=token, ttl=ttl), timeout)

    def prepare(
        self,
        token: int,
        batch_id: str,
        *,
        partitions: Sequence[Partition] | None = None,
        timeout: float | None = None,
    ) -> tuple[Partition, ...]:
        """LEASED -> PREPARED for a batch of the lease (``Ledger.prepare``)."""
        parts = None if partitions is None else tuple(Partition(*p) for p in partitions)
        return self._run(Prepare(token=token, batch_id=batch_id, partitions=parts), timeout)

    def start_training(
        self, token: int, batch_id: str, *, timeout: float | None = None
    ) -> tuple[Partition, ...]:
        """PREPARED -> TRAINING for the batch (``Ledger.start_training``)."""
        return self._run(StartTraining(token=token, batch_id=batch_id), timeout)

    def finish_training(
        self, token: int, batch_id: str, *, timeout: float | None = None
    ) -> tuple[Partition, ...]:
        """TRAINING -> TRAINED for the batch (``Ledger.finish_training``)."""
        return self._run(FinishTraining(token=token, batch_id=batch_id), timeout)

    def commit(self, token: int, batch_id: str, *, timeout: float | None = None) -> tuple[Partition, ...]:
        """TRAINED -> COMMITTED for the batch; its groups go to the GC list (``Ledger.commit``)."""
        return self._run(Commit(token=token, batch_id=batch_id), timeout)

    def release(
        self,
        token: int,
        *,
        partitions: Sequence[Partition] | None = None,
        columns: Iterable[str] = (),
        timeout: float | None = None,
    ) -> tuple[Partition, ...]:
        """Give LEASED/PREPARED groups back to READY, recording appended columns (``Ledger.release``)."""
        parts = None if partitions is None else tuple(Partition(*p) for p in partitions)
        return self._run(Release(token=token, partitions=parts, columns=tuple(columns)), timeout)

    def report_unusable(
        self,
        token: int,
        *,
        missing: Sequence[Partition] = (),
        unreachable: Sequence[str] = (),
        timeout: float | None = None,
    ) -> tuple[Partition, ...]:
        """Take groups a trainer could not open out of its lease: ``missing`` ones (their server does not
        hold them) are recorded lost, those on ``unreachable`` servers go back to READY while the servers
        back off (``Ledger.report_unusable``). Returns the partitions that left the lease."""
        parts = tuple(Partition(*p) for p in missing)
        return self._run(ReportUnusable(token=token, missing=parts, unreachable=tuple(unreachable)), timeout)

    def resolve(
        self, job_id: str, partitions: Sequence[Partition], action: str, *, timeout: float | None = None
    ) -> tuple[Partition, ...]:
        """Operator: requeue or drop UNKNOWN groups (``Ledger.resolve``)."""
        parts = tuple(Partition(*p) for p in partitions)
        return self._run(Resolve(job_id=job_id, partitions=parts, action=action), timeout)

    # ------------------------------------------------------------------ queries
    def counts(self, job_id: str, *, timeout: float | None = None) -> dict[str, int]:
        """Groups per state of the job (``Ledger.counts``)."""
        return self._run(Counts(job_id=job_id), timeout)

    def usage(self, job_id: str, *, timeout: float | None = None) -> tuple[int, int]:
        """``(bytes, groups)`` the job holds (``Ledger.usage``)."""
        return self._run(Usage(job_id=job_id), timeout)

    def lease_groups(self, token: int, *, timeout: float | None = None) -> tuple[GroupInfo, ...]:
        """The groups of a lease, as they are now (``Ledger.lease_groups``)."""
        return self._run(LeaseGroups(token=token), timeout)

    def gc_list(self, job_id: str | None = None, *, timeout: float | None = None) -> tuple[DeleteWork, ...]:
        """What waits for a confirmed delete (``Ledger.gc_list``)."""
        return self._run(GcList(job_id=job_id), timeout)

    def fence_list(self, *, timeout: float | None = None) -> tuple[FenceWork, ...]:
        """Fences that wait for their storage servers to confirm them (``Ledger.fence_list``)."""
        return self._run(FenceList(), timeout)

    def servers(self, *, timeout: float | None = None) -> tuple[ServerInfo, ...]:
        """Registered storage servers and their reservations."""
        return self._run(Servers(), timeout)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(
        self, job_id: str, path: str | os.PathLike[str] | None = None, *, timeout: float | None = None
    ) -> bytes:
        """Take the job's checkpoint (refused while any group is LEASED..TRAINED); write it atomically to
        ``path`` in this process's file system when given (temporary file, fsync, rename), and then
        confirm it durable. Returns its bytes. The host never writes a file its caller names.

        Without ``path`` the checkpoint is not durable until :meth:`confirm_checkpoint` says so: until
        then the job keeps its committed groups (``Ledger.checkpoint``).

        Raises:
            InvalidStateError: a group is LEASED..TRAINED. CheckpointError: the file could not be written
                (nothing is confirmed: kept commits stay kept).
        """
        data = self.transport.checkpoint(job_id, None, self._t(timeout))
        if path is not None:
            write_atomic(path, data)
            self.confirm_checkpoint(job_id, data, timeout=timeout)
        return data

    def confirm_checkpoint(
        self, job_id: str, checkpoint: bytes | int, *, timeout: float | None = None
    ) -> int:
        """The checkpoint (its bytes, or its sequence number) is stored safely: the commits it covers
        are deleted from now on (``Ledger.confirm_checkpoint``). Returns how many were released."""
        seq = checkpoint if isinstance(checkpoint, int) else checkpoint_seq(checkpoint)
        return self._run(ConfirmCheckpoint(job_id=job_id, seq=seq), timeout)

    def lost(self, job_id: str, *, timeout: float | None = None) -> tuple[LostGroup, ...]:
        """Groups of the job that can never be offered again, with why (``Ledger.lost``)."""
        return self._run(Lost(job_id=job_id), timeout)

    def restore(
        self,
        source: bytes | str | os.PathLike[str],
        *,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None,
        old_ready: OldReady | str = OldReady.REOFFER,
        available: Iterable[Partition | HeldGroup] | None = None,
        min_token: int = 0,
        timeout: float | None = None,
    ) -> dict[str, int]:
        """Restart a job from a checkpoint (bytes, or a file in this process's file system, read here:
        the host never reads a file its caller names) under a larger epoch (``Ledger.restore``);
        ``available`` lists what the storage servers hold (:class:`HeldGroup` listings, or bare
        partitions); ``min_token`` the highest generation they saw for the job."""
        src = source if isinstance(source, bytes) else read_file(source)
        cfg = dict(config) if isinstance(config, Mapping) else config
        kwargs: dict[str, Any] = {"job_id": job_id, "epoch": epoch, "config": cfg, "old_ready": old_ready}
        if available is not None:
            kwargs["available"] = tuple(p if isinstance(p, HeldGroup) else Partition(*p) for p in available)
        if min_token:
            kwargs["min_token"] = min_token
        return self.transport.restore(src, kwargs, self._t(timeout))
