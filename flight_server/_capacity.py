"""Capacity accounting of the group store: bytes held and reserved, against the store's bounds.

Capacity counts buffer sizes (``get_total_buffer_size`` of received batches, or segment sizes in an arena;
Arrow's memory pool does not see buffers received by Flight) and what in-flight puts and appends have
reserved; group slots count the groups stored plus the puts in flight. A refusal is a
:class:`~trajflight.errors.CapacityExceededError` carrying ``retry_after`` (retrying can help), or an
:class:`~trajflight.errors.InvalidRequestError` for a single group over ``max_group_bytes`` (it cannot).

:class:`Capacity` counts and refuses; it is not thread-safe: the group store (:mod:`._store`) calls it under
its own lock, and owns the maps the counts are of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajflight.errors import CapacityExceededError, InvalidRequestError
from trajflight.flight_server._store_records import Reservation, StoreLimits, fmt_key
from trajflight.units import format_size

__all__ = ["Capacity"]


class Capacity:
    """The bytes a store holds and has reserved, within its :class:`StoreLimits`.

    Args:
        limits: The store's bounds.
    """

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self.held_bytes = 0
        """Bytes of the stored groups."""
        self.reserved_bytes = 0
        """Bytes reserved by puts and appends in flight."""

    def reserve(self, res: Reservation, nbytes: int, stranded: int) -> None:
        """Reserve ``nbytes`` more for ``res``; ``stranded``: bytes of the arena no group counts any more
        (they occupy it all the same, so they count as used).

        Raises:
            InvalidRequestError: the group would exceed ``max_group_bytes``.
            CapacityExceededError: the store is full (with ``retry_after``); nothing is reserved.
        """
        limits = self.limits
        if res.reserved + nbytes > limits.max_group_bytes:
            raise InvalidRequestError(
                f"group {fmt_key(res.key)}: {format_size(res.reserved + nbytes)} exceeds the server's "
                f"max_group_bytes of {format_size(limits.max_group_bytes)}; split the group or raise the "
                "limit",
                nbytes=res.reserved + nbytes,
                limit=limits.max_group_bytes,
            )
        used = self.held_bytes + self.reserved_bytes + stranded
        if used + nbytes > limits.capacity_bytes:
            raise CapacityExceededError(
                f"server full: {format_size(used)} of {format_size(limits.capacity_bytes)} used, "
                f"{format_size(nbytes)} more needed for group {fmt_key(res.key)}; retry after "
                f"{limits.retry_after:g}s (trainers free space as they commit)",
                retry_after=limits.retry_after,
                needed_bytes=nbytes,
                free_bytes=max(0, limits.capacity_bytes - used),
            )
        self.reserved_bytes += nbytes
        res.reserved += nbytes

    def release(self, res: Reservation) -> None:
        """Give back the bytes ``res`` reserved."""
        self.reserved_bytes -= res.reserved
        res.reserved = 0

    def check_slot(self, groups: int) -> None:
        """Refuse one more group when ``groups`` (stored plus in flight) fill every slot.

        Raises:
            CapacityExceededError: with ``retry_after``.
        """
        limits = self.limits
        if groups >= limits.capacity_groups:
            raise CapacityExceededError(
                f"server full: {groups} of {limits.capacity_groups} groups held or in flight; retry after "
                f"{limits.retry_after:g}s",
                retry_after=limits.retry_after,
            )

    def fits(self, groups: int, announced: Sequence[int], stranded: int) -> bool:
        """Whether ``len(announced)`` more groups (``groups`` stored or in flight already) fit, each and
        all their announced bytes too (a batch's quick check; the refusal itself is :meth:`reserve`'s)."""
        limits = self.limits
        return (
            groups + len(announced) <= limits.capacity_groups
            and max(announced) <= limits.max_group_bytes
            and min(announced) >= 0
            and self.held_bytes + self.reserved_bytes + stranded + sum(announced) <= limits.capacity_bytes
        )

    def figures(self) -> dict[str, Any]:
        """The capacity counts of ``stats``."""
        limits = self.limits
        return {
            "bytes": self.held_bytes,
            "reserved_bytes": self.reserved_bytes,
            "capacity_bytes": limits.capacity_bytes,
            "capacity_groups": limits.capacity_groups,
            "free_bytes": limits.capacity_bytes - self.held_bytes - self.reserved_bytes,
        }
