"""The public client on one host: shared memory chosen by host identity, Flight forced by a setting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from procmaps import inside, mapped_ranges

import trajflight
from trajflight._lease import fetch_table
from trajflight._storage import StoragePool
from trajflight.errors import ConfigError, StaleFenceError
from trajflight.flight_server.shm._sweep import ORPHAN_AGE
from trajflight.workload import make_workload

from .conftest import PLANES, WRITER, plane, run_child, start_child


@pytest.fixture(scope="module", params=PLANES)
def shm_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[trajflight.LocalCluster]:
    """Two storage server processes with arenas (the default) and an in-process controller; plain and
    secure (tokens on the same-host socket too)."""
    with plane(request.param, tmp_path_factory, servers=2, capacity="256MiB", timeout=20.0) as c:
        yield c


def test_same_host_put_and_fetch_go_through_shared_memory_bit_exact_and_zero_copy(shm_cluster, job):
    client = shm_cluster.client()
    client.open_job(job, 1)
    (g,) = make_workload(1, 8, seed=3, response_median=256)
    meta = client.writer(job, 1).put(g.encode(job, 1))
    assert client.storage.uses_shm(meta.location)
    with client.trainer(job).lease(1, wait=5) as batch:
        tensors = batch.fetch(["response_ids", "response_logprobs", "advantage"])
        ranges = mapped_ranges(shm_cluster.shm_dir)
        for name, expected in (("response_ids", g.response_values), ("response_logprobs", g.logprobs)):
            values = tensors.tensors[name].values()
            assert inside(values.data_ptr(), ranges), f"{name} was copied"
            assert np.array_equal(values.numpy(), expected)
        assert inside(tensors.tensors["advantage"].data_ptr(), ranges)
        assert np.array_equal(tensors.tensors["advantage"].numpy(), g.advantage)
    assert shm_cluster.wait_idle(job) == (0, 0)
    stats = client.storage.client(meta.location).stats()
    assert stats["shm"]["live_segments"] == 0  # commit released the segment
    assert tensors.tensors["response_ids"].values().numpy()[:4].tolist() == g.response_values[:4].tolist()


def test_writers_in_other_processes_and_batches_over_two_servers_match_the_flight_path(shm_cluster, job):
    client = shm_cluster.client()
    client.open_job(job, 1)
    written = run_child(WRITER, shm_cluster.address, job, 1, 0, 6)  # connect() picks shm by itself
    assert len(written) == 6
    for location in shm_cluster.server_locations:
        assert client.storage.client(location).stats()["shm"]["live_segments"] >= 1
    with client.trainer(job).lease(6, wait=5) as batch:
        over_shm = batch.fetch_table()
        mine = client.storage  # the same TLS material and credential (the secure plane needs them)
        flight_pool = StoragePool(timeout=20, transport="flight", tls=mine.tls, credential=mine.credential)
        try:
            over_flight = fetch_table(batch.handle, pool=flight_pool)
        finally:
            flight_pool.close()
        assert over_shm.equals(over_flight)
        assert over_shm.num_rows == 24


def test_flight_forced_by_the_setting(shm_cluster, job):
    client = shm_cluster.client(transport="flight")
    client.open_job(job, 1)
    (g,) = make_workload(1, 4, seed=5, response_median=64)
    meta = client.writer(job, 1).put(g.encode(job, 1))
    assert not client.storage.uses_shm(meta.location)
    before = len(mapped_ranges(shm_cluster.shm_dir))
    with client.trainer(job).lease(1, wait=5) as batch:
        tensors = batch.fetch(["response_ids"])
        values = tensors.tensors["response_ids"].values()
        assert np.array_equal(values.numpy(), g.response_values)
        assert len(mapped_ranges(shm_cluster.shm_dir)) == before  # nothing mapped: it came over Flight
        # ... served from the same memory: the server keeps the group in a segment of its arena.
        assert client.storage.client(meta.location).stats()["shm"]["live_segments"] >= 1
    assert shm_cluster.wait_idle(job) == (0, 0)


@pytest.mark.parametrize("transport", ["auto", "flight"])
def test_put_many_of_columns_over_two_servers_reads_back_group_by_group(shm_cluster, job, transport):
    """Groups encoded together and placed on two servers: on shared memory each server's groups are
    joined from their slices (or written as joined, when one server takes them all), over Flight sent
    as slices; every group reads back as it was given, with the writer's default sample ids."""
    client = shm_cluster.client(transport=transport)
    client.open_job(job, 1)
    groups = make_workload(6, 3, seed=14, response_median=64)
    infos = client.writer(job, 1).put_many([g.columns() for g in groups])
    assert [i.rows for i in infos] == [3] * 6
    by_id = {i.partition.group_id: g for i, g in zip(infos, groups, strict=True)}
    with client.trainer(job).lease(6, wait=5) as batch:
        table = batch.fetch_table(["group_id", "sample_id", "response_ids", "advantage"])
    for gid, g in by_id.items():
        rows = table.filter(pa.compute.equal(table.column("group_id"), gid))
        assert np.array_equal(rows.column("response_ids").combine_chunks().values, g.response_values)
        assert rows.column("advantage").to_pylist() == g.advantage.tolist()
        assert rows.column("sample_id").to_pylist() == [f"{job}/1/{gid}/{i}" for i in range(3)]
    assert shm_cluster.wait_idle(job) == (0, 0)


def test_a_superseded_lease_is_refused_on_the_shared_memory_path(shm_cluster, job):
    client = shm_cluster.client()
    client.open_job(job, 1, {"default_lease_ttl": "1s"})
    (g,) = make_workload(1, 4, seed=6, response_median=64)
    client.writer(job, 1).put(g.encode(job, 1))
    stale = client.trainer(job, owner="zombie").lease(1, wait=5, renew=False)
    stale.fetch_table(["reward"])
    time.sleep(1.3)  # the zombie's lease expires; a new holder gets the group under a newer generation
    fresh = client.trainer(job, owner="survivor").lease(1, wait=5)
    assert fresh.handle.groups[0].generation > stale.handle.groups[0].generation
    with pytest.raises(StaleFenceError):
        stale.fetch_table(["reward"])
    with fresh:
        assert fresh.fetch_table(["reward"]).num_rows == 4
    assert shm_cluster.wait_idle(job) == (0, 0)


def test_shm_forced_where_impossible_and_unknown_transports_are_config_errors():
    with trajflight.LocalCluster(servers=1, processes=False, shm=False) as cluster:
        client = cluster.client(transport="shm")
        client.open_job("j", 1)
        (g,) = make_workload(1, 2, response_median=64)
        with pytest.raises(ConfigError, match="no shared-memory arena"):
            client.writer("j", 1).put(g.encode("j", 1))
        auto = cluster.client()
        meta = auto.writer("j", 1).put(g.encode("j", 1))
        assert not auto.storage.uses_shm(meta.location)  # auto falls back to Flight
    with pytest.raises(ConfigError, match="transport must be one of"):
        StoragePool(transport="carrier-pigeon")  # type: ignore[arg-type]


def test_in_thread_servers_get_arenas_too():
    with trajflight.LocalCluster(servers=1, processes=False) as cluster:
        client = cluster.client()
        client.open_job("j", 1)
        groups = make_workload(2, 4, response_median=64)
        for g in groups:
            client.writer("j", 1, writer_id="w").put(g.encode("j", 1))
        with client.trainer("j").lease(2, wait=5) as batch:
            table = batch.fetch_table(["response_ids"])
            assert client.storage.uses_shm(batch.handle.groups[0].location)
        expected = pa.concat_arrays([pa.array(g.response_values) for g in groups])
        assert table.column("response_ids").combine_chunks().flatten().equals(expected)


def test_put_many_lands_as_one_segment_and_a_lease_in_order_decodes_with_no_copy():
    with trajflight.LocalCluster(servers=1, processes=False) as cluster:
        client = cluster.client()
        client.open_job("j", 1)
        groups = make_workload(6, 4, seed=9, response_median=64)
        infos = client.writer("j", 1).put_many([g.encode("j", 1) for g in groups])
        assert len(infos) == 6
        location = infos[0].location
        assert client.storage.client(location).stats()["shm"]["live_segments"] == 1
        with client.trainer("j").lease(6, wait=5) as batch:
            tensors = batch.fetch(["response_ids"])
            values = tensors.tensors["response_ids"].values()
            assert inside(values.data_ptr(), mapped_ranges(cluster.shm_dir))
            leased = [g.partition.group_id for g in batch.handle.groups]
            by_id = {i.partition.group_id: g for i, g in zip(infos, groups, strict=True)}
            expected = np.concatenate([by_id[i].response_values for i in leased])
            assert np.array_equal(values.numpy(), expected)
        assert cluster.wait_idle("j") == (0, 0)
        assert client.storage.client(location).stats()["shm"]["live_segments"] == 0


def test_put_many_of_encoded_groups_writes_their_joined_batch_with_no_copy_to_join(monkeypatch):
    """Groups from encode_groups are slices of one joined batch: the shared-memory put writes it as it
    is (no join), and a lease in order reads exactly the groups' data from one segment."""
    import trajflight.flight_server.shm._client as shm_client

    def no_join(*args: object, **kwargs: object) -> None:
        raise AssertionError("the groups were joined again")

    monkeypatch.setattr(shm_client, "join_batches", no_join)
    with trajflight.LocalCluster(servers=1, processes=False) as cluster:
        client = cluster.client()
        client.open_job("j", 1)
        groups = make_workload(5, 3, seed=10, response_median=64)
        encoded = trajflight.codec.encode_groups(
            job_id="j", epoch=1, groups=[{**g.columns(), "group_id": g.group_id} for g in groups]
        )
        infos = client.writer("j", 1).put_many(encoded)
        location = infos[0].location
        assert client.storage.client(location).stats()["shm"]["live_segments"] == 1
        with client.trainer("j").lease(5, wait=5) as batch:
            table = batch.fetch_table()
            assert table.column("group_id").to_pylist() == [
                i.partition.group_id for i in infos for _ in range(3)
            ]
            mine = encoded.joined.drop_columns(["job_id", "epoch", "group_id"])
            assert table.drop_columns(["job_id", "epoch", "group_id"]).to_batches()[0].equals(mine)
        assert cluster.wait_idle("j") == (0, 0)


def test_a_lease_reads_through_the_segments_it_opened_and_sees_its_own_appends(shm_cluster, job):
    client = shm_cluster.client()
    client.open_job(job, 1)
    (g,) = make_workload(1, 4, seed=8, response_median=64)
    meta = client.writer(job, 1).put(g.encode(job, 1))
    server = client.storage.client(meta.location)
    with client.trainer(job).lease(1, wait=5) as batch:
        opened_at_lease = server.stats()["groups_read"]
        assert batch.fetch_table(["reward"]).num_rows == 4
        assert server.stats()["groups_read"] == opened_at_lease  # the lease's open served the read
        extra = pa.table({"ref_logprob": pa.array([0.25] * 4, pa.float32())})
        batch.append(meta.partition, extra)
        table = batch.fetch_table()  # every stored column, the appended one too
        assert table.column("ref_logprob").to_pylist() == [0.25] * 4
    assert shm_cluster.wait_idle(job) == (0, 0)


def test_a_committed_lease_kept_by_the_caller_does_not_pin_its_segments(shm_cluster, job):
    client = shm_cluster.client()
    client.open_job(job, 1)
    (g,) = make_workload(1, 4, seed=9, response_median=64)
    client.writer(job, 1).put(g.encode(job, 1))
    batch = client.trainer(job).lease(1, wait=5)
    tensors = batch.fetch(["response_ids"])
    directory = os.path.join(shm_cluster.shm_dir, "")
    # Segment files only: each client also maps the servers' fence boards, apart from any lease.
    assert mapped_ranges(directory, name_part="/seg-")  # the tensors alias the mapping...
    batch.commit()
    del tensors
    assert not mapped_ranges(directory, name_part="/seg-")  # ...which goes with them, though `batch` lives on
    assert shm_cluster.wait_idle(job) == (0, 0)


def test_a_lease_maps_its_segments_when_granted_and_its_first_read_maps_nothing(shm_cluster, job):
    """The lease's open maps (and so locks against reuse) the groups' segments at once: the data is
    held from the grant on, even if the groups are deleted before the first read."""
    client = shm_cluster.client()
    client.open_job(job, 1)
    groups = make_workload(3, 4, seed=10, response_median=64)
    client.writer(job, 1).put_many([g.encode(job, 1) for g in groups])
    directory = os.path.join(shm_cluster.shm_dir, "")
    assert not mapped_ranges(directory, name_part="/seg-")
    with client.trainer(job).lease(3, wait=5) as batch:
        held = mapped_ranges(directory, name_part="/seg-")
        assert held  # mapped at the grant, before any read
        opened = list(batch._opened.values())  # one per server the groups landed on
        mapped = [o.mapped for o in opened]
        assert all(mapped)
        tensors = batch.fetch(["response_ids"])
        assert [o.mapped for o in opened] == mapped  # the read mapped nothing more
        assert tensors.num_rows == 12
    assert shm_cluster.wait_idle(job) == (0, 0)


KILLED_DRIVER = """
import json, os, signal, sys
import trajflight
from trajflight.workload import make_workload
cluster = trajflight.LocalCluster(servers=1, capacity="64MiB", shm_root=sys.argv[1]).start()
client = cluster.client()
client.open_job("j", 1)
(group,) = make_workload(1, 8, seed=1, response_median=64)
client.writer("j", 1).put(group.encode("j", 1))
print(json.dumps({"server": cluster._procs[0].pid, "dir": cluster.shm_dir}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a crash: the cluster never closes
"""


@pytest.fixture
def short_root() -> Iterator[str]:
    """A deployment root with a short path (a Unix socket's path has at most 107 bytes)."""
    root = tempfile.mkdtemp(prefix="tf-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_killed_driver_leaves_no_server_and_no_directory(short_root):
    """The servers of a LocalCluster whose process is SIGKILLed stop by themselves, removing their
    segments and then the deployment directory (issue 19: an empty ``trajflight-<uuid>/`` stayed until a
    later start swept it); a directory left by servers that could not clean up (SIGKILLed themselves)
    is still removed by the next cluster on the machine."""
    child = start_child(KILLED_DRIVER, short_root)
    try:
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL, err[-2000:]
    left = json.loads(out.strip().splitlines()[-1])
    deadline = time.monotonic() + 15
    while _alive(left["server"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(left["server"]), "the orphaned server is still running"
    deadline = time.monotonic() + 15
    while os.path.exists(left["dir"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(left["dir"]), list(os.walk(left["dir"]))
    os.makedirs(os.path.join(left["dir"], "server-0"))  # as a SIGKILLed server leaves it
    old = time.time() - 2 * ORPHAN_AGE
    os.utime(left["dir"], (old, old))  # a minute later
    with trajflight.LocalCluster(servers=1, capacity="64MiB", shm_root=short_root, processes=False) as fresh:
        fresh.client()
        assert not os.path.exists(left["dir"])
        assert os.path.isdir(str(fresh.shm_dir))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not reaped yet by its new parent) is gone too
        return f.read().split(") ", 1)[1].split()[0] != "Z"


def test_a_put_many_batch_goes_to_one_of_two_servers_and_its_lease_decodes_with_no_copy():
    """Two servers: the batch is placed whole on one (issue 16), so a lease of it in order reads one
    slice of one segment: the tensors alias the arena, and the next batch goes to the other server."""
    with trajflight.LocalCluster(servers=2, processes=False) as cluster:
        client = cluster.client()
        client.open_job("j", 1)
        writer = client.writer("j", 1)
        groups = make_workload(6, 4, seed=9, response_median=64)
        first = writer.put_many([g.columns() for g in groups])
        second = writer.put_many([g.columns() for g in groups])
        assert len({i.location for i in first}) == 1
        assert len({i.location for i in second}) == 1
        assert first[0].location != second[0].location
        with client.trainer("j").lease(6, wait=5) as batch:
            assert [g.partition for g in batch.handle.groups] == [i.partition for i in first]
            values = batch.fetch(["response_ids"]).tensors["response_ids"].values()
            assert inside(values.data_ptr(), mapped_ranges(cluster.shm_dir))
            expected = np.concatenate([g.response_values for g in groups])
            assert np.array_equal(values.numpy(), expected)
        with client.trainer("j").lease(6, wait=5):
            pass
        assert cluster.wait_idle("j") == (0, 0)


def test_a_put_many_batch_no_server_holds_whole_is_split_and_reads_back_group_by_group():
    """Servers of at most 4 groups: a batch of 6 is placed group by group over both, as before, and
    every group reads back as it was given (each server's groups joined from their slices)."""
    with trajflight.LocalCluster(servers=2, processes=False, max_groups=4) as cluster:
        client = cluster.client()
        client.open_job("j", 1)
        groups = make_workload(6, 3, seed=14, response_median=64)
        infos = client.writer("j", 1).put_many([g.columns() for g in groups])
        assert len({i.location for i in infos}) == 2
        by_id = {i.partition.group_id: g for i, g in zip(infos, groups, strict=True)}
        with client.trainer("j").lease(6, wait=5) as batch:
            table = batch.fetch_table(["group_id", "response_ids"])
        for gid, g in by_id.items():
            rows = table.filter(pa.compute.equal(table.column("group_id"), gid))
            assert np.array_equal(rows.column("response_ids").combine_chunks().values, g.response_values)
        assert cluster.wait_idle("j") == (0, 0)
