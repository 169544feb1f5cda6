"""The same-node path: groups written straight into the server's shared-memory arena and mapped by readers.

Every lease and fencing rule of the Flight path is repeated here through a ``transport`` fixture that puts
and reads either over Flight or through shared memory, against the same server (with an arena).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import multiprocessing
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group
from procmaps import inside, mapped_ranges
from shm_testkit import killed_writer

from trajflight.auth import Keyring
from trajflight.codec import decode
from trajflight.errors import (
    AlreadyExistsError,
    AuthenticationError,
    CapacityExceededError,
    ConfigError,
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
from trajflight.flight_server._wire import PutDescriptor, ShmPublishRequest, ShmReserveRequest, encode
from trajflight.flight_server.shm._segment import size_class
from trajflight.flight_server.shm._sweep import ORPHAN_AGE, remove_dead_arena, sweep_dead_arenas
from trajflight.keys import Partition

KEY = Partition("job-a", 1, 5)
SECRET = "k1:0123456789abcdef0123456789abcdef"


@contextlib.contextmanager
def shm_serving(
    limits: StoreLimits | None = None, *, directory: str | None = None, **kwargs: object
) -> Iterator[tuple[StorageServer, StorageClient]]:
    """A storage server with a fresh arena (or one on ``directory``) and a client; both always closed."""
    slab = kwargs.pop("slab_bytes", None)
    credential = kwargs.pop("credential", None)
    arena = ShmArena(directory) if slab is None else ShmArena(directory, slab_bytes=int(slab))  # type: ignore[call-overload]
    with (
        StorageServer(limits=limits, arena=arena, **kwargs) as server,
        StorageClient(server.location, timeout=20, credential=credential) as client,  # type: ignore[arg-type]
    ):
        yield server, client


@dataclass(frozen=True)
class Transport:
    """How a test puts and reads: over Flight or through shared memory."""

    name: str
    put: Callable[..., None]
    get: Callable[..., pa.Table]


def _shm_put(client: StorageClient, key: Partition, data: pa.RecordBatch, **kw: object) -> None:
    client.shm_put_groups([(key, data)], **kw)  # type: ignore[arg-type]


def _local(client: StorageClient) -> StorageClient:
    """The client with its actions on the server's same-host channel (as the public client sets it up)."""
    if client._shm.local is None:
        client.use_local_channel(client.health()["shm_socket"])
    return client


def _inline_put(client: StorageClient, key: Partition, data: pa.RecordBatch, **kw: object) -> None:
    client = _local(client)
    assert client.inline_put_bytes >= data.nbytes  # small test groups travel whole in one shm_put call
    client.shm_put_groups([(key, data)], **kw)  # type: ignore[arg-type]


TRANSPORTS = {
    "flight": Transport(
        "flight", lambda c, k, d, **kw: c.put_groups([(k, d)], **kw), lambda c, r, **kw: c.get(r, **kw)
    ),
    "shm": Transport("shm", _shm_put, lambda c, r, **kw: c.shm_get(r, **kw)),
    "shm-inline": Transport("shm-inline", _inline_put, lambda c, r, **kw: _local(c).shm_get(r, **kw)),
}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> Transport:
    return TRANSPORTS[request.param]


# ------------------------------------------------------------------------------------- data path


def test_same_host_put_and_get_are_bit_exact_and_tensors_alias_the_mapping():
    group = make_group(KEY, k=8, response_len=512)
    with shm_serving() as (server, client):
        client.shm_put_groups([(KEY, group)], writer="rollout-1")
        table = client.shm_get([GroupRead(KEY, LeaseToken(1))])
        assert table.equals(pa.Table.from_batches([group]))
        batch = decode(table, columns=["response_ids", "response_logprobs", "reward"])
        ranges = mapped_ranges(server.arena.directory)
        assert ranges, "the reader maps the segment"
        for name in ("response_ids", "response_logprobs"):
            values = batch.tensors[name].values()
            assert inside(values.data_ptr(), ranges), f"{name} was copied"
            expected = group.column(name).values.to_numpy()
            assert np.array_equal(values.numpy(), expected)
        assert inside(batch.tensors["reward"].data_ptr(), ranges)
        # Remote readers and any plain Flight client read the same group from the same memory.
        assert client.get([KEY]).equals(table)
        raw = flight.FlightClient(server.location)
        assert raw.do_get(flight.Ticket(client.list_groups()[0].ticket)).read_all().equals(table)
        raw.close()
        stats = client.stats()
        assert stats["shm"]["live_segments"] == 1
        assert stats["bytes"] == size_class(stats["bytes"])  # capacity counts the segment's size class


def test_many_groups_in_one_reservation_projection_and_flight_puts_land_in_the_arena_too():
    keys = [Partition("job-a", 1, g) for g in range(4)]
    groups = [make_group(k) for k in keys]
    with shm_serving() as (_, client):
        client.shm_put_groups(list(zip(keys[:3], groups[:3], strict=True)))  # one stream, one segment
        client.put_groups([(keys[3], groups[3])])  # over Flight: copied once into a segment
        assert client.stats()["shm"]["live_segments"] == 2
        table = client.shm_get(keys, columns=["group_id", "reward"])
        assert table.column_names == ["group_id", "reward"]
        assert table.column("group_id").to_pylist() == [g for g in range(4) for _ in range(8)]
        assert client.shm_get(keys).equals(pa.Table.from_batches(groups))
        with pytest.raises(SchemaError, match="no column 'nope'"):
            client.shm_get(keys, columns=["nope"])


def test_a_segment_readers_map_keeps_its_bytes_after_delete_and_is_reused_once_they_let_go():
    group = make_group(KEY, response_len=256, fixed=True)
    with shm_serving() as (server, client):
        client.shm_put_groups([(KEY, group)])
        table = client.shm_get([GroupRead(KEY, LeaseToken(1))])
        path = client._action("shm_open", encode_ticket(KEY), None)["segments"][0]["path"]
        client.delete([GroupRead(KEY, LeaseToken(1))])
        for g in range(20):  # while the reader maps it, new puts of its size never land in it
            other = Partition("job-a", 1, 100 + g)
            client.shm_put_groups([(other, make_group(other, response_len=256, fixed=True))])
            client.delete([GroupRead(other, LeaseToken(1))])
        assert table.equals(pa.Table.from_batches([group]))
        assert client.stats()["shm"]["reclaimed"] == 0
        assert os.path.exists(path)  # draining, not unlinked: the reader's lock keeps it
        del table
        gc.collect()  # the reader's last buffer goes: its mapping, and its lock, with it
        assert server.arena is not None
        assert server.arena.reclaim() == 0  # what the arena's background does every half second
        shm = client.stats()["shm"]
        assert (shm["reclaimed"], shm["draining_segments"]) == (1, 0)
        assert os.path.exists(path)  # back in the pool, pre-faulted, for a later put of its size


def test_put_read_delete_cycles_reuse_a_couple_of_segments_and_keep_the_pool_small():
    """Segments readers mapped come back once they let go; the arena does not also keep a warm spare
    for each of them (that grew the pool by a segment per batch, up to pool_bytes)."""
    with shm_serving() as (server, client):
        assert server.arena is not None
        for g in range(12):
            key = Partition("job-a", 1, g)
            client.shm_put_groups([(key, make_group(key, response_len=256, fixed=True))])
            table = client.shm_get([GroupRead(key, LeaseToken(1))])
            client.delete([GroupRead(key, LeaseToken(1))])
            del table
            gc.collect()
            server.arena.reclaim()
        time.sleep(0.2)  # a refill asked for may still be running
        shm = client.stats()["shm"]
        assert shm["reclaimed"] >= 10
        assert shm["created"] <= 3
        assert shm["free_segments"] <= 2


def test_a_reader_killed_while_it_maps_a_segment_lets_the_server_reuse_it():
    """A reader's lock goes with its process: a SIGKILLed reader leaves nothing pinned."""
    group = make_group(KEY, response_len=256, fixed=True)
    with shm_serving() as (server, client):
        client.shm_put_groups([(KEY, group)])
        segment = client._action("shm_open", encode_ticket(KEY), None)["segments"][0]
        code = (
            "import sys, time\n"
            "from trajflight.flight_server.shm._segment import map_segment\n"
            "mm = map_segment(sys.argv[1], int(sys.argv[2]))\n"
            "print('mapped', flush=True)\n"
            "time.sleep(60)\n"
        )
        argv = [sys.executable, "-c", code, segment["path"], str(segment["capacity"])]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as reader:
            try:
                assert reader.stdout is not None
                assert reader.stdout.readline().strip() == "mapped"
                client.delete([GroupRead(KEY, LeaseToken(1))])
                assert server.arena is not None
                assert server.arena.reclaim() == 1  # the live reader's lock keeps it draining
            finally:
                reader.send_signal(signal.SIGKILL)
                reader.wait(timeout=10)
        assert server.arena.reclaim() == 0
        assert client.stats()["shm"]["reclaimed"] == 1
        assert os.path.exists(segment["path"])  # in the pool for the next put of its size


def test_a_segment_reused_before_a_reader_mapped_it_is_never_read_as_its_old_group():
    """The race the reader's check after mapping closes: the server handed a segment over, then the
    group was deleted and its segment reused for another group before the reader locked and mapped it."""
    group = make_group(KEY, response_len=256, fixed=True)
    with shm_serving() as (_, client):
        client.shm_put_groups([(KEY, group)])
        read = [GroupRead(KEY, LeaseToken(1))]
        opened = client.shm_open(read)  # handed over, not mapped yet
        client.delete(read)
        other = Partition("job-a", 1, 7)
        client.shm_put_groups([(other, make_group(other, response_len=256, fixed=True))])
        assert client.stats()["shm"]["reclaimed"] == 1  # the old group's segment holds the new one now
        with pytest.raises(NotFoundError):
            client.shm_get(read, opened=opened)
        assert opened.mapped == 1  # it mapped the reused segment, and the check after it refused


def encode_ticket(key: Partition) -> bytes:
    from trajflight.flight_server import GetTicket

    return encode(GetTicket((GroupRead(key),)))


def test_segments_nobody_mapped_are_reused_pre_faulted():
    with shm_serving() as (_, client):
        for g in range(10):  # put and delete, never read through shared memory: one segment recycled
            key = Partition("job-a", 1, g)
            client.shm_put_groups([(key, make_group(key, response_len=64, fixed=True))])
            client.delete([GroupRead(key, LeaseToken(1))])
        shm = client.stats()["shm"]
        assert shm["reused"] >= 8
        assert shm["created"] <= 2
        assert shm["live_segments"] == 0


def test_arena_directory_is_private_and_owned_by_one_server(tmp_path):
    directory = str(tmp_path / "arena")
    with shm_serving(directory=directory) as (server, client):
        client.shm_put_groups([(KEY, make_group(KEY))])
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        (name,) = server.arena.files()
        assert stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) == 0o600
        with pytest.raises(ConfigError, match="in use by another live server"):
            ShmArena(directory)
    assert not os.path.exists(directory)  # close unlinks every segment and the directory


# ---------------------------------------------------------------------------- validation, lifecycle


def test_a_segment_that_does_not_hold_a_valid_group_is_refused_and_released():
    group = make_group(KEY)
    with shm_serving() as (_, client):
        put = PutDescriptor(KEY, num_rows=8)
        seg = client._action("shm_reserve", encode(ShmReserveRequest((put,), batch_bytes=4096)), None)[
            "segments"
        ][0]
        with open(seg["path"], "r+b") as f:
            f.write(b"not an arrow stream" * 10)
        with pytest.raises(SchemaError, match="does not hold one Arrow IPC stream"):
            client._action("shm_publish", encode(ShmPublishRequest(((seg["reservation"], 190),))), None)
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["pending_puts"]) == (0, 0, 0)
        assert stats["shm"]["live_segments"] == 0  # released (its writer is done: reusable)
        # A valid stream for another partition is refused by validate_group, as on do_put.
        wrong = Partition("job-a", 1, 6)
        with pytest.raises(SchemaError):
            _shm_put_as(client, KEY, make_group(wrong))
        client.shm_put_groups([(KEY, group)])  # the partition is free again
        assert client.get([KEY]).num_rows == 8
        with pytest.raises(NotFoundError, match="unknown"):  # a reservation publishes once
            client._action("shm_publish", encode(ShmPublishRequest(((seg["reservation"], 190),))), None)


def _shm_put_as(client: StorageClient, key: Partition, data: pa.RecordBatch) -> None:
    """Reserve for ``key`` but write ``data`` (which names another partition)."""
    import pyarrow.ipc as ipc

    sizer = pa.MockOutputStream()
    with ipc.new_stream(sizer, data.schema) as w:
        w.write_batch(data)
    put = PutDescriptor(key, num_rows=data.num_rows)
    reserve = ShmReserveRequest((put,), batch_bytes=sizer.size())
    seg = client._action("shm_reserve", encode(reserve), None)["segments"][0]
    with open(seg["path"], "r+b") as f, ipc.new_stream(f, data.schema) as w:
        w.write_batch(data)
    client._action("shm_publish", encode(ShmPublishRequest(((seg["reservation"], sizer.size()),))), None)


def test_a_writer_killed_mid_write_leaves_nothing_visible_and_nothing_leaked():
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe
    with shm_serving() as (server, client):
        ready = ctx.Event()
        child = ctx.Process(target=killed_writer, args=(server.location, KEY, ready), daemon=True)
        child.start()
        try:
            assert ready.wait(30), "the writer never reserved its segment"
            assert client.stats()["pending_shm_puts"] == 1
            (doomed,) = server.arena.files()
            with pytest.raises(NotFoundError):
                client.get([KEY])
            with pytest.raises(AlreadyExistsError, match="being written"):
                client.shm_put_groups([(KEY, make_group(KEY))])
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        deadline = time.monotonic() + 10
        while client.stats()["pending_shm_puts"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = client.stats()
        held = (stats["groups"], stats["bytes"], stats["reserved_bytes"], stats["pending_puts"])
        assert held == (0, 0, 0, 0)
        assert stats["shm"]["live_segments"] == 0
        files = server.arena.files()
        assert doomed not in files, "the half-written segment is unlinked, never reused"
        assert len(files) == client.stats()["shm"]["free_segments"]  # only fresh, pre-faulted spares
        client.shm_put_groups([(KEY, make_group(KEY))])
        assert client.get([KEY]).num_rows == 8


def _reap(proc: subprocess.Popen[str]) -> None:
    """A server process a test started is gone (killed if it still runs) and its pipe closed."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _start_server(directory: str) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "trajflight", "server", "--shm-dir", directory, "--shutdown-grace", "1s"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_restarted_server_sweeps_the_segments_of_its_dead_incarnation(tmp_path):
    directory = str(tmp_path / "arena")
    proc, location = _start_server(directory)
    try:
        with StorageClient(location, timeout=20) as client:
            keys = [Partition("job-a", 1, g) for g in range(3)]
            for k in keys:  # a segment each
                client.shm_put_groups([(k, make_group(k))])
            table = client.shm_get(keys)  # a reader that outlives the server
            held = [GroupRead(k, LeaseToken(1)) for k in keys]
            opened = client.shm_open(held)  # and a lease's open, kept across the crash...
            assert client.shm_get(held, opened=opened).num_rows == 24  # ...with its segments mapped
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        orphans = [n for n in os.listdir(directory) if n.startswith("seg-")]
        assert len(orphans) == 3
    finally:
        _reap(proc)
    proc, location = _start_server(directory)
    try:
        with StorageClient(location, timeout=20) as client:
            assert client.stats()["shm"]["swept_at_start"] == 3
            assert [n for n in os.listdir(directory) if n.startswith("seg-")] == []
            assert client.stats()["groups"] == 0
            client.use_local_channel(client.health()["shm_socket"])
            with pytest.raises(NotFoundError):  # the new incarnation's board: the kept open is asked again
                client.shm_get(held, opened=opened)
        assert table.equals(pa.Table.from_batches([make_group(k) for k in keys]))  # still mapped
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    assert not os.path.exists(directory)


def test_an_auto_named_arena_removes_the_directories_of_killed_servers_and_only_those():
    """A killed server's auto-named directory is never started on again: the next auto-named arena
    removes it (with its segments), and leaves a live server's directory alone however old."""
    proc, location = _start_server("auto")
    try:
        with StorageClient(location, timeout=20) as client:
            client.shm_put_groups([(KEY, make_group(KEY))])
            dead = str(client.stats()["shm"]["dir"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _reap(proc)
    assert [n for n in os.listdir(dead) if n.startswith("seg-")]  # left behind, holding its memory
    live = ShmArena()
    try:
        old = time.time() - 2 * ORPHAN_AGE
        for directory in (dead, live.directory):
            os.utime(directory, (old, old))
        fresh = ShmArena()
        try:
            assert fresh.dead_swept >= 1
            assert not os.path.exists(dead)
            assert os.path.isdir(live.directory)  # its server holds the lock: alive, however old
        finally:
            fresh.close()
    finally:
        live.close()


def test_only_dead_auto_named_arena_directories_left_untouched_for_a_while_are_removed(tmp_path):
    def arena_dir(name: str, *, age: float) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / ".lock").touch()
        (path / "seg-x-0").write_bytes(b"x")
        os.utime(path, (time.time() - age, time.time() - age))
        return str(path)

    young = arena_dir("trajflight-" + "a" * 32, age=1.0)  # maybe a server starting right now
    dead = arena_dir("trajflight-" + "b" * 32, age=2 * ORPHAN_AGE)
    named = arena_dir("my-arena", age=2 * ORPHAN_AGE)  # a --shm-dir of the user's: never touched
    assert sweep_dead_arenas(str(tmp_path)) == 1
    assert (os.path.exists(young), os.path.exists(dead), os.path.exists(named)) == (True, False, True)


def test_a_cluster_s_directory_of_server_arenas_goes_only_when_all_its_servers_are_dead(tmp_path):
    """LocalCluster's layout, trajflight-<uuid>/server-<i>/: the whole directory goes once no server
    holds its lock; one live server keeps it; a directory holding only empty directories goes too; one
    with files but no lock is not an arena and stays."""
    old = time.time() - 2 * ORPHAN_AGE

    def cluster_dir(name: str, servers: int) -> str:
        root = tmp_path / name
        for i in range(servers):
            (root / f"server-{i}").mkdir(parents=True)
            (root / f"server-{i}" / ".lock").touch()
            (root / f"server-{i}" / "seg-x-0").write_bytes(b"x")
        os.utime(root, (old, old))
        return str(root)

    crashed = cluster_dir("trajflight-" + "c" * 32, 2)
    running = cluster_dir("trajflight-" + "d" * 32, 2)
    emptied = tmp_path / ("trajflight-" + "e" * 32)
    (emptied / "server-0").mkdir(parents=True)
    os.utime(emptied, (old, old))
    foreign = tmp_path / ("trajflight-" + "f" * 32)
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not an arena")
    os.utime(foreign, (old, old))
    held = os.open(os.path.join(running, "server-1", ".lock"), os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # server-1 of that cluster is alive
        assert sweep_dead_arenas(str(tmp_path)) == 2
        assert not os.path.exists(crashed)
        assert not os.path.exists(emptied)
        assert os.path.isdir(running)
        assert os.path.isdir(foreign)
    finally:
        os.close(held)
    os.utime(running, (old, old))
    assert sweep_dead_arenas(str(tmp_path)) == 1
    assert not os.path.exists(running)
    assert os.path.isdir(foreign)


def test_the_owner_of_a_killed_server_removes_its_arena_at_once_and_never_a_live_one(tmp_path):
    """RayCluster.close() removes the arenas of server actors it killed (they could not close them),
    without the sweep's wait for ORPHAN_AGE; a live server's arena, a missing path or a directory without
    a lock stays."""
    live = ShmArena(str(tmp_path / "live"))
    try:
        assert not remove_dead_arena(live.directory)  # its server holds the lock
        assert os.path.isdir(live.directory)
    finally:
        live.close()
    killed = tmp_path / ("trajflight-" + "9" * 32)
    killed.mkdir()
    (killed / ".lock").touch()  # its server died: nobody holds the lock
    (killed / "seg-x-0").write_bytes(b"x")
    assert remove_dead_arena(str(killed))
    assert not killed.exists()
    assert not remove_dead_arena(str(killed))  # gone already
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "a.txt").write_text("not an arena")
    assert not remove_dead_arena(str(foreign))
    assert foreign.exists()


def test_a_server_without_an_arena_refuses_shm_calls_with_a_hint():
    with StorageServer() as server, StorageClient(server.location) as client:
        assert client.health()["shm_dir"] is None
        with pytest.raises(InvalidRequestError, match="no shared-memory arena"):
            client.shm_put_groups([(KEY, make_group(KEY))])
        client.put_groups([(KEY, make_group(KEY))])
        with pytest.raises(InvalidRequestError, match="no shared-memory arena"):
            client.shm_get([KEY])


# ---------------------------------------------------------- every fencing rule, on both transports


def test_put_under_a_fenced_epoch_is_refused(transport):
    old = Partition("job-a", 0, 1)
    with shm_serving() as (_, client):
        client.fence("job-a", 1)
        with pytest.raises(StaleFenceError, match="epoch 0 of job 'job-a' is fenced"):
            transport.put(client, old, make_group(old))
        transport.put(client, KEY, make_group(KEY))
        other = Partition("job-b", 0, 1)
        transport.put(client, other, make_group(other))
        assert client.stats()["reserved_bytes"] == 0


def test_a_fence_raised_between_reserve_and_publish_refuses_the_publish():
    with shm_serving() as (_, client):
        group = make_group(KEY)
        import pyarrow.ipc as ipc

        sizer = pa.MockOutputStream()
        with ipc.new_stream(sizer, group.schema) as w:
            w.write_batch(group)
        put = PutDescriptor(KEY, num_rows=8)
        reserve = ShmReserveRequest((put,), batch_bytes=sizer.size())
        seg = client._action("shm_reserve", encode(reserve), None)["segments"][0]
        with open(seg["path"], "r+b") as f, ipc.new_stream(f, group.schema) as w:
            w.write_batch(group)
        client.fence("job-a", 2)
        with pytest.raises(StaleFenceError):
            client._action(
                "shm_publish", encode(ShmPublishRequest(((seg["reservation"], sizer.size()),))), None
            )
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["shm"]["live_segments"]) == (0, 0, 0)


def test_a_group_is_never_overwritten(transport):
    with shm_serving() as (_, client):
        TRANSPORTS["shm"].put(client, KEY, make_group(KEY))
        with pytest.raises(AlreadyExistsError, match="already stored"):
            transport.put(client, KEY, make_group(KEY, seed=1))


def test_reads_with_a_stale_token_are_refused_and_newer_reads_raise_the_fence(transport):
    with shm_serving() as (_, client):
        transport.put(client, KEY, make_group(KEY))
        transport.get(client, [GroupRead(KEY, LeaseToken(1))])
        transport.get(client, [GroupRead(KEY, LeaseToken(2))])
        with pytest.raises(StaleFenceError, match="generation 1 is older than generation 2"):
            transport.get(client, [GroupRead(KEY, LeaseToken(1))])
        # The fence is shared: a read on one path raises it for the other.
        other = TRANSPORTS["flight" if transport.name == "shm" else "shm"]
        with pytest.raises(StaleFenceError):
            other.get(client, [GroupRead(KEY, LeaseToken(1))])
        assert transport.get(client, [KEY]).num_rows == 8  # tokenless reads (analysts) stay open


def test_an_open_is_read_again_without_a_call_while_the_fence_board_shows_nothing_changed():
    group = make_group(KEY)
    ref = pa.table({"ref_logprob": pa.array([0.5] * 8, pa.float32())})
    with shm_serving() as (_, client):
        client.shm_put_groups([(KEY, group)])
        held = [GroupRead(KEY, LeaseToken(3))]
        opened = client.shm_open(held)
        calls: list[str] = []
        action = client._action

        def counted(name: str, body: bytes, timeout: float | None) -> dict[str, object]:
            calls.append(name)
            return action(name, body, timeout)

        client._action = counted  # type: ignore[method-assign]
        again = client.shm_get(held, opened=opened)
        assert again.equals(pa.Table.from_batches([group]))
        assert calls == []  # the board answered
        # An append changes the group's tag: the next read opens it again and sees the new column.
        client.append_columns(KEY, ref, LeaseToken(3))
        assert client.shm_get(held, opened=opened).column_names[-1] == "ref_logprob"
        assert calls == ["shm_open"]
        # A re-granted lease and a delete change the board too; the server then refuses the old holder.
        reopened = client.shm_open(held)
        client.advance_generation([GroupRead(KEY, LeaseToken(4))])
        with pytest.raises(StaleFenceError):
            client.shm_get(held, opened=reopened)
        newest = [GroupRead(KEY, LeaseToken(4))]
        latest = client.shm_open(newest)
        assert client.shm_get(newest, opened=latest).num_rows == 8
        assert client.delete(newest)["deleted"] == 1
        with pytest.raises(NotFoundError):
            client.shm_get(newest, opened=latest)


def test_reading_back_the_opened_reads_themselves_gives_what_fresh_reads_give():
    keys = [Partition("job-a", 1, g) for g in range(3)]
    groups = [make_group(k) for k in keys]
    with shm_serving() as (_, client):
        client.shm_put_groups(list(zip(keys, groups, strict=True)))
        opened = client.shm_open([GroupRead(k, LeaseToken(2)) for k in keys])
        same, fresh = opened.reads, tuple(GroupRead(k, LeaseToken(2)) for k in keys)
        assert same is not fresh
        for columns in (None, ["reward", "response_ids"], ["reward"]):
            assert client.shm_get(same, columns=columns, opened=opened).equals(
                client.shm_get(fresh, columns=columns, opened=opened)
            )
        assert client.shm_get(fresh[1:], opened=opened).num_rows == 16  # a subset: per-group path
        with pytest.raises(SchemaError):  # a column no group has: asked again, the server names it
            client.shm_get(same, columns=["nope"], opened=opened)


def test_a_joined_batch_is_put_as_one_segment_and_its_rows_must_add_up():
    keys = [Partition("job-a", 1, g) for g in range(3)]
    groups = [make_group(k) for k in keys]
    joined = pa.concat_batches(groups)
    with shm_serving() as (_, client):
        with pytest.raises(InvalidRequestError, match="add up"):
            client.shm_put_groups(list(zip(keys[:2], groups[:2], strict=True)), joined=joined)
        with pytest.raises(InvalidRequestError, match="add up"):
            client.shm_put_groups([(keys[0], groups[0].slice(0, 0)), (keys[1], joined)], joined=joined)
        # Rows that do not carry the key they are announced under are refused by the server, whole.
        with pytest.raises(SchemaError):
            client.shm_put_groups(
                [(keys[1], groups[1]), (keys[0], groups[0]), (keys[2], groups[2])], joined=joined
            )
        assert client.stats()["groups"] == 0
        client.shm_put_groups(list(zip(keys, groups, strict=True)), joined=joined)
        table = client.shm_get(keys)
        assert table.equals(pa.Table.from_batches([joined]))
        assert table.column("reward").num_chunks == 1  # one segment, one slice
        assert client.stats()["shm"]["live_segments"] == 1


def _segment_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("seg-"))


def test_small_groups_are_packed_into_slabs_and_read_back_bit_exact_from_a_few_mappings():
    keys = [Partition("job-a", 1, g) for g in range(24)]
    groups = [make_group(k, seed=g) for g, k in enumerate(keys)]
    with shm_serving(slab_bytes=64 * 1024) as (server, client):
        _local(client)
        for key, group in zip(keys, groups, strict=True):
            client.shm_put_groups([(key, group)])
        assert server.arena is not None
        held = [GroupRead(k, LeaseToken(1)) for k in keys]
        opened = client.shm_open(held)
        slabs = sorted({os.path.basename(path) for path, *_ in opened._segments})
        assert 1 < len(slabs) < len(keys) // 2  # several groups per slab, more than one slab
        table = client.shm_get(held, opened=opened)
        assert table.equals(pa.Table.from_batches(groups))
        assert len(opened._maps) == len(slabs)  # one mapping per slab, not one per group
        # Deleting some groups leaves the others of their slab readable, with nothing copied.
        assert client.delete([GroupRead(k, LeaseToken(1)) for k in keys[::2]])["deleted"] == 12
        assert client.shm_get(keys[1::2]).equals(pa.Table.from_batches(groups[1::2]))
        assert client.delete([GroupRead(k, LeaseToken(1)) for k in keys[1::2]])["deleted"] == 12
        stats = client.stats()
        assert (stats["groups"], stats["bytes"], stats["shm"]["live_segments"]) == (0, 0, 0)
        # The full slabs were handed to a reader that still maps them: they drain, kept as they are and
        # not reused; the reader's table is intact. Once it lets go, a put takes them back.
        current = server.arena._slab
        full = [name for name in slabs if current is None or name != current.name]
        assert len(full) >= 1
        assert set(full) <= set(_segment_files(server.arena.directory))
        assert stats["shm"]["draining_segments"] >= len(full)
        assert table.equals(pa.Table.from_batches(groups))
        del table, opened
        gc.collect()
        assert server.arena.reclaim() == 0  # (the arena's background also looks every half second)
        shm = client.stats()["shm"]
        assert (shm["draining_segments"], shm["reclaimed"] >= len(full)) == (0, True)


def test_a_slab_kept_alive_by_one_group_still_counts_against_capacity():
    """Deleted groups of a full slab that another group keeps alive still occupy tmpfs: capacity counts
    them (stranded bytes) until the slab's last group goes, so it keeps bounding the arena's memory."""
    keys = [Partition("job-a", 1, g) for g in range(40)]
    groups = [make_group(k, response_len=64, fixed=True) for k in keys]
    with shm_serving(slab_bytes=64 * 1024) as (_, client):
        _local(client)
        placed = []
        for key, group in zip(keys, groups, strict=True):
            client.shm_put_groups([(key, group)])
            placed.append(key)
            if client.stats()["shm"]["stranded_bytes"]:  # the first slab was retired (full)
                break
        opened = client.shm_open(placed)
        first = opened._segments[opened._groups[placed[0]][1][0][0]][0]
        in_first = [k for k in placed if opened._segments[opened._groups[k][1][0][0]][0] == first]
        assert 2 < len(in_first) < len(placed)
        tail = client.stats()["shm"]["stranded_bytes"]  # the retired slab's unused tail
        client.delete([GroupRead(k, LeaseToken(1)) for k in in_first[1:]])  # in_first[0] keeps it alive
        stats = client.stats()
        per_group = stats["bytes"] // (len(placed) - len(in_first) + 1)
        assert stats["shm"]["stranded_bytes"] == tail + per_group * (len(in_first) - 1)
        client.delete([GroupRead(in_first[0], LeaseToken(1))])  # the slab's last group: all of it goes
        assert client.stats()["shm"]["stranded_bytes"] == 0


def test_stranded_slab_bytes_can_refuse_a_put_until_the_slab_goes():
    keys = [Partition("job-a", 1, g) for g in range(8)]
    groups = [make_group(k, response_len=64, fixed=True) for k in keys]
    with shm_serving(slab_bytes=32 * 1024) as (_, probe):
        _local(probe)
        probe.shm_put_groups([(keys[0], groups[0])])
        one = probe.stats()["bytes"]  # what one packed group counts
    per_slab = (32 * 1024) // one
    assert per_slab >= 2
    # Room for exactly one slab's worth of groups plus one.
    with shm_serving(
        StoreLimits(capacity_bytes=one * (per_slab + 1), retry_after=0.1), slab_bytes=32 * 1024
    ) as (
        _,
        client,
    ):
        _local(client)
        for key, group in zip(keys[: per_slab + 1], groups, strict=False):  # the last one retires slab 1
            client.shm_put_groups([(key, group)])
        client.delete([GroupRead(k, LeaseToken(1)) for k in keys[1:per_slab]])  # keys[0] pins slab 1
        stats = client.stats()
        assert stats["bytes"] == 2 * one  # keys[0] and the group in slab 2...
        assert stats["shm"]["stranded_bytes"] > one  # ...but slab 1's freed space is still in tmpfs
        with pytest.raises(CapacityExceededError, match="server full"):
            client.shm_put_groups([(keys[per_slab + 1], groups[per_slab + 1])])
        client.delete([GroupRead(keys[0], LeaseToken(1))])  # slab 1 goes: its bytes come back
        client.shm_put_groups([(keys[per_slab + 1], groups[per_slab + 1])])


def test_concurrent_small_puts_never_share_bytes():
    keys = [Partition("job-a", 1, g) for g in range(32)]
    groups = [make_group(k, seed=g, response_len=200) for g, k in enumerate(keys)]
    with shm_serving(slab_bytes=128 * 1024) as (_, client):
        _local(client)

        def put(i: int) -> None:
            client.shm_put_groups([(keys[i], groups[i])])

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(put, range(len(keys))))
        for key, group in zip(keys, groups, strict=True):
            assert client.shm_get([key]).equals(pa.Table.from_batches([group]))


@pytest.mark.parametrize("inline", [True, False], ids=["slabs", "segments"])
def test_concurrent_puts_reads_and_deletes_never_return_another_groups_bytes(inline: bool):
    """Small puts (packed into slabs, or each in a segment of its own), reads through kept opens (the fence
    board) and deletes, all at once for about two seconds, with segments reused as soon as no reader maps
    them: every read is bit-exact or refused (gone, or superseded), never wrong."""
    expected: dict[Partition, pa.Table] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + 2.0
    outcomes = {"read": 0, "refused": 0, "wrong": 0}
    failures: list[BaseException] = []

    def tally(outcome: str) -> None:
        with lock:
            outcomes[outcome] += 1

    def guarded(target: Callable[..., None]) -> Callable[..., None]:
        def run(*args: object) -> None:
            try:
                target(*args)
            except BaseException as exc:  # any failure of a worker fails the test
                failures.append(exc)

        return run

    with shm_serving(StoreLimits(capacity_bytes=1 << 30), slab_bytes=96 * 1024) as (server, _):

        def connected() -> StorageClient:
            client = StorageClient(server.location, timeout=20, inline_put_bytes=256 * 1024 if inline else 0)
            return _local(client)

        def writer(wid: int) -> None:
            with connected() as client:
                for n in itertools.count():
                    if time.monotonic() > deadline:
                        return
                    key = Partition("job-a", 1, wid * 1_000_000 + n)
                    group = make_group(key, seed=n % 50, response_len=(16, 64, 300)[n % 3])
                    client.shm_put_groups([(key, group)])
                    with lock:
                        expected[key] = pa.Table.from_batches([group])

        def reader(first: int) -> None:
            rng = random.Random(first)
            with connected() as client:
                for generation in itertools.count(first, 2):
                    if time.monotonic() > deadline:
                        return
                    with lock:
                        keys = rng.sample(sorted(expected), min(8, len(expected)))
                        want = [expected[k] for k in keys]
                    if not keys:
                        continue
                    reads = [GroupRead(k, LeaseToken(generation)) for k in keys]
                    try:
                        opened = client.shm_open(reads)
                        tables = [client.shm_get(reads, opened=opened) for _ in range(2)]
                    except (NotFoundError, StaleFenceError):
                        tally("refused")
                        continue
                    whole = pa.concat_tables(want)
                    tally("read" if all(t.equals(whole) for t in tables) else "wrong")

        def deleter() -> None:
            rng = random.Random(7)
            with connected() as client:
                while time.monotonic() < deadline:
                    with lock:
                        keys = rng.sample(sorted(expected), 5) if len(expected) > 20 else []
                        for k in keys:
                            del expected[k]
                    if keys:
                        client.delete([GroupRead(k, LeaseToken(2**40)) for k in keys])
                    time.sleep(0.002)

        threads = [threading.Thread(target=guarded(writer), args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=guarded(reader), args=(i,)) for i in (1, 2)]
        threads.append(threading.Thread(target=guarded(deleter)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert failures == []
    assert outcomes["wrong"] == 0
    assert outcomes["read"] > 0
    assert server.arena is not None
    assert server.arena.reclaimed > 0  # segments readers had mapped were reused meanwhile


def test_a_column_appended_to_a_group_of_a_shared_stream_reads_back_with_that_groups_rows():
    """Regression: the appended group forgot its first row in the batch's stream (read the first group's)."""
    keys = [Partition("job-a", 1, g) for g in range(3)]
    groups = [make_group(k) for k in keys]
    extra = pa.table({"ref_logprob": pa.array([float(i) for i in range(8)], pa.float32())})
    with shm_serving() as (_, client):
        client.shm_put_groups(list(zip(keys, groups, strict=True)))
        client.append_columns(keys[1], extra, LeaseToken(1))
        for read in (client.shm_get, client.get):
            table = read([GroupRead(keys[1], LeaseToken(1))])
            assert table.drop_columns(["ref_logprob"]).equals(pa.Table.from_batches([groups[1]]))
            assert table.column("ref_logprob").to_pylist() == [float(i) for i in range(8)]


def test_a_restarted_server_replaces_its_fence_board_so_kept_opens_go_back_to_it(tmp_path):
    held = [GroupRead(KEY, LeaseToken(1))]
    with shm_serving(directory=str(tmp_path / "arena")) as (_, client):
        client.shm_put_groups([(KEY, make_group(KEY))])
        opened = client.shm_open(held)
        assert client.shm_get(held, opened=opened).num_rows == 8
    with (
        shm_serving(directory=str(tmp_path / "arena")) as (_, client),
        pytest.raises(NotFoundError),  # the old board is gone: asked, the new server has no group
    ):
        client.shm_get(held, opened=opened)


@pytest.mark.parametrize("size", [-1, 2**30])
def test_an_inline_put_limit_the_channel_cannot_carry_is_refused_up_front(size):
    with pytest.raises(InvalidRequestError, match="inline_put_bytes must be between 0 and"):
        StorageClient("grpc://127.0.0.1:1", inline_put_bytes=size)


def test_an_inline_put_that_does_not_match_its_body_or_hold_a_group_leaves_nothing():
    group = make_group(KEY)
    with shm_serving() as (server, client):
        channel = _local(client)._shm.local
        assert channel is not None
        stream = pa.BufferOutputStream()
        with pa.ipc.new_stream(stream, group.schema) as writer:
            writer.write_batch(group)
        payload = stream.getvalue()

        def body(nbytes: int) -> bytes:
            return encode(ShmReserveRequest((PutDescriptor(KEY, "w", nbytes, 8),), "w"))

        with pytest.raises(InvalidRequestError, match="announces"):
            channel.call("shm_put", body(payload.size + 1), 5, payload=payload)
        with pytest.raises(InvalidRequestError, match="takes no payload"):
            channel.call("health", b"", 5, payload=payload)
        garbage = pa.py_buffer(b"\xff" * payload.size)
        with pytest.raises(SchemaError, match="IPC stream"):
            channel.call("shm_put", body(payload.size), 5, payload=garbage)
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["pending_shm_puts"]) == (0, 0, 0)
        assert stats["shm"]["live_segments"] == 0
        assert stats["shm"]["slab_streams"] == 0  # the slab small groups are packed into holds nothing
        channel.call("shm_put", body(payload.size), 5, payload=payload)  # the right bytes go through
        assert client.stats()["shm"]["slab_streams"] == 1
        assert client.shm_get([KEY]).equals(pa.Table.from_batches([group]))
        assert server.arena is not None


def test_advanced_generations_and_deletes_fence_readers(transport):
    with shm_serving() as (_, client):
        transport.put(client, KEY, make_group(KEY))
        client.advance_generation([GroupRead(KEY, LeaseToken(4))])
        with pytest.raises(StaleFenceError):
            transport.get(client, [GroupRead(KEY, LeaseToken(3))])
        assert client.delete([GroupRead(KEY, LeaseToken(4))])["deleted"] == 1
        with pytest.raises(NotFoundError):
            transport.get(client, [GroupRead(KEY, LeaseToken(5))])
        assert client.stats()["bytes"] == 0


def test_capacity_refusal_carries_a_retry_hint_and_recovers_after_delete(transport):
    keys = [Partition("job-a", 0, g) for g in range(3)]
    groups = [make_group(k, response_len=256, fixed=True) for k in keys]
    with shm_serving() as (_, probe):
        transport.put(probe, keys[0], groups[0])  # what one group counts on this path (a packed small
        segment = probe.stats()["bytes"]  # group: its stream rounded to 64 bytes; else the size class)
    with shm_serving(StoreLimits(capacity_bytes=int(segment * 2.5), retry_after=0.25)) as (_, client):
        transport.put(client, keys[0], groups[0])
        transport.put(client, keys[1], groups[1])
        with pytest.raises(CapacityExceededError, match="server full") as info:
            transport.put(client, keys[2], groups[2])
        assert info.value.retry_after == 0.25
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["pending_shm_puts"]) == (2, 0, 0)
        assert client.delete([GroupRead(keys[0], LeaseToken(1))])["bytes_freed"] == segment
        transport.put(client, keys[2], groups[2])


def test_column_appends_reach_shm_readers_and_are_fenced(transport):
    group = make_group(KEY)
    ref = pa.table({"ref_logprob": pa.array([0.5] * 8, pa.float32())})
    with shm_serving() as (_, client):
        transport.put(client, KEY, group)
        client.append_columns(KEY, ref, LeaseToken(3))
        table = transport.get(client, [GroupRead(KEY, LeaseToken(3))])
        assert table.column_names[-1] == "ref_logprob"
        assert table.drop_columns(["ref_logprob"]).equals(pa.Table.from_batches([group]))
        only = transport.get(client, [KEY], columns=["ref_logprob"])
        assert only.column(0).to_pylist() == [0.5] * 8
        with pytest.raises(StaleFenceError):
            transport.get(client, [GroupRead(KEY, LeaseToken(2))])


def test_a_restored_job_reaches_old_epoch_groups_under_new_generations(transport):
    with shm_serving() as (_, client):
        transport.put(client, KEY, make_group(KEY))
        transport.get(client, [GroupRead(KEY, LeaseToken(3))])
        client.fence("job-a", KEY.epoch + 1)
        late = Partition("job-a", KEY.epoch, 99)
        with pytest.raises(StaleFenceError, match="fenced"):
            transport.put(client, late, make_group(late))
        client.advance_generation([GroupRead(KEY, LeaseToken(10))])
        assert transport.get(client, [GroupRead(KEY, LeaseToken(10))]).num_rows == 8
        with pytest.raises(StaleFenceError):
            transport.get(client, [GroupRead(KEY, LeaseToken(3))])


def test_with_a_deployment_secret_each_transport_needs_a_token_with_the_right_role(transport):
    ring = Keyring.from_secret(SECRET)
    with shm_serving(keyring=ring, credential=ring.mint("w", "writer", ["job-a"])) as (server, writer):
        with (
            StorageClient(server.location, timeout=20) as anonymous,
            pytest.raises(AuthenticationError, match="no credential") as info,
        ):
            transport.put(anonymous, KEY, make_group(KEY))
        assert info.value.reason == "missing"
        other = Partition("job-b", 1, 5)
        with pytest.raises(PermissionDeniedError, match="outside the credential's jobs"):
            transport.put(writer, other, make_group(other))
        assert writer.stats()["pending_shm_puts"] == 0
        transport.put(writer, KEY, make_group(KEY))
        with pytest.raises(PermissionDeniedError, match="needs role trainer or reader"):
            transport.get(writer, [GroupRead(KEY, LeaseToken(7))])
        trainer = ring.mint("t", "trainer", ["job-a"])
        with StorageClient(server.location, timeout=20, credential=trainer) as reader:
            assert transport.get(reader, [GroupRead(KEY, LeaseToken(7))]).num_rows == 8


def test_a_batch_written_as_one_stream_is_read_back_as_one_chunk_and_freed_with_its_last_group():
    keys = [Partition("job-a", 1, g) for g in range(5)]
    groups = [make_group(k, response_len=128) for k in keys]
    with shm_serving() as (server, client):
        client.shm_put_groups(list(zip(keys, groups, strict=True)))
        shm = client.stats()["shm"]
        assert shm["live_segments"] == 1
        assert client.stats()["bytes"] == shm["live_bytes"]  # the groups' shares add up to the segment
        table = client.shm_get([GroupRead(k, LeaseToken(1)) for k in keys])
        assert table.equals(pa.Table.from_batches(groups))
        assert table.column("response_ids").num_chunks == 1  # one slice: decode joins nothing
        values = decode(table, columns=["response_ids"]).tensors["response_ids"].values()
        assert inside(values.data_ptr(), mapped_ranges(server.arena.directory))
        shuffled = [keys[3], keys[0], keys[4]]
        expected = pa.Table.from_batches([groups[3], groups[0], groups[4]])
        assert client.shm_get(shuffled).equals(expected)
        assert client.get(shuffled).equals(expected)  # Flight readers are served from the same segment
        client.delete([GroupRead(k, LeaseToken(1)) for k in keys[:4]])
        assert client.stats()["shm"]["live_segments"] == 1  # still held by the last group
        assert client.shm_get([keys[4]]).equals(pa.Table.from_batches([groups[4]]))
        client.delete([GroupRead(keys[4], LeaseToken(1))])
        stats = client.stats()
        assert (stats["bytes"], stats["shm"]["live_segments"]) == (0, 0)
        assert table.equals(pa.Table.from_batches(groups))  # the reader's mapping outlives the segment


def test_a_batch_with_one_bad_group_is_refused_whole_naming_the_group():
    keys = [Partition("job-a", 1, g) for g in range(4)]
    groups = [make_group(k) for k in keys]
    with shm_serving() as (_, client):
        swapped = [groups[0], groups[1], groups[3], groups[2]]  # rows of groups 2 and 3 swapped
        with pytest.raises(SchemaError, match="group_id"):
            client.shm_put_groups(list(zip(keys, swapped, strict=True)))
        stats = client.stats()
        assert (stats["groups"], stats["reserved_bytes"], stats["shm"]["live_segments"]) == (0, 0, 0)
        index = groups[1].schema.get_field_index("response_logprobs")
        ragged = groups[1].set_column(index, "response_logprobs", groups[2].column(index))  # other lengths
        with pytest.raises(SchemaError, match="response_logprobs"):
            client.shm_put_groups([(keys[0], groups[0]), (keys[1], ragged)])
        assert client.stats()["groups"] == 0
        client.shm_put_groups(list(zip(keys, groups, strict=True)))
        assert client.shm_get(keys).equals(pa.Table.from_batches(groups))


def test_an_inline_put_whose_metadata_outgrows_the_room_left_for_it_is_measured_and_sent(monkeypatch):
    """The inline stream is written in one pass into its buffers' bytes plus room for the metadata; a
    stream needing more (many columns, say) is sized exactly and written again, bytes unchanged."""
    from trajflight.flight_server.shm import _client

    measured = []
    exact = _client.serialize_segment
    monkeypatch.setattr(_client, "_STREAM_ROOM", 0)
    monkeypatch.setattr(_client, "serialize_segment", lambda *a: measured.append(1) or exact(*a))
    group = make_group(KEY)
    with shm_serving() as (_server, client):
        _inline_put(client, KEY, group)
        assert measured == [1]  # the first pass ran out of room
        assert client.stats()["shm"]["slab_streams"] == 1  # it went inline, packed into the slab
        assert client.shm_get([KEY]).equals(pa.Table.from_batches([group]))
