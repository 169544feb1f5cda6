"""A put_many's per-group publication figures (response tokens, oldest policy version), computed for all
groups at once, equal those computed group by group, whatever the groups hold."""

from __future__ import annotations

import pyarrow as pa
import pytest

import trajflight._client as client_module
from trajflight._client import _figures, _policy_version, _tokens_of
from trajflight.codec import encode_group
from trajflight.workload import make_workload


def _one_by_one(batches: list[pa.RecordBatch], default: int) -> tuple[list[int], list[int]]:
    return [_tokens_of(b) for b in batches], [_policy_version(b, default) for b in batches]


def _group(group_id: int, lengths: list[int], versions: list[int]) -> pa.RecordBatch:
    return encode_group(
        job_id="j",
        epoch=1,
        group_id=group_id,
        prompt_ids=[1, 2, 3],
        response_ids=[list(range(n)) for n in lengths],
        response_logprobs=[[-0.5] * n for n in lengths],
        reward=[1.0] * len(lengths),
        policy_version=versions,
    )


def _set(batch: pa.RecordBatch, name: str, column: pa.Array) -> pa.RecordBatch:
    index = batch.schema.get_field_index(name)
    return batch.set_column(index, pa.field(name, column.type), column)


def test_the_standard_workload_s_figures_equal_the_group_by_group_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches = [g.encode("j", 1, policy_version=g.group_id % 5) for g in make_workload(16, 4, seed=3)]
    expected = _one_by_one(batches, 7)

    def not_here(*_: object) -> int:
        raise AssertionError("the standard workload's figures are computed for all groups at once")

    monkeypatch.setattr(client_module, "_tokens_of", not_here)
    monkeypatch.setattr(client_module, "_policy_version", not_here)
    assert _figures(batches, 7) == expected


@pytest.mark.parametrize(
    "case",
    [
        "varied",
        "no policy column",
        "no response column",
        "a null response row",
        "a null policy version",
        "an empty group",
        "other schemas",
        "one group",
    ],
)
def test_every_kind_of_group_gets_the_group_by_group_figures(case: str) -> None:
    batches = [_group(0, [3, 0, 5], [4, 2, 9]), _group(1, [1], [6]), _group(2, [2, 7], [3, 3])]
    if case == "no policy column":
        batches = [b.drop_columns(["policy_version"]) for b in batches]
    elif case == "no response column":
        batches = [b.drop_columns(["response_ids", "response_logprobs", "loss_mask"]) for b in batches]
    elif case == "a null response row":
        column = batches[1].column("response_ids")
        batches[1] = _set(batches[1], "response_ids", pa.array([None], column.type))
    elif case == "a null policy version":
        batches[2] = _set(batches[2], "policy_version", pa.array([None, 5], pa.int64()))
    elif case == "an empty group":
        batches[1] = batches[1].slice(0, 0)
    elif case == "other schemas":
        batches[0] = batches[0].drop_columns(["policy_version"])
        batches[2] = _set(batches[2], "policy_version", pa.array([3, 3], pa.int32()))
    elif case == "one group":
        batches = batches[:1]
    assert _figures(batches, 11) == _one_by_one(batches, 11)
