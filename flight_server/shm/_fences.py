"""The fence board: each stored group's lease generation, published in shared memory for same-host readers.

A storage server with an arena keeps one file, ``<arena>/fences``: an array of slots of two little-endian
int64 words, ``(tag, generation)``. A stored group holds one slot while it is stored; its *tag* is unique for
the server's life (a counter with a random 32-bit start) and changes whenever the group does (an append);
its *generation* is the highest lease generation the server has seen for it. The server writes the board
under its store lock, generation first and tag last on install, tag first on removal.

A same-host reader that opened a lease's segments (``shm_open``, which raises the groups' generations to
the lease's and answers each group's ``[slot, tag]``) can then check a later read of the same groups
without a call: the read is still valid exactly when the slot still carries the group's tag and the lease's
generation (:func:`read_board`). Anything else (a newer generation: the lease was re-granted; another tag:
the group was deleted or appended to; a board file replaced by a restarted server) sends the reader back
to the server (``shm_open`` again), which answers with the precise error or the group's new parts. A wrong
"no" costs one call; a "yes" needs both tag reads and the generation to agree.

The board is advisory for same-host readers only: every write path (puts, appends, deletes) is fenced by
the server as before. It does not guarantee anything after the server died without restarting (its last
board stays readable; a reader then reads what it had already mapped).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import sys
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["BOARD_FILE", "BoardQuery", "FenceBoard", "MappedBoard", "read_board"]

BOARD_FILE = "fences"
_WORDS = 2  # tag, generation
_SCALAR_READS = 8 if sys.byteorder == "little" else 0  # reads checked word by word (the board is "<i8")


class FenceBoard:
    """The server side: slots assigned to stored groups, written under the caller's lock (not thread-safe
    on its own).

    Args:
        directory: The arena's private directory; the board file there is replaced.
        slots: Groups that can hold a slot at once; groups beyond it get none (their readers always ask
            the server). The file is sparse: untouched slots take no memory.
    """

    def __init__(self, directory: str, slots: int = 1 << 18) -> None:
        self.path = os.path.join(directory, BOARD_FILE)
        self.slots = slots
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a dead incarnation's board: readers that mapped it see the inode change
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, slots * _WORDS * 8)
            self._mm: mmap.mmap | None = mmap.mmap(fd, slots * _WORDS * 8, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._words = np.frombuffer(self._mm, dtype="<i8").reshape(slots, _WORDS)
        self._held: dict[Hashable, tuple[int, int]] = {}  # key -> (slot, tag)
        self._free = list(range(slots - 1, -1, -1))
        self._next_tag = (secrets.randbits(31) << 32) + 1

    def install(self, key: Hashable, generation: int) -> None:
        """Give ``key`` a slot with a new tag (or a new tag in its slot: the group changed)."""
        held = self._held.get(key)
        if held is not None:
            slot = held[0]
        elif self._free:
            slot = self._free.pop()
        else:
            return  # board full: this group's readers ask the server
        tag, self._next_tag = self._next_tag, self._next_tag + 1
        self._words[slot, 0] = 0  # readers of the old tag stop matching before the generation moves
        self._words[slot, 1] = generation
        self._words[slot, 0] = tag
        self._held[key] = (slot, tag)

    def raise_to(self, key: Hashable, generation: int) -> None:
        """Publish a new highest generation of ``key`` (no-op without a slot)."""
        held = self._held.get(key)
        if held is not None:
            self._words[held[0], 1] = generation

    def remove(self, key: Hashable) -> None:
        """The group is gone: clear and free its slot."""
        held = self._held.pop(key, None)
        if held is not None:
            self._words[held[0], 0] = 0
            self._words[held[0], 1] = -1
            self._free.append(held[0])

    def entry(self, key: Hashable) -> tuple[int, int] | None:
        """``(slot, tag)`` of ``key`` for a reader, or None."""
        return self._held.get(key)

    def close(self) -> None:
        """Clear every slot (readers fall back to the server, which is going away) and unmap."""
        if self._mm is None:
            return
        self._words[:, 0] = 0
        self._held.clear()
        del self._words
        self._mm.close()
        self._mm = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class MappedBoard:
    """A reader's read-only mapping of a server's board file (one per server, kept by the client).

    Raises:
        OSError: the file cannot be opened (the server is gone).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self.inode = os.fstat(fd).st_ino
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.words = np.frombuffer(mm, dtype="<i8").reshape(size // (8 * _WORDS), _WORDS)
        self.flat = memoryview(mm).cast("q")  # the same words, read one by one without numpy

    def current(self) -> bool:
        """Whether the path still names this file (a restarted server replaces it)."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False


def read_board(board: MappedBoard, entries: Sequence[tuple[int, int]], generations: Sequence[int]) -> bool:
    """Whether every ``(slot, tag)`` still holds its tag at exactly the matching generation (see
    :class:`BoardQuery`, which prepares the same check once for repeated reads)."""
    return BoardQuery(entries, generations).matches(board)


class BoardQuery:
    """What a reader checks on a board for a set of groups: ``(slot, tag)`` and generation per group,
    prepared once (a trainer reads its lease several times).

    Args:
        entries: ``(slot, tag)`` per group, as ``shm_open`` gave them.
        generations: The reader's lease generation per group.
    """

    __slots__ = ("_generations", "_high", "_items", "_low", "_slots", "_tags")

    def __init__(self, entries: Sequence[tuple[int, int]], generations: Sequence[int]) -> None:
        self._items = [
            (slot * _WORDS, tag, gen) for (slot, tag), gen in zip(entries, generations, strict=True)
        ]
        slots = [slot for slot, _ in entries]
        self._low, self._high = (min(slots), max(slots)) if slots else (0, -1)
        many = len(slots) > _SCALAR_READS  # checked with numpy: the arrays once, here
        self._slots = np.asarray(slots if many else (), dtype=np.int64)
        self._tags = np.asarray([tag for _, tag in entries] if many else (), dtype=np.int64)
        self._generations = np.asarray(generations if many else (), dtype=np.int64)

    def matches(self, board: MappedBoard) -> bool:
        """Whether every slot still holds its tag at exactly the matching generation, on the board file
        the path names now.

        Each slot's tag is read before and after its generation: a slot that changed in between does not
        match. False means "ask the server", never "refused".
        """
        if not self._items or not board.current() or self._low < 0 or self._high >= len(board.words):
            return False
        if len(self._items) <= _SCALAR_READS:  # a few groups: plain reads beat numpy's fixed costs
            words = board.flat
            for at, tag, generation in self._items:
                if words[at] != tag or words[at + 1] != generation or words[at] != tag:
                    return False
            return True
        before = board.words[self._slots, 0]  # every tag, then every generation, then every tag again
        seen = board.words[self._slots, 1]
        after = board.words[self._slots, 0]
        return bool(
            np.array_equal(before, self._tags)
            and np.array_equal(after, self._tags)
            and np.array_equal(seen, self._generations)
        )
