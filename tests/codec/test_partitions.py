"""with_partitions: groups encoded elsewhere get the key columns of the partitions they were granted."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trajflight.codec import encode_groups, validate_group, with_partitions
from trajflight.errors import InvalidRequestError
from trajflight.keys import Partition
from trajflight.workload import make_workload


def test_a_batch_gets_its_partition_and_keeps_every_other_column_without_a_copy():
    (g,) = make_workload(1, 4, seed=0, response_median=32)
    batch = g.encode("caller-job", 1)
    key = Partition("job", 7, 123)
    keyed = with_partitions(batch, [key])
    assert validate_group(keyed, expect=key) == key
    assert keyed.schema.names == batch.schema.names
    for name in batch.schema.names:
        if name in ("job_id", "epoch", "group_id"):
            continue
        assert keyed.column(name).buffers()[-1].address == batch.column(name).buffers()[-1].address
    assert keyed.column("sample_id").equals(batch.column("sample_id"))  # the caller's ids stay


def test_missing_key_columns_are_added_in_front_and_a_dictionary_job_id_becomes_a_string():
    (g,) = make_workload(1, 2, seed=1, response_median=16)
    batch = g.encode("job", 1)
    bare = batch.drop_columns(["job_id", "epoch", "group_id"])
    keyed = with_partitions(bare, [Partition("job", 1, 7)])
    assert keyed.schema.names == ["job_id", "epoch", "group_id", *bare.schema.names]
    assert validate_group(keyed, expect=Partition("job", 1, 7)) == Partition("job", 1, 7)
    index = batch.schema.get_field_index("job_id")
    coded = batch.set_column(index, "job_id", batch.column("job_id").dictionary_encode())
    assert with_partitions(coded, [Partition("job", 1, 8)]).schema.field("job_id").type == pa.string()


def test_groups_encoded_together_get_one_partition_each_and_their_sizes_counted_again():
    groups = make_workload(3, 4, seed=2, response_median=32)
    encoded = encode_groups(
        job_id="j", epoch=1, groups=[{**g.columns(), "group_id": i} for i, g in enumerate(groups)]
    )
    keys = [Partition("a-longer-job-id", 2, 40 + i) for i in range(3)]
    keyed = with_partitions(encoded, keys)
    assert keyed.rows == encoded.rows
    for key, group, before in zip(keys, keyed, encoded, strict=True):
        assert validate_group(group, expect=key) == key
        assert group.drop_columns(["job_id", "epoch", "group_id"]).equals(
            before.drop_columns(["job_id", "epoch", "group_id"])
        )
    # Every sample's job id is longer by the same bytes: each group is charged them.
    grown = len("a-longer-job-id") - len("j")
    assert [n - m for n, m in zip(keyed.nbytes, encoded.nbytes, strict=True)] == [grown * 4] * 3
    mixed = with_partitions(encoded, [Partition("a", 1, 1), Partition("b", 2, 2), Partition("a", 1, 3)])
    assert mixed.joined.column("job_id").to_pylist() == ["a"] * 4 + ["b"] * 4 + ["a"] * 4
    assert mixed.joined.column("epoch").to_pylist() == [1] * 4 + [2] * 4 + [1] * 4


def test_a_list_of_batches_gets_one_partition_each_sharing_the_columns_of_one_job_and_length():
    groups = make_workload(3, 4, seed=4, response_median=32)
    batches = [g.encode("caller", 1) for g in groups]
    keys = [Partition("job", 2, 10 + i) for i in range(3)]
    keyed = with_partitions(batches, keys)
    assert [validate_group(b, expect=k) for b, k in zip(keyed, keys, strict=True)] == keys
    assert keyed[0].column("job_id").buffers()[2].address == keyed[1].column("job_id").buffers()[2].address


def test_not_one_partition_per_group_is_refused():
    groups = make_workload(2, 2, seed=3, response_median=16)
    encoded = encode_groups(
        job_id="j", epoch=1, groups=[{**g.columns(), "group_id": i} for i, g in enumerate(groups)]
    )
    with pytest.raises(InvalidRequestError, match="one partition per group"):
        with_partitions(encoded, [Partition("j", 1, 0)])
    with pytest.raises(InvalidRequestError, match="one partition per group"):
        with_partitions(encoded[0], [Partition("j", 1, 0), Partition("j", 1, 1)])
    with pytest.raises(InvalidRequestError, match="one partition per group"):
        with_partitions(list(encoded), [Partition("j", 1, 0)])
