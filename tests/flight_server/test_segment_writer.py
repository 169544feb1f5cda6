"""A same-host writer's segment writes: ``write(2)`` the first time, a kept mapping when handed it again.

Unit tests on plain files (the writer does not care who made them), then through a real server whose
arena hands the same segment back for batch after batch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from flight_testkit import make_group
from test_shm_batch import joined, serving

from trajflight.errors import InvalidRequestError, NotFoundError
from trajflight.flight_server import GroupRead, LeaseToken
from trajflight.flight_server._segments import stream_size
from trajflight.flight_server.shm._writer import SegmentWriter
from trajflight.keys import Partition

SEGMENT = 256 * 1024


def _batch(seed: int) -> pa.RecordBatch:
    return make_group(Partition("job-a", 1, seed), 4, seed=seed)


def _segment(tmp_path: Path, name: str, size: int = SEGMENT) -> str:
    path = tmp_path / name
    path.write_bytes(b"\xff" * size)  # not zeros: a stale byte would show
    return str(path)


def _stored(path: str) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(Path(path).read_bytes())).read_all()


def _write(writer: SegmentWriter, path: str, batch: pa.RecordBatch, capacity: int = SEGMENT) -> int:
    return writer.write(path, capacity, batch.schema, [batch])


def test_a_segment_seen_again_is_written_through_a_kept_mapping_bit_exact(tmp_path: Path) -> None:
    writer = SegmentWriter()
    path = _segment(tmp_path, "seg-1")
    for i, expect_mapped in enumerate([0, 1, 2]):
        batch = _batch(i)
        size = _write(writer, path, batch)
        assert size == stream_size(batch.schema, [batch])
        assert _stored(path).equals(pa.Table.from_batches([batch]))
        assert writer.mapped_writes == expect_mapped
    assert writer.kept_bytes == SEGMENT
    writer.close()
    assert writer.kept_bytes == 0
    _write(writer, path, _batch(9))  # usable after close: seen anew
    assert writer.mapped_writes == 2
    assert _stored(path).equals(pa.Table.from_batches([_batch(9)]))


def test_an_unlinked_segment_s_mapping_is_dropped_at_the_next_write(tmp_path: Path) -> None:
    writer = SegmentWriter()
    gone, other = _segment(tmp_path, "seg-gone"), _segment(tmp_path, "seg-other")
    _write(writer, gone, _batch(0))
    _write(writer, gone, _batch(1))
    assert writer.kept_bytes == SEGMENT
    os.unlink(gone)  # the server trims its pool: the kept mapping alone holds the pages now
    _write(writer, other, _batch(2))
    assert writer.kept_bytes == 0
    with pytest.raises(NotFoundError, match="is gone"):
        _write(writer, gone, _batch(3))


def test_a_file_recreated_at_the_same_path_is_not_written_through_the_old_mapping(tmp_path: Path) -> None:
    writer = SegmentWriter()
    path = _segment(tmp_path, "seg-1")
    _write(writer, path, _batch(0))
    _write(writer, path, _batch(1))
    os.unlink(path)
    path = _segment(tmp_path, "seg-1")  # same name, another file
    _write(writer, path, _batch(2))
    assert _stored(path).equals(pa.Table.from_batches([_batch(2)]))


def test_kept_mappings_are_bounded_in_count_and_bytes(tmp_path: Path) -> None:
    writer = SegmentWriter(max_segments=2)
    paths = [_segment(tmp_path, f"seg-{i}") for i in range(3)]
    for path in paths * 3:
        _write(writer, path, _batch(0))
    assert writer.kept_bytes == 2 * SEGMENT
    # Each file is written with write(2) first, then mapped; seg-0's mapping, the least recently used,
    # goes when seg-2's comes, and seg-0 starts over (not mapped again at once: a writer handed more
    # segments in turn than it keeps would pay for a new mapping at every write).
    assert writer.mapped_writes == 5
    small = SegmentWriter(max_bytes=SEGMENT - 1)  # never keeps a segment larger than its budget
    for _ in range(3):
        _write(small, paths[0], _batch(0))
    assert small.mapped_writes == 0
    assert small.kept_bytes == 0
    off = SegmentWriter(max_segments=0)
    for _ in range(3):
        _write(off, paths[0], _batch(0))
    assert off.mapped_writes == 0
    with pytest.raises(InvalidRequestError, match=">= 0"):
        SegmentWriter(max_bytes=-1)


def test_a_stream_larger_than_the_reservation_is_refused_on_either_path(tmp_path: Path) -> None:
    writer = SegmentWriter()
    path = _segment(tmp_path, "seg-1")
    batch = _batch(0)
    too_small = stream_size(batch.schema, [batch]) - 8
    with pytest.raises(InvalidRequestError, match="segment of"):
        _write(writer, path, batch, too_small)  # write(2)
    with pytest.raises(InvalidRequestError, match="does not fit the segment"):
        _write(writer, path, batch, too_small)  # through a new mapping, which it then gives up
    assert writer.kept_bytes == 0
    _write(writer, path, batch)  # still usable
    assert _stored(path).equals(pa.Table.from_batches([batch]))


def test_a_writer_putting_batch_after_batch_writes_the_reused_segment_through_its_mapping() -> None:
    with serving() as (server, client):
        for rep in range(4):
            keys = [Partition("job-a", 1, 10 * rep + g) for g in range(3)]
            batch = joined(keys)
            client.shm_put_groups(
                [(k, batch.slice(8 * i, 8)) for i, k in enumerate(keys)], joined=batch, writer="w"
            )
            assert client.shm_get(keys).equals(pa.Table.from_batches([batch]))
            client.delete([GroupRead(k, LeaseToken(1)) for k in keys])
            server.arena.reclaim()  # no reader holds it: back to the pool at once
        assert client._shm._segments.mapped_writes >= 2
    assert client._shm._segments.kept_bytes == 0  # the client's close let go
