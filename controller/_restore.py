"""Restoring a job from its checkpoint: what is offered again, what is purged, what is reported lost.

A restore installs the checkpointed job under a larger epoch, then compares it with what the storage
servers hold (``available``, from their listings):

* a group READY at the checkpoint that a server holds is offered again (same partition, new tokens);
  a job that checkpoints keeps committed data until a later checkpoint covers the commit, so this
  includes every group the rolled-back incarnation committed after the newest durable checkpoint;
* a group READY (or UNKNOWN) at the checkpoint that no server holds can never be offered again: it is
  recorded lost with its partition and the reason, and goes to the GC list (a delete of nothing);
* a group a server holds that the checkpoint does not know (acknowledged after it, or granted and never
  published), and a held group that was only granted at the checkpoint, is purged: it goes to the GC
  list with the server's size, so the servers' capacity comes back, and is counted;
* unpublished grants are abandoned, UNKNOWN groups stay UNKNOWN, the GC list carries over (with the
  commits the checkpoint covers), and so does the record of lost groups.

Without ``available`` the checkpoint is trusted: nothing is found lost and nothing is purged.
This module changes nothing when it raises: every argument is checked before anything is installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trajflight.errors import (
    AlreadyExistsError,
    CheckpointError,
    ConfigError,
    InvalidRequestError,
    StaleFenceError,
    brief,
)

from . import _checkpoint as _ckpt
from ._entries import (
    ALLOCATED,
    DROPPED,
    READY,
    UNKNOWN,
    _Group,
    _Job,
    check_columns,
    check_int,
    check_name,
    check_old_ready,
    check_partition,
)
from ._jobs import job_config
from ._parts import Parts
from ._records import HeldGroup, JobConfig, OldReady, Partition

__all__ = ["Holdings", "check_holdings", "restore", "restore_job"]

Holdings = tuple[set[Partition], dict[Partition, HeldGroup]]
"""The partitions the servers hold, and those of them known with their server and size."""


def restore(
    parts: Parts,
    data: bytes,
    *,
    job_id: str,
    epoch: int,
    config: JobConfig | Mapping[str, Any] | None,
    now: float,
    old_ready: OldReady | str,
    available: Sequence[Partition | HeldGroup] | None,
    min_token: int,
) -> None:
    """Check everything, then restore ``job_id`` from the job checkpoint ``data`` (see
    :meth:`~._ledger.Ledger.restore` for the contract and the errors)."""
    payload = _ckpt.decode(data, _ckpt.KIND_JOB)
    if payload.get("job_id") != job_id:
        raise CheckpointError(
            f"the checkpoint is of job {brief(payload.get('job_id'))}, not {brief(job_id)}; "
            "pass the right file or job"
        )
    cfg = job_config(config)
    try:
        saved = JobConfig(**payload["config"])
    except (TypeError, KeyError):
        raise CheckpointError("the checkpoint's configuration is malformed; restore an older copy") from None
    diff = cfg.difference(saved)
    if diff is not None:
        raise ConfigError(
            f"{diff}: the checkpoint was taken with {diff}={getattr(saved, diff)!r}, the restore asks for "
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
    if job_id in parts.jobs:
        raise AlreadyExistsError(
            f"job {job_id!r} is already open in this controller; restore into a fresh controller"
        )
    drop = check_old_ready(old_ready) is OldReady.DROP
    check_int(min_token, "min_token")
    registered = set(parts.servers.by_id)
    imp = _ckpt.parse_job_checkpoint(payload, registered)
    holdings = (
        None if available is None else check_holdings(available, job_id, epoch, imp.server_ids | registered)
    )
    restore_job(
        parts, imp, epoch=epoch, config=cfg, now=now, drop=drop, holdings=holdings, min_token=min_token
    )


def check_holdings(
    available: Iterable[Partition | HeldGroup | Any], job_id: str, epoch: int, servers: set[str]
) -> Holdings:
    """Check ``available`` (partitions, or :class:`HeldGroup` listings) for a restore of ``job_id``.

    Raises:
        InvalidRequestError: an entry is malformed, of another job, or on a server neither registered
            nor listed by the checkpoint.
        StaleFenceError: a server holds a group of ``epoch`` or later (restore under a larger epoch).
    """
    if isinstance(available, str | bytes):
        raise InvalidRequestError("available must be a list of partitions or HeldGroup records")
    present: set[Partition] = set()
    held: dict[Partition, HeldGroup] = {}
    for item in available:
        key = check_partition(item.partition if isinstance(item, HeldGroup) else item)
        if key.job_id != job_id:
            raise InvalidRequestError(
                f"available lists {brief(tuple(key))}, a group of another job than {job_id!r}; "
                "list the servers' groups of the job restored only"
            )
        check_int(key.epoch, "a partition's epoch")
        if key.epoch >= epoch:
            raise StaleFenceError(
                f"the storage servers hold group {brief(tuple(key))} of epoch {key.epoch}, not older than "
                f"the restore's epoch {epoch}: restore under an epoch larger than every epoch the job ran",
                job_id=job_id,
                epoch=epoch,
            )
        present.add(key)
        if isinstance(item, HeldGroup):
            check_name(item.server_id, "a held group's server_id")
            check_int(item.nbytes, "a held group's nbytes")
            if item.server_id not in servers:
                raise InvalidRequestError(
                    f"group {brief(tuple(key))} is held by server {brief(item.server_id)}, which is not "
                    "registered; register it before the restore"
                )
            columns = tuple(sorted(check_columns(item.columns, "a held group's columns")))
            held[key] = HeldGroup(key, item.server_id, item.nbytes, columns)
    return present, held


def restore_job(
    parts: Parts,
    imp: _ckpt.JobImport,
    *,
    epoch: int,
    config: JobConfig,
    now: float,
    drop: bool,
    holdings: Holdings | None,
    min_token: int = 0,
) -> None:
    """Install the parsed checkpoint ``imp`` at ``epoch`` and apply the rules of the module docstring.

    ``drop``: READY groups of the checkpoint are dropped (deleted) rather than offered again.
    ``holdings``: from :func:`check_holdings`, or ``None`` to trust the checkpoint.
    ``min_token``: tokens issued afterwards are larger than it too (the servers' highest generation).
    """
    job, groups = _ckpt.install_job_checkpoint(parts, imp, epoch, config, now, min_token=min_token)
    # Restored from a checkpoint: its commits are kept until a later checkpoint of it is durable.
    job.checkpoints = job.durable = max(1, job.checkpoints)
    present, held = (None, {}) if holdings is None else holdings
    gone = (
        f"absent from every storage server at the restore to epoch {epoch} (committed and deleted after "
        "this checkpoint, or its server lost it)"
    )
    for g in sorted(groups, key=lambda g: g.ready_seq):
        absent = present is not None and g.key not in present
        if g.state is READY:
            if drop:
                parts.groups.to_gc(g, DROPPED, now)
            elif absent:
                _lose(parts, job, g, gone, now)
            else:
                stored = held.get(g.key)
                if stored is not None and stored.columns:  # appended after the checkpoint, too
                    g.colset, g.columns = frozenset(stored.columns), stored.columns
                parts.groups.index_ready(job, g)
        elif g.state is UNKNOWN and absent:
            _lose(parts, job, g, gone, now)  # an operator's requeue could never be read
        elif g.state is ALLOCATED:
            if present is not None and not absent:
                job.purged += 1  # put after the checkpoint, never published
            parts.groups.to_gc(g, DROPPED, now)
    known = {g.key for g in groups}
    for key, item in held.items():
        if key not in known:
            _purge(parts, job, item, now)
    parts.groups.changed()
    parts.groups.capacity_changed()  # a new epoch and configuration


def _lose(parts: Parts, job: _Job, g: _Group, reason: str, now: float) -> None:
    job.lost[g.key] = reason
    parts.groups.to_gc(g, DROPPED, now)


def _purge(parts: Parts, job: _Job, item: HeldGroup, now: float) -> None:
    """Put a stored group the checkpoint does not know on the GC list, counting its bytes until the
    delete is confirmed (so that the server's capacity and the ledger's agree again)."""
    # A fresh token: larger than any the rolled-back incarnation gave the group, so the server takes it.
    g = _Group(item.partition, item.server_id, parts.tokens.next(), item.nbytes, now)
    parts.groups.add(job, g)
    parts.groups.to_gc(g, DROPPED, now)
    job.purged += 1
