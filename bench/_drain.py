"""Emptying a job between timed rounds: the same step in every same-host benchmark of issue 16."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from ._stats import Stats, percentile

__all__ = ["drain", "summary"]


def drain(trainer: Any, cluster: Any, job: str, pause: float = 0.2) -> None:
    """Commit whatever of ``job`` is READY, wait until the cluster confirmed every delete, then sleep
    ``pause`` seconds (the storage server re-creates pre-faulted segments meanwhile).

    Raises:
        Whatever the trainer's lease or commit raises; the wait gives up after 60 s.
    """
    while (lease := trainer.try_lease(4096, wait=0.0, renew=False)) is not None:
        lease.commit()
    cluster.wait_idle(job, timeout=60.0)
    time.sleep(pause)


def summary(values: Sequence[float]) -> dict[str, float]:
    """:class:`~trajflight.bench._stats.Stats` of ``values`` as a dict, with their 99th percentile."""
    return {**dataclasses.asdict(Stats.of(values)), "p99": percentile(values, 99)}
