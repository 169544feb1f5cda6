"""docs/operations.md describes every exported metric, and the Grafana dashboard queries only metrics that
exist (a renamed metric would otherwise leave a silent, empty panel)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trajflight

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    """(family names, sample names) of a controller's and a storage server's endpoints, with a job."""
    families: set[str] = set()
    samples: set[str] = set()
    with trajflight.LocalCluster(servers=1, capacity="64MiB", processes=False, metrics_port=0) as cluster:
        client = cluster.client()
        client.open_job(
            "docs", 1, config={"capacity_bytes": "32MiB", "capacity_groups": 100, "max_group_bytes": "1MiB"}
        )
        client.writer("docs", 1).put(
            prompt_ids=[1], response_ids=[[2]], response_logprobs=[[-0.1]], reward=[1.0]
        )
        for url in cluster.metrics_urls.values():
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
            for family in text_string_to_metric_families(text):
                if not family.name.endswith("_created"):  # prometheus_client's start time of a series
                    families.add(family.name)
                samples.update(s.name for s in family.samples)
    return families, samples


def test_operations_md_describes_every_exported_metric(exported):
    families, _ = exported
    text = (DOCS / "operations.md").read_text()
    assert len(families) > 40
    missing = [name for name in sorted(families) if f"`{name}" not in text and f"`{name}_total" not in text]
    assert missing == []


def test_every_metric_the_dashboard_queries_is_exported(exported):
    _, samples = exported
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    queried = {name for e in exprs for name in re.findall(r"\btrajflight_\w+", e)}
    assert sorted(queried - samples) == []
    assert {"trajflight_groups", "trajflight_unknown_groups", "trajflight_gc_backlog"} <= queried
