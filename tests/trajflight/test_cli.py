"""`trajflight up` starts a standing data plane; `trajflight stats ADDRESS` reads its counters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import trajflight

from .conftest import put_groups


def test_up_then_connect_put_and_stats_then_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajflight", "up", "--servers", "1", "--capacity", "64MiB"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = proc.stdout.readline().strip() if proc.stdout else ""
        assert address.startswith("grpc://127.0.0.1:")
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_stats_of_nothing_says_it_cannot_connect():
    result = subprocess.run(
        [sys.executable, "-m", "trajflight", "stats", "grpc://127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "trajflight stats:" in result.stderr


def _stats(address: str) -> dict[str, Any]:
    """What `trajflight stats ADDRESS --job cli-job --json` prints, parsed."""
    out = subprocess.run(
        [sys.executable, "-m", "trajflight", "stats", address, "--job", "cli-job", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result
