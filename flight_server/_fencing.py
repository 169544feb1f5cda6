"""The group store's fences: what it refuses, and the memory that outlives the groups themselves.

Per job: the lowest epoch still accepted for puts (a restarted job fences its old epochs) and the type of
every column its groups carry (one type per column per job). Per group: the highest lease generation
seen (from reads, appends, deletes and raises; kept after a delete, so a zombie's late delete or append is
still refused; forgotten once the group's epoch is fenced and it holds no data), published on the fence
board for same-host readers (:mod:`.shm._fences`). And the tombstones of deleted keys
(:mod:`._tombstones`), so that a late put of one is refused.

:class:`Fences` holds that state and its checks. It is not thread-safe: the group store (:mod:`._store`)
calls it under its own lock, and decides what is stored. It does no I/O but writing the board's shared
memory.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from trajflight.errors import LeaseExpiredError, SchemaError, StaleFenceError
from trajflight.flight_server._store_records import fmt_key, key_fields
from trajflight.flight_server._tombstones import Tombstones
from trajflight.flight_server._wire import LeaseToken
from trajflight.flight_server._wire_bounds import echo
from trajflight.flight_server.shm._fences import FenceBoard
from trajflight.keys import Partition

__all__ = ["Fences"]


@dataclass(slots=True)
class _JobState:
    min_epoch: int = 0
    column_types: dict[str, pa.DataType] = field(default_factory=dict)


class Fences:
    """Epoch fences and column types per job, lease generations per group, tombstones.

    Args:
        board: The fence board that publishes generations to same-host readers (None without an arena).
    """

    def __init__(self, board: FenceBoard | None) -> None:
        self.board = board
        self._jobs: dict[str, _JobState] = {}
        self._generation: dict[Partition, int] = {}
        self._tombstones = Tombstones()

    # ------------------------------------------------------------------------------------------ checks

    def check_epoch(self, key: Partition, what: str) -> None:
        """Refuse ``what`` of ``key`` when its epoch is fenced.

        Raises:
            StaleFenceError: the epoch is below the job's ``min_epoch``.
        """
        state = self._jobs.get(key.job_id)
        if state is not None and key.epoch < state.min_epoch:
            raise StaleFenceError(
                f"{what} of group {fmt_key(key)} refused: epoch {key.epoch} of job {echo(key.job_id)} is "
                f"fenced (epochs below {state.min_epoch} are closed); this process belongs to an old "
                "incarnation of the job: stop it",
                job_id=key.job_id,
                epoch=key.epoch,
                min_epoch=state.min_epoch,
            )

    def check_not_deleted(self, key: Partition) -> None:
        """Refuse a put of a key the store deleted (see :mod:`._tombstones`).

        Raises:
            LeaseExpiredError: the key is tombstoned.
        """
        if key in self._tombstones:
            raise LeaseExpiredError(
                f"put of group {fmt_key(key)} refused: this partition was deleted here (the controller "
                "gave it up: its put grant expired or the group was dropped); nothing was stored. Put the "
                "group again under a new partition from the controller",
                **key_fields(key),
            )

    def check_token(self, key: Partition, token: LeaseToken | None, what: str, *, required: bool) -> None:
        """Refuse ``what`` of ``key`` under a token older than the highest generation seen (or without a
        token, where one is ``required``).

        Raises:
            StaleFenceError: the token is missing or stale.
        """
        if token is None:
            if required:
                raise StaleFenceError(
                    f"{what} of group {fmt_key(key)} refused: it needs the holder's lease token; "
                    "acquire a lease",
                    generation=None,
                    highest=self._generation.get(key),
                )
            return
        highest = self._generation.get(key, -1)
        if token.generation < highest:
            raise StaleFenceError(
                f"{what} of group {fmt_key(key)} refused: lease generation {token.generation} is older "
                f"than generation {highest} already seen; the lease was re-granted: stop and re-acquire",
                generation=token.generation,
                highest=highest,
            )

    def check_schema(self, key: Partition, schema: pa.Schema) -> None:
        """Refuse columns whose type differs from the one the job stores them as.

        Raises:
            SchemaError: naming the column.
        """
        state = self._jobs.get(key.job_id)
        if state is None:
            return
        for f in schema:
            known = state.column_types.get(f.name)
            if known is not None and known != f.type:
                raise SchemaError(
                    f"column {echo(f.name)} of group {fmt_key(key)} has type {f.type}, but job "
                    f"{echo(key.job_id)} stores it as {known}; every group of a job uses one type per column",
                    column=f.name,
                )

    def admits(self, keys: Sequence[Partition]) -> bool:
        """Whether puts of every key pass the epoch fences and the tombstones (a batch's quick check)."""
        jobs = self._jobs
        for job_id, epoch in {key[:2] for key in keys}:  # the fence depends on the job and epoch only
            state = jobs.get(job_id)
            if state is not None and epoch < state.min_epoch:
                return False
        tombstones = self._tombstones
        return not any(key in tombstones for key in keys)

    # ----------------------------------------------------------------------------------------- changes

    def learn_columns(self, job_id: str, schema: pa.Schema) -> None:
        """Fix the type of every column of ``schema`` the job has not stored yet."""
        state = self._jobs.get(job_id)
        if state is None:
            state = self._jobs[job_id] = _JobState()
        for f in schema:
            state.column_types.setdefault(f.name, f.type)

    def installed(self, key: Partition) -> None:
        """The group ``key`` was stored or changed (an append): a new board tag at its generation, so
        readers holding its old parts ask the server again."""
        if self.board is not None:
            self.board.install(key, self._generation.get(key, -1))

    def raise_to(self, key: Partition, generation: int) -> bool:
        """Raise ``key``'s highest generation to ``generation`` (never lowers it), on the board too;
        whether it rose.

        The board is written first: a failure there leaves the store's memory of the group unchanged."""
        if generation <= self._generation.get(key, -1):
            return False
        if self.board is not None:
            self.board.raise_to(key, generation)
        self._generation[key] = generation
        return True

    def deleted(self, key: Partition, generation: int) -> None:
        """``key`` was deleted under ``generation`` (stored, being put or never seen): its generation is
        remembered, its key tombstoned (no put of it is kept), its board slot cleared."""
        self._generation[key] = max(generation, self._generation.get(key, -1))
        self._tombstones.add(key)
        if self.board is not None:
            self.board.remove(key)

    def purged(self, key: Partition) -> None:
        """The stored group ``key`` of a fenced epoch was dropped: nothing of it is remembered."""
        self._generation.pop(key, None)
        if self.board is not None:
            self.board.remove(key)

    def fence(self, job_id: str, min_epoch: int, stored: Container[Partition]) -> int:
        """Refuse puts of ``job_id``'s epochs below ``min_epoch`` (monotonic); returns the job's fence.

        The tombstones of fenced epochs go (the fence refuses their puts now), and so do the generations
        of their groups that are not ``stored``.
        """
        state = self._jobs.get(job_id)
        if state is None:
            state = self._jobs[job_id] = _JobState()
        state.min_epoch = max(state.min_epoch, min_epoch)
        self._tombstones.forget_below(job_id, state.min_epoch)
        for key in [k for k in self._generation if k.job_id == job_id and k.epoch < state.min_epoch]:
            if key not in stored:
                del self._generation[key]
        return state.min_epoch

    # ---------------------------------------------------------------------------------------- figures

    def job_figures(self, jobs: dict[str, Any]) -> None:
        """Add ``min_epoch`` and ``max_generation`` (a restore issues tokens above it) to the ``stats``
        entries of ``jobs``, making one for a job that holds no group."""
        for job_id, state in self._jobs.items():
            jobs.setdefault(job_id, {"groups": 0, "bytes": 0, "epochs": {}})["min_epoch"] = state.min_epoch
        for key, generation in self._generation.items():
            job = jobs.setdefault(key.job_id, {"groups": 0, "bytes": 0, "epochs": {}})
            job["max_generation"] = max(job.get("max_generation", 0), generation)

    def tombstone_figures(self) -> dict[str, int]:
        """The tombstones' counts for ``stats``."""
        return self._tombstones.stats()
