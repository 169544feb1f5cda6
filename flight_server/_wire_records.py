"""The records of the storage server's wire (descriptors, tickets, action bodies).

Plain frozen dataclasses, validated where they are decoded (:mod:`._wire`, which also encodes them and
re-exports every name here). ``docs/wire-format.md`` is the reference.

This module does no I/O and does not validate field values (the decoders do).
"""

from __future__ import annotations

from dataclasses import dataclass

from trajflight.keys import Partition

__all__ = [
    "WIRE_VERSION",
    "AppendDescriptor",
    "DeleteRequest",
    "FenceRequest",
    "GenerationRequest",
    "GetTicket",
    "GroupRead",
    "LeaseToken",
    "ListCriteria",
    "PutDescriptor",
    "PutManyDescriptor",
    "ShmAbortRequest",
    "ShmBatchPublishRequest",
    "ShmBatchReserveRequest",
    "ShmPublishRequest",
    "ShmReserveRequest",
]


WIRE_VERSION = 1
"""The only wire version this build speaks; a message with another ``"v"`` is refused."""


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """The fencing token of a lease on one group.

    Attributes:
        generation: The lease generation; strictly increases per group across re-grants. Servers refuse
            a token lower than the highest generation they have seen for the group.
    """

    generation: int


@dataclass(frozen=True, slots=True)
class PutDescriptor:
    """A ``do_put`` of a whole group: the partition plus the writer's credentials.

    Attributes:
        key: The partition ``(job_id, epoch, group_id)``.
        writer: Free-form writer id, for logs and stats.
        nbytes: Announced payload size (trajflight's client: the IPC size of the batches it sends, an
            upper bound of what the server holds); lets the server refuse an oversized or over-capacity put
            before any payload arrives. Optional.
        num_rows: Announced row count; when given, a stream that ends with fewer rows is refused.
    """

    key: Partition
    writer: str = ""
    nbytes: int | None = None
    num_rows: int | None = None


@dataclass(frozen=True, slots=True)
class PutManyDescriptor:
    """A ``do_put`` of several whole groups in one stream, published all together or not at all.

    The stream carries the groups in this order, each as one or more batches of its own (no batch holds
    rows of two groups); ``num_rows`` of every group is required to find the boundaries.

    Attributes:
        puts: One :class:`PutDescriptor` per group (``num_rows`` required; their ``writer`` is ignored).
        writer: Free-form writer id.
    """

    puts: tuple[PutDescriptor, ...]
    writer: str = ""


@dataclass(frozen=True, slots=True)
class AppendDescriptor:
    """A ``do_put`` that adds columns to a stored group, under the holder's lease token.

    Attributes:
        key: The stored group.
        token: The holder's lease token; refused when lower than the highest generation seen.
        nbytes: Announced size of the new columns, optional.
    """

    key: Partition
    token: LeaseToken
    nbytes: int | None = None


@dataclass(frozen=True, slots=True)
class GroupRead:
    """One group named by a ticket, with the reader's lease token when the group is leased."""

    key: Partition
    token: LeaseToken | None = None


@dataclass(frozen=True, slots=True)
class GetTicket:
    """A ``do_get`` ticket: groups (streamed in this order) and an optional column projection.

    Attributes:
        groups: The groups; at least one.
        columns: Column names to stream, in this order; None streams every column.
    """

    groups: tuple[GroupRead, ...]
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ListCriteria:
    """``list_flights`` filter; None matches everything."""

    job_id: str | None = None
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """Body of the ``delete`` action: groups with the deleter's lease tokens."""

    groups: tuple[GroupRead, ...]


@dataclass(frozen=True, slots=True)
class FenceRequest:
    """Body of the ``fence`` action: refuse puts of every epoch of ``job_id`` below ``min_epoch``.

    Attributes:
        purge: Also delete stored groups of the fenced epochs and give their bytes back.
    """

    job_id: str
    min_epoch: int
    purge: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Body of the ``advance_generation`` action: the controller raises the fence of groups it re-granted.

    Each entry's token carries the new generation.
    """

    groups: tuple[GroupRead, ...]


@dataclass(frozen=True, slots=True)
class ShmReserveRequest:
    """Body of the ``shm_reserve`` action: a same-node writer asks for segments to write groups into.

    Attributes:
        puts: One :class:`PutDescriptor` per group; ``nbytes`` (the IPC stream's size) is required.
        writer: Free-form writer id.
        ttl: Seconds the writer has to publish before the reservation is dropped (None: the server's).
        batch_bytes: When given, one segment of this many bytes for all the groups, written as one IPC
            stream in the listed order (``num_rows`` required per group, ``nbytes`` not); readers of the
            groups in that order get them with no copy to join them.
    """

    puts: tuple[PutDescriptor, ...]
    writer: str = ""
    ttl: float | None = None
    batch_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ShmBatchReserveRequest:
    """Body of ``shm_reserve`` in its compact batch form: groups of one job and epoch written as one IPC
    stream into one shared segment, answered with one reservation for the whole batch.

    It admits exactly the groups a :class:`ShmReserveRequest` with ``batch_bytes`` names (same checks,
    same capacity), but travels as a few arrays instead of an object per group, and its result is one
    segment and one reservation instead of a copy of them per group.

    Attributes:
        job_id: The groups' job.
        epoch: The groups' epoch.
        group_ids: The groups in stream order (at least one, each once).
        rows: Each group's row count (> 0), in the same order.
        batch_bytes: Size of the shared segment: the stream's size (> 0).
        writer: Free-form writer id.
        ttl: Seconds the writer has to publish before the reservation is dropped (None: the server's).
    """

    job_id: str
    epoch: int
    group_ids: tuple[int, ...]
    rows: tuple[int, ...]
    batch_bytes: int
    writer: str = ""
    ttl: float | None = None

    def keys(self) -> list[Partition]:
        """The groups' partition keys, in stream order."""
        job_id, epoch = self.job_id, self.epoch
        return [Partition(job_id, epoch, g) for g in self.group_ids]


@dataclass(frozen=True, slots=True)
class ShmPublishRequest:
    """Body of the ``shm_publish`` action: ``(reservation, stream size)`` per written group."""

    items: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ShmBatchPublishRequest:
    """Body of ``shm_publish`` in its compact batch form: the one reservation of a
    :class:`ShmBatchReserveRequest` and the size of the stream written (publishes every group of it)."""

    reservation: str
    size: int


@dataclass(frozen=True, slots=True)
class ShmAbortRequest:
    """Body of the ``shm_abort`` action: reservations the writer gives up."""

    reservations: tuple[str, ...]
