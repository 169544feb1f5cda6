"""`trajflight up` starts a standing data plane; `trajflight stats ADDRESS` reads its counters; the
controller's `info` action answers bare Flight clients; `trajflight --version`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

import trajflight

from .conftest import put_groups, stop_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_up(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajflight", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = proc.stdout.readline().strip() if proc.stdout else ""
    assert address.startswith("grpc://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
    return proc, address


@pytest.fixture(scope="module")
def plane() -> Iterator[str]:
    """One `trajflight up` for the module's read-only checks, on a port given with --port."""
    port = _free_port()
    proc, address = _start_up(
        "--servers", "2", "--capacity", "64MiB", "--port", str(port), "--log-level", "info"
    )
    try:
        assert address == f"grpc://127.0.0.1:{port}"
        yield address
    finally:
        stop_process(proc)


def _stats(address: str, job: str | None = "cli-job") -> dict[str, Any]:
    """What `trajflight stats ADDRESS [--job JOB] --json` prints, parsed."""
    cmd = [sys.executable, "-m", "trajflight", "stats", address, "--json"]
    out = subprocess.run(
        cmd + (["--job", job] if job else []), capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_up_then_connect_put_and_stats_then_sigterm():
    proc, address = _start_up("--servers", "1", "--capacity", "64MiB")
    try:
        with trajflight.connect(address, timeout=20) as client:
            client.open_job("cli-job", 1)
            put_groups(client.writer("cli-job", 1), 2)
        stats = _stats(address)
        assert stats["controller"]["counters"]["groups_published"] == 2
        assert stats["counts"]["READY"] == 2
        assert sum(s["groups"] for s in stats["servers"].values()) == 2
        assert all(s["groups_read"] == 0 for s in stats["servers"].values())
        with (
            trajflight.connect(address, timeout=20) as client,
            client.trainer("cli-job").lease(2, wait=5) as b,
        ):
            b.fetch(["reward"])
        after = _stats(address)
        assert sum(s["groups_read"] for s in after["servers"].values()) == 2  # gets are counted
        assert after["controller"]["counters"]["leases_granted"] == 1
        assert after["controller"]["counters"]["commits"] == 2
        table = subprocess.run(
            [sys.executable, "-m", "trajflight", "stats", address],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "groups_published" in table
    finally:
        err = stop_process(proc)
    (start,) = [line for line in err.splitlines() if line.startswith("trajflight up: serving on ")]
    assert address in start
    assert err.rstrip().endswith("trajflight up: stopped")  # issue 19: it printed nothing when it stopped


def test_stats_labels_each_byte_count_by_what_it_counts(plane: str):
    """issue 19: `stats --job` said the job holds 1835 bytes while the servers said 6336 and 4224 and
    each FlightInfo 2112, unexplained. The controller charges what writers announced (the batches'
    Arrow buffers); a server holds each group's Arrow IPC stream (what its FlightInfo reports)."""
    with trajflight.connect(plane, timeout=20) as client:
        client.open_job("bytes-job", 1)
        metas = put_groups(client.writer("bytes-job", 1), 3)
    stats = _stats(plane, "bytes-job")
    assert stats["usage_bytes"] == sum(m.nbytes for m in metas)
    assert stats["usage_groups"] == 3
    for server_id, server in stats["servers"].items():
        criteria = json.dumps({"v": 1, "job_id": "bytes-job"}).encode()
        mine = list(flight.FlightClient(stats["server_locations"][server_id]).list_flights(criteria))
        assert server["jobs"].get("bytes-job", {"bytes": 0})["bytes"] == sum(i.total_bytes for i in mine)
    table = subprocess.run(
        [sys.executable, "-m", "trajflight", "stats", plane, "--job", "bytes-job"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"capacity charged: {stats['usage_bytes']} bytes, 3 groups" in table
    assert "bytes held" in table
    assert "FlightInfo" in table
    assert max(len(line) for line in table.splitlines()) <= 100


def test_stats_of_nothing_says_the_controller_cannot_be_reached():
    """issue 19: a dead controller address said "the storage server could not be reached"."""
    result = subprocess.run(
        [sys.executable, "-m", "trajflight", "stats", "grpc://127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "trajflight stats: the controller at grpc://127.0.0.1:1 could not be reached" in result.stderr
    assert "storage server" not in result.stderr


@pytest.mark.parametrize("body", [b'{"v": 1}', b""])
def test_info_action_speaks_plain_json_to_a_bare_flight_client(plane: str, body: bytes):
    """issue 19: `info` refused {"v": 1} ("untagged object ['v']") and answered type-tagged JSON."""
    (result,) = flight.FlightClient(plane).do_action(flight.Action("info", body))
    info = json.loads(result.body.to_pybytes())
    assert info["v"] == 1
    assert info["kind"] == "embedded"
    assert [s["location"].startswith("grpc://127.0.0.1:") for s in info["servers"]] == [True, True]
    assert "$m" not in result.body.to_pybytes().decode()


@pytest.mark.parametrize("body", [b'{"v": 2}', b"[1]", b"not json", b'{"v": true}'])
def test_info_action_refuses_other_versions_and_garbage(plane: str, body: bytes):
    with pytest.raises(flight.FlightError, match=r"\[trajflight:invalid_request\].*wire version 1"):
        list(flight.FlightClient(plane).do_action(flight.Action("info", body)))


def test_version_is_the_package_version():
    out = subprocess.run(
        [sys.executable, "-m", "trajflight", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == f"trajflight {trajflight.__version__}"
    assert trajflight.__version__ == importlib.metadata.version("trajflight")


def test_up_refuses_a_port_in_use_in_one_line(plane: str):
    port = plane.rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "trajflight", "up", "--servers", "1", "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert f"trajflight up: the controller could not listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_kill_9_of_up_leaves_no_shared_memory_directory():
    """issue 19: after `kill -9` of `trajflight up` its servers stopped and removed their arenas, but
    the empty deployment directory /dev/shm/trajflight-<uuid>/ stayed until a later start swept it."""
    proc, address = _start_up("--servers", "2", "--capacity", "64MiB")
    try:
        arenas = [s["shm"]["dir"] for s in _stats(address, None)["servers"].values()]
        deployment = Path(arenas[0]).parent
        assert {str(Path(a).parent) for a in arenas} == {str(deployment)}
        assert deployment.is_dir()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    deadline = time.monotonic() + 30  # the servers notice their parent is gone within a second
    while deployment.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not deployment.exists()
