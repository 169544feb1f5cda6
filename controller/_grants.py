"""Put grants and publishing: placement and capacity for new groups, and making stored groups READY.

``allocate`` gives a writer the job's next partition on a storage server with room and reserves its bytes
under a grant token; ``publish`` makes the stored group READY and gives back what it did not use;
``publish_ahead`` publishes and grants the writer's next partitions in the same operation. An unpublished
grant expires after the job's ``grant_ttl`` (or when its holder abandons it) and its partition is
garbage-collected.

It does not check that a published group is really stored: the storage server refuses puts without the
grant's token, and the writer publishes only after its put succeeded. It reads no clock.
"""

from __future__ import annotations

import contextlib
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

from ._entries import (
    ALLOCATED,
    DROPPED,
    INT64_MAX,
    _Group,
    _Job,
    _Server,
    _Writer,
    check_columns,
    check_int,
    check_name,
    check_partition,
)
from ._groups import Groups
from ._jobs import Jobs
from ._records import GroupInfo, Partition, Publication, Published, PutGrant
from ._servers import Servers
from ._tokens import Tokens

__all__ = ["Grants"]

_Sizes = tuple[int, int, int, int]
"""``(rows, nbytes, tokens, policy_version)`` of a publication."""


class Grants:
    """Put grants with their expiries, and publication.

    Args:
        jobs, servers, groups, tokens: The ledger's collaborators a grant touches.
    """

    __slots__ = ("_groups", "_heap", "_jobs", "_servers", "_tokens")

    def __init__(self, jobs: Jobs, servers: Servers, groups: Groups, tokens: Tokens) -> None:
        self._jobs = jobs
        self._servers = servers
        self._groups = groups
        self._tokens = tokens
        self._heap: list[tuple[float, Partition]] = []

    # ------------------------------------------------------------------ expiry
    def next_due(self) -> float | None:
        """When the earliest grant may expire (``None``: no grant)."""
        return self._heap[0][0] if self._heap else None

    def expire(self, now: float) -> None:
        """Abandon every grant due by ``now`` that was not published: its partition goes to the GC list."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            expires_at, key = heapq.heappop(heap)
            g = self._groups.table.get(key)
            if g is not None and g.state is ALLOCATED and g.expires_at == expires_at:
                self._groups.to_gc(g, DROPPED, now)

    def load(self, groups: Iterable[_Group]) -> None:
        """Schedule the expiries of the ALLOCATED ``groups`` (a snapshot's)."""
        self._heap.extend((g.expires_at, g.key) for g in groups if g.state is ALLOCATED)
        self._heap.sort()

    # ------------------------------------------------------------------ allocation
    def allocate(self, job_id: str, epoch: int, writer_id: str, nbytes: int, now: float) -> PutGrant:
        """See :meth:`~._ledger.Ledger.allocate`."""
        job, writer = self._allocating_writer(job_id, epoch, writer_id)
        self._check_group_size(job, nbytes, "nbytes")
        self._check_on_policy(job, writer_id, writer)
        server = self._room(job, writer.node, nbytes)
        if isinstance(server, CapacityExceededError):
            raise server
        return self._grant(job, server, nbytes, now)

    def allocate_many(
        self, job_id: str, epoch: int, writer_id: str, nbytes: Sequence[int], now: float
    ) -> list[PutGrant]:
        """See :meth:`~._ledger.Ledger.allocate_many`."""
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
        together = self._batch_server(job, writer.node, nbytes)
        if together is not None:  # one server: the batch's groups stay one slice of one segment
            return [self._grant(job, together, size, now) for size in nbytes]
        grants: list[PutGrant] = []
        for size in nbytes:
            server = self._room(job, writer.node, size)
            if isinstance(server, CapacityExceededError):
                if grants:
                    break
                raise server
            grants.append(self._grant(job, server, size, now))
        return grants

    def _batch_server(self, job: _Job, node: str, nbytes: Sequence[int]) -> _Server | None:
        """The one server all groups of a batch go to, or ``None`` to place them group by group.

        A batch of two or more groups goes to one server when the job's capacity holds all of it and
        some server has room for all of it: the server placement picks for the whole batch (on the
        writer's node first, then the least loaded), unless that server is off the writer's node while
        the first group alone would be placed on it. So a lease of the batch in order reads one slice of
        one server's segment, with no copy to join groups of several servers (issue 16).
        """
        if len(nbytes) < 2:
            return None
        total, cfg = sum(nbytes), job.config
        if (cfg.capacity_bytes is not None and job.used_bytes + total > cfg.capacity_bytes) or (
            cfg.capacity_groups is not None and job.used_groups + len(nbytes) > cfg.capacity_groups
        ):
            return None
        server = self._servers.place(node, total, len(nbytes))
        if server is None or server.node == node:
            return server
        first = self._servers.place(node, nbytes[0])
        return server if first is None or first.node != node else None

    def _allocating_writer(self, job_id: str, epoch: int, writer_id: str) -> tuple[_Job, _Writer]:
        job = self._jobs.job_epoch(job_id, epoch)
        writer = job.writers.get(check_name(writer_id, "writer_id"))
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
        server = self._servers.place(node, nbytes)
        if server is None:
            return CapacityExceededError(
                f"no storage server has room for {nbytes} more bytes ({len(self._servers.by_id)} "
                "registered); wait for commits and deletes, or register more servers",
                retry_after=cfg.capacity_retry_after,
            )
        return server

    def _grant(self, job: _Job, server: _Server, nbytes: int, now: float) -> PutGrant:
        """Reserve ``nbytes`` on ``server`` for the job's next partition (checked by :meth:`_room`)."""
        key = Partition(job.job_id, job.epoch, job.next_group_id)
        job.next_group_id += 1
        token = self._tokens.next()
        expires_at = now + job.config.grant_ttl
        self._groups.add(job, _Group(key, server.server_id, token, nbytes, expires_at))
        heapq.heappush(self._heap, (expires_at, key))
        return PutGrant(key, server.server_id, server.location, token, nbytes, expires_at)

    # ------------------------------------------------------------------ publication
    def publish(
        self,
        partition: Partition | Sequence[Any],
        token: int,
        rows: int,
        nbytes: int,
        tokens: int,
        policy_version: int,
        columns: Iterable[str],
    ) -> GroupInfo:
        """See :meth:`~._ledger.Ledger.publish`."""
        key = check_partition(partition)
        job = self._jobs.job_epoch(key.job_id, key.epoch)
        g = self._granted(key, token)
        sizes = (rows, nbytes, tokens, policy_version)
        _check_sizes(key, sizes)
        cols = check_columns(columns, "columns")  # a repeat is checked too: bad input is never accepted
        if g.state is not ALLOCATED:
            _check_repeat(key, self._published_sizes(key, g), sizes)
            return self._groups.info(g)
        self._check_publication(job, key, g, sizes)
        self._make_published(job, g, sizes, cols, self._groups.columns(cols))
        return self._groups.info(g)

    def publish_many(self, items: Sequence[Publication]) -> list[GroupInfo]:
        """See :meth:`~._ledger.Ledger.publish_many`."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise InvalidRequestError(
                f"items must be a list of Publication records (one per stored group), got "
                f"{type(items).__name__}; call publish for a single group"
            )
        if not items:
            raise InvalidRequestError("items is empty; pass one Publication per stored group (at least one)")
        jobs: dict[tuple[str, int], _Job] = {}
        columns: dict[tuple[str, ...], tuple[frozenset[str], tuple[str, ...]]] = {}
        planned: dict[Partition, _Sizes] = {}  # partitions this call publishes -> their sizes
        apply: list[tuple[_Job, _Group, _Sizes, frozenset[str], tuple[str, ...]]] = []
        groups: list[_Group] = []
        for i, item in enumerate(items):
            if not isinstance(item, Publication):
                raise InvalidRequestError(
                    f"items[{i}] must be a Publication, got {type(item).__name__}; build one per stored group"
                )
            key = check_partition(item.partition)
            job = jobs.get((key.job_id, key.epoch))
            if job is None:
                job = jobs[key.job_id, key.epoch] = self._jobs.job_epoch(key.job_id, key.epoch)
            g = self._granted(key, item.token)
            groups.append(g)
            sizes = (item.rows, item.nbytes, item.tokens, item.policy_version)
            _check_sizes(key, sizes)
            # Columns next, a repeat's too (bad input is never accepted), in publish's order of checks.
            cols = columns.get(item.columns) if type(item.columns) is tuple else None
            if cols is None:
                colset = check_columns(item.columns, "columns")
                cols = (colset, self._groups.columns(colset))
                if type(item.columns) is tuple:
                    columns[item.columns] = cols
            prior = planned.get(key)
            if prior is None and g.state is not ALLOCATED:
                prior = self._published_sizes(key, g)
            if prior is not None:
                _check_repeat(key, prior, sizes)
                continue
            self._check_publication(job, key, g, sizes)
            planned[key] = sizes
            apply.append((job, g, sizes, *cols))
        for job, g, sizes, colset, names in apply:
            self._make_published(job, g, sizes, colset, names)
        return [self._groups.info(g) for g in groups]

    # ------------------------------------------------------------------ grant ahead
    def publish_ahead(
        self,
        items: Sequence[Publication],
        job_id: str,
        epoch: int,
        writer_id: str,
        ahead: Sequence[int],
        now: float,
    ) -> Published:
        """See :meth:`~._ledger.Ledger.publish_ahead`."""
        job, _ = self._allocating_writer(job_id, epoch, writer_id)
        if isinstance(ahead, str | bytes) or not isinstance(ahead, Sequence):
            raise InvalidRequestError(
                f"ahead must be a list of group sizes (one int per grant asked for ahead), got "
                f"{type(ahead).__name__}; pass [] to ask for none"
            )
        for i, size in enumerate(ahead):
            check_int(size, f"ahead[{i}]", minimum=1)
        groups = self.publish_many(items)
        grants: list[PutGrant] = []
        cfg = job.config
        # Under strict on-policy, a grant held ahead would let a put skip allocate's check that the
        # writer acknowledged the current policy: none is made ahead there.
        if ahead and not cfg.strict_on_policy and all(size <= cfg.max_group_bytes for size in ahead):
            # No room: no grant, and the writer allocates when it puts.
            with contextlib.suppress(CapacityExceededError):
                grants = self.allocate_many(job_id, epoch, writer_id, ahead, now)
        return Published(tuple(groups), tuple(grants), now)

    def abandon(self, partition: Partition | Sequence[Any], token: int, now: float) -> bool:
        """See :meth:`~._ledger.Ledger.abandon`."""
        key = check_partition(partition)
        g = self._granted(key, token)
        if g.state is not ALLOCATED:
            return False
        self._groups.to_gc(g, DROPPED, now)
        return True

    def _granted(self, key: Partition, token: int) -> _Group:
        """The group of ``key`` if ``token`` is its grant's token; else raise."""
        if type(token) is not int or token < 0 or token > INT64_MAX:
            check_int(token, "token")
        g = self._groups.table.get(key)
        if g is None:
            raise NotFoundError(f"partition {tuple(key)} was never allocated (or is deleted); allocate first")
        if token != g.grant_token:
            raise StaleFenceError(
                f"token {token} is not the put grant of {tuple(key)}; use the grant's token"
            )
        return g

    @staticmethod
    def _published_sizes(key: Partition, g: _Group) -> _Sizes:
        """What a group that is no longer ALLOCATED was published with; raise if its grant expired."""
        if g.state is DROPPED and g.rows == 0:
            raise LeaseExpiredError(
                f"the put grant of {tuple(key)} expired before publish; the partition is being garbage-"
                "collected; allocate a new partition and put again",
            )
        return (g.rows, g.nbytes, g.tokens, g.policy_version)

    @staticmethod
    def _check_publication(job: _Job, key: Partition, g: _Group, sizes: _Sizes) -> None:
        """Check the sizes (checked ints already) of a first publication of the ALLOCATED group ``g``."""
        _, nbytes, _, policy_version = sizes
        if nbytes > g.nbytes:
            raise InvalidRequestError(
                f"published nbytes={nbytes} exceeds the {g.nbytes} bytes reserved for {tuple(key)}; "
                "allocate with nbytes at least the group's size"
            )
        if policy_version > job.policy_version:
            raise InvalidRequestError(
                f"policy_version {policy_version} was never announced for job {key.job_id!r} "
                f"(current {job.policy_version})"
            )

    def _make_published(
        self, job: _Job, g: _Group, sizes: _Sizes, colset: frozenset[str], columns: tuple[str, ...]
    ) -> None:
        """Publish the checked group ``g``: give back its unused reservation, record it, make it READY."""
        rows, nbytes, tokens, policy_version = sizes
        self._groups.give_back(job, g, g.nbytes - nbytes)
        g.nbytes, g.rows, g.tokens, g.policy_version = nbytes, rows, tokens, policy_version
        g.colset, g.columns = colset, columns
        self._groups.make_ready(g, front=False)


def _check_sizes(key: Partition, sizes: _Sizes) -> None:
    """Every size of a publication is an int in int64 range (first publications and repeats alike)."""
    if all(type(v) is int and 0 <= v <= INT64_MAX for v in sizes):
        return
    try:
        for value, what in zip(sizes, ("rows", "nbytes", "tokens", "policy_version"), strict=True):
            check_int(value, what)
    except InvalidRequestError as exc:  # name the group: one of a publish_many's many
        raise InvalidRequestError(f"{exc} (the publication of {tuple(key)})") from None


def _check_repeat(key: Partition, published: _Sizes, sizes: _Sizes) -> None:
    """A publish of a group already published: an idempotent repeat, or refused."""
    if published != sizes:
        raise AlreadyExistsError(f"partition {tuple(key)} is already published; groups are never overwritten")
