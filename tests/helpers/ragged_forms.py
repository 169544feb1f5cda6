"""Per-sample rows given to ``encode_group`` in every input form it accepts (shared by the codec tests)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from trajflight.codec import Padded, Ragged


def as_form(rows: list[np.ndarray], dtype: Any, form: str, junk: int, offsets_dtype: Any = np.int32) -> Any:
    """``rows`` (cast to ``dtype``) as one input form: ``lists``, ``arrays``, ``tensors``, ``pyarrow``,
    ``2d`` (falls back to ``tuple`` for rows of different lengths), ``tuple``, ``tuple-int64``,
    ``tuple-sliced`` (values with ``junk`` leading entries and offsets starting there, as a slice's do),
    ``Ragged``, ``Ragged-torch``, ``nested``, ``padded-torch``; anything else is a numpy ``Padded``."""
    rows = [r.astype(dtype) for r in rows]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    if form == "lists":
        return [r.tolist() for r in rows]
    if form == "arrays":
        return rows
    if form == "tensors":
        return [torch.from_numpy(r) for r in rows]
    if form == "pyarrow":
        return pa.array([r.tolist() for r in rows], pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))
    if form == "2d" and len(set(lengths.tolist())) <= 1:
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=dtype)
    values = np.concatenate([np.zeros(junk, dtype=dtype), *rows])
    offsets = (np.concatenate([[0], np.cumsum(lengths)]) + junk).astype(offsets_dtype)
    if form in ("tuple", "2d"):
        return (values[junk:], offsets - junk)
    if form == "tuple-int64":
        return (values[junk:], (offsets - junk).astype(np.int64))
    if form == "tuple-sliced":
        return (values, offsets)
    if form == "Ragged":
        return Ragged(values, offsets)
    if form == "Ragged-torch":
        return Ragged(torch.from_numpy(values), torch.from_numpy(offsets))
    if form == "nested" and rows:
        return torch.nested.nested_tensor_from_jagged(
            torch.from_numpy(values[junk:]), torch.from_numpy(offsets - junk).long()
        )
    width = int(lengths.max()) if len(lengths) else 0
    padded = np.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    if form == "padded-torch":
        return Padded(torch.from_numpy(padded), torch.from_numpy(lengths))
    return Padded(padded, lengths)
