"""Key columns of groups a writer built before the controller named them (pure helpers of the pool)."""

from __future__ import annotations

import pytest

from trajflight._storage import joined_with_keys, with_key
from trajflight.codec import validate_group
from trajflight.errors import InvalidRequestError
from trajflight.keys import Partition
from trajflight.workload import make_workload


def test_joined_groups_carry_each_groups_key_and_validate_group_by_group():
    batches = [g.encode("job", 1) for g in make_workload(3, 4, seed=2, response_median=32)]
    keys = [Partition("job", 1, 40 + i) for i in range(3)]
    joined = joined_with_keys(batches, keys)
    assert joined.num_rows == sum(b.num_rows for b in batches)
    offset = 0
    for key, batch in zip(keys, batches, strict=True):
        part = joined.slice(offset, batch.num_rows)
        assert validate_group(part, expect=key) == key
        assert part.drop_columns(["group_id"]).equals(batch.drop_columns(["group_id"]))
        offset += batch.num_rows
    # Keys of several jobs and epochs are set row by row too.
    mixed = joined_with_keys(batches[:2], [Partition("a", 1, 1), Partition("b", 2, 2)])
    assert mixed.column("job_id").to_pylist() == ["a"] * 4 + ["b"] * 4
    assert mixed.column("epoch").to_pylist() == [1] * 4 + [2] * 4


def test_missing_key_columns_are_added_in_front_and_other_schemas_are_refused():
    batch = make_workload(1, 2, seed=0, response_median=16)[0].encode("job", 1)
    bare = batch.drop_columns(["job_id", "epoch", "group_id"])
    keyed = with_key(bare, Partition("job", 1, 7))
    assert keyed.schema.names == ["job_id", "epoch", "group_id", *bare.schema.names]
    assert validate_group(keyed, expect=Partition("job", 1, 7)) == Partition("job", 1, 7)
    assert joined_with_keys([bare, bare], [Partition("job", 1, 1), Partition("job", 1, 2)]).num_rows == 4
    with pytest.raises(InvalidRequestError, match="share one schema"):
        joined_with_keys([batch, bare], [Partition("job", 1, 1), Partition("job", 1, 2)])
