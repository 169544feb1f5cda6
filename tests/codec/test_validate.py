"""validate_group's cheap checks against its precise ones: the same verdict and the same error, always.

Storage servers validate every group they receive, so validate_group first runs cheap checks that can
only accept (null counts, key columns as raw bytes, list offsets as numpy views); the precise
``pyarrow.compute`` checks run when those do not accept, and word the error. These tests generate groups
valid and invalid (sliced, offsets not starting at 0, nulls, null entries inside ragged rows, a wrong key
in any row, dictionary job ids, large_list columns, after IPC or not) and compare validate_group with the
same call forced onto the precise checks alone.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajflight import workload
from trajflight.codec import (
    STANDARD_SCHEMA,
    TrajectorySchema,
    _validate,
    decode,
    encode_group,
    validate_group,
)
from trajflight.codec._validate import check_ragged_lengths
from trajflight.errors import SchemaError
from trajflight.keys import Partition


def _custom_schema() -> TrajectorySchema:
    """The standard columns with nullable keys, an int32 epoch and large_list token ids (int64 offsets)."""
    changes = {
        "job_id": pa.field("job_id", pa.string(), nullable=True),
        "epoch": pa.field("epoch", pa.int32(), nullable=True),
        "response_ids": pa.field("response_ids", pa.large_list(pa.int32()), nullable=False),
        "top_p_ids": pa.field("top_p_ids", pa.large_list(pa.large_list(pa.int32())), nullable=True),
    }
    return TrajectorySchema(
        tuple(changes.get(f.name, f) for f in STANDARD_SCHEMA.fields), STANDARD_SCHEMA.required
    )


SCHEMAS = {"standard": STANDARD_SCHEMA, "custom": _custom_schema()}
RAGGED = ("response_logprobs", "loss_mask", "top_p_ids", "top_p_probs")
_ONE_MORE = {"response_logprobs": -0.5, "loss_mask": 1, "top_p_ids": [7], "top_p_probs": [0.25]}


@contextmanager
def _precise_only() -> Iterator[None]:
    """validate_group and check_ragged_lengths with their cheap checks switched off."""
    with (
        mock.patch.object(_validate, "_plan", return_value=None),
        mock.patch.object(_validate, "ragged_agree", return_value=False),
    ):
        yield


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", call())
    except SchemaError as exc:
        return ("SchemaError", str(exc), exc.column, exc.row)
    except Exception as exc:  # e.g. an Arrow error on data full=False let through: it must match too
        return (type(exc).__name__, str(exc))


def _ipc(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as a storage server sees it: written to an IPC stream and read back."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(pa.BufferReader(sink.getvalue())).read_next_batch()


def _with_junk_in_front(array: pa.Array, junk: list[Any]) -> pa.Array:
    """The same rows as a slice of a longer array: its offsets (or data) do not start at 0."""
    return pa.concat_arrays([pa.array(junk, array.type), array]).slice(len(junk))


_JUNK: dict[str, list[Any]] = {
    "job_id": ["xx"],
    "sample_id": ["yy", "z"],
    "prompt_ids": [[5, 5]],
    "response_ids": [[7], [7, 7]],
    "response_logprobs": [[0.1, 0.2, 0.3]],
    "loss_mask": [[1]],
    "top_p_ids": [[[1, 2]], [[3]]],
    "top_p_probs": [[[0.5, 0.5, 0.5]]],
}


@st.composite
def groups(
    draw: st.DrawFn, *, without_candidates: bool = False
) -> tuple[pa.RecordBatch, TrajectorySchema, Partition | None]:
    """A batch (mostly one group, sometimes several or a slice), its schema and the key to expect;
    ``without_candidates``: always top-p columns, always with null rows (:func:`_samples_without_candidates`).
    """
    schema_name = draw(st.sampled_from(sorted(SCHEMAS)))
    schema = SCHEMAS[schema_name]
    groups_ = draw(st.sampled_from([1, 1, 1, 1, 1, 2, 3]))  # several: rows of other groups, or slices of one
    sizes = draw(st.lists(st.integers(1, 3), min_size=groups_, max_size=groups_))
    group_ids = [5 + g for g, size in enumerate(sizes) for _ in range(size)]
    n = len(group_ids)
    # Samples of zero tokens more often with null top-p rows: only the validity bitmaps tell them apart.
    length = st.integers(0, 4) | st.just(0) if without_candidates else st.integers(0, 4)
    lengths = draw(st.lists(length, min_size=n, max_size=n))
    top_p = without_candidates or draw(st.booleans())
    candidates = [draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)) for k in lengths]
    job = draw(st.sampled_from(["j", "job", "jé"]))
    data: dict[str, list[Any]] = {
        "job_id": [job] * n,
        "epoch": [1] * n,
        "group_id": group_ids,
        "sample_index": list(range(n)),
        "sample_id": [f"s{i}" for i in range(n)],
        "policy_version": [0] * n,
        "prompt_ids": [[1, 2]] * n,
        "response_ids": [list(range(k)) for k in lengths],
        "response_logprobs": [[-0.5] * k for k in lengths],
        "loss_mask": [[1] * k for k in lengths],
        "reward": [1.0] * n,
    }
    if top_p:
        data["top_p_ids"] = [[[7] * c for c in row] for row in candidates]
        data["top_p_probs"] = [[[0.25] * c for c in row] for row in candidates]

    mutation = draw(
        st.sampled_from(
            # Fewer refusals before the ragged checks where the null top-p rows are what is tested.
            ["none", "none", "none", "key", "entry", "length", "length", "candidate", "candidate"]
            if without_candidates
            else [
                *("none", "key", "null", "no candidates", "entry", "entry"),
                *("length", "length", "length", "candidate", "candidate"),
            ]
        )
    )
    row = draw(st.sampled_from([0, n - 1]) | st.integers(0, n - 1))
    if mutation == "key":
        name = draw(st.sampled_from(["job_id", "epoch", "group_id"]))
        data[name][row] = (
            draw(st.sampled_from(["k", "jo", "job2"])) if name == "job_id" else data[name][row] + 1
        )
    elif mutation == "null":  # refused: a non-nullable column, or one top_p_* column alone (half the time)
        columns = [c for c in RAGGED[2:] if c in data]
        data[draw(st.sampled_from(columns if columns and draw(st.booleans()) else sorted(data)))][row] = None
    elif mutation == "no candidates" and top_p:  # a sample without candidates: valid
        data["top_p_ids"][row] = data["top_p_probs"][row] = None
    elif mutation == "entry":  # a null inside a row: refused in every standard ragged column
        name = draw(st.sampled_from([c for c in ("prompt_ids", "response_ids", *RAGGED) if c in data]))
        cell = [list(x) if isinstance(x, list) else x for x in data[name][row]]  # rows may share lists
        if cell:
            at = draw(st.integers(0, len(cell) - 1))
            if isinstance(cell[at], list) and cell[at] and draw(st.booleans()):
                cell[at][draw(st.integers(0, len(cell[at]) - 1))] = None  # a null candidate
            else:
                cell[at] = None  # a null entry, or a null token of top_p_*
            data[name][row] = cell
    elif mutation == "length":
        name = draw(st.sampled_from([c for c in RAGGED if c in data]))
        shorter = bool(data[name][row]) and draw(st.booleans())
        # Both top-p columns alike, some of the time: they agree with each other, not with response_ids.
        both = top_p and name in RAGGED[2:] and draw(st.booleans())
        for column in RAGGED[2:] if both else (name,):
            cell = data[column][row]
            data[column][row] = cell[:-1] if shorter else [*cell, _ONE_MORE[column]]
    elif mutation == "candidate" and top_p and lengths[row]:
        token = draw(st.integers(0, lengths[row] - 1))
        data["top_p_probs"][row][token] = [*data["top_p_probs"][row][token], 0.25]
    holes = without_candidates or (top_p and draw(st.booleans()))
    # Half the time the mutated row keeps its candidates, so the null rows do not hide the mutation.
    keep = row if n > 1 and draw(st.booleans()) else None
    spanning = _samples_without_candidates(draw, data, lengths, keep) if holes else {}

    arrays = []
    for name, values in data.items():
        array = pa.array(values, schema.field(name).type)
        if name in spanning:
            array = _null_rows_over_tokens(array, spanning[name])
        if name == "job_id" and draw(st.booleans()):
            array = _dictionary(array, many=draw(st.booleans()))
        elif name in _JUNK and draw(st.booleans()):
            array = _with_junk_in_front(array, _JUNK[name])
        arrays.append(array)
    batch = pa.RecordBatch.from_arrays(arrays, names=list(data))

    cut = draw(st.sampled_from(["whole", "whole", "whole", "slice", "slice", "slice", "no rows"]))
    if cut == "slice":
        start = draw(st.integers(0, n - 1))
        batch = batch.slice(start, draw(st.integers(1, n - start)))
    elif cut == "no rows":
        batch = batch.slice(draw(st.integers(0, n)), 0)
    if draw(st.booleans()):
        batch = _ipc(batch)
    expect = draw(st.sampled_from(["none", "right", "right", "right", "wrong"]))
    if expect == "none":
        return batch, schema, None
    first = batch.column("group_id")[0].as_py() if batch.num_rows else None
    key = Partition(job, 1, 5 if first is None else first)
    if expect == "wrong":
        field = draw(st.sampled_from(["job_id", "epoch", "group_id"]))
        key = key._replace(**{field: "jx" if field == "job_id" else getattr(key, field) + 1})
    return batch, schema, key


def _samples_without_candidates(
    draw: st.DrawFn, data: dict[str, list[Any]], lengths: list[int], keep: int | None
) -> dict[str, set[int]]:
    """Over whatever mutation ``data`` (with top-p columns) has: samples without candidates, None in both
    top-p columns (valid); or, one time in four each, one row None in one column alone (refused), or null
    rows left spanning their tokens in one column or both (Arrow allows it; encode_group never builds it).

    ``lengths`` are the samples' token counts; row ``keep`` (if not None) is not made null. Returns the
    rows to make null over their tokens, by column (:func:`_null_rows_over_tokens`); the other null rows
    are set to None in ``data``.
    """
    rows = draw(st.sets(st.sampled_from([r for r in range(len(lengths)) if r != keep]), min_size=1))
    twist = draw(st.sampled_from(["both", "both", "one side", "spanning"]))
    names = ("top_p_ids", "top_p_probs")
    if twist == "spanning":  # in one column (refused) or both (valid where the rest is)
        return {name: rows for name in draw(st.sampled_from([names, names[:1], names[1:]]))}
    # The lone row of zero tokens half the time (where there is one): the offsets then agree.
    empty = sorted(r for r in rows if not lengths[r])
    lone = draw(st.sampled_from(empty if empty and draw(st.booleans()) else sorted(rows)))
    if twist != "one side":
        lone = None
    kept = draw(st.sampled_from(names))  # the column whose row ``lone`` keeps its candidates
    for name in names:
        for row in rows:
            if row != lone or name != kept:
                data[name][row] = None
    return {}


def _null_rows_over_tokens(array: pa.Array, rows: set[int]) -> pa.Array:
    """``array`` (a list column) with ``rows`` null but still spanning the tokens they held."""
    mask = pa.array([i in rows or not array[i].is_valid for i in range(len(array))])
    return type(array).from_arrays(array.offsets, array.values, mask=mask)


def _dictionary(array: pa.Array, *, many: bool) -> pa.Array:
    """``array`` dictionary-encoded: a one-entry dictionary where it can be, else (or if ``many``) more."""
    encoded = array.dictionary_encode()
    if not many:
        return encoded
    # An unused first entry: indices are then all 1, and the dictionary has two entries.
    dictionary = pa.concat_arrays([pa.array(["unused"]), encoded.dictionary])
    return pa.DictionaryArray.from_arrays(pa.compute.add(encoded.indices, 1).cast(pa.int8()), dictionary)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_cheap_and_precise_checks_give_the_same_verdict(case: tuple[pa.RecordBatch, TrajectorySchema, Any]):
    batch, schema, expect = case
    cheap = _outcome(lambda: validate_group(batch, schema, expect=expect))
    with _precise_only():
        precise = _outcome(lambda: validate_group(batch, schema, expect=expect))
    assert cheap == precise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups(without_candidates=True))
def test_cheap_and_precise_checks_agree_on_samples_without_candidates(
    case: tuple[pa.RecordBatch, TrajectorySchema, Any],
):
    """The cheap checks accept top-p null rows (None in both columns, spanning no token); every group
    here has some, valid or not (one column None alone, null rows over tokens, and the other mutations)."""
    batch, schema, expect = case
    cheap = _outcome(lambda: validate_group(batch, schema, expect=expect))
    with _precise_only():
        precise = _outcome(lambda: validate_group(batch, schema, expect=expect))
    assert cheap == precise
    ragged = _outcome(lambda: check_ragged_lengths(batch))  # encode_group's entry to the same checks
    with _precise_only():
        assert ragged == _outcome(lambda: check_ragged_lengths(batch))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_check_ragged_lengths_cheap_and_precise_agree(case: tuple[pa.RecordBatch, TrajectorySchema, Any]):
    batch = case[0]
    cheap = _outcome(lambda: check_ragged_lengths(batch))
    with _precise_only():
        precise = _outcome(lambda: check_ragged_lengths(batch))
    assert cheap == precise


@contextmanager
def _precise_checks_forbidden() -> Iterator[None]:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a precise check ran on a valid group")

    with (
        mock.patch.object(_validate, "check_nulls", refuse),
        mock.patch.object(_validate, "_check_constant", refuse),
        mock.patch.object(_validate, "_check_ragged_precisely", refuse),
        mock.patch.object(_validate, "_refuse_null_entry", refuse),
    ):
        yield


@pytest.mark.parametrize("top_p", [False, True], ids=["plain", "top_p"])
def test_a_valid_group_from_ipc_passes_on_the_cheap_checks_alone(top_p):
    """What keeps a server's validation cheap: no pyarrow.compute pass for a group that is fine."""
    group = _ipc(workload.make_workload(2, 8, seed=0, top_p=top_p)[1].encode("job", 1))
    with _precise_checks_forbidden():
        assert validate_group(group, expect=Partition("job", 1, 1)) == Partition("job", 1, 1)
        assert validate_group(group) == Partition("job", 1, 1)


def test_a_wrong_key_in_the_last_row_of_a_large_batch_is_named():
    groups_ = [g.encode("job", 1) for g in workload.make_workload(8, 8, seed=0, response_median=8.0)]
    whole = pa.concat_batches(groups_)
    epochs = pa.array([1] * (whole.num_rows - 1) + [2], pa.int64())
    index = whole.schema.get_field_index("epoch")
    whole = _ipc(whole.set_column(index, whole.schema.field(index), epochs))
    with pytest.raises(SchemaError, match=r"'epoch' row 63 is 2, expected 1") as info:
        validate_group(whole, expect=Partition("job", 1, 0))
    assert (info.value.column, info.value.row) == ("epoch", 63)


@pytest.mark.parametrize("many", [False, True], ids=["one-entry", "two-entry"])
def test_a_dictionary_encoded_job_id_is_checked_like_a_string(many):
    group = workload.make_workload(1, 4, seed=0)[0].encode("job", 1)
    index = group.schema.get_field_index("job_id")
    encoded = group.set_column(index, "job_id", _dictionary(group.column("job_id"), many=many))
    assert validate_group(encoded) == Partition("job", 1, 0)
    assert validate_group(_ipc(encoded), expect=Partition("job", 1, 0)) == Partition("job", 1, 0)
    with pytest.raises(SchemaError, match=r"'job_id' row 0 is 'job', expected 'other'"):
        validate_group(encoded, expect=Partition("other", 1, 0))


def test_the_second_group_of_a_sliced_batch_validates_with_its_own_key():
    """A slice's offsets do not start at 0, and its key columns start mid-buffer."""
    a, b = (g.encode("job", 3) for g in workload.make_workload(2, 4, seed=1))
    second = pa.concat_batches([a, b]).slice(a.num_rows)
    assert second.column("response_ids").offsets[0].as_py() > 0
    assert validate_group(second, expect=Partition("job", 3, 1)) == Partition("job", 3, 1)
    with pytest.raises(SchemaError, match=r"'group_id' row 0 is 1, expected 0"):
        validate_group(second, expect=Partition("job", 3, 0))


@pytest.mark.parametrize("repeated", ["top_p_probs", "loss_mask", "reward", "epoch"])
@pytest.mark.parametrize("bad_lengths", [False, True], ids=["good", "bad-lengths"])
def test_a_repeated_column_name_gives_what_the_precise_checks_give(repeated, bad_lengths):
    """Arrow lets a batch repeat a name; the cheap checks step aside rather than pick one of the columns."""
    group = workload.make_workload(1, 4, seed=0, top_p=True)[0].encode("job", 1)
    if bad_lengths:
        index = group.schema.get_field_index("response_logprobs")
        short = pa.array([[0.5]] * group.num_rows, pa.list_(pa.float32()))
        group = group.set_column(index, "response_logprobs", short)
    group = group.append_column(repeated, group.column(repeated))
    for call in (
        lambda: validate_group(group, expect=Partition("job", 1, 0)),
        lambda: check_ragged_lengths(group),
    ):
        cheap = _outcome(call)
        with _precise_only():
            assert cheap == _outcome(call)


def test_a_repeated_column_name_is_a_schema_error_naming_it():
    """Regression: a repeated name used to escape as a KeyError from the column lookups."""
    group = workload.make_workload(1, 4, seed=0)[0].encode("job", 1)
    twice = group.append_column("reward", group.column("reward"))
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks, pytest.raises(SchemaError, match="'reward' appears more than once") as info:
            validate_group(twice, expect=Partition("job", 1, 0))
        assert info.value.column == "reward"


@pytest.mark.parametrize("expect", [None, Partition("job", 1, 0)], ids=["no-expect", "expect"])
def test_a_null_key_in_a_schema_that_allows_it_is_a_schema_error_naming_the_row(expect):
    """Regression: with nullable key columns (a custom schema), a null first key raised a TypeError."""
    group = workload.make_workload(1, 4, seed=0)[0].encode("job", 1)
    nullable = TrajectorySchema(
        tuple(f.with_nullable(True) if f.name == "job_id" else f for f in STANDARD_SCHEMA.fields),
        STANDARD_SCHEMA.required,
    )
    for row in (0, 2):
        job = pa.array(["job" if i != row else None for i in range(group.num_rows)], pa.string())
        holed = group.set_column(group.schema.get_field_index("job_id"), "job_id", job)
        for checks in (contextlib.nullcontext(), _precise_only()):
            with checks, pytest.raises(SchemaError, match=f"'job_id' row {row} is null") as info:
                validate_group(holed, nullable, expect=expect)
            assert info.value.row == row


def test_nulls_in_several_columns_name_the_first_in_column_order():
    """Regression: the null check walked a set, so which column an error named could vary by process."""
    group = workload.make_workload(1, 4, seed=0)[0].encode("job", 1)
    for name in ("sample_index", "reward"):
        index = group.schema.get_field_index(name)
        values = group.column(name).to_pylist()
        values[1] = None
        group = group.set_column(
            index, group.schema.field(index), pa.array(values, group.schema.field(index).type)
        )
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks, pytest.raises(SchemaError, match="'sample_index' row 1 is null"):
            validate_group(group, expect=Partition("job", 1, 0))


def _with_null(
    group: pa.RecordBatch, name: str, row: int, token: int, candidate: int | None
) -> pa.RecordBatch:
    """``group`` with entry ``token`` of ``row`` (or that token's ``candidate``) of ``name`` set to null,
    built with pyarrow directly, as an analyst or another client might build a group."""
    rows = group.column(name).to_pylist()
    cell = list(rows[row])
    if candidate is None:
        cell[token] = None
    else:
        cell[token] = [None if c == candidate else v for c, v in enumerate(cell[token])]
    rows[row] = cell
    index = group.schema.get_field_index(name)
    return group.set_column(index, group.schema.field(index), pa.array(rows, group.schema.field(index).type))


@pytest.mark.parametrize(
    ("name", "token", "candidate", "message"),
    [
        ("prompt_ids", 1, None, "row 2 entry 1 is null"),
        ("response_ids", 0, None, "row 2 entry 0 is null"),
        ("response_logprobs", 3, None, "row 2 entry 3 is null"),
        ("loss_mask", 1, None, "row 2 entry 1 is null"),
        ("top_p_ids", 1, None, "row 2 token 1 is null"),
        ("top_p_probs", 2, None, "row 2 token 2 is null"),
        ("top_p_ids", 1, 0, "row 2 token 1 candidate 0 is null"),
        ("top_p_probs", 0, 1, "row 2 token 0 candidate 1 is null"),
    ],
)
def test_a_null_entry_inside_a_standard_ragged_row_is_refused_naming_row_and_entry(
    name, token, candidate, message
):
    """Regression: validate_group (what servers run before a put becomes visible) accepted a group with a
    null inside a ragged row, which encode_group refuses and every trainer's decode then failed on."""
    group = workload.make_workload(1, 4, seed=0, top_p=True, response_median=8.0)[0].encode("job", 1)
    cell = group.column(name)[2].as_py()
    assert len(cell) > token  # the entry (or token) exists, and so does the candidate
    assert candidate is None or len(cell[token]) > candidate
    holed = _with_null(group, name, 2, token, candidate)
    with pytest.raises(SchemaError):
        decode(holed)  # why the group is refused: it could be stored but never trained on
    for batch in (holed, _ipc(holed)):
        for full in (True, False):  # not Arrow's structural validation: refused either way
            for checks in (contextlib.nullcontext(), _precise_only()):
                with checks, pytest.raises(SchemaError, match=f"column {name!r} {message}") as info:
                    validate_group(batch, expect=Partition("job", 1, 0), full=full)
                assert (info.value.column, info.value.row) == (name, 2)


def test_null_entries_in_user_ragged_columns_are_kept():
    """Every user column round-trips, nulls included; only the standard columns refuse them."""
    schema = STANDARD_SCHEMA.extend(
        ("ref_logprobs", pa.list_(pa.float32())), ("alt_ids", pa.list_(pa.list_(pa.int32())))
    )
    group = workload.make_workload(1, 3, seed=0)[0].encode("job", 1)
    group = group.append_column("ref_logprobs", pa.array([[0.5, None], [], None], pa.list_(pa.float32())))
    group = group.append_column(
        "alt_ids", pa.array([[[1, None], None], [], [[]]], schema.field("alt_ids").type)
    )
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks:
            assert validate_group(group, schema, expect=Partition("job", 1, 0)) == Partition("job", 1, 0)
            assert validate_group(_ipc(group), schema) == Partition("job", 1, 0)


def test_nulls_outside_every_row_are_not_refused():
    """Arrow's null count covers a child's every value; a slice or a null row can hide the null from all
    rows, and then the group is valid (decode reads only what the rows span)."""
    a, b = (g.encode("job", 1) for g in workload.make_workload(2, 3, seed=0, top_p=True, response_median=8.0))
    holed = _with_null(pa.concat_batches([a, b]), "response_ids", 1, 0, None)
    second = holed.slice(a.num_rows)  # the null lies in the first group's rows
    assert second.column("response_ids").values.null_count == 1
    candidates = b.column("top_p_ids").to_pylist()
    candidates[1] = [[1], None]  # a null token under a null row (a sample without candidates)
    tokens = pa.array(candidates, b.schema.field("top_p_ids").type)
    mask = pa.array([i == 1 for i in range(b.num_rows)])
    hidden = pa.ListArray.from_arrays(tokens.offsets, tokens.values, mask=mask)
    assert hidden.values.null_count == 1
    assert hidden.null_count == 1
    probs = pa.array([None if i == 1 else r for i, r in enumerate(b.column("top_p_probs").to_pylist())])
    index = b.schema.get_field_index("top_p_ids")
    b = b.set_column(index, b.schema.field(index), hidden)
    b = b.set_column(index + 1, b.schema.field(index + 1), probs.cast(b.schema.field(index + 1).type))
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks:
            assert validate_group(second, expect=Partition("job", 1, 1)) == Partition("job", 1, 1)
            assert validate_group(b, expect=Partition("job", 1, 1)) == Partition("job", 1, 1)
    decode(second)


def test_a_null_top_p_row_that_encode_group_writes_is_valid():
    """encode_group documents ``None`` as a sample without candidates and the standard schema declares
    top_p_* nullable, so validate_group accepts the row; decode reads it as a sample of zero tokens (it
    refused the whole top-p column until a trainer distilling from top-p candidates crashed on it)."""
    group = workload.make_workload(1, 3, seed=0, top_p=True, response_median=8.0)[0]
    columns = group.columns(job_id="job", epoch=1, group_id=0)
    encoded = group.encode("job", 1)
    for name in ("top_p_ids", "top_p_probs"):
        columns[name] = [None if i == 1 else r for i, r in enumerate(encoded.column(name).to_pylist())]
    batch = encode_group(**columns)
    assert batch.column("top_p_ids").null_count == 1
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks:
            assert validate_group(_ipc(batch), expect=Partition("job", 1, 0)) == Partition("job", 1, 0)
    top = decode(batch).doubly_ragged["top_p_ids"]
    lengths = (top.outer_offsets[1:] - top.outer_offsets[:-1]).tolist()
    responses = [len(r) for r in batch.column("response_ids").to_pylist()]
    assert lengths == [0 if i == 1 else n for i, n in enumerate(responses)]
    assert decode(batch, columns=["response_ids", "loss_mask"]).columns == ("response_ids", "loss_mask")


def _without_candidates(group: pa.RecordBatch, name: str, rows: set[int]) -> pa.RecordBatch:
    """``group`` with ``rows`` of top-p column ``name`` null (no candidates), built with pyarrow directly."""
    index = group.schema.get_field_index(name)
    field = group.schema.field(index)
    values = [None if i in rows else r for i, r in enumerate(group.column(index).to_pylist())]
    return group.set_column(index, field, pa.array(values, field.type))


@pytest.mark.parametrize("row", [0, 2], ids=["first-row", "third-row"])
@pytest.mark.parametrize(("name", "other"), [("top_p_ids", "top_p_probs"), ("top_p_probs", "top_p_ids")])
def test_a_sample_without_candidates_in_one_top_p_column_only_is_refused(name, other, row):
    """Regression: validate_group exempted a top-p row null on either side, so a group whose top_p_ids
    and top_p_probs disagree about which samples have no candidates was stored; decode reads a null row as
    zero tokens, so the two columns came back with different outer offsets and a distillation loss
    pairing ids with probs silently misaligned."""
    group = workload.make_workload(1, 4, seed=0, top_p=True, response_median=8.0)[0].encode("job", 1)
    holed = _without_candidates(group, name, {row})
    # Why the group is refused: the columns' samples no longer line up. (decode refuses the two together
    # since; each alone still decodes so.)
    top = {n: decode(holed, columns=[n]).doubly_ragged[n] for n in (name, other)}
    assert top[name].outer_offsets.tolist() != top[other].outer_offsets.tolist()
    message = f"column {name!r} row {row} is None but {other} row {row} is not"
    for batch in (holed, _ipc(holed)):
        for full in (True, False):  # not Arrow's structural validation: refused either way
            for checks in (contextlib.nullcontext(), _precise_only()):
                with checks, pytest.raises(SchemaError, match=message) as info:
                    validate_group(batch, expect=Partition("job", 1, 0), full=full)
                assert "both must be None for the same samples" in str(info.value)
                assert (info.value.column, info.value.row) == (name, row)


def test_top_p_columns_null_for_the_same_samples_pass_and_a_slice_is_judged_on_its_own_rows():
    """Both columns None for a sample is a sample without candidates; a disagreement outside a slice's
    rows is not the slice's, and one inside is named by the slice's row."""
    a, b = (g.encode("job", 1) for g in workload.make_workload(2, 3, seed=0, top_p=True, response_median=8.0))
    both = pa.concat_batches([a, b])
    both = _without_candidates(_without_candidates(both, "top_p_ids", {0, 4}), "top_p_probs", {0, 4})
    apart = _without_candidates(both, "top_p_ids", {1})  # in a's rows only
    second = _without_candidates(apart, "top_p_probs", {5}).slice(3)  # and in b's row 2
    keys = Partition("job", 1, 0), Partition("job", 1, 1)
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks:
            assert validate_group(_ipc(both.slice(0, 3)), expect=keys[0]) == keys[0]
            assert validate_group(_ipc(both.slice(3)), expect=keys[1]) == keys[1]
            assert validate_group(_ipc(apart.slice(3)), expect=keys[1]) == keys[1]
            with pytest.raises(SchemaError, match="'top_p_probs' row 2 is None but top_p_ids row 2") as info:
                validate_group(_ipc(second), expect=keys[1])
            assert info.value.row == 2


def test_one_top_p_column_alone_may_have_samples_without_candidates():
    """Both top-p columns are optional (README, schema): one alone, with null rows, has nothing to
    disagree with and stays valid, from encode_group as from pyarrow."""
    group = workload.make_workload(1, 3, seed=0, top_p=True, response_median=8.0)[0]
    columns = group.columns(job_id="job", epoch=1, group_id=0)
    encoded = group.encode("job", 1)
    del columns["top_p_probs"]
    columns["top_p_ids"] = [
        None if i == 1 else r for i, r in enumerate(encoded.column("top_p_ids").to_pylist())
    ]
    alone = encode_group(**columns)
    assert "top_p_probs" not in alone.schema.names
    assert alone.column("top_p_ids").null_count == 1
    built = _without_candidates(encoded, "top_p_probs", {0}).drop_columns(["top_p_ids"])
    for checks in (contextlib.nullcontext(), _precise_only()):
        with checks:
            for batch in (alone, built):
                assert validate_group(_ipc(batch), expect=Partition("job", 1, 0)) == Partition("job", 1, 0)


def _edited(group: pa.RecordBatch, **rows: list[Any]) -> pa.RecordBatch:
    """``group`` with the named columns replaced by these Python rows, built with pyarrow directly."""
    for name, values in rows.items():
        index = group.schema.get_field_index(name)
        field = group.schema.field(index)
        group = group.set_column(index, field, pa.array(values, field.type))
    return group


@pytest.mark.parametrize("rows", [{0}, {2}, {3}, {0, 1, 3}], ids=["first", "middle", "last", "three"])
def test_samples_without_candidates_pass_on_the_cheap_checks_alone(rows):
    """Regression: any null top-p row made validate_group leave its cheap checks for the precise ones,
    ~560 us instead of ~50 us per group of the standard top-p workload, on every put a server validated."""
    group = workload.make_workload(1, 4, seed=0, top_p=True, response_median=8.0)[0].encode("job", 1)
    holed = _without_candidates(_without_candidates(group, "top_p_ids", rows), "top_p_probs", rows)
    second = pa.concat_batches([group, holed]).slice(group.num_rows)  # bitmaps and offsets mid-buffer
    with _precise_checks_forbidden():
        for batch in (_ipc(holed), holed, second, _ipc(second)):
            assert validate_group(batch, expect=Partition("job", 1, 0)) == Partition("job", 1, 0)
            check_ragged_lengths(batch)


def _one_side_on_an_empty_sample(group: pa.RecordBatch) -> pa.RecordBatch:
    """Row 1 has no tokens and is None in top_p_ids alone; row 0 is None in both. The outer offsets of
    the two columns agree: only their validity bitmaps differ."""
    edits = {n: group.column(n).to_pylist() for n in ("response_ids", *RAGGED)}
    for values in edits.values():
        values[1] = []
    edits["top_p_ids"][0] = edits["top_p_probs"][0] = edits["top_p_ids"][1] = None
    return _edited(group, **edits)


def _both_top_p_one_token_long(group: pa.RecordBatch) -> pa.RecordBatch:
    """Row 0 None in both top-p columns; row 2 one token longer in both than its response."""
    ids, probs = (group.column(n).to_pylist() for n in RAGGED[2:])
    ids[0] = probs[0] = None
    ids[2], probs[2] = [*ids[2], [7]], [*probs[2], [0.25]]
    return _edited(group, top_p_ids=ids, top_p_probs=probs)


def _probs_rows_shifted(group: pa.RecordBatch) -> pa.RecordBatch:
    """Row 3 None in both top-p columns; top_p_probs' last token of row 0 moved to the start of row 1:
    the same tokens and candidate sets in order as top_p_ids, in rows of other lengths."""
    ids, probs = (group.column(n).to_pylist() for n in RAGGED[2:])
    ids[3] = probs[3] = None
    probs[0], probs[1] = probs[0][:-1], [probs[0][-1], *probs[1]]
    return _edited(group, top_p_ids=ids, top_p_probs=probs)


def _one_candidate_more(group: pa.RecordBatch) -> pa.RecordBatch:
    """Row 0 None in both top-p columns; row 2 token 1 with one probability more than ids."""
    ids, probs = (group.column(n).to_pylist() for n in RAGGED[2:])
    ids[0] = probs[0] = None
    probs[2][1] = [*probs[2][1], 0.25]
    return _edited(group, top_p_ids=ids, top_p_probs=probs)


def _null_over_tokens(*names: str) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """Row 1 null in ``names`` while still spanning its tokens (Arrow allows it; encode_group never
    builds it), row 3 None in both top-p columns."""

    def edit(group: pa.RecordBatch) -> pa.RecordBatch:
        group = _without_candidates(_without_candidates(group, "top_p_ids", {3}), "top_p_probs", {3})
        for name in names:
            index = group.schema.get_field_index(name)
            array = _null_rows_over_tokens(group.column(index), {1})
            group = group.set_column(index, group.schema.field(index), array)
        return group

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_one_side_on_an_empty_sample, "'top_p_ids' row 1 is None but top_p_probs row 1 is not"),
        (_both_top_p_one_token_long, r"'top_p_ids' row 2 has \d+ entries but response_ids has \d+"),
        (_probs_rows_shifted, r"'top_p_probs' row 0 has \d+ entries but response_ids has \d+"),
        (_one_candidate_more, r"'top_p_probs' row 2 token 1 has \d+ candidates but top_p_ids has \d+"),
        (_null_over_tokens("top_p_probs"), "'top_p_probs' row 1 is None but top_p_ids row 1 is not"),
        (_null_over_tokens(*RAGGED[2:]), None),  # valid, on the precise checks
    ],
    ids=[
        *("one-side-empty-sample", "both-one-token-long", "probs-rows-shifted", "candidate-more"),
        *("one-over-tokens", "both-over"),
    ],
)
def test_groups_with_samples_without_candidates_get_the_precise_verdict(edit, message):
    """Each thing the cheap checks must see before they accept null top-p rows (the validity bitmaps,
    each column's lengths against response_ids, the candidate sets, null rows spanning no token), shown
    by a group that differs from a valid one in that alone."""
    group = edit(workload.make_workload(1, 4, seed=0, top_p=True, response_median=8.0)[0].encode("job", 1))
    assert group.column("top_p_ids").null_count
    assert group.column("top_p_probs").null_count
    for batch in (group, _ipc(group)):
        call = partial(validate_group, batch, expect=Partition("job", 1, 0))
        cheap = _outcome(call)
        with _precise_only():
            assert cheap == _outcome(call)
        if message is None:
            assert cheap == ("returned", Partition("job", 1, 0))
        else:
            with pytest.raises(SchemaError, match=message):
                validate_group(batch, expect=Partition("job", 1, 0))
