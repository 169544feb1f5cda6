"""A storage server's Prometheus metrics: the store collector, request timing, refusals by reason, the
endpoint, and ``trajflight server --metrics-port``."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from flight_testkit import make_group, server_process, serving
from prometheus_client.parser import text_string_to_metric_families

from trajflight.errors import (
    CapacityExceededError,
    InvalidRequestError,
    NotFoundError,
    StaleFenceError,
)
from trajflight.flight_server import GroupRead, LeaseToken, MetricsEndpoint, StorageClient, StoreLimits
from trajflight.flight_server._metrics import ServerMetrics
from trajflight.flight_server._store import GroupStore
from trajflight.keys import Partition
from trajflight.refusals import REFUSAL_REASONS

KEY = Partition("job-m", 1, 0)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint, by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_the_store_collector_reads_the_store_at_scrape_time():
    with serving(StoreLimits(capacity_bytes=1 << 24, capacity_groups=10)) as (server, client):
        reg = server.metrics.registry
        srv = {"server": server.location}
        assert reg.get_sample_value("trajflight_server_groups", srv) == 0
        client.put_groups(
            [(Partition("job-m", 1, g), make_group(Partition("job-m", 1, g))) for g in range(3)]
        )
        stats = server.store.stats()
        assert reg.get_sample_value("trajflight_server_groups", srv) == 3
        assert reg.get_sample_value("trajflight_server_bytes", srv) == stats["bytes"] > 0
        assert reg.get_sample_value("trajflight_server_capacity_bytes", srv) == 1 << 24
        assert reg.get_sample_value("trajflight_server_capacity_groups", srv) == 10
        assert reg.get_sample_value("trajflight_server_groups_put_total", srv) == 3
        assert reg.get_sample_value("trajflight_server_job_groups", {**srv, "job": "job-m"}) == 3
        client.get([GroupRead(Partition("job-m", 1, 0), LeaseToken(1))])
        client.delete([GroupRead(Partition("job-m", 1, 1), LeaseToken(1))])
        assert reg.get_sample_value("trajflight_server_groups_read_total", srv) == 1
        assert reg.get_sample_value("trajflight_server_groups_deleted_total", srv) == 1
        assert reg.get_sample_value("trajflight_server_groups", srv) == 2
        assert stats["groups_put"] == 3  # the same counts in the stats action


def test_requests_are_timed_and_refusals_counted_by_reason():
    with serving(StoreLimits(capacity_bytes=1 << 24, capacity_groups=1)) as (server, client):
        reg = server.metrics.registry
        for reason in REFUSAL_REASONS:  # every reason is exported from the start
            assert reg.get_sample_value("trajflight_server_refusals_total", {"reason": reason}) == 0
        client.put_groups([(KEY, make_group(KEY))])
        client.get([GroupRead(KEY, LeaseToken(5))])
        with pytest.raises(StaleFenceError):
            client.get([GroupRead(KEY, LeaseToken(4))])  # older than generation 5
        other, old = Partition("job-m", 1, 1), Partition("job-m", 1, 2)
        with pytest.raises(CapacityExceededError):
            client.put_groups([(other, make_group(other))])  # one group slot
        client.fence("job-m", 2)
        with pytest.raises(StaleFenceError):
            client.put_groups([(old, make_group(old))])  # epoch 1 is fenced
        with pytest.raises(NotFoundError):
            client.get([Partition("job-m", 1, 9)])  # an error, not a refusal

        def refusals(reason: str) -> float | None:
            return reg.get_sample_value("trajflight_server_refusals_total", {"reason": reason})

        assert (refusals("stale_token"), refusals("capacity"), refusals("fenced_epoch")) == (1, 1, 1)

        def requests(op: str, outcome: str) -> float | None:
            return reg.get_sample_value("trajflight_server_requests_total", {"op": op, "outcome": outcome})

        assert (requests("do_get", "ok"), requests("do_get", "refused"), requests("do_get", "error")) == (
            1,
            1,
            1,
        )
        assert (requests("do_put", "ok"), requests("do_put", "refused")) == (1, 2)
        assert reg.get_sample_value("trajflight_server_request_seconds_count", {"op": "do_get"}) == 3
        assert reg.get_sample_value("trajflight_server_request_seconds_count", {"op": "fence"}) == 1


def test_count_refusal_is_the_hook_of_credential_checks_and_refuses_unknown_reasons():
    metrics = ServerMetrics(GroupStore().stats, "grpc://x")
    metrics.count_refusal("unauthenticated")
    metrics.count_refusal("wrong_role")
    metrics.count_refusal("wrong_role")
    get = metrics.registry.get_sample_value
    assert get("trajflight_server_refusals_total", {"reason": "unauthenticated"}) == 1
    assert get("trajflight_server_refusals_total", {"reason": "wrong_role"}) == 2
    with pytest.raises(InvalidRequestError, match="unknown refusal reason"):
        metrics.count_refusal("bad_mood")


def test_an_unknown_action_name_is_one_label_not_one_per_name():
    with serving() as (server, client):
        for name in ("no-such-action-1", "no-such-action-2"):
            with pytest.raises(InvalidRequestError):
                client._action(name, b"{}", 5)
        get = server.metrics.registry.get_sample_value
        assert get("trajflight_server_request_seconds_count", {"op": "unknown"}) == 2
        assert get("trajflight_server_request_seconds_count", {"op": "no-such-action-1"}) is None


def test_the_endpoint_serves_its_server_names_it_in_health_and_frees_its_port_on_close():
    with serving(metrics_port=0) as (server, client):
        url = server.metrics_url
        assert url is not None
        assert url.startswith("http://127.0.0.1:")
        assert client.health()["metrics"] == url
        client.put_groups([(KEY, make_group(KEY))])
        samples = scrape(url)
        assert value(samples, "trajflight_server_groups", server=server.location) == 1
        assert value(samples, "trajflight_server_requests_total", op="do_put", outcome="ok") == 1
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    with serving() as (plain, plain_client):  # no port: no endpoint, the metrics still kept
        assert plain.metrics_url is None
        assert plain_client.health()["metrics"] is None


def test_a_busy_metrics_port_is_a_typed_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidRequestError, match="metrics endpoint could not listen"):
            MetricsEndpoint(ServerMetrics(GroupStore().stats, "x").registry, "127.0.0.1", port)
    with pytest.raises(InvalidRequestError, match="metrics port"):
        MetricsEndpoint(ServerMetrics(GroupStore().stats, "x").registry, "127.0.0.1", 70000)


def test_trajflight_server_serves_metrics_and_logs_json_lines():
    args = ("--metrics-port", "0", "--log-level", "INFO", "--log-json")
    with server_process(*args) as (proc, location), StorageClient(location, timeout=20) as client:
        url = client.health()["metrics"]
        client.put_groups([(KEY, make_group(KEY))])
        client.fence("job-m", 2)
        samples = scrape(url)
        assert value(samples, "trajflight_server_groups_put_total", server=location) == 1
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    fenced = [line for line in lines if "fenced below epoch 2" in line["message"]]
    assert [(line["job"], line["level"]) for line in fenced] == [("job-m", "INFO")]
    assert f"metrics {url}" in err  # the serving line names the endpoint
