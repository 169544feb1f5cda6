"""decode's remembered column plans (codec._decode_columns): never stale for another schema, bounded."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from trajflight.codec import _decode_columns, decode, decode_numpy
from trajflight.codec._decode_columns import Kind, columns_of
from trajflight.errors import SchemaError


def _batch(types: dict[str, pa.DataType], nullable: bool = True) -> pa.RecordBatch:
    arrays = {
        name: pa.array([[1, 2], [3]] if pa.types.is_list(t) else [1, 2], type=t) for name, t in types.items()
    }
    schema = pa.schema([pa.field(n, t, nullable=nullable) for n, t in types.items()])
    return pa.RecordBatch.from_arrays(list(arrays.values()), schema=schema)


def test_two_schemas_alternating_decode_each_as_its_own():
    ints = _batch({"a": pa.int64(), "b": pa.list_(pa.int32())})
    other = _batch({"b": pa.float32(), "a": pa.list_(pa.uint8())})
    for _ in range(3):
        one, two = decode(ints), decode(other)
        assert one.tensors["a"].dtype == torch.int64
        assert one.tensors["b"].is_nested
        assert two.tensors["b"].dtype == torch.float32
        assert two.tensors["a"].dtype == torch.uint8
        assert [r.tolist() for r in two.tensors["a"].unbind()] == [[1, 2], [3]]


def test_the_same_names_with_other_types_are_not_served_a_stale_entry():
    as_int = _batch({"x": pa.int32()})
    as_list = _batch({"x": pa.list_(pa.int32())})
    as_string = pa.record_batch({"x": pa.array(["p", "q"])})
    assert decode(as_int).tensors["x"].dtype == torch.int32
    assert decode(as_list).tensors["x"].is_nested
    assert decode(as_string).arrow["x"].to_pylist() == ["p", "q"]
    assert decode(as_int).tensors["x"].tolist() == [1, 2]


def test_nullability_is_part_of_the_entry():
    nested = pa.list_(pa.list_(pa.int32()))
    rows = pa.array([[[1]], None], type=nested)
    loose = pa.RecordBatch.from_arrays([rows], schema=pa.schema([pa.field("c", nested, nullable=True)]))
    strict = pa.RecordBatch.from_arrays([rows], schema=pa.schema([pa.field("c", nested, nullable=False)]))
    assert decode(loose).doubly_ragged["c"].outer_offsets.tolist() == [0, 1, 1]
    with pytest.raises(SchemaError, match="non-nullable"):
        decode(strict)
    assert decode(loose).doubly_ragged["c"].outer_offsets.tolist() == [0, 1, 1]


def test_projected_columns_have_their_own_entries():
    batch = _batch({"a": pa.int64(), "b": pa.list_(pa.int32()), "c": pa.float32()})
    assert decode(batch, columns=["c", "a"]).columns == ("c", "a")
    assert decode(batch).columns == ("a", "b", "c")
    assert decode(batch, columns=["b"]).columns == ("b",)
    assert decode_numpy(batch, columns=["c", "a"]).columns == ("c", "a")
    with pytest.raises(SchemaError, match=r"columns \['zz'\] are not in the batch"):
        decode(batch, columns=["a", "zz"])
    assert decode(batch, columns=["a"]).tensors["a"].tolist() == [1, 2]


def test_equal_schemas_share_one_entry_and_metadata_does_not_matter():
    one = _batch({"a": pa.int64()})
    two = _batch({"a": pa.int64()}).replace_schema_metadata({"k": "v"})
    assert columns_of(one.schema, None) is columns_of(two.schema, None)
    assert columns_of(one.schema, ["a"]) is not columns_of(one.schema, None)
    assert columns_of(one.schema, None).columns[0].kind is Kind.FLAT


def test_the_memo_is_bounded():
    for i in range(3 * _decode_columns._RECENT):
        decode(_batch({f"col{i}": pa.int32()}))
    assert len(_decode_columns._recent) == _decode_columns._RECENT


def test_a_column_named_twice_is_refused_by_name():
    batch = pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["d", "d"])
    with pytest.raises(SchemaError, match="'d' appears more than once"):
        decode(batch)
