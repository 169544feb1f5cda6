"""The pool's one put route: groups keyed by the writer, put over Flight or shared memory in one call.

Keying itself is the codec's (``tests/codec/test_partitions.py``); what the pool adds is the route, the
slices of a joined batch, and the refusals of groups that cannot travel together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from trajflight._storage import StoragePool
from trajflight.codec import EncodedGroups, encode_groups, validate_group, with_partitions
from trajflight.errors import InvalidRequestError
from trajflight.flight_server import GroupRead, ShmArena, StorageServer
from trajflight.keys import Partition
from trajflight.workload import make_workload


@pytest.fixture(params=["flight", "shm"])
def pool_and_location(request: pytest.FixtureRequest) -> Iterator[tuple[StoragePool, str]]:
    """A storage server with an arena on loopback and a pool forced onto one transport."""
    with (
        StorageServer(arena=ShmArena()) as server,
        contextlib.closing(StoragePool(timeout=20, transport=request.param)) as pool,
    ):
        yield pool, server.location


def _encoded(count: int, job: str = "job") -> tuple[list[Partition], EncodedGroups]:
    groups = make_workload(count, 4, seed=2, response_median=32)
    encoded = encode_groups(
        job_id=job, epoch=1, groups=[{**g.columns(), "group_id": i} for i, g in enumerate(groups)]
    )
    keys = [Partition(job, 1, 40 + i) for i in range(count)]
    return keys, with_partitions(encoded, keys)


def test_groups_of_a_joined_batch_are_stored_as_its_slices_under_their_keys(pool_and_location):
    pool, location = pool_and_location
    keys, keyed = _encoded(3)
    pool.put_groups(
        location, list(zip(keys, keyed, strict=True)), writer="w", timeout=20, joined=keyed.joined
    )
    lone = Partition("job", 1, 99)
    pool.put_groups(location, [(lone, with_partitions(keyed[0], [lone]))], writer="w", timeout=20)
    table = pool.get(location, [GroupRead(k) for k in keys], columns=None, timeout=20)
    assert table.num_rows == keyed.joined.num_rows
    at = 0
    for key, rows in zip(keys, keyed.rows, strict=True):
        part = table.slice(at, rows).combine_chunks().to_batches()[0]
        assert validate_group(part, expect=key) == key
        at += rows
    listed = {info.key for info in pool.client(location).list_groups("job")}
    assert listed == {*keys, lone}


def test_groups_of_other_schemas_or_a_joined_batch_of_other_rows_are_refused(pool_and_location):
    pool, location = pool_and_location
    keys, keyed = _encoded(2)
    bare = keyed[1].drop_columns(["reward"])
    with pytest.raises(InvalidRequestError, match="another schema"):
        pool.put_groups(location, [(keys[0], keyed[0]), (keys[1], bare)], writer="w", timeout=20)
    with pytest.raises(InvalidRequestError, match="joined batch has"):
        pool.put_groups(location, [(keys[0], keyed[0])], writer="w", timeout=20, joined=keyed.joined)
    assert pool.client(location).list_groups("job") == []  # nothing of a refused put was stored
