"""The ledger: the lease state machine, the GC list and the queries, on top of :class:`LedgerCore`.

Per group: ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED``, plus ``UNKNOWN``.
``acquire`` leases READY groups under one fencing token; ``prepare`` gathers some LEASED groups of the
lease into a named batch; ``start_training``, ``finish_training`` and ``commit`` move a whole batch one
step. Each step is a compare-and-set on the token and the batch's prior state and returns the same answer
when repeated identically. ``release`` gives LEASED/PREPARED groups back to READY (enrichment stages record
the columns they appended). Expiry (lazy, on every call, or :meth:`Ledger.tick`) sends LEASED/PREPARED
groups to READY and TRAINING/TRAINED groups to UNKNOWN, where only an operator's :meth:`Ledger.resolve`
moves them. ``commit`` puts a group on the GC list; its capacity comes back when the host confirms the
delete.

It does not retry anything by itself and never replays an UNKNOWN group.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trajflight.errors import (
    AlreadyExistsError,
    CheckpointError,
    ConfigError,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    StaleFenceError,
)

from . import _checkpoint as _ckpt
from ._core import LedgerCore
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
    check_old_ready,
    check_partition,
    check_partitions,
    check_state,
)
from ._records import (
    LIVE_STATES,
    DeleteWork,
    GroupInfo,
    GroupState,
    JobConfig,
    Lease,
    OldReady,
    Partition,
    ResolveAction,
)

__all__ = ["Ledger"]


class Ledger(LedgerCore):
    """The controller's state machine: sans-IO, deterministic, driven by ``now``.

    Args:
        incarnation: Fencing tokens start at ``incarnation << 32``; hosts pass a value larger than any
            previous run's (they persist it) so that tokens keep increasing across restarts.
    """

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
        sets), not to the number of READY groups.

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
        keys = job.ready.take(
            max_groups,
            min_version=None if staleness is None else job.policy_version - staleness,
            exact_version=exact,
            require=require_set,
            lack=lack_set,
            max_tokens=max_tokens,
            tokens_of=lambda key: groups[key].tokens,
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
                f"ttl must be a number of seconds in (0, {maximum}] (max_lease_ttl), got {ttl!r}"
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
                f"group {tuple(key)} was re-leased with a newer token {g.generation} than {lease.token}; "
                "stop working on it",
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
        keys = lease.batches.get(batch_id)
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
        """TRAINED -> COMMITTED for the batch: each group is trained once, for good, and put on the GC list.

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
        leaving: dict[str, set[Partition]] = {}
        for g in todo:
            if g.batch_id is not None:
                leaving.setdefault(g.batch_id, set()).add(g.key)
            if added:
                g.colset = g.colset | added
                g.columns = self._columns(g.colset)
            del lease.live[g.key]
            self._make_ready(g, front=True)
        for batch, keys_out in leaving.items():  # prepared groups leave their batch
            rest = tuple(k for k in lease.batches[batch] if k not in keys_out)
            if rest:
                lease.batches[batch] = rest
            else:
                del lease.batches[batch]
                del lease.stage[batch]
        if lease.ended is None and not lease.live:
            self._retire(lease, "done")
        return keys

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
        except ValueError:
            raise InvalidRequestError(f"action must be 'requeue' or 'drop', got {action!r}") from None
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

    # ------------------------------------------------------------------ sweeping and GC
    def tick(self, now: float) -> None:
        """Apply expiries due at ``now`` (hosts call it from their sweeper; every other call does too)."""
        self._advance(now)

    def next_deadline(self) -> float | None:
        """The earliest time at which something may expire or a delete fall due (``None``: nothing)."""
        times = []
        if self._lease_heap:
            times.append(self._lease_heap[0][0])
        if self._grant_heap:
            times.append(self._grant_heap[0][0])
        for job in self._jobs.values():
            due = job.gc.next_due()
            if due is not None:
                times.append(due)
        return min(times) if times else None

    def take_deletes(self, *, now: float, limit: int = 256) -> list[DeleteWork]:
        """Hand out up to ``limit`` due deletes; each must be reported with :meth:`delete_done`.

        An unreported delete is handed out again after the job's ``delete_timeout``.
        """
        self._advance(now)
        out: list[DeleteWork] = []
        for job in self._jobs.values():
            for entry in job.gc.take(self._now, limit - len(out)):
                g = self._groups[entry.key]
                server = self._servers[g.server_id]
                out.append(
                    DeleteWork(
                        g.key, g.server_id, server.location, g.generation, entry.attempts, entry.last_error
                    )
                )
            if len(out) >= limit:
                break
        return out

    def delete_done(
        self, partition: Partition | Sequence[Any], *, ok: bool, now: float, error: str | None = None
    ) -> bool:
        """Report a delete's outcome. On success the group is forgotten and its capacity released.

        Returns:
            True when this report released the group; False for a failure (retried later) or a late
            duplicate report.
        """
        self._advance(now)
        key = check_partition(partition)
        job = self._jobs.get(key.job_id)
        if job is None or key not in job.gc:
            return False
        if not job.gc.done(key, bool(ok), self._now, error):
            return False
        g = self._groups.pop(key)
        del job.groups[key]
        job.counts[g.state] -= 1
        job.deleted += 1
        server = self._servers[g.server_id]
        server.used_bytes -= g.nbytes
        server.used_groups -= 1
        job.used_bytes -= g.nbytes
        job.used_groups -= 1
        return True

    # ------------------------------------------------------------------ queries
    def counts(self, job_id: str) -> dict[str, int]:
        """Groups per state for the job (every state present), plus ``deleted`` (confirmed deletes) and
        ``committed_total`` (commits ever, deleted or not)."""
        job = self._job(job_id)
        out = {state.value: n for state, n in job.counts.items()}
        out["deleted"] = job.deleted
        out["committed_total"] = job.committed
        return out

    def usage(self, job_id: str) -> tuple[int, int]:
        """``(bytes, groups)`` the job holds: reserved or stored, not yet confirmed deleted."""
        job = self._job(job_id)
        return job.used_bytes, job.used_groups

    def lease_groups(self, token: int) -> tuple[GroupInfo, ...]:
        """Current information on every group a lease was granted (deleted ones omitted)."""
        lease = self._lease(token)
        return tuple(self._info(self._groups[k]) for k in lease.keys if k in self._groups)

    def live_leases(self, job_id: str | None = None) -> tuple[int, ...]:
        """Tokens of the live leases (of one job, or all)."""
        return tuple(t for t, lease in self._leases.items() if job_id is None or lease.job_id == job_id)

    def gc_list(self, job_id: str | None = None) -> tuple[DeleteWork, ...]:
        """What waits for a confirmed delete (of one job, or all), with attempts and last errors."""
        out = []
        for job in self._jobs.values():
            if job_id is not None and job.job_id != job_id:
                continue
            for entry in job.gc:
                g = self._groups[entry.key]
                out.append(
                    DeleteWork(
                        g.key,
                        g.server_id,
                        self._servers[g.server_id].location,
                        g.generation,
                        entry.attempts,
                        entry.last_error,
                    )
                )
        return tuple(out)

    def groups_in(self, job_id: str, state: GroupState | str) -> tuple[GroupInfo, ...]:
        """Every group of the job in ``state`` (O(groups of the job); for operators and tests)."""
        job = self._job(job_id)
        st = check_state(state)
        return tuple(self._info(g) for k in job.groups if (g := self._groups[k]).state is st)

    def is_quiescent(self, job_id: str) -> bool:
        """True when no group of the job is LEASED..TRAINED (a checkpoint may be taken)."""
        job = self._job(job_id)
        return not any(job.counts[s] for s in LIVE_STATES)

    # ------------------------------------------------------------------ checkpoints and recovery
    def checkpoint(self, job_id: str, *, now: float) -> bytes:
        """The job's quiescent cursor and state, framed with format version and checksum.

        Write it with :func:`~trajflight.controller.write_checkpoint` (atomic) or keep the bytes.

        Raises:
            NotFoundError: the job is not open.
            InvalidStateError: a group of the job is LEASED..TRAINED; checkpoint between steps.
        """
        return _ckpt.export_job_checkpoint(self, job_id, now)

    def restore(
        self,
        data: bytes,
        *,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None,
        now: float,
        old_ready: OldReady | str = OldReady.REOFFER,
    ) -> dict[str, int]:
        """Restart ``job_id`` from a job checkpoint under a larger ``epoch``.

        Uncommitted READY groups of the old epoch are re-offered (same partitions, new tokens on the next
        acquire) or dropped (deleted) as ``old_ready`` says; unpublished grants are abandoned (deleted);
        UNKNOWN groups stay UNKNOWN; the GC list carries over. Tokens issued afterwards are larger than
        every token issued before the checkpoint.

        Returns:
            The job's counts after the restore (see :meth:`counts`).

        Raises:
            CheckpointError: the data is corrupt, truncated, of another format or of another job.
            ConfigError: ``config`` differs from the checkpoint's (the setting is named).
            StaleFenceError: ``epoch`` is not larger than the checkpoint's epoch.
            AlreadyExistsError: this ledger already has the job open.
        """
        now = self._advance(now)
        payload = _ckpt.decode(data, _ckpt.KIND_JOB)
        if payload.get("job_id") != job_id:
            raise CheckpointError(
                f"the checkpoint is of job {payload.get('job_id')!r}, not {job_id!r}; "
                "pass the right file or job"
            )
        cfg = self._config(config)
        try:
            saved = JobConfig(**payload["config"])
        except (TypeError, KeyError):
            raise CheckpointError(
                "the checkpoint's configuration is malformed; restore an older copy"
            ) from None
        diff = cfg.difference(saved)
        if diff is not None:
            raise ConfigError(
                f"{diff}: the checkpoint was taken with {diff}={getattr(saved, diff)!r}, the restore "
                "asks for "
                f"{getattr(cfg, diff)!r}; restore with the same configuration",
                setting=diff,
            )
        check_int(epoch, "epoch")
        if epoch <= payload["epoch"]:
            raise StaleFenceError(
                f"restore of job {job_id!r} needs an epoch larger than the checkpoint's "
                f"{payload['epoch']}, got {epoch}",
                job_id=job_id,
                epoch=epoch,
            )
        if job_id in self._jobs:
            raise AlreadyExistsError(
                f"job {job_id!r} is already open in this controller; restore into a fresh controller"
            )
        drop = check_old_ready(old_ready) is OldReady.DROP
        groups = _ckpt.import_job(self, payload, epoch, cfg, now)
        job = self._jobs[job_id]
        for g in sorted(groups, key=lambda g: g.ready_seq):
            if g.state is READY:
                if drop:
                    self._to_gc(g, DROPPED)
                else:
                    g.ready_seq = job.ready.push(g.key, g.policy_version, g.colset)
            elif g.state is GroupState.ALLOCATED:
                self._to_gc(g, DROPPED)
        self.ready_version += 1
        return self.counts(job_id)

    def snapshot(self) -> bytes:
        """The whole ledger, live leases included, for a host's crash recovery (not a job checkpoint)."""
        return _ckpt.export_snapshot(self)

    @classmethod
    def from_snapshot(cls, data: bytes, *, source: str = "snapshot") -> Ledger:
        """A ledger exactly as :meth:`snapshot` saw it.

        Raises:
            CheckpointError: the snapshot is corrupt, truncated or of another format.
        """
        ledger = cls()
        _ckpt.import_snapshot(ledger, data, source=source)
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
        self._advance(now)
        check_int(incarnation, "incarnation")
        if incarnation <= self._incarnation:
            raise InvalidRequestError(
                f"incarnation {incarnation} must be larger than the current {self._incarnation}"
            )
        self._incarnation, self._counter = incarnation, 0
        leases = list(self._leases.values())
        for lease in leases:
            self._end_live_lease(lease, "restart")
        return len(leases)
