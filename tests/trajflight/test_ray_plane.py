"""The Ray data plane end to end: on the session's local Ray runtime (``ray_runtime``), and on a simulated
two-node cluster (``ray.cluster_utils.Cluster``) in a child process with its own Ray.

Writers run as Ray tasks (and as a plain process joining by address), a trainer leases, fetches torch
tensors from servers in parallel, commits, and capacity returns to zero once the controller actor's
sweeper has deleted the groups over Flight. The module's plane runs twice (issue 18): plain, and secure
(a deployment secret and mutual TLS on every storage server, see ``conftest.plane``); there the Ray tasks
connect with short-lived tokens scoped to their role and job, given as arguments or in their
``runtime_env``. It serves its metrics (``metrics_port=0``), and a test scrapes them against ``stats``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import trajflight
from trajflight._ray_connect import parse_ray_address
from trajflight._ray_plane import RayCluster
from trajflight.auth import Credential
from trajflight.controller import GroupState
from trajflight.errors import (
    AlreadyExistsError,
    ConfigError,
    InvalidRequestError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
)
from trajflight.flight_server import GroupRead, LeaseToken
from trajflight.keys import Partition

from .conftest import PLANES, SECRET
from .conftest import plane as started_plane
from .test_metrics import HELD_STATES, one, scrape, total

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}

# Puts ``count`` small groups (4 samples) as a writer of ``job``; returns what a test checks. Made by exec
# (no importable module), so Ray ships it by value; it imports what it needs itself. Child scripts reuse it.
WRITE_GROUPS = textwrap.dedent(
    """
    def write_groups(address, job, epoch, first, count, token=None, tls=None):
        import ray
        import trajflight
        from trajflight.workload import make_workload

        with trajflight.connect(address, timeout=20, token=token, tls=tls) as client:
            writer = client.writer(job, epoch, writer_id=f"writer-{first}")
            metas = []
            for g in make_workload(count, 4, seed=first, response_median=64, first_group_id=first):
                o = g.response_offsets
                meta = writer.put(prompt_ids=g.prompt, response_ids=(g.response_values, o),
                                  response_logprobs=(g.logprobs, o), reward=g.reward,
                                  sample_ids=[f"p{g.group_id}/{i}" for i in range(4)])
                metas.append({"partition": list(meta.partition), "server_id": meta.server_id,
                              "location": meta.location, "rows": meta.rows})
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"node": node, "writer_node": writer.node, "metas": metas}
    """
)


def _write_groups_fn():
    scope: dict = {}
    exec(WRITE_GROUPS, scope)
    return scope["write_groups"]


def _job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


TLS_ENV = ("TRAJFLIGHT_TLS_CA", "TRAJFLIGHT_TLS_CERT", "TRAJFLIGHT_TLS_KEY")


def _token(plane: RayCluster, role: str, job: str) -> Credential | None:
    """A two-minute credential of ``role`` scoped to ``job``; None on a plain plane."""
    return None if plane.keyring is None else plane.mint(role, [job], ttl=120.0, sub=f"test-{role}")


def _connect_args(plane: RayCluster, role: str, job: str) -> dict[str, Any]:
    """``write_groups``'s credential arguments for ``role`` on ``job``: none on a plain plane; on a secure
    one a short-lived scoped token and the client's TLS material."""
    token = _token(plane, role, job)
    return {} if token is None else {"token": token, "tls": plane.client_tls}


def _env_vars(plane: RayCluster, role: str, job: str) -> dict[str, str]:
    """The same credential as environment variables (``TRAJFLIGHT_TOKEN`` and the client's TLS files,
    which the secure fixture put in this process's environment); empty on a plain plane."""
    token = _token(plane, role, job)
    if token is None:
        return {}
    return {"TRAJFLIGHT_TOKEN": token.reveal(), **{k: os.environ[k] for k in TLS_ENV}}


# ---------------------------------------------------------------------------------------- no Ray needed


@pytest.mark.parametrize(
    "address",
    [
        "ray://",
        "ray://ns",
        "ray://ns/",
        "ray:///name",
        "ray://ns/name/more",
        "ray://ns/na me",
        "ray://n/x?y=1",
    ],
)
def test_malformed_ray_addresses_are_refused_with_the_expected_form(address):
    with pytest.raises(InvalidRequestError, match=r"ray://NAMESPACE/NAME"):
        parse_ray_address(address)


def test_a_ray_client_address_gets_a_hint():
    with pytest.raises(InvalidRequestError, match="Ray Client"):
        parse_ray_address("ray://head-node:10001")
    assert parse_ray_address("ray://trajflight-1a2b/trajflight-controller") == (
        "trajflight-1a2b",
        "trajflight-controller",
    )


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"servers": 0}, "servers"),
        ({"namespace": "a/b"}, "namespace"),
        ({"capacity": "lots"}, "capacity"),
        ({"metrics_port": -1}, "metrics_port"),
        ({"metrics_port": True}, "metrics_port"),
        ({"metrics_port": "9100"}, "metrics_port"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_setting(kwargs, setting):
    with pytest.raises(ConfigError) as info:
        RayCluster(**kwargs)
    assert info.value.setting == setting


def test_import_trajflight_does_not_import_ray():
    code = textwrap.dedent(
        """
        import sys
        import trajflight
        from trajflight.errors import InvalidRequestError
        trajflight.RayCluster  # resolving the name imports the module, not ray
        try:
            trajflight.connect("ray://only-a-namespace")
        except InvalidRequestError:
            pass
        print("ray" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_mint_has_local_cluster_s_contract_and_needs_no_running_plane(monkeypatch):
    """``RayCluster.mint`` (``LocalCluster.mint``'s body, ``trajflight.auth.mint_for_client``)."""
    from trajflight.auth import Role

    monkeypatch.delenv("TRAJFLIGHT_SECRET", raising=False)
    secure = RayCluster(secret="ray-mint:trajflight-ray-mint-secret-0123")
    claims = secure.keyring.verify(secure.mint("trainer", ["job-a"], ttl=60.0, sub="rank-0"))
    assert (claims.sub, claims.role, claims.jobs, claims.exp - claims.iat) == (
        "rank-0",
        Role.TRAINER,
        ("job-a",),
        60,
    )
    assert secure.keyring.verify(secure.mint()).role is Role.ADMIN
    with pytest.raises(ConfigError, match="no deployment secret"):
        RayCluster().mint("writer", ["job-a"])


# ---------------------------------------------------------------------------------------- session Ray


@pytest.fixture(scope="module", params=PLANES)
def plane(request, ray_runtime, tmp_path_factory):
    """Two storage server actors and the controller actor, in a fresh namespace, for the whole module,
    each serving its metrics on a free port; once plain and once secure (tokens and mutual TLS)."""
    with started_plane(
        request.param,
        tmp_path_factory,
        RayCluster,
        servers=2,
        capacity="256MiB",
        timeout=20.0,
        metrics_port=0,
    ) as p:
        yield p


@pytest.mark.ray
def test_servers_are_node_pinned_actors_on_loopback(plane, ray_runtime):
    import psutil

    from trajflight.errors import AuthenticationError
    from trajflight.flight_server import StorageClient

    secure = plane.keyring is not None
    scheme = "grpc+tls" if secure else "grpc"
    here = ray_runtime.get_runtime_context().get_node_id()
    assert plane.address == f"ray://{plane.namespace}/trajflight-controller"
    assert len(plane.servers) == 2
    registered = {s.server_id: s for s in plane.client().controller.servers()}
    for server in plane.servers:
        assert server.node_id == here
        assert server.location.startswith(f"{scheme}://127.0.0.1:")
        assert registered[server.server_id].node == here
        assert registered[server.server_id].location == server.location
        actor = ray_runtime.get_actor(server.actor_name, namespace=plane.namespace)
        info = ray_runtime.get(actor.describe.remote(), timeout=10)
        listening = [
            c.laddr
            for c in psutil.Process(info["pid"]).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening, "the storage server actor listens nowhere"
        assert {addr.ip for addr in listening} <= LOOPBACK, listening
        if secure:  # the client's certificate without a token is not enough
            with (
                StorageClient(server.location, timeout=10, tls=plane.client_tls) as bare,
                pytest.raises(AuthenticationError),
            ):
                bare.health()


@pytest.mark.ray
def test_writers_as_ray_tasks_put_to_their_node_and_a_trainer_commits_to_zero(plane, ray_runtime):
    job = _job()
    client = plane.client()
    client.open_job(job, 1, {"default_lease_ttl": "20s"})
    write = ray_runtime.remote(num_cpus=0)(_write_groups_fn())
    writer = _connect_args(plane, "writer", job)
    results = ray_runtime.get(
        [write.remote(plane.address, job, 1, g, 4, **writer) for g in (0, 100)], timeout=60
    )

    servers = {s.server_id: s for s in plane.servers}
    metas = [m for r in results for m in r["metas"]]
    assert len(metas) == 8
    for r in results:
        assert r["writer_node"] == r["node"]  # the default node of a writer on a Ray plane
        assert all(servers[m["server_id"]].node_id == r["node"] for m in r["metas"])
    assert {m["location"] for m in metas} == set(plane.server_locations)  # spread over both servers

    trainer = client.trainer(job)
    with trainer.lease(8, wait=10) as batch:
        assert len(batch) == 8
        tensors = batch.fetch(["response_ids", "reward", "sample_id"])  # one do_get per server, in parallel
        assert tensors.num_rows == 32
        assert tuple(tensors.tensors["reward"].shape) == (32,)
        ids = tensors.tensors["response_ids"]
        assert ids.is_nested
        assert int(ids.offsets()[-1]) == ids.values().numel() > 0
        assert len(set(tensors.arrow["sample_id"].to_pylist())) == 32
        # The single-controller pattern: shards of the lease fetched by Ray tasks, under its token (and,
        # secure, with a trainer's credential and TLS files from the tasks' environment).
        env = _env_vars(plane, "trainer", job)
        rows_of = ray_runtime.remote(num_cpus=0, **({"runtime_env": {"env_vars": env}} if env else {}))(
            _rows_of
        )
        shards = batch.shards(2)
        rows = ray_runtime.get([rows_of.remote(s.select(["reward"])) for s in shards], timeout=60)
        assert sum(rows) == 32
    assert plane.wait_idle(job, timeout=15.0) == (0, 0)
    assert client.controller.counts(job)["committed_total"] == 8
    for stats in client.stats(job)["servers"].values():
        assert stats["jobs"][job]["groups"] == 0


@pytest.mark.ray
def test_a_client_on_a_server_s_host_takes_its_shared_memory_arena(plane, ray_runtime):
    """issue 16: storage server actors ran without an arena (``health`` said ``shm_dir: None``), so a
    writer and a trainer on a server's own node went over Flight; now each actor has an arena and a
    client on its host puts and reads through it, by the same host-identity rule as an embedded plane."""
    from procmaps import inside, mapped_ranges  # here: Ray workers import this module without tests/helpers

    from trajflight.workload import make_workload

    job = _job()
    client = plane.client()
    client.open_job(job, 1, {"default_lease_ttl": "20s"})
    for server in plane.servers:
        health = client.storage.client(server.location).health()
        assert server.shm_dir is not None
        assert health["shm_dir"] == server.shm_dir
        assert client.storage.uses_shm(server.location)
    groups = make_workload(4, 4, seed=3, response_median=64)
    infos = client.writer(job, 1).put_many([g.encode(job, 1) for g in groups])
    live = sum(client.storage.client(s.location).stats()["shm"]["live_segments"] for s in plane.servers)
    assert live >= 1  # stored in the arenas' segments, not in Flight buffers
    with client.trainer(job).lease(4, wait=10) as batch:
        column = batch.fetch_table(["response_ids"]).column("response_ids")
        arenas = [r for s in plane.servers for r in mapped_ranges(s.shm_dir)]
        for chunk in column.chunks:  # one per server: each read in place from its arena, no copy
            assert inside(chunk.values.buffers()[1].address, arenas)
        by_id = {i.partition.group_id: g for i, g in zip(infos, groups, strict=True)}
        leased = [g.partition.group_id for g in batch.handle.groups]
        expected = [int(v) for i in leased for v in by_id[i].response_values]
        assert column.combine_chunks().values.to_pylist() == expected
    assert plane.wait_idle(job, timeout=15.0) == (0, 0)


@pytest.mark.ray
def test_a_writer_with_grant_ahead_puts_with_one_controller_actor_call(plane, ray_runtime):
    """issue 16: on the Ray plane each controller call is an actor call (about 2 ms here); with
    ``grant_ahead`` a put after the first is one ``publish_ahead`` call, and ``close`` gives the held grant
    back, so the job's usage returns to zero after the commit."""
    from unittest import mock

    from trajflight.workload import make_workload

    job = _job()
    client = plane.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1, grant_ahead=True)
    batches = [g.encode(job, 1) for g in make_workload(3, 4, seed=5, response_median=64)]
    batches.sort(key=lambda b: b.get_total_buffer_size(), reverse=True)  # each fits the one before's grant
    sent: list[str] = []
    run = client.controller._run
    with mock.patch.object(client.controller, "_run", lambda c, t: sent.append(c.name) or run(c, t)):
        for batch in batches:
            writer.put(batch)
    assert sent == ["allocate", "publish_ahead", "publish_ahead", "publish_ahead"]
    with client.trainer(job).lease(3, wait=10) as leased:
        assert len(leased.partitions) == 3
    writer.close()
    assert plane.wait_idle(job, timeout=15.0) == (0, 0)


def _rows_of(handle):
    import trajflight

    return trajflight.fetch(handle).num_rows


@pytest.mark.ray
def test_a_process_outside_ray_joins_by_address(plane, ray_runtime):
    """Secure, it connects with nothing but its environment: a writer's token and the client's TLS files.
    Issue 18: ``connect("ray://...")`` read ``TRAJFLIGHT_TOKEN`` but not ``TRAJFLIGHT_TLS_*``, so this
    process could not reach a Ray plane's ``grpc+tls://`` storage servers."""
    job = _job()
    client = plane.client()
    client.open_job(job, 1)
    code = WRITE_GROUPS + textwrap.dedent(
        """
        import json, sys
        print(json.dumps(write_groups(sys.argv[1], sys.argv[2], 1, 0, 2)))
        """
    )
    env = {**os.environ, **_env_vars(plane, "writer", job)}
    out = subprocess.run(
        [sys.executable, "-c", code, plane.address, job], capture_output=True, text=True, timeout=90, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["node"] == ray_runtime.get_runtime_context().get_node_id() == result["writer_node"]
    with client.trainer(job).lease(2, wait=10) as batch:
        assert batch.fetch(["reward"]).num_rows == 8
    assert plane.wait_idle(job, timeout=15.0) == (0, 0)


@pytest.mark.ray
def test_an_expired_lease_is_fenced_on_its_storage_server_by_the_controller_actor(plane, ray_runtime):
    """Issue 14 item 9 on Ray: the controller actor's fencer (``FlightStorage.fence``) raises the
    generation of an expired lease's groups on their servers, so the old token is refused there (a
    zombie's read and append)."""
    job = _job()
    client = plane.client()
    client.open_job(job, 1, {"default_lease_ttl": "1s"})
    write = ray_runtime.remote(num_cpus=0)(_write_groups_fn())
    ray_runtime.get(
        write.remote(plane.address, job, 1, 0, 1, **_connect_args(plane, "writer", job)), timeout=60
    )
    lease = client.controller.acquire(job, "raw", max_groups=1)  # no client-side fencing at all
    (group,) = lease.groups
    storage = client.storage.client(group.location)
    read = GroupRead(Partition(*group.partition), LeaseToken(lease.token))
    assert storage.get([read]).num_rows == group.rows
    deadline = time.monotonic() + 30.0
    while (
        client.controller.group(group.partition).state is not GroupState.READY
        or client.controller.fence_list()
    ):
        assert time.monotonic() < deadline, "the lease did not expire, or its fence did not run"
        time.sleep(0.05)
    with pytest.raises(StaleFenceError):
        storage.get([read])
    with pytest.raises(StaleFenceError):
        storage.append_columns(read.key, pa.table({"z": pa.array([0.0] * group.rows)}), read.token)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.mark.ray
def test_metrics_endpoints_of_the_controller_and_servers_agree_with_stats(plane, ray_runtime):
    """Issue 18: the controller actor and every storage server actor serve Prometheus metrics on their
    node's address (loopback here), named by ``metrics_urls``; after a put, a lease and its commit the
    counters agree with ``stats`` (groups put = committed + held), and no credential shows in them."""
    from trajflight.workload import make_workload

    urls = plane.metrics_urls
    assert sorted(urls) == ["controller", "server-0", "server-1"]
    assert urls["controller"] == plane.client().controller.transport.info(10.0)["metrics"]
    assert urlsplit(urls["controller"]).hostname == "127.0.0.1"
    for i, server in enumerate(plane.servers):
        assert urls[f"server-{i}"] == server.metrics_url
        assert urlsplit(server.metrics_url).hostname == urlsplit(server.location).hostname == "127.0.0.1"
    names = ["controller", "server-0", "server-1"]
    before = {n: scrape(urls[n]) for n in names}  # the module's plane: other tests' figures are in there

    job, put, leased = _job(), 6, 4
    client = plane.client()
    client.open_job(job, 1, {"default_lease_ttl": "20s"})
    client.writer(job, 1).put_many([g.encode(job, 1) for g in make_workload(put, 4, seed=5)])
    with client.trainer(job).lease(leased, wait=10) as batch:
        assert len(batch) == leased
        assert batch.fetch(["reward"]).num_rows == 4 * leased
    deadline = time.monotonic() + 15.0
    while (counts := client.controller.counts(job))["deleted"] < leased:  # the commits' deletes
        assert time.monotonic() < deadline, counts
        time.sleep(0.05)
    stats = client.stats(job)
    after = {n: scrape(urls[n]) for n in names}

    def delta(name: str, source: str = "controller", **labels: str) -> float:
        return one(after[source], name, **labels) - one(before[source], name, **labels)

    ctl = after["controller"]
    counts = stats["counts"]
    held = sum(one(ctl, "trajflight_groups", job=job, state=s) for s in HELD_STATES)
    committed = one(ctl, "trajflight_groups_committed_total", job=job)
    assert delta("trajflight_groups_published_total") == put
    assert committed == leased == counts["committed_total"]
    assert put == committed + held  # groups put = groups committed + held
    for state in (*HELD_STATES, "COMMITTED"):
        assert one(ctl, "trajflight_groups", job=job, state=state) == counts[state], state
    assert one(ctl, "trajflight_groups_deleted_total", job=job) == counts["deleted"] == leased
    assert one(ctl, "trajflight_job_bytes", job=job) == stats["usage_bytes"] > 0
    assert one(ctl, "trajflight_job_held_groups", job=job) == stats["usage_groups"] == held
    assert (
        delta("trajflight_leases_granted_total") == 1 == delta("trajflight_leases_ended_total", reason="done")
    )
    assert delta("trajflight_groups_leased_total") == leased

    servers = [after[f"server-{i}"] for i in range(2)]
    assert sum(delta("trajflight_server_groups_put_total", f"server-{i}") for i in range(2)) == put
    assert sum(delta("trajflight_server_groups_deleted_total", f"server-{i}") for i in range(2)) == leased
    assert sum(one(s, "trajflight_server_job_groups", job=job) for s in servers) == held
    assert sum(one(s, "trajflight_server_job_bytes", job=job) for s in servers) == sum(
        s["jobs"][job]["bytes"] for s in stats["servers"].values()
    )
    assert sum(total(s, "trajflight_server_groups") for s in servers) == sum(
        s["groups"] for s in stats["servers"].values()
    )

    texts = [_text(url) for url in urls.values()]
    secrets = [SECRET, SECRET.split(":", 1)[1]] if plane.keyring is not None else []
    token = os.environ.get("TRAJFLIGHT_TOKEN") if plane.keyring is not None else None
    for text in texts:
        assert f'job="{job}"' in text
        assert "eyJ" not in text  # no bearer token (a JWT's header) in any sample or label
        for secret in [*secrets, *([token] if token else [])]:
            assert secret not in text


@pytest.mark.ray
def test_the_ray_plane_exports_the_embedded_plane_s_metric_families(plane):
    """The same families as ``LocalCluster(metrics_port=)``'s: docs/operations.md and the dashboard
    describe both planes' endpoints. (``_created`` names are left out: the text parser makes them a
    family of their own only once a labelled series exists, which depends on the requests served.)"""

    def families(urls: dict[str, str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {"controller": set(), "server": set()}
        for name, url in urls.items():
            kind = "controller" if name == "controller" else "server"
            found = text_string_to_metric_families(_text(url))
            out[kind] |= {f.name for f in found if not f.name.endswith("_created")}
        return out

    with trajflight.LocalCluster(servers=1, capacity="64MiB", processes=False, metrics_port=0) as local:
        embedded = families(local.metrics_urls)
    on_ray = families(plane.metrics_urls)
    assert len(embedded["controller"]) > 20
    assert len(embedded["server"]) > 15
    assert on_ray == embedded


@pytest.mark.ray
def test_a_metrics_port_in_use_fails_the_start_naming_it(ray_runtime):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plane = RayCluster(servers=1, capacity="16MiB", metrics_port=port, timeout=20.0)
        with pytest.raises(
            UnavailableError, match=rf"metrics endpoint could not listen on 127\.0\.0\.1:{port}"
        ):
            plane.start()
    assert plane.metrics_urls == {}


@pytest.mark.ray
def test_unknown_controller_and_taken_name(plane, ray_runtime):
    with pytest.raises(NotFoundError, match="no trajflight controller"):
        trajflight.connect(f"ray://{plane.namespace}/no-such-controller")
    with pytest.raises(AlreadyExistsError, match="already runs"):
        RayCluster(servers=1, namespace=plane.namespace, timeout=20.0).start()
    plane.client().controller.servers()  # the running plane is untouched


@pytest.mark.ray
@pytest.mark.parametrize("mode", PLANES)
def test_restart_controller_keeps_address_servers_and_clients(ray_runtime, mode, tmp_path_factory):
    """Secure, the restarted actor (its constructor re-run by Ray) still deletes with a minted token; its
    metrics endpoint comes back (on a new free port with ``metrics_port=0``) and ``metrics_urls`` names it."""
    job = _job()
    with started_plane(
        mode, tmp_path_factory, RayCluster, servers=1, capacity="64MiB", timeout=20.0, metrics_port=0
    ) as plane:
        client = plane.client()
        config = {"default_lease_ttl": "20s"}
        client.open_job(job, 1, config)
        writer = client.writer(job, 1)
        write = ray_runtime.remote(num_cpus=0)(_write_groups_fn())
        ray_runtime.get(
            write.remote(plane.address, job, 1, 0, 3, **_connect_args(plane, "writer", job)), timeout=60
        )
        checkpoint = client.checkpoint(job)
        before = client.controller.transport.info(10.0)["pid"]

        plane.restart_controller()

        assert client.controller.transport.info(10.0)["pid"] != before
        assert [s.location for s in client.controller.servers()] == plane.server_locations
        client.restore(
            checkpoint, job_id=job, epoch=2, config=config
        )  # the same client works after the restart
        url = plane.metrics_urls["controller"]
        assert url == client.controller.transport.info(10.0)["metrics"]
        ready = client.controller.counts(job)["READY"]
        assert one(scrape(url), "trajflight_groups", job=job, state="READY") == ready == 3
        with pytest.raises(StaleFenceError):
            writer.put(
                prompt_ids=[[1]], response_ids=[[3]], response_logprobs=[[-0.5]], reward=[0.0]
            )  # epoch 1 is fenced
        with client.trainer(job).lease(3, wait=10) as batch:
            assert len(batch) == 3
            assert batch.fetch(["reward"]).num_rows == 12
        # A restored job keeps its commits until a later checkpoint is durable (issue 14): confirm one.
        assert client.confirm_checkpoint(job, client.checkpoint(job)) == 3
        assert plane.wait_idle(job, timeout=15.0) == (0, 0)


@pytest.mark.ray
@pytest.mark.parametrize("mode", PLANES)
def test_with_a_state_dir_a_restarted_controller_keeps_its_groups(
    ray_runtime, mode, tmp_path, tmp_path_factory
):
    job = _job()
    with started_plane(
        mode, tmp_path_factory, RayCluster, servers=1, capacity="64MiB", state_dir=tmp_path, timeout=20.0
    ) as plane:
        client = plane.client()
        client.open_job(job, 1, {"default_lease_ttl": "20s"})
        write = ray_runtime.remote(num_cpus=0)(_write_groups_fn())
        ray_runtime.get(
            write.remote(plane.address, job, 1, 0, 2, **_connect_args(plane, "writer", job)), timeout=60
        )

        plane.restart_controller()  # Ray restarts the actor; it replays its journal

        assert client.controller.counts(job)["READY"] == 2
        with client.trainer(job).lease(2, wait=10) as batch:
            assert batch.fetch(["reward"]).num_rows == 8
        assert plane.wait_idle(job, timeout=15.0) == (0, 0)


# ---------------------------------------------------------------------------------------- two nodes

TWO_NODES = WRITE_GROUPS + textwrap.dedent(
    """
    import json, os
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    import trajflight

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        with trajflight.RayCluster(capacity="64MiB", timeout=30) as plane:  # one server per node
            client = plane.client()
            client.open_job("two-nodes", 1, {"default_lease_ttl": "30s"})
            write = ray.remote(num_cpus=0)(write_groups)
            nodes = sorted({s.node_id for s in plane.servers})
            refs = [write.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                    .remote(plane.address, "two-nodes", 1, 100 * i, 3) for i, n in enumerate(nodes)]
            writers = ray.get(refs, timeout=60)
            with client.trainer("two-nodes").lease(6, wait=10) as batch:
                rows = batch.fetch(["response_ids", "reward"]).num_rows
                spans = sorted({g.location for g in batch.handle.groups})
            idle = plane.wait_idle("two-nodes", timeout=15.0)
            servers = {s.server_id: s.node_id for s in plane.servers}
            shm = [client.storage.uses_shm(s.location) for s in plane.servers]
            arenas = [s.shm_dir for s in plane.servers]
            print(json.dumps({"nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]], "servers": servers,
                              "writers": writers, "rows": rows, "spans": spans, "idle": list(idle),
                              "shm": shm, "arenas": arenas}))
    finally:
        ray.shutdown()
        cluster.shutdown()
    """
)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(170)
def test_two_node_cluster_writers_put_to_their_own_node():
    """A simulated two-node cluster (its own Ray, in a child process so it never meets the session's).

    Plain only: the slowest test here (a second Ray in a child); its secure paths (scoped tokens and mTLS
    from Ray tasks to their node's server) are those the module's secure plane runs on one node."""
    # Not the secure module plane's credential either (it stays in the environment while that plane
    # lives): this child's plane has no secret, and its servers refuse a token.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("TRAJFLIGHT_")}
    out = subprocess.run(
        [sys.executable, "-c", TWO_NODES], capture_output=True, text=True, timeout=150, env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert len(result["nodes"]) == 2
    assert sorted(result["servers"].values()) == sorted(result["nodes"])  # one server per node
    assert {w["node"] for w in result["writers"]} == set(result["nodes"])
    for w in result["writers"]:
        assert w["writer_node"] == w["node"]
        assert len(w["metas"]) == 3
        assert all(result["servers"][m["server_id"]] == w["node"] for m in w["metas"])  # own node's server
    assert result["rows"] == 24
    assert len(result["spans"]) == 2  # the trainer's batch spanned both nodes' servers
    assert result["idle"] == [0, 0]
    # Simulated nodes share this host (one host identity): each server has its arena, and the driver
    # reaches both through shared memory; every arena is gone once the plane is closed.
    assert result["shm"] == [True, True]
    assert all(result["arenas"])
    assert not any(os.path.exists(a) for a in result["arenas"])


@pytest.mark.ray
def test_a_ray_plane_with_a_secret_authenticates_its_servers_and_hides_the_secret(ray_runtime):
    """RayCluster(secret=): the server actors refuse calls without a token, the controller actor's deletes
    and the driver's client carry minted admin tokens, a Ray task connects with its own credential, and
    the secret shows in no repr, actor name or task argument's repr."""
    from trajflight.auth import Keyring
    from trajflight.errors import AuthenticationError
    from trajflight.flight_server import StorageClient

    secret = "ray:ray-plane-secret-0123456789abcdef"
    with RayCluster(servers=1, capacity="64MiB", secret=secret, timeout=60.0) as secure:
        with (
            StorageClient(secure.server_locations[0], timeout=10) as bare,
            pytest.raises(AuthenticationError),
        ):
            bare.health()
        job = _job()
        client = secure.client()
        client.open_job(job, 1)
        writer_token = Keyring.from_secret(secret).mint("ray-writer", "writer", [job]).reveal()

        def write(address: str, job: str, token: str) -> int:
            import trajflight
            from trajflight.workload import make_workload

            with trajflight.connect(address, timeout=20, token=token) as remote:
                (g,) = make_workload(1, 4, seed=3, response_median=32)
                remote.writer(job, 1).put(g.encode(job, 1))
            return 1

        put = ray_runtime.remote(num_cpus=0)(write)
        assert ray_runtime.get(put.remote(secure.address, job, writer_token), timeout=60) == 1
        with client.trainer(job).lease(1, wait=10) as batch:
            assert batch.fetch_table(["reward"]).num_rows == 4
        assert secure.wait_idle(job, timeout=20) == (0, 0)  # the actor's deletes carried its token
        names = [s.actor_name for s in secure.servers]
        for text in (repr(secure._secret), str(vars(secure)), *names):
            assert "ray-plane-secret" not in text
