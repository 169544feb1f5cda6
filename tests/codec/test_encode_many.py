"""encode_groups: the batched twin of encode_group, one joined record batch and each group a slice of it.

The property: ``encode_groups(...)[i]`` equals ``encode_group(**groups[i])`` (rows and Arrow schema) for
every accepted input, in the merged tier's form (numpy arrays, as a rollout engine holds them) and in any
other (the precise tier); the joined batch equals the concatenation; ``nbytes`` is the bytes of each
group's rows in the joined buffers; nothing aliases the inputs. Refusals are encode_group's, naming the
group, plus those of the batch itself (a repeated group id, groups of different schemas, ...).

``nbytes`` is compared with two truths computed otherwise: Arrow's ``RecordBatch.nbytes`` of the slice
(which counts ``rows`` offsets per list/string level where a copy needs ``rows + 1``: the test adds the one
offset per level), and the per-column ``get_total_buffer_size()`` of the group's own encode_group batch,
whose buffers are exact for the inputs drawn here (offsets from 0 to the values' end) where the group has
samples: equal where no column of the joined batch has a validity bitmap, else no larger (a slice's rows
may cover one more bitmap byte than a bitmap of their own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trajflight import workload
from trajflight.codec import (
    STANDARD_SCHEMA,
    DoublyRagged,
    EncodedGroups,
    Ragged,
    _encode_many,
    _encode_merged,
    encode_group,
    encode_groups,
)
from trajflight.codec._nbytes import group_nbytes
from trajflight.errors import InvalidRequestError, SchemaError

from .test_encode_tiers import UNUSUAL, input_memory
from .test_errors import BAD_INPUTS, TELEMETRY, telemetry_rows

JOB, EPOCH = "job", 3
USER_SCHEMA = STANDARD_SCHEMA.extend(("score", pa.float64()), ("ref", pa.list_(pa.float32())))


# --- Helpers --------------------------------------------------------------------------------------------


def _offset_levels(type_: pa.DataType) -> int:
    """List and string levels of a type: Arrow's nbytes counts one offset fewer than a copy needs at each."""
    if pa.types.is_dictionary(type_):
        return _offset_levels(type_.value_type)
    if pa.types.is_struct(type_):
        return sum(_offset_levels(type_.field(i).type) for i in range(type_.num_fields))
    if pa.types.is_list(type_):
        return 1 + _offset_levels(type_.value_type)
    return int(pa.types.is_string(type_) or pa.types.is_binary(type_))


def _slice_bytes(batch: pa.RecordBatch) -> int:
    """Truth one: Arrow's bytes of the slice's referenced buffer ranges, plus the last offset per level."""
    return int(batch.nbytes) + 4 * sum(_offset_levels(f.type) for f in batch.schema)


def _own_bytes(batch: pa.RecordBatch) -> int:
    """Truth two: the buffers of the group's own batch, column by column (a buffer shared counts for each)."""
    return sum(column.get_total_buffer_size() for column in batch.columns)


def _has_bitmap(array: pa.Array) -> bool:
    if array.buffers()[0] is not None:
        return True
    if pa.types.is_list(array.type):
        return _has_bitmap(array.values)
    return False


def _buffers(array: pa.Array) -> list[pa.Buffer]:
    found = [b for b in array.buffers() if b is not None and b.size]
    if pa.types.is_dictionary(array.type):
        found += _buffers(array.dictionary)
    return found


def _assert_not_aliased(joined: pa.RecordBatch, groups: Sequence[dict[str, Any]]) -> None:
    inputs = [(at, n) for at, n in input_memory(list(groups), []) if n]  # an empty array aliases nothing
    for column in joined.columns:
        for buffer in _buffers(column):
            start, stop = buffer.address, buffer.address + buffer.size
            assert not any(at < stop and start < at + n for at, n in inputs), "joined aliases an input"


def _tiers(groups: Sequence[dict[str, Any]], schema: Any = STANDARD_SCHEMA) -> tuple[EncodedGroups, str]:
    """encode_groups' result and the tier that built it ("merged" or "precise")."""
    with mock.patch.object(_encode_many, "encode_group", wraps=encode_group) as precise:
        result = encode_groups(job_id=JOB, epoch=EPOCH, groups=groups, schema=schema)
    return result, "precise" if precise.called else "merged"


def _check(groups: Sequence[dict[str, Any]], schema: Any = STANDARD_SCHEMA) -> tuple[EncodedGroups, str]:
    """Assert the contract for valid ``groups``; the result and its tier."""
    result, tier = _tiers(groups, schema)
    expected = [encode_group(job_id=JOB, epoch=EPOCH, schema=schema, **g) for g in groups]
    assert len(result) == len(groups)
    assert result.rows == tuple(b.num_rows for b in expected)
    for got, want in zip(result, expected, strict=True):
        assert got.schema.equals(want.schema, check_metadata=True)
        assert got.equals(want)
    assert result.joined.equals(pa.concat_batches(expected))
    bitmaps = any(_has_bitmap(column) for column in result.joined.columns)
    for got, batch, want in zip(result.nbytes, result, expected, strict=True):
        assert got == _slice_bytes(batch)
        if want.num_rows:  # encode_group keeps a shared prompt of zero samples as a slice of one row
            assert got >= _own_bytes(want)
            assert bitmaps or got == _own_bytes(want)
    _assert_not_aliased(result.joined, groups)
    return result, tier


# --- The property ---------------------------------------------------------------------------------------


def _ragged(
    rows: list[np.ndarray], dtype: Any, form: str, offsets_dtype: Any, offsets: np.ndarray | None
) -> Any:
    """``rows`` (of ``dtype``) as per-sample lists, ``(values, offsets)`` or a Ragged (the ``offsets`` given
    or new ones)."""
    if form == "lists":
        return [r.tolist() for r in rows]
    values = np.concatenate([np.zeros(0, dtype), *rows])
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(offsets_dtype)
    return Ragged(values, offsets) if form == "Ragged" else (values, offsets)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    """Valid groups of one schema, and whether they are all in the merged tier's form."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n, unique=True))
    advantage = draw(st.booleans())
    mask = draw(st.sampled_from([None, np.uint8, bool, np.int64]))
    top_p = draw(st.sampled_from(["none", "both", "ids", "probs"]))
    top_p_lists = draw(st.booleans())  # lists with samples without candidates (None), else DoublyRagged
    ids_dtype = draw(st.sampled_from([np.int32, np.int64]))
    offsets_dtype = draw(st.sampled_from([np.int32, np.int64]))
    shared = draw(st.booleans())  # the per-token columns given response_ids' offsets array itself
    versions = draw(st.sampled_from(["same int", "ints", "arrays"]))
    mergeable = top_p == "none" or not top_p_lists
    groups = []
    for gid in ids:
        k = draw(st.sampled_from([0, 1, 1, 2, 3, 5]))
        lengths = [int(x) for x in draw(st.lists(st.sampled_from([0, 1, 3, 7, 120]), min_size=k, max_size=k))]
        form = draw(st.sampled_from(["tuple", "tuple", "Ragged", "lists"]))
        mergeable &= form != "lists"
        tokens = [rng.integers(0, 2**31 - 1, n_).astype(ids_dtype) for n_ in lengths]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(offsets_dtype)
        per_token = offsets if shared and form != "lists" else None  # one array, as columns() shares it
        group: dict[str, Any] = {
            "group_id": gid,
            "response_ids": _ragged(tokens, ids_dtype, form, offsets_dtype, per_token),
            "response_logprobs": _ragged(
                [rng.standard_normal(n_).astype(np.float32) for n_ in lengths],
                np.float32,
                form,
                offsets_dtype,
                per_token,
            ),
            "reward": rng.random(k).astype(np.float32),
        }
        prompt = rng.integers(0, 1000, int(draw(st.sampled_from([0, 1, 5, 40])))).astype(np.int32)
        if draw(st.booleans()):
            group["prompt_ids"] = prompt  # one flat prompt shared by the samples
            mergeable &= k > 0
        else:
            prompts = [prompt[: i + 1] for i in range(k)]  # one prompt per sample
            group["prompt_ids"] = _ragged(prompts, np.int32, "tuple", np.int32, None)
        if mask is not None:
            bits = [rng.integers(0, 2, n_).astype(mask) for n_ in lengths]
            group["loss_mask"] = _ragged(bits, mask, form, offsets_dtype, per_token)
        if advantage:
            group["advantage"] = rng.standard_normal(k).astype(np.float32)
        if versions == "same int":
            group["policy_version"] = 7
        elif versions == "ints":
            group["policy_version"] = int(rng.integers(-5, 2**40))
        else:
            group["policy_version"] = rng.integers(0, 100, k)
        if top_p != "none":
            counts = [rng.integers(0, 4, n_) for n_ in lengths]
            present = [bool(rng.random() < 0.7) for _ in lengths]
            for name, dtype in (("top_p_ids", np.int32), ("top_p_probs", np.float32)):
                if top_p not in ("both", name[6:]):
                    continue
                if top_p_lists:
                    group[name] = [
                        [list(range(c)) if dtype == np.int32 else [0.5] * c for c in row] if keep else None
                        for row, keep in zip(counts, present, strict=True)
                    ]
                else:
                    flat = np.concatenate([[0], *counts]).astype(np.int64)
                    inner = np.cumsum(flat).astype(np.int32)
                    group[name] = DoublyRagged(rng.random(int(inner[-1])).astype(dtype), offsets, inner)
        groups.append(group)
    mergeable &= len({isinstance(g["prompt_ids"], np.ndarray) for g in groups}) == 1
    return groups, mergeable


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_each_group_is_encode_groups_of_its_own_and_the_sizes_are_its_rows(drawn):
    groups, mergeable = drawn
    _, tier = _check(groups)
    event(f"tier: {tier}")  # --hypothesis-show-statistics: both tiers are drawn often
    assert tier == ("merged" if mergeable else "precise")


@pytest.mark.parametrize("top_p", [False, True], ids=["plain", "top_p"])
def test_the_standard_workload_takes_the_merged_tier(top_p):
    groups = workload.make_workload(16, 8, seed=1, top_p=top_p, response_median=64)
    result, tier = _check([g.columns(policy_version=2) | {"group_id": g.group_id} for g in groups])
    assert tier == "merged"
    for i, g in enumerate(groups):
        assert result[i].equals(g.encode(JOB, EPOCH, policy_version=2))
    # One offsets buffer for the per-token columns, as the merged pseudo-group shares them.
    joined = result.joined
    per_token = ("response_ids", "response_logprobs", "loss_mask")
    assert len({joined.column(n).buffers()[1].address for n in per_token}) == 1


def test_user_columns_of_numpy_arrays_take_the_merged_tier():
    """The standard workload with per-sample user columns (as ``trajflight bench`` passes them) is encoded
    in one merged call, each group equal to its own encode_group, its user columns typed by the schema."""
    groups = workload.make_workload(16, 8, seed=2, response_median=64)
    schema = STANDARD_SCHEMA.extend(("score", pa.float64()))
    cols = []
    for g in groups:
        users = {"user_id": np.arange(8, dtype=np.int64) + 8 * g.group_id, "score": np.full(8, 0.5)}
        cols.append(g.columns(extra=users) | {"group_id": g.group_id})
    result, tier = _check(cols, schema)
    assert tier == "merged"
    assert result.joined.schema.field("score").type == pa.float64()
    assert result.joined.column("user_id").to_pylist() == list(range(8 * 16))


USER_COLUMNS_ASIDE: dict[str, tuple[Any, str]] = {
    "names in another order": (
        lambda g: {"b": np.arange(3.0), "a": np.arange(3)} if g == 9 else None,
        "refused",
    ),
    "another dtype in one group": (
        lambda g: {"a": np.arange(3), "b": np.arange(3, dtype=np.int32 if g == 9 else np.int64)},
        "refused",
    ),
    "a None value": (lambda g: {"a": np.arange(3), "b": None if g == 9 else np.arange(3.0)}, "refused"),
    "one group without them": (lambda g: {} if g == 9 else None, "refused"),
    "a list": (lambda g: {"a": [1, 2, 3], "b": np.arange(3.0)}, "precise"),
    "a 2-D array": (lambda g: {"a": np.ones((3, 2)), "b": np.arange(3.0)}, "precise"),
    "strings": (lambda g: {"a": np.array(["x", "y", "z"]), "b": np.arange(3.0)}, "precise"),
}


@pytest.mark.parametrize(("extra", "outcome"), USER_COLUMNS_ASIDE.values(), ids=list(USER_COLUMNS_ASIDE))
def test_user_columns_outside_the_merged_form_give_the_precise_tiers_outcome(extra, outcome):
    """Where one group's user columns differ in form, the merged tier steps aside: encode_groups gives what
    the groups one by one give (the same batch, or a refusal of groups of different schemas)."""
    groups = []
    for gid in (4, 9, 2):
        users = extra(gid)
        groups.append(
            _group(gid, extra=users if users is not None else {"a": np.arange(3), "b": np.arange(3.0)})
        )
    if outcome == "refused":
        with (
            mock.patch.object(_encode_many, "encode_group", wraps=encode_group) as precise,
            pytest.raises(SchemaError, match="schema"),
        ):
            encode_groups(job_id=JOB, epoch=EPOCH, groups=groups)
        assert precise.called
        return
    _, tier = _check(groups)
    assert tier == "precise"


def test_a_user_column_declared_as_a_list_is_not_merged():
    """A user column the schema declares as a list type, given one value per sample, takes the precise
    tier (which says what is wrong), never a merged cast."""
    groups = [_group(gid, extra={"ref": np.arange(3.0)}) for gid in (4, 9)]
    with (
        mock.patch.object(_encode_merged, "encode_group", wraps=encode_group) as merged_call,
        pytest.raises(SchemaError),
    ):
        encode_groups(job_id=JOB, epoch=EPOCH, groups=groups, schema=USER_SCHEMA)
    assert not merged_call.called


# --- The precise tier -----------------------------------------------------------------------------------


def _group(gid: int, k: int = 3, **more: Any) -> dict[str, Any]:
    lengths = [4, 0, 7, 2, 5][:k]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return {
        "group_id": gid,
        "prompt_ids": np.arange(6, dtype=np.int32) + gid,
        "response_ids": (np.arange(offsets[-1], dtype=np.int32) + gid, offsets),
        "response_logprobs": (np.full(offsets[-1], -0.5, np.float32), offsets),
        "reward": np.arange(k, dtype=np.float32),
        **more,
    }


OTHER_FORMS: dict[str, Any] = {
    "sample ids": lambda g: {"sample_ids": [f"s{g}-{i}" for i in range(3)]},
    "telemetry": lambda g: {"telemetry": [{"ms": g + i} for i in range(3)]},
    "user columns": lambda g: {"extra": {"score": np.arange(3.0), "ref": [[0.5] * 4, [], [0.5] * 7]}},
    "torch": lambda g: {"reward": torch.arange(3, dtype=torch.float32)},
    "python lists": lambda g: {"response_logprobs": [[0.0] * 4, [], [0.1] * 7], "advantage": [1.0, None, 2]},
    "policy version numpy scalar": lambda g: {"policy_version": np.int64(g)},
    "a 2-D prompt": lambda g: {"prompt_ids": np.ones((3, 2), np.int32)},
}


@pytest.mark.parametrize("more", OTHER_FORMS.values(), ids=list(OTHER_FORMS))
def test_other_forms_take_the_precise_tier_with_the_same_result(more):
    groups = [_group(gid, **more(gid)) for gid in (4, 9, 2)]
    _, tier = _check(groups, USER_SCHEMA)
    assert tier == "precise"


@pytest.mark.gpu
def test_cuda_groups_are_staged_by_encode_group_and_joined():
    groups = []
    for gid in (1, 2):
        values, offsets = _group(gid)["response_ids"]
        cuda = (torch.from_numpy(values).cuda(), torch.from_numpy(offsets).cuda())
        groups.append(_group(gid, response_ids=cuda, reward=torch.arange(3.0, device="cuda")))
    result, tier = _check(groups)
    assert tier == "precise"
    values = result[1].column("response_ids").flatten().to_numpy()  # .values would ignore the slice
    assert values.tolist() == _group(2)["response_ids"][0].tolist()


def test_finish_reasons_hold_the_same_values_under_one_dictionary():
    """Joining unifies the groups' dictionaries: the values per row are the group's own, not the buffers."""
    reasons = [["stop", "length", "stop"], ["abort", "stop", "stop"]]
    groups = [_group(gid, finish_reason=r) for gid, r in zip((1, 2), reasons, strict=True)]
    result = encode_groups(job_id=JOB, epoch=EPOCH, groups=groups)
    for batch, nbytes, group, r in zip(result, result.nbytes, groups, reasons, strict=True):
        own = encode_group(job_id=JOB, epoch=EPOCH, **group)
        assert batch.schema.equals(own.schema)
        assert batch.column("finish_reason").to_pylist() == r
        assert batch.drop_columns(["finish_reason"]).equals(own.drop_columns(["finish_reason"]))
        assert nbytes == _slice_bytes(batch)  # the whole union dictionary, for each group


@pytest.mark.parametrize("flat", [True, False], ids=["flat prompt", "per-sample prompts"])
def test_a_single_group_is_copied_not_aliased(flat):
    prompts = (np.arange(6, dtype=np.int32), np.array([0, 2, 4, 6]))
    group = _group(5) if flat else _group(5, prompt_ids=prompts)
    _, tier = _check([group])
    assert tier == "merged"
    alone, _ = _check([_group(5, sample_ids=["a", "b", "c"])])  # the precise tier: one batch joined
    assert alone.joined.num_rows == 3


def test_groups_without_samples_keep_their_place():
    empty = {
        "group_id": 8,
        "prompt_ids": (np.zeros(0, np.int32), np.zeros(1, np.int32)),
        "response_ids": (np.zeros(0, np.int32), np.zeros(1, np.int32)),
        "response_logprobs": (np.zeros(0, np.float32), np.zeros(1, np.int32)),
        "reward": np.zeros(0, np.float32),
    }
    pairs = {"prompt_ids": (np.arange(6, dtype=np.int32), np.array([0, 1, 3, 6]))}
    result, tier = _check([_group(1, **pairs), empty, _group(2, **pairs)])
    assert tier == "merged"
    assert result.rows == (3, 0, 3)
    assert result[1].num_rows == 0
    result, _ = _check([empty, {**empty, "group_id": 9}])
    assert result.rows == (0, 0)
    assert result.joined.num_rows == 0


# --- The result -----------------------------------------------------------------------------------------


def test_the_result_is_a_read_only_sequence_of_slices():
    result = encode_groups(job_id=JOB, epoch=EPOCH, groups=[_group(g) for g in (3, 1, 2)])
    assert isinstance(result, Sequence)
    assert len(result) == 3
    assert [b.column("group_id")[0].as_py() for b in result] == [3, 1, 2]
    assert result[-1].equals(result[2])
    assert isinstance(result[1:], list)
    assert [b.num_rows for b in result[1:]] == [3, 3]
    assert (
        result[0].column("response_ids").buffers()[1].address
        == result.joined.column("response_ids").buffers()[1].address
    )  # a slice: the joined buffers themselves
    with pytest.raises(IndexError):
        result[3]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.rows = (1,)  # type: ignore[misc]
    assert repr(result).startswith("EncodedGroups(3 groups, 9 rows, ")


def test_encoded_groups_refuses_rows_that_do_not_describe_the_joined_batch():
    joined = encode_groups(job_id=JOB, epoch=EPOCH, groups=[_group(1)]).joined
    with pytest.raises(InvalidRequestError, match="do not describe a joined batch of 3 rows"):
        EncodedGroups(joined, (2,), (10,))
    with pytest.raises(InvalidRequestError, match="1 sizes"):
        EncodedGroups(joined, (1, 2), (10,))


def test_sizes_count_the_bitmap_bytes_a_slice_covers():
    """Group 1's rows (3..5) of the advantage bitmap lie in its byte 0; group 2's (6..8) span bytes 0, 1."""
    advantage = [[1.0, None, 2.0], [None, 1.0, 1.0], [0.5, 0.5, None]]
    groups = [_group(gid, advantage=a) for gid, a in zip((1, 2, 3), advantage, strict=True)]
    result, _ = _check(groups)
    column = result.joined.select(["advantage"])
    assert group_nbytes(column, result.rows) == (4 * 3 + 1, 4 * 3 + 1, 4 * 3 + 2)


# --- Refusals -------------------------------------------------------------------------------------------


def _refused(groups: Any, error: type[Exception] = SchemaError, **call: Any) -> Any:
    arguments = {"job_id": JOB, "epoch": EPOCH, **call}
    with pytest.raises(error) as info:
        encode_groups(groups=groups, **arguments)
    return info.value


_CALL_KEYS = {"job_id", "epoch", "schema"}


@pytest.mark.parametrize(
    ("overrides", "column", "row", "message"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_a_group_encode_group_refuses_is_refused_naming_it(simple_group, overrides, column, row, message):
    group = {k: v for k, v in simple_group.items() if k not in _CALL_KEYS}
    call = {k: v for k, v in overrides.items() if k in _CALL_KEYS}
    bad = {**group, "group_id": 11, **{k: v for k, v in overrides.items() if k not in _CALL_KEYS}}
    error = _refused([{**group, "group_id": 10}, bad, {**group, "group_id": 12}], **call)
    assert message in str(error)
    assert (error.column, error.row) == (column, row)
    if overrides.keys() <= _CALL_KEYS:  # job_id, epoch or schema: the call's, worded as encode_group does
        assert "group" not in str(error)
    else:
        assert f"group 1 (group_id {bad['group_id']!r})" in str(error)
        assert error.group == 1


def test_a_float_in_a_declared_integer_telemetry_field_is_refused_naming_group_field_and_row(simple_group):
    """encode_groups takes telemetry on its precise tier (encode_group per group): a float there is refused
    as encode_group refuses it, not truncated, with the group added to column, field and row."""
    group = {k: v for k, v in simple_group.items() if k not in _CALL_KEYS}
    good, bad = telemetry_rows(), telemetry_rows(num_preemptions=1.7)
    groups = [{**group, "group_id": 10, "telemetry": good["telemetry"]}]
    groups.append({**group, "group_id": 11, "telemetry": bad["telemetry"]})
    error = _refused(groups, schema=TELEMETRY)
    assert (error.group, error.column, error.field, error.row) == (1, "telemetry", "num_preemptions", 1)
    assert "group 1 (group_id 11): column 'telemetry' field 'num_preemptions' row 1" in str(error)


@pytest.mark.parametrize("overrides", UNUSUAL.values(), ids=list(UNUSUAL))
def test_an_unusual_group_gives_the_outcome_of_encode_group(overrides):
    """Inputs at the edges of the merged tier's form (offsets past int32, strided, decreasing, ...)."""
    overrides = {k: v for k, v in overrides.items() if k not in _CALL_KEYS}
    ids, offsets = np.arange(11, dtype=np.int32), np.array([0, 4, 4, 11], dtype=np.int32)
    base = {
        "prompt_ids": np.arange(5, dtype=np.int32),
        "response_ids": (ids, offsets),
        "response_logprobs": (np.zeros(11, np.float32), offsets),
        "reward": np.zeros(3, np.float32),
    }
    groups = [{**base, "group_id": 1}, {**base, **overrides, "group_id": 2}, {**base, "group_id": 3}]
    try:
        encode_group(job_id=JOB, epoch=EPOCH, **groups[1])
    except Exception as exc:  # every refusal is a SchemaError; any other exception must match too
        own = exc
    else:
        own = None
    if own is None:
        _check(groups)
        return
    error = _refused(groups, type(own))
    if isinstance(own, SchemaError):
        assert (error.column, error.row, error.group) == (own.column, own.row, 1)
        assert str(error) == f"group 1 (group_id 2): {own}"
    else:
        assert error.__notes__[-1].endswith("group 1 (group_id 2) of encode_groups")


def test_sample_counts_that_cancel_across_groups_are_refused_for_the_first_group():
    """Group 0's logprobs have one sample more, group 1's one fewer: merged, the totals would agree."""
    first, second = _group(1), _group(2)
    values, offsets = first["response_logprobs"]
    first["response_logprobs"] = (np.concatenate([values, [0.0]]).astype(np.float32), np.append(offsets, 12))
    values, offsets = second["response_logprobs"]
    second["response_logprobs"] = (values[:4], offsets[:-1])
    error = _refused([first, second])
    assert str(error).startswith("group 0 (group_id 1): column 'response_logprobs' has 4 rows")


def test_per_token_lengths_that_differ_in_one_group_name_the_group_and_row():
    bad = _group(2)
    values, _ = bad["response_logprobs"]
    bad["response_logprobs"] = (values, np.array([0, 4, 5, 11], dtype=np.int32))
    error = _refused([_group(1), bad])
    assert (error.group, error.column, error.row) == (1, "response_logprobs", 1)
    assert "row 1 has 1 entries but response_ids has 0" in str(error)


@pytest.mark.parametrize(
    "offsets",
    [np.array([0, 2**31 - 1, 0, 11], dtype=np.int32), np.array([0, 2**62, 4, 11], dtype=np.int64)],
    ids=["int32, wraps when rebased", "int64"],
)
def test_an_offset_past_the_groups_last_is_refused_after_merging_too(offsets):
    """Rebased onto group 0's 11 values, 2**31 - 1 wraps in int32: the merged offsets must still decrease."""
    bad = _group(2)
    values, _ = bad["response_ids"]
    bad["response_ids"] = (values, offsets)
    error = _refused([_group(1), bad])
    assert (error.group, error.column, error.row) == (1, "response_ids", 1)
    assert "offsets decrease" in str(error)


def test_floats_for_token_ids_in_one_group_name_it():
    bad = _group(2)
    values, offsets = bad["response_ids"]
    bad["response_ids"] = (values.astype(np.float32), offsets)
    error = _refused([_group(1), _group(3), bad])
    assert str(error).startswith("group 2 (group_id 2): column 'response_ids': wrong dtype float32")


@pytest.mark.parametrize(
    ("group_id", "message"),
    [
        (-1, "group 1 (group_id -1): group_id must be a non-negative integer"),
        (2**63, "fits int64"),
        (1.0, "got 1.0"),
        (1, "group 1 (group_id 1) repeats the group_id of group 0: a group id names one group"),
    ],
    ids=["negative", "past int64", "a float", "repeated"],
)
def test_bad_or_repeated_group_ids_are_refused(group_id, message):
    error = _refused([_group(1), {**_group(2), "group_id": group_id}])
    assert message in str(error)
    assert (error.column, error.group) == ("group_id", 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g: g.pop("group_id"), "group 1 has no 'group_id'"),
        (lambda g: g.pop("reward"), "group 1 (group_id 2) has no 'reward'"),
        (lambda g: g.update(job_id="other"), "holds 'job_id': it is the same for every group; pass job_id="),
        (lambda g: g.update(epoch=1), "pass epoch= to encode_groups itself"),
        (lambda g: g.update(schema=STANDARD_SCHEMA), "pass schema= to encode_groups itself"),
        (lambda g: g.update(rewards=[1]), "holds 'rewards', which is not an argument of encode_group"),
    ],
    ids=["no group id", "no reward", "job id", "epoch", "schema", "unknown key"],
)
def test_keys_a_group_may_not_hold_or_lack_are_refused(change, message):
    bad = _group(2)
    change(bad)
    error = _refused([_group(1), bad])
    assert message in str(error)
    assert error.group == 1


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ({}, {"advantage": np.zeros(3, np.float32)}, "has columns ['advantage'] that group 0 has not"),
        ({"advantage": np.zeros(3, np.float32)}, {}, "lacks columns ['advantage'] that group 0 has"),
        ({}, {"top_p_ids": [[[1]] * 4, [], [[2]] * 7]}, "has columns ['top_p_ids']"),
        (
            {"extra": {"tag": [1, 2, 3]}},
            {"extra": {"tag": ["a", "b", "c"]}},
            "has column 'tag' as string (nullable), group 0 as int64 (nullable)",
        ),
        ({"advantage": [1.0, 2.0, 3.0]}, {"advantage": None}, "lacks columns ['advantage']"),
        ({"extra": {"a": [1, 2, 3], "b": [1, 2, 3]}}, {"extra": {"b": [1, 2, 3], "a": [1, 2, 3]}}, "order"),
    ],
    ids=[
        "advantage added",
        "advantage left out",
        "top-p added",
        "user column type",
        "None leaves out",
        "user columns in another order",
    ],
)
def test_groups_of_different_schemas_are_refused_naming_the_first_that_differs(first, second, message):
    error = _refused([_group(1, **first), _group(2, **first), _group(3, **second), _group(4, **second)])
    assert message in str(error)
    assert str(error).startswith("group 2 (group_id 3) ")
    assert "put groups of different columns (or column types) in separate encode_groups calls" in str(error)
    assert error.group == 2


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([], "empty list of groups; pass at least one group"),
        ({"group_id": 1}, "must be a sequence (a list) of mappings, one per group, got dict"),
        ("groups", "got str"),
        (None, "got NoneType"),
        ((g for g in [1]), "got generator"),
        ([_group(1), 7], "groups[1] has type int; each group is a mapping"),
    ],
    ids=["empty", "a mapping", "a string", "None", "a generator", "not a mapping"],
)
def test_groups_that_are_not_a_sequence_of_mappings_are_refused(groups, message):
    error = _refused(groups, InvalidRequestError)
    assert message in str(error)


def test_an_exception_other_than_a_refusal_is_told_which_group_raised_it():
    groups = [_group(gid, sample_ids=["a", "b", "c"]) for gid in (1, 2)]  # the precise tier
    first = encode_group(job_id=JOB, epoch=EPOCH, **groups[0])
    with (
        mock.patch.object(_encode_many, "encode_group", side_effect=[first, MemoryError()]),
        pytest.raises(MemoryError) as info,
    ):
        encode_groups(job_id=JOB, epoch=EPOCH, groups=groups)
    assert info.value.__notes__ == ["raised by encode_group for group 1 (group_id 2) of encode_groups"]


def test_a_failing_merged_encode_steps_aside_for_the_precise_tier():
    """The merged tier never refuses: whatever its encode raises, the groups are encoded one by one."""
    with mock.patch.object(_encode_merged, "encode_group", side_effect=SchemaError("merged only")):
        result, tier = _tiers([_group(1), _group(2)])
    assert tier == "precise"
    assert result.rows == (3, 3)
