"""Shared builders for codec tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    # --import-mode=importlib does not put test folders on sys.path: test_validate_many reuses
    # test_validate's group strategy by name.
    sys.path.insert(0, _HERE)


def ragged(lengths: list[int], dtype: Any, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(values, int32 offsets) with the given row lengths."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if np.dtype(dtype).kind == "f":
        values = rng.standard_normal(int(offsets[-1])).astype(dtype)
    else:
        values = rng.integers(0, 100, int(offsets[-1])).astype(dtype)
    return values, offsets


@pytest.fixture
def simple_group() -> dict[str, Any]:
    """Keyword arguments of encode_group for a 3-sample group given as (values, offsets) pairs."""
    ids, offsets = ragged([4, 0, 7], np.int32)
    logprobs, _ = ragged([4, 0, 7], np.float32, seed=1)
    return {
        "job_id": "job",
        "epoch": 2,
        "group_id": 5,
        "prompt_ids": np.arange(6, dtype=np.int32),
        "response_ids": (ids, offsets),
        "response_logprobs": (logprobs, offsets),
        "reward": np.array([1.0, 0.0, 1.0], dtype=np.float32),
    }
