"""The raw shared-memory ceiling: one pre-faulted segment on ``/dev/shm``, written by one process and
mapped by another.

A writer process (spawned: the rollout worker) holds the workload's arrays and, on request, copies the
payload bytes into one segment (``np.copyto`` per column, each column's values contiguous over the batch,
as the one-object Ray form lays them out); the driver (the trainer) has the same segment mapped and
builds torch tensors over it with no copy (jagged: views; padded: one copy). A put is timed from the
request to the writer's reply; the offsets and dtypes are known to both sides beforehand (no metadata,
no protocol, no accounting). Nothing moves data between two processes on one host faster: it is the
bound the same-host path is measured against.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from trajflight.workload import SyntheticGroup, make_workload

from ._system import ALL_COLUMNS, RAGGED, GetVariant, System, group_arrays

__all__ = ["ShmCeilingSystem"]

SHM_DIR = "/dev/shm"
_REPLY_TIMEOUT = 120.0
_Layout = dict[str, tuple[int, int, str]]  # column: (byte offset in the segment, values, numpy dtype)


def _layout(parts: Sequence[dict[str, np.ndarray]], base: int) -> tuple[_Layout, int]:
    """Where each column's values go: ``{name: (byte offset, count, dtype)}`` from ``base``, and the end."""
    out: _Layout = {}
    pos = base
    for name in ALL_COLUMNS:
        count = sum(len(p[name]) for p in parts)
        dtype = parts[0][name].dtype
        pos = -(-pos // 64) * 64  # each column 64-byte aligned, as Arrow aligns its buffers
        out[name] = (pos, count, dtype.str)
        pos += count * dtype.itemsize
    return out, pos


def _write(view: np.ndarray, parts: Sequence[dict[str, np.ndarray]], layout: _Layout) -> None:
    """Copy the parts' columns into the segment where ``layout`` (:func:`_layout` of them) says."""
    for name, (pos, _, _) in layout.items():
        for p in parts:
            src = p[name].view(np.uint8)
            np.copyto(view[pos : pos + src.nbytes], src)
            pos += src.nbytes


def _writer_main(conn: Any, path: str, params: tuple[int, int, int, float]) -> None:
    """The writer process: map the segment, pre-fault it, then serve ``("put", None)`` (every group)
    and ``("one", i)`` (group ``i`` alone, after the batch) until ``("stop", None)``."""
    groups, samples, seed, median = params
    parts = [group_arrays(g) for g in make_workload(groups, samples, seed=seed, response_median=median)]
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    view = np.frombuffer(mm, dtype=np.uint8)
    view[:] = 1  # pre-fault every page in this process
    batch, one_base = _layout(parts, 0)
    ones = [_layout([p], one_base)[0] for p in parts]
    conn.send("ready")
    while True:
        what, arg = conn.recv()
        if what == "stop":
            break
        start = time.monotonic_ns()
        if what == "put":
            _write(view, parts, batch)
        else:
            i = arg % len(parts)
            _write(view, [parts[i]], ones[i])
        conn.send(start)
    del view
    with contextlib.suppress(BufferError):
        mm.close()
    conn.close()


class ShmCeilingSystem(System):
    """One pre-faulted ``/dev/shm`` segment, written by a writer process, mapped by the driver."""

    name = "shm-ceiling"
    role = "reference"
    form = "1 pre-faulted segment, 2 processes"
    description = (
        "raw shared memory: a writer process copies the payload into one pre-faulted /dev/shm segment "
        "the driver has mapped; torch views over it (the same-host ceiling)"
    )
    memory_note = "RSS of the writer process (the segment counted as shared memory)"
    include_shmem = True
    supports_batched = True

    def __init__(
        self, groups: Sequence[SyntheticGroup], *, samples: int, seed: int, response_median: float
    ) -> None:
        super().__init__(groups)
        self._params = (len(groups), samples, seed, response_median)
        self._parts = [group_arrays(g) for g in self.groups]
        self._path = os.path.join(SHM_DIR, f"trajflight-bench-ceiling-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self._proc: Any = None
        self._conn: Any = None
        self._mm: mmap.mmap | None = None
        self._batch, one_base = _layout(self._parts, 0)
        self._offsets = self._ragged_offsets(self._parts)
        # Each group alone, after the batch: its layout and offsets, known to both sides beforehand.
        self._ones = [(_layout([p], one_base)[0], self._ragged_offsets([p])) for p in self._parts]
        self._size = one_base + max(_layout([p], 0)[1] for p in self._parts) + 64 * len(ALL_COLUMNS)

    @staticmethod
    def _ragged_offsets(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
        import torch

        out = {}
        for name in RAGGED:
            lengths = np.concatenate([np.diff(p[name + "@offsets"]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            out[name] = (torch.from_numpy(offsets), int(lengths.max(initial=0)))
        return out

    def setup(self) -> None:
        if not os.path.isdir(SHM_DIR):
            from ._system import SystemUnavailable

            raise SystemUnavailable(f"no {SHM_DIR} here", "run on Linux (tmpfs at /dev/shm)")
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self._size)
            self._mm = mmap.mmap(fd, self._size)
        finally:
            os.close(fd)
        np.frombuffer(self._mm, dtype=np.uint8)[:] = 0  # pre-fault every page in this process too
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_writer_main, args=(child, self._path, self._params), daemon=True)
        self._proc.start()
        child.close()
        self._reply()

    def _reply(self) -> Any:
        if not self._conn.poll(_REPLY_TIMEOUT):
            raise TimeoutError(f"the shared-memory writer process did not answer in {_REPLY_TIMEOUT:g} s")
        return self._conn.recv()

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._conn.send(("stop", None))
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(10)
            self._conn.close()
            self._proc = None
        if self._mm is not None:
            gc.collect()  # tensors over the map must be gone before it closes
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def server_pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []

    def put_all(self) -> None:
        self._conn.send(("put", None))
        self._reply()

    def put_batched_all(self) -> None:
        self.put_all()

    def _tensors(
        self,
        layout: _Layout,
        offsets: dict[str, Any],
        columns: Sequence[str],
        pad: bool,
    ) -> dict[str, Any]:
        import torch

        out: dict[str, Any] = {}
        for name in columns:
            pos, count, dtype = layout[name]
            values = torch.from_numpy(np.frombuffer(self._mm, np.dtype(dtype), count, pos))  # type: ignore[arg-type]
            if name in RAGGED:
                offs, longest = offsets[name]
                values = torch.nested.nested_tensor_from_jagged(values, offs, max_seqlen=longest)
                if pad:
                    values = values.to_padded_tensor(0)
            out[name] = values
        return out

    def get(self, variant: GetVariant) -> Any:
        return self._tensors(
            self._batch, self._offsets, variant.columns or ALL_COLUMNS, variant.layout == "padded"
        )

    def small_roundtrip(self, index: int) -> None:
        self._one(index)

    def _one(self, index: int) -> int:
        """Have the writer write group ``index`` alone, then view it; the writer's start (monotonic ns)."""
        self._conn.send(("one", index))
        start = self._reply()
        layout, offsets = self._ones[index % len(self._ones)]
        self._tensors(layout, offsets, ALL_COLUMNS, False)
        return int(start)

    def handoff(self, iters: int) -> list[float]:
        """One group from the writer process to this (waiting) process: the writer's start of the copy to
        tensors over it here, seconds, ``iters`` times."""
        out = []
        for i in range(iters):
            start = self._one(i)
            out.append((time.monotonic_ns() - start) / 1e9)
        return out
