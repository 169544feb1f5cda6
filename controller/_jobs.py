"""Jobs and their epochs, writers and policy versions: the ledger's per-job facts.

A job is open at one epoch at a time; a larger epoch fences every older one (the ledger ends the old
epoch's leases and abandons its grants, this module starts the new epoch: new configuration, writers
forgotten, group ids from 0). Writers register per epoch and acknowledge announced policy versions;
strict on-policy mode holds ``acquire`` while one has not.

It does not hold the groups (:mod:`._groups` does; a job record only counts them) and reads no clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from trajflight.errors import (
    ConfigError,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    StaleFenceError,
    brief,
)

from ._entries import INT64_MAX, _Job, _Writer, check_int, check_name
from ._records import LIVE_STATES, JobConfig, LostGroup, PolicyStatus

__all__ = ["Jobs", "job_config"]


def job_config(config: JobConfig | Mapping[str, Any] | None) -> JobConfig:
    """``config`` as a validated :class:`JobConfig` (``None``: the defaults).

    Raises:
        ConfigError: a setting is unknown or invalid (named).
        InvalidRequestError: ``config`` is neither a JobConfig nor a mapping.
    """
    if config is None:
        return JobConfig()
    if isinstance(config, JobConfig):
        return config
    if isinstance(config, Mapping):
        return JobConfig.from_mapping(config)
    raise InvalidRequestError(f"config must be a JobConfig or a mapping, got {type(config).__name__}")


class Jobs:
    """The open jobs, by id."""

    __slots__ = ("_jobs",)

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __getitem__(self, job_id: str) -> _Job:
        return self._jobs[job_id]

    def __iter__(self) -> Iterator[_Job]:
        return iter(list(self._jobs.values()))

    def ids(self) -> list[str]:
        """The ids of the open jobs, in the order they were opened."""
        return list(self._jobs)

    def get(self, job_id: str) -> _Job | None:
        """The job, or ``None`` when it is not open."""
        return self._jobs.get(job_id)

    def add(self, job: _Job) -> None:
        """Open a new job (the caller checked that it is not open)."""
        self._jobs[job.job_id] = job

    def job(self, job_id: str) -> _Job:
        """The open job ``job_id``.

        Raises:
            NotFoundError: it is not open. InvalidRequestError: ``job_id`` is not a name.
        """
        job = self._jobs.get(job_id) if type(job_id) is str else None
        if job is None:
            check_name(job_id, "job_id")
            raise NotFoundError(f"job {brief(job_id)} is not open; call open_job first", job_id=job_id)
        return job

    def job_epoch(self, job_id: str, epoch: int) -> _Job:
        """The open job ``job_id`` if ``epoch`` is its current epoch.

        Raises:
            StaleFenceError: ``epoch`` is older (fenced). NotFoundError: the job, or that epoch, is not open.
        """
        job = self.job(job_id)
        if type(epoch) is not int or epoch < 0 or epoch > INT64_MAX:
            check_int(epoch, "epoch")
        if epoch < job.epoch:
            raise StaleFenceError(
                f"epoch {epoch} of job {job_id!r} is fenced by epoch {job.epoch}: this caller belongs to an "
                "older run of the job; stop it",
                job_id=job_id,
                epoch=epoch,
                current_epoch=job.epoch,
            )
        if epoch > job.epoch:
            raise NotFoundError(
                f"epoch {epoch} of job {job_id!r} is not open (current epoch {job.epoch}); "
                "call open_job first",
                job_id=job_id,
            )
        return job

    # ------------------------------------------------------------------ epochs
    @staticmethod
    def is_new_epoch(job: _Job, epoch: int, cfg: JobConfig) -> bool:
        """Whether opening ``job`` at ``epoch`` starts a new epoch (False: the same epoch, opened again
        with the same configuration: nothing to do).

        Raises:
            StaleFenceError: ``epoch`` is older than the current one.
            ConfigError: the current epoch is asked for with another configuration (the setting named).
        """
        if epoch < job.epoch:
            raise StaleFenceError(
                f"epoch {epoch} of job {job.job_id!r} is older than its current epoch {job.epoch}; a "
                "restart must use a larger epoch",
                job_id=job.job_id,
                epoch=epoch,
            )
        if epoch == job.epoch:
            diff = cfg.difference(job.config)
            if diff is not None:
                raise ConfigError(
                    f"{diff}: job {job.job_id!r} epoch {epoch} is already open with {diff}="
                    f"{getattr(job.config, diff)!r}; open a larger epoch to change the configuration",
                    setting=diff,
                )
            return False
        return True

    @staticmethod
    def start_epoch(job: _Job, epoch: int, cfg: JobConfig) -> None:
        """Move ``job`` to the larger ``epoch`` (its old leases and grants are already dealt with): new
        configuration, group ids from 0, writers to register again."""
        job.epoch = epoch
        job.config = cfg
        job.next_group_id = 0
        job.writers.clear()
        job.gc.retry_initial, job.gc.retry_max = cfg.delete_retry_initial, cfg.delete_retry_max
        job.gc.timeout = cfg.delete_timeout

    # ------------------------------------------------------------------ writers and policy versions
    def register_writer(
        self, job_id: str, epoch: int, writer_id: str, node: str, policy_version: int | None
    ) -> PolicyStatus:
        """See :meth:`~._ledger.Ledger.register_writer`."""
        job = self.job_epoch(job_id, epoch)
        check_name(writer_id, "writer_id")
        check_name(node, "node")
        version = (
            job.policy_version if policy_version is None else check_int(policy_version, "policy_version")
        )
        writer = job.writers.get(writer_id)
        if writer is None:
            job.writers[writer_id] = _Writer(node, version)
        else:
            writer.node = node
            writer.acked = max(writer.acked, version)
        return self.policy_status(job_id)

    def announce_policy(self, job_id: str, version: int) -> PolicyStatus:
        """See :meth:`~._ledger.Ledger.announce_policy`."""
        job = self.job(job_id)
        check_int(version, "version")
        if version < job.policy_version:
            raise InvalidRequestError(
                f"policy version {version} is older than the announced version {job.policy_version} of job "
                f"{job_id!r}; versions only increase",
            )
        job.policy_version = version
        return self.policy_status(job_id)

    def ack_policy(self, job_id: str, epoch: int, writer_id: str, version: int) -> PolicyStatus:
        """See :meth:`~._ledger.Ledger.ack_policy` (the caller wakes acquirers: a hold may have lifted)."""
        job = self.job_epoch(job_id, epoch)
        writer = job.writers.get(check_name(writer_id, "writer_id"))
        if writer is None:
            raise NotFoundError(
                f"writer {writer_id!r} is not registered for job {job_id!r}; register_writer first"
            )
        check_int(version, "version")
        if version > job.policy_version:
            raise InvalidRequestError(
                f"policy version {version} was not announced (current {job.policy_version}); "
                "ack what was announced"
            )
        writer.acked = max(writer.acked, version)
        return self.policy_status(job_id)

    def policy_status(self, job_id: str) -> PolicyStatus:
        """See :meth:`~._ledger.Ledger.policy_status`."""
        job = self.job(job_id)
        pending = job.pending_writers()
        acked = sorted(w for w in job.writers if w not in pending)
        return PolicyStatus(
            job_id,
            job.policy_version,
            tuple(acked),
            tuple(pending),
            job.config.strict_on_policy and bool(pending),
        )

    # ------------------------------------------------------------------ checkpoints
    def checkpointable(self, job_id: str) -> _Job:
        """The job, if none of its groups is LEASED..TRAINED (a checkpoint of it may be taken).

        Raises:
            NotFoundError: the job is not open. InvalidStateError: some group is LEASED..TRAINED.
        """
        job = self.job(job_id)
        live = self.live_groups(job_id)
        if live:
            raise InvalidStateError(
                f"checkpoint of job {job_id!r} refused: {live} groups are LEASED..TRAINED; commit or release "
                "them (or let their leases expire) and checkpoint between training steps",
                live=live,
            )
        return job

    def confirm_checkpoint(self, job_id: str, seq: int, now: float) -> int:
        """See :meth:`~._ledger.Ledger.confirm_checkpoint`."""
        job = self.job(job_id)
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
            job.gc.add(key, now)
        return len(released)

    # ------------------------------------------------------------------ queries
    def counts(self, job_id: str) -> dict[str, int]:
        """See :meth:`~._ledger.Ledger.counts`."""
        job = self.job(job_id)
        out = {state.value: n for state, n in job.counts.items()}
        out["deleted"] = job.deleted
        out["committed_total"] = job.committed
        out["kept"] = len(job.kept)
        out["lost"] = len(job.lost)
        out["purged"] = job.purged
        return out

    def lost(self, job_id: str) -> tuple[LostGroup, ...]:
        """See :meth:`~._ledger.Ledger.lost`."""
        job = self.job(job_id)
        return tuple(LostGroup(key, reason) for key, reason in job.lost.items())

    def usage(self, job_id: str) -> tuple[int, int]:
        """See :meth:`~._ledger.Ledger.usage`."""
        job = self.job(job_id)
        return job.used_bytes, job.used_groups

    def live_groups(self, job_id: str) -> int:
        """How many groups of the job are LEASED..TRAINED (0: a checkpoint may be taken)."""
        job = self.job(job_id)
        return sum(job.counts[s] for s in LIVE_STATES)
