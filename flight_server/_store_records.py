"""The records of the group store: a stored group, the store's bounds, one in-flight reservation, and
how messages name a group.

Below both the store (:mod:`._store`) and its shared-memory collaborator (:mod:`.shm._store`), which
build and account these records; a :class:`StoredGroup` is generic in what its parts are placed in (an
arena's segments), so this module knows nothing of the arena. They do no I/O; a :class:`Reservation`
calls back into its :class:`Accounting` (the store) to account capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from trajflight.errors import InvalidRequestError
from trajflight.flight_server._wire_bounds import echo
from trajflight.keys import Partition

__all__ = ["Accounting", "Reservation", "StoreLimits", "StoredGroup", "fmt_key", "key_fields"]

P = TypeVar("P")
"""Where a stored group's parts are placed: the arena's segments (:class:`~.shm._segment.Segment`)."""


def fmt_key(key: Partition) -> str:
    """A group key for messages: ``('job', epoch 1, group 5)`` (a long job id cut, see ``echo``)."""
    return f"({echo(key.job_id)}, epoch {key.epoch}, group {key.group_id})"


def key_fields(key: Partition) -> dict[str, Any]:
    """A group key as error fields."""
    return {"job_id": key.job_id, "epoch": key.epoch, "group_id": key.group_id}


@dataclass(frozen=True, slots=True)
class StoredGroup(Generic[P]):
    """One published group: immutable; an append publishes a new one.

    Attributes:
        key: The partition.
        parts: Tables over the stored streams; the first holds the put, the rest appended columns. A group
            put in a batch that shares one stream (one segment) holds that whole stream as its first part:
            its rows start at ``offsets[0]``.
        part_bytes: Bytes held by each part (buffer sizes; a shared stream's groups each count a share).
        view: The group's rows over its parts (see :attr:`table`), or None where the group is the ``rows``
            rows of ``parts[0]`` from ``offsets[0]`` (a batch member: sliced on first use, so publishing a
            batch costs no slice per group).
        writer: The writer id given at put.
        created: Monotonic publish time.
        segments: Where each part is placed: its arena segment (empty without an arena).
        offsets: Per part, its first row in its segment's stream (a batch of groups shares one stream).
        starts: Per part, the byte offset of its stream in its segment (small groups share a slab).
        rows: The group's samples where ``view`` is None (else unused).
    """

    key: Partition
    parts: tuple[pa.Table, ...]
    part_bytes: tuple[int, ...]
    view: pa.Table | None
    writer: str = ""
    created: float = 0.0
    segments: tuple[P, ...] = ()
    offsets: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    rows: int = 0

    @property
    def table(self) -> pa.Table:
        """Zero-copy view of the group over its parts (what ``do_get`` streams). Aliases the stored
        buffers: never write through it (``torch.from_dlpack`` ignores Arrow's read-only flag)."""
        view = self.view
        if view is None:
            # Slicing is idempotent: two threads racing here build equal views and either one is kept.
            view = self.parts[0].slice(self.offsets[0], self.rows)
            object.__setattr__(self, "view", view)
        return view

    @property
    def schema(self) -> pa.Schema:
        """The group's columns (without slicing a batch member's table)."""
        view = self.view
        return self.parts[0].schema if view is None else view.schema

    def row_offset(self, part: int) -> int:
        """First row of part ``part`` in its segment's stream (non-zero when a batch shares a segment)."""
        return self.offsets[part] if part < len(self.offsets) else 0

    def start(self, part: int) -> int:
        """Byte offset of part ``part``'s stream in its segment (non-zero in a slab of small groups)."""
        return self.starts[part] if part < len(self.starts) else 0

    @property
    def nbytes(self) -> int:
        """Bytes held (sum over parts): what capacity counts."""
        return sum(self.part_bytes)

    @property
    def num_rows(self) -> int:
        """Samples in the group."""
        view = self.view
        return self.rows if view is None else int(view.num_rows)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Bounds of one store.

    Attributes:
        capacity_bytes: Bytes held plus reserved by in-flight puts/appends.
        capacity_groups: Groups held plus in-flight puts.
        max_group_bytes: Largest single put or append (refused as invalid: retrying cannot help).
        retry_after: Hint (seconds) carried by :class:`CapacityExceededError`.
    """

    capacity_bytes: int = 8 * 2**30
    capacity_groups: int = 1_000_000
    max_group_bytes: int = 2**31
    retry_after: float = 1.0

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "capacity_groups", "max_group_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidRequestError(f"StoreLimits.{name} must be a positive int, got {value!r}")
        if self.retry_after < 0:
            raise InvalidRequestError(f"StoreLimits.retry_after must be >= 0, got {self.retry_after!r}")


class Accounting(Protocol):
    """Where a :class:`Reservation` counts its bytes: the group store's capacity."""

    def reserve_bytes(self, res: Reservation, nbytes: int) -> None:
        """Count ``nbytes`` more for ``res``; raises CapacityExceededError or InvalidRequestError."""

    def release_reservation(self, res: Reservation) -> None:
        """Give back everything ``res`` holds (its bytes, its group slot)."""


@dataclass(slots=True)
class Reservation:
    """Capacity held by one in-flight put or append; release it (context manager) on any failure.

    Attributes:
        key: The group being written.
        counts_group: Whether it holds a group slot (a put) or only bytes (an append).
        reserved: Bytes reserved so far.
        received: Payload bytes received so far.
    """

    store: Accounting
    key: Partition
    counts_group: bool
    reserved: int = 0
    received: int = 0
    done: bool = False

    def grow(self, nbytes: int) -> None:
        """Account ``nbytes`` more received; reserves more capacity when needed.

        Raises:
            InvalidRequestError: the write exceeds ``max_group_bytes``.
            CapacityExceededError: the store is full (with ``retry_after``); nothing is kept.
        """
        self.received += nbytes
        if self.received > self.reserved:
            self.store.reserve_bytes(self, self.received - self.reserved)

    def reserve(self, nbytes: int) -> None:
        """Reserve ``nbytes`` up front (a size announced by the writer); raises like :meth:`grow`."""
        self.store.reserve_bytes(self, nbytes)

    def release(self) -> None:
        """Give the reservation back (idempotent)."""
        if not self.done:
            self.done = True
            self.store.release_reservation(self)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
