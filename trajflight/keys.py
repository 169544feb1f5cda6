"""The partition key of a group, shared by every part (standard library only).

A group of samples is stored, leased, committed and deleted under ``(job_id, epoch, group_id)``. This
module guarantees nothing about the values: each part checks what it receives
(``trajflight.controller`` and the storage servers' wire decoders range-check them).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Partition"]


class Partition(NamedTuple):
    """The partition key of a group, ``(job_id, epoch, group_id)``; unique within a job, never reused.

    A named tuple rather than a frozen dataclass: storage servers look keys up several times per group
    on every read and put, and a tuple's hash and equality run in C. It equals the plain tuple of the
    same three values.
    """

    job_id: str
    epoch: int
    group_id: int
