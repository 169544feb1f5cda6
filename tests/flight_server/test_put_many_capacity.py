"""A ``put_many`` over Flight is charged what the server holds for each group, not its parent batch.

Groups from ``encode_groups`` (an :class:`~trajflight.codec.EncodedGroups`) are slices of one joined
batch: their buffers are the joined batch's. Arrow IPC writes only the rows of a slice, so that is what a
storage server receives and holds; the put must announce that, not the buffers the slice points into.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from flight_testkit import serving

import trajflight
from trajflight.codec import EncodedGroups, encode_groups, with_partitions
from trajflight.flight_server import StoreLimits
from trajflight.keys import Partition
from trajflight.workload import make_workload

JOB = "job-capacity"
GROUPS = 32


def _encoded(job: str, epoch: int = 1) -> EncodedGroups:
    groups = make_workload(GROUPS, 8, seed=11, response_median=128)
    return encode_groups(
        job_id=job, epoch=epoch, groups=[{**g.columns(), "group_id": g.group_id} for g in groups]
    )


def _received_bytes(batch: pa.RecordBatch) -> int:
    """What a server holds for ``batch`` sent over Flight: the buffers an IPC stream of it decodes to."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch().get_total_buffer_size()


def test_slices_of_a_joined_batch_fit_a_server_sized_a_little_above_their_payload() -> None:
    """Bug (issue 16): ``StorageClient._batches`` announced each slice at ``get_total_buffer_size()``,
    the whole joined batch's buffers, so many groups were refused "server full" far below capacity."""
    encoded = _encoded(JOB)
    keys = [Partition(JOB, 1, i) for i in range(GROUPS)]
    slices = with_partitions(encoded, keys)
    held = sum(_received_bytes(s) for s in slices)
    assert slices[1].get_total_buffer_size() > held / 2  # each slice points into the whole batch
    with serving(StoreLimits(capacity_bytes=int(held * 1.1))) as (_, client):
        client.put_groups(list(zip(keys, slices, strict=True)), writer="w")
        stats = client.stats()
        assert stats["groups"] == GROUPS
        assert stats["bytes"] <= int(held * 1.1)
        assert stats["reserved_bytes"] == 0
        assert client.get(keys).equals(pa.Table.from_batches(slices).combine_chunks())


def test_one_slice_put_alone_is_charged_its_rows() -> None:
    """The same bug for one group: a slice put on its own announced its parent's buffers."""
    encoded = _encoded(JOB)
    keys = [Partition(JOB, 1, i) for i in range(GROUPS)]
    slices = with_partitions(encoded, keys)
    one = _received_bytes(slices[0])
    with serving(StoreLimits(capacity_bytes=one * 2)) as (_, client):
        client.put_groups([(keys[0], slices[0])])
        assert client.stats()["groups"] == 1


@pytest.fixture(scope="module")
def tight_cluster() -> Iterator[tuple[trajflight.LocalCluster, int]]:
    """One storage server (in this process, Flight only) sized a little above the workload's payload."""
    held = sum(_received_bytes(s) for s in _encoded(JOB))
    with trajflight.LocalCluster(
        servers=1, capacity=int(held * 1.25), processes=False, shm=False, timeout=20.0
    ) as cluster:
        yield cluster, held


@pytest.mark.parametrize("given", ["encoded", "columns"])
def test_writer_put_many_over_flight_fits_a_server_sized_a_little_above_the_payload(
    tight_cluster: tuple[trajflight.LocalCluster, int], given: str
) -> None:
    """Bug (issue 16): the public ``Writer.put_many`` of an ``EncodedGroups`` (or of the groups' columns,
    encoded together) over Flight failed "server full" on a server with room for the groups."""
    cluster, held = tight_cluster
    job = f"{JOB}-{given}"
    client = cluster.client(transport="flight")
    try:
        client.open_job(job, 1)
        writer = client.writer(job, 1, writer_id="w")
        if given == "encoded":
            infos = writer.put_many(_encoded(job), timeout=10.0)
        else:
            groups = make_workload(GROUPS, 8, seed=11, response_median=128)
            infos = writer.put_many([g.columns() for g in groups], timeout=10.0)
        assert len(infos) == GROUPS
        assert not client.storage.uses_shm(infos[0].location)
        stats = client.storage.client(infos[0].location).stats()
        assert stats["groups"] == GROUPS
        assert stats["bytes"] <= held * 1.25
        with client.trainer(job).lease(GROUPS, wait=10.0) as batch:
            assert len(batch) == GROUPS
            assert batch.fetch_table().num_rows == GROUPS * 8
        assert cluster.wait_idle(job) == (0, 0)
    finally:
        client.close()
