"""Typed containers for ragged data, used both as encode inputs and as decode outputs.

The same three shapes appear on both sides of the codec, holding numpy arrays or torch tensors:

* :class:`Ragged` — ``values`` plus ``offsets`` (``len(offsets) == rows + 1``), row ``i`` is
  ``values[offsets[i]:offsets[i + 1]]``.
* :class:`Padded` — a ``[rows, max_len]`` array plus per-row ``lengths``.
* :class:`DoublyRagged` — per sample, per token, a ragged candidate set: ``values``, ``outer_offsets``
  (sample -> token range) and ``inner_offsets`` (token -> value range).

These are plain records: they neither own nor copy memory; whoever built them says what they alias.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

__all__ = ["DoublyRagged", "NumpyBatch", "Padded", "Ragged", "TorchBatch"]

ArrayT = TypeVar("ArrayT")


@dataclass(frozen=True, slots=True)
class Ragged(Generic[ArrayT]):
    """Rows of varying length as ``values`` and ``offsets`` (offsets[0] may be non-zero on input)."""

    values: ArrayT
    offsets: ArrayT


@dataclass(frozen=True, slots=True)
class Padded(Generic[ArrayT]):
    """Rows padded to a common length: ``values[i, :lengths[i]]`` is row ``i``."""

    values: ArrayT
    lengths: ArrayT


@dataclass(frozen=True, slots=True)
class DoublyRagged(Generic[ArrayT]):
    """Two levels of raggedness (per sample, per token, candidates), e.g. ``top_p_ids``.

    Sample ``i`` spans tokens ``outer_offsets[i]:outer_offsets[i + 1]``; token ``j`` spans values
    ``inner_offsets[j]:inner_offsets[j + 1]``. Decoded offsets always start at zero. A sample without
    candidates (a null row, ``None`` at encode in ``top_p_ids`` and ``top_p_probs`` alike) decodes as a
    sample of zero tokens.
    """

    values: ArrayT
    outer_offsets: ArrayT
    inner_offsets: ArrayT


@dataclass(frozen=True, slots=True)
class TorchBatch:
    """A decoded batch of torch tensors, one entry per requested column, grouped by kind.

    Attributes:
        num_rows: Samples in the batch.
        columns: The decoded column names, in the order asked for.
        tensors: Primitive columns as 1-D tensors and, with ``layout="jagged"``, ``list<T>`` columns as
            jagged nested tensors (``torch.nested.nested_tensor_from_jagged``).
        ragged: With ``layout="ragged"``, ``list<T>`` columns as plain ``values`` plus int32 ``offsets``
            tensors (``cu_seqlens`` for variable-length kernels): no nested-tensor construction cost.
        padded: With ``layout="padded"``, ``list<T>`` columns as ``[rows, max_len]`` tensors plus lengths.
        doubly_ragged: ``list<list<T>>`` columns (top-p candidates) as values plus both offset levels.
        arrow: Columns torch cannot hold (strings, dictionaries, structs, ...) left as Arrow arrays.
        device: The device every tensor lives on.
    """

    num_rows: int
    columns: tuple[str, ...]
    tensors: dict[str, torch.Tensor]
    ragged: dict[str, Ragged[torch.Tensor]]
    padded: dict[str, Padded[torch.Tensor]]
    doubly_ragged: dict[str, DoublyRagged[torch.Tensor]]
    arrow: dict[str, pa.Array]
    device: str = "cpu"
    # Keeps the pinned staging buffer alive while an asynchronous H2D copy may still read it.
    _keepalive: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class NumpyBatch:
    """A decoded batch of numpy arrays; the numpy twin of :class:`TorchBatch`.

    Attributes:
        num_rows: Samples in the batch.
        columns: The decoded column names, in the order asked for.
        arrays: Primitive columns as 1-D arrays.
        ragged: With ``layout="jagged"`` or ``"ragged"``, ``list<T>`` columns as values plus offsets
            (starting at 0).
        padded: With ``layout="padded"``, ``list<T>`` columns as ``[rows, max_len]`` arrays plus lengths.
        doubly_ragged: ``list<list<T>>`` columns as values plus both offset levels.
        arrow: Columns numpy cannot hold without conversion (strings, dictionaries, structs, ...).
    """

    num_rows: int
    columns: tuple[str, ...]
    arrays: dict[str, Any]
    ragged: dict[str, Ragged[Any]]
    padded: dict[str, Padded[Any]]
    doubly_ragged: dict[str, DoublyRagged[Any]]
    arrow: dict[str, pa.Array]
