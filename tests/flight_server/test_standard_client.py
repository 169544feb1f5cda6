"""A bare ``pyarrow.flight`` client that knows nothing of trajflight lists, inspects and reads groups."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, serving

from trajflight.keys import Partition

KEYS = [
    Partition("job-a", 0, 1),
    Partition("job-a", 0, 2),
    Partition("job-a", 1, 1),
    Partition("job-b", 0, 1),
]


@pytest.fixture(scope="module")
def stocked():
    with serving() as (server, client):
        for key in KEYS:
            client.put_groups([(key, make_group(key))])
        yield server


def _bare(server) -> flight.FlightClient:
    return flight.FlightClient(server.location)


def test_bare_client_lists_every_group_with_schema_rows_bytes_and_a_readable_endpoint(stocked):
    bare = _bare(stocked)
    infos = list(bare.list_flights())
    assert [tuple(p.decode() for p in i.descriptor.path) for i in infos] == [
        (k.job_id, str(k.epoch), str(k.group_id)) for k in KEYS
    ]
    for info, key in zip(infos, KEYS, strict=True):
        assert info.total_records == 8
        assert info.total_bytes > 0
        assert info.schema.names[:3] == ["job_id", "epoch", "group_id"]
        endpoint = info.endpoints[0]
        assert endpoint.locations[0].uri.decode() == stocked.location
        table = flight.FlightClient(endpoint.locations[0]).do_get(endpoint.ticket).read_all()
        assert table.equals(pa.Table.from_batches([make_group(key)]))
    bare.close()


def test_bare_client_filters_by_job_and_epoch(stocked):
    bare = _bare(stocked)
    criteria = json.dumps({"v": 1, "job_id": "job-a", "epoch": 0}).encode()
    assert [i.total_records for i in bare.list_flights(criteria)] == [8, 8]
    assert len(list(bare.list_flights(json.dumps({"v": 1, "job_id": "job-b"}).encode()))) == 1
    bare.close()


def test_bare_client_asks_for_one_group_by_path(stocked):
    bare = _bare(stocked)
    info = bare.get_flight_info(flight.FlightDescriptor.for_path("job-a", "1", "1"))
    assert info.total_records == 8
    assert bare.do_get(info.endpoints[0].ticket).read_all().column("epoch").to_pylist() == [1] * 8
    schema = bare.get_schema(flight.FlightDescriptor.for_path("job-a", "1", "1")).schema
    assert schema == info.schema
    with pytest.raises(flight.FlightServerError, match="not_found"):
        bare.get_flight_info(flight.FlightDescriptor.for_path("job-a", "9", "9"))
    bare.close()


def test_bare_client_writes_through_a_path_descriptor_where_no_secret_is_set():
    key = Partition("bare", 0, 3)
    with serving() as (server, client):
        bare = _bare(server)
        group = make_group(key)
        writer, _ = bare.do_put(flight.FlightDescriptor.for_path("bare", "0", "3", "8"), group.schema)
        writer.write_batch(group)
        writer.close()
        bare.close()
        assert client.get([key]).equals(pa.Table.from_batches([group]))


def test_bare_client_sees_the_actions_described(stocked):
    bare = _bare(stocked)
    actions = {a.type: a.description for a in bare.list_actions()}
    assert set(actions) >= {"delete", "fence", "advance_generation", "stats", "health"}
    assert all(actions.values())
    (health,) = bare.do_action(flight.Action("health", b""))
    assert json.loads(health.body.to_pybytes())["status"] == "ok"
    bare.close()
