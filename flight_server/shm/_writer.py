"""A same-host writer's side of shared-memory puts: IPC streams written into the server's segment files.

The arena reuses its segments (:mod:`._arena`), so a writer that puts batches of a similar size again and
again is handed the same few files. Copying into a mapping this process already holds runs at memory
speed, faster than ``write(2)`` into the file; mapping a file costs more than either (filling its page
tables; BENCHMARKS.md, *Transport*). So :class:`SegmentWriter` writes a segment it sees for the first time
with ``write(2)``, and maps one it is handed again, keeping that mapping for the next time: a one-off
segment costs no mapping, a reused one is mapped once.

A kept mapping references the file's pages. When the server unlinks a segment (it trims its pool, or
drops a segment whose writer never published), those pages stay allocated in tmpfs until the mapping
goes. So the writer keeps a bounded number of mappings (least recently used out first), drops those whose
file is unlinked at its next write, and drops all of them on :meth:`SegmentWriter.close`. Between writes,
an idle writer can therefore hold up to ``max_bytes`` of unlinked segments' memory.

The writer writes a segment only while it holds the server's reservation for it (the server checks the
bytes at publish and never reuses a segment whose writer did not publish); this module does not check
that itself, and a kept mapping gives no other process's data to the writer that the file's path does not.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from trajflight.errors import InvalidRequestError
from trajflight.flight_server._segments import write_stream
from trajflight.flight_server.shm._segment import POPULATE, write_segment

__all__ = ["MAX_KEPT_BYTES", "MAX_KEPT_SEGMENTS", "SegmentWriter"]

MAX_KEPT_SEGMENTS = 8
"""Mappings a :class:`SegmentWriter` keeps by default."""
MAX_KEPT_BYTES = 256 * 2**20
"""Bytes of mappings a :class:`SegmentWriter` keeps by default (a larger segment is never kept)."""
_SEEN = 64  # segments remembered as seen once (to map them the second time)


@dataclass(slots=True)
class _Kept:
    fd: int  # kept open: its link count tells when the server unlinked the file
    mm: mmap.mmap

    def close(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(BufferError):  # a buffer still exported: unmapped when it goes
            self.mm.close()


class SegmentWriter:
    """Writes Arrow IPC streams into segment files of a same-host server, keeping mappings of reused ones.

    Thread-safe: threads may write different segments at once (one segment is written by one put).

    Args:
        max_segments: Mappings kept at most (0 keeps none: every write goes through ``write(2)``).
        max_bytes: Bytes of mappings kept at most.
    """

    def __init__(self, *, max_segments: int = MAX_KEPT_SEGMENTS, max_bytes: int = MAX_KEPT_BYTES) -> None:
        if max_segments < 0 or max_bytes < 0:
            raise InvalidRequestError(
                f"max_segments and max_bytes must be >= 0, got {max_segments!r} and {max_bytes!r}"
            )
        self.max_segments = max_segments
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int], _Kept] = OrderedDict()  # (path, inode), oldest first
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.mapped_writes = 0
        """Writes that went through a kept mapping (the others went through ``write(2)``)."""

    def write(self, path: str, capacity: int, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
        """Write ``batches`` as one IPC stream at offset 0 of the segment file ``path``; returns its size.

        Through a kept mapping of the file when this writer has one or has seen the file before (it maps
        it now and keeps it), else with ``write(2)`` (:func:`~._segment.write_segment`). The file is never
        truncated or extended.

        Raises:
            NotFoundError: the file is gone (the reservation was swept). InvalidRequestError: the stream
            is larger than ``capacity``.
        """
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return int(write_segment(path, capacity, schema, batches))  # raises its NotFoundError
        key = (path, st.st_ino)
        kept = self._take(key, st.st_size)
        if kept is None:
            return int(write_segment(path, capacity, schema, batches))
        try:
            size = _write_into(kept.mm, min(capacity, st.st_size), schema, batches)
        except BaseException:
            kept.close()
            raise
        self._keep(key, kept)
        return size

    def _take(self, key: tuple[str, int], size: int) -> _Kept | None:
        """The kept mapping of ``key`` (taken out while it is written), a new one the second time a file
        is seen, or None (write it with ``write(2)``)."""
        with self._lock:
            self._drop_unlinked()
            kept = self._kept.pop(key, None)
            if kept is not None or size > self.max_bytes or self.max_segments == 0:
                return kept
            if key not in self._seen:
                self._seen[key] = None
                if len(self._seen) > _SEEN:
                    self._seen.popitem(last=False)
                return None
            del self._seen[key]
        try:
            fd = os.open(key[0], os.O_RDWR)
        except FileNotFoundError:
            return None  # write_segment says it is gone
        if os.fstat(fd).st_ino != key[1]:  # replaced since it was looked up: not the file seen before
            os.close(fd)
            return None
        try:
            # Filled in one call: the writer touches every page it writes, and faulting them one by one
            # cost more here.
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | POPULATE)
        except OSError:
            os.close(fd)
            return None  # out of address space or memory: write(2) still works
        return _Kept(fd, mm)

    def _keep(self, key: tuple[str, int], kept: _Kept) -> None:
        """Keep ``kept`` (just written through) as the most recently used mapping, within the bounds."""
        with self._lock:
            self.mapped_writes += 1
            self._kept[key] = kept
            while len(self._kept) > self.max_segments or self._kept_bytes() > self.max_bytes:
                self._kept.popitem(last=False)[1].close()

    def _kept_bytes(self) -> int:
        return sum(len(k.mm) for k in self._kept.values())

    def _drop_unlinked(self) -> None:
        for key, kept in list(self._kept.items()):
            if os.fstat(kept.fd).st_nlink == 0:
                del self._kept[key]
                kept.close()

    @property
    def kept_bytes(self) -> int:
        """Bytes of the mappings kept now."""
        with self._lock:
            return self._kept_bytes()

    def close(self) -> None:
        """Drop every kept mapping (idempotent); the writer stays usable (it maps again when needed)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            self._seen.clear()
        for k in kept:
            k.close()


def _write_into(mm: mmap.mmap, capacity: int, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Write the stream at offset 0 of ``mm``, at most ``capacity`` bytes; returns its size."""
    with pa.FixedSizeBufferWriter(pa.py_buffer(memoryview(mm)[:capacity])) as out:
        try:
            write_stream(out, schema, batches)
        except OSError as exc:  # pyarrow's "Write out of bounds"
            raise InvalidRequestError(
                f"shm put: the stream does not fit the segment of {capacity} bytes ({exc})"
            ) from None
        return int(out.tell())
