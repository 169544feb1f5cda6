"""Timing statistics, peak-memory probes and progress lines for ``trajflight bench``.

Peak memory is read from the kernel's high-water mark (``VmHWM`` in ``/proc/PID/status``), reset before a
phase by writing ``5`` to ``/proc/PID/clear_refs`` (Linux >= 4.0). Where that is not possible (another OS,
no permission) a sampling thread polls ``psutil`` RSS every few milliseconds instead, which can miss a
short spike: the JSON says which method was used.

It does not isolate processes from each other: other work on the machine shows up in the spread.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PeakMemory",
    "Progress",
    "Stats",
    "cpu_count",
    "cpu_per_call",
    "percentile",
    "release_free_memory",
    "shmem_bytes",
    "timed",
]


@dataclass(frozen=True, slots=True)
class Stats:
    """Median and spread of repeated measurements (any unit)."""

    median: float
    min: float
    max: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Summarise ``values`` (at least one)."""
        if not values:
            raise ValueError("no measurement to summarise")
        ordered = sorted(values)
        if len(ordered) >= 2:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = q3 = ordered[0]
        return cls(statistics.median(ordered), ordered[0], ordered[-1], q1, q3, len(ordered))


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no measurement")
    k = (len(ordered) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` took (``time.perf_counter``)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_per_call(fn: Callable[[], Any], calls: int) -> float:
    """CPU seconds of this process per call of ``fn`` over ``calls`` calls, with the garbage collector
    off while they run (after one untimed call to warm up). CPU time, not wall time: on a shared machine
    the wall clock mostly measures the wait for a core."""
    fn()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(calls):
            fn()
        return (time.process_time() - start) / calls
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------------- memory
def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def release_free_memory() -> None:
    """Hand memory this process freed back to the OS: glibc ``malloc_trim(0)`` and Arrow's default pool.

    Without it, a peak-RSS growth measured after other work can read low (the allocator reuses pages it
    kept) and depend on what ran before.
    """
    import gc

    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # an old pyarrow without release_unused: growth may read low
        pass
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def shmem_bytes() -> int:
    """Bytes of shared memory in use on the machine (``Shmem`` of ``/proc/meminfo``; 0 elsewhere).

    Ray's object store lives in shared memory that its server process need not touch, so its RSS alone
    would miss it.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Shmem:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


class PeakMemory:
    """Peak RSS growth of a set of processes over one phase, as a context manager.

    Args:
        pids: The processes; each one's growth is its peak RSS during the phase minus its RSS at the start.
        include_shmem: Also count the machine's shared-memory growth (an object store in ``/dev/shm``).

    After the block, :attr:`growth` is the summed growth in bytes and :attr:`peak` the summed peak RSS.
    """

    def __init__(self, pids: Iterable[int], *, include_shmem: bool = False) -> None:
        self.pids = list(pids)
        self.include_shmem = include_shmem
        self.method = "VmHWM"
        self.growth = 0
        self.peak = 0
        self._start: dict[int, int] = {}
        self._sampled: dict[int, int] = {}
        self._shmem_start = 0
        self._shmem_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _rss(self, pid: int) -> int:
        value = _status_kib(pid, "VmRSS")
        if value is not None:
            return value
        import psutil

        return int(psutil.Process(pid).memory_info().rss)

    def __enter__(self) -> PeakMemory:
        for pid in self.pids:
            if not _reset_hwm(pid):
                self.method = "sampled RSS"
            self._start[pid] = self._rss(pid)
        self._shmem_start = self._shmem_peak = shmem_bytes() if self.include_shmem else 0
        if self.method != "VmHWM" or self.include_shmem:
            self._sampled = dict(self._start)
            self._thread = threading.Thread(target=self._sample, name="bench-memory", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._poll()

    def _poll(self) -> None:
        if self.method != "VmHWM":
            for pid in self.pids:
                try:
                    self._sampled[pid] = max(self._sampled[pid], self._rss(pid))
                except Exception:  # the process ended: keep what was seen
                    continue
        if self.include_shmem:
            self._shmem_peak = max(self._shmem_peak, shmem_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll()
        growth = peak = 0
        for pid in self.pids:
            if self.method == "VmHWM":
                hwm = _status_kib(pid, "VmHWM") or self._start[pid]
            else:
                hwm = self._sampled[pid]
            peak += hwm
            growth += max(0, hwm - self._start[pid])
        if self.include_shmem:
            shm = max(0, self._shmem_peak - self._shmem_start)
            growth += shm
            peak += shm
        self.growth, self.peak = growth, peak


# -------------------------------------------------------------------------------------------- progress
class Progress:
    """One line per step on stderr, with the time since the run started; silent when ``enabled`` is off."""

    def __init__(self, enabled: bool = True, stream: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        """Print ``message`` prefixed with the elapsed time."""
        if self.enabled:
            print(f"[bench {time.monotonic() - self.start:6.1f}s] {message}", file=self.stream, flush=True)


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
