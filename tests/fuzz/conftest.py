"""Bad-input fuzzing of the storage server: make the kits importable by name.

``tests/flight_server`` (``flight_testkit``, ``shm_testkit``) and this folder (``fuzz_kit``) go on
``sys.path``; --import-mode=importlib adds no test folder itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE), str(_HERE.parent / "flight_server")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
