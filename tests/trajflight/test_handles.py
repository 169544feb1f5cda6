"""Batch handles: balanced splits, concatenation, projection, pickling."""

from __future__ import annotations

import pickle

import pytest

from trajflight import BatchHandle, GroupInfo
from trajflight.controller import GroupState, Partition
from trajflight.errors import InvalidRequestError


def _handle(tokens: list[int], columns=("response_ids", "reward")) -> BatchHandle:
    groups = tuple(
        GroupInfo(
            Partition("j", 1, i),
            GroupState.LEASED,
            "s0",
            "grpc://127.0.0.1:1",
            10 + i,
            8,
            1000,
            t,
            0,
            columns,
            None,
        )
        for i, t in enumerate(tokens)
    )
    return BatchHandle("j", 42, groups, None, 99.0)


def test_split_balances_tokens_and_keeps_order_within_shards():
    handle = _handle([900, 100, 500, 400, 300, 200, 100])
    shards = handle.split(3)
    loads = sorted(s.tokens for s in shards)
    assert loads == [800, 800, 900]
    for shard in shards:
        ids = [g.partition.group_id for g in shard.groups]
        assert ids == sorted(ids)
        assert shard.token == 42
    assert sorted(g.partition for s in shards for g in s.groups) == sorted(handle.partitions)


def test_split_into_more_shards_than_groups_leaves_some_empty():
    shards = _handle([5, 5]).split(4)
    assert [len(s.groups) for s in shards].count(0) == 2


def test_concat_rejoins_shards_of_one_lease():
    handle = _handle([1, 2, 3])
    joined = BatchHandle.concat(handle.split(2))
    assert sorted(joined.partitions) == sorted(handle.partitions)
    with pytest.raises(InvalidRequestError, match="shards of one lease"):
        BatchHandle.concat([handle, BatchHandle("j", 43, handle.groups)])
    with pytest.raises(InvalidRequestError, match="at least one"):
        BatchHandle.concat([])


def test_select_projects_and_refuses_missing_columns():
    handle = _handle([1])
    assert handle.select(["reward"]).columns == ("reward",)
    with pytest.raises(InvalidRequestError, match="does not carry columns"):
        handle.select(["advantage"])


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_split_needs_a_positive_int(n):
    with pytest.raises(InvalidRequestError, match="positive number of shards"):
        _handle([1]).split(n)


def test_handles_are_small_and_picklable():
    handle = _handle([10] * 64)
    data = pickle.dumps(handle)
    assert pickle.loads(data) == handle
    assert len(data) < 16_000
