"""Fixtures of the fault-injection suite: a fresh plane of real processes per scenario, killed at
teardown whatever happened.

The helpers of this folder (``faultkit``, ``fault_audit``; the child scripts import ``_childkit``) are
importable by name: this folder goes on ``sys.path`` (its module names collide with nothing installed).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from faultkit import Plane  # noqa: E402

_JOBS = itertools.count()


@pytest.fixture
def make_plane(tmp_path: Path) -> Iterator[Callable[..., Plane]]:
    """Start planes (``make_plane(servers=2, ...)``); every process of each is killed at teardown."""
    planes: list[Plane] = []

    def make(**options: Any) -> Plane:
        root = tmp_path / f"plane-{len(planes)}"
        root.mkdir()
        plane = Plane(root, **options)
        planes.append(plane)
        return plane.start()

    try:
        yield make
    finally:
        for plane in planes:
            plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., Plane]) -> Plane:
    """Two storage servers (shared-memory arenas) and a journaling controller, each its own process."""
    return make_plane()


@pytest.fixture
def job() -> str:
    return f"fault-{next(_JOBS)}"


@pytest.fixture(scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    holder: dict[str, Any] = {"plane": None, "n": 0}
    try:
        yield holder
    finally:
        plane = holder["plane"]
        if plane is not None:
            left = plane.stop_cleanly()
            plane.close()
            if left:
                pytest.fail(f"the shared plane left {len(left)} files in /dev/shm: {left[:5]}")


@pytest.fixture
def shared_plane(_shared: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A plane shared by the scenarios of a module that fault only writers and trainers (each scenario
    has a job of its own); replaced by a fresh one when a scenario left it killed, stopped or holding
    anything, so no scenario inherits another's faults."""
    plane = _shared["plane"]
    if plane is not None and plane.dirty() is not None:
        plane.close()
        plane = None
    if plane is None:
        _shared["n"] += 1
        root = tmp_path_factory.mktemp(f"shared-plane-{_shared['n']}")
        plane = Plane(root)
        plane.shared = True
        _shared["plane"] = plane.start()
    try:
        yield plane
    finally:
        plane.close_children()
