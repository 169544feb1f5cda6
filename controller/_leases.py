"""The lease state machine on top of :class:`~._partitions.PartitionLedger`: acquire, the forward steps,
release, and the operator's resolve.

Per group: ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED``, plus ``UNKNOWN``.
``acquire`` leases READY groups under one fencing token; ``prepare`` gathers some LEASED groups of the
lease into a named batch; ``start_training``, ``finish_training`` and ``commit`` move a whole batch one
step. Each step is a compare-and-set on the token and the batch's prior state and returns the same answer
when repeated identically. ``release`` gives LEASED/PREPARED groups back to READY (enrichment stages record
the columns they appended). Expiry (lazy, on every call) sends LEASED/PREPARED groups to READY and
TRAINING/TRAINED groups to UNKNOWN, where only an operator's ``resolve`` moves them.

It does not retry anything by itself and never replays an UNKNOWN group.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from trajflight.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    StaleFenceError,
    brief,
)

from ._entries import (
    COMMITTED,
    DROPPED,
    LEASED,
    PREPARED,
    READY,
    TRAINED,
    TRAINING,
    UNKNOWN,
    _Group,
    _Lease,
    check_columns,
    check_int,
    check_name,
    check_names,
    check_partitions,
)
from ._partitions import PartitionLedger
from ._records import (
    GroupState,
    Lease,
    Partition,
    ResolveAction,
)

__all__ = ["LeaseMachine"]


class LeaseMachine(PartitionLedger):
    """Leases, batches, release and resolve; :class:`~._ledger.Ledger` adds GC, queries and checkpoints."""

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
        job = self._job(job_id)
        cfg = job.config
        check_name(owner, "owner")
        check_int(max_groups, "max_groups", minimum=1)
        if max_groups > cfg.max_groups_per_lease:
            raise InvalidRequestError(
                f"max_groups={max_groups} exceeds max_groups_per_lease={cfg.max_groups_per_lease}; "
                "ask for fewer"
            )
        ttl = self._ttl(ttl, cfg.default_lease_ttl, cfg.max_lease_ttl)
        if max_tokens is not None:
            check_int(max_tokens, "max_tokens", minimum=1)
        staleness = cfg.max_staleness
        if max_staleness is not None:
            check_int(max_staleness, "max_staleness")
            staleness = max_staleness if staleness is None else min(staleness, max_staleness)
        require_set = check_columns(require, "require")
        lack_set = check_columns(lack, "lack")
        exact = None
        if cfg.strict_on_policy:
            if job.pending_writers():
                return None
            exact = job.policy_version
        groups = self._groups
        reach = self._reach

        def parked(key: Partition) -> bool:  # a group of a server in back-off waits for it
            g = groups[key]
            if reach.unreachable(g.server_id):
                reach.park(g.server_id, key, g.ready_seq)
                return True
            return False

        keys = job.ready.take(
            max_groups,
            min_version=None if staleness is None else job.policy_version - staleness,
            exact_version=exact,
            require=require_set,
            lack=lack_set,
            max_tokens=max_tokens,
            tokens_of=lambda key: groups[key].tokens,
            skip=parked if reach else None,
        )
        if not keys:
            return None
        token = self._next_token()
        lease = _Lease(token, job_id, owner, ttl, now + ttl)
        counts = job.counts
        infos = []
        for key in keys:
            g = groups[key]
            g.state = LEASED
            g.generation = token
            g.lease = token
            lease.live[key] = None
            infos.append(self._info(g))
        counts[READY] -= len(keys)
        counts[LEASED] += len(keys)
        lease.keys = keys
        self._leases[token] = lease
        heapq.heappush(self._lease_heap, (lease.expires_at, token))
        return Lease(token, job_id, owner, lease.expires_at, tuple(infos))

    @staticmethod
    def _ttl(ttl: float | None, default: float, maximum: float) -> float:
        if ttl is None:
            return default
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= maximum:
            raise InvalidRequestError(
                f"ttl must be a number of seconds in (0, {maximum}] (max_lease_ttl), got {brief(ttl)}"
            )
        return float(ttl)

    def renew(self, token: int, *, now: float, ttl: float | None = None) -> float:
        """Extend the lease (all its groups) to ``now + ttl``; return the new expiry.

        Raises:
            LeaseExpiredError: the lease already expired (its groups moved on; do not commit them).
            StaleFenceError: the token is older than the groups' generation, or its epoch is fenced.
            InvalidStateError: the lease is finished.
        """
        now = self._advance(now)
        lease = self._live_lease(token)
        cfg = self._jobs[lease.job_id].config
        lease.ttl = self._ttl(ttl, lease.ttl, cfg.max_lease_ttl)
        lease.expires_at = now + lease.ttl
        heapq.heappush(self._lease_heap, (lease.expires_at, token))
        return lease.expires_at

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
        lease = self._lease(token)
        check_name(batch_id, "batch_id")
        existing = lease.batches.get(batch_id)
        if existing is not None:
            if lease.stage[batch_id] is PREPARED and (
                partitions is None or set(check_partitions(partitions)) == set(existing)
            ):
                if lease.ended is not None:
                    raise self._ended_error(lease)
                return existing
            raise InvalidStateError(
                f"batch {batch_id!r} of lease {token} already exists ({lease.stage[batch_id]}) with other "
                "groups or further on; use a new batch id",
            )
        if lease.ended is not None:
            raise self._ended_error(lease)
        if partitions is None:
            keys = tuple(k for k in lease.live if self._groups[k].state is LEASED)
            if not keys:
                raise InvalidStateError(f"lease {token} has no LEASED group left to prepare")
        else:
            keys = check_partitions(partitions)
            if not keys:
                raise InvalidRequestError("partitions must name at least one group (or be None for all)")
            for key in keys:
                self._check_member(lease, key, (LEASED,))
        for key in keys:
            g = self._groups[key]
            g.state = PREPARED
            g.batch_id = batch_id
        counts = self._jobs[lease.job_id].counts
        counts[LEASED] -= len(keys)
        counts[PREPARED] += len(keys)
        lease.batches[batch_id] = keys
        lease.stage[batch_id] = PREPARED
        return keys

    def _check_member(self, lease: _Lease, key: Partition, states: tuple[GroupState, ...]) -> _Group:
        g = self._groups.get(key)
        # Tokens are unique per lease and only grow: a generation below the token means the group was
        # never granted to this lease; above it, the group was granted again since (O(1), no scan).
        if g is None or g.generation < lease.token or g.key.job_id != lease.job_id:
            raise NotFoundError(f"group {tuple(key)} is not part of lease {lease.token}")
        if g.generation != lease.token:
            raise StaleFenceError(
                f"group {tuple(key)} has a newer generation {g.generation} than lease {lease.token} (the "
                "lease ended, or the group was leased again); stop working on it",
                token=lease.token,
            )
        if key not in lease.live or g.state not in states:
            raise InvalidStateError(
                f"group {tuple(key)} is {g.state.value}, expected {'/'.join(s.value for s in states)} under "
                f"lease {lease.token}",
            )
        return g

    def _step(
        self, token: int, batch_id: str, prior: GroupState, target: GroupState, now: float
    ) -> tuple[Partition, ...]:
        self._advance(now)
        lease = self._lease(token)
        keys = lease.batches.get(check_name(batch_id, "batch_id"))
        if keys is None:
            if lease.ended is not None:
                raise self._ended_error(lease)
            raise NotFoundError(f"lease {token} has no batch {batch_id!r}; call prepare first")
        stage = lease.stage[batch_id]
        if stage is target:
            return keys  # an identical repeat
        if lease.ended is not None:
            raise self._ended_error(lease)
        if stage is not prior:
            raise InvalidStateError(
                f"batch {batch_id!r} of lease {token} is {stage.value}; this step needs {prior.value}",
                token=token,
            )
        groups = self._groups
        for key in keys:
            groups[key].state = target
        counts = self._jobs[lease.job_id].counts
        counts[prior] -= len(keys)
        counts[target] += len(keys)
        lease.stage[batch_id] = target
        return keys

    def start_training(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """PREPARED -> TRAINING for the batch. From here an expiry sends its groups to UNKNOWN.

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not PREPARED.
            LeaseExpiredError, StaleFenceError: the lease is gone.
        """
        return self._step(token, batch_id, PREPARED, TRAINING, now)

    def finish_training(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """TRAINING -> TRAINED for the batch (the optimizer step is done, not yet recorded as committed).

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not TRAINING.
            LeaseExpiredError, StaleFenceError: the lease is gone.
        """
        return self._step(token, batch_id, TRAINING, TRAINED, now)

    def commit(self, token: int, batch_id: str, *, now: float) -> tuple[Partition, ...]:
        """TRAINED -> COMMITTED for the batch: each group is trained once, for good, and put on the GC list,
        or, once the job has taken a checkpoint, kept (stored, holding capacity) until a later checkpoint
        is confirmed durable (:meth:`~._ledger.Ledger.confirm_checkpoint`).

        The lease ends when none of its groups is left LEASED..TRAINED.

        Raises:
            NotFoundError: no such batch. InvalidStateError: the batch is not TRAINED.
            LeaseExpiredError, StaleFenceError: the lease is gone (its groups went to UNKNOWN; an
                operator decides).
        """
        lease = self._leases.get(token)
        keys = self._step(token, batch_id, TRAINED, COMMITTED, now)
        if lease is not None and lease.ended is None and keys[0] in lease.live:
            job = self._jobs[lease.job_id]
            job.committed += len(keys)
            for key in keys:
                del lease.live[key]
                self._groups[key].lease = None
                if job.checkpoints:  # a restore from the newest checkpoint must find it again
                    job.kept[key] = job.checkpoints
                else:
                    job.gc.add(key, self._now)
            if not lease.live:
                self._retire(lease, "done")
        return keys

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
        lease = self._lease(token)
        added = check_columns(columns, "columns")
        if partitions is None:
            if lease.ended is not None and lease.ended != "done":
                raise self._ended_error(lease)
            keys = tuple(k for k in lease.live if self._groups[k].state in (LEASED, PREPARED))
        else:
            keys = check_partitions(partitions)
        todo = []
        for key in keys:
            g = self._groups.get(key)
            if (
                g is not None
                and key not in lease.live
                and g.generation == token
                and g.state is READY
                and added <= g.colset
            ):
                continue  # an identical repeat
            if g is not None and g.generation > token:
                self._check_member(lease, key, (LEASED, PREPARED))  # raises StaleFenceError
            if lease.ended is not None:
                raise self._ended_error(lease)
            todo.append(self._check_member(lease, key, (LEASED, PREPARED)))
        for g in todo:
            twice = added & g.colset
            if twice:
                raise AlreadyExistsError(
                    f"group {tuple(g.key)} already carries {sorted(twice)}; each column is written once "
                    "(lease with lack=... to skip groups that have it)",
                    columns=sorted(twice),
                )
        self._leave_batches(lease, todo)
        for g in todo:
            if added:
                g.colset = g.colset | added
                g.columns = self._columns(g.colset)
            del lease.live[g.key]
            self._make_ready(g, front=True)
        if lease.ended is None and not lease.live:
            self._retire(lease, "done")
        return keys

    @staticmethod
    def _leave_batches(lease: _Lease, groups: Iterable[_Group]) -> None:
        """Take prepared ``groups`` out of their batches (a batch left empty is forgotten)."""
        leaving: dict[str, set[Partition]] = {}
        for g in groups:
            if g.batch_id is not None:
                leaving.setdefault(g.batch_id, set()).add(g.key)
        for batch, keys_out in leaving.items():
            rest = tuple(k for k in lease.batches[batch] if k not in keys_out)
            if rest:
                lease.batches[batch] = rest
            else:
                del lease.batches[batch]
                del lease.stage[batch]

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
        self._advance(now)
        lease = self._lease(token)
        job = self._jobs[lease.job_id]
        keys = check_partitions(missing)
        servers = check_names(unreachable, "unreachable")
        for server_id in servers:
            if server_id not in self._servers:
                raise NotFoundError(f"no storage server {server_id!r:.100} is registered")
        lost = []
        for key in keys:
            if job.lost.get(key, "").startswith("missing on server") and key not in lease.live:
                continue  # an identical repeat
            if lease.ended is not None:
                raise self._ended_error(lease)
            lost.append(self._check_member(lease, key, (LEASED, PREPARED)))
        if lease.ended is not None:
            if servers and lease.ended != "done":
                raise self._ended_error(lease)
            return ()
        cfg = job.config
        for server_id in servers:
            self._reach.mark(server_id, self._now, cfg.server_retry_initial, cfg.server_retry_max)
        lost_keys = {g.key for g in lost}
        waiting = [
            g
            for k in lease.live
            if k not in lost_keys
            and (g := self._groups[k]).server_id in servers
            and g.state in (LEASED, PREPARED)
        ]
        self._leave_batches(lease, [*lost, *waiting])
        for g in lost:
            del lease.live[g.key]
            job.lost[g.key] = f"missing on server {g.server_id[:100]}"
            self._to_gc(g, DROPPED)
        for g in waiting:
            del lease.live[g.key]
            self._make_ready(g, front=True)  # parked by the next acquire that meets it
        if not lease.live:
            self._retire(lease, "done")
        gone = lost_keys | {g.key for g in waiting}
        return tuple(k for k in lease.keys if k in gone)

    def resolve(
        self, job_id: str, partitions: Sequence[Partition], action: ResolveAction | str, *, now: float
    ) -> tuple[Partition, ...]:
        """Operator decision for UNKNOWN groups: ``requeue`` (READY again, new token on the next acquire)
        or ``drop`` (deleted, never trained). All-or-nothing; a repeat of an applied drop is a no-op.

        Raises:
            InvalidRequestError: unknown action. NotFoundError: a group is not in the job.
            InvalidStateError: a group is not UNKNOWN (nothing is changed).
        """
        self._advance(now)
        self._job(job_id)
        try:
            act = ResolveAction(action)
        except (ValueError, TypeError):
            raise InvalidRequestError(f"action must be 'requeue' or 'drop', got {brief(action)}") from None
        keys = check_partitions(partitions)
        todo = []
        for key in keys:
            g = self._groups.get(key)
            if g is None or key.job_id != job_id:
                raise NotFoundError(f"group {tuple(key)} is not a live group of job {job_id!r}")
            if g.state is UNKNOWN:
                todo.append(g)
            elif not (act is ResolveAction.DROP and g.state is DROPPED):
                raise InvalidStateError(
                    f"group {tuple(key)} is {g.state.value}; only UNKNOWN groups are resolved"
                )
        for g in todo:
            if act is ResolveAction.REQUEUE:
                self._make_ready(g, front=True)
            else:
                self._to_gc(g, DROPPED)
        return keys
