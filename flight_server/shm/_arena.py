"""The shared-memory arena of a storage server: size-classed, pre-faulted, reused segment files on tmpfs.

One arena per server, in a private directory (``/dev/shm/trajflight-<uuid>/`` by default, mode 0700; files
0600, so only the deployment's user can map them), holding the segment files of :mod:`._segment`. Fresh
tmpfs pages are zeroed by the kernel on first touch, several times slower to write than a reused,
pre-faulted file (BENCHMARKS.md, "Transport"), so segments are created pre-faulted (``posix_fallocate`` +
``MAP_POPULATE``) and reused.

Small groups (a same-node writer's one-call put, ``shm_put``) are *packed* into slab segments of 4 MiB,
one IPC stream after another at 64-byte aligned offsets (:meth:`ShmArena.pack`): a reader of many small
groups maps a few files, not one per group. A slab is one segment for every rule below; it goes back to
the arena when it is full and its last group is released. Until then the bytes of its released groups
(and its unused tail) stay in tmpfs: they are reported as ``stranded_bytes`` and counted by the store as
used capacity, so capacity bounds the arena's memory to within the one slab being filled.

Reuse rule (the safety choice): a released segment goes back to the free pool only when no buffer of
this server still aliases it (a ``do_get`` stream still running keeps it draining until the stream ends)
and **no same-node reader still maps it**. Readers say so with the file itself: :func:`~._segment.map_segment`
holds a shared ``flock`` on the segment for as long as its mapping lives (the lock goes with the last
buffer over the mapping, or with the reader's process), and the arena reuses a segment handed to readers
only once it can take the exclusive lock itself (it lets go at once). A reader therefore checks that its
group is still stored (the fence board) *after* it has locked and mapped the segment: a segment the
arena took back before that check can only hold another group, and the check refuses it. Until its
readers let go, a released segment drains; a fresh, pre-faulted one of its class is created in the
background meanwhile if the pool has none. A segment given to a writer whose put never completed (it
died or timed out) is unlinked, never reused: the writer may still be writing into it.

On start the arena takes an exclusive ``flock`` on ``<dir>/.lock`` and sweeps every segment file left in
the directory by a previous, dead incarnation; a directory locked by a live process is refused. An
auto-named arena also removes the directories killed servers left beside it
(:func:`~._sweep.sweep_dead_arenas`).

This module does not guarantee confidentiality against processes of the same user (they can map the
files), nor that a same-node writer stops writing after it published (writers are the deployment's own
processes; the server validates the bytes at publish). It does not survive the machine's reboot.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import mmap
import os
import socket
import threading
import uuid
from pathlib import Path

import pyarrow as pa

from trajflight.errors import ConfigError, InvalidRequestError, NotFoundError
from trajflight.flight_server.shm._segment import POPULATE, Segment, size_class, unlink_segment
from trajflight.flight_server.shm._sweep import sweep_dead_arenas
from trajflight.units import format_size

__all__ = ["SLAB_ALIGN", "SLAB_BYTES", "ShmArena", "host_id"]

log = logging.getLogger("trajflight.flight_server.shm")

SLAB_BYTES = 4 * 2**20  # small groups are packed into slabs of this size (ShmArena.pack)
SLAB_ALIGN = 64  # streams in a slab start on 64-byte boundaries (Arrow's buffer alignment)
RECLAIM_EVERY = 0.5  # seconds between the background's looks at segments draining from readers
_ASKS_PER_RESERVATION = 4  # readers' segments a reservation asks about (oldest first)
_PREFIX = "seg-"


def host_id() -> str:
    """This machine's identity for same-host transport choice: ``hostname/boot_id``.

    Not an IP address: two processes see the same value only on the same running kernel with the same
    hostname (containers on one host usually differ by hostname, and the client also checks that it can
    see the arena's directory).
    """
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot}"


class ShmArena:
    """Segment files on tmpfs for one storage server. Thread-safe.

    Args:
        directory: The arena's private directory; created (0700) if missing, swept if it holds files of a
            dead incarnation. None: a fresh ``/dev/shm/trajflight-<uuid>`` (the system temp dir where
            ``/dev/shm`` does not exist).
        pool_bytes: Most bytes of free, pre-faulted segments kept for reuse (beyond it released segments
            are unlinked).
        background: A background thread refills the pool (a segment unlinked, or draining from readers,
            while the pool has none of its size) and takes back segments readers let go of.
        slab_bytes: Size of the *slabs* small groups are packed into (:meth:`pack`), one after another.

    Raises:
        ConfigError: the directory is in use by a live arena, or cannot be created.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        pool_bytes: int = 512 * 2**20,
        background: bool = True,
        slab_bytes: int = SLAB_BYTES,
    ) -> None:
        auto = directory is None
        if directory is None:
            directory = os.path.join(_auto_base(), f"trajflight-{uuid.uuid4().hex}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.pool_bytes = pool_bytes
        self.slab_bytes = size_class(slab_bytes)
        self._slab: Segment | None = None  # the slab small groups are being packed into
        self._slab_used = 0
        self.stranded_bytes = 0  # see stranded_bytes below (kept under the lock)
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
            self._lock_fd = os.open(os.path.join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"shared-memory arena: cannot use {self.directory!r}: {exc}", setting="shm-dir"
            ) from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise ConfigError(
                f"shared-memory arena {self.directory!r} is in use by another live server; give each "
                "server its own --shm-dir",
                setting="shm-dir",
            ) from exc
        self.swept = self._sweep()
        # An auto-named arena's server that was killed leaves its directory behind, and no later server
        # ever starts on that name: the next auto-named arena removes such directories.
        self.dead_swept = (
            sweep_dead_arenas(os.path.dirname(self.directory), keep=self.directory) if auto else 0
        )
        self._lock = threading.Lock()
        self._names = itertools.count()
        self._token = uuid.uuid4().hex[:8]
        self._free: dict[int, list[Segment]] = {}
        self._free_bytes = 0
        self._draining: list[Segment] = []
        self._live: dict[str, Segment] = {}  # name -> segment in use (held or reserved)
        self._closed = False
        self._refill: list[int] = []
        self._wake = threading.Condition(self._lock)
        self.created = 0
        self.reused = 0
        self.reclaimed = 0  # segments readers had mapped, back in the pool once they let go
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run_refill, name="trajflight-shm-refill", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------------------------------ lifecycle

    def _sweep(self) -> int:
        """Unlink every segment file in the directory (orphans of a dead incarnation); returns the count."""
        swept = 0
        for entry in os.scandir(self.directory):
            if entry.name.startswith(_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    swept += 1
        if swept:
            log.warning("shared-memory arena %s: swept %d orphaned segments", self.directory, swept)
        return swept

    def close(self, *, remove_dir: bool = True) -> None:
        """Unlink every segment and the directory; idempotent. Live mappings stay valid until dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            segments = [s for lst in self._free.values() for s in lst] + self._draining
            segments += list(self._live.values())
            self._slab = None
            self.stranded_bytes = 0
            self._free.clear()
            self._draining.clear()
            self._live.clear()
            self._free_bytes = 0
            self._wake.notify_all()
        for seg in segments:
            unlink_segment(seg)
        self._sweep()
        if remove_dir:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, ".lock"))
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    # ----------------------------------------------------------------------------------- segments

    def _create(self, capacity: int, *, populate: bool = True) -> Segment:
        name = f"{_PREFIX}{self._token}-{next(self._names)}"
        path = os.path.join(self.directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, capacity)
            try:
                os.posix_fallocate(fd, 0, capacity)  # tmpfs: allocate (and zero) the pages now, once
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    os.unlink(path)
                    raise
            # Background creations also fill this process's page tables; on a put's critical path that
            # is skipped (a same-node writer fills the pages through its own mapping).
            mm = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | (POPULATE if populate else 0))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.created += 1
        return Segment(name, path, capacity, mm)

    def acquire(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` (a reused, pre-faulted one when the pool has one).

        Raises:
            OSError: tmpfs is full (ENOSPC): the server maps it to a capacity refusal.
        """
        capacity = size_class(nbytes)
        with self._lock:
            if self._closed:
                raise NotFoundError("the shared-memory arena is closed")
            # A reservation asks a few readers' segments (the background asks the rest): it does not pay
            # a system call for every segment a trainer still maps.
            self._reclaim_locked(asks=_ASKS_PER_RESERVATION)
            free = self._free.get(capacity)
            if free:
                seg = free.pop()
                seg.refs = 1
                self._free_bytes -= capacity
                self._live[seg.name] = seg
                self.reused += 1
                return seg
        seg = self._create(capacity, populate=False)
        with self._lock:
            self._live[seg.name] = seg
        return seg

    def pack(self, nbytes: int) -> tuple[Segment, int]:
        """Room for a small stream of ``nbytes`` in the current slab: ``(slab, start)``, 64-byte aligned.

        Small groups share slab segments, one after another, instead of a segment each (a reader of many
        of them maps one file, not one per group). The caller holds one reference of the slab per stream
        (release it with :meth:`release`, as a segment); the slab goes back to the arena when its last
        stream is released and it is full (or the arena closes). Regions are never reused within a slab.

        Raises:
            InvalidRequestError: ``nbytes`` is larger than a slab. OSError: tmpfs is full.
        """
        need = -(-max(nbytes, 1) // SLAB_ALIGN) * SLAB_ALIGN
        if need > self.slab_bytes:
            raise InvalidRequestError(f"a packed stream holds at most {self.slab_bytes} bytes, got {nbytes}")
        while True:
            with self._lock:
                if self._closed:
                    raise NotFoundError("the shared-memory arena is closed")
                slab = self._slab
                if slab is not None and self._slab_used + need <= slab.capacity:
                    start = self._slab_used
                    self._slab_used += need
                    slab.packed += need
                    slab.refs += 1
                    return slab, start
                self._slab = None  # full (or none yet): retire it, its streams keep it alive
                if slab is not None:  # its released streams and unused tail are held by nobody now
                    self._strand_locked(slab, slab.freed + slab.capacity - slab.packed)
            if slab is not None:
                self.release(slab)  # the slab's own reference, held while it was being filled
            fresh = self.acquire(self.slab_bytes)
            with self._lock:
                if self._slab is None:
                    fresh.slab = True
                    self._slab, self._slab_used = fresh, 0
                    if not self._free.get(self.slab_bytes):  # have the next slab pre-faulted by then
                        self._refill.append(self.slab_bytes)
                        self._wake.notify()
                    continue
            self.release(fresh)  # another thread installed a slab first: give this one back

    def release_stream(self, slab: Segment, nbytes: int) -> None:
        """Give back one stream of ``nbytes`` (as :meth:`pack` rounded it) of a slab.

        Until a slab's last stream is released its bytes stay in tmpfs. Once the slab is retired (full),
        the bytes no group counts any more (released streams, the unused tail) count in
        ``stranded_bytes``, which the store adds to its used capacity: capacity keeps bounding the arena's
        memory, to within the one slab being filled, even when one long-lived group keeps a slab alive.
        """
        with self._lock:
            if slab.name in self._live:
                if slab is self._slab:
                    slab.freed += nbytes  # counted if and when the slab is retired
                else:
                    self._strand_locked(slab, nbytes)
        self.release(slab)

    def _strand_locked(self, slab: Segment, nbytes: int) -> None:
        slab.stranded += nbytes
        self.stranded_bytes += nbytes

    def place(self, nbytes: int) -> tuple[Segment, pa.Buffer]:
        """A segment for a stream of ``nbytes`` and a mutable buffer of exactly ``nbytes`` over it."""
        seg = self.acquire(nbytes)
        return seg, seg.buffer(nbytes)

    def release(self, seg: Segment) -> None:
        """Give a segment back: kept for reuse when safe (see the module docstring), else unlinked."""
        with self._lock:
            if seg.name not in self._live:
                return  # released already, or the arena closed
            seg.refs -= 1
            if seg.refs > 0:
                return  # other groups of its batch still hold it
            del self._live[seg.name]
            self.stranded_bytes -= seg.stranded  # a slab's stranded bytes leave with it
            seg.packed = seg.freed = seg.stranded = 0
            seg.slab = False
            unlink = seg.exposed or self._closed
            # Readers that let go already: back in the pool now; else it drains until they do.
            waits = not unlink and not self._reclaim_one_locked(seg)
            if waits:
                self._draining.append(seg)
            # Gone for good, or until its readers let go: have a warm one of its size ready meanwhile,
            # unless the pool has one (a segment that drains comes back; refilling for each would grow
            # the pool by a segment per batch until pool_bytes).
            gone = unlink or (waits and seg.readers)
            if (
                gone
                and not self._closed
                and not self._free.get(seg.capacity)
                and seg.capacity not in self._refill
                and self._free_bytes + seg.capacity <= self.pool_bytes
            ):
                self._refill.append(seg.capacity)
                self._wake.notify()
        if unlink:
            unlink_segment(seg)

    def reclaim(self) -> int:
        """Take back released segments that nothing maps any more (readers that let go); returns how many
        still drain. Runs in the background every ``RECLAIM_EVERY`` seconds while some drain, and in
        part on every reservation."""
        with self._lock:
            self._reclaim_locked()
            return len(self._draining)

    def _reclaim_locked(self, *, asks: int | None = None) -> None:
        """Take back what drained, asking at most ``asks`` files whether readers still map them (a system
        call each; None: every file); the files asked in vain go to the back of the line."""
        if not self._draining:
            return
        keep: list[Segment] = []
        asked: list[Segment] = []
        for seg in self._draining:
            if asks is not None and seg.readers and seg.quiet():
                if asks <= 0:
                    keep.append(seg)
                    continue
                asks -= 1
                if not self._reclaim_one_locked(seg):
                    asked.append(seg)
            elif not self._reclaim_one_locked(seg):
                keep.append(seg)
        self._draining = keep + asked

    def _reclaim_one_locked(self, seg: Segment) -> bool:
        """Take a released segment back (into the pool, or unlinked beyond ``pool_bytes``) when nothing
        aliases it any more; False while it must keep draining."""
        if not seg.quiet() or not seg.unread():
            return False
        if self._free_bytes + seg.capacity <= self.pool_bytes:
            if seg.readers:
                self.reclaimed += 1
            seg.readers = False
            self._free.setdefault(seg.capacity, []).append(seg)
            self._free_bytes += seg.capacity
        else:
            unlink_segment(seg)
        return True

    def _run_refill(self) -> None:
        while True:
            with self._lock:
                while not self._refill and not self._closed:
                    if not self._wake.wait(RECLAIM_EVERY if self._draining else None):
                        self._reclaim_locked()  # readers let go of segments since the last look
                if self._closed:
                    return
                capacity = self._refill.pop()
                if self._free_bytes + capacity > self.pool_bytes:
                    continue
            try:
                seg = self._create(capacity)
            except OSError as exc:
                log.warning("shared-memory arena: background refill failed: %s", exc)
                continue
            with self._lock:
                if self._closed:
                    unlink_segment(seg)
                    return
                self._free.setdefault(capacity, []).append(seg)
                self._free_bytes += capacity

    def files(self) -> list[str]:
        """Names of the segment files now in the directory (for tests and operators)."""
        return sorted(e.name for e in os.scandir(self.directory) if e.name.startswith(_PREFIX))

    def stats(self) -> dict[str, object]:
        """Counts for the server's ``stats`` action (the slab being filled counts as live once it holds
        a stream)."""
        with self._lock:
            idle = [self._slab] if self._slab is not None and self._slab.refs == 1 else []
            return {
                "dir": self.directory,
                "live_segments": len(self._live) - len(idle),
                "live_bytes": sum(s.capacity for s in self._live.values()) - sum(s.capacity for s in idle),
                "free_segments": sum(len(v) for v in self._free.values()),
                "free_bytes": self._free_bytes,
                "draining_segments": len(self._draining),
                "created": self.created,
                "reused": self.reused,
                "reclaimed": self.reclaimed,
                "swept_at_start": self.swept,
                "dead_arenas_swept": self.dead_swept,
                # the slab small groups are being packed into: streams held in it, bytes handed out
                "slab_streams": 0 if self._slab is None else self._slab.refs - 1,
                "slab_used_bytes": 0 if self._slab is None else self._slab_used,
                "stranded_bytes": self.stranded_bytes,
            }

    def __repr__(self) -> str:
        return f"ShmArena({self.directory!r}, pool {format_size(self.pool_bytes)})"


def _auto_base() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
