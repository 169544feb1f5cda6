"""The READY index of one job: what ``acquire`` takes from, in time proportional to what it takes.

READY groups live in FIFO buckets keyed by ``(policy_version, columns)``. A request (a staleness bound,
required and lacking columns, a token budget) selects the eligible buckets (there are few: one per live
policy version and column set) and merges their heads, oldest first. Entries are removed lazily: a group
that left READY some other way leaves a stale entry that is skipped (and dropped) when reached, so the
cost of an acquire is O(groups taken + stale entries skipped + buckets), never O(READY groups).

Groups given back after an expiry or a requeue go to the *front* of their bucket (they are the oldest
data); among themselves the most recently returned comes first.

This module does not know group states; the caller says which entries are still valid.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["ReadyIndex"]

K = TypeVar("K")

BucketKey = tuple[int, frozenset[str]]


class ReadyIndex(Generic[K]):
    """FIFO buckets of READY group keys with lazy deletion.

    Args:
        is_valid: ``is_valid(key, seq)`` tells whether an entry still stands for a READY group (the
            caller stores the ``seq`` returned by :meth:`push` with its group).
    """

    __slots__ = ("_back", "_buckets", "_front", "_is_valid")

    def __init__(self, is_valid: Callable[[K, int], bool]) -> None:
        self._buckets: dict[BucketKey, deque[tuple[int, K]]] = {}
        self._back = 0
        self._front = 0
        self._is_valid = is_valid

    def push(self, key: K, policy_version: int, columns: frozenset[str], *, front: bool = False) -> int:
        """Index ``key`` as READY and return its sequence number (store it with the group)."""
        bucket = self._buckets.get((policy_version, columns))
        if bucket is None:
            bucket = self._buckets[(policy_version, columns)] = deque()
        if front:
            self._front -= 1
            bucket.appendleft((self._front, key))
            return self._front
        self._back += 1
        bucket.append((self._back, key))
        return self._back

    def _eligible(
        self,
        min_version: int | None,
        exact_version: int | None,
        require: frozenset[str],
        lack: frozenset[str],
    ) -> list[BucketKey]:
        out = []
        for bkey in self._buckets:
            version, columns = bkey
            if exact_version is not None and version != exact_version:
                continue
            if min_version is not None and version < min_version:
                continue
            if require and not require <= columns:
                continue
            if lack and not lack.isdisjoint(columns):
                continue
            out.append(bkey)
        return out

    def _head(self, bkey: BucketKey) -> tuple[int, K] | None:
        bucket = self._buckets[bkey]
        while bucket:
            seq, key = bucket[0]
            if self._is_valid(key, seq):
                return seq, key
            bucket.popleft()
        return None

    def take(
        self,
        max_groups: int,
        *,
        min_version: int | None = None,
        exact_version: int | None = None,
        require: frozenset[str] = frozenset(),
        lack: frozenset[str] = frozenset(),
        max_tokens: int | None = None,
        tokens_of: Callable[[K], int] | None = None,
        skip: Callable[[K], bool] | None = None,
    ) -> list[K]:
        """Remove and return up to ``max_groups`` eligible keys, oldest first.

        Args:
            max_groups: Most keys to take.
            min_version: Only groups with at least this policy version.
            exact_version: Only groups with exactly this policy version.
            require: Only groups that carry all these columns.
            lack: Only groups that carry none of these columns.
            max_tokens: Stop before the total of ``tokens_of`` would exceed it; a first group larger than
                the whole budget is still taken alone, so that no group becomes unleasable.
            tokens_of: Token count of a key (needed with ``max_tokens``).
            skip: Keys for which it returns True are removed from the index and not taken (the caller
                keeps them, e.g. groups of a storage server in back-off; they cost one call each).
        """
        eligible = self._eligible(min_version, exact_version, require, lack)
        taken: list[K] = []
        total = 0
        while len(taken) < max_groups and eligible:
            best: BucketKey | None = None
            best_seq = 0
            for bkey in list(eligible):
                head = self._head(bkey)
                if head is None:
                    eligible.remove(bkey)
                    del self._buckets[bkey]
                    continue
                if best is None or head[0] < best_seq:
                    best, best_seq = bkey, head[0]
            if best is None:
                break
            key = self._buckets[best][0][1]
            if skip is not None and skip(key):
                self._buckets[best].popleft()
                continue
            if max_tokens is not None and tokens_of is not None:
                cost = tokens_of(key)
                if taken and total + cost > max_tokens:
                    break
                total += cost
            self._buckets[best].popleft()
            taken.append(key)
            if max_tokens is not None and total >= max_tokens:
                break
        return taken

    def entries(self) -> Iterator[K]:
        """Every valid entry, bucket by bucket (for queries and checkpoints; O(READY groups))."""
        for bucket in self._buckets.values():
            for seq, key in bucket:
                if self._is_valid(key, seq):
                    yield key

    def __len__(self) -> int:
        """Entries held, stale ones included (an upper bound on READY groups)."""
        return sum(len(b) for b in self._buckets.values())
