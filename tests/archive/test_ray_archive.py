"""The archive on a Ray data plane: the controller actor writes it before its deletes."""

from __future__ import annotations

from collections import Counter

import pytest

from trajflight.analytics import scan

from .conftest import commit_all, put_groups

pytest.importorskip("ray", reason="needs the ray extra")


@pytest.mark.ray
def test_a_ray_data_plane_archives_committed_groups_before_deleting_them(ray_runtime, tmp_path, job):
    """Issue 17: the Ray controller actor routes its deletes through the archive too (made in the
    actor's process from a picklable factory), and reports it in its info."""
    from trajflight import RayCluster

    with (
        RayCluster(servers=1, capacity="64MiB", timeout=20.0, archive=tmp_path, archive_flush=0.2) as plane,
        plane.client() as client,
    ):
        put_groups(client, job, 4)
        commit_all(client, job, 4)
        assert plane.wait_idle(job, timeout=30.0) == (0, 0)
        status = client.controller.transport.info(10.0)["archive"]
    assert status["groups"] == 4
    assert status["error"] is None
    ids = Counter(scan(tmp_path, job=job, columns=["sample_id"]).to_table().column("sample_id").to_pylist())
    assert len(ids) == 12
    assert set(ids.values()) == {1}
