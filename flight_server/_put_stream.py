"""Reading a ``do_put`` stream: its schema's names bounded, each batch accounted as it arrives, group
boundaries of a ``put_many``, and the one thing pyarrow's reader does not tell: whether the stream ended
because its writer finished it or because the call broke.

pyarrow's server-side reader raises StopIteration both when the client half-closes the stream
(``done_writing()``, or ``close()``) and when the call breaks (the client was killed, or cancelled): gRPC's
read just returns false. Only the call's state tells them apart: a broken call is cancelled by the time
its read fails (:func:`check_finished`). A writer that fails mid-stream but still closes its writer
cleanly is told apart by the row count every put announces, which the server checks.

This module reads and accounts; it neither validates rows nor publishes (the server does).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.flight as flight

from trajflight.errors import InvalidRequestError, UnavailableError
from trajflight.flight_server._store_records import Reservation
from trajflight.flight_server._wire import PutDescriptor
from trajflight.flight_server._wire_bounds import MAX_NAME_CHARS, echo

__all__ = ["check_finished", "check_stream_schema", "receive", "receive_groups"]


def check_stream_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a put or append stream, its column names bounded before any message names one.

    Raises:
        InvalidRequestError: a column name longer than ``MAX_NAME_CHARS``.
    """
    for name in schema.names:
        if len(name) > MAX_NAME_CHARS:
            raise InvalidRequestError(
                f"do_put: a column name has {len(name)} characters, more than the {MAX_NAME_CHARS} "
                f"allowed ({echo(name)})",
                field="schema",
            )
    return schema


def check_finished(context: flight.ServerCallContext, what: str) -> None:
    """Refuse a stream whose end was its writer's death, not its ``done_writing()``.

    Raises:
        UnavailableError: the call was cancelled (nobody is left to hear it; it keeps nothing).
    """
    if context.is_cancelled():
        raise UnavailableError(
            f"{what}: the stream broke before the writer finished it (the writer died or cancelled the "
            "call); nothing was stored: put the group again"
        )


def receive(
    context: flight.ServerCallContext, reader: flight.MetadataRecordBatchReader, res: Reservation, what: str
) -> list[pa.RecordBatch]:
    """Read the rest of a stream, accounting each batch against ``res`` as it arrives (capacity is
    refused at the first batch that does not fit); a stream that broke rather than ended is refused.

    Raises:
        CapacityExceededError, InvalidRequestError (over ``max_group_bytes``), UnavailableError.
    """
    batches: list[pa.RecordBatch] = []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            check_finished(context, what)
            return batches
        batch = chunk.data
        if batch is None:  # metadata-only message
            continue
        res.grow(batch.get_total_buffer_size())  # O(buffers); RecordBatch.nbytes walks every list's offsets
        batches.append(batch)


def receive_groups(
    context: flight.ServerCallContext,
    reader: flight.MetadataRecordBatchReader,
    puts: Sequence[PutDescriptor],
    reservations: Sequence[Reservation],
) -> list[list[pa.RecordBatch]]:
    """Read a ``put_many`` stream: the groups of ``puts`` in order, each as batches of its own with
    exactly its announced rows, each batch accounted against its group's reservation.

    Raises:
        InvalidRequestError: a batch crosses a group boundary, or the stream ends inside a group. Plus
        those of :func:`receive`.
    """
    per_group: list[list[pa.RecordBatch]] = [[] for _ in puts]
    index, filled = 0, 0
    while True:
        try:
            batch = reader.read_chunk().data
        except StopIteration:
            check_finished(context, f"put of {len(puts)} groups")
            break
        if batch is None or batch.num_rows == 0:
            continue
        if index >= len(puts) or filled + batch.num_rows > (puts[index].num_rows or 0):
            raise InvalidRequestError(
                "put_many: a batch crosses a group boundary or the stream carries more rows than "
                "announced; send each group as batches of its own, in the announced order"
            )
        reservations[index].grow(batch.get_total_buffer_size())
        per_group[index].append(batch)
        filled += batch.num_rows
        if filled == puts[index].num_rows:
            index, filled = index + 1, 0
    if index != len(puts):
        raise InvalidRequestError(
            f"put_many: the stream ended inside group {index} of {len(puts)}; nothing was stored, "
            "put the groups again"
        )
    return per_group
