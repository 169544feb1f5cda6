"""Shared test configuration: capability markers and one Ray runtime for the whole session.

* ``gpu`` tests skip where torch sees no CUDA device.
* ``ray`` tests skip where ray is not installed and share one local runtime bound to loopback
  (starting Ray costs about 7 s here; starting it per test would blow CI's budget).
* Helpers shared by several test folders (``tests/helpers``: ``procmaps``) are importable by name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before any test module is collected: Ray reads this flag once, at ``import ray``, and without it a Ray
# started on 127.0.0.1 advertises (and its actors bind) the machine's network address. A test module
# that imports ray at collection (``pytest.importorskip("ray")``) would otherwise beat the runtime fixture.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Helpers shared by several test folders, importable by name. Only this folder goes on sys.path: the test
# folders themselves are named like the packages they test (``trajflight``, ``codec``, ...), so putting
# ``tests/`` there would shadow the real packages. (--import-mode=importlib adds no test folder itself.)
_HELPERS = str(Path(__file__).resolve().parent / "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is false)")
    skip_ray = pytest.mark.skip(reason="needs ray: pip install 'trajflight[ray]'")
    has_cuda = None
    has_ray = importlib.util.find_spec("ray") is not None
    for item in items:
        if "gpu" in item.keywords:
            if has_cuda is None:
                has_cuda = _cuda_available()
            if not has_cuda:
                item.add_marker(skip_gpu)
        if "ray" in item.keywords and not has_ray:
            item.add_marker(skip_ray)


@pytest.fixture(scope="session")
def ray_runtime() -> Iterator[object]:
    """One local Ray runtime on loopback shared by every ``ray`` test of the session."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=8,
        log_to_driver=False,
        namespace="trajflight-tests",
    )
    try:
        yield ray
    finally:
        ray.shutdown()
