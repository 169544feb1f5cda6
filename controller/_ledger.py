"""The ledger: the public state machine. Layers, bottom up:

* :mod:`._core` — jobs and epochs, storage servers, policy versions;
* :mod:`._partitions` — placement and capacity, put grants, publishing;
* :mod:`._leases` — the lease path ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED``
  (+ ``UNKNOWN``), release for pipeline stages, the operator's resolve;
* this module — the GC list (commit and drop put groups on it; capacity comes back only when the host
  confirms the delete; a job that checkpoints keeps its commits until a later checkpoint is confirmed
  durable), queries, job checkpoints, snapshots and crash recovery; :mod:`._restore` decides what a
  restore offers again, purges or reports lost.

Sans-IO: every call gets ``now``; see :mod:`._core` for what that guarantees. It does not retry anything
by itself and never replays an UNKNOWN group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trajflight.errors import (
    AlreadyExistsError,
    CheckpointError,
    ConfigError,
    InvalidRequestError,
    StaleFenceError,
)

from . import _checkpoint as _ckpt
from ._entries import (
    check_int,
    check_old_ready,
    check_partition,
    check_state,
)
from ._leases import LeaseMachine
from ._records import (
    LIVE_STATES,
    DeleteWork,
    GroupInfo,
    GroupState,
    HeldGroup,
    JobConfig,
    LostGroup,
    OldReady,
    Partition,
)
from ._restore import check_holdings, restore_job

__all__ = ["Ledger"]


class Ledger(LeaseMachine):
    """The controller's state machine: sans-IO, deterministic, driven by ``now``.

    Args:
        incarnation: Fencing tokens start at ``incarnation << 32``; hosts pass a value larger than any
            previous run's (they persist it) so that tokens keep increasing across restarts.
    """

    # ------------------------------------------------------------------ sweeping and GC
    def tick(self, now: float) -> None:
        """Apply expiries due at ``now`` (hosts call it from their sweeper; every other call does too)."""
        self._advance(now)

    def next_deadline(self) -> float | None:
        """The earliest time at which something may expire, a delete fall due or a storage server's
        back-off end (``None``: nothing)."""
        times = []
        if self._lease_heap:
            times.append(self._lease_heap[0][0])
        if self._grant_heap:
            times.append(self._grant_heap[0][0])
        for due in (*(job.gc.next_due() for job in self._jobs.values()), self._fences.next_due()):
            if due is not None:
                times.append(due)
        due = self._reach.next_due()
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
        self._unpark(self._reach.reached(g.server_id))  # the server answered
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
        """Groups per state for the job (every state present), plus ``deleted`` (confirmed deletes),
        ``committed_total`` (commits ever, deleted or not), ``kept`` (COMMITTED groups kept for a restore
        until a later checkpoint is durable: they hold capacity), ``lost`` (groups that can never be
        offered again, see :meth:`lost`) and ``purged`` (groups restores deleted because their checkpoint
        did not know them)."""
        job = self._job(job_id)
        out = {state.value: n for state, n in job.counts.items()}
        out["deleted"] = job.deleted
        out["committed_total"] = job.committed
        out["kept"] = len(job.kept)
        out["lost"] = len(job.lost)
        out["purged"] = job.purged
        return out

    def lost(self, job_id: str) -> tuple[LostGroup, ...]:
        """Every group of the job that can never be offered again although it was not trained, with why
        (oldest first; carried in checkpoints and snapshots)."""
        job = self._job(job_id)
        return tuple(LostGroup(key, reason) for key, reason in job.lost.items())

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
        return _ckpt.export_job_checkpoint(self, job_id, now)

    def confirm_checkpoint(self, job_id: str, seq: int, *, now: float) -> int:
        """Checkpoint ``seq`` of the job is durable: the commits it covers (made before it was taken) go
        to the GC list. Idempotent; confirming an older checkpoint than one confirmed changes nothing.

        Returns:
            The number of kept commits this confirmation released for deletion.

        Raises:
            NotFoundError: the job is not open.
            InvalidRequestError: ``seq`` is not the sequence number of a checkpoint taken of the job.
        """
        self._advance(now)
        job = self._job(job_id)
        check_int(seq, "seq", minimum=1)
        if seq > job.checkpoints:
            raise InvalidRequestError(
                f"job {job_id!r} has no checkpoint {seq} (newest {job.checkpoints}); confirm the sequence "
                "number of the bytes checkpoint returned (checkpoint_seq reads it)"
            )
        if seq <= job.durable:
            return 0
        job.durable = seq
        released = []
        for key, taken in job.kept.items():  # in commit order, so in order of checkpoints taken too
            if taken >= seq:
                break
            released.append(key)
        for key in released:
            del job.kept[key]
            job.gc.add(key, self._now)
        return len(released)

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
        now = self._advance(now)
        payload = _ckpt.decode(data, _ckpt.KIND_JOB)
        if payload.get("job_id") != job_id:
            raise CheckpointError(
                f"the checkpoint is of job {payload.get('job_id')!r:.100}, not {job_id!r:.100}; "
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
        check_int(min_token, "min_token")
        imp = _ckpt.parse_job_checkpoint(self, payload)
        holdings = (
            None
            if available is None
            else check_holdings(available, job_id, epoch, imp.server_ids | set(self._servers))
        )
        restore_job(
            self, imp, epoch=epoch, config=cfg, now=now, drop=drop, holdings=holdings, min_token=min_token
        )
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
