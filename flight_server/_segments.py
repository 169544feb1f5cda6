"""Arrow IPC streams in one buffer: how a group part is written to, and read from, one segment.

A :data:`Placement` hands out buffers (Arrow's pool with :func:`heap_placement`; the shared-memory arena,
:mod:`.shm._arena`, hands out its segments the same way). :func:`serialize_segment` writes batches into
exactly one such buffer with one copy, and :func:`open_segment` reopens it as a table that aliases the
buffer. A process that maps the same bytes (a same-host reader of a shared-memory file) opens them the same
way, with no copy. :func:`concat_groups` and :func:`join_batches` join groups' tables and batches.

This module does not free or recycle buffers: a segment lives as long as something references it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = [
    "Placement",
    "concat_groups",
    "heap_placement",
    "join_batches",
    "open_segment",
    "serialize_segment",
    "stream_size",
    "write_stream",
]

Placement = Callable[[int], pa.Buffer]
"""``place(size)`` returns a mutable buffer of exactly ``size`` bytes that the store may keep."""


def heap_placement(size: int) -> pa.Buffer:
    """Place segments in Arrow's default memory pool (64-byte aligned, returned on free)."""
    return pa.allocate_buffer(size)


def serialize_segment(batches: Sequence[pa.RecordBatch], schema: pa.Schema, allocate: Placement) -> pa.Buffer:
    """Write ``batches`` as one IPC stream into one buffer of exactly the stream's size (one copy).

    The result is owned by the caller (and whoever ``allocate`` delegates to); it does not alias the
    batches, so the received Flight buffers can be freed right after.
    """
    buffer = allocate(stream_size(schema, batches))
    with pa.FixedSizeBufferWriter(buffer) as out:
        write_stream(out, schema, batches)
    return buffer


def write_stream(sink: Any, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> None:
    """Write ``batches`` into ``sink`` (a pyarrow output stream or a file) as one IPC stream: schema,
    batches, end-of-stream."""
    with ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def stream_size(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> int:
    """Bytes of ``batches`` as one IPC stream (:func:`write_stream`), computed without copying."""
    sizer = pa.MockOutputStream()
    write_stream(sizer, schema, batches)
    return int(sizer.size())


def open_segment(segment: pa.Buffer) -> pa.Table:
    """Open a segment as a table whose columns alias the segment's memory (no copy)."""
    return ipc.open_stream(pa.BufferReader(segment)).read_all()


def concat_groups(tables: Sequence[pa.Table]) -> pa.Table:
    """Groups' tables as one, rows in order, with no copy of their data (chunks are kept).

    Groups whose appended columns differ are joined with the missing columns read as nulls.
    """
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:  # groups with different appended columns: missing ones read as nulls
        return pa.concat_tables(tables, promote_options="default")


def join_batches(batches: Sequence[pa.RecordBatch], schema: pa.Schema | None = None) -> pa.RecordBatch:
    """Record batches of one schema (``schema``, where given) as one record batch, rows in order: one copy
    of their buffers, dictionaries unified (``pyarrow.concat_batches``, as ``codec.encode_groups`` joins).

    Raises:
        pyarrow.ArrowInvalid: the batches do not share one schema.
    """
    if schema is not None and batches and not batches[0].schema.equals(schema):
        raise pa.ArrowInvalid(f"a batch's schema {batches[0].schema} is not the stream's {schema}")
    return pa.concat_batches(batches)
