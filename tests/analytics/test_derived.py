"""The derived columns match their definitions, computed naively in Python, on every ragged edge."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from trajflight.analytics import DERIVED_COLUMNS, add_derived
from trajflight.errors import InvalidRequestError, SchemaError


def _entropy(probs: list[float]) -> float | None:
    s = sum(probs)
    if not probs or s <= 0:
        return None
    return -sum((p / s) * math.log(p / s) for p in probs if p > 0)


def _reference(row: dict) -> dict:
    logprobs = [v for v in row["response_logprobs"] or [] if v is not None]
    entropies = [e for e in (_entropy(t) for t in row["top_p_probs"] or []) if e is not None]
    prompt, response = row["prompt_ids"], row["response_ids"]
    return {
        "prompt_length": None if prompt is None else len(prompt),
        "response_length": None if response is None else len(response),
        "tokens": None if prompt is None or response is None else len(prompt) + len(response),
        "mean_logprob": sum(logprobs) / len(logprobs) if logprobs else None,
        "top_p_entropy": sum(entropies) / len(entropies) if entropies else None,
    }


def _table() -> pa.Table:
    return pa.table(
        {
            "prompt_ids": pa.array([[1, 2], [3], [], None, [4, 5, 6]], pa.list_(pa.int32())),
            "response_ids": pa.array([[7, 8, 9], [], [1], [2, 3], None], pa.list_(pa.int32())),
            "response_logprobs": pa.array(
                [[-0.5, -1.5, None], [], [-2.0], [-0.25, -0.75], None], pa.list_(pa.float32())
            ),
            "top_p_probs": pa.array(
                [[[0.5, 0.5], [1.0], []], [], [[0.2, 0.2, 0.4]], [[0.0, 0.0], [0.9, 0.1]], None],
                pa.list_(pa.list_(pa.float32())),
            ),
        }
    )


def _close(got: dict, want: dict) -> None:
    for name, value in want.items():
        if value is None or isinstance(value, int):
            assert got[name] == value, name
        else:
            assert got[name] == pytest.approx(value, rel=1e-6), name


def test_every_derived_column_matches_its_definition():
    table = _table()
    out = add_derived(table, DERIVED_COLUMNS)
    assert out.schema.names == [*table.schema.names, *DERIVED_COLUMNS]
    for got, row in zip(out.to_pylist(), table.to_pylist(), strict=True):
        _close(got, _reference(row))


def test_sliced_and_chunked_inputs_give_the_same_values():
    """Offsets of a slice do not start at 0 and ``.values`` ignores the slice: both must be honoured."""
    table = _table()
    whole = add_derived(table, DERIVED_COLUMNS).to_pylist()
    sliced = add_derived(table.slice(1, 3), DERIVED_COLUMNS).to_pylist()
    assert sliced == whole[1:4]
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    assert add_derived(chunked, DERIVED_COLUMNS).to_pylist() == whole


def test_a_one_candidate_token_has_zero_entropy_and_uniform_sets_log_k():
    table = pa.table({"top_p_probs": pa.array([[[1.0]], [[0.25] * 4]], pa.list_(pa.list_(pa.float32())))})
    values = add_derived(table, ["top_p_entropy"]).column("top_p_entropy").to_pylist()
    assert values[0] == 0.0
    assert values[1] == pytest.approx(math.log(4))


def test_empty_table_and_bad_names_are_typed():
    empty = _table().slice(0, 0)
    assert add_derived(empty, DERIVED_COLUMNS).num_rows == 0
    with pytest.raises(InvalidRequestError, match="no derived column"):
        add_derived(empty, ["entropy"])
    with pytest.raises(SchemaError, match="needs the column top_p_probs") as info:
        add_derived(empty.drop_columns(["top_p_probs"]), ["top_p_entropy"])
    assert info.value.column == "top_p_probs"
