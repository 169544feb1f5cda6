"""Partitions on top of :class:`~._core.LedgerCore`: put grants (placement and capacity) and publishing.

``allocate`` gives a writer the job's next partition on a storage server with room and reserves its
bytes under a grant token; ``publish`` makes the stored group READY and gives back what it did not use.
An unpublished grant expires after the job's ``grant_ttl`` and its partition is garbage-collected.

Sans-IO like the rest of the ledger (see :mod:`._core`). It does not check that a published group is
really stored: the storage server refuses puts without the grant's token, and the writer publishes only
after its put succeeded.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from trajflight.errors import (
    AlreadyExistsError,
    CapacityExceededError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
)

from ._core import LedgerCore
from ._entries import (
    ALLOCATED,
    DROPPED,
    _Group,
    _Job,
    _Server,
    _Writer,
    check_columns,
    check_int,
    check_partition,
)
from ._records import GroupInfo, Partition, PutGrant

__all__ = ["PartitionLedger"]


class PartitionLedger(LedgerCore):
    """Put grants and publishing; :class:`~._leases.LeaseMachine` adds the leases."""

    def allocate(self, job_id: str, epoch: int, writer_id: str, *, nbytes: int, now: float) -> PutGrant:
        """Give a writer the next partition of the job, placed and with ``nbytes`` reserved.

        Placement: a server on the writer's node with room, else any server with room, the least loaded
        by bytes first (ties by id).

        Raises:
            StaleFenceError: ``epoch`` is fenced.
            NotFoundError: the job/epoch is not open or the writer is not registered.
            InvalidRequestError: ``nbytes`` is not positive or exceeds ``max_group_bytes``.
            InvalidStateError: strict on-policy mode and the writer has not acknowledged the current
                policy version (``retry_after`` set).
            CapacityExceededError: the job's or every server's capacity is full (``retry_after`` set).
        """
        now = self._advance(now)
        job, writer = self._allocating_writer(job_id, epoch, writer_id)
        self._check_group_size(job, nbytes, "nbytes")
        self._check_on_policy(job, writer_id, writer)
        server = self._room(job, writer.node, nbytes)
        if isinstance(server, CapacityExceededError):
            raise server
        return self._grant(job, server, nbytes, now)

    def allocate_many(
        self, job_id: str, epoch: int, writer_id: str, *, nbytes: Sequence[int], now: float
    ) -> list[PutGrant]:
        """Give a writer the next partitions of the job, one per group size in ``nbytes``, in order.

        The grants are exactly those of calling :meth:`allocate` once per size, in order, at the same
        ``now``, stopping at the first refusal for capacity: the same placement, partitions, tokens and
        expiries. When capacity runs out after ``k`` grants it returns those ``k`` (a prefix: a later,
        smaller group is never granted ahead of one that did not fit, so partitions keep the order of the
        groups); ask again for the rest later. Every grant is whole; nothing is reserved for the groups
        not granted. Every size is checked before anything is granted, so a refused call changes nothing.

        Args:
            nbytes: Bytes to reserve for each group (a non-empty list of positive ints).

        Returns:
            One grant per granted group, in the order of ``nbytes``; at least one.

        Raises:
            StaleFenceError: ``epoch`` is fenced.
            NotFoundError: the job/epoch is not open or the writer is not registered.
            InvalidRequestError: ``nbytes`` is empty or not a list, or a size is not positive or exceeds
                ``max_group_bytes`` (the message names its index).
            InvalidStateError: strict on-policy mode and the writer has not acknowledged the current
                policy version (``retry_after`` set).
            CapacityExceededError: not even the first group fits, exactly as :meth:`allocate` refuses it
                (``retry_after`` set); nothing was granted.
        """
        now = self._advance(now)
        job, writer = self._allocating_writer(job_id, epoch, writer_id)
        if isinstance(nbytes, str | bytes) or not isinstance(nbytes, Sequence):
            raise InvalidRequestError(
                f"nbytes must be a list of group sizes (one int per group), got {type(nbytes).__name__}; "
                "call allocate for a single group"
            )
        if not nbytes:
            raise InvalidRequestError("nbytes is empty; pass one size per group to allocate (at least one)")
        for i, size in enumerate(nbytes):
            self._check_group_size(job, size, f"nbytes[{i}]")
        self._check_on_policy(job, writer_id, writer)
        grants: list[PutGrant] = []
        for size in nbytes:
            server = self._room(job, writer.node, size)
            if isinstance(server, CapacityExceededError):
                if grants:
                    break
                raise server
            grants.append(self._grant(job, server, size, now))
        return grants

    def _allocating_writer(self, job_id: str, epoch: int, writer_id: str) -> tuple[_Job, _Writer]:
        job = self._job_epoch(job_id, epoch)
        writer = job.writers.get(writer_id)
        if writer is None:
            raise NotFoundError(
                f"writer {writer_id!r} is not registered for job {job_id!r} epoch {epoch}; "
                "call register_writer"
            )
        return job, writer

    @staticmethod
    def _check_group_size(job: _Job, nbytes: int, what: str) -> None:
        check_int(nbytes, what, minimum=1)
        if nbytes > job.config.max_group_bytes:
            raise InvalidRequestError(
                f"{what}={nbytes} exceeds max_group_bytes={job.config.max_group_bytes}; split the group or "
                "raise the setting"
            )

    @staticmethod
    def _check_on_policy(job: _Job, writer_id: str, writer: _Writer) -> None:
        cfg = job.config
        if cfg.strict_on_policy and writer.acked < job.policy_version:
            raise InvalidStateError(
                f"writer {writer_id!r} has not acknowledged policy version {job.policy_version} (strict "
                "on-policy); load the new weights, call ack_policy, then allocate",
                retry_after=cfg.capacity_retry_after,
            )

    def _room(self, job: _Job, node: str, nbytes: int) -> _Server | CapacityExceededError:
        """The server a group of ``nbytes`` goes to, or the refusal to raise when it does not fit."""
        cfg = job.config
        if (cfg.capacity_bytes is not None and job.used_bytes + nbytes > cfg.capacity_bytes) or (
            cfg.capacity_groups is not None and job.used_groups + 1 > cfg.capacity_groups
        ):
            return CapacityExceededError(
                f"job {job.job_id!r} holds {job.used_bytes} bytes in {job.used_groups} groups, its capacity "
                f"is {cfg.capacity_bytes} bytes / {cfg.capacity_groups} groups; wait for trainers to commit",
                retry_after=cfg.capacity_retry_after,
            )
        server = self._place(node, nbytes)
        if server is None:
            return CapacityExceededError(
                f"no storage server has room for {nbytes} more bytes ({len(self._servers)} registered); wait "
                "for commits and deletes, or register more servers",
                retry_after=cfg.capacity_retry_after,
            )
        return server

    def _grant(self, job: _Job, server: _Server, nbytes: int, now: float) -> PutGrant:
        """Reserve ``nbytes`` on ``server`` for the job's next partition (checked by :meth:`_room`)."""
        key = Partition(job.job_id, job.epoch, job.next_group_id)
        job.next_group_id += 1
        token = self._next_token()
        expires_at = now + job.config.grant_ttl
        g = _Group(key, server.server_id, token, nbytes, expires_at)
        self._groups[key] = g
        job.groups[key] = None
        job.counts[ALLOCATED] += 1
        server.used_bytes += nbytes
        server.used_groups += 1
        job.used_bytes += nbytes
        job.used_groups += 1
        heapq.heappush(self._grant_heap, (expires_at, key))
        return PutGrant(key, server.server_id, server.location, token, nbytes, expires_at)

    def _place(self, node: str, nbytes: int) -> _Server | None:
        best: _Server | None = None
        best_rank: tuple[bool, int, str] | None = None
        for server in self._servers.values():
            if (
                server.used_bytes + nbytes > server.capacity_bytes
                or server.used_groups + 1 > server.capacity_groups
            ):
                continue
            rank = (server.node != node, server.used_bytes, server.server_id)
            if best_rank is None or rank < best_rank:
                best, best_rank = server, rank
        return best

    def publish(
        self,
        partition: Partition | Sequence[Any],
        *,
        token: int,
        rows: int,
        nbytes: int,
        tokens: int,
        policy_version: int,
        columns: Iterable[str],
        now: float,
    ) -> GroupInfo:
        """Make a stored group READY (idempotent for the same grant token and sizes).

        Unused reservation (granted minus ``nbytes``) is given back at once.

        Raises:
            StaleFenceError: the epoch is fenced, or ``token`` is not the grant's token.
            LeaseExpiredError: the grant expired; the partition is being garbage-collected.
            AlreadyExistsError: the partition was already published (with other values).
            InvalidRequestError: ``nbytes`` exceeds the reservation, or a value is invalid.
        """
        self._advance(now)
        key = check_partition(partition)
        job = self._job_epoch(key.job_id, key.epoch)
        g = self._groups.get(key)
        if g is None:
            raise NotFoundError(f"partition {tuple(key)} was never allocated (or is deleted); allocate first")
        if token != g.grant_token:
            raise StaleFenceError(
                f"token {token} is not the put grant of {tuple(key)}; use the grant's token"
            )
        if g.state is not ALLOCATED:
            if g.state is DROPPED and g.rows == 0:
                raise LeaseExpiredError(
                    f"the put grant of {tuple(key)} expired before publish; the partition is being garbage-"
                    "collected; allocate a new partition and put again",
                )
            if (g.rows, g.nbytes, g.tokens, g.policy_version) == (rows, nbytes, tokens, policy_version):
                return self._info(g)
            raise AlreadyExistsError(
                f"partition {tuple(key)} is already published; groups are never overwritten"
            )
        check_int(rows, "rows")
        check_int(nbytes, "nbytes")
        check_int(tokens, "tokens")
        check_int(policy_version, "policy_version")
        if nbytes > g.nbytes:
            raise InvalidRequestError(
                f"published nbytes={nbytes} exceeds the {g.nbytes} bytes reserved for {tuple(key)}; allocate "
                "with nbytes at least the group's size"
            )
        if policy_version > job.policy_version:
            raise InvalidRequestError(
                f"policy_version {policy_version} was never announced for job {key.job_id!r} "
                f"(current {job.policy_version})"
            )
        cols = check_columns(columns, "columns")
        giveback = g.nbytes - nbytes
        server = self._servers[g.server_id]
        server.used_bytes -= giveback
        job.used_bytes -= giveback
        g.nbytes, g.rows, g.tokens, g.policy_version = nbytes, rows, tokens, policy_version
        g.colset, g.columns = cols, self._columns(cols)
        self._make_ready(g, front=False)
        return self._info(g)

    def group(self, partition: Partition | Sequence[Any]) -> GroupInfo:
        """What the ledger knows of one group.

        Raises:
            NotFoundError: never allocated, or deleted.
        """
        g = self._groups.get(check_partition(partition))
        if g is None:
            raise NotFoundError(f"no group {tuple(partition)} (never allocated, or already deleted)")
        return self._info(g)
