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
from trajflight.controller import DeleteWork
from trajflight.errors import InvalidRequestError
from trajflight.flight_server import GroupRead, LeaseToken, ShmArena, StorageServer
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


def _gc_work(key: Partition, location: str, token: int = 1) -> DeleteWork:
    return DeleteWork(key, "s0", location, token, 1, None, "committed")


def test_delete_groups_deletes_a_batch_in_one_call_and_a_stale_token_fails_only_its_group(
    pool_and_location, monkeypatch
):
    """Issue 17: the archive's deletes go one call per server, and a stale fence on one group neither
    drops the others nor deletes it (the call is split until the refused group stands alone)."""
    pool, location = pool_and_location
    keys, keyed = _encoded(6)
    pool.put_groups(location, list(zip(keys, keyed, strict=True)), writer="w", timeout=20)
    client = pool.client(location)
    client.advance_generation([GroupRead(keys[3], LeaseToken(5))])  # a newer lease holds group 43
    calls: list[int] = []
    delete = client.delete

    def counted(groups, **kwargs):
        calls.append(len(groups))
        return delete(groups, **kwargs)

    monkeypatch.setattr(client, "delete", counted)
    work = [_gc_work(k, location) for k in keys]
    out = pool.delete_groups(work)
    assert [w for w, _, _ in out] == work  # in work's order
    assert [ok for _, ok, _ in out] == [True, True, True, False, True, True]
    assert str(out[3][2]).startswith("StaleFenceError: ")
    assert [info.key for info in client.list_groups("job")] == [keys[3]]  # only the refused one stays
    assert calls[0] == 6  # the whole batch first, then its halves
    assert len(calls) > 1

    calls.clear()
    again = pool.delete_groups(work[:3] + work[4:])  # already deleted: still a success, in one call
    assert [ok for _, ok, _ in again] == [True] * 5
    assert calls == [5]


def test_delete_groups_reports_every_group_of_an_unreachable_server_failed(pool_and_location):
    """A server that cannot be reached fails each of its groups (they stay on the GC list), and the
    groups of the other server are deleted all the same."""
    pool, location = pool_and_location
    keys, keyed = _encoded(2)
    pool.put_groups(location, list(zip(keys, keyed, strict=True)), writer="w", timeout=20)
    with StorageServer() as gone:
        dead = gone.location
    pool.timeout = 2.0
    work = [_gc_work(keys[0], location), _gc_work(Partition("job", 1, 7), dead), _gc_work(keys[1], location)]
    out = pool.delete_groups(work)
    assert [(w, ok) for w, ok, _ in out] == [(work[0], True), (work[1], False), (work[2], True)]
    assert str(out[1][2]).startswith(("UnavailableError: ", "DeadlineExceededError: "))
    assert pool.client(location).list_groups("job") == []


def test_a_plane_without_an_archive_deletes_a_commit_s_groups_in_one_call(monkeypatch):
    """The controller's own GC went one delete call per group where the archive's went one per server;
    a LocalCluster without an archive now hands each sweeper pass's deletes to ``delete_groups`` too."""
    import trajflight
    from trajflight.workload import make_workload

    calls: list[int] = []
    delete_groups = StoragePool.delete_groups

    def counted(self, work):
        calls.append(len(work))
        return delete_groups(self, work)

    monkeypatch.setattr(StoragePool, "delete_groups", counted)
    monkeypatch.setattr(StoragePool, "delete", lambda self, work: pytest.fail("a delete of one group"))
    with trajflight.LocalCluster(servers=1, processes=False) as cluster, cluster.client() as client:
        client.open_job("gc", 1)
        writer = client.writer("gc", 1)
        for g in make_workload(8, 4, seed=1, response_median=32):
            writer.put(**g.columns())
        with client.trainer("gc").lease(8, wait=10) as batch:
            batch.fetch_table(["reward"])
        assert cluster.wait_idle("gc", timeout=20) == (0, 0)
    assert sum(calls) == 8
    assert max(calls) == 8  # the commit's groups in one call, not one call each
