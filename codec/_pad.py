"""Padding ragged columns to ``[rows, max_len]`` arrays: the one route of ``layout="padded"``.

:func:`pad_rows` pads every column that shares one offsets array in a single pass over the rows (a
group's ``response_ids``, ``response_logprobs`` and ``loss_mask``): one slice copy per row and column,
written once. A zero padding value (all bits zero) is not written at all: the output comes from
``numpy.zeros``, which asks the allocator for zeroed memory (``calloc``), so the pages that hold only
padding are never touched here. On a training batch most of a padded tensor is padding; torch's
jagged -> dense kernel and a boolean-mask scatter both write every element and cost several times as
much (BENCHMARKS.md, "Padded gets").

Memory and ownership: every output is a new array that owns its memory (numpy's allocation, also under
a torch tensor made with ``torch.from_numpy``, which makes that tensor not resizable); nothing aliases
the inputs.

It does not guarantee when the zeroed pages are faulted in: untouched padding is mapped by the kernel
on first access (a read maps the shared zero page, a write a fresh one), so part of the cost of a
zero-padded output moves to the first pass over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trajflight.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

__all__ = ["pad_rows", "padding_numpy", "padding_torch"]


def _checked(name: str, pad: Any, make: Callable[[], np.ndarray], dtype: object) -> np.ndarray:
    """``make()`` (the padding value as a 0-d array of the column's dtype), or a typed refusal."""
    try:
        return make()
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:  # torch raises RuntimeError
        raise InvalidRequestError(
            f"padding_value {pad!r} cannot pad column {name!r} of dtype {dtype} ({exc}); pass a number "
            "that fits it",
            column=name,
        ) from exc


def padding_numpy(name: str, pad: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """The padding value of a numpy column as a 0-d array of ``dtype``, as ``numpy.full`` writes it.

    Raises:
        InvalidRequestError: ``dtype`` cannot hold ``pad`` (``column`` names the column).
    """

    def make() -> np.ndarray:
        value = pad
        if dtype.kind in "iu" and isinstance(pad, float | np.floating):
            # numpy casts a NaN, infinite or out-of-range float to garbage integers (with a RuntimeWarning);
            # torch.full refuses them. Through int() (truncating 1.5 as torch does) numpy refuses them too.
            value = int(pad)
        return np.full((), value, dtype=dtype)

    return _checked(name, pad, make, dtype)


def padding_torch(name: str, pad: Any, dtype: torch.dtype) -> np.ndarray:
    """The padding value of a torch column as a 0-d numpy array, the bits ``torch.full`` writes.

    Raises:
        InvalidRequestError: ``dtype`` cannot hold ``pad`` (``column`` names the column), including a
            finite value that would round to infinity in a float dtype.
    """
    import torch

    def make() -> np.ndarray:
        if isinstance(pad, int | np.integer) and not dtype.is_floating_point:
            # torch.full wraps an integer out of an unsigned dtype's range (-1 -> 255 for the loss mask)
            # where numpy refuses it.
            info = torch.iinfo(dtype)
            if not info.min <= pad <= info.max:
                raise OverflowError(f"{pad} is outside {info.min}..{info.max}")
        value = torch.full((), pad, dtype=dtype)
        # torch.full rounds an out-of-range float to inf in one element and refuses it in several.
        if dtype.is_floating_point and bool(torch.isinf(value)) and np.isfinite(float(pad)):
            raise OverflowError(f"{pad} is outside the range of {dtype}")
        return value.numpy()

    return _checked(name, pad, make, dtype)


def pad_rows(
    values: Sequence[np.ndarray], offsets: np.ndarray, max_len: int, pads: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Pad columns that share ``offsets``: ``out[k][i, :n_i]`` is row ``i`` of ``values[k]``, the rest
    of the row is ``pads[k]`` (a 0-d array of that column's dtype).

    Args:
        values: Each column's values (1-D; row ``i`` is ``values[k][offsets[i]:offsets[i + 1]]``).
        offsets: The rows' offsets, starting at zero.
        max_len: The longest row's length (the outputs' width; not checked).
        pads: Each column's padding value, as :func:`padding_torch` or :func:`padding_numpy` make it.

    Returns:
        One new C-contiguous ``[rows, max_len]`` array per column, owning its memory.
    """
    rows = max(len(offsets) - 1, 0)
    outs: list[np.ndarray] = []
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    fills: list[tuple[np.ndarray, np.ndarray]] = []
    for column, pad in zip(values, pads, strict=True):
        zero = not pad.tobytes().strip(b"\0")  # all bits zero: not -0.0
        out = (np.zeros if zero else np.empty)((rows, max_len), dtype=column.dtype)
        outs.append(out)
        copies.append((out.reshape(-1), column))
        if not zero:
            fills.append((out.reshape(-1), pad))
    bounds = offsets.tolist()
    row = 0
    for start, end in itertools.pairwise(bounds):
        stop = row + end - start
        if stop > row:
            for flat, column in copies:
                flat[row:stop] = column[start:end]
        for flat, pad in fills:
            flat[stop : row + max_len] = pad
        row += max_len
    return outs
