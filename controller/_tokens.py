"""Fencing tokens: one counter, ``incarnation << 32 | counter``, that only ever grows.

Each put grant and each lease takes the next value, so a group's generation strictly increases across
re-grants, and across restarts as long as the incarnation does (hosts persist it). This module keeps no
clock and knows nothing of what a token is given to.
"""

from __future__ import annotations

__all__ = ["COUNTER_BITS", "Tokens"]

COUNTER_BITS = 32
"""Bits of the counter below the incarnation."""


class Tokens:
    """The token counter of one ledger.

    Args:
        incarnation: The first token issued is ``(incarnation << 32) + 1``.
    """

    __slots__ = ("counter", "incarnation")

    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation
        self.counter = 0

    @property
    def last(self) -> int:
        """The newest token issued (``incarnation << 32`` before any of this incarnation)."""
        return (self.incarnation << COUNTER_BITS) | self.counter

    def next(self) -> int:
        """Issue the next token (a full counter starts the next incarnation)."""
        self.counter += 1
        if self.counter >= 1 << COUNTER_BITS:
            self.incarnation += 1
            self.counter = 1
        return (self.incarnation << COUNTER_BITS) | self.counter

    def restart(self, incarnation: int) -> None:
        """Start ``incarnation`` (larger than the current one, checked by the caller) from counter 0."""
        self.incarnation, self.counter = incarnation, 0

    def raise_above(self, floor: int) -> None:
        """Make every token issued from now on larger than ``floor`` (a restore's newest known token)."""
        if self.last < floor:
            self.restart((floor >> COUNTER_BITS) + 1)
