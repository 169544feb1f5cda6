"""Read-only views across a ledger's collaborators: the metrics' figures and the next deadline.

Each function reads the collaborators of :mod:`._parts` and changes nothing (it does not apply expiries
either: the ledger's queries read the state as the last call left it). It does not guarantee a
consistent view across calls: a host reads :func:`figures` in one call when it needs one.
"""

from __future__ import annotations

from typing import Any

from ._parts import Parts

__all__ = ["figures", "next_deadline"]


def figures(parts: Parts) -> dict[str, Any]:
    """See :meth:`~._ledger.Ledger.figures` (the shape of the answer is documented there)."""
    jobs: dict[str, Any] = {}
    for job in parts.jobs:
        cfg = job.config
        jobs[job.job_id] = {
            "counts": parts.jobs.counts(job.job_id),
            "usage": (job.used_bytes, job.used_groups),
            "capacity": (cfg.capacity_bytes, cfg.capacity_groups),
            "gc": len(parts.upkeep.gc_list(job.job_id)),
            "leases": len(parts.leases.live_tokens(job.job_id)),
        }
    return {
        "jobs": jobs,
        "servers": list(parts.servers.infos()),
        "fences": len(parts.upkeep.fences),
        "lease_ends": parts.leases.end_counts(),
    }


def next_deadline(parts: Parts) -> float | None:
    """See :meth:`~._ledger.Ledger.next_deadline`: the earliest due time, or ``None`` when nothing is."""
    times = parts.upkeep.next_due()
    for due in (parts.leases.next_due(), parts.grants.next_due(), parts.upkeep.reach.next_due()):
        if due is not None:
            times.append(due)
    return min(times) if times else None
