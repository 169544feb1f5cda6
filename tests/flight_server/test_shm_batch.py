"""Same-host puts of a joined batch: one segment, one reservation, one publish (docs/wire-format.md).

The compact ``shm_reserve`` / ``shm_publish`` form of a batch admits and publishes exactly what the
``groups`` form does, under the same checks and errors; the ``groups`` form keeps working for old clients.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from flight_testkit import make_group

from trajflight.auth import Keyring
from trajflight.errors import (
    AlreadyExistsError,
    CapacityExceededError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    SchemaError,
    StaleFenceError,
)
from trajflight.flight_server import (
    GroupRead,
    LeaseToken,
    ShmArena,
    StorageClient,
    StorageServer,
    StoreLimits,
)
from trajflight.flight_server._segments import stream_size
from trajflight.flight_server._wire import (
    PutDescriptor,
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
    encode,
)
from trajflight.flight_server.shm._segment import size_class, write_segment
from trajflight.keys import Partition

SECRET = "k1:0123456789abcdef0123456789abcdef"
KEYS = [Partition("job-a", 1, g) for g in (7, 3, 11)]


@contextlib.contextmanager
def serving(
    limits: StoreLimits | None = None, **kwargs: Any
) -> Iterator[tuple[StorageServer, StorageClient]]:
    """A server with an arena and a client whose actions go over the same-host channel, as in production."""
    credential = kwargs.pop("credential", None)
    with (
        StorageServer(limits=limits, arena=ShmArena(), **kwargs) as server,
        StorageClient(server.location, timeout=20, credential=credential) as client,
    ):
        client.use_local_channel(client.health()["shm_socket"])
        yield server, client


def joined(keys: list[Partition], k: int = 8) -> pa.RecordBatch:
    return pa.concat_batches([make_group(key, k, seed=i) for i, key in enumerate(keys)])


def rows_of(keys: list[Partition], batch: pa.RecordBatch) -> list[tuple[Partition, pa.RecordBatch]]:
    """The groups of a joined batch of ``keys`` (8 rows each), as slices of it."""
    return [(key, batch.slice(8 * i, 8)) for i, key in enumerate(keys)]


def reserve(client: StorageClient, keys: list[Partition], batch: pa.RecordBatch, **kw: Any) -> dict[str, Any]:
    rows = tuple(batch.num_rows // len(keys) for _ in keys)
    request = ShmBatchReserveRequest(
        keys[0].job_id, keys[0].epoch, tuple(k.group_id for k in keys), rows, _size(batch), **kw
    )
    reply: dict[str, Any] = client._action("shm_reserve", encode(request), None)
    return reply


def _size(batch: pa.RecordBatch) -> int:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return int(sink.tell())


def publish(client: StorageClient, reservation: str, size: int) -> dict[str, Any]:
    reply: dict[str, Any] = client._action(
        "shm_publish", encode(ShmBatchPublishRequest(reservation, size)), None
    )
    return reply


def nothing_held(client: StorageClient) -> bool:
    stats = client.stats()
    return (stats["groups"], stats["pending_puts"], stats["reserved_bytes"], stats["pending_shm_puts"]) == (
        0,
        0,
        0,
        0,
    )


def test_a_batch_is_reserved_as_one_segment_and_one_reservation_and_read_back_bit_exact():
    batch = joined(KEYS)
    with serving() as (_, client):
        reply = reserve(client, KEYS, batch, writer="rollout-1")
        assert set(reply) == {"batch"}
        assert set(reply["batch"]) == {"reservation", "path", "capacity"}
        stats = client.stats()
        assert (stats["pending_puts"], stats["pending_shm_puts"]) == (3, 3)
        assert stats["reserved_bytes"] == reply["batch"]["capacity"]  # the shares add up to the segment
        size = write_segment(reply["batch"]["path"], reply["batch"]["capacity"], batch.schema, [batch])
        assert publish(client, reply["batch"]["reservation"], size) == {
            "published": 3,
            "bytes": reply["batch"]["capacity"],
        }
        assert client.stats()["pending_shm_puts"] == 0
        whole = pa.Table.from_batches([batch])
        assert client.shm_get(KEYS).equals(whole)
        # Each group on its own, over Flight too: its rows of the shared stream, nothing else.
        for i, key in enumerate(KEYS):
            assert client.get([key]).equals(whole.slice(8 * i, 8))
            assert client.shm_get([key]).equals(whole.slice(8 * i, 8))
        assert [(g.key, g.num_rows) for g in client.list_groups()] == [(k, 8) for k in sorted(KEYS)]
        with pytest.raises(NotFoundError, match="already published"):
            publish(client, reply["batch"]["reservation"], size)
        assert client.stats()["shm"]["live_segments"] == 1
        # The segment goes back with the last of its groups.
        client.delete([GroupRead(k, LeaseToken(1)) for k in KEYS[:2]])
        assert client.stats()["shm"]["live_segments"] == 1
        client.delete([GroupRead(KEYS[2], LeaseToken(1))])
        assert client.stats()["shm"]["live_segments"] == 0
        assert nothing_held(client)


def test_a_flight_put_many_is_placed_in_one_segment_that_goes_back_with_its_last_group():
    """Groups put over Flight in one stream are copied once into one segment (not a segment each), as a
    same-host batch is: each group reads back its own rows bit-exact, over Flight and mapped, capacity
    counts the segment once (the groups' shares add up to it), and it goes back with the last group."""
    groups = [(key, make_group(key, 8, seed=i)) for i, key in enumerate(KEYS)]
    with serving() as (_, client):
        client.put_groups(groups, writer="rollout-1")
        stats = client.stats()
        assert (stats["groups"], stats["shm"]["live_segments"]) == (3, 1)
        schema = groups[0][1].schema
        assert stats["bytes"] == size_class(stream_size(schema, [b for _, b in groups]))
        for key, batch in groups:
            assert client.get([key]).equals(pa.Table.from_batches([batch]))
            assert client.shm_get([key]).equals(pa.Table.from_batches([batch]))
        assert client.get(KEYS).equals(pa.Table.from_batches([b for _, b in groups]))
        client.delete([GroupRead(k, LeaseToken(1)) for k in KEYS[:2]])
        assert client.stats()["shm"]["live_segments"] == 1
        assert client.get([KEYS[2]]).equals(pa.Table.from_batches([groups[2][1]]))
        client.delete([GroupRead(KEYS[2], LeaseToken(1))])
        assert client.stats()["shm"]["live_segments"] == 0
        assert nothing_held(client)


def test_the_client_puts_a_joined_batch_in_the_compact_form():
    batch = joined(KEYS)
    with serving() as (_, client):
        sent: list[tuple[str, dict[str, Any]]] = []
        action = client._action

        def spy(name: str, body: bytes, timeout: float | None) -> dict[str, Any]:
            sent.append((name, json.loads(body)))
            return action(name, body, timeout)

        client._action = spy  # type: ignore[method-assign]
        client.shm_put_groups(rows_of(KEYS, batch), joined=batch, writer="w")
        assert [name for name, _ in sent] == ["shm_reserve", "shm_publish"]
        assert sent[0][1]["batch"]["group_ids"] == [7, 3, 11]
        assert "groups" not in sent[0][1]
        assert set(sent[1][1]["batch"]) == {"reservation", "size"}
        assert client.shm_get(KEYS).equals(pa.Table.from_batches([batch]))
        # Groups of several epochs cannot travel compactly: the client names them one by one.
        other = [Partition("job-a", 2, 1), Partition("job-a", 3, 1)]
        sent.clear()
        client.shm_put_groups(rows_of(other, joined(other)), joined=joined(other), writer="w")
        assert "groups" in sent[0][1]
        assert client.shm_get(other).num_rows == 16


def test_an_old_client_s_batch_reservation_of_one_segment_per_group_entry_still_works():
    """Regression guard: the ``groups`` form with ``batch_bytes`` (one reservation per group, each naming
    the shared segment) is what clients before the compact form send; it must keep its meaning."""
    batch = joined(KEYS)
    size = _size(batch)
    with serving() as (_, client):
        puts = tuple(PutDescriptor(k, "old", None, 8) for k in KEYS)
        segments = client._action("shm_reserve", encode(ShmReserveRequest(puts, "old", None, size)), None)[
            "segments"
        ]
        assert len(segments) == 3
        assert len({(s["path"], s["capacity"]) for s in segments}) == 1
        assert len({s["reservation"] for s in segments}) == 3
        assert client.stats()["pending_shm_puts"] == 3
        written = write_segment(segments[0]["path"], segments[0]["capacity"], batch.schema, [batch])
        # Every group of the shared segment must be in the call, as before.
        partial = ShmPublishRequest(((segments[0]["reservation"], written),))
        with pytest.raises(InvalidRequestError, match="publish every group of a batch together"):
            client._action("shm_publish", encode(partial), None)
        client._action("shm_abort", encode(ShmAbortRequest(tuple(s["reservation"] for s in segments))), None)
        assert nothing_held(client)
        segments = client._action("shm_reserve", encode(ShmReserveRequest(puts, "old", None, size)), None)[
            "segments"
        ]
        written = write_segment(segments[0]["path"], segments[0]["capacity"], batch.schema, [batch])
        items = ShmPublishRequest(tuple((s["reservation"], written) for s in segments))
        assert client._action("shm_publish", encode(items), None)["published"] == 3
        assert client.shm_get(KEYS).equals(pa.Table.from_batches([batch]))
        assert client.get([KEYS[1]]).equals(pa.Table.from_batches([batch]).slice(8, 8))


def test_a_refused_batch_reservation_names_its_group_and_keeps_nothing():
    batch = joined(KEYS)
    with serving(StoreLimits(capacity_groups=4)) as (_, client):
        client.shm_put_groups([(KEYS[1], make_group(KEYS[1]))])
        with pytest.raises(AlreadyExistsError) as exists:
            reserve(client, KEYS, batch)
        assert exists.value.fields["group_id"] == 3
        client.delete([GroupRead(KEYS[1], LeaseToken(1))])
        assert nothing_held(client)
        five = [Partition("job-a", 1, g) for g in range(20, 25)]  # not group 3: a deleted key stays refused
        with pytest.raises(CapacityExceededError, match="4 of 4 groups"):
            reserve(client, five, joined(five))
        assert nothing_held(client)
        client.fence("job-a", 2)
        with pytest.raises(StaleFenceError):
            reserve(client, KEYS, batch)
        assert nothing_held(client)
    # One byte short of the segment: the last group's share is the one that does not fit.
    with serving(StoreLimits(capacity_bytes=size_class(_size(batch)) - 1)) as (_, client):
        with pytest.raises(CapacityExceededError, match="group 11") as full:
            reserve(client, KEYS, batch)
        assert full.value.fields["retry_after"] > 0
        assert nothing_held(client)


def test_a_refused_batch_publish_gives_everything_back():
    batch = joined(KEYS)
    with serving() as (_, client):
        # Rows that carry another group's key than the one announced for them.
        reply = reserve(client, [KEYS[1], KEYS[0], KEYS[2]], batch)["batch"]
        size = write_segment(reply["path"], reply["capacity"], batch.schema, [batch])
        with pytest.raises(SchemaError, match="group_id"):
            publish(client, reply["reservation"], size)
        assert nothing_held(client)
        with pytest.raises(NotFoundError):  # a refused reservation is gone
            publish(client, reply["reservation"], size)
        # Fewer rows written than announced, a size outside the segment, bytes that are no stream.
        reply = reserve(client, KEYS, batch)["batch"]
        short = batch.slice(0, 16)
        size = write_segment(reply["path"], reply["capacity"], short.schema, [short])
        with pytest.raises(InvalidRequestError, match="announced"):
            publish(client, reply["reservation"], size)
        reply = reserve(client, KEYS, batch)["batch"]
        with pytest.raises(InvalidRequestError, match="outside the segment"):
            publish(client, reply["reservation"], reply["capacity"] + 1)
        reply = reserve(client, KEYS, batch)["batch"]
        with pytest.raises(SchemaError, match="Arrow IPC stream"):
            publish(client, reply["reservation"], 64)
        assert nothing_held(client)
        with pytest.raises(NotFoundError):
            publish(client, "no-such-reservation", 64)


def test_a_batch_reservation_is_aborted_or_swept_whole():
    batch = joined(KEYS)
    with serving() as (server, client):
        reply = reserve(client, KEYS, batch)["batch"]
        aborted = client._action("shm_abort", encode(ShmAbortRequest((reply["reservation"],))), None)
        assert aborted == {"aborted": 3}
        assert nothing_held(client)
        reply = reserve(client, KEYS, batch, ttl=1.0)["batch"]
        assert server.store.shm.sweep(now=server.store._clock() + 2.0) == 3  # its writer died
        assert nothing_held(client)
        with pytest.raises(NotFoundError):
            publish(client, reply["reservation"], 64)
        # The keys are free again.
        reply = reserve(client, KEYS, batch)["batch"]
        size = write_segment(reply["path"], reply["capacity"], batch.schema, [batch])
        assert publish(client, reply["reservation"], size)["published"] == 3


def test_an_authenticated_server_checks_the_batch_s_job_against_the_writer_s_token():
    ring = Keyring.from_secret(SECRET)
    batch = joined(KEYS)
    with serving(keyring=ring, credential=ring.mint("w", "writer", ["job-b"])) as (_, client):
        with pytest.raises(PermissionDeniedError, match="outside the credential's jobs"):
            reserve(client, KEYS, batch)
        assert nothing_held(client)
    with serving(keyring=ring, credential=ring.mint("w", "writer", ["job-a"])) as (_, client):
        client.shm_put_groups(rows_of(KEYS, batch), joined=batch)
        with pytest.raises(PermissionDeniedError, match="needs role trainer or reader"):
            client.shm_get(KEYS)


def test_columns_appended_to_a_member_of_a_batch_join_its_rows_only():
    batch = joined(KEYS)
    with serving() as (_, client):
        client.shm_put_groups(rows_of(KEYS, batch), joined=batch)
        extra = pa.table({"ref_logprob": pa.array([float(i) for i in range(8)], pa.float32())})
        client.append_columns(KEYS[1], extra, LeaseToken(1))
        whole = pa.Table.from_batches([batch])
        for read in (client.get, client.shm_get):
            middle = read([GroupRead(KEYS[1], LeaseToken(1))])
            assert middle.column_names[-1] == "ref_logprob"
            assert middle.drop_columns(["ref_logprob"]).equals(whole.slice(8, 8))
            assert middle.column("ref_logprob").to_pylist() == [float(i) for i in range(8)]
            assert read([KEYS[2]]).equals(whole.slice(16, 8))


def test_giving_up_one_group_of_a_shared_segment_gives_up_the_segment_whole():
    """Issue 15 made every same-host reservation one segment: a reservation id of one group of the
    ``groups`` form names the whole segment, so aborting it gives every group of it up (the result counts
    them) and leaves nothing held, nor a key taken."""
    batch = joined(KEYS)
    with serving() as (_, client):
        puts = tuple(PutDescriptor(k, "w", None, 8) for k in KEYS)
        reserve = ShmReserveRequest(puts, "w", None, _size(batch))
        segments = client._action("shm_reserve", encode(reserve), None)["segments"]
        aborted = client._action("shm_abort", encode(ShmAbortRequest((segments[1]["reservation"],))), None)
        assert aborted == {"aborted": 3}
        assert nothing_held(client)
        with pytest.raises(NotFoundError):  # its other groups went with it
            client._action(
                "shm_publish", encode(ShmPublishRequest(((segments[0]["reservation"], 64),))), None
            )
        client.shm_put_groups(rows_of(KEYS, batch), joined=batch)  # the keys are free
        assert client.shm_get(KEYS).num_rows == 24


def test_a_publish_naming_a_shared_segment_in_part_changes_nothing():
    """A publish that names some groups of a shared segment (or one twice) is refused before anything is
    taken: the reservation stays whole, and a publish naming every group then goes through."""
    batch = joined(KEYS)
    with serving() as (_, client):
        puts = tuple(PutDescriptor(k, "w", None, 8) for k in KEYS)
        reserve = ShmReserveRequest(puts, "w", None, _size(batch))
        segments = client._action("shm_reserve", encode(reserve), None)["segments"]
        written = write_segment(segments[0]["path"], segments[0]["capacity"], batch.schema, [batch])
        ids = [s["reservation"] for s in segments]
        for named in (ids[:2], [ids[0], ids[0], ids[1], ids[2]]):
            with pytest.raises(InvalidRequestError, match="publish every group of a batch together"):
                client._action(
                    "shm_publish", encode(ShmPublishRequest(tuple((i, written) for i in named))), None
                )
            assert client.stats()["pending_shm_puts"] == 3
        every = ShmPublishRequest(tuple((i, written) for i in ids))
        assert client._action("shm_publish", encode(every), None)["published"] == 3
        assert client.shm_get(KEYS).equals(pa.Table.from_batches([batch]))


def test_a_flight_read_of_a_batch_in_its_order_streams_one_record_batch_per_run():
    """A trainer on another node reads a same-host batch over Flight: groups named in their stored order
    come back as one slice of the stored batch (one record batch, so its decode joins nothing); any other
    order, a gap, a projection or an appended member still reads bit-exact."""
    batch = joined(KEYS)
    whole = pa.Table.from_batches([batch])
    with serving() as (_, client):
        client.shm_put_groups(rows_of(KEYS, batch), joined=batch)
        in_order = client.get(KEYS)
        assert in_order.equals(whole)
        assert {c.num_chunks for c in in_order.columns} == {1}
        projected = client.get(KEYS[1:], columns=["response_ids", "group_id"])
        assert projected.equals(whole.slice(8, 16).select(["response_ids", "group_id"]))
        assert {c.num_chunks for c in projected.columns} == {1}
        shuffled = client.get([KEYS[2], KEYS[0], KEYS[1]])
        assert shuffled.equals(pa.concat_tables([whole.slice(16, 8), whole.slice(0, 8), whole.slice(8, 8)]))
        gap = client.get([KEYS[0], KEYS[2]])
        assert gap.equals(pa.concat_tables([whole.slice(0, 8), whole.slice(16, 8)]))
        assert {c.num_chunks for c in gap.columns} == {2}
        extra = pa.table({"ref_logprob": pa.array([float(i) for i in range(8)], pa.float32())})
        client.append_columns(KEYS[1], extra, LeaseToken(1))
        mixed = client.get(KEYS)  # the appended member reads alone, its neighbours as they are
        assert mixed.drop_columns(["ref_logprob"]).equals(whole)
        assert mixed.column("ref_logprob").to_pylist()[8:16] == [float(i) for i in range(8)]
