"""A put of a key the server has deleted is refused: no orphan group after the controller gave it up.

Regression tests for issue 14, item 8: ``allocate()``, wait past ``grant_ttl``, then put: the controller
had dropped the grant and sent its delete (which found nothing), the server then accepted the put and
kept the group forever (``publish`` said NotFound, the controller counted usage ``(0, 0)``). Every key a
delete names is now tombstoned (compactly, per job and epoch), and a later or in-flight put of it is
refused with LeaseExpiredError naming the partition.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, serving
from hypothesis import given
from hypothesis import strategies as st
from shm_testkit import shm_serving

import trajflight
from trajflight.errors import LeaseExpiredError, StaleFenceError
from trajflight.flight_server import GroupRead, LeaseToken, PutDescriptor, StorageClient
from trajflight.flight_server._tombstones import Tombstones, _Ranges
from trajflight.flight_server._wire import encode
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 1)


def _nothing_held(client: StorageClient) -> bool:
    stats = client.stats()
    return (stats["groups"], stats["bytes"], stats["reserved_bytes"], stats["pending_puts"]) == (0, 0, 0, 0)


OTHER = Partition("job-a", 0, 2)


def _inline(client: StorageClient) -> None:
    client.use_local_channel(client.health()["shm_socket"])
    client.shm_put_groups([(KEY, make_group(KEY))])


PUTS = {
    "flight": lambda c: c.put_groups([(KEY, make_group(KEY))]),
    "put_groups": lambda c: c.put_groups([(OTHER, make_group(OTHER)), (KEY, make_group(KEY))]),
    "shm": lambda c: c.shm_put_groups([(KEY, make_group(KEY))]),
    "shm-batch": lambda c: c.shm_put_groups([(OTHER, make_group(OTHER)), (KEY, make_group(KEY))]),
    "shm-inline": _inline,
}


@pytest.mark.parametrize("put", sorted(PUTS))
def test_a_put_after_the_delete_of_a_key_never_stored_is_refused(put):
    """Regression: the GC's delete of an expired grant found nothing, and the put that came after it
    was kept forever (an orphan the controller no longer counted)."""
    with shm_serving() as (_, client):
        result = client.delete([GroupRead(KEY, LeaseToken(0))])  # what the controller's GC sends
        assert result["missing"] == [{"job_id": "job-a", "epoch": 0, "group_id": 1}]
        with pytest.raises(LeaseExpiredError, match=r"\('job-a', epoch 0, group 1\).*deleted") as info:
            PUTS[put](client)
        assert info.value.fields == {"job_id": "job-a", "epoch": 0, "group_id": 1}
        assert _nothing_held(client)
        assert client.stats()["tombstones"] == {"epochs": 1, "ranges": 1}


def test_a_put_in_flight_when_its_key_is_deleted_is_refused_at_publish():
    group = make_group(KEY)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        descriptor = flight.FlightDescriptor.for_command(encode(PutDescriptor(KEY, num_rows=8)))
        writer, _ = raw.do_put(descriptor, group.schema)
        writer.write_batch(group.slice(0, 4))
        deadline = time.monotonic() + 20
        while client.stats()["pending_puts"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        client.delete([GroupRead(KEY, LeaseToken(0))])  # the grant expired while the stream arrived
        writer.write_batch(group.slice(4, 4))
        with pytest.raises(flight.FlightUnauthorizedError, match=r"lease_expired.*deleted"):
            writer.close()
        raw.close()
        assert _nothing_held(client)


def test_a_same_host_reservation_whose_key_is_deleted_is_refused_at_publish():
    with shm_serving() as (server, client):
        sink = pa.BufferOutputStream()
        group = make_group(KEY)
        with pa.ipc.new_stream(sink, group.schema) as stream:
            stream.write_batch(group)
        data = sink.getvalue()
        store = server.store
        put = store.shm.reserve([KEY], [8], data.size)
        put.segment.mm[: data.size] = data.to_pybytes()  # the writer wrote its group
        client.delete([GroupRead(KEY, LeaseToken(0))])  # ... and its grant expired before the publish
        with pytest.raises(LeaseExpiredError):
            store.shm.publish([(put.id, data.size)])
        assert _nothing_held(client)


def test_a_deleted_group_cannot_be_put_again():
    """A writer retrying a put whose ack it lost, after the GC deleted it: refused, not an orphan."""
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        assert client.delete([GroupRead(KEY, LeaseToken(0))])["deleted"] == 1
        with pytest.raises(LeaseExpiredError):
            client.put_groups([(KEY, make_group(KEY))])
        other = Partition("job-a", 0, 2)
        client.put_groups([(other, make_group(other))])  # other partitions are untouched
        assert client.get([other]).num_rows == 8


def test_a_refused_delete_leaves_no_tombstone():
    with serving() as (_, client):
        client.advance_generation([GroupRead(KEY, LeaseToken(5))])
        with pytest.raises(StaleFenceError):
            client.delete([GroupRead(KEY, LeaseToken(4))])
        client.put_groups([(KEY, make_group(KEY))])
        assert client.get([KEY]).num_rows == 8


def test_tombstones_stay_compact_and_go_with_the_fence():
    with serving() as (_, client):
        for start in range(0, 10_000, 1000):  # the GC deletes in order: one range
            client.delete(
                [GroupRead(Partition("job-a", 0, g), LeaseToken(0)) for g in range(start, start + 1000)]
            )
        assert client.stats()["tombstones"] == {"epochs": 1, "ranges": 1}
        client.delete([GroupRead(Partition("job-a", 1, g), LeaseToken(0)) for g in (1, 3, 5)])
        assert client.stats()["tombstones"] == {"epochs": 2, "ranges": 4}
        client.fence("job-a", 1)  # epoch 0's puts are refused by the fence now: its tombstones go
        assert client.stats()["tombstones"] == {"epochs": 1, "ranges": 3}
        with pytest.raises(StaleFenceError):
            client.put_groups([(KEY, make_group(KEY))])


@given(st.lists(st.integers(0, 60), max_size=80), st.lists(st.integers(0, 70), max_size=30))
def test_ranges_hold_exactly_the_ids_added(added, probes):
    ranges, model = _Ranges(), set()
    for g in added:
        ranges.add(g)
        model.add(g)
        assert all(a < b for a, b in zip(ranges.ends, ranges.starts[1:], strict=False))  # disjoint, apart
    assert all((g in ranges) == (g in model) for g in [*added, *probes])
    tombstones = Tombstones()
    for g in added:
        tombstones.add(Partition("j", 3, g))
    assert tombstones.stats()["ranges"] == len(ranges.starts)


def test_a_put_after_its_grant_expired_is_refused_end_to_end():
    """The issue's scenario on a real cluster: allocate, let the grant expire and its delete run, put."""
    job = "orphan-job"
    with trajflight.LocalCluster(servers=1, capacity="64MiB", timeout=20.0) as cluster:
        client = cluster.client(transport="flight")
        client.open_job(job, 1, {"grant_ttl": "200ms"})
        writer = client.writer(job, 1)
        grant = client.controller.allocate(job, 1, writer.writer_id, nbytes=1 << 16, timeout=10)
        assert cluster.wait_idle(job, timeout=20) == (0, 0)  # expired, dropped, its delete confirmed
        key = Partition(*grant.partition)
        with StorageClient(grant.location, timeout=20) as storage:
            with pytest.raises(LeaseExpiredError):
                storage.put_groups([(key, pa.Table.from_batches([make_group(key)]))])
            assert storage.stats()["groups"] == 0
        assert cluster.wait_idle(job) == (0, 0)
