"""codec._jagged: the direct nested-tensor constructor agrees with torch's public one, or is not used."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight.codec import _jagged
from trajflight.codec._jagged import jagged

DTYPES = (torch.int32, torch.int64, torch.float32, torch.uint8)
# Row lengths, value dtype and offsets dtype of a jagged tensor.
ROWS = {
    "lengths": st.lists(st.integers(0, 9), min_size=1, max_size=8),
    "dtype": st.sampled_from(DTYPES),
    "offsets_dtype": st.sampled_from((torch.int32, torch.int64)),
}


def _public(values: torch.Tensor, offsets: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=max_seqlen)


def _offsets(lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=dtype)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out


@settings(max_examples=60, deadline=None)
@given(**ROWS)
def test_jagged_equals_the_public_constructor(lengths, dtype, offsets_dtype):
    offsets = _offsets(lengths, offsets_dtype)
    values = torch.arange(int(offsets[-1]), dtype=torch.int64).to(dtype)
    got, want = jagged(values, offsets, max(lengths)), _public(values, offsets, max(lengths))
    assert type(got) is type(want)
    assert got.size(0) == want.size(0) == len(lengths)
    assert got.dim() == want.dim()
    assert got.dtype == want.dtype
    assert got._max_seqlen == want._max_seqlen == max(lengths)
    assert got.offsets() is offsets
    assert got.values().data_ptr() == values.data_ptr()  # aliases, no copy
    assert [t.tolist() for t in got.unbind()] == [t.tolist() for t in want.unbind()]
    assert torch.equal(got.to_padded_tensor(0), want.to_padded_tensor(0))
    # Ordinary nested-tensor ops work on it as on the public one.
    assert torch.equal((got * 2).values(), (want * 2).values())


@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="proven on torch 2.13 only")
def test_direct_constructor_is_used_on_the_pinned_torch():
    assert _jagged._builder() is not _jagged._public


def test_values_that_require_grad_take_the_public_view():
    values = torch.arange(6, dtype=torch.float32, requires_grad=True)
    offsets = torch.tensor([0, 1, 6])
    nested = jagged(values, offsets, 5)
    nested.values().sum().backward()
    assert torch.equal(values.grad, torch.ones(6))


def test_a_probe_that_disagrees_falls_back_to_the_public_constructor(monkeypatch):
    monkeypatch.setattr(_jagged, "_same", lambda *args: False)
    _jagged._builder.cache_clear()
    try:
        assert _jagged._builder() is _jagged._public
        values, offsets = torch.arange(3), torch.tensor([0, 3])
        assert jagged(values, offsets, 3).unbind()[0].tolist() == [0, 1, 2]
    finally:
        _jagged._builder.cache_clear()  # the next call proves the direct way again, unpatched


def test_a_missing_torch_internal_falls_back_to_the_public_constructor(monkeypatch):
    import torch.nested._internal.nested_tensor as internal

    monkeypatch.delattr(internal, "_store_val_in_tensor")
    _jagged._builder.cache_clear()
    try:
        assert _jagged._builder() is _jagged._public
    finally:
        monkeypatch.undo()
        _jagged._builder.cache_clear()


@settings(max_examples=40, deadline=None)
@given(**ROWS)
def test_a_tensor_built_like_another_equals_the_public_constructor(lengths, dtype, offsets_dtype):
    offsets = _offsets(lengths, offsets_dtype)
    first = jagged(torch.arange(int(offsets[-1]), dtype=torch.int32), offsets, max(lengths))
    values = torch.arange(int(offsets[-1]), dtype=torch.int64).to(dtype)
    got, want = jagged(values, offsets, max(lengths), like=first), _public(values, offsets, max(lengths))
    assert type(got) is type(want)
    assert got.shape == want.shape
    assert got.stride() == want.stride()
    assert got.dtype == want.dtype
    assert got._max_seqlen == want._max_seqlen == max(lengths)
    assert got.offsets() is offsets
    assert got.values().data_ptr() == values.data_ptr()
    assert torch.equal(got.to_padded_tensor(0), want.to_padded_tensor(0))
    # Columns of one offsets tensor combine elementwise, as torch allows for the public ones.
    assert torch.equal((got * first.to(dtype)).values(), (want * first.to(dtype)).values())


def test_like_over_other_offsets_is_not_used():
    first = jagged(torch.arange(5), torch.tensor([0, 2, 5]), 3)
    offsets = torch.tensor([0, 4, 5])
    got = jagged(torch.arange(5), offsets, 4, like=first)
    assert got.offsets() is offsets
    assert [t.tolist() for t in got.unbind()] == [[0, 1, 2, 3], [4]]


@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="proven on torch 2.13 only")
def test_the_sibling_constructor_is_used_on_the_pinned_torch():
    assert _jagged._sibling_builder() is not None


def test_a_sibling_probe_that_disagrees_falls_back(monkeypatch):
    monkeypatch.setattr(_jagged, "_same", lambda *args: False)
    _jagged._sibling_builder.cache_clear()
    try:
        assert _jagged._sibling_builder() is None
        offsets = torch.tensor([0, 1, 3])
        first = jagged(torch.arange(3), offsets, 2)
        assert [t.tolist() for t in jagged(torch.arange(3) * 2, offsets, 2, like=first).unbind()] == [
            [0],
            [2, 4],
        ]
    finally:
        _jagged._sibling_builder.cache_clear()
