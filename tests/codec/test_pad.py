"""``layout="padded"``: the one-pass padder (``codec/_pad.py``) against a padding built row by row.

Each test pins a branch of the padder or a case the routes before it got wrong: columns sharing offsets,
zero padding left to ``numpy.zeros`` (and ``-0.0``, which is not zero bits), unsigned dtypes, empty rows
and batches, and padding values that a float64 round trip or a float16 would change.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight.codec import decode, decode_numpy
from trajflight.errors import InvalidRequestError

NUMERIC = [
    *(pa.type_for_alias(f"{kind}{bits}") for kind in ("int", "uint") for bits in (8, 16, 32, 64)),
    *(pa.type_for_alias(f"float{bits}") for bits in (16, 32, 64)),
]


def _expected(rows: list[list[Any]], dtype: np.dtype[Any], pad: Any) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = np.array(row, dtype=dtype)
    return out


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _batch(**columns: tuple[list[list[Any]], pa.DataType]) -> pa.RecordBatch:
    return pa.record_batch({n: pa.array(rows, type=pa.list_(t)) for n, (rows, t) in columns.items()})


@pytest.mark.parametrize("type_", NUMERIC, ids=str)
@pytest.mark.parametrize("pad", ["zero", "one", "max"])
def test_every_numeric_dtype_pads_with_its_value_bit_exact(type_, pad):
    """uint16/32/64 columns used to fail in torch's mask scatter (NotImplementedError, untyped)."""
    dtype = np.dtype(type_.to_pandas_dtype())
    value = {"zero": 0, "one": 1, "max": np.iinfo(dtype).max if dtype.kind in "iu" else 65504}[pad]
    rows = [[1, 2, 3], [], [4], [5, 6]]
    batch = _batch(x=(rows, type_))
    got = decode(batch, layout="padded", padding_value=value).padded["x"]
    want = _expected(rows, dtype, value)
    assert got.values.numpy().dtype == dtype
    assert _bits(got.values.numpy()) == _bits(want)
    assert got.lengths.dtype == torch.int64
    assert got.lengths.tolist() == [3, 0, 1, 2]
    numpy_got = decode_numpy(batch, layout="padded", padding_value=value).padded["x"]
    assert _bits(numpy_got.values) == _bits(want)


def test_columns_sharing_offsets_are_padded_as_each_alone_with_their_own_lengths():
    rows = [[3, 1, 4], [], [1, 5, 9, 2, 6]]
    other = [[7], [8, 8], []]
    batch = _batch(
        response_ids=(rows, pa.int32()),
        response_logprobs=([[float(v) / 2 for v in r] for r in rows], pa.float32()),
        loss_mask=([[1] * len(r) for r in rows], pa.uint8()),
        other=(other, pa.int64()),
    )
    out = decode(batch, layout="padded", padding_value=-0.0)
    ids, lp, mask = (out.padded[n] for n in ("response_ids", "response_logprobs", "loss_mask"))
    assert _bits(ids.values.numpy()) == _bits(_expected(rows, np.dtype(np.int32), 0))
    assert _bits(lp.values.numpy()) == _bits(
        _expected([[v / 2 for v in r] for r in rows], np.dtype(np.float32), -0.0)
    )
    assert np.signbit(lp.values.numpy()[1]).all()  # -0.0 is not zero bits: written, sign kept
    assert _bits(mask.values.numpy()) == _bits(_expected([[1] * len(r) for r in rows], np.dtype(np.uint8), 0))
    assert _bits(out.padded["other"].values.numpy()) == _bits(_expected(other, np.dtype(np.int64), 0))
    assert out.padded["other"].lengths.tolist() == [1, 2, 0]
    lengths = [p.lengths for p in (ids, lp, mask)]
    assert all(t.tolist() == [3, 0, 5] for t in lengths)
    lengths[0][0] = 99  # each column its own lengths tensor: a write to one stays there
    assert lengths[1][0] == 3
    assert lengths[2][0] == 3


def test_padded_tensors_own_their_memory_and_do_not_alias_arrow():
    batch = _batch(x=([[1, 2], [3]], pa.int32()))
    got = decode(batch, layout="padded").padded["x"].values
    assert got.is_contiguous()
    got[0, 0] = 42
    assert batch.column("x")[0].as_py() == [1, 2]


@pytest.mark.parametrize(
    "rows",
    [[], [[]], [[], [], []], [[], [1, 2], []]],
    ids=["no rows", "one empty row", "all rows empty", "empty first and last"],
)
@pytest.mark.parametrize("pad", [0, -7])
def test_empty_rows_and_batches(rows, pad):
    batch = _batch(x=(rows, pa.int32()))
    got = decode(batch, layout="padded", padding_value=pad).padded["x"]
    want = _expected(rows, np.dtype(np.int32), pad)
    assert tuple(got.values.shape) == want.shape
    assert got.values.numpy().tolist() == want.tolist()
    assert got.lengths.tolist() == [len(r) for r in rows]


def test_sliced_batch_pads_its_own_rows():
    rows = [[1], [2, 3], [4, 5, 6], [7]]
    batch = _batch(x=(rows, pa.int16())).slice(1, 2)
    got = decode(batch, layout="padded", padding_value=9).padded["x"]
    assert got.values.tolist() == [[2, 3, 9], [4, 5, 6]]


def test_a_large_int64_padding_value_is_exact_in_a_large_batch():
    """The jagged->dense kernel took the padding value as a float64 (2**62 + 1 -> 2**62) from 1M
    padded elements on; the mask path below it kept it exact. Exact at every size now."""
    lengths = [1] * 299 + [5000]  # 300 rows x 5000 = 1.5M padded elements
    rows = [list(range(n)) for n in lengths]
    got = decode(_batch(x=(rows, pa.int64())), layout="padded", padding_value=2**62 + 1).padded["x"]
    assert int(got.values[0, 1]) == 2**62 + 1
    assert int(got.values[-1, -1]) == 4999


def test_a_padding_value_past_float16_is_refused_with_a_typed_error():
    """torch.full rounds 70000 to inf in one float16 element and refuses it in several (an untyped
    RuntimeError from decode before); refused up front now, naming the column."""
    with pytest.raises(InvalidRequestError, match="padding_value 70000 cannot pad column 'x'") as info:
        decode(_batch(x=([[1.0], []], pa.float16())), layout="padded", padding_value=70000)
    assert info.value.column == "x"
    got = decode(_batch(x=([[1.0], []], pa.float16())), layout="padded", padding_value=float("inf"))
    assert got.padded["x"].values[1, 0] == float("inf")  # an infinite value asked for is kept


ROWS = st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12), max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    ids=ROWS,
    type_=st.sampled_from([pa.int32(), pa.int64(), pa.float32(), pa.float64()]),
    pad=st.sampled_from([0, 1, -0.0, 0.5, 3, 255]),
)
def test_padded_equals_a_row_by_row_padding(ids, type_, pad):
    dtype = np.dtype(type_.to_pandas_dtype())
    if dtype.kind == "f":
        ids = [[v / 8 for v in r] for r in ids]
    mask = [[int(v) % 251 for v in r] for r in ids]
    batch = _batch(a=(ids, type_), b=(mask, pa.uint8()))
    out = decode(batch, layout="padded", padding_value=pad)
    torch_pad = torch.full((), pad, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype).numpy()
    assert _bits(out.padded["a"].values.numpy()) == _bits(_expected(ids, dtype, torch_pad))
    mask_pad = np.uint8(int(pad))
    assert _bits(out.padded["b"].values.numpy()) == _bits(_expected(mask, np.dtype(np.uint8), mask_pad))
    assert out.padded["a"].lengths.tolist() == [len(r) for r in ids]
