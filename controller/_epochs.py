"""Opening a job, and moving it to a larger epoch: the rule :meth:`~._ledger.Ledger.open_job` states.

A new job gets its empty record; the same epoch with the same configuration is a no-op; a larger epoch
ends the job's live leases, drops its unpublished grants (and its READY groups when asked to) through the
GC list, and starts the epoch. The checks of the epoch and configuration are :mod:`._jobs`'s.

It does not read a clock (``now`` is passed in, already advanced by the ledger) and does not journal
anything; it does not guarantee that the host has fenced the older epoch on the storage servers (the
fences it queues are :mod:`._upkeep`'s to hand out).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trajflight.logs import context as log_context

from ._entries import ALLOCATED, DROPPED, READY, check_int, check_name, check_old_ready
from ._jobs import job_config
from ._parts import Parts
from ._records import JobConfig, OldReady

__all__ = ["open_job"]

log = logging.getLogger("trajflight.controller")


def open_job(
    parts: Parts,
    job_id: str,
    epoch: int,
    config: JobConfig | Mapping[str, Any] | None,
    old_ready: OldReady | str,
    now: float,
) -> JobConfig:
    """See :meth:`~._ledger.Ledger.open_job` (``now`` already advanced); returns the validated config.

    Raises:
        InvalidRequestError, ConfigError, StaleFenceError: as :meth:`~._ledger.Ledger.open_job` says.
    """
    check_name(job_id, "job_id")
    check_int(epoch, "epoch")
    cfg = job_config(config)
    drop = check_old_ready(old_ready) is OldReady.DROP
    jobs, groups = parts.jobs, parts.groups
    job = jobs.get(job_id)
    if job is None:
        jobs.add(groups.new_job(job_id, epoch, cfg))
        log.info("job opened at epoch %d", epoch, extra=log_context(job=job_id, epoch=epoch))
        return cfg
    if not jobs.is_new_epoch(job, epoch, cfg):
        return cfg
    log.info(
        "job moves to epoch %d: epoch %d and older are fenced",
        epoch,
        job.epoch,
        extra=log_context(job=job_id, epoch=epoch),
    )
    parts.leases.end_job(job_id, now)
    for key in list(job.groups):
        g = groups.table[key]
        if g.state is ALLOCATED or (g.state is READY and drop):
            groups.to_gc(g, DROPPED, now)
    jobs.start_epoch(job, epoch, cfg)
    groups.capacity_changed()  # a new configuration; writers of the fenced epoch learn it as they retry
    return cfg
