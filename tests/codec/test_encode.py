"""encode_group: every accepted input form, zero-copy where promised, defaults and user columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from trajflight.codec import STANDARD_SCHEMA, DoublyRagged, Padded, Ragged, decode_numpy, encode_group


def _values_address(batch: pa.RecordBatch, name: str) -> int:
    column = batch.column(name)
    return column.values.buffers()[1].address


def _rows(batch: pa.RecordBatch, name: str) -> list[list[float]]:
    return batch.column(name).to_pylist()


def test_numpy_values_offsets_are_aliased_not_copied(simple_group):
    batch = encode_group(**simple_group)
    ids, _ = simple_group["response_ids"]
    logprobs, _ = simple_group["response_logprobs"]
    assert _values_address(batch, "response_ids") == ids.ctypes.data
    assert _values_address(batch, "response_logprobs") == logprobs.ctypes.data
    assert batch.column("reward").buffers()[1].address == simple_group["reward"].ctypes.data


def test_torch_tensors_and_nested_jagged_tensors_are_aliased(simple_group):
    ids, offsets = simple_group["response_ids"]
    logprobs, _ = simple_group["response_logprobs"]
    ids_t, logprobs_t = torch.from_numpy(ids), torch.from_numpy(logprobs)
    reward = torch.tensor([1.0, 0.0, 1.0])
    nested = torch.nested.nested_tensor_from_jagged(ids_t, torch.from_numpy(offsets).long())
    batch = encode_group(
        **{
            **simple_group,
            "response_ids": nested,
            "response_logprobs": Ragged(logprobs_t, torch.from_numpy(offsets)),
            "reward": reward,
        }
    )
    assert _values_address(batch, "response_ids") == ids_t.data_ptr()
    assert _values_address(batch, "response_logprobs") == logprobs_t.data_ptr()
    assert batch.column("reward").buffers()[1].address == reward.data_ptr()


def test_tensors_that_require_grad_are_detached_not_refused(simple_group):
    logprobs, offsets = simple_group["response_logprobs"]
    with_grad = torch.from_numpy(logprobs.copy()).requires_grad_()
    batch = encode_group(**{**simple_group, "response_logprobs": (with_grad, torch.from_numpy(offsets))})
    assert _values_address(batch, "response_logprobs") == with_grad.data_ptr()


@pytest.mark.parametrize(
    "form",
    [
        "python lists",
        "per-sample numpy",
        "per-sample torch",
        "tuple",
        "Ragged",
        "Padded numpy",
        "Padded torch",
        "nested",
        "pyarrow",
    ],
)
def test_every_ragged_input_form_gives_the_same_rows(simple_group, form):
    ids, offsets = simple_group["response_ids"]
    rows = [ids[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    lengths = np.diff(offsets)
    padded = np.zeros((len(rows), lengths.max()), dtype=np.int32)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    value = {
        "python lists": [r.tolist() for r in rows],
        "per-sample numpy": rows,
        "per-sample torch": [torch.from_numpy(r) for r in rows],
        "tuple": (ids, offsets),
        "Ragged": Ragged(ids, offsets),
        "Padded numpy": Padded(padded, lengths),
        "Padded torch": Padded(torch.from_numpy(padded), torch.from_numpy(lengths)),
        "nested": torch.nested.nested_tensor_from_jagged(
            torch.from_numpy(ids), torch.from_numpy(offsets).long()
        ),
        "pyarrow": pa.array([r.tolist() for r in rows], pa.list_(pa.int64())),
    }[form]
    batch = encode_group(**{**simple_group, "response_ids": value})
    assert batch.column("response_ids").to_pylist() == [r.tolist() for r in rows]


def test_a_2d_array_is_read_as_equal_length_rows(simple_group):
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    logprobs = np.zeros((3, 4), dtype=np.float32)
    batch = encode_group(**{**simple_group, "response_ids": ids, "response_logprobs": logprobs})
    assert _rows(batch, "response_ids") == ids.tolist()
    assert _values_address(batch, "response_ids") == ids.ctypes.data


def test_a_flat_prompt_is_shared_by_every_sample(simple_group):
    batch = encode_group(**simple_group)
    assert _rows(batch, "prompt_ids") == [list(range(6))] * 3
    per_sample = encode_group(**{**simple_group, "prompt_ids": [[1], [2, 3], []]})
    assert _rows(per_sample, "prompt_ids") == [[1], [2, 3], []]


def test_defaults_fill_keys_ids_mask_and_policy_version(simple_group):
    batch = encode_group(**simple_group)
    assert batch.column("job_id").to_pylist() == ["job"] * 3
    assert batch.column("epoch").to_pylist() == [2] * 3
    assert batch.column("group_id").to_pylist() == [5] * 3
    assert batch.column("sample_index").to_pylist() == [0, 1, 2]
    assert batch.column("sample_id").to_pylist() == ["job/2/5/0", "job/2/5/1", "job/2/5/2"]
    assert batch.column("policy_version").to_pylist() == [0, 0, 0]
    assert [set(row) for row in _rows(batch, "loss_mask")] == [{1}, set(), {1}]
    assert [len(r) for r in _rows(batch, "loss_mask")] == [4, 0, 7]
    assert "advantage" not in batch.schema.names


def test_bool_masks_are_viewed_as_uint8_without_a_copy(simple_group):
    _, offsets = simple_group["response_ids"]
    mask = np.ones(int(offsets[-1]), dtype=bool)
    mask[::2] = False
    batch = encode_group(**{**simple_group, "loss_mask": (mask, offsets)})
    assert batch.schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert _values_address(batch, "loss_mask") == mask.ctypes.data
    assert (
        np.concatenate([np.array(r, dtype=bool) for r in _rows(batch, "loss_mask")]).tolist() == mask.tolist()
    )


def test_int64_token_ids_within_range_are_converted(simple_group):
    ids, offsets = simple_group["response_ids"]
    batch = encode_group(**{**simple_group, "response_ids": (ids.astype(np.int64), offsets)})
    assert batch.schema.field("response_ids").type == pa.list_(pa.int32())
    assert batch.column("response_ids").values.to_numpy().tolist() == ids.tolist()


def test_optional_standard_columns(simple_group):
    lengths = [4, 0, 7]
    top_ids = [[[t, t + 1] for t in range(n)] for n in lengths]
    top_probs = [[[0.75, 0.25] for _ in range(n)] for n in lengths]
    batch = encode_group(
        **simple_group,
        advantage=[0.5, None, -0.5],
        policy_version=[3, 3, 4],
        sample_ids=["a", "b", "c"],
        top_p_ids=top_ids,
        top_p_probs=top_probs,
        finish_reason=["stop", "length", "stop"],
        telemetry=[{"queue_ms": 1.5, "engine": "vllm"}] * 3,
    )
    assert batch.column("advantage").to_pylist() == [0.5, None, -0.5]
    assert batch.column("policy_version").to_pylist() == [3, 3, 4]
    assert batch.column("top_p_ids").to_pylist() == top_ids
    assert batch.schema.field("finish_reason").type == pa.dictionary(pa.int8(), pa.string())
    assert batch.column("finish_reason").to_pylist() == ["stop", "length", "stop"]
    assert batch.column("telemetry").to_pylist()[0] == {"queue_ms": 1.5, "engine": "vllm"}


def test_doubly_ragged_values_are_aliased(simple_group):
    _, offsets = simple_group["response_ids"]
    tokens = int(offsets[-1])
    inner = np.arange(tokens + 1, dtype=np.int32) * 2
    cand_ids = np.arange(2 * tokens, dtype=np.int32)
    cand_probs = np.full(2 * tokens, 0.5, dtype=np.float32)
    batch = encode_group(
        **simple_group,
        top_p_ids=DoublyRagged(cand_ids, offsets, inner),
        top_p_probs=DoublyRagged(cand_probs, offsets, inner),
    )
    assert batch.column("top_p_ids").values.values.buffers()[1].address == cand_ids.ctypes.data
    assert batch.column("top_p_ids").to_pylist()[0][1] == [2, 3]


def test_telemetry_as_a_dict_of_columns(simple_group):
    batch = encode_group(
        **simple_group, telemetry={"ttft_ms": np.array([1.0, 2.0, 3.0]), "retries": [0, 1, 0]}
    )
    assert batch.column("telemetry").to_pylist()[1] == {"ttft_ms": 2.0, "retries": 1}


def test_declared_integer_telemetry_fields_keep_their_integers(simple_group):
    """The refusal of floats and bools in declared integer fields (they were truncated) keeps what was
    accepted: Python and numpy ints, None (a null), a missing field (a null), a null sample, lists and a
    nested struct; as a list of dicts, a generator of them, a dict of columns (lists, integer arrays, one
    int for every sample) and a pyarrow struct array, which is cast as any Arrow input is (2.0 becomes 2)."""
    schema = STANDARD_SCHEMA.with_telemetry(
        pa.struct(
            [
                ("num_preemptions", pa.int64()),
                ("ttft_ms", pa.float64()),
                ("cached", pa.list_(pa.int32())),
                ("kv", pa.struct([("blocks", pa.int16())])),
            ]
        )
    )
    rows = [
        {"num_preemptions": 1, "ttft_ms": 0.5, "cached": [1, np.int64(2)], "kv": {"blocks": np.int16(3)}},
        {"num_preemptions": np.int64(2), "ttft_ms": 1, "cached": None, "kv": None},
        None,
    ]
    expected = [
        {"num_preemptions": 1, "ttft_ms": 0.5, "cached": [1, 2], "kv": {"blocks": 3}},
        {"num_preemptions": 2, "ttft_ms": 1.0, "cached": None, "kv": None},
        None,
    ]
    for given in (rows, (row for row in rows)):
        batch = encode_group(**simple_group, telemetry=given, schema=schema)
        assert batch.column("telemetry").to_pylist() == expected
    missing = encode_group(
        **simple_group, telemetry=[{"ttft_ms": 0.5}, {}, {"num_preemptions": None}], schema=schema
    )
    assert [row["num_preemptions"] for row in missing.column("telemetry").to_pylist()] == [None] * 3
    columns = {
        "num_preemptions": [1, None, np.int32(3)],
        "cached": [[1], [], None],
        "kv": [{"blocks": 1}, None, {"blocks": np.int64(2)}],
    }
    for given_column, expected_column in [
        (np.array([1, 2, 3]), [1, 2, 3]),
        (torch.tensor([1, 2, 3]), [1, 2, 3]),
        (7, [7, 7, 7]),
        (pa.array([1.0, 2.0, 3.0]), [1, 2, 3]),
    ]:
        batch = encode_group(
            **simple_group, telemetry={**columns, "num_preemptions": given_column}, schema=schema
        )
        assert [row["num_preemptions"] for row in batch.column("telemetry").to_pylist()] == expected_column
    batch = encode_group(**simple_group, telemetry=columns, schema=schema)
    assert [row["kv"] for row in batch.column("telemetry").to_pylist()] == [
        {"blocks": 1},
        None,
        {"blocks": 2},
    ]
    arrow = pa.array([{"num_preemptions": 2.0}] * 3)
    batch = encode_group(**simple_group, telemetry=arrow, schema=schema)
    assert [row["num_preemptions"] for row in batch.column("telemetry").to_pylist()] == [2] * 3


def test_undeclared_telemetry_keeps_its_inferred_types(simple_group):
    """The check of fields inference made integer (apache/arrow GH-40910) leaves floats floats and ints
    ints, numpy ints included."""
    rows = [{"n": 1, "ms": 0.5}, {"n": np.int64(2), "ms": 1}, {"n": None, "ms": np.float16(1.5)}]
    batch = encode_group(**simple_group, telemetry=rows)
    assert str(batch.schema.field("telemetry").type) == "struct<n: int64, ms: double>"
    assert batch.column("telemetry").to_pylist() == [
        {"n": 1, "ms": 0.5},
        {"n": 2, "ms": 1.0},
        {"n": None, "ms": 1.5},
    ]


def test_user_columns_of_several_arrow_types(simple_group):
    _, offsets = simple_group["response_ids"]
    ref = np.linspace(-1, 0, int(offsets[-1]), dtype=np.float32)
    batch = encode_group(
        **simple_group,
        extra={
            "ref_logprobs": (ref, offsets),
            "tag": ["a", "b", None],
            "score": np.array([0.1, 0.2, 0.3]),
            "meta": pa.array([{"k": 1}, {"k": 2}, {"k": 3}]),
            "labels": pa.array(["x", "y", "x"]).dictionary_encode(),
            "spans": [[[1, 2]], [], [[3], [4, 5]]],
        },
    )
    assert batch.schema.field("ref_logprobs").type == pa.list_(pa.float32())
    assert _values_address(batch, "ref_logprobs") == ref.ctypes.data
    assert batch.column("tag").to_pylist() == ["a", "b", None]
    assert batch.schema.field("score").type == pa.float64()
    assert batch.column("meta").to_pylist()[2] == {"k": 3}
    assert pa.types.is_dictionary(batch.schema.field("labels").type)
    assert batch.column("spans").to_pylist() == [[[1, 2]], [], [[3], [4, 5]]]


def test_declared_user_columns_take_the_declared_type(simple_group):
    from trajflight.codec import STANDARD_SCHEMA

    schema = STANDARD_SCHEMA.extend(("score", pa.float32()))
    batch = encode_group(**simple_group, extra={"score": [1, 2, 3]}, schema=schema)
    assert batch.schema.field("score").type == pa.float32()


def test_zero_samples_make_an_empty_group(simple_group):
    empty = np.empty(0, dtype=np.int32)
    batch = encode_group(
        **{
            **simple_group,
            "response_ids": [],
            "response_logprobs": [],
            "reward": np.empty(0, dtype=np.float32),
            "prompt_ids": empty,
        }
    )
    assert batch.num_rows == 0
    assert batch.schema.field("response_ids").type == pa.list_(pa.int32())


def test_python_bool_masks_are_stored_as_uint8(simple_group):
    """Regression: lists of Python bools were refused for the uint8 loss mask ("Expected integer, got
    bool"), while numpy and torch bool masks were accepted."""
    rows = [[True, False, True, True], [], [False] * 3 + [True] * 4]
    as_ints = [[int(v) for v in row] for row in rows]
    tensors, arrays = (
        [torch.tensor(r, dtype=torch.bool) for r in rows],
        [np.array(r, dtype=bool) for r in rows],
    )
    for mask in (rows, tensors, arrays):
        batch = encode_group(**simple_group, loss_mask=mask)
        assert batch.schema.field("loss_mask").type == pa.list_(pa.uint8())
        assert batch.column("loss_mask").to_pylist() == as_ints


def test_integer_lists_of_numpy_ints_and_nulls_convert_exactly(simple_group):
    """The float check's tiers (apache/arrow GH-40910 made pyarrow's own inference unusable for it) keep
    what was accepted: numpy integer scalars in lists, nulls in user columns, ids past 2**31 in an int64
    column, and numpy int64 scalars whose sum overflows (summed on the way, without a warning)."""
    big = np.int64(2**62)
    batch = encode_group(
        **{**simple_group, "prompt_ids": [np.int64(1), 2, np.uint8(3)]},
        policy_version=[np.int32(4), 5, 6],
        top_p_ids=[[[np.int16(1), 2]] * 4, None, [[3]] * 7],
        extra={"hashes": [[big, big], [], [None, -big]], "n": [[2**40], None, [np.int64(-(2**63))]]},
    )
    assert batch.column("prompt_ids").to_pylist() == [[1, 2, 3]] * 3
    assert batch.column("policy_version").to_pylist() == [4, 5, 6]
    assert batch.column("top_p_ids").to_pylist()[0] == [[1, 2]] * 4
    assert batch.schema.field("hashes").type == pa.list_(pa.int64())
    assert batch.column("hashes").to_pylist() == [[2**62, 2**62], [], [None, -(2**62)]]
    assert batch.column("n").to_pylist() == [[2**40], None, [-(2**63)]]


def test_undeclared_ragged_user_columns_take_the_values_dtype(simple_group):
    """Regression: an undeclared user column given as Ragged, Padded, DoublyRagged, per-sample tensors, a
    bfloat16 tensor or a (uint8 values, offsets) tuple failed with a raw TypeError or ArrowInvalid."""
    values, offsets = simple_group["response_ids"]
    lengths = np.diff(offsets)
    padded = np.zeros((3, int(lengths.max())), dtype=np.float32)
    for i, n in enumerate(lengths):
        padded[i, :n] = 0.5
    rows = [torch.full((int(n),), 0.5) for n in lengths]
    batch = encode_group(
        **simple_group,
        extra={
            "ragged": Ragged(values.astype(np.int16), offsets),
            "ragged_torch": Ragged(torch.from_numpy(values).long(), torch.from_numpy(offsets)),
            "padded": Padded(padded, lengths),
            "padded_torch": Padded(torch.from_numpy(padded).double(), torch.from_numpy(lengths)),
            "rows_torch": rows,
            "pair_uint8": (np.ones(len(values), dtype=np.uint8), offsets.astype(np.int64)),
            "pair_int32": (values, offsets.astype(np.int64)),
            "bf16": torch.ones(3, dtype=torch.bfloat16),
            "candidates": DoublyRagged(np.arange(12, dtype=np.int32), offsets, np.arange(12, dtype=np.int32)),
        },
    )
    types = {name: str(batch.schema.field(name).type) for name in batch.schema.names[-9:]}
    assert types == {
        "ragged": "list<item: int16>",
        "ragged_torch": "list<item: int64>",
        "padded": "list<item: float>",
        "padded_torch": "list<item: double>",
        "rows_torch": "list<item: float>",
        "pair_uint8": "list<item: uint8>",
        "pair_int32": "list<item: int32>",
        "bf16": "float",
        "candidates": "list<item: list<item: int32>>",
    }
    expected = [[0.5] * int(n) for n in lengths]
    for name in ("padded", "padded_torch", "rows_torch"):
        assert batch.column(name).to_pylist() == expected
    assert batch.column("ragged").to_pylist() == batch.column("response_ids").to_pylist()
    assert batch.column("bf16").to_pylist() == [1.0, 1.0, 1.0]


def test_a_user_column_given_one_scalar_repeats_it_for_every_sample(simple_group):
    """Regression: an undeclared scalar (``extra={"temperature": 0.7}``) failed with a raw TypeError; a
    declared one was already repeated, as policy_version is."""
    batch = encode_group(
        **simple_group, extra={"temperature": 0.7, "seed": 7}, telemetry={"engine": 1, "ms": [1.0, 2.0, 3.0]}
    )
    assert batch.column("temperature").to_pylist() == [0.7] * 3
    assert batch.column("seed").to_pylist() == [7] * 3
    assert batch.column("telemetry").to_pylist()[2] == {"engine": 1, "ms": 3.0}


def test_a_user_column_given_none_is_left_out(simple_group):
    """None leaves a user column out, as it does the optional keyword arguments (it raised a KeyError)."""
    batch = encode_group(**simple_group, extra={"ref_logprobs": None, "score": [1.0, 2.0, 3.0]})
    assert "ref_logprobs" not in batch.schema.names
    assert batch.column("score").to_pylist() == [1.0, 2.0, 3.0]


def test_nulls_decode_can_take_are_still_accepted(simple_group):
    """The refusal of null entries inside standard ragged rows (they passed encode and decode refused
    them) stops there: a null outside a sliced Arrow input, a top-p row without candidates and nulls in
    user columns (every user column round-trips, nulls included) are kept."""
    values, offsets = simple_group["response_logprobs"]
    rows = [None, *(row.tolist() for row in np.split(values, offsets[1:-1]))]
    sliced = pa.array(rows, pa.list_(pa.float32())).slice(1)
    batch = encode_group(
        **{**simple_group, "response_logprobs": sliced},
        top_p_ids=[None, [], [[1]] * 7],
        top_p_probs=[None, [], [[0.5]] * 7],
        extra={
            "tags": [["a", None], [], ["b"]],
            "flags": [[True, None], [], [False]],
            "ref": [[0.5, None], [], []],
        },
    )
    assert batch.column("response_logprobs").to_pylist() == rows[1:]
    assert batch.column("top_p_ids").to_pylist()[0] is None
    assert batch.column("tags").to_pylist()[0] == ["a", None]
    assert batch.column("flags").to_pylist()[0] == [True, None]
    assert batch.column("ref").to_pylist()[0] == [0.5, None]


def test_a_per_sample_array_is_stored_in_either_form_the_3d_error_names(simple_group):
    """The refusal of a [K, A, B] user column (its message said only "expected 1-D") names two forms that
    store it; both round-trip."""
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    batch = encode_group(
        **simple_group,
        extra={"flat": x.reshape(3, -1), "shaped": pa.FixedShapeTensorArray.from_numpy_ndarray(x)},
    )
    assert batch.schema.field("flat").type == pa.list_(pa.float32())
    out = decode_numpy(batch, columns=["flat", "shaped"])
    np.testing.assert_array_equal(out.ragged["flat"].values.reshape(3, 2, 2), x)
    np.testing.assert_array_equal(out.arrow["shaped"].to_numpy_ndarray(), x)
