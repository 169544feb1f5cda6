"""Prometheus metrics of an embedded data plane during a run with writer processes and a trainer: the
counters agree with ``stats`` (groups put = groups committed + held at the end; groups by state)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trajflight

from .conftest import WRITER

HELD_STATES = ("READY", "LEASED", "PREPARED", "TRAINING", "TRAINED", "UNKNOWN")


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the endpoint, by name: ``[(labels, value), ...]``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def one(samples: dict, name: str, **labels: str) -> float:
    (value,) = [v for got, v in samples[name] if all(got.get(k) == w for k, w in labels.items())]
    return value


def total(samples: dict, name: str) -> float:
    return sum(v for _, v in samples[name])


@pytest.mark.slow  # about 5 s: two server processes and two writer processes
def test_scraped_counters_during_a_run_agree_with_stats():
    job, per_writer = "metrics-run", 6
    with trajflight.LocalCluster(servers=2, capacity="256MiB", timeout=20.0, metrics_port=0) as cluster:
        urls = cluster.metrics_urls
        assert sorted(urls) == ["controller", "server-0", "server-1"]
        client = cluster.client()
        client.open_job(job, epoch=1, config={"default_lease_ttl": "30s"})
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, cluster.address, job, "1", str(first), str(per_writer)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for first in (0, 1000)
        ]
        trainer = client.trainer(job)
        trained, during = 0, None
        while trained < 8:
            with trainer.lease(2, wait=15) as batch:
                batch.fetch(["reward"])
                if during is None:  # scraped while the trainer holds a lease
                    during = scrape(urls["controller"])
                trained += len(batch)
        for proc in writers:
            proc.communicate(timeout=60)
            assert proc.returncode == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the commits' deletes confirmed
            counts = client.controller.counts(job)
            if counts["deleted"] == counts["committed_total"]:
                break
            time.sleep(0.05)
        stats = client.stats(job)
        ctl = scrape(urls["controller"])
        servers = [scrape(urls[f"server-{i}"]) for i in range(2)]

    assert one(during, "trajflight_live_leases", job=job) == 1
    assert one(during, "trajflight_groups", job=job, state="LEASED") >= 1

    counts = stats["counts"]
    published = one(ctl, "trajflight_groups_published_total")
    committed = one(ctl, "trajflight_groups_committed_total", job=job)
    held = sum(one(ctl, "trajflight_groups", job=job, state=s) for s in HELD_STATES)
    assert published == 2 * per_writer
    assert committed == trained == counts["committed_total"]
    assert published == committed + held  # groups put = groups committed + held at the end
    for state in (*HELD_STATES, "COMMITTED"):
        assert one(ctl, "trajflight_groups", job=job, state=state) == counts[state], state
    assert one(ctl, "trajflight_groups_deleted_total", job=job) == counts["deleted"]
    assert one(ctl, "trajflight_job_bytes", job=job) == stats["usage_bytes"]
    assert one(ctl, "trajflight_job_held_groups", job=job) == stats["usage_groups"] == held
    assert one(ctl, "trajflight_leases_granted_total") == one(
        ctl, "trajflight_leases_ended_total", reason="done"
    )

    # Each storage server: what it stores is what stats says, and what was put there went somewhere.
    assert len(stats["servers"]) == 2
    assert sum(total(s, "trajflight_server_groups") for s in servers) == held
    assert sum(total(s, "trajflight_server_groups") for s in servers) == sum(
        s["groups"] for s in stats["servers"].values()
    )
    assert sum(total(s, "trajflight_server_groups_put_total") for s in servers) == published
    assert sum(total(s, "trajflight_server_groups_deleted_total") for s in servers) == committed
    assert sum(total(s, "trajflight_server_bytes") for s in servers) == sum(
        s["bytes"] for s in stats["servers"].values()
    )
