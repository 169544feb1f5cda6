"""The ledger: the controller's state machine, a surface over the collaborators of :mod:`._parts`.

Events in, decisions out, time passed in. No method reads a clock, opens a file or a socket, or starts a
thread: every call gets ``now`` (seconds, any monotonic-enough origin) and first applies what time has
done since the last call (lazy expiry of leases, put grants and server back-offs, in the order they fell
due). The ledger never goes back in time: a ``now`` smaller than one already seen is treated as the latest
one seen. Given the same calls with the same arguments, it makes the same decisions, so a host can
journal the calls and replay them.

Each public method checks its arguments, applies expiries and hands the work to the collaborator that owns
the state: jobs and epochs (:mod:`._jobs`), servers and placement (:mod:`._servers`), the group table
(:mod:`._groups`), put grants and publishing (:mod:`._grants`), leases (:mod:`._leases`), deletes, fences
and back-off (:mod:`._upkeep`). Rules that span several of them are functions over :class:`~._parts.Parts`:
opening a job and moving it to a new epoch (:mod:`._epochs`), taking a checkpoint and crash recovery
(:mod:`._recovery`), the metrics' figures and the next deadline (:mod:`._views`); checkpoints and
snapshots are :mod:`._checkpoint`'s format, restores :mod:`._restore`'s rules.

It does not guarantee anything about the storage servers: it tells the host what to delete
(``take_deletes``) and to fence (``take_fences``) and believes what the host reports (``delete_done``,
``fence_done``). It is not thread-safe (hosts serialise calls), does not retry anything by itself and
never replays an UNKNOWN group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import _checkpoint as _ckpt
from . import _epochs, _recovery, _views
from ._entries import PREPARED, TRAINED, TRAINING, check_int, check_name
from ._parts import Parts
from ._records import (
    DeleteWork,
    FenceWork,
    GroupInfo,
    GroupState,
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
    ResolveAction,
    ServerInfo,
)
from ._restore import restore

__all__ = ["Ledger"]


class Ledger:
    """The controller's state machine: sans-IO, deterministic, driven by ``now``.

    Args:
        incarnation: Fencing tokens start at ``incarnation << 32``; hosts pass a value larger than any
            previous run's (they persist it) so that tokens keep increasing across restarts.
    """

    __slots__ = ("_grants", "_groups", "_jobs", "_leases", "_now", "_parts", "_servers", "_tokens", "_upkeep")

    def __init__(self, *, incarnation: int = 0) -> None:
        self._now = float("-inf")
        self._parts = parts = Parts.create(check_int(incarnation, "incarnation"))
        self._tokens = parts.tokens
        self._servers = parts.servers
        self._jobs = parts.jobs
        self._groups = parts.groups
        self._upkeep = parts.upkeep
        self._grants = parts.grants
        self._leases = parts.leases

    @property
    def incarnation(self) -> int:
        """The incarnation folded into the tokens issued now."""
        return self._tokens.incarnation

    @property
    def last_token(self) -> int:
        """The newest fencing token issued (0 before any)."""
        return self._tokens.last

    @property
    def parks(self) -> int:
        """Groups parked so far on storage servers in back-off (a host journals a call that parked)."""
        return self._upkeep.reach.parks

    @property
    def ready_version(self) -> int:
        """Incremented whenever a group becomes READY: hosts wake long-polling acquirers on a change."""
        return self._groups.ready_version

    @property
    def capacity_version(self) -> int:
        """Incremented whenever capacity may have come back (a delete confirmed, a reservation given back,
        a server registered or resized, a job's epoch or restore): hosts wake writers waiting for it."""
        return self._groups.capacity_version

    def _advance(self, now: float) -> float:
        if now > self._now:
            self._now = float(now)
        now = self._now
        self._leases.expire(now)
        self._grants.expire(now)
        return now

    # ------------------------------------------------------------------ storage servers
    def register_server(
        self,
        server_id: str,
        *,
        node: str,
        location: str,
        capacity_bytes: int,
        capacity_groups: int,
        now: float,
    ) -> ServerInfo:
        """Register (or update) a storage server that groups can be placed on.

        Re-registering an id updates its node, location and capacities and keeps what is reserved on it;
        it also counts as reaching the server: a back-off after unanswered calls ends at once.

        Raises:
            InvalidRequestError: an empty name or a negative capacity.
        """
        self._advance(now)
        check_name(server_id, "server_id")
        check_name(node, "node")
        check_name(location, "location")
        check_int(capacity_bytes, "capacity_bytes")
        check_int(capacity_groups, "capacity_groups")
        server, known = self._servers.register(server_id, node, location, capacity_bytes, capacity_groups)
        self._groups.capacity_changed()
        if known:
            self._groups.unpark(self._upkeep.reach.reached(server_id))
        return server.info()

    def servers(self) -> tuple[ServerInfo, ...]:
        """Every registered storage server with its reservations, sorted by id."""
        return self._servers.infos()

    # ------------------------------------------------------------------ jobs, writers, policy versions
    def open_job(
        self,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None = None,
        *,
        now: float,
        old_ready: OldReady | str = OldReady.REOFFER,
    ) -> JobConfig:
        """Open ``job_id`` at ``epoch`` (idempotent for the same epoch and configuration).

        A larger epoch fences every older one: its put grants are abandoned (garbage-collected), its live
        leases end (LEASED/PREPARED groups to READY, TRAINING/TRAINED to UNKNOWN), its writers must
        register again, and its READY groups are re-offered or dropped as ``old_ready`` says.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: a setting is invalid (named), or the epoch is already open with another setting.
            StaleFenceError: ``epoch`` is smaller than one already opened for the job.
        """
        return _epochs.open_job(self._parts, job_id, epoch, config, old_ready, self._advance(now))

    def register_writer(
        self,
        job_id: str,
        epoch: int,
        writer_id: str,
        *,
        node: str,
        now: float,
        policy_version: int | None = None,
    ) -> PolicyStatus:
        """Register a rollout worker of the job's current epoch (idempotent; updates its node).

        Args:
            policy_version: The weights version the writer has loaded; default the job's current one.

        Raises:
            StaleFenceError: ``epoch`` is older than the job's current epoch.
            NotFoundError: the job or epoch is not open.
        """
        self._advance(now)
        return self._jobs.register_writer(job_id, epoch, writer_id, node, policy_version)

    def announce_policy(self, job_id: str, version: int, *, now: float) -> PolicyStatus:
        """The trainer announces new weights ``version`` (larger than the current one; idempotent if equal).

        Raises:
            InvalidRequestError: ``version`` is smaller than the current one.
        """
        self._advance(now)
        return self._jobs.announce_policy(job_id, version)

    def ack_policy(
        self, job_id: str, epoch: int, writer_id: str, version: int, *, now: float
    ) -> PolicyStatus:
        """A registered writer acknowledges that it generates with ``version`` from now on.

        Raises:
            NotFoundError: the writer is not registered for this epoch.
            InvalidRequestError: ``version`` was never announced.
        """
        self._advance(now)
        status = self._jobs.ack_policy(job_id, epoch, writer_id, version)
        self._groups.changed()  # a hold may have lifted
        return status

    def policy_status(self, job_id: str) -> PolicyStatus:
        """The current policy version of the job and which writers acknowledged it."""
        return self._jobs.policy_status(job_id)

    # ------------------------------------------------------------------ partitions
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
        return self._grants.allocate(job_id, epoch, writer_id, nbytes, self._advance(now))

    def allocate_many(
        self, job_id: str, epoch: int, writer_id: str, *, nbytes: Sequence[int], now: float
    ) -> list[PutGrant]:
        """Give a writer the next partitions of the job, one per group size in ``nbytes``, in order.

        Where the job's capacity holds the whole batch and one server has room for all of it, every
        group goes to that server (the one :meth:`allocate`'s placement picks for the batch's total bytes
        and groups; off the writer's node only where the first group alone would be placed off it too),
        so that a lease of the batch in order reads one slice of one segment. Otherwise the grants are
        exactly those of calling :meth:`allocate` once per size, in order, at the same ``now``, stopping
        at the first refusal for capacity. Either way the partitions, tokens and expiries are those of
        the calls of :meth:`allocate`. When capacity runs out after ``k`` grants it returns those ``k``
        (a prefix: a later, smaller group is never granted ahead of one that did not fit, so partitions
        keep the order of the groups); ask again for the rest later. Every grant is whole; nothing is
        reserved for the groups not granted. Every size is checked before anything is granted, so a
        refused call changes nothing.

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
        return self._grants.allocate_many(job_id, epoch, writer_id, nbytes, self._advance(now))

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
            NotFoundError: the job/epoch is not open, or the partition was never allocated (or is deleted).
            LeaseExpiredError: the grant expired; the partition is being garbage-collected.
            AlreadyExistsError: the partition was already published (with other values).
            InvalidRequestError: ``nbytes`` exceeds the reservation, or a value is invalid.
        """
        self._advance(now)
        return self._grants.publish(partition, token, rows, nbytes, tokens, policy_version, columns)

    def publish_many(self, items: Sequence[Publication], *, now: float) -> list[GroupInfo]:
        """Make several stored groups READY in one operation: :meth:`publish` for each item, in order.

        Each item is checked exactly as :meth:`publish` checks it (the same errors, with the same
        messages), an item repeating a publication already made (by an earlier call or an earlier item
        of this one) returns the group as it is, and the groups become READY in the order of ``items``
        with their unused reservations given back, as repeated :meth:`publish` calls at the same ``now``
        would leave them. All or nothing: every item is checked before any is applied, so when one is
        refused the call raises what :meth:`publish` would have raised for it and publishes none of the
        items (not even those before it); a refused call changes nothing but lazy expiry, and repeating
        a successful call returns the same answer.

        Args:
            items: One :class:`~trajflight.controller.Publication` per stored group (a non-empty list);
                they may belong to several jobs.

        Returns:
            One :class:`~trajflight.controller.GroupInfo` per item, in the order of ``items``.

        Raises:
            InvalidRequestError: ``items`` is empty or not a list, an item is not a ``Publication``
                (the message names its index), or as :meth:`publish` refuses an item.
            StaleFenceError, NotFoundError, LeaseExpiredError, AlreadyExistsError: as :meth:`publish`
                refuses the first item it refuses; nothing was published.
        """
        self._advance(now)
        return self._grants.publish_many(items)

    def publish_ahead(
        self,
        items: Sequence[Publication],
        *,
        job_id: str,
        epoch: int,
        writer_id: str,
        ahead: Sequence[int] = (),
        now: float,
    ) -> Published:
        """:meth:`publish_many` of ``items``, then :meth:`allocate_many` of ``ahead`` for the writer, in one
        operation: a writer's put gets its next grants with the publication of its last (grant ahead).

        The publication is exactly :meth:`publish_many`'s (the same checks, all or nothing). The grants
        are exactly those :meth:`allocate_many` would make at the same ``now`` right after it, charged
        and expiring like any grant (an unpublished grant expires after ``grant_ttl`` and its partition
        is garbage-collected; a new epoch drops it), with one difference: asking ahead never makes the
        call fail. Where the grants do not fit (capacity, a size over ``max_group_bytes``) the answer
        has none and the writer allocates when it puts. A job with ``strict_on_policy`` gets none ahead
        either: a held grant would let a put skip :meth:`allocate`'s check that the writer acknowledged
        the current policy version. A repeat of a
        successful call publishes nothing new but grants again: a holder gives back grants it will not
        use with :meth:`abandon`.

        Args:
            items: The stored groups to publish, as for :meth:`publish_many`.
            job_id, epoch, writer_id: The registered writer the grants are for.
            ahead: Bytes to reserve for each grant asked for ahead (``[]``: none).

        Returns:
            The published groups, in the order of ``items``; the grants made, a prefix of ``ahead``.

        Raises:
            StaleFenceError: ``epoch`` is fenced; nothing was published.
            NotFoundError: the writer is not registered for the job's epoch; nothing was published.
            InvalidRequestError: ``ahead`` is not a list of positive ints, or as :meth:`publish_many`.
            LeaseExpiredError, AlreadyExistsError: as :meth:`publish_many`; nothing was published.
        """
        return self._grants.publish_ahead(items, job_id, epoch, writer_id, ahead, self._advance(now))

    def abandon(self, partition: Partition | Sequence[Any], *, token: int, now: float) -> bool:
        """Give up an unpublished grant before it expires: its partition is dropped and garbage-collected
        at once, as when it expires, and its reservation is refunded when the delete is confirmed.

        Returns:
            Whether the grant was abandoned now; ``False`` for a group already published or dropped
            (nothing to give back: repeating the call is harmless).

        Raises:
            NotFoundError: the partition was never allocated (or is deleted).
            StaleFenceError: ``token`` is not the partition's grant token.
            InvalidRequestError: a malformed partition or token.
        """
        return self._grants.abandon(partition, token, self._advance(now))

    def group(self, partition: Partition | Sequence[Any]) -> GroupInfo:
        """What the ledger knows of one group.

        Raises:
            NotFoundError: never allocated, or deleted.
        """
        return self._groups.group(partition)

    # ------------------------------------------------------------------ leases
    def acquire(
        self,
        job_id: str,
        owner: str,
        *,
        max_groups: int,
        now: float,
        ttl: float | None = None,
        max_tokens: int | None = None,
        max_staleness: int | None = None,
        require: Iterable[str] = (),
        lack: Iterable[str] = (),
    ) -> Lease | None:
        """Lease up to ``max_groups`` READY groups of the job under one new fencing token.

        Cost is proportional to the groups taken (plus the number of distinct policy versions and column
        sets), not to the number of READY groups. Groups on a storage server in back-off (see
        :meth:`report_unusable`) are not leased: they wait, out of the READY index, until it ends.

        Args:
            job_id: The job.
            owner: Who leases (free text for operators).
            max_groups: Most groups to lease, at most the job's ``max_groups_per_lease``.
            now: Ledger time.
            ttl: Seconds until the lease expires unless renewed; default the job's ``default_lease_ttl``.
            max_tokens: Token budget: stop before the total token count would exceed it (a single group
                larger than the budget is leased alone).
            max_staleness: Only groups with policy version >= current - ``max_staleness``; the tighter of
                this and the job's ``max_staleness`` applies.
            require: Only groups that carry all these columns (a pipeline stage's inputs).
            lack: Only groups that carry none of these columns (a stage's outputs, not yet written).

        Returns:
            The lease, or ``None`` when no eligible group is READY (or strict on-policy mode holds the
            round until every registered writer acknowledged the announced version).

        Raises:
            NotFoundError: the job is not open.
            InvalidRequestError: a limit is out of range.
        """
        now = self._advance(now)
        return self._leases.acquire(
            job_id, owner, max_groups, now, ttl, max_tokens, max_staleness, require, lack
        )

    def renew(self, token: int, *, now: float, ttl: float | None = None) -> float:
        """Extend the lease (all its groups) to ``now + ttl``; return the new expiry.

        Raises:
            LeaseExpiredError: the lease already expired (its groups moved on; do not commit them).
            StaleFenceError: the token is older than the groups' generation, or its epoch is fenced.
            InvalidStateError: the lease is finished.
        """
        return self._leases.renew(token, self._advance(now), ttl)

    def prepare(
        self, token: int, batch_id: str, *, now: float, partitions: Sequence[Partition] | None = None
    ) -> tuple[Partition, ...]:
        """Gather LEASED groups of the lease into batch ``batch_id`` (LEASED -> PREPARED).

        Args:
            token: The lease's token.
            batch_id: A name for the batch, unique within the lease.
            now: Ledger time.
            partitions: The groups; default every group of the lease still LEASED.

        Returns:
            The batch's partitions (the same on an identical repeat).

        Raises:
            LeaseExpiredError, StaleFenceError: the lease is gone (see :meth:`renew`).
            InvalidStateError: a group is not LEASED under this lease, the batch exists with other
                groups, or no group is left to prepare.
        """
        self._advance(now)
        return self._leases.prepare(token, batch_id, partitions)

    def start_training(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """PREPARED -> TRAINING for the batch. From here an expiry sends its groups to UNKNOWN.

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not PREPARED.
            LeaseExpiredError, StaleFenceError: the lease is gone.
        """
        self._advance(now)
        return self._leases.step(token, batch_id, PREPARED, TRAINING)

    def finish_training(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """TRAINING -> TRAINED for the batch (the optimizer step is done, not yet recorded as committed).

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not TRAINING.
            LeaseExpiredError, StaleFenceError: the lease is gone.
        """
        self._advance(now)
        return self._leases.step(token, batch_id, TRAINING, TRAINED)

    def commit(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """TRAINED -> COMMITTED for the batch: each group is trained once, for good, and put on the GC list,
        or, once the job has taken a checkpoint, kept (stored, holding capacity) until a later checkpoint
        is confirmed durable (:meth:`confirm_checkpoint`).

        The lease ends when none of its groups is left LEASED..TRAINED.

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not TRAINED.
            LeaseExpiredError, StaleFenceError: the lease is gone (its groups went to UNKNOWN; an
                operator decides).
        """
        return self._leases.commit(token, batch_id, self._advance(now))

    def release(
        self,
        token: int,
        *,
        now: float,
        partitions: Sequence[Partition] | None = None,
        columns: Iterable[str] = (),
    ) -> tuple[Partition, ...]:
        """Give LEASED or PREPARED groups back to READY, recording ``columns`` as appended to them.

        Enrichment stages (reference logprobs, rewards, advantages) lease groups lacking their output,
        append it through the storage server, then release with ``columns`` naming what they wrote. A
        trainer that gives up releases without columns. Prepared groups leave their batch.

        Args:
            token: The lease's token.
            now: Ledger time.
            partitions: The groups; default every LEASED or PREPARED group of the lease.
            columns: Columns appended to these groups.

        Returns:
            The partitions released (the same on an identical repeat).

        Raises:
            InvalidStateError: a group is TRAINING or TRAINED (finish and commit it, or let the lease
                expire), or is not in this lease.
            AlreadyExistsError: a group already carries one of ``columns`` (each column is written once);
                nothing is released.
            LeaseExpiredError, StaleFenceError: the lease is gone.
        """
        self._advance(now)
        return self._leases.release(token, partitions, columns)

    def report_unusable(
        self,
        token: int,
        *,
        now: float,
        missing: Sequence[Partition] = (),
        unreachable: Sequence[str] = (),
    ) -> tuple[Partition, ...]:
        """A trainer could not open some groups of its lease on their storage servers: take them out.

        Args:
            token: The lease's token.
            now: Ledger time.
            missing: LEASED/PREPARED groups of the lease whose server answered that it does not hold
                them. Each leaves the lease, is recorded lost (``"missing on server <id>"``, see
                ``Ledger.lost``) and goes to the GC list as DROPPED, so that its capacity comes back;
                it is never offered again.
            unreachable: Storage servers that did not answer (dead or stopped). Each goes into back-off
                (the job's ``server_retry_initial``, doubling per report up to ``server_retry_max``;
                a report during a back-off changes nothing): ``acquire`` leases none of its groups until
                the back-off ends, the server registers again or a delete on it is confirmed. The
                lease's LEASED/PREPARED groups on it go back to READY.

        The lease ends when nothing is left in it. Checks everything before changing anything; a
        repeat changes nothing more.

        Returns:
            The partitions that left the lease, in lease order.

        Raises:
            LeaseExpiredError, StaleFenceError: the lease is gone (its groups moved on).
            NotFoundError: a server is not registered, or a group is not part of the lease.
            InvalidStateError: a missing group is not LEASED/PREPARED under this lease.
        """
        return self._leases.report_unusable(token, self._advance(now), missing, unreachable)

    def resolve(
        self, job_id: str, partitions: Sequence[Partition], action: ResolveAction | str, *, now: float
    ) -> tuple[Partition, ...]:
        """Operator decision for UNKNOWN groups: ``requeue`` (READY again, new token on the next acquire)
        or ``drop`` (deleted, never trained). All-or-nothing; a repeat of an applied drop is a no-op.

        Raises:
            InvalidRequestError: unknown action. NotFoundError: a group is not in the job.
            InvalidStateError: a group is not UNKNOWN (nothing is changed).
        """
        return self._groups.resolve(job_id, partitions, action, self._advance(now))

    # ------------------------------------------------------------------ sweeping: deletes and fences
    def tick(self, now: float) -> None:
        """Apply expiries due at ``now`` (hosts call it from their sweeper; every other call does too)."""
        self._advance(now)

    def next_deadline(self) -> float | None:
        """The earliest time at which something may expire, a delete fall due or a storage server's
        back-off end (``None``: nothing)."""
        return _views.next_deadline(self._parts)

    def take_deletes(self, *, now: float, limit: int = 256) -> list[DeleteWork]:
        """Hand out up to ``limit`` due deletes; each must be reported with :meth:`delete_done`.

        An unreported delete is handed out again after the job's ``delete_timeout``.
        """
        return self._upkeep.take_deletes(self._advance(now), limit)

    def delete_done(
        self, partition: Partition | Sequence[Any], *, ok: bool, now: float, error: str | None = None
    ) -> bool:
        """Report a delete's outcome. On success the group is forgotten and its capacity released.

        Returns:
            True when this report released the group; False for a failure (retried later) or a late
            duplicate report.
        """
        return self._upkeep.delete_done(partition, ok, self._advance(now), error)

    def take_fences(self, *, now: float, limit: int = 256) -> list[FenceWork]:
        """Hand out up to ``limit`` due fences; each must be reported with :meth:`fence_done`.

        A fence of a group the ledger has since forgotten (deleted) is dropped, not handed out. An
        unreported fence is handed out again after a timeout.
        """
        return self._upkeep.take_fences(self._advance(now), limit)

    def fence_done(
        self,
        partition: Partition | Any,
        *,
        generation: int,
        ok: bool,
        now: float,
        error: str | None = None,
    ) -> bool:
        """Report a fence's outcome. Returns True when it confirmed the group's pending fence; False for a
        failure (retried with back-off), a fence of an older generation, or a late duplicate."""
        return self._upkeep.fence_done(partition, generation, ok, self._advance(now), error)

    # ------------------------------------------------------------------ queries
    @property
    def job_ids(self) -> tuple[str, ...]:
        """The ids of every job opened (or restored) on this ledger (a property, not an operation: the
        host's timeline reads it, no client asks for it)."""
        return tuple(self._jobs.ids())

    def counts(self, job_id: str) -> dict[str, int]:
        """Groups per state for the job (every state present), plus ``deleted`` (confirmed deletes),
        ``committed_total`` (commits ever, deleted or not), ``kept`` (COMMITTED groups kept for a restore
        until a later checkpoint is durable: they hold capacity), ``lost`` (groups that can never be
        offered again, see :meth:`lost`) and ``purged`` (groups restores deleted because their checkpoint
        did not know them)."""
        return self._jobs.counts(job_id)

    def figures(self) -> dict[str, Any]:
        """What the metrics export (``trajflight.controller._metrics``), in one read.

        Returns:
            ``{"jobs": {job_id: {"counts": counts(job), "usage": (bytes, groups), "capacity":
            (capacity_bytes | None, capacity_groups | None), "gc": groups waiting for a confirmed delete,
            "leases": live leases}}, "servers": [ServerInfo], "fences": fences waiting, "lease_ends":
            {reason: leases ended since this ledger was made or loaded}}`` (reasons ``done``, ``expired``,
            ``fenced``, ``restart``).
        """
        return _views.figures(self._parts)

    def lost(self, job_id: str) -> tuple[LostGroup, ...]:
        """Every group of the job that can never be offered again although it was not trained, with why
        (oldest first; carried in checkpoints and snapshots)."""
        return self._jobs.lost(job_id)

    def usage(self, job_id: str) -> tuple[int, int]:
        """``(bytes, groups)`` the job holds: reserved or stored, not yet confirmed deleted."""
        return self._jobs.usage(job_id)

    def lease_groups(self, token: int) -> tuple[GroupInfo, ...]:
        """Current information on every group a lease was granted (deleted ones omitted)."""
        return self._leases.lease_groups(token)

    def lease_job(self, token: int) -> str:
        """The job of the lease ``token`` (live or ended): what an authenticating host checks a trainer's
        job scope against. Raises like any lease call on an unknown or forgotten token."""
        return self._leases.lookup(token).job_id

    def live_leases(self, job_id: str | None = None) -> tuple[int, ...]:
        """Tokens of the live leases (of one job, or all)."""
        return self._leases.live_tokens(job_id)

    def gc_list(self, job_id: str | None = None) -> tuple[DeleteWork, ...]:
        """What waits for a confirmed delete (of one job, or all), with attempts and last errors."""
        return self._upkeep.gc_list(job_id)

    def fence_list(self) -> tuple[FenceWork, ...]:
        """The fences that wait for a confirmation, with attempts and last errors (operators, tests)."""
        return tuple(self._upkeep.fences)

    def groups_in(self, job_id: str, state: GroupState | str) -> tuple[GroupInfo, ...]:
        """Every group of the job in ``state`` (O(groups of the job); for operators and tests)."""
        return self._groups.groups_in(job_id, state)

    def is_quiescent(self, job_id: str) -> bool:
        """True when no group of the job is LEASED..TRAINED (a checkpoint may be taken)."""
        return self._jobs.live_groups(job_id) == 0

    # ------------------------------------------------------------------ checkpoints and recovery
    def checkpoint(self, job_id: str, *, now: float) -> bytes:
        """The job's quiescent cursor and state, framed with format version, checksum and the job's next
        checkpoint sequence number (:func:`~._checkpoint.checkpoint_seq` reads it).

        From the first checkpoint on, committed groups are kept (stored, counted against capacity) until
        a later checkpoint is confirmed durable: write the bytes (atomically, with
        :func:`~trajflight.controller.write_checkpoint`), then call :meth:`confirm_checkpoint`. A restore
        from this checkpoint deletes the commits it covers and offers again the groups it has READY.

        Raises:
            NotFoundError: the job is not open.
            InvalidStateError: a group of the job is LEASED..TRAINED; checkpoint between steps.
        """
        return _recovery.take_checkpoint(self._parts, job_id, self._advance(now))

    def confirm_checkpoint(self, job_id: str, seq: int, *, now: float) -> int:
        """Checkpoint ``seq`` of the job is durable: the commits it covers (made before it was taken) go
        to the GC list. Idempotent; confirming an older checkpoint than one confirmed changes nothing.

        Returns:
            The number of kept commits this confirmation released for deletion.

        Raises:
            NotFoundError: the job is not open.
            InvalidRequestError: ``seq`` is not the sequence number of a checkpoint taken of the job.
        """
        return self._jobs.confirm_checkpoint(job_id, seq, self._advance(now))

    def restore(
        self,
        data: bytes,
        *,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None,
        now: float,
        old_ready: OldReady | str = OldReady.REOFFER,
        available: Sequence[Partition | HeldGroup] | None = None,
        min_token: int = 0,
    ) -> dict[str, int]:
        """Restart ``job_id`` from a job checkpoint under a larger ``epoch``.

        What the storage servers hold decides, deterministically (see :mod:`._restore`): a group READY at
        the checkpoint is offered again (same partition, new tokens on the next acquire) when a server
        holds it; committed data is kept until a later checkpoint covers the commit, so this includes
        the groups the rolled-back incarnation committed after the checkpoint. A group READY or UNKNOWN at
        the checkpoint that no server holds is recorded lost (see :meth:`lost`). Groups the servers hold
        that the checkpoint does not know (acknowledged after it, or granted and never published) are
        purged: deleted through the GC list and counted (``purged``). ``old_ready="drop"`` drops every
        READY group instead; unpublished grants are abandoned; UNKNOWN groups stay UNKNOWN; the GC list
        and the lost record carry over. Tokens issued afterwards are larger than every token issued
        before the checkpoint. Commits of the restored job are kept until a later checkpoint of it is
        confirmed durable.

        Args:
            available: What the storage servers hold for the job: :class:`HeldGroup` listings (partition,
                server, bytes; needed to purge) or bare partitions (presence only). ``None`` trusts the
                checkpoint: nothing is found lost, nothing purged.
            min_token: The highest generation the storage servers saw for the job (their ``stats``):
                tokens issued afterwards are larger than it too. The rolled-back incarnation may have
                issued tokens above the checkpoint's (after a crash recovery of its own), and servers
                refuse a lease or delete under a token below one they saw.

        Returns:
            The job's counts after the restore (see :meth:`counts`).

        Raises:
            CheckpointError: the data is corrupt, truncated, of another format or of another job.
            ConfigError: ``config`` differs from the checkpoint's (the setting is named).
            StaleFenceError: ``epoch`` is not larger than the checkpoint's epoch, or than the epoch of a
                group the servers hold.
            AlreadyExistsError: this ledger already has the job open.
            InvalidRequestError: ``available`` lists a group of another job or on an unknown server.
        """
        restore(
            self._parts,
            data,
            job_id=job_id,
            epoch=epoch,
            config=config,
            now=self._advance(now),
            old_ready=old_ready,
            available=available,
            min_token=min_token,
        )
        return self.counts(job_id)

    def snapshot(self) -> bytes:
        """The whole ledger, live leases included, for a host's crash recovery (not a job checkpoint)."""
        return _ckpt.export_snapshot(self._parts, self._now)

    @classmethod
    def from_snapshot(cls, data: bytes, *, source: str = "snapshot") -> Ledger:
        """A ledger exactly as :meth:`snapshot` saw it.

        Raises:
            CheckpointError: the snapshot is corrupt, truncated or of another format.
        """
        ledger = cls()
        ledger._now = _ckpt.import_snapshot(ledger._parts, data, source=source)
        return ledger

    def recover(self, incarnation: int, *, now: float) -> int:
        """After a host crash: start a new incarnation and end every live lease.

        LEASED/PREPARED groups go back to READY; TRAINING/TRAINED groups become UNKNOWN (training may
        have happened; an operator decides). Tokens issued from now on are ``>= incarnation << 32``.

        Returns:
            The number of leases ended.

        Raises:
            InvalidRequestError: ``incarnation`` is not larger than the current one.
        """
        return _recovery.recover(self._parts, incarnation, self._advance(now))
