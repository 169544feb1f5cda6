"""Segment files of a shared-memory arena: one Arrow IPC stream at offset 0 of a file on tmpfs.

Each stored group part lives in one *segment*: a file holding one complete Arrow IPC stream (schema,
batches, end-of-stream) at offset 0. The server maps every segment read-write (``MAP_SHARED``) and serves
``do_get`` from that mapping; same-node writers write the stream straight into the same file
(:func:`write_segment`, one copy into the shared pages); same-node readers map it read-only and decode
with no copy (:func:`map_segment`). Sizes are rounded up to a *size class* (:func:`size_class`: quarter
steps between powers of two, so at most 25% is wasted); capacity counts the class size.

A read-only mapping holds a shared ``flock`` on its file for as long as it lives: that is how readers
tell the arena (:mod:`._arena`) that a segment must not be reused yet (:meth:`Segment.unread`).

This module does not recycle segments (the arena does) and does not guarantee confidentiality against
processes of the same user (they can map the files).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from trajflight.errors import InvalidRequestError, NotFoundError
from trajflight.flight_server._segments import write_stream

__all__ = [
    "MIN_SEGMENT",
    "PAGE",
    "POPULATE",
    "Segment",
    "map_segment",
    "size_class",
    "unlink_segment",
    "write_segment",
]

PAGE = mmap.PAGESIZE
MIN_SEGMENT = 16 * 1024
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: fill the page tables in one call


def size_class(nbytes: int) -> int:
    """The segment size for a stream of ``nbytes``: pages, then quarter steps between powers of two."""
    if nbytes < 0:
        raise InvalidRequestError(f"segment size must be >= 0, got {nbytes}")
    size = max(MIN_SEGMENT, -(-nbytes // PAGE) * PAGE)
    base = 1 << (size.bit_length() - 1)
    step = max(PAGE, base // 4)
    return -(-size // step) * step


@dataclass(eq=False)
class Segment:
    """One segment file and this server's read-write mapping of it.

    Attributes:
        name: File name (unique for the arena's life; never reused, so readers' caches cannot confuse two
            files).
        path: Absolute path.
        capacity: File size (its size class); what capacity counts.
        exposed: Handed to a writer outside this process that has not published: never reused (see the
            module docstring).
        readers: Handed to same-node readers (``shm_open``): reused only once no reader holds its lock.
        refs: Groups holding it (a batch of groups written as one stream shares one segment); the arena
            takes it back when the last one releases it.
        slab: Small groups are packed into it (:meth:`ShmArena.pack`); release them with
            :meth:`ShmArena.release_stream`.
        packed: As a slab, the bytes handed out to streams so far.
        freed: As a slab, the bytes of its streams released so far.
        stranded: As a retired slab (full, no longer packed into), the bytes it holds that no group counts
            any more: its released streams and its unused tail (see ``ShmArena.release_stream``).
    """

    name: str
    path: str
    capacity: int
    mm: mmap.mmap | None
    exposed: bool = False
    readers: bool = False
    refs: int = 1
    slab: bool = False
    packed: int = 0
    freed: int = 0
    stranded: int = 0
    _views: list[weakref.ref[memoryview]] = field(default_factory=list)

    def buffer(self, size: int | None = None, start: int = 0) -> pa.Buffer:
        """A buffer over ``size`` bytes of the server's mapping from ``start`` (mutable; aliases the file).

        The arena learns when every such buffer (and every Arrow slice of it, e.g. a running ``do_get``)
        is gone, and only then may reuse the segment.
        """
        if self.mm is None:
            raise NotFoundError(f"segment {self.name} was released")
        end = self.capacity if size is None else start + size
        view = memoryview(self.mm)[start:end]  # slices stay mutable
        self._views.append(weakref.ref(view))
        return pa.py_buffer(view)

    def quiet(self) -> bool:
        """True when no buffer of :meth:`buffer` is alive any more."""
        self._views = [v for v in self._views if v() is not None]
        return not self._views

    def unread(self) -> bool:
        """True when no same-node reader maps the file: the exclusive ``flock`` can be taken (and is let
        go at once). Always true for a segment never handed to readers."""
        if not self.readers:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a reader holds its shared lock
        finally:
            os.close(fd)  # closing lets go of the lock
        return True


def unlink_segment(seg: Segment) -> None:
    """Unlink the file and drop this server's mapping reference (unmapped when its last buffer goes)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(seg.path)
    seg.mm = None


def map_segment(path: str, size: int, *, writable: bool = False) -> mmap.mmap:
    """Map a segment file of this host (read-only unless ``writable``).

    The mapping aliases the server's segment. A read-only mapping holds a shared ``flock`` on the file
    for as long as it lives, which keeps the server from reusing the segment (see the module docstring):
    its bytes stay as they are after the server deletes the group, until the last buffer over the
    mapping is dropped. A reader must check that its group is still stored *after* mapping (the segment
    may have been reused for another group before it was locked).

    Raises:
        NotFoundError: the file is gone (the group was deleted, or the server restarted).
    """
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise NotFoundError(
            f"shared-memory segment {path} is gone (the group was deleted or its server restarted)"
        ) from None
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # Writers pre-fill their page tables (they write every page); readers map lazily: decoding is
        # zero-copy and touches little, and even a reader of every byte paid less for faulting pages in
        # (the kernel's fault-around) than for MAP_POPULATE (BENCHMARKS.md, *Transport*).
        flags = mmap.MAP_SHARED | (POPULATE if writable else 0)
        if not writable:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits out the arena's (instant) check, if it runs now
        mm = mmap.mmap(fd, size, flags=flags, prot=prot)
    except BaseException:
        os.close(fd)
        raise
    if writable:
        os.close(fd)
    else:
        weakref.finalize(mm, os.close, fd)  # the lock goes with the mapping's last buffer
    return mm


def write_segment(path: str, capacity: int, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Write ``batches`` as one Arrow IPC stream at offset 0 of the segment file ``path``; returns its size.

    The bytes go straight into the file's shared pages with ``write(2)`` (one copy, from the batches'
    buffers; no socket, no mapping in this process): several times faster than through a fresh ``mmap`` of
    the same (pre-allocated) file, whose page-table setup dominates (BENCHMARKS.md, *Transport*). The file
    is not truncated, so its pre-faulted pages are kept.

    Raises:
        NotFoundError: the file is gone (the reservation was swept). InvalidRequestError: the stream is
        larger than the segment.
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        raise NotFoundError(f"shared-memory segment {path} is gone (the reservation expired)") from None
    with os.fdopen(fd, "wb", buffering=0) as f:
        write_stream(f, schema, batches)
        size = f.tell()
    if size > capacity:
        raise InvalidRequestError(f"shm put: wrote {size} bytes into a segment of {capacity}")
    return int(size)
