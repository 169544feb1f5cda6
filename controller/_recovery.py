"""Taking a job checkpoint and recovering from a host crash, on a ledger's collaborators.

:func:`take_checkpoint` frames a quiescent job (the format is :mod:`._checkpoint`'s) and counts the
checkpoint; :func:`recover` starts a new incarnation and ends every live lease. Restores from a
checkpoint are :mod:`._restore`'s rules, whole-ledger snapshots :mod:`._checkpoint`'s.

It does not write or read any file and does not make a checkpoint durable: the host writes the bytes and
reports them with ``confirm_checkpoint``. Every function gets ``now`` already advanced by the ledger.
"""

from __future__ import annotations

from trajflight.errors import InvalidRequestError

from . import _checkpoint as _ckpt
from ._entries import check_int
from ._parts import Parts

__all__ = ["recover", "take_checkpoint"]


def take_checkpoint(parts: Parts, job_id: str, now: float) -> bytes:
    """See :meth:`~._ledger.Ledger.checkpoint`: the job's framed checkpoint, numbered one past the last.

    Raises:
        NotFoundError: the job is not open.
        InvalidStateError: a group of the job is LEASED..TRAINED (nothing is counted).
    """
    job = parts.jobs.checkpointable(job_id)
    data = _ckpt.job_checkpoint(parts, job, job.checkpoints + 1, now)
    job.checkpoints += 1
    return data


def recover(parts: Parts, incarnation: int, now: float) -> int:
    """See :meth:`~._ledger.Ledger.recover`: returns the number of leases ended.

    Raises:
        InvalidRequestError: ``incarnation`` is not larger than the current one (nothing is changed).
    """
    check_int(incarnation, "incarnation")
    tokens = parts.tokens
    if incarnation <= tokens.incarnation:
        raise InvalidRequestError(
            f"incarnation {incarnation} must be larger than the current {tokens.incarnation}"
        )
    tokens.restart(incarnation)
    return parts.leases.end_all(now)
