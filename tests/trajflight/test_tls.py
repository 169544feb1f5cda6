"""TLS and mutual TLS on every Flight endpoint (issue 18): the control server and the storage servers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import trajflight
from trajflight.devcerts import DevCerts, make_dev_certs
from trajflight.errors import ConfigError, UnavailableError
from trajflight.flight_server import StorageClient, StorageServer, TlsConfig
from trajflight.workload import make_workload

from .conftest import start_up, stop_up

pytest.importorskip("cryptography", reason="the tls extra: pip install 'trajflight[tls]'")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def mtls_cluster(certs: DevCerts) -> Iterator[trajflight.LocalCluster]:
    """Storage server processes (started with ``trajflight server --tls-*``) and the control server, all
    demanding client certificates."""
    with trajflight.LocalCluster(servers=1, tls=certs.server, client_tls=certs.client) as cluster:
        yield cluster


def _round_trip(client: trajflight.Client, job: str) -> int:
    client.open_job(job, 1)
    (group,) = make_workload(1, 4, seed=1, response_median=16)
    client.writer(job, 1).put(group.encode(job, 1))
    with client.trainer(job).lease(1, wait=10) as batch:
        return int(batch.fetch_table(["reward"]).num_rows)


def test_every_endpoint_serves_grpc_tls_and_a_client_with_its_certificate_round_trips(mtls_cluster, certs):
    assert mtls_cluster.address.startswith("grpc+tls://127.0.0.1:")
    assert all(loc.startswith("grpc+tls://127.0.0.1:") for loc in mtls_cluster.server_locations)
    with trajflight.connect(mtls_cluster.address, tls=certs.client, transport="flight") as client:
        assert _round_trip(client, "over-tls") == 4
    assert mtls_cluster.wait_idle("over-tls") == (0, 0)  # the controller's deletes went over mTLS too
    with trajflight.connect(mtls_cluster.address, tls=certs.client) as client:  # same host: the arena
        assert _round_trip(client, "same-host") == 4


def test_a_client_without_a_certificate_or_trusting_another_ca_is_refused(mtls_cluster, certs, tmp_path):
    location = mtls_cluster.server_locations[0]
    no_cert = TlsConfig(ca=certs.client.ca)
    with pytest.raises(UnavailableError), StorageClient(location, timeout=5, tls=no_cert) as bare:
        bare.health()
    other = make_dev_certs(tmp_path / "other")
    with pytest.raises(UnavailableError), StorageClient(location, timeout=5, tls=other.client) as stranger:
        stranger.health()
    plain = location.replace("grpc+tls://", "grpc://")
    with pytest.raises(UnavailableError), StorageClient(plain, timeout=5) as plaintext:
        plaintext.health()
    with pytest.raises(UnavailableError):
        trajflight.connect(mtls_cluster.address, tls=no_cert, timeout=5).controller.servers()


def test_a_refused_tls_handshake_says_which_setting_to_give(mtls_cluster, certs, tmp_path):
    """The errors name what to do (tls= or TRAJFLIGHT_TLS_*), not only gRPC's handshake words."""
    location = mtls_cluster.server_locations[0]
    untrusting = (None, make_dev_certs(tmp_path / "another").client)  # system roots; another CA
    for tls in untrusting:
        with (
            pytest.raises(UnavailableError, match=r"TLS handshake failed.*TRAJFLIGHT_TLS_CA"),
            StorageClient(location, timeout=5, tls=tls) as client,
        ):
            client.health()
    for where, tls in ((location, TlsConfig(ca=certs.client.ca)), (location.replace("+tls", ""), None)):
        with (
            pytest.raises(UnavailableError, match=r"serves TLS and refused.*TRAJFLIGHT_TLS_"),
            StorageClient(where, timeout=5, tls=tls) as client,
        ):
            client.health()


def test_tls_without_client_certificates_serves_any_client_trusting_the_ca(certs):
    server_only = TlsConfig(certs.server.cert, certs.server.key)  # no ca: no client certificate asked
    with (
        StorageServer(tls=server_only) as server,
        StorageClient(server.location, timeout=5, tls=TlsConfig(ca=certs.client.ca)) as client,
    ):
        assert client.health()["status"] == "ok"


def test_tls_settings_that_cannot_work_are_config_errors_naming_them(certs):
    with pytest.raises(ConfigError, match="cert and key together"):
        TlsConfig(cert=certs.server.cert)
    with pytest.raises(ConfigError, match="not a grpc\\+tls:// location"):
        StorageClient("grpc://127.0.0.1:1", tls=certs.client)
    with pytest.raises(ConfigError, match="client_tls"):
        trajflight.LocalCluster(tls=certs.server)
    with pytest.raises(ConfigError, match="cannot read"):
        TlsConfig.from_files(Path("/nonexistent/cert.pem"), Path("/nonexistent/key.pem"))
    assert "BEGIN" not in repr(certs.server)  # the key never shows in a repr or a log line


@pytest.mark.ray
def test_a_ray_plane_serves_its_storage_servers_over_mutual_tls(ray_runtime, certs):
    from trajflight import RayCluster

    with pytest.raises(ConfigError, match="client_tls"):
        RayCluster(tls=certs.server)
    with RayCluster(servers=1, capacity="64MiB", tls=certs.server, client_tls=certs.client) as plane:
        (location,) = plane.server_locations
        assert location.startswith("grpc+tls://127.0.0.1:")
        with plane.client() as client:  # the plane's own client, same node: the arena still serves
            assert _round_trip(client, "ray-own") == 4
        with trajflight.connect(plane.address, tls=certs.client, transport="flight") as client:
            assert _round_trip(client, "ray-flight") == 4
        assert plane.wait_idle("ray-flight") == (0, 0)  # the controller actor's deletes went over mTLS
        with pytest.raises(UnavailableError), StorageClient(location, timeout=5) as plaintext:
            plaintext.health()
        # No CA given: the system's roots do not trust the private CA, so the handshake fails.
        with (
            trajflight.connect(plane.address, transport="flight") as stranger,
            pytest.raises(UnavailableError, match="certificate verify failed"),
        ):
            stranger.open_job("no-cert", 1)


def test_up_with_dev_tls_serves_mutual_tls_to_clients_holding_the_certificates(tmp_path):
    folder = tmp_path / "dev-tls"
    proc, address = start_up(
        "--servers", "1", "--capacity", "64MiB", "--dev-tls", str(folder), scheme="grpc+tls"
    )
    try:
        tls = TlsConfig.from_files(folder / "client.pem", folder / "client.key", folder / "ca.pem")
        with trajflight.connect(address, tls=tls, transport="flight") as client:
            assert _round_trip(client, "up-tls") == 4
        with pytest.raises(UnavailableError):
            trajflight.connect(address, tls=TlsConfig(ca=tls.ca), timeout=5).controller.servers()
    finally:
        err = stop_up(proc)
    assert f"{folder}/client.pem" in err  # it says how clients connect


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "--tls-ca"),
        (
            ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "a.pem", "--tls-client-ca", "a.pem"],
            "mutual",
        ),
        (["--dev-tls", "d", "--tls-ca", "a.pem"], "drop the --tls-"),
        (["--tls-cert", "/no/c.pem", "--tls-key", "/no/k.pem", "--tls-ca", "/no/a.pem"], "cannot read"),
    ],
)
def test_up_refuses_tls_options_that_cannot_work_naming_them(options, message):
    out = subprocess.run(
        [sys.executable, "-m", "trajflight", "up", "--servers", "1", *options],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_the_control_endpoint_refuses_plaintext_and_a_certificate_of_another_ca(mtls_cluster, tmp_path):
    """The TLS rows of the refusal table (issue 18) for the controller's endpoint; the storage servers'
    are the test above."""
    other = make_dev_certs(tmp_path / "other")
    servers = mtls_cluster.client().controller.servers()
    with pytest.raises(UnavailableError):
        trajflight.connect(mtls_cluster.address, tls=other.client, timeout=5).controller.servers()
    plain = mtls_cluster.address.replace("grpc+tls://", "grpc://")
    with pytest.raises(UnavailableError):
        trajflight.connect(plain, timeout=5).controller.register_server(
            "intruder", node="n", location="grpc://127.0.0.1:1", capacity_bytes=1, capacity_groups=1
        )
    assert mtls_cluster.client().controller.servers() == servers  # nothing registered
