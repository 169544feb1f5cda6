"""``trajflight server`` as a process: prints its location, stops on SIGTERM within 5 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, server_process

from trajflight.flight_server import StorageClient
from trajflight.flight_server._wire import GetTicket, GroupRead, encode
from trajflight.keys import Partition


def _terminate(proc: subprocess.Popen[str]) -> float:
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(15)
    return time.monotonic() - start


def test_server_prints_its_location_serves_and_stops_cleanly_on_sigterm():
    key = Partition("cli", 0, 1)
    with server_process("--capacity", "64MiB") as (proc, location):
        with StorageClient(location, timeout=20) as client:
            client.put_groups([(key, make_group(key))])
            assert client.stats()["capacity_bytes"] == 64 * 2**20
        elapsed = _terminate(proc)
        assert proc.returncode == 0
        assert "stopped" in proc.stderr.read()
    assert elapsed < 5


@pytest.mark.slow
def test_sigterm_stops_the_server_within_5s_despite_a_stalled_reader():
    key = Partition("cli", 0, 1)
    big = make_group(key, k=256, response_len=16384, fixed=True)  # ~40 MB: far beyond gRPC's window
    with server_process("--capacity", "1GiB", "--shutdown-grace", "2s") as (proc, location):
        with StorageClient(location, timeout=60, write_size_limit_bytes=2**20) as client:
            client.put_groups([(key, big)])
        stalled = flight.FlightClient(location)
        reader = stalled.do_get(flight.Ticket(encode(GetTicket((GroupRead(key),)))))
        reader.read_chunk()  # one batch, then never read again: the server's stream blocks
        try:
            elapsed = _terminate(proc)
        finally:
            stalled.close()
        assert proc.returncode == 0
        assert "exiting anyway" in proc.stderr.read()
    assert elapsed < 5


def test_bad_configuration_exits_with_a_message():
    proc = subprocess.run(
        [sys.executable, "-m", "trajflight", "server", "--capacity", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "capacity" in proc.stderr
