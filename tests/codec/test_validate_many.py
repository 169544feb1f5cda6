"""validate_groups against validate_group of each group: the same verdict and the same error, always.

A storage server validates a ``put_many`` stream with one ``validate_groups`` call instead of one
``validate_group`` per group; the stream is untrusted input, so the batched pass may only ever accept what
every per-group call accepts, and where any group is refused, the error must be the one the per-group
calls raise first. These tests reuse test_validate's generated groups (valid and invalid: nulls, null
entries, wrong keys, ragged lengths, slices, dictionary job ids, after IPC or not).
"""

from __future__ import annotations

import io
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_validate import _outcome, groups

from trajflight import workload
from trajflight.codec import (
    STANDARD_SCHEMA,
    TrajectorySchema,
    _validate_many,
    validate_group,
    validate_groups,
)
from trajflight.errors import SchemaError
from trajflight.keys import Partition

_Case = tuple[pa.RecordBatch, TrajectorySchema, Partition | None]


def _keyed(case: _Case) -> bool:
    return case[2] is not None and case[0].num_rows > 0


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[pa.RecordBatch], TrajectorySchema, list[Partition]]:
    """Groups of one stream: batches of one Arrow schema and one trajectory schema, each with its key."""
    first = draw(groups().filter(_keyed))
    more = draw(st.lists(groups().filter(_keyed), max_size=3))
    # Only groups of the first one's schemas can share its stream (a stream has one schema).
    same = [c for c in more if c[1] is first[1] and c[0].schema.equals(first[0].schema)]
    cases = [first, *same]
    return [c[0] for c in cases], first[1], [c[2] for c in cases]  # type: ignore[misc]


def _one_by_one(batches: list[pa.RecordBatch], schema: TrajectorySchema, keys: list[Partition]) -> None:
    for batch, key in zip(batches, keys, strict=True):
        validate_group(batch, schema, expect=key, full=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_many_at_once_and_one_by_one_give_the_same_verdict(case: Any):
    batches, schema, keys = case
    table = pa.Table.from_batches(batches)
    rows = [b.num_rows for b in batches]
    many = _outcome(lambda: validate_groups(table, schema, keys, rows))
    single = _outcome(lambda: _one_by_one(batches, schema, keys))
    if single[0] == "returned":
        assert many == ("returned", None)
    else:
        assert many == single


def _ipc_stream(batches: list[pa.RecordBatch]) -> pa.Table:
    """``batches`` as a storage server receives a put_many: one IPC stream, read back as a table."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return ipc.open_stream(pa.BufferReader(sink.getvalue())).read_all()


def _workload(top_p: bool) -> tuple[list[pa.RecordBatch], list[Partition]]:
    groups_ = workload.make_workload(6, 8, seed=0, top_p=top_p, response_median=16.0)
    return [g.encode("job", 1) for g in groups_], [Partition("job", 1, g.group_id) for g in groups_]


@pytest.mark.parametrize("top_p", [False, True], ids=["plain", "top_p"])
@pytest.mark.parametrize("joined", [False, True], ids=["a-batch-per-group", "one-batch"])
def test_a_valid_stream_is_accepted_in_one_pass(top_p, joined):
    """What keeps a server's put_many cheap: no group-by-group validate_group where every group is fine,
    whether each group is a batch of its own (a Flight put_many) or all share one (a same-host batch)."""
    batches, keys = _workload(top_p)
    table = _ipc_stream([pa.concat_batches(batches)] if joined else batches)
    with mock.patch.object(_validate_many, "validate_group", side_effect=AssertionError("group by group")):
        validate_groups(table, STANDARD_SCHEMA, keys, [8] * len(keys))


@pytest.mark.parametrize("joined", [False, True], ids=["a-batch-per-group", "one-batch"])
@pytest.mark.parametrize("column", ["group_id", "epoch", "job_id"])
def test_a_wrong_key_in_a_later_group_is_named_with_that_group_s_row(joined, column):
    batches, keys = _workload(top_p=False)
    bad = batches[3]
    index = bad.schema.get_field_index(column)
    values = bad.column(index).to_pylist()
    values[5] = "other" if column == "job_id" else values[5] + 7
    batches[3] = bad.set_column(
        index, bad.schema.field(index), pa.array(values, bad.schema.field(index).type)
    )
    table = _ipc_stream([pa.concat_batches(batches)] if joined else batches)
    with pytest.raises(SchemaError, match=rf"{column!r} row 5 ") as info:
        validate_groups(table, STANDARD_SCHEMA, keys, [8] * len(keys))
    assert (info.value.column, info.value.row) == (column, 5)


def test_rows_that_do_not_add_up_are_refused():
    batches, keys = _workload(top_p=False)
    with pytest.raises(ValueError, match="row counts"):
        validate_groups(pa.Table.from_batches(batches), STANDARD_SCHEMA, keys, [8] * (len(keys) - 1))
    with pytest.raises(ValueError, match="row counts"):
        validate_groups(pa.Table.from_batches(batches), STANDARD_SCHEMA, keys, [7] * len(keys))


def test_a_ragged_length_that_disagrees_in_one_group_is_named():
    batches, keys = _workload(top_p=False)
    bad = batches[2]
    index = bad.schema.get_field_index("loss_mask")
    masks = bad.column(index).to_pylist()
    masks[1] = [*masks[1], 1]
    batches[2] = bad.set_column(index, bad.schema.field(index), pa.array(masks, bad.schema.field(index).type))
    with pytest.raises(SchemaError, match="'loss_mask' row 1") as info:
        validate_groups(_ipc_stream(batches), STANDARD_SCHEMA, keys, [8] * len(keys))
    assert info.value.row == 1


def test_offsets_going_backwards_in_one_group_are_refused_as_invalid_arrow_data():
    """Arrow's full validation runs on every batch: offsets that go backwards (which Arrow's cheap
    validation lets through: it reads the first and the last) are never read."""
    batches, keys = _workload(top_p=False)
    bad = batches[4]
    index = bad.schema.get_field_index("prompt_ids")
    column = bad.column(index)
    offsets = np.asarray(column.offsets).copy()
    offsets[3], offsets[4] = offsets[4], offsets[3]  # row 3 ends before it starts
    broken = pa.Array.from_buffers(
        column.type, len(column), [None, pa.py_buffer(offsets.tobytes())], children=[column.values]
    )
    batches[4] = bad.set_column(index, bad.schema.field(index), broken)
    with pytest.raises(SchemaError, match="invalid Arrow data"):
        validate_groups(pa.Table.from_batches(batches), STANDARD_SCHEMA, keys, [8] * len(keys))
