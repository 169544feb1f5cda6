"""Storage-server tests: make ``flight_testkit`` importable by name (also by ``spawn`` children)."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    # --import-mode=importlib does not put test folders on sys.path; spawn children inherit sys.path.
    sys.path.insert(0, _HERE)
