"""TLS and mutual TLS on every Flight endpoint (issue 18): the control server and the storage servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import trajflight
from trajflight.devcerts import DevCerts, make_dev_certs
from trajflight.errors import ConfigError, UnavailableError
from trajflight.flight_server import StorageClient, StorageServer, TlsConfig
from trajflight.workload import make_workload

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
