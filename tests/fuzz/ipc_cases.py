"""Tampered Arrow IPC: record batches whose buffers lie (for a Flight ``do_put``, which frames them itself),
and tampered IPC stream bytes (for the same-host path, where the writer's bytes are the stream).

Every tampering here is invalid by construction, so any case the server accepted would be a finding:
offsets out of range or non-monotonic, invalid UTF-8, nulls in key columns, wrong types, missing
columns, wrong keys, per-token lengths that disagree; and for raw streams, a truncated stream, a flipped
byte in a region where any change is wrong (key columns, the per-token offsets), a corrupted message
length, a schema message that does not match its batch, a size outside the segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from flight_testkit import make_group

from trajflight.keys import Partition


def setcol(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    i = batch.schema.get_field_index(name)
    return batch.set_column(i, batch.schema.field(i).with_type(array.type), array)


def _offsets(column: pa.Array) -> np.ndarray:
    return np.frombuffer(column.buffers()[1], np.int32)[
        column.offset : column.offset + len(column) + 1
    ].copy()


def with_list_offset(batch: pa.RecordBatch, name: str, slot: int, value: int) -> pa.RecordBatch:
    """``batch`` with list column ``name``'s offset ``slot`` set to ``value`` (first and last offsets are
    checked when the array is built, so those must stay in range; the rest only a full validation sees)."""
    column = batch.column(name)
    offsets = _offsets(column)
    offsets[slot] = value
    array = pa.Array.from_buffers(
        column.type, len(column), [None, pa.py_buffer(offsets.tobytes())], children=[column.values]
    )
    return setcol(batch, name, array)


def bad_offset_values(batch: pa.RecordBatch, name: str, slot: int) -> list[int]:
    """Values of offset ``slot`` that no valid list array has: non-monotonic or out of range."""
    offsets = _offsets(batch.column(name))
    values_len = len(batch.column(name).values)
    out = [-1, -(2**31)]
    if slot > 0:
        out.append(int(offsets[slot - 1]) - 1)
    if slot < len(offsets) - 1:
        out.append(int(offsets[slot + 1]) + 1)
    out += [values_len + 1, 2**31 - 1]
    first_or_last = slot in (0, len(offsets) - 1)
    # the first and last offsets must stay within the values for the array to be built at all
    return [v for v in out if not first_or_last or 0 <= v <= values_len]


def _string_array(column: pa.Array, offsets: bytes | None = None, data: bytes | None = None) -> pa.Array:
    return pa.Array.from_buffers(
        pa.string(),
        len(column),
        [None, pa.py_buffer(offsets) if offsets is not None else column.buffers()[1],
         pa.py_buffer(data) if data is not None else column.buffers()[2]],
    )  # fmt: skip


def _bad_utf8(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    column = batch.column(name)
    data = bytearray(column.buffers()[2].to_pybytes())
    data[0] = 0xFF
    return setcol(batch, name, _string_array(column, data=bytes(data)))


def _string_offset(batch: pa.RecordBatch, name: str, slot: int, value: int) -> pa.RecordBatch:
    column = batch.column(name)
    offsets = np.frombuffer(column.buffers()[1], np.int32)[: len(column) + 1].copy()
    offsets[slot] = value
    return setcol(batch, name, _string_array(column, offsets=offsets.tobytes()))


def _null_in(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    column = batch.column(name)
    bitmap = pa.py_buffer(bytes([0b11111110]) + b"\xff" * 8)
    array = pa.Array.from_buffers(column.type, len(column), [bitmap, *column.buffers()[1:]], null_count=1)
    return setcol(batch, name, array)


def _lengths_disagree(batch: pa.RecordBatch) -> pa.RecordBatch:
    column = batch.column("response_logprobs")
    offsets = _offsets(column)
    offsets[1] += 1  # row 0 one token longer, row 1 one shorter: still a valid list, not a valid group
    array = pa.Array.from_buffers(
        column.type, len(column), [None, pa.py_buffer(offsets.tobytes())], children=[column.values]
    )
    return setcol(batch, "response_logprobs", array)


Tamper = Callable[[pa.RecordBatch], pa.RecordBatch]

BATCH_TAMPERS: dict[str, Tamper] = {
    "invalid-utf8-sample_id": lambda b: _bad_utf8(b, "sample_id"),
    "invalid-utf8-job_id": lambda b: _bad_utf8(b, "job_id"),
    "job_id-offset-beyond": lambda b: _string_offset(b, "job_id", 2, 10**7),
    "job_id-offset-negative": lambda b: _string_offset(b, "job_id", 3, -4),
    "sample_id-offset-decreasing": lambda b: _string_offset(b, "sample_id", 2, 0),
    "null-in-group_id": lambda b: _null_in(b, "group_id"),
    "null-in-epoch": lambda b: _null_in(b, "epoch"),
    "null-in-job_id": lambda b: _null_in(b, "job_id"),
    "null-in-sample_index": lambda b: _null_in(b, "sample_index"),
    "reward-int64": lambda b: setcol(b, "reward", pa.array(np.zeros(b.num_rows, np.int64))),
    "response_ids-int64-values": lambda b: setcol(
        b,
        "response_ids",
        pa.ListArray.from_arrays(
            b.column("response_ids").offsets, b.column("response_ids").values.cast(pa.int64())
        ),
    ),
    "loss_mask-bool": lambda b: setcol(
        b,
        "loss_mask",
        pa.ListArray.from_arrays(
            b.column("loss_mask").offsets, b.column("loss_mask").values.cast(pa.bool_())
        ),
    ),
    "epoch-string": lambda b: setcol(b, "epoch", pa.array(["1"] * b.num_rows)),
    "missing-reward": lambda b: b.drop_columns(["reward"]),
    "missing-group_id": lambda b: b.drop_columns(["group_id"]),
    "wrong-group_id": lambda b: setcol(b, "group_id", pa.array(np.full(b.num_rows, 7, np.int64))),
    "wrong-job_id": lambda b: setcol(b, "job_id", pa.array(["someone-else"] * b.num_rows)),
    "wrong-epoch": lambda b: setcol(b, "epoch", pa.array(np.zeros(b.num_rows, np.int64))),
    "one-row-of-another-group": lambda b: setcol(
        b, "group_id", pa.array(np.r_[b.column("group_id").to_numpy()[:-1], 7], pa.int64())
    ),
    "logprob-lengths-disagree": _lengths_disagree,
}


# --------------------------------------------------------------------------------------- raw streams


@dataclass(frozen=True)
class Stream:
    """A valid IPC stream's bytes and where its messages end."""

    data: bytes
    schema_end: int
    batch_end: int


def stream_of(batch: pa.RecordBatch, schema: pa.Schema | None = None) -> Stream:
    """``batch`` as one IPC stream (schema, the batch, end-of-stream); with ``schema``, that schema's
    message stands in for the batch's own (a schema that does not match its batch)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    reader = pa.BufferReader(data)
    pa.ipc.read_message(reader)
    schema_end = reader.tell()
    pa.ipc.read_message(reader)
    batch_end = reader.tell()
    if schema is not None:
        head = schema.serialize().to_pybytes()
        return Stream(head + data[schema_end:], len(head), len(head) + batch_end - schema_end)
    return Stream(data, schema_end, batch_end)


def joined(keys: list[Partition]) -> pa.RecordBatch:
    return pa.concat_batches([make_group(k) for k in keys])


def regions(batch: pa.RecordBatch, stream: Stream) -> dict[str, tuple[int, int]]:
    """Byte ranges of the stream where any change makes the group invalid: the key columns' buffers and
    the per-token offsets (found by their exact bytes)."""
    patterns = {
        "group_id": batch.column("group_id").to_numpy().astype("<i8").tobytes(),
        "epoch": batch.column("epoch").to_numpy().astype("<i8").tobytes(),
        "job_id-data": batch.column("job_id").buffers()[2].to_pybytes()[: 4 * batch.num_rows],
        "job_id-offsets": np.frombuffer(batch.column("job_id").buffers()[1], np.int32)[
            : batch.num_rows + 1
        ].tobytes(),
        "response_ids-offsets": _offsets(batch.column("response_ids")).tobytes(),
    }
    out = {}
    for name, pattern in patterns.items():
        at = stream.data.find(pattern, stream.schema_end)
        # The per-token columns share their offsets (the same bytes three times): a change to any one
        # of them breaks their agreement, so the first will do. Key buffers must be found once.
        if at >= 0 and (name.endswith("-offsets") or stream.data.find(pattern, at + 1) < 0):
            out[name] = (at, at + len(pattern))
    return out


def flip(data: bytes, at: int, xor: int) -> bytes:
    return data[:at] + bytes([data[at] ^ xor]) + data[at + 1 :]


def with_int32(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + int(value).to_bytes(4, "little", signed=True) + data[at + 4 :]


SCHEMA_SWAPS: dict[str, Callable[[pa.Schema], pa.Schema]] = {
    # the same buffers read under another type of the same width
    "reward-as-int32": lambda s: s.set(s.get_field_index("reward"), pa.field("reward", pa.int32())),
    "response_ids-as-uint32": lambda s: s.set(
        s.get_field_index("response_ids"), pa.field("response_ids", pa.list_(pa.uint32()))
    ),
    # a required column renamed (same length: the same layout)
    "reward-renamed": lambda s: s.set(s.get_field_index("reward"), pa.field("rewarx", pa.float32())),
    "group_id-as-float64": lambda s: s.set(s.get_field_index("group_id"), pa.field("group_id", pa.float64())),
}
