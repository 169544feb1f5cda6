"""Small picklable metadata handles: what an RL framework routes work with (like TransferQueue's BatchMeta).

A :class:`~trajflight.controller.GroupInfo` describes one stored group (where it lives, its rows, bytes,
tokens, columns, state and fencing generation); a :class:`BatchHandle` describes some leased groups
(a whole lease or a shard of it) plus the column projection to read. A driver splits a handle per rank
(balanced by token count), concatenates or projects it, and ships it to worker processes, which read
their shard straight from the storage servers under the lease's token with :func:`trajflight.fetch`.

Handles are immutable snapshots: they do not follow the lease's state (the controller is the truth).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from trajflight.controller import GroupInfo, Partition
from trajflight.errors import InvalidRequestError

__all__ = ["BatchHandle"]


@dataclass(frozen=True, slots=True)
class BatchHandle:
    """Leased groups to read, and under which lease: picklable, splittable, projectable.

    Attributes:
        job_id: The job.
        token: The lease's fencing token; commits and transitions use it.
        groups: The groups, in order.
        columns: Columns to read (``None``: all).
        expires_at: Controller time at which the lease expires unless renewed (as of this handle).
    """

    job_id: str
    token: int
    groups: tuple[GroupInfo, ...]
    columns: tuple[str, ...] | None = None
    expires_at: float = 0.0

    @property
    def rows(self) -> int:
        """Samples in the handle."""
        return sum(g.rows for g in self.groups)

    @property
    def tokens(self) -> int:
        """Tokens in the handle."""
        return sum(g.tokens for g in self.groups)

    @property
    def nbytes(self) -> int:
        """Bytes stored for the handle's groups (before projection)."""
        return sum(g.nbytes for g in self.groups)

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """The groups' partitions, in order."""
        return tuple(g.partition for g in self.groups)

    def select(self, columns: Iterable[str]) -> BatchHandle:
        """The same groups, reading only ``columns``.

        Raises:
            InvalidRequestError: a column is not carried by every group of the handle.
        """
        wanted = tuple(columns)
        for g in self.groups:
            missing = [c for c in wanted if c not in g.columns]
            if missing:
                raise InvalidRequestError(
                    f"group {tuple(g.partition)} does not carry columns {missing}; lease groups that have "
                    "them (require=...) or project to columns every group carries"
                )
        return replace(self, columns=wanted)

    def split(self, n: int) -> list[BatchHandle]:
        """Split into ``n`` shards balanced by token count (whole groups; largest first onto the lightest).

        Shards keep the lease's token and the projection; each shard's groups keep their lease order.
        Some shards are empty when there are fewer groups than ``n``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise InvalidRequestError(f"split needs a positive number of shards, got {n!r}")
        heap = [(0, rank) for rank in range(n)]
        assigned: list[list[int]] = [[] for _ in range(n)]
        order = sorted(range(len(self.groups)), key=lambda i: -self.groups[i].tokens)
        for i in order:
            load, rank = heapq.heappop(heap)
            assigned[rank].append(i)
            heapq.heappush(heap, (load + self.groups[i].tokens, rank))
        return [replace(self, groups=tuple(self.groups[i] for i in sorted(idx))) for idx in assigned]

    @staticmethod
    def concat(handles: Sequence[BatchHandle]) -> BatchHandle:
        """Join shards of one lease (same job, token and projection) back into one handle.

        Raises:
            InvalidRequestError: no handles, or handles of different leases or projections.
        """
        if not handles:
            raise InvalidRequestError("concat needs at least one handle")
        first = handles[0]
        for h in handles[1:]:
            if (h.job_id, h.token, h.columns) != (first.job_id, first.token, first.columns):
                raise InvalidRequestError(
                    "concat joins shards of one lease with one projection; got tokens "
                    f"{first.token} and {h.token}, columns {first.columns} and {h.columns}"
                )
        groups = tuple(g for h in handles for g in h.groups)
        return replace(first, groups=groups, expires_at=min(h.expires_at for h in handles))
