"""A put is published only when its writer finished the stream, never when the writer died mid-stream.

Regression tests for issue 14, item 1: a raw ``do_put`` (command descriptor without ``num_rows``) of
1-row slices whose writer was SIGKILLed published the group with 4 of its 8 rows. pyarrow's reader ends
the same way (StopIteration) when the client half-closes and when the call breaks; and a writer that
fails mid-stream but closes its writer (``with writer:``, or the writer's destructor at exit) ends the
stream cleanly too. So the server now refuses a stream whose call was cancelled, and requires every put
to announce its row count.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import dying_writer, make_group, serving

from trajflight.flight_server import PutDescriptor
from trajflight.flight_server._wire import PutManyDescriptor, encode
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 1)


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def _command(**fields: object) -> tuple[str, bytes]:
    return ("command", encode(PutDescriptor(KEY, "raw", **fields)))  # type: ignore[arg-type]


DESCRIPTORS = {
    # The whole group arrived, the writer died before done_writing(): published before the fix.
    "command-all-rows": (_command(num_rows=8), 8),
    "path-all-rows": (("path", [KEY.job_id, str(KEY.epoch), str(KEY.group_id), "8"]), 8),
    "put_many-all-rows": (("command", encode(PutManyDescriptor((PutDescriptor(KEY, num_rows=8),)))), 8),
    # The scenario: no row count, 4 of 8 rows, then SIGKILL.
    "command-no-count": (_command(), 4),
    "path-no-count": (("path", [KEY.job_id, str(KEY.epoch), str(KEY.group_id)]), 4),
}


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_a_writer_killed_mid_stream_publishes_nothing(name):
    """Regression: a SIGKILLed raw writer's stream was taken for a finished one and published."""
    descriptor, rows = DESCRIPTORS[name]
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe; the child makes its own client
    with serving() as (server, client):
        ready = ctx.Event()
        child = ctx.Process(
            target=dying_writer, args=(server.location, KEY, descriptor, rows, ready), daemon=True
        )
        child.start()
        try:
            assert ready.wait(60), "the writer never sent its rows"
            time.sleep(0.2)  # let the rows reach the server's reader (a refusal only makes it faster)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        _wait_for(lambda: client.stats()["pending_puts"] == 0)
        raw = flight.FlightClient(server.location)
        assert list(raw.list_flights()) == []
        raw.close()
        stats = client.stats()
        assert (stats["groups"], stats["bytes"], stats["reserved_bytes"]) == (0, 0, 0)
        client.put_groups([(KEY, make_group(KEY))])  # the partition is free: the writer may put it again
        assert client.get([KEY]).num_rows == 8


@pytest.mark.parametrize(
    "descriptor",
    [
        flight.FlightDescriptor.for_command(encode(PutDescriptor(KEY, "raw"))),
        flight.FlightDescriptor.for_path(KEY.job_id, str(KEY.epoch), str(KEY.group_id)),
    ],
    ids=["command", "path"],
)
def test_a_put_without_a_row_count_is_refused_before_any_row_is_kept(descriptor):
    """A writer that fails mid-stream and still closes its writer (``with writer:`` on an exception, or
    the writer's destructor) ends the stream exactly as a finished one does: only a count tells."""
    group = make_group(KEY)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        writer, _ = raw.do_put(descriptor, group.schema)
        with pytest.raises(flight.FlightServerError, match=r"invalid_request.*num_rows"), writer:
            writer.write_batch(group.slice(0, 4))  # the refusal surfaces here or at the close
        raw.close()
        assert client.stats()["groups"] == 0


def test_a_writer_that_fails_mid_stream_but_closes_cleanly_is_refused_by_its_count():
    group = make_group(KEY)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        descriptor = flight.FlightDescriptor.for_command(encode(PutDescriptor(KEY, num_rows=8)))
        writer, _ = raw.do_put(descriptor, group.schema)
        with pytest.raises(flight.FlightServerError, match="4 rows arrived, 8 announced"), writer:  # noqa: PT012
            for i in range(4):
                writer.write_batch(group.slice(i, 1))
        raw.close()
        assert client.stats()["groups"] == 0


def test_a_bare_client_puts_through_a_four_part_path():
    group = make_group(KEY)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        path = flight.FlightDescriptor.for_path(KEY.job_id, str(KEY.epoch), str(KEY.group_id), "8")
        writer, _ = raw.do_put(path, group.schema)
        writer.write_table(pa.Table.from_batches([group]))
        writer.close()
        raw.close()
        assert client.get([KEY]).equals(pa.Table.from_batches([group]))
