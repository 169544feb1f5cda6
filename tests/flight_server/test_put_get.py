"""Round trips through one storage server: put, get, projection, duplicates and put validation."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flight_testkit import make_group, serving

from trajflight.errors import AlreadyExistsError, InvalidRequestError, NotFoundError, SchemaError
from trajflight.flight_server import StoreLimits
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 7)


def test_put_then_get_round_trips_bit_exact():
    group = make_group(KEY)
    with serving() as (_, client):
        client.put_groups([(KEY, group)], writer="rollout-0")
        table = client.get([KEY])
    assert table.equals(pa.Table.from_batches([group]))


def test_second_put_to_a_stored_partition_is_refused_and_keeps_the_first():
    first, second = make_group(KEY, seed=1), make_group(KEY, seed=2)
    with serving() as (_, client):
        client.put_groups([(KEY, first)])
        with pytest.raises(AlreadyExistsError, match="never overwrites"):
            client.put_groups([(KEY, second)])
        assert client.get([KEY]).equals(pa.Table.from_batches([first]))
        assert client.stats()["groups"] == 1


def test_projection_streams_only_the_named_columns_in_order():
    group = make_group(KEY)
    with serving() as (_, client):
        client.put_groups([(KEY, group)])
        table = client.get([KEY], columns=["response_logprobs", "response_ids"])
    assert table.column_names == ["response_logprobs", "response_ids"]
    assert table.column("response_ids").combine_chunks().equals(group.column("response_ids"))


def test_projection_of_an_unknown_column_names_it():
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        with pytest.raises(SchemaError, match="no column 'nope'") as info:
            client.get([KEY], columns=["nope"])
    assert info.value.column == "nope"


def test_get_of_many_groups_keeps_ticket_order():
    keys = [Partition("job-a", 0, g) for g in (3, 1, 2)]
    with serving() as (_, client):
        for key in keys:
            client.put_groups([(key, make_group(key))])
        table = client.get(keys, columns=["group_id"])
    assert table.column("group_id").to_pylist() == [3] * 8 + [1] * 8 + [2] * 8


def test_unknown_group_is_not_found():
    with serving() as (_, client), pytest.raises(NotFoundError, match="not stored here"):
        client.get([Partition("job-a", 0, 99)])


def test_reads_are_aligned_for_dlpack_consumers():
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        values = client.get([KEY]).column("response_logprobs").chunk(0).values
    assert values.buffers()[1].address % 4 == 0


def test_rows_of_another_partition_are_refused_with_the_row():
    other = make_group(Partition("job-a", 0, 8))
    with serving() as (_, client):
        with pytest.raises(SchemaError, match="group_id") as info:
            client.put_groups([(KEY, other)])
        assert info.value.column == "group_id"
        assert client.stats()["groups"] == 0


def test_a_group_missing_a_required_column_is_refused():
    group = make_group(KEY).drop_columns(["reward"])
    with serving() as (_, client), pytest.raises(SchemaError, match="'reward' is missing"):
        client.put_groups([(KEY, group)])


def test_a_user_column_keeps_one_type_per_job():
    a, b = Partition("job-a", 0, 1), Partition("job-a", 0, 2)
    with serving() as (_, client):
        client.put_groups([(a, make_group(a).append_column("score", pa.array([1.0] * 8, pa.float64())))])
        with pytest.raises(SchemaError, match="one type per column"):
            client.put_groups([(b, make_group(b).append_column("score", pa.array([1] * 8, pa.int64())))])


def test_a_put_many_whose_user_column_changes_type_is_refused_whole_naming_its_first_group():
    """The stream's schema is checked against the job once for the whole put_many, as each group's was."""
    stored, keys = Partition("job-a", 0, 1), [Partition("job-a", 0, g) for g in (2, 3)]

    def scored(key: Partition, type_: pa.DataType) -> pa.RecordBatch:
        return make_group(key).append_column("score", pa.array([1] * 8, type_))

    with serving() as (_, client):
        client.put_groups([(stored, scored(stored, pa.float64()))])
        with pytest.raises(SchemaError, match=r"group 2\).*one type per column") as info:
            client.put_groups([(k, scored(k, pa.int64())) for k in keys])
        assert info.value.column == "score"
        stats = client.stats()
        assert (stats["groups"], stats["pending_puts"], stats["reserved_bytes"]) == (1, 0, 0)
        client.put_groups([(k, scored(k, pa.float64())) for k in keys])  # nothing kept the keys
        assert client.stats()["groups"] == 3


def test_write_size_limit_splits_a_group_into_batches_of_one_put():
    group = make_group(KEY, k=32, response_len=512)
    with serving() as (_, client_unused):
        from trajflight.flight_server import StorageClient

        with StorageClient(client_unused.location, write_size_limit_bytes=group.nbytes // 3) as client:
            client.put_groups([(KEY, group)])
            table = client.get([KEY])
    assert table.num_rows == 32
    assert table.combine_chunks().equals(pa.Table.from_batches([group]).combine_chunks())


def test_a_group_over_max_group_bytes_is_refused_as_invalid():
    group = make_group(KEY, k=16, response_len=512)
    with serving(StoreLimits(max_group_bytes=group.nbytes // 2)) as (_, client):
        with pytest.raises(InvalidRequestError, match="max_group_bytes"):
            client.put_groups([(KEY, group)])
        assert client.stats()["reserved_bytes"] == 0


def test_an_empty_stream_publishes_nothing():
    with serving() as (_, client):
        with pytest.raises(InvalidRequestError, match="no samples"):
            client.put_groups([(KEY, make_group(KEY).slice(0, 0))])
        assert client.stats()["groups"] == 0


def test_in_an_arena_each_part_is_one_ipc_stream_in_a_segment_served_without_copies():
    """What the removed ``place=`` hook guarded, through the one placement left (issue 15): with an arena,
    a Flight put and a column append are each copied once into a segment of their own, as one IPC
    stream, served from there with no copy, and capacity counts the segments."""
    from trajflight.flight_server import LeaseToken, ShmArena

    group = make_group(KEY)
    with serving(arena=ShmArena()) as (server, client):
        client.put_groups([(KEY, group)])
        client.append_columns(KEY, pa.table({"ref": pa.array([1.0] * 8, pa.float32())}), LeaseToken(1))
        stored = server.store.get(KEY)
        assert len(stored.segments) == 2
        assert stored.part_bytes == tuple(s.capacity for s in stored.segments)
        first = stored.segments[0].buffer()
        assert pa.ipc.open_stream(first).read_all().equals(pa.Table.from_batches([group]))
        values = stored.table.column("response_ids").chunk(0).values.buffers()[1]
        assert first.address <= values.address < first.address + first.size
        assert client.get([KEY]).drop_columns(["ref"]).equals(pa.Table.from_batches([group]))
        assert client.stats()["bytes"] == sum(s.capacity for s in stored.segments)


def test_concurrent_puts_of_one_partition_store_exactly_one():
    from concurrent.futures import ThreadPoolExecutor

    groups = [make_group(KEY, seed=s, k=64, response_len=512) for s in range(4)]
    with serving() as (_, client):

        def put(group: pa.RecordBatch) -> str:
            try:
                client.put_groups([(KEY, group)])
            except AlreadyExistsError:
                return "refused"
            return "stored"

        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(put, groups))
        assert sorted(outcomes) == ["refused"] * 3 + ["stored"]
        stored = client.get([KEY])
        assert any(stored.equals(pa.Table.from_batches([g])) for g in groups)
        assert client.stats()["pending_puts"] == 0
