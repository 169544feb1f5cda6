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

__all__ = ["BOARD_FILE", "FenceBoard", "MappedBoard", "read_board"]

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
    """Whether every ``(slot, tag)`` still holds its tag at exactly the matching generation.

    The tags are read before and after the generations (vectorised): a slot that changed in between does
    not match. False means "ask the server", never "refused".
    """
    if not entries or not board.current():
        return False
    if len(entries) <= _SCALAR_READS:  # a few groups: plain reads beat numpy's fixed costs (~30 us)
        words, rows = board.flat, len(board.words)
        for (slot, tag), generation in zip(entries, generations, strict=True):
            if not 0 <= slot < rows:
                return False
            at = slot * _WORDS
            if words[at] != tag or words[at + 1] != generation or words[at] != tag:
                return False
        return True
    slots = np.fromiter((s for s, _ in entries), dtype=np.int64, count=len(entries))
    if slots.min() < 0 or slots.max() >= len(board.words):
        return False
    tags = np.fromiter((t for _, t in entries), dtype=np.int64, count=len(entries))
    want = np.asarray(generations, dtype=np.int64)
    before = board.words[slots, 0]
    seen = board.words[slots, 1]
    after = board.words[slots, 0]
    return bool(np.array_equal(before, tags) and np.array_equal(after, tags) and np.array_equal(seen, want))
