"""A table of bad inputs: each gives its typed error, naming the column (and row); nothing half-built."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from trajflight.codec import STANDARD_SCHEMA, DoublyRagged, Padded, encode_group, validate_group
from trajflight.errors import SchemaError
from trajflight.keys import Partition

from .conftest import ragged

IDS, OFFSETS = ragged([4, 0, 7], np.int32)
LOGPROBS, _ = ragged([4, 0, 7], np.float32, seed=1)

# A declared telemetry struct with integer fields: a scalar, a list, a nested struct's and a uint8.
TELEMETRY = STANDARD_SCHEMA.with_telemetry(
    pa.struct(
        [
            ("num_preemptions", pa.int64()),
            ("ttft_ms", pa.float64()),
            ("cached", pa.list_(pa.int32())),
            ("kv", pa.struct([("blocks", pa.int16()), ("util", pa.float32())])),
            ("flag", pa.uint8()),
        ]
    )
)


def telemetry_rows(**sample_1: object) -> dict[str, object]:
    """encode_group arguments: telemetry of three samples (a list of dicts), sample 1 overridden."""
    rows: list[dict[str, object]] = [{"num_preemptions": i, "ttft_ms": 0.5 + i} for i in range(3)]
    rows[1].update(sample_1)
    return {"telemetry": rows, "schema": TELEMETRY}


def telemetry_columns(**columns: object) -> dict[str, object]:
    """encode_group arguments: telemetry as a dict of per-sample columns over three samples."""
    return {"telemetry": {"ttft_ms": [0.5, 1.5, 2.5], **columns}, "schema": TELEMETRY}


BAD_INPUTS = [
    # (id, overrides, column, row, message)
    (
        "logprobs shorter",
        {"response_logprobs": [[0.1] * 4, [], [0.1] * 6]},
        "response_logprobs",
        2,
        "row 2 has 6 entries but response_ids has 7",
    ),
    ("mask longer", {"loss_mask": [[1] * 4, [1], [1] * 7]}, "loss_mask", 1, "row 1 has 1 entries"),
    ("top_p wrong tokens", {"top_p_ids": [[[1]] * 4, [], [[1]] * 6]}, "top_p_ids", 2, "row 2 has 6 entries"),
    (
        "top_p candidates disagree",
        {
            "top_p_ids": [[[1]] * 4, [], [[1]] * 7],
            "top_p_probs": [[[0.5]] * 4, [], [[0.5]] * 6 + [[0.5, 0.5]]],
        },
        "top_p_probs",
        2,
        "token 6 has 2 candidates but top_p_ids has 1",
    ),
    # A sample without candidates is None in both top-p columns: one alone left the two columns' decoded
    # outer offsets apart (a distillation loss pairing ids with probs silently misaligned).
    (
        "top_p ids none where probs are not",
        {"top_p_ids": [None, [], [[1]] * 7], "top_p_probs": [[[0.5]] * 4, [], [[0.5]] * 7]},
        "top_p_ids",
        0,
        "row 0 is None but top_p_probs row 0 is not",
    ),
    (
        "top_p probs none in arrow where ids are not",
        {
            "top_p_ids": DoublyRagged(np.ones(11, np.int32), OFFSETS, np.arange(12, dtype=np.int32)),
            "top_p_probs": pa.array([[[0.5]] * 4, [], None], pa.list_(pa.list_(pa.float32()))),
        },
        "top_p_probs",
        2,
        "row 2 is None but top_p_ids row 2 is not",
    ),
    (
        "top_p none against an empty sample",
        {"top_p_ids": [[[1]] * 4, [], [[1]] * 7], "top_p_probs": [[[0.5]] * 4, None, [[0.5]] * 7]},
        "top_p_probs",
        1,
        "both must be None for the same samples",
    ),
    (
        "token id over int32",
        {"response_ids": (IDS.astype(np.int64) + np.int64(2**31), OFFSETS)},
        "response_ids",
        0,
        "does not fit int32",
    ),
    (
        "negative token id overflow in python lists",
        {"prompt_ids": [[1], [2**40], [3]]},
        "prompt_ids",
        1,
        "cannot convert",
    ),
    (
        "float token ids",
        {"response_ids": (IDS.astype(np.float32), OFFSETS)},
        "response_ids",
        None,
        "wrong dtype float32",
    ),
    ("string rewards", {"reward": ["a", "b", "c"]}, "reward", 0, "cannot convert"),
    (
        "reward count",
        {"reward": np.ones(2, dtype=np.float32)},
        "reward",
        None,
        "has 2 entries but the group has 3",
    ),
    (
        "decreasing offsets",
        {"response_ids": (IDS, np.array([0, 4, 3, 11], dtype=np.int32))},
        "response_ids",
        1,
        "offsets decrease",
    ),
    (
        "offsets past values",
        {"response_ids": (IDS, np.array([0, 4, 4, 99], dtype=np.int32))},
        "response_ids",
        None,
        "offsets span 0..99",
    ),
    (
        "padded length too long",
        {"response_ids": Padded(np.zeros((3, 2), np.int32), np.array([1, 3, 0]))},
        "response_ids",
        1,
        "length 3 outside 0..2",
    ),
    ("3-D array", {"response_ids": np.zeros((3, 2, 2), np.int32)}, "response_ids", None, "must be 2-D"),
    (
        "tuple of three",
        {"response_ids": (IDS, OFFSETS, OFFSETS)},
        "response_ids",
        None,
        "read as (values, offsets)",
    ),
    ("mask of floats", {"loss_mask": (np.ones(11, np.float32), OFFSETS)}, "loss_mask", None, "wrong dtype"),
    (
        "mask over 255",
        {"loss_mask": (np.full(11, 300, np.int32), OFFSETS)},
        "loss_mask",
        0,
        "does not fit uint8",
    ),
    ("null reward", {"reward": [1.0, None, 0.0]}, "reward", 1, "row 1 is null"),
    ("empty job id", {"job_id": ""}, "job_id", None, "non-empty string"),
    ("negative epoch", {"epoch": -1}, "epoch", None, "non-negative integer"),
    ("bool group id", {"group_id": True}, "group_id", None, "non-negative integer"),
    ("extra shadows a standard column", {"extra": {"reward": [1, 2, 3]}}, "reward", None, "keyword argument"),
    ("telemetry not a struct", {"telemetry": [1, 2, 3]}, "telemetry", None, "must be a struct"),
    ("user column length", {"extra": {"tag": ["a"]}}, "tag", None, "has 1 entries but the group has 3"),
    ("object rows", {"response_ids": 17}, "response_ids", None, "cannot read int as ragged rows"),
    # Regressions: each of these raised a raw OverflowError, TypeError, KeyError, ArrowInvalid or
    # AttributeError (or a typed error that did not say what to do) before it was made a SchemaError.
    ("epoch past int64", {"epoch": 2**63}, "epoch", None, "fits int64 (0..9223372036854775807)"),
    ("group id past int64", {"group_id": np.uint64(2**64 - 1)}, "group_id", None, "fits int64"),
    ("job id not UTF-8", {"job_id": "job\ud800"}, "job_id", None, "valid UTF-8"),
    ("response ids None", {"response_ids": None}, "response_ids", None, "response_ids is required"),
    ("reward None", {"reward": None}, "reward", None, "reward is required"),
    ("prompt None", {"prompt_ids": None}, "prompt_ids", None, "prompt_ids is required"),
    ("policy version None", {"policy_version": None}, "policy_version", None, "policy_version is required"),
    ("values None under offsets", {"response_ids": (None, OFFSETS)}, "response_ids", None, "1-D array"),
    ("user column of objects", {"extra": {"tag": [object()] * 3}}, "tag", None, "schema.extend"),
    ("user column of mixed types", {"extra": {"tag": [1, "a", 2.0]}}, "tag", None, "schema.extend"),
    ("user column numpy objects", {"extra": {"tag": np.array([object()] * 3)}}, "tag", None, "schema.extend"),
    ("user column a dict", {"extra": {"tag": {"a": 1}}}, "tag", None, "one value per sample"),
    ("user column name not a str", {"extra": {1: [1, 2, 3]}}, None, None, "names must be strings"),
    ("extra not a mapping", {"extra": [1, 2, 3]}, None, None, "extra must be a mapping"),
    ("schema not a TrajectorySchema", {"schema": "standard"}, None, None, "TrajectorySchema"),
    ("telemetry a number", {"telemetry": 5}, "telemetry", None, "pass a list of dicts"),
    ("telemetry field of objects", {"telemetry": {"x": object()}}, "telemetry.x", None, "schema.extend"),
    ("mask mixing bools and ints", {"loss_mask": [[True, 1, 0, 0], [], [1] * 7]}, "loss_mask", 0, "convert"),
    # Silent coercions: each of these was stored altered (a string repeated, a float truncated, an array's
    # shape unexplained) or stored and then refused by decode, before it was refused here.
    ("sample ids one string", {"sample_ids": "abc"}, "sample_id", None, "one id per sample"),
    ("sample ids bytes", {"sample_ids": b"abc"}, "sample_id", None, "one id per sample"),
    ("sample ids a 0-d array", {"sample_ids": np.array("abc")}, "sample_id", None, "one id per sample"),
    ("sample ids repeated", {"sample_ids": ["a", "b", "a"]}, "sample_id", 2, "row 2 repeats 'a' of row 0"),
    ("sample ids repeated in arrow", {"sample_ids": pa.array(["a", "a", "b"])}, "sample_id", 1, "repeats"),
    ("policy version a float", {"policy_version": 1.5}, "policy_version", None, "got float 1.5"),
    ("policy version a whole float", {"policy_version": 2.0}, "policy_version", None, "got float 2.0"),
    ("policy version numpy float", {"policy_version": np.float32(1.5)}, "policy_version", None, "float"),
    ("policy version 0-d float", {"policy_version": np.array(1.5)}, "policy_version", None, "float"),
    ("policy version numpy bool", {"policy_version": np.True_}, "policy_version", None, "got bool True"),
    ("policy versions with a float", {"policy_version": [1, 1.5, 2]}, "policy_version", 1, "float 1.5"),
    ("policy versions numpy bools", {"policy_version": [np.True_] * 3}, "policy_version", 0, "bool"),
    (
        "token ids floats in lists",
        {"response_ids": [[1, 2, 3, 4], [], [5] * 6 + [6.5]]},
        "response_ids",
        2,
        "6.5",
    ),
    ("prompt with a float", {"prompt_ids": [1, 2.5]}, "prompt_ids", 0, "float 2.5"),
    ("mask of float lists", {"loss_mask": [[1, 0.5, 1, 1], [], [1] * 7]}, "loss_mask", 0, "float 0.5"),
    ("top_p ids floats", {"top_p_ids": [[[1]] * 4, [], [[1]] * 6 + [[1.5]]]}, "top_p_ids", 2, "float 1.5"),
    (
        "declared int user column a float",
        {"extra": {"n": 1.5}, "schema": STANDARD_SCHEMA.extend(("n", pa.int64()))},
        "n",
        None,
        "got float 1.5",
    ),
    # apache/arrow GH-40910: numpy float16, longdouble and complex scalars mixed with Python ints infer as
    # int64 and were truncated (np.float16(6.5) stored as 6), past the float check; now refused as floats.
    (
        "token ids float16 among ints",
        {"response_ids": [[1, 2, 3, 4], [], [5] * 6 + [np.float16(6.5)]]},
        "response_ids",
        2,
        "got float 6.5",
    ),
    (
        "token ids whole float16 among ints",
        {"response_ids": [[1, 2, 3, np.float16(4.0)], [], [5] * 7]},
        "response_ids",
        0,
        "got float 4.0",
    ),
    (
        "token ids longdouble among ints",
        {"response_ids": [[1, 2, 3, 4], [], [5] * 6 + [np.longdouble(6.5)]]},
        "response_ids",
        2,
        "got float 6.5",
    ),
    (
        "token ids complex among ints",
        {"response_ids": [[1, 2, 3, np.complex64(4.5)], [], [5] * 7]},
        "response_ids",
        0,
        "got complex (4.5+0j)",
    ),
    (
        "token ids a float16 array among lists",
        {"response_ids": [[1, 2, 3, 4], [], np.full(7, 2.5, np.float16)]},
        "response_ids",
        2,
        "got float 2.5",
    ),
    (
        "token ids float16 among numpy ints",
        {"response_ids": [[np.int32(1)] * 4, [], [np.int32(5)] * 6 + [np.float16(6.5)]]},
        "response_ids",
        2,
        "got float 6.5",
    ),
    ("prompt with a float16", {"prompt_ids": [1, np.float16(2.5)]}, "prompt_ids", 0, "got float 2.5"),
    ("policy version float16", {"policy_version": np.float16(1.5)}, "policy_version", None, "got float 1.5"),
    (
        "policy versions with a float16",
        {"policy_version": [1, np.float16(1.5), 2]},
        "policy_version",
        1,
        "got float 1.5",
    ),
    (
        "top_p ids float16 among ints",
        {"top_p_ids": [[[1]] * 4, None, [[1]] * 6 + [[2, np.float16(1.5)]]]},
        "top_p_ids",
        2,
        "got float 1.5",
    ),
    (
        "mask float16 among ints",
        {"loss_mask": [[1, 0, 1, np.float16(1.0)], [], [1] * 7]},
        "loss_mask",
        0,
        "got float 1.0",
    ),
    (
        "inferred int user column with a float16",
        {"extra": {"n": [[1, np.float16(1.5)], [], [2]]}},
        "n",
        0,
        "got float 1.5",
    ),
    # Python bools in token-id lists were refused with pyarrow's "cannot convert ... got bool"; now worded
    # as bools in policy_version are.
    ("token ids bools in lists", {"response_ids": [[1, 2, True, 4], [], [5] * 7]}, "response_ids", 0, "bool"),
    # Telemetry fields declared as integers: pyarrow truncated a float there (1.7 stored as 1; a dict of
    # columns refused it only through the struct cast, naming neither field nor row, and kept 2.0 or a bool
    # array as 2 and 1). Now refused as policy_version refuses them: floats whole or not, bools.
    (
        "telemetry int field a float",
        telemetry_rows(num_preemptions=1.7),
        "telemetry",
        1,
        "column 'telemetry' field 'num_preemptions' row 1: expected integers (int64), got float 1.7",
    ),
    ("telemetry int field a whole float", telemetry_rows(num_preemptions=2.0), "telemetry", 1, "float 2.0"),
    ("telemetry int field a bool", telemetry_rows(num_preemptions=True), "telemetry", 1, "got bool True"),
    (
        "telemetry int field numpy float",
        telemetry_rows(num_preemptions=np.float32(1.5)),
        "telemetry",
        1,
        "1.5",
    ),
    ("telemetry int field float16", telemetry_rows(num_preemptions=np.float16(1.5)), "telemetry", 1, "1.5"),
    ("telemetry uint8 field a bool", telemetry_rows(flag=True), "telemetry", 1, "field 'flag' row 1"),
    ("telemetry int list field a float", telemetry_rows(cached=[1, 2.5]), "telemetry", 1, "field 'cached'"),
    ("telemetry int list field a bool", telemetry_rows(cached=[True]), "telemetry", 1, "got bool True"),
    (
        "telemetry nested struct int field a float",
        telemetry_rows(kv={"blocks": 3.5, "util": 0.5}),
        "telemetry",
        1,
        "field 'kv.blocks' row 1: expected integers (int16), got float 3.5",
    ),
    (
        "telemetry column of ints with a float",
        telemetry_columns(num_preemptions=[0, 1.7, 2]),
        "telemetry",
        1,
        "field 'num_preemptions' row 1: expected integers (int64), got float 1.7",
    ),
    (
        "telemetry column of ints with a float16",
        telemetry_columns(num_preemptions=[0, np.float16(1.5), 2]),
        "telemetry",
        1,
        "got float 1.5",
    ),
    (
        "telemetry column a float array",
        telemetry_columns(num_preemptions=np.array([0.0, 1.0, 2.0])),
        "telemetry",
        None,
        "field 'num_preemptions': wrong dtype float64, expected integers (int64)",
    ),
    (
        "telemetry column a bool array",
        telemetry_columns(flag=np.array([True, False, True])),
        "telemetry",
        None,
        "wrong dtype bool",
    ),
    (
        "telemetry column a float tensor",
        telemetry_columns(num_preemptions=torch.ones(3)),
        "telemetry",
        None,
        "wrong dtype float32",
    ),
    (
        "telemetry column one float",
        telemetry_columns(num_preemptions=1.5),
        "telemetry",
        None,
        "field 'num_preemptions': expected integers (int64), got float 1.5",
    ),
    (
        "telemetry nested struct column with a float",
        telemetry_columns(kv=[None, {"blocks": 1.5}, {"blocks": 2}]),
        "telemetry",
        1,
        "field 'kv.blocks' row 1",
    ),
    # An int past its field's type in a list of dicts raised pyarrow's raw OverflowError.
    (
        "telemetry int past int64",
        telemetry_rows(num_preemptions=2**70),
        "telemetry",
        1,
        "column 'telemetry' row 1: Python int too large",
    ),
    (
        "telemetry uint8 field negative",
        telemetry_rows(flag=-1),
        "telemetry",
        1,
        "row 1: can't convert negative",
    ),
    (
        "undeclared telemetry int past int64",
        {"telemetry": [{"n": 1}, {"n": 2**64}, {}]},
        "telemetry",
        1,
        "row 1",
    ),
    # apache/arrow GH-40910 in undeclared telemetry: inference made the field int64 and truncated 1.5.
    (
        "undeclared telemetry float16 among ints",
        {"telemetry": [{"n": 0}, {"n": np.float16(1.5)}, {"n": 2}]},
        "telemetry",
        1,
        "field 'n' row 1: expected integers (int64), got float 1.5",
    ),
    (
        "mask null entry",
        {"loss_mask": [[1, None, 1, 1], [], [1] * 7]},
        "loss_mask",
        0,
        "row 0 entry 1 is null",
    ),
    ("token id null", {"response_ids": [[1, 2, 3, 4], [], [1] * 6 + [None]]}, "response_ids", 2, "entry 6"),
    (
        "logprob null",
        {"response_logprobs": [[0.0] * 4, [], [None] + [0.0] * 6]},
        "response_logprobs",
        2,
        "null",
    ),
    ("prompt null entry", {"prompt_ids": [1, None]}, "prompt_ids", 0, "row 0 entry 1 is null"),
    (
        "logprobs null in arrow",
        {"response_logprobs": pa.array([[0.0] * 4, [], [0.0] * 6 + [None]], pa.list_(pa.float32()))},
        "response_logprobs",
        2,
        "row 2 entry 6 is null",
    ),
    (
        "top_p null token",
        {"top_p_ids": [[[1]] * 4, [], [[1]] * 6 + [None]]},
        "top_p_ids",
        2,
        "token 6 is null",
    ),
    (
        "top_p null candidate",
        {"top_p_ids": [[[1]] * 4, [], [[1]] * 6 + [[1, None]]]},
        "top_p_ids",
        2,
        "token 6 candidate 1 is null",
    ),
    (
        "user column 3-D",
        {"extra": {"x": np.zeros((3, 2, 2), np.float32)}},
        "x",
        None,
        "FixedShapeTensorArray",
    ),
    (
        "declared user column 3-D",
        {"extra": {"x": np.zeros((3, 2, 2))}, "schema": STANDARD_SCHEMA.extend(("x", pa.float64()))},
        "x",
        None,
        "reshape(3, -1)",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "column", "row", "message"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gives_a_typed_error_naming_column_and_row(simple_group, overrides, column, row, message):
    with pytest.raises(SchemaError) as info:
        encode_group(**{**simple_group, **overrides})
    assert message in str(info.value)
    assert info.value.column == column
    assert info.value.row == row


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (telemetry_rows(num_preemptions=1.5), "num_preemptions"),
        (telemetry_rows(kv={"blocks": 1.5}), "kv.blocks"),
        (telemetry_columns(cached=[[1], [2.5], []]), "cached"),
        (telemetry_columns(num_preemptions=np.ones(3)), "num_preemptions"),
    ],
    ids=["list of dicts", "nested struct", "dict of columns", "numpy column"],
)
def test_a_telemetry_refusal_carries_the_field(simple_group, overrides, field):
    """The field is a structured detail of the error (it travels with column and row), not only words."""
    with pytest.raises(SchemaError) as info:
        encode_group(**{**simple_group, **overrides})
    assert (info.value.column, info.value.field) == ("telemetry", field)
    assert info.value.fields["field"] == field


def _group(**overrides) -> pa.RecordBatch:
    return encode_group(
        job_id="j",
        epoch=1,
        group_id=3,
        prompt_ids=[1, 2],
        response_ids=(IDS, OFFSETS),
        response_logprobs=(LOGPROBS, OFFSETS),
        reward=[1.0, 0.0, 1.0],
        **overrides,
    )


def test_validate_accepts_a_good_group_and_returns_its_key():
    assert validate_group(_group()) == Partition("j", 1, 3)
    assert validate_group(_group(), expect=Partition("j", 1, 3)) == Partition("j", 1, 3)


def test_validate_refuses_samples_of_different_groups():
    a, b = (
        _group(),
        encode_group(
            **{
                **dict(
                    job_id="j",
                    epoch=1,
                    group_id=4,
                    prompt_ids=[1],
                    response_ids=[[1]],
                    response_logprobs=[[0.0]],
                    reward=[1.0],
                )
            }
        ),
    )
    mixed = pa.Table.from_batches([a, b]).combine_chunks().to_batches()[0]
    with pytest.raises(SchemaError, match="'group_id' row 3 is 4, expected 3") as info:
        validate_group(mixed)
    assert info.value.row == 3


def test_validate_refuses_a_group_meant_for_another_partition():
    with pytest.raises(SchemaError, match="'epoch' row 0 is 1, expected 2"):
        validate_group(_group(), expect=Partition("j", 2, 3))


def test_validate_refuses_missing_and_mistyped_columns():
    group = _group()
    with pytest.raises(SchemaError, match="'reward' is missing"):
        validate_group(group.drop_columns(["reward"]))
    retyped = group.set_column(
        group.schema.get_field_index("reward"), "reward", group.column("reward").cast(pa.float64())
    )
    with pytest.raises(SchemaError, match="'reward' has type double"):
        validate_group(retyped)


def test_validate_wraps_arrow_structural_failures():
    """Offsets that decrease inside the array: only Arrow's full validation sees it; we name it."""
    group = _group()
    ids = group.column("response_ids")
    bad_offsets = pa.array(np.array([0, 8, 4, 11], dtype=np.int32))
    broken = pa.ListArray.from_buffers(ids.type, 3, [None, bad_offsets.buffers()[1]], children=[ids.values])
    corrupt = group.set_column(group.schema.get_field_index("response_ids"), "response_ids", broken)
    with pytest.raises(SchemaError, match="invalid Arrow data"):
        validate_group(corrupt)
    bad_utf8 = pa.Array.from_buffers(
        pa.string(), 1, [None, pa.array([0, 2], pa.int32()).buffers()[1], pa.py_buffer(b"\xff\xfe")]
    )
    with pytest.raises(SchemaError, match="invalid Arrow data"):
        validate_group(
            group.set_column(
                group.schema.get_field_index("sample_id"), "sample_id", pa.concat_arrays([bad_utf8] * 3)
            )
        )


def test_validate_refuses_non_batches():
    with pytest.raises(SchemaError, match=r"expected a pyarrow\.RecordBatch"):
        validate_group({"a": 1})  # type: ignore[arg-type]
