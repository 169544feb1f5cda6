"""A deployment secret on the embedded planes (issue 18): ``trajflight up`` with ``TRAJFLIGHT_SECRET``
(it used to fail at ``open_job``), ``LocalCluster(secret=)`` and the environment, operator credentials
from ``trajflight token``, and credentials kept out of command lines, ``repr`` and errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trajflight
from trajflight.auth import Credential, Keyring, Role
from trajflight.errors import AuthenticationError, ConfigError, PermissionDeniedError
from trajflight.flight_server import StorageClient

from .conftest import put_groups, start_up, stop_up

SECRET = "ops:up-plane-secret-0123456789abcdef"


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJFLIGHT_")}
    return {**env, **more}


def _token(role: str, *jobs: str) -> str:
    """What ``trajflight token`` prints (the secret from the environment)."""
    cmd = [sys.executable, "-m", "trajflight", "token", "--role", role, "--ttl", "10m"]
    for job in jobs:
        cmd += ["--job", job]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env(TRAJFLIGHT_SECRET=SECRET))
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    return out.stdout.strip()


@pytest.mark.slow  # a standing plane in a subprocess and five CLI runs: about 6 s
def test_up_with_a_secret_serves_only_credentials_and_says_how_to_mint_them():
    proc, address = start_up("--servers", "1", "--capacity", "64MiB", env=_env(TRAJFLIGHT_SECRET=SECRET))
    try:
        with (
            trajflight.connect(address, timeout=20) as anonymous,
            pytest.raises(AuthenticationError, match="no credential"),
        ):
            anonymous.open_job("up-job", 1)
        with trajflight.connect(address, timeout=20, token=_token("admin")) as admin:
            admin.open_job("up-job", 1)  # fences every storage server with a minted admin token
        with trajflight.connect(address, timeout=20, token=_token("writer", "up-job")) as writer:
            put_groups(writer.writer("up-job", 1), 2)
            with pytest.raises(PermissionDeniedError, match="needs role trainer"):
                writer.trainer("up-job").lease(1, wait=1)
        with (
            trajflight.connect(address, timeout=20, token=_token("trainer", "up-job")) as trainer,
            trainer.trainer("up-job").lease(2, wait=5) as batch,
        ):
            assert batch.fetch_table(["reward"]).num_rows == 8
        stats = subprocess.run(
            [sys.executable, "-m", "trajflight", "stats", address, "--json", "--job", "up-job"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(TRAJFLIGHT_TOKEN=_token("reader", "up-job")),
        )
        assert stats.returncode == 0, stats.stderr
        assert '"commits": 2' in stats.stdout
    finally:
        err = stop_up(proc)
    assert "authentication on (signing key ops)" in err
    assert "trajflight token --role ROLE --job JOB" in err
    assert SECRET not in err


def test_token_without_a_secret_says_where_to_put_one():
    out = subprocess.run(
        [sys.executable, "-m", "trajflight", "token", "--role", "reader"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert out.returncode == 2
    assert "TRAJFLIGHT_SECRET" in out.stderr
    assert not out.stdout


def test_a_local_cluster_with_a_secret_authenticates_every_endpoint_and_hides_the_secret(tmp_path: Path):
    with trajflight.LocalCluster(servers=1, capacity="64MiB", secret=SECRET, timeout=20.0) as cluster:
        location = cluster.server_locations[0]
        with StorageClient(location, timeout=10) as bare, pytest.raises(AuthenticationError):
            bare.health()
        client = cluster.client()  # this process's clients get admin tokens minted here
        client.open_job("lc-job", 1)
        put_groups(client.writer("lc-job", 1), 1)
        with client.trainer("lc-job").lease(1, wait=5) as batch:
            assert batch.fetch_table(["reward"]).num_rows == 4
        assert cluster.wait_idle("lc-job") == (0, 0)  # the controller's deletes carry its own token
        reader = cluster.mint("reader", ["lc-job"])
        assert Keyring.from_secret(SECRET).verify(reader).role is Role.READER
        with StorageClient(location, timeout=10, credential=reader) as scoped:
            assert scoped.health()["authenticated"] is True
        for text in (repr(cluster), str(vars(cluster)), repr(reader), repr(cluster.keyring)):
            assert SECRET.split(":")[1] not in text
            assert reader.reveal() not in text
        pid = cluster._procs[0].pid  # the server got the secret through its environment, not argv
        assert SECRET.split(":")[1] not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


@pytest.mark.parametrize("transport", ["flight", "shm"])
def test_each_role_does_its_part_of_a_round_trip_over_either_transport(transport):
    """Credentials of the least role each step needs: an admin opens, a writer puts, a trainer leases,
    fetches and commits, a reader reads (over Flight the trainer raises generations itself)."""
    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB", secret=SECRET) as cluster:

        def connect(role: str) -> trajflight.Client:
            return trajflight.connect(
                cluster.address, timeout=20, transport=transport, token=cluster.mint(role, ["rt-job"])
            )

        with connect("admin") as admin:
            admin.open_job("rt-job", 1)
        with connect("writer") as writer:
            put_groups(writer.writer("rt-job", 1), 2)
        with connect("reader") as reader:
            assert reader.stats("rt-job")["counts"]["READY"] == 2
        with connect("trainer") as trainer, trainer.trainer("rt-job").lease(2, wait=5) as batch:
            assert batch.fetch_table(["reward"]).num_rows == 8
        assert cluster.wait_idle("rt-job") == (0, 0)


def test_a_local_cluster_reads_the_secret_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRAJFLIGHT_SECRET", SECRET)
    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB") as cluster:
        assert cluster.keyring is not None
        assert cluster.keyring.signing_kid == "ops"
        with (
            trajflight.connect(cluster.address, timeout=10, token=Credential("not.a.token")) as bad,
            pytest.raises(AuthenticationError, match="malformed"),
        ):
            bad.controller.servers()
    monkeypatch.setenv("TRAJFLIGHT_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        trajflight.LocalCluster(servers=1, processes=False)


def test_a_live_scan_reads_a_secure_plane_with_a_reader_credential(monkeypatch):
    pytest.importorskip("duckdb")
    from trajflight.analytics import scan

    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB", secret=SECRET) as cluster:
        client = cluster.client()
        client.open_job("scan-job", 1)
        put_groups(client.writer("scan-job", 1), 2)
        monkeypatch.setenv("TRAJFLIGHT_TOKEN", cluster.mint("reader", ["scan-job"]).reveal())
        table = scan(cluster.address, job="scan-job", columns=["reward"]).to_table()
        assert table.num_rows == 8
        monkeypatch.delenv("TRAJFLIGHT_TOKEN")
        with pytest.raises(AuthenticationError):
            scan(cluster.address, job="scan-job", columns=["reward"]).to_table()
