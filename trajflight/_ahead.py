"""A writer's grants made ahead: what its next ``put`` may use instead of asking the controller.

A put publishes with ``publish_ahead``, which grants the writer's next partition in the same controller
operation, so a steady-state put makes one controller call instead of two (issue 16). :class:`Ahead`
keeps those grants, and the size to ask for next: the largest of the writer's last few reservations
(:mod:`trajflight._sizing`'s bounds of its inputs), so a group of the usual sizes fits the grant held.

A held grant is charged on the controller like any grant. It is used only while less than half its
lifetime has passed by this process's clock (the rest is left to the put: a put slower than that may
find the grant expired at publish, as a slow put with a fresh grant does); a grant too small for a group
stays held for a later one, and one past its half-life is dropped (it expires on the controller, which
garbage-collects its partition). A new epoch drops the held grants on the controller: a put with one is
refused with ``StaleFenceError``, as any put of a fenced writer is. A job with ``strict_on_policy`` gets
no grant ahead (the controller's rule), so its writers allocate every put. It keeps no grant across
processes.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from trajflight.controller import PutGrant

__all__ = ["Ahead"]

RECENT = 8
"""How many of the writer's last reservations the size asked for ahead covers."""


@dataclass(frozen=True, slots=True)
class _Held:
    grant: PutGrant
    usable_until: float  # time.monotonic() after which it is not used


class Ahead:
    """The grants a writer holds ahead, and the size of the next one to ask for. Thread-safe."""

    __slots__ = ("_held", "_lock", "_recent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._recent: collections.deque[int] = collections.deque(maxlen=RECENT)

    def take(self, nbytes: int) -> PutGrant | None:
        """A held grant of at least ``nbytes`` within its half-life, no longer held; ``None`` if none is
        (the caller allocates). Grants past their half-life are dropped."""
        now = time.monotonic()
        with self._lock:
            self._held = [h for h in self._held if h.usable_until > now]
            for i, held in enumerate(self._held):
                if held.grant.nbytes >= nbytes:
                    del self._held[i]
                    return held.grant
        return None

    def request(self, reserved: int) -> list[int]:
        """Note a put's reservation; the sizes to ask for ahead with its publication: one, the largest
        of the recent reservations, when no grant is held (else none)."""
        with self._lock:
            self._recent.append(reserved)
            return [] if self._held else [max(self._recent)]

    def hold(self, grants: tuple[PutGrant, ...], granted_at: float) -> None:
        """Keep ``grants``, received now, made at ledger time ``granted_at`` (``Published``'s)."""
        now = time.monotonic()
        with self._lock:
            for grant in grants:
                self._held.append(_Held(grant, now + (grant.expires_at - granted_at) / 2))

    def release(self) -> list[PutGrant]:
        """Every held grant, no longer held (for the caller to abandon)."""
        with self._lock:
            held, self._held = self._held, []
        return [h.grant for h in held]
