"""Atomic publish and bounded capacity: nothing half-written is ever visible or kept."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, serving, slow_writer

from trajflight.errors import AlreadyExistsError, CapacityExceededError, NotFoundError, SchemaError
from trajflight.flight_server import GroupRead, LeaseToken, PutDescriptor, StoreLimits
from trajflight.flight_server._wire import PutManyDescriptor, encode
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 1)


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def test_a_writer_killed_mid_stream_leaves_nothing_and_frees_its_reservation():
    """A put whose client dies (SIGKILL, a real process) is never published and gives its bytes back."""
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe; the child makes its own client
    with serving() as (server, client):
        ready = ctx.Event()
        child = ctx.Process(target=slow_writer, args=(server.location, KEY, 4, ready), daemon=True)
        child.start()
        try:
            assert ready.wait(60), "the writer never started its put"
            _wait_for(lambda: client.stats()["reserved_bytes"] > 0)
            assert client.stats()["pending_puts"] == 1
            with pytest.raises(NotFoundError):
                client.get([KEY])  # in flight: not visible
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        _wait_for(lambda: client.stats()["pending_puts"] == 0)
        stats = client.stats()
        assert (stats["groups"], stats["bytes"], stats["reserved_bytes"]) == (0, 0, 0)
        with pytest.raises(NotFoundError):
            client.get([KEY])
        client.put_groups([(KEY, make_group(KEY))])  # the partition is free again
        assert client.get([KEY]).num_rows == 8


def test_a_stream_cut_short_of_its_announced_rows_is_refused():
    group = make_group(KEY, k=8)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        descriptor = flight.FlightDescriptor.for_command(encode(PutDescriptor(KEY, num_rows=8)))
        writer, _ = raw.do_put(descriptor, group.schema)
        writer.write_batch(group.slice(0, 5))
        with pytest.raises(flight.FlightServerError, match="5 rows arrived, 8 announced"):
            writer.close()
        raw.close()
        assert client.stats()["groups"] == 0


def test_capacity_refusal_carries_a_retry_hint_and_recovers_after_delete():
    groups = {g: make_group(Partition("job-a", 0, g), response_len=256, fixed=True) for g in range(3)}
    limit = int(groups[0].nbytes * 2.5)
    with serving(StoreLimits(capacity_bytes=limit, retry_after=0.25)) as (_, client):
        client.put_groups([(Partition("job-a", 0, 0), groups[0])])
        client.put_groups([(Partition("job-a", 0, 1), groups[1])])
        with pytest.raises(CapacityExceededError, match="server full") as info:
            client.put_groups([(Partition("job-a", 0, 2), groups[2])])
        assert info.value.retry_after == 0.25
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"]) == (2, 0)
        freed = client.delete([GroupRead(Partition("job-a", 0, 0), LeaseToken(1))])
        assert freed["bytes_freed"] > 0
        client.put_groups([(Partition("job-a", 0, 2), groups[2])])
        assert client.stats()["groups"] == 2


def test_capacity_is_checked_as_an_unannounced_stream_arrives():
    """A writer that announces no size is stopped at the first batch that does not fit."""
    group = make_group(KEY, k=64, response_len=1024)
    with serving(StoreLimits(capacity_bytes=group.nbytes // 4)) as (server, client):
        raw = flight.FlightClient(server.location)
        descriptor = flight.FlightDescriptor.for_command(encode(PutDescriptor(KEY, num_rows=64)))
        writer, _ = raw.do_put(descriptor, group.schema)
        with pytest.raises(flight.FlightUnavailableError, match="trajflight:capacity"):  # noqa: PT012
            # the refusal surfaces at whichever write or close meets the server's status
            for batch in pa.Table.from_batches([group]).to_batches(max_chunksize=4):
                writer.write_batch(batch)
            writer.close()
        raw.close()
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["pending_puts"]) == (0, 0, 0)


def test_group_count_is_bounded_too():
    with serving(StoreLimits(capacity_groups=1)) as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        other = Partition("job-a", 0, 2)
        with pytest.raises(CapacityExceededError, match="1 of 1 groups"):
            client.put_groups([(other, make_group(other))])


def test_put_groups_publishes_many_groups_in_one_stream():
    keys = [Partition("job-a", 0, g) for g in range(5)]
    groups = [make_group(k) for k in keys]
    with serving() as (_, client):
        client.put_groups(list(zip(keys, groups, strict=True)), writer="rollout-1")
        assert client.stats()["groups"] == 5
        assert client.get(keys).equals(pa.Table.from_batches(groups))


def test_put_groups_is_all_or_nothing():
    keys = [Partition("job-a", 0, g) for g in range(3)]
    groups = [make_group(k) for k in keys]
    groups[2] = make_group(Partition("job-a", 0, 9))  # rows name another partition: validation fails
    with serving() as (_, client):
        with pytest.raises(SchemaError, match="group_id"):
            client.put_groups(list(zip(keys, groups, strict=True)))
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["pending_puts"]) == (0, 0, 0)
        client.put_groups([(keys[1], make_group(keys[1]))])
        with pytest.raises(AlreadyExistsError):  # one stored key refuses the whole put
            client.put_groups([(keys[0], make_group(keys[0])), (keys[1], make_group(keys[1]))])
        assert client.stats()["groups"] == 1


def test_put_groups_refuses_batches_that_straddle_groups():
    keys = [Partition("job-a", 0, g) for g in range(2)]
    both = pa.concat_tables([pa.Table.from_batches([make_group(k)]) for k in keys]).combine_chunks()
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        puts = tuple(PutDescriptor(k, num_rows=8) for k in keys)
        descriptor = flight.FlightDescriptor.for_command(encode(PutManyDescriptor(puts)))
        writer, _ = raw.do_put(descriptor, both.schema)
        with pytest.raises(flight.FlightServerError, match="crosses a group boundary"):  # noqa: PT012
            writer.write_table(both)  # one batch of 16 rows
            writer.close()
        raw.close()
        assert client.stats()["groups"] == 0
