"""The demo's reward stage: group-normalised advantages, appended to the stored groups.

A thread of the trainer's process. It leases groups that lack ``advantage``, reads their ``reward``
column, computes GRPO's advantage per group (``(r - mean) / (std + eps)`` over the group's samples; 0
for a group whose samples all scored the same), appends it to each group on its storage server under
the lease's token, and releases the groups with the new column recorded, so that the trainer's
``require=["advantage"]`` lease finds them.

Checkpoints need a quiescent job (no group leased): :meth:`RewardStage.paused` holds the stage between
two leases while the trainer checkpoints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["RewardStage", "group_advantages"]

EPS = 1e-6


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """GRPO's advantages of one group's samples: rewards normalised by the group's mean and std."""
    rewards = np.asarray(rewards, dtype=np.float64)
    out: np.ndarray = ((rewards - rewards.mean()) / (rewards.std() + EPS)).astype(np.float32)
    return out


class RewardStage(threading.Thread):
    """Lease groups lacking ``advantage``, append it, release them; until :meth:`stop`.

    Args:
        client: The data plane connection (this process's).
        job_id: The job.
        batch: Most groups per lease.
    """

    def __init__(self, client: Any, job_id: str, *, batch: int) -> None:
        super().__init__(name="demo-reward-stage", daemon=True)
        self.trainer = client.trainer(job_id, owner="demo-reward-stage")
        self.batch = batch
        self.groups = 0
        self.already = 0  # groups whose advantage was stored already (see _once)
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._pausing = threading.Event()
        self._stopped = threading.Event()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the stage between two leases for the duration of the ``with`` block."""
        self._pausing.set()
        try:
            with self._lock:
                yield
        finally:
            self._pausing.clear()

    def stop(self) -> None:
        """Stop after the current lease (its groups are released first); returns at once."""
        self._stopped.set()

    def run(self) -> None:
        try:
            while not self._stopped.is_set():
                if self._pausing.is_set():
                    time.sleep(0.002)
                    continue
                with self._lock:
                    self._once()
        except BaseException as exc:  # reported by the trainer, which owns the terminal
            self.error = exc

    def _once(self) -> None:
        from trajflight.errors import AlreadyExistsError

        batch = self.trainer.try_lease(self.batch, wait=0.05, lack=["advantage"])
        if batch is None:
            return
        table = batch.fetch_table(["reward"])
        rewards = table.column("reward").to_numpy()
        row = 0
        for meta in batch.handle.groups:
            advantage = group_advantages(rewards[row : row + meta.rows])
            try:
                batch.append(meta.partition, pa.table({"advantage": advantage}))
            except AlreadyExistsError:
                # Appended by an incarnation rolled back to a checkpoint taken before the append: the
                # stored column is this one (the same rewards give the same advantages); record it.
                self.already += 1
            row += meta.rows
        batch.release(columns=["advantage"])
        self.groups += len(batch)
