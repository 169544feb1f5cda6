"""The import layers of the tree, checked by import-linter (the contracts in ``pyproject.toml``).

The installed package maps ``codec/``, ``controller/``, ``flight_server/`` and ``bench/`` into
``trajflight`` (``package-dir``), so a static import graph of the repository's folders would not see them
as subpackages: the test lays the package out as it is installed, with symbolic links, and lints that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="needs import-linter (the test extra)")

ROOT = Path(__file__).resolve().parent.parent
PARTS = {"codec": "codec", "controller": "controller", "flight_server": "flight_server", "bench": "bench"}


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``trajflight/`` as installed: the face's modules, and the parts linked in as subpackages."""
    tree = tmp_path_factory.mktemp("layout")
    package = tree / "trajflight"
    package.mkdir()
    for entry in (ROOT / "trajflight").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in PARTS.items():
        (package / name).symlink_to(ROOT / folder)
    return tree


def test_the_import_contracts_hold(installed_layout: Path) -> None:
    """Layers point down, the face uses the parts' public names only, and no package has an import
    loop (lazy and ``TYPE_CHECKING`` imports count)."""
    env = {**os.environ, "PYTHONPATH": str(installed_layout)}
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename=sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "pyproject.toml")],
        cwd=installed_layout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_every_module_of_the_face_is_in_a_layer() -> None:
    """A new module of ``trajflight/`` must be placed in the layers contract, or nothing checks it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    modules = {
        f"trajflight.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "trajflight").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    modules |= {f"trajflight.{name}" for name in PARTS}
    assert modules - named == set(), f"modules no layer names: {sorted(modules - named)}"
