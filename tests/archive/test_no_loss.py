"""Archiving loses nothing and writes nothing twice: failed deletes, controller restarts on either side
of a file's rename, a storage-server kill, and an archive target that cannot be written."""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

import trajflight
from trajflight._stats import collect, format_table
from trajflight.analytics import scan

from .conftest import commit_all, put_groups, wait_for

GROUPS = 6
SAMPLES = 3  # rows per rich group


def _ids(root: Any, job: str) -> Counter[str]:
    table = scan(root, job=job, columns=["sample_id"]).to_table()
    return Counter(table.column("sample_id").to_pylist())


def _data_files(root: str) -> list[str]:
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if not d.endswith("_manifests")
    )


def _manifests(root: str) -> list[str]:
    folder = os.path.join(root, "_manifests")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _status(cluster: trajflight.LocalCluster) -> dict[str, Any]:
    assert cluster.archive is not None
    return cluster.archive.status()


class FailingDeletes:
    """Wraps the archive's batched deleter: fails every call while ``failing`` is set (the crash window
    after a rename); ``failed`` counts the groups of the failed calls."""

    def __init__(self, delete_groups: Any) -> None:
        self.delete_groups = delete_groups
        self.failing = threading.Event()
        self.failing.set()
        self.failed = 0

    def __call__(self, work: Any) -> Any:
        if self.failing.is_set():
            self.failed += len(work)
            raise ConnectionError("injected: the delete did not reach the server")
        return self.delete_groups(work)


def test_failed_deletes_after_the_rename_are_retried_without_a_second_file(tmp_path, job):
    """Issue 17: a delete that fails after its group's file is durable keeps the group on the GC list;
    the retry must only delete it, never archive it into a second file (rows counted by sample_id)."""
    with trajflight.LocalCluster(servers=2, processes=False, archive=tmp_path, archive_flush=0.2) as cluster:
        assert cluster.archive is not None
        deletes = FailingDeletes(cluster.archive._delete_groups)
        cluster.archive._delete_groups = deletes
        with cluster.client() as client:
            put_groups(client, job, GROUPS)
            commit_all(client, job, GROUPS)
            wait_for(lambda: deletes.failed >= GROUPS, what="the injected delete failures")
            files = _data_files(str(tmp_path))
            deletes.failing.clear()
            assert cluster.wait_idle(job, timeout=30.0) == (0, 0)
        assert _status(cluster)["rewrites"] == 0
        assert _status(cluster)["files"] == len(files)  # each file written once, none again
    assert _data_files(str(tmp_path)) == files
    ids = _ids(tmp_path, job)
    assert len(ids) == GROUPS * SAMPLES
    assert set(ids.values()) == {1}
    assert _manifests(str(tmp_path)) == []


@pytest.mark.parametrize("window", ["after-rename", "before-rename"])
def test_a_controller_restart_mid_archive_loses_and_duplicates_nothing(tmp_path, job, window):
    """Issue 17: the controller crashes (restarts from its journal) either after a batch's file was
    renamed but before its deletes, or after its manifest but before its file. Its successor hands the
    same deletes out again; the archive must end with every sample exactly once."""
    root = tmp_path / "archive"
    with trajflight.LocalCluster(
        servers=2, processes=False, archive=root, archive_flush=0.2, state_dir=tmp_path / "state"
    ) as cluster:
        archive = cluster.archive
        assert archive is not None
        deletes = FailingDeletes(archive._delete_groups)
        archive._delete_groups = deletes
        if window == "before-rename":

            def no_file(*_: Any) -> None:
                raise OSError("injected: the process died before the rename")

            archive._write_file = no_file  # type: ignore[method-assign]
        with cluster.client() as client:
            put_groups(client, job, GROUPS)
            commit_all(client, job, GROUPS)
        wait_for(
            lambda: deletes.failed >= GROUPS or archive.status()["failures"] >= 1,
            what="the injected failure",
        )
        assert len(_manifests(str(root))) >= 1
        cluster.restart_controller()  # a fresh Archive: it knows the batch only from its manifest
        assert cluster.wait_idle(job, timeout=30.0) == (0, 0)
        status = _status(cluster)
    assert status["files"] == (0 if window == "after-rename" else status["rewrites"])
    assert status["error"] is None
    ids = _ids(root, job)
    assert len(ids) == GROUPS * SAMPLES
    assert set(ids.values()) == {1}
    assert _manifests(str(root)) == []


def test_a_storage_server_killed_mid_archive_keeps_its_groups_on_the_gc_list(tmp_path, job):
    """Issue 17: a storage server dies while the archive reads a batch. The other server's groups are
    archived once and deleted; the dead server's are neither archived nor confirmed deleted: they stay
    on the GC list (retried), and the failure shows as an ArchiveError."""
    with trajflight.LocalCluster(
        servers=2, processes=True, shm=False, archive=tmp_path, archive_flush=0.2, timeout=10.0
    ) as cluster:
        archive = cluster.archive
        assert archive is not None
        reading, go = threading.Event(), threading.Event()
        read = archive._read

        def gated(location: str, keys: list[Any]) -> pa.Table:
            reading.set()
            go.wait(30.0)
            return read(location, keys)

        archive._read = gated
        with cluster.client() as client:
            infos = put_groups(client, job, GROUPS)
            commit_all(client, job, GROUPS)
            dead = cluster.server_locations[1]
            on_dead = {i.partition.group_id for i in infos if i.location == dead}
            assert 0 < len(on_dead) < GROUPS  # both servers hold some
            wait_for(reading.is_set, what="the archive's first read")
            cluster.kill_server(1)
            go.set()
            wait_for(lambda: archive.status()["error"] is not None, what="the archive's error")
            wait_for(lambda: archive.status()["groups"] == GROUPS - len(on_dead), what="the live half")
            remote = trajflight.connect(cluster.address, timeout=10.0)
            stats = remote.controller.transport.info(10.0)["archive"]  # stats() would need every server
            remote.close()
            left = {w.partition.group_id for w in client.controller.gc_list(job)}
        assert stats["error"]["type"] == "ArchiveError"
        assert "storage server" in stats["error"]["message"]
        assert left == on_dead  # never deleted unarchived
    ids = _ids(tmp_path, job)
    assert set(ids.values()) == {1}
    table = scan(tmp_path, job=job, columns=["group_id"]).to_table()
    assert set(table.column("group_id").to_pylist()) == set(range(GROUPS)) - on_dead


def test_an_unwritable_archive_keeps_the_data_and_reports_a_typed_error(tmp_path, job):
    """Issue 17: a read-only archive target deletes nothing: the groups stay on their servers and the
    GC list, ``stats`` shows an ArchiveError saying what to do, and once the target is writable again
    every group is archived exactly once. (Root ignores a directory's mode bits, so as root the target
    is a path under a regular file, which no one can write either.)"""
    target = tmp_path / "ro"
    target.mkdir()
    os.chmod(target, 0o555)
    blocker = None
    if os.access(target, os.W_OK):  # running as root
        blocker = tmp_path / "blocker"
        blocker.write_text("not a directory")
        target = blocker / "archive"
    cluster = trajflight.LocalCluster(servers=1, processes=False, archive=target, archive_flush=0.2)
    with cluster, cluster.client() as client:
        put_groups(client, job, GROUPS)
        commit_all(client, job, GROUPS)
        remote = trajflight.connect(cluster.address, timeout=10.0)
        wait_for(lambda: remote.stats()["controller"]["archive"]["error"] is not None, what="the error")
        error = remote.stats()["controller"]["archive"]["error"]
        table = format_table(collect(remote, cluster.address, None), None)
        assert "ArchiveError: " in table  # what `trajflight stats ADDRESS` prints
        assert error["type"] == "ArchiveError"
        assert "stay on their storage servers" in error["message"]
        assert "writable" in error["message"]
        assert client.controller.usage(job)[1] == GROUPS  # nothing deleted
        assert len(scan(cluster.address, job=job, columns=["sample_id"]).to_table()) == GROUPS * SAMPLES
        if blocker is not None:
            blocker.unlink()
        else:
            os.chmod(tmp_path / "ro", 0o755)
        assert cluster.wait_idle(job, timeout=60.0) == (0, 0)
        assert remote.stats()["controller"]["archive"]["error"] is None
        remote.close()
    ids = _ids(target, job)
    assert len(ids) == GROUPS * SAMPLES
    assert set(ids.values()) == {1}
    shutil.rmtree(tmp_path / "ro", ignore_errors=True)
