"""decode / decode_numpy: zero-copy views, layouts, slices, chunks, alignment, nulls, devices."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import torch

from trajflight.codec import DoublyRagged, decode, decode_numpy, encode_group
from trajflight.errors import InvalidRequestError, SchemaError


def _address(array: pa.Array) -> int:
    return array.buffers()[1].address + array.offset * (array.type.bit_width // 8)


@pytest.fixture
def batch(simple_group):
    lengths = [4, 0, 7]
    return encode_group(
        **simple_group,
        advantage=[0.5, None, -0.5],
        top_p_ids=[[[t, t + 1, t + 2][: 1 + t % 3] for t in range(n)] for n in lengths],
        top_p_probs=[[[0.5, 0.25, 0.25][: 1 + t % 3] for t in range(n)] for n in lengths],
        finish_reason=["stop", "length", "stop"],
        telemetry=[{"ms": 1.0}, {"ms": 2.0}, {"ms": 3.0}],
    )


def test_jagged_tensors_alias_arrow_buffers(batch):
    out = decode(batch, columns=["response_ids", "reward"])
    nested = out.tensors["response_ids"]
    assert nested.is_nested
    assert nested.values().data_ptr() == batch.column("response_ids").values.buffers()[1].address
    assert out.tensors["reward"].data_ptr() == _address(batch.column("reward"))
    assert [row.tolist() for row in nested.unbind()] == batch.column("response_ids").to_pylist()
    assert out.columns == ("response_ids", "reward")


def test_writes_through_a_decoded_tensor_reach_the_arrow_data(batch):
    """DLPack ignores Arrow's read-only flag: the docstring warns, this test pins it."""
    out = decode(batch, columns=["reward"])
    out.tensors["reward"][0] = 42.0
    assert batch.column("reward")[0].as_py() == 42.0


def test_padded_layout_pads_to_the_longest_row(batch):
    out = decode(batch, columns=["response_ids", "response_logprobs"], layout="padded", padding_value=-1)
    padded = out.padded["response_ids"]
    assert padded.values.shape == (3, 7)
    assert padded.lengths.tolist() == [4, 0, 7]
    assert padded.values[1].tolist() == [-1] * 7
    assert padded.values[0, :4].tolist() == batch.column("response_ids")[0].as_py()
    assert out.padded["response_logprobs"].values.dtype == torch.float32


def test_doubly_ragged_columns_give_values_and_both_offset_levels(batch):
    top = decode(batch, columns=["top_p_ids"]).doubly_ragged["top_p_ids"]
    assert top.outer_offsets.tolist() == [0, 4, 4, 11]
    rows = batch.column("top_p_ids").to_pylist()
    flat_tokens = [token for row in rows for token in row]
    assert len(top.inner_offsets) == len(flat_tokens) + 1
    for j, token in enumerate(flat_tokens):
        assert top.values[top.inner_offsets[j] : top.inner_offsets[j + 1]].tolist() == token


def test_strings_dictionaries_and_structs_stay_arrow(batch):
    out = decode(batch, columns=["sample_id", "finish_reason", "telemetry", "job_id"])
    assert set(out.arrow) == {"sample_id", "finish_reason", "telemetry", "job_id"}
    assert out.arrow["finish_reason"].to_pylist() == ["stop", "length", "stop"]


def test_nulls_need_a_fill_value_and_the_error_names_the_row(batch):
    with pytest.raises(SchemaError, match=r"'advantage' row 1 is null.*fill_nulls") as info:
        decode(batch, columns=["advantage"])
    assert (info.value.column, info.value.row) == ("advantage", 1)
    filled = decode(batch, columns=["advantage"], fill_nulls={"advantage": 0.0})
    assert filled.tensors["advantage"].tolist() == [0.5, 0.0, -0.5]


def test_null_rows_in_list_columns_are_refused():
    array = pa.array([[1, 2], None], pa.list_(pa.int32()))
    with pytest.raises(SchemaError, match="ragged columns decode without nulls"):
        decode(pa.record_batch({"ids": array}))


def test_sliced_batches_rebase_offsets_and_keep_aliasing(batch):
    sliced = batch.slice(1, 2)
    out = decode(sliced, columns=["response_ids"])
    nested = out.tensors["response_ids"]
    assert nested.offsets().tolist() == [0, 0, 7]
    assert [r.tolist() for r in nested.unbind()] == sliced.column("response_ids").to_pylist()
    # Values alias the parent's buffer, starting at the slice's first value.
    parent = batch.column("response_ids").values
    assert nested.values().data_ptr() == _address(parent) + 4 * 4
    numpy_out = decode_numpy(sliced, columns=["response_ids", "top_p_ids"])
    assert numpy_out.ragged["response_ids"].offsets.tolist() == [0, 0, 7]
    assert numpy_out.doubly_ragged["top_p_ids"].outer_offsets.tolist() == [0, 0, 7]


def test_several_groups_are_joined_with_one_copy(simple_group):
    a = encode_group(**simple_group)
    b = encode_group(**{**simple_group, "group_id": 6})
    for data in ([a, b], pa.Table.from_batches([a, b])):
        out = decode(data, columns=["response_ids", "group_id"])
        assert out.num_rows == 6
        rows = [r.tolist() for r in out.tensors["response_ids"].unbind()]
        assert rows == a.column("response_ids").to_pylist() + b.column("response_ids").to_pylist()
        assert out.tensors["group_id"].tolist() == [5, 5, 5, 6, 6, 6]


def test_batches_of_different_schemas_are_refused(simple_group):
    a = encode_group(**simple_group)
    b = encode_group(**simple_group, advantage=[1.0, 2.0, 3.0])
    with pytest.raises(SchemaError, match="another schema"):
        decode([a, b])
    projected = decode([a.select(["reward"]), b.select(["reward"])])
    assert projected.num_rows == 6


def _misaligned_copy(array: pa.Array) -> pa.Array:
    """The same values in a buffer whose address is 1 byte off (as Flight receive buffers can be)."""
    raw = bytearray(len(array) * 4 + 8)
    base = pa.py_buffer(raw)
    start = (-base.address) % 8 + 1
    raw[start : start + len(array) * 4] = array.to_numpy().tobytes()
    data = base.slice(start, len(array) * 4)
    return pa.Array.from_buffers(array.type, len(array), [None, data])


def test_misaligned_buffers_are_copied_to_aligned_memory():
    values = pa.array(np.arange(10, dtype=np.float32))
    odd = _misaligned_copy(values)
    assert odd.buffers()[1].address % 4 != 0
    out = decode(pa.record_batch({"x": odd}))
    assert out.tensors["x"].data_ptr() % 4 == 0
    assert out.tensors["x"].tolist() == values.to_pylist()


def test_ipc_round_trip_decodes_without_copies(batch):
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    received = ipc.open_stream(sink.getvalue()).read_all()
    out = decode(received, columns=["response_logprobs"])
    assert out.tensors["response_logprobs"].values().data_ptr() == _address(
        received.column("response_logprobs").chunk(0).values
    )


def test_bool_columns_become_uint8():
    out = decode(pa.record_batch({"flag": pa.array([True, False, True])}))
    assert out.tensors["flag"].dtype == torch.uint8
    assert out.tensors["flag"].tolist() == [1, 0, 1]


def test_numpy_twin_aliases_and_pads(batch):
    out = decode_numpy(batch, columns=["response_ids", "reward"])
    ragged = out.ragged["response_ids"]
    assert ragged.values.ctypes.data == batch.column("response_ids").values.buffers()[1].address
    assert ragged.offsets.tolist() == [0, 4, 4, 11]
    padded = decode_numpy(batch, columns=["response_ids"], layout="padded").padded["response_ids"]
    assert padded.values.shape == (3, 7)
    assert padded.lengths.tolist() == [4, 0, 7]


def test_zero_rows_decode_to_empty_tensors(simple_group):
    empty = encode_group(**simple_group).slice(0, 0)
    out = decode(empty, columns=["response_ids", "reward"])
    assert out.num_rows == 0
    assert out.tensors["reward"].shape == (0,)
    assert out.tensors["response_ids"].size(0) == 0
    assert decode(empty, columns=["response_ids"], layout="padded").padded["response_ids"].values.shape == (
        0,
        0,
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"layout": "dense"}, InvalidRequestError, "layout must be"),
        ({"device": "mps"}, InvalidRequestError, "device must be"),
        ({"columns": ["nope"]}, SchemaError, r"\['nope'\] are not in the batch"),
    ],
)
def test_bad_decode_arguments(batch, kwargs, error, message):
    with pytest.raises(error, match=message):
        decode(batch, **kwargs)


PADDED_IDS = {"columns": ["response_ids"], "layout": "padded"}
# Regressions: each of these raised a raw TypeError, ValueError, OverflowError, RuntimeError or Arrow error.
BAD_ARGUMENTS = [
    # (id, kwargs, message)
    ("columns a string", {"columns": "reward"}, r"columns=\['reward'\]"),
    ("columns not iterable", {"columns": 5}, "list of column names"),
    ("fill_nulls not a mapping", {"fill_nulls": [0.0]}, "fill_nulls must be a mapping"),
    ("fill value of another type", {"fill_nulls": {"advantage": "x"}}, r"fill_nulls\['advantage'\] = 'x'"),
    ("fill value None", {"fill_nulls": {"advantage": None}}, r"fill_nulls\['advantage'\] is None"),
    ("padding a string", {**PADDED_IDS, "padding_value": "x"}, "padding_value"),
    ("padding past int32", {**PADDED_IDS, "padding_value": 2**40}, "int32"),
    ("padding None", {**PADDED_IDS, "padding_value": None}, "padding_value"),
    # Regressions: decode_numpy padded integers with garbage (and a RuntimeWarning) where decode refused.
    (
        "padding NaN for integers",
        {**PADDED_IDS, "padding_value": float("nan")},
        "padding_value nan cannot pad",
    ),
    (
        "padding inf for integers",
        {**PADDED_IDS, "padding_value": float("inf")},
        "padding_value inf cannot pad",
    ),
    ("padding past int32 as a float", {**PADDED_IDS, "padding_value": 1e20}, "'response_ids' of dtype"),
    (
        "padding NaN for the mask",
        {"columns": ["loss_mask"], "layout": "padded", "padding_value": np.nan},
        "nan",
    ),
    # Regression: decode padded the uint8 mask with 255 (torch wraps -1) where decode_numpy refused.
    (
        "padding -1 for the mask",
        {"columns": ["loss_mask"], "layout": "padded", "padding_value": -1},
        "padding_value -1 cannot pad column 'loss_mask'",
    ),
]


@pytest.mark.parametrize("decoder", [decode, decode_numpy], ids=["torch", "numpy"])
@pytest.mark.parametrize(
    ("kwargs", "message"), [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS]
)
def test_bad_arguments_of_both_decoders_give_an_invalid_request(batch, decoder, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        decoder(batch, **kwargs)


@pytest.mark.parametrize("device", ["not a device", "cuda:x", 3.5])
def test_a_device_torch_cannot_parse_is_an_invalid_request(batch, device):
    """Regression: torch.device's RuntimeError escaped decode."""
    with pytest.raises(InvalidRequestError, match="device must be"):
        decode(batch, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where torch sees no CUDA device")
def test_a_cuda_device_without_cuda_is_an_invalid_request(batch):
    """Regression: torch's pinned-memory RuntimeError escaped decode on a machine without CUDA."""
    with pytest.raises(InvalidRequestError, match=r"torch\.cuda\.is_available\(\) is False"):
        decode(batch, columns=["reward"], device="cuda")


def test_bool_columns_take_a_bool_fill_value():
    """Regression: a bool fill for a bool column (decoded as uint8) raised a raw ArrowTypeError."""
    table = pa.table({"done": pa.array([True, None, False])})
    assert decode(table, fill_nulls={"done": True}).tensors["done"].tolist() == [1, 1, 0]
    assert decode_numpy(table, fill_nulls={"done": False}).arrays["done"].tolist() == [1, 0, 0]


def test_non_arrow_input_is_refused():
    with pytest.raises(InvalidRequestError, match="RecordBatch"):
        decode({"a": [1]})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="empty list"):
        decode([])
    for data in ("groups", b"groups", pa.array([1, 2])):  # iterable, but not of record batches
        with pytest.raises(InvalidRequestError, match="takes a RecordBatch, a Table or a list"):
            decode(data)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_device_decode_is_bit_exact_and_on_the_gpu(batch):
    out = decode(batch, columns=["response_ids", "response_logprobs", "reward", "top_p_ids"], device="cuda")
    torch.cuda.synchronize()
    assert out.device == "cuda"
    nested = out.tensors["response_logprobs"]
    assert nested.is_cuda
    host = decode(batch, columns=["response_logprobs", "reward"])
    assert torch.equal(
        nested.values().cpu().view(torch.int32), host.tensors["response_logprobs"].values().view(torch.int32)
    )
    assert torch.equal(out.tensors["reward"].cpu(), host.tensors["reward"])
    assert out.doubly_ragged["top_p_ids"].values.is_cuda


@pytest.mark.gpu
def test_cuda_inputs_are_staged_through_pinned_memory(simple_group):
    ids, offsets = simple_group["response_ids"]
    on_gpu = {
        **simple_group,
        "response_ids": (torch.from_numpy(ids).cuda(), torch.from_numpy(offsets).cuda()),
    }
    batch = encode_group(**on_gpu)
    assert batch.column("response_ids").values.to_numpy().tolist() == ids.tolist()


def test_ragged_layout_gives_plain_values_and_offsets_aliasing_arrow(batch):
    out = decode(batch, columns=["response_ids", "reward"], layout="ragged")
    ragged = out.ragged["response_ids"]
    assert ragged.values.data_ptr() == batch.column("response_ids").values.buffers()[1].address
    assert ragged.offsets.tolist() == [0, 4, 4, 11]
    assert ragged.offsets.dtype == torch.int32  # cu_seqlens for variable-length kernels
    assert "response_ids" not in out.tensors
    assert out.tensors["reward"].shape == (3,)
    assert decode_numpy(batch, columns=["response_ids"], layout="ragged").ragged[
        "response_ids"
    ].offsets.tolist() == [0, 4, 4, 11]


def test_large_padded_batches_match_the_rows_of_a_small_one():
    """A batch of 1.5M padded elements (once torch's jagged->dense kernel, a mask scatter below 1M)
    has the same rows as a small slice of it."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 64, 300)
    lengths[7] = 5000  # 300 rows x 5000 = 1.5M padded elements
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 1000, int(offsets[-1])).astype(np.int32)
    array = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    batch = pa.record_batch({"ids": array})
    padded = decode(batch, layout="padded", padding_value=-1).padded["ids"]
    assert padded.values.shape == (300, 5000)
    for i in (0, 7, 299):
        row = values[offsets[i] : offsets[i + 1]]
        assert padded.values[i, : len(row)].tolist() == row.tolist()
        assert (padded.values[i, len(row) :] == -1).all()
    small = decode(batch.slice(0, 5), layout="padded", padding_value=-1).padded["ids"]
    assert torch.equal(small.values, padded.values[:5, : small.values.shape[1]])


@pytest.mark.parametrize("layout", ["jagged", "ragged"])
def test_list_columns_of_equal_row_lengths_share_one_offsets_tensor(simple_group, layout):
    out = decode(encode_group(**simple_group), layout=layout)

    def offsets(name):
        return out.tensors[name].offsets() if layout == "jagged" else out.ragged[name].offsets

    assert offsets("response_logprobs") is offsets("response_ids")
    assert offsets("loss_mask") is offsets("response_ids")
    assert offsets("prompt_ids") is not offsets("response_ids")  # other row lengths: its own
    if layout == "jagged":  # torch accepts elementwise operations between them only so
        masked = out.tensors["response_logprobs"] * out.tensors["loss_mask"]
        assert torch.equal(masked.values(), out.tensors["response_logprobs"].values() * 1)


# --- Samples without top-p candidates ---------------------------------------------------------------------

# Per sample, per response token, the candidates; sample 1 has none (None, as encode_group documents).
CANDIDATE_IDS = [[[1, 2], [3], [4, 5, 6]], None, [[7], [8, 9]]]
CANDIDATE_PROBS = [[[0.5, 0.5], [1.0], [0.25, 0.25, 0.5]], None, [[1.0], [0.75, 0.25]]]


@pytest.fixture
def without_candidates() -> pa.RecordBatch:
    """A 3-sample group (3, 4 and 2 response tokens) whose sample 1 has no top-p candidates."""
    lengths = [3, 4, 2]
    offsets = np.zeros(4, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return encode_group(
        job_id="job",
        epoch=1,
        group_id=0,
        prompt_ids=np.arange(5, dtype=np.int32),
        response_ids=(np.arange(9, dtype=np.int32), offsets),
        response_logprobs=(np.zeros(9, dtype=np.float32), offsets),
        reward=np.ones(3, dtype=np.float32),
        top_p_ids=CANDIDATE_IDS,
        top_p_probs=CANDIDATE_PROBS,
    )


def _samples(top: DoublyRagged) -> list[list[list[float]]]:
    """Per sample, per token, the candidates a DoublyRagged holds (numpy arrays or tensors)."""
    outer, inner, values = (
        np.asarray(a).tolist() for a in (top.outer_offsets, top.inner_offsets, top.values)
    )
    return [
        [values[inner[t] : inner[t + 1]] for t in range(outer[i], outer[i + 1])]
        for i in range(len(outer) - 1)
    ]


def _ipc_round_trip(batch: pa.RecordBatch) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(sink.getvalue()).read_next_batch()


@pytest.mark.parametrize("layout", ["jagged", "ragged", "padded"])
@pytest.mark.parametrize("decoder", [decode, decode_numpy], ids=["torch", "numpy"])
def test_a_sample_without_top_p_candidates_decodes_as_zero_tokens(without_candidates, decoder, layout):
    """Regression: encode_group wrote ``None`` as a null top-p row (valid, and stored by the server), then
    decode refused the whole column ("'top_p_ids': row 1 is null"): a trainer distilling from top-p
    candidates crashed on the first sample without them. The null sample now spans zero tokens; the
    others keep their candidates, and everything still aliases Arrow's buffers."""
    for batch in (without_candidates, _ipc_round_trip(without_candidates)):
        out = decoder(batch, layout=layout)
        ids, probs = out.doubly_ragged["top_p_ids"], out.doubly_ragged["top_p_probs"]
        assert np.asarray(ids.outer_offsets).tolist() == [0, 3, 3, 5]
        assert _samples(ids) == [CANDIDATE_IDS[0], [], CANDIDATE_IDS[2]]
        assert _samples(probs) == [CANDIDATE_PROBS[0], [], CANDIDATE_PROBS[2]]  # exact in float32
        assert np.asarray(probs.outer_offsets).tolist() == [0, 3, 3, 5]
        # Zero copy: a null row that spans no token (as Arrow builds it) needs no rewriting.
        column = batch.column("top_p_ids")
        values, outer = ids.values, ids.outer_offsets
        pointer = values.data_ptr() if isinstance(values, torch.Tensor) else values.ctypes.data
        assert pointer == column.values.values.buffers()[1].address
        pointer = outer.data_ptr() if isinstance(outer, torch.Tensor) else outer.ctypes.data
        assert pointer == column.buffers()[1].address


def test_samples_without_candidates_in_a_slice_and_across_groups(without_candidates):
    sliced = decode_numpy(without_candidates.slice(1), columns=["top_p_ids"]).doubly_ragged["top_p_ids"]
    assert sliced.outer_offsets.tolist() == [0, 0, 2]
    assert _samples(sliced) == [[], CANDIDATE_IDS[2]]
    joined = decode([without_candidates, without_candidates], columns=["top_p_ids"]).doubly_ragged[
        "top_p_ids"
    ]
    assert joined.outer_offsets.tolist() == [0, 3, 3, 5, 8, 8, 10]
    assert _samples(joined) == [CANDIDATE_IDS[0], [], CANDIDATE_IDS[2]] * 2


@pytest.mark.parametrize("decoder", [decode, decode_numpy], ids=["torch", "numpy"])
def test_a_null_top_p_row_spanning_tokens_decodes_as_zero_tokens(decoder):
    """Arrow lets a null row span tokens (encode_group never writes one); they are not the sample's, even
    a null token among them: the row decodes as zero tokens and the others keep their candidates."""
    tokens = pa.array([[1, 2], [3], [9], None, [4], [5, 6]], pa.list_(pa.int32()))
    for list_type, offsets_type in ((pa.ListArray, pa.int32()), (pa.LargeListArray, pa.int64())):
        offsets = pa.array([0, 2, 4, 6], offsets_type)
        column = list_type.from_arrays(offsets, tokens, mask=pa.array([False, True, False]))
        top = decoder(pa.record_batch({"top_p_ids": column})).doubly_ragged["top_p_ids"]
        assert np.asarray(top.outer_offsets).tolist() == [0, 2, 2, 4]
        assert _samples(top) == [[[1, 2], [3]], [], [[4], [5, 6]]]


def test_a_non_nullable_doubly_ragged_column_still_refuses_null_rows(without_candidates):
    index = without_candidates.schema.get_field_index("top_p_ids")
    field = without_candidates.schema.field(index).with_nullable(False)
    strict = without_candidates.set_column(index, field, without_candidates.column(index))
    for decoder in (decode, decode_numpy):
        with pytest.raises(SchemaError, match="'top_p_ids': row 1 is null") as info:
            decoder(strict, columns=["top_p_ids"])
        assert (info.value.column, info.value.row) == ("top_p_ids", 1)


def _candidates_in_one_column(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    """``batch`` (the ``without_candidates`` group) with sample 1's candidates in top-p column ``name``
    (one per token of its 4), None in the other: a group validate_group refuses, as another tool could
    still write one to a file."""
    index = batch.schema.get_field_index(name)
    rows = batch.column(index).to_pylist()
    rows[1] = [[7 if name == "top_p_ids" else 1.0]] * 4
    return batch.set_column(index, batch.schema.field(index), pa.array(rows, batch.schema.field(index).type))


@pytest.mark.parametrize(("name", "other"), [("top_p_probs", "top_p_ids"), ("top_p_ids", "top_p_probs")])
@pytest.mark.parametrize("decoder", [decode, decode_numpy], ids=["torch", "numpy"])
def test_top_p_columns_null_for_different_samples_are_refused(without_candidates, decoder, name, other):
    """Regression: data that skipped validate_group (a file written by another tool) with a sample None in
    one top-p column only decoded with the two columns' outer offsets misaligned ([0, 3, 3, 5] against
    [0, 3, 7, 9]): a loss pairing ids with probs read another sample's probabilities. Decoding both
    columns refuses it, naming the None column and the row as validate_group does."""
    lone = _candidates_in_one_column(without_candidates, name)
    message = f"column {other!r} row 1 is None but {name} row 1 is not: both must be None"
    for batch in (lone, _ipc_round_trip(lone)):
        with pytest.raises(SchemaError, match=message + ".*columns=") as info:
            decoder(batch)
        assert (info.value.column, info.value.row) == (other, 1)
        with pytest.raises(SchemaError, match=message):
            decoder(batch, columns=["top_p_probs", "response_ids", "top_p_ids"])
    with pytest.raises(SchemaError, match=f"column {other!r} row 4 is None") as info:
        decoder([without_candidates, lone])  # rows count through the batches, as in the other errors
    assert info.value.row == 4
    # Each column alone has nothing to disagree with; a slice past the sample is not refused.
    assert decoder(lone, columns=[other]).num_rows == 3
    assert decoder(lone, columns=[name, "response_ids"]).num_rows == 3
    assert decoder(lone.slice(2)).num_rows == 1


# --- Null entries inside list rows ------------------------------------------------------------------------

IDS_2 = pa.list_(pa.list_(pa.int32()))
NULL_ENTRIES = [
    # (id, column, row, message): 100 full rows first, so that an index into all values is not the row's.
    (
        "entry",
        pa.array([[0.5] * 40] * 100 + [[0.5], [], [1.0, None]], pa.list_(pa.float32())),
        102,
        r"'x' row 102 entry 1 is null",
    ),
    (
        "token",
        pa.array([[[1]] * 40] * 100 + [[[1]], [[2], None]], IDS_2),
        101,
        r"'x' row 101 token 1 is null",
    ),
    (
        "candidate",
        pa.array([[[1]] * 40] * 100 + [[[1]], [[2], [3, None]]], IDS_2),
        101,
        r"'x' row 101 token 1 candidate 1 is null",
    ),
]


@pytest.mark.parametrize(
    ("column", "row", "message"), [c[1:] for c in NULL_ENTRIES], ids=[c[0] for c in NULL_ENTRIES]
)
@pytest.mark.parametrize("decoder", [decode, decode_numpy], ids=["torch", "numpy"])
def test_a_null_inside_a_list_row_is_refused_naming_row_and_entry(decoder, column, row, message):
    """Regression: decode said "value 4209 is null" (an index into all the column's values) and set no
    ``row``; it names the row and the entry in it, as encode_group and validate_group do. In a slice the
    row counts from the slice's first."""
    batch = pa.record_batch({"x": column})
    with pytest.raises(SchemaError, match=message + ".*columns=") as info:
        decoder(batch)
    assert (info.value.column, info.value.row) == ("x", row)
    with pytest.raises(SchemaError, match=message.replace(str(row), str(row - 100))) as info:
        decoder(batch.slice(100))
    assert info.value.row == row - 100
    assert decoder(batch.slice(0, 100)).num_rows == 100  # the null lies outside the slice's rows


def test_list_and_large_list_columns_of_the_same_rows_share_offsets():
    """The shared-offsets lookup compares values, not Arrow types: int32 and int64 offsets of equal rows
    give one offsets tensor, so their jagged tensors combine elementwise."""
    rows = [[1, 2], [], [3, 4, 5]]
    batch = pa.record_batch(
        {
            "a": pa.array(rows, type=pa.list_(pa.int32())),
            "b": pa.array(rows, type=pa.large_list(pa.int32())),
            "c": pa.array([[1], [2], [3]], type=pa.list_(pa.int32())),
        }
    )
    out = decode(batch)
    assert out.tensors["a"].offsets() is out.tensors["b"].offsets()
    assert out.tensors["c"].offsets() is not out.tensors["a"].offsets()
    assert [t.tolist() for t in (out.tensors["a"] * out.tensors["b"]).unbind()] == [[1, 4], [], [9, 16, 25]]
