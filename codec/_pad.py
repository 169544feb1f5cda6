"""Padding ragged columns to ``[rows, max_len]`` arrays: the one route of ``layout="padded"``.

:func:`pad_rows` copies each row once (one numpy slice copy per row) and pads its tail; a zero padding
value (all bits zero) is not written at all: the output comes from
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
from collections.abc import Callable
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


def pad_rows(values: np.ndarray, offsets: np.ndarray, max_len: int, pad: np.ndarray) -> np.ndarray:
    """``values`` padded: ``out[i, :n_i]`` is row ``i``, the rest of the row is ``pad``.

    Args:
        values: The column's values (1-D; row ``i`` is ``values[offsets[i]:offsets[i + 1]]``).
        offsets: The rows' offsets, starting at zero.
        max_len: The longest row's length (the output's width; not checked).
        pad: The padding value, a 0-d array of ``values.dtype`` as :func:`padding_torch` or
            :func:`padding_numpy` make it.

    Returns:
        A new C-contiguous ``[rows, max_len]`` array that owns its memory.
    """
    rows = max(len(offsets) - 1, 0)
    zero = not pad.tobytes().strip(b"\0")  # all bits zero: not -0.0
    out = (np.zeros if zero else np.empty)((rows, max_len), dtype=values.dtype)
    flat = out.reshape(-1)
    row = 0
    for start, end in itertools.pairwise(offsets.tolist()):
        stop = row + end - start
        if stop > row:
            flat[row:stop] = values[start:end]
        if not zero:
            flat[stop : row + max_len] = pad
        row += max_len
    return out
