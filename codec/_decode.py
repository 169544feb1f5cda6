"""Decoding: record batches (one group, or several: a training batch) -> torch tensors or numpy arrays.

Memory and ownership:

* Primitive columns and the values of ``list<T>``/``list<list<T>>`` columns reach torch through DLPack
  (numpy through ``to_numpy(zero_copy_only=True)``) and **alias Arrow's buffers**: no copy, the tensors
  keep the Arrow memory alive, and writing to them writes to the Arrow data (a stored group, if the
  batch aliases one). Clone before writing.
* Offsets are normalised to start at zero; when a slice makes them start elsewhere they are rebased
  (a copy of ``rows + 1`` integers, never of the payload).
* Columns of several chunks (a table or a list of batches) are joined with one copy of their values.
* Buffers whose address is not a multiple of the element size (seen on Flight receive buffers) are
  copied once to aligned memory.
* ``bool`` columns are converted to ``uint8`` (one copy): Arrow's bit-packed booleans have no DLPack
  export. Nulls in primitive columns need ``fill_nulls`` (one copy); null rows of ``list<T>`` columns,
  and null entries inside the rows of any list column, are refused (the error names row and entry).
* A null row of a *nullable* ``list<list<T>>`` column (``top_p_ids``/``top_p_probs``: a sample without
  candidates, as ``encode_group`` writes ``None``) decodes as a sample of zero tokens
  (``outer_offsets[i] == outer_offsets[i + 1]``), the way Arrow already stores it: no copy. Only a null
  row spanning tokens (Arrow allows it; ``encode_group`` never writes one) costs a copy of the column
  that drops them. A column declared non-nullable refuses null rows. Where ``top_p_ids`` and
  ``top_p_probs`` are decoded together they must be null for the same samples (or their outer offsets
  would disagree); checked only where one has null rows.
* ``layout="padded"`` builds a new ``[rows, max_len]`` array or tensor per column (one copy, one pass
  over the rows, :mod:`trajflight.codec._pad`); the tensors are over
  numpy memory (``torch.from_numpy``: they own it, and are not resizable); ``device="cuda"`` adds the
  one pinned staging copy and an asynchronous host-to-device copy (:mod:`trajflight.codec._device`).

It does not guarantee that decoded CPU tensors stay valid if the caller frees Arrow memory by other
means than dropping references (for example by unmapping a file it mapped itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajflight.codec._containers import DoublyRagged, NumpyBatch, Padded, Ragged, TorchBatch
from trajflight.codec._decode_columns import DecodeColumn, Kind, columns_of
from trajflight.codec._jagged import jagged
from trajflight.codec._pad import pad_rows, padding_numpy, padding_torch
from trajflight.codec._validate import check_null_entries, check_same_null_rows
from trajflight.errors import InvalidRequestError, SchemaError

if TYPE_CHECKING:
    import torch

__all__ = ["Layout", "decode", "decode_numpy"]

Layout = Literal["jagged", "ragged", "padded"]

BatchLike: TypeAlias = pa.RecordBatch | pa.Table | Sequence[pa.RecordBatch]


@dataclass(frozen=True, slots=True)
class _Flat:
    values: pa.Array


@dataclass(frozen=True, slots=True)
class _List:
    values: pa.Array
    offsets: pa.Array
    max_len: int


@dataclass(frozen=True, slots=True)
class _List2:
    values: pa.Array
    outer: pa.Array
    inner: pa.Array


@dataclass(frozen=True, slots=True)
class _Other:
    array: pa.Array


_Plan = _Flat | _List | _List2 | _Other


def _as_table(data: BatchLike) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, Iterable) and not isinstance(
        data, str | bytes | Mapping | pa.Array | pa.ChunkedArray
    ):
        batches: list[Any] = list(data)
        if not batches:
            raise InvalidRequestError("decode() got an empty list of record batches; pass at least one")
        for i, batch in enumerate(batches):
            if not isinstance(batch, pa.RecordBatch):
                raise InvalidRequestError(f"decode() item {i} is a {type(batch).__name__}, not a RecordBatch")
            if not batch.schema.equals(batches[0].schema):
                raise SchemaError(
                    f"record batch {i} has another schema than batch 0 (columns {batch.schema.names} vs "
                    f"{batches[0].schema.names}); decode groups of one schema together or project with "
                    "columns=[...]",
                )
        return pa.Table.from_batches(batches)
    raise InvalidRequestError(
        f"decode() takes a RecordBatch, a Table or a list of RecordBatches, not {type(data).__name__}"
    )


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    return pa.concat_arrays(column.chunks)  # the one copy that joining groups costs


def _aligned(array: pa.Array) -> pa.Array:
    """``array`` itself, or an aligned copy when its data buffer is misaligned for its element type."""
    width = array.type.bit_width // 8
    buffer = array.buffers()[1]
    if buffer is None or width <= 1 or (buffer.address + array.offset * width) % width == 0:
        return array
    return pa.array(np.array(array.to_numpy(zero_copy_only=False), copy=True), type=array.type)


def _first_null(array: pa.Array) -> int:
    return int(pc.index(pc.is_null(array), True).as_py())


def _flat(name: str, array: pa.Array, fill_nulls: Mapping[str, Any]) -> _Flat:
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.uint8())
    if array.null_count:
        if name not in fill_nulls:
            row = _first_null(array)
            raise SchemaError(
                f"column {name!r} row {row} is null; pass fill_nulls={{{name!r}: value}} to decode it",
                column=name,
                row=row,
            )
        array = pc.fill_null(array, _fill_scalar(name, fill_nulls[name], array.type))
    return _Flat(_aligned(array))


def _fill_scalar(name: str, value: Any, type_: pa.DataType) -> pa.Scalar:
    """The fill value of a primitive column as a scalar of its (decoded) type; a bool counts as 0/1."""
    if value is None:
        raise InvalidRequestError(
            f"fill_nulls[{name!r}] is None; pass the value that replaces the column's nulls", column=name
        )
    given = value
    if isinstance(value, bool | np.bool_):  # bool columns decode as uint8: True fills as 1
        value = int(value)
    try:
        return pa.scalar(value, type=type_)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequestError(
            f"fill_nulls[{name!r}] = {given!r} does not fit the column's type {type_} ({exc}); pass a "
            "value of that type",
            column=name,
        ) from exc


def _rebased(array: pa.Array, *, longest: bool = False) -> tuple[pa.Array, pa.Array, int]:
    """(values, offsets, longest row or 0) of a list array, offsets starting at zero and values sliced to
    match; the longest row is measured only when asked (it reads every offset).

    Reads the offsets through a numpy view (no copy): cheaper than pyarrow scalars and compute kernels
    at the sizes of a training batch, where decode's fixed cost per column is what counts.
    """
    offsets = array.offsets
    view = offsets.to_numpy(zero_copy_only=False)  # a view unless the buffer is misaligned
    start, end = int(view[0]), int(view[-1])
    longest_row = int(np.diff(view).max()) if longest and len(view) > 1 else 0
    values = array.values.slice(start, end - start)
    if start:
        offsets = pc.subtract(offsets, pa.scalar(start, type=offsets.type))
    return values, _aligned(offsets), longest_row


def _no_null_rows(name: str, array: pa.Array, why: str) -> None:
    if array.null_count:
        row = _first_null(array)
        raise SchemaError(
            f"column {name!r}: row {row} is null; {why}: fill them (pyarrow.compute.fill_null) or leave "
            "the column out with columns=[...]",
            column=name,
            row=row,
        )


def _refuse_null_entry(name: str, array: pa.Array) -> None:
    """Raise for the first null entry (or token, or candidate) inside a row of list column ``array``,
    naming the row and the entry in it (:func:`~trajflight.codec._validate.check_null_entries`).

    Called where a child slice that the rows span holds a null (its null count: O(1), Arrow keeps it,
    so the path without nulls costs nothing more); ``array`` has no null row left, so that null is in a row.
    """
    try:
        check_null_entries(array, column=name)
    except SchemaError as exc:
        raise SchemaError(
            f"{exc.message}; to decode the other columns, leave this one out with columns=[...]",
            column=name,
            row=exc.row,
        ) from None
    raise SchemaError(  # not reached: check_null_entries finds every null inside the rows
        f"column {name!r} holds a null inside a row; fill it or leave the column out with columns=[...]",
        column=name,
    )


def _null_rows_as_no_tokens(name: str, array: pa.Array, nullable: bool) -> pa.Array:
    """``array`` (a list of lists) whose null rows read as rows of zero tokens: no candidates.

    ``array`` itself (no copy) where it has no null row, or where every null row already spans no token,
    as Arrow builds them (``encode_group`` given ``None``); otherwise a copy without the tokens under
    null rows. A column declared non-nullable (``nullable`` False) refuses null rows.
    """
    if not array.null_count:
        return array
    if not nullable:
        _no_null_rows(name, array, "the column is declared non-nullable")  # raises
    spans = np.diff(array.offsets.to_numpy(zero_copy_only=False))
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    if not spans[~valid].any():
        return array
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(np.where(valid, spans, 0), out=offsets[1:])
    tokens = pc.list_flatten(array)  # the valid rows' tokens, in order (one copy)
    if pa.types.is_large_list(array.type):
        return pa.LargeListArray.from_arrays(pa.array(offsets), tokens)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), tokens)


def _plan(column: DecodeColumn, array: pa.Array, fill_nulls: Mapping[str, Any]) -> _Plan:
    name, kind = column.name, column.kind
    if kind is Kind.FLAT:
        return _flat(name, array, fill_nulls)
    if kind is Kind.LIST:
        _no_null_rows(name, array, "ragged columns decode without nulls")
        values, offsets, max_len = _rebased(array, longest=True)
        if values.null_count:
            _refuse_null_entry(name, array)
        return _List(_aligned(values), offsets, max_len)
    if kind is Kind.LIST2:
        array = _null_rows_as_no_tokens(name, array, column.nullable)
        tokens, outer, _ = _rebased(array)
        values, inner, _ = _rebased(tokens)
        if tokens.null_count or values.null_count:
            _refuse_null_entry(name, array)
        return _List2(_aligned(values), outer, inner)
    return _Other(array)


def _plans(
    data: BatchLike, columns: Sequence[str] | None, fill_nulls: Mapping[str, Any] | None
) -> tuple[int, dict[str, _Plan]]:
    source = data if isinstance(data, pa.RecordBatch) else _as_table(data)
    if isinstance(columns, str | bytes):
        raise InvalidRequestError(
            f"columns must be a list of column names, got the string {columns!r}; pass columns=[{columns!r}]"
        )
    try:
        requested = None if columns is None else tuple(columns)
    except TypeError:
        raise InvalidRequestError(
            f"columns must be a list of column names, got {type(columns).__name__}"
        ) from None
    if fill_nulls is not None and not isinstance(fill_nulls, Mapping):
        raise InvalidRequestError(
            f"fill_nulls must be a mapping of column name to fill value, got {type(fill_nulls).__name__}; "
            "pass fill_nulls={'column': value}"
        )
    wanted = columns_of(source.schema, requested)
    fills = {} if fill_nulls is None else dict(fill_nulls)
    if isinstance(source, pa.RecordBatch):  # one group: its columns are single arrays already
        arrays = {c.name: source.column(c.index) for c in wanted.columns}
    else:
        arrays = {c.name: _single_chunk(source.column(c.index)) for c in wanted.columns}
    plans = {c.name: _plan(c, arrays[c.name], fills) for c in wanted.columns}
    if wanted.candidates:
        _check_candidate_rows(arrays["top_p_ids"], arrays["top_p_probs"])
    return source.num_rows, plans


def _check_candidate_rows(ids: pa.Array, probs: pa.Array) -> None:
    """top_p_ids and top_p_probs, both decoded, null (no candidates) for the same samples: a null row
    decodes as zero tokens, so one null in one column alone would give the two columns different outer
    offsets, and a loss pairing ids with probs would read another sample's. validate_group refuses such a
    group; data that skipped it (a file written by another tool) is refused here.

    O(1) where neither column has a null row (Arrow's kept null counts); otherwise reads both validity
    bitmaps (a copy of one bool per row).
    """
    try:
        check_same_null_rows(ids, probs)
    except SchemaError as exc:
        raise SchemaError(
            f"{exc.message}; to decode the other columns, leave these two out with columns=[...]",
            column=exc.column,
            row=exc.row,
        ) from None


def _check_layout(layout: str) -> None:
    if layout not in ("jagged", "ragged", "padded"):
        raise InvalidRequestError(f"layout must be 'jagged', 'ragged' or 'padded', got {layout!r}")


def _pad_numpy(
    name: str, values: np.ndarray, offsets: np.ndarray, max_len: int, pad: Any
) -> Padded[np.ndarray]:
    out = pad_rows(values, offsets, max_len, padding_numpy(name, pad, values.dtype))
    return Padded(out, np.diff(offsets).astype(np.int64))


def decode_numpy(
    data: BatchLike,
    *,
    columns: Sequence[str] | None = None,
    layout: Layout = "jagged",
    padding_value: float = 0,
    fill_nulls: Mapping[str, Any] | None = None,
) -> NumpyBatch:
    """Decode one or more groups to numpy arrays (the twin of :func:`decode`).

    Args:
        data: A record batch, a table or a list of record batches of one schema.
        columns: Columns to decode (default all), in this order.
        layout: ``"jagged"`` or ``"ragged"``: ``list<T>`` columns as :class:`Ragged` (values, offsets
            from 0); ``"padded"``: as :class:`Padded` (``[rows, max_len]`` array plus lengths, one copy).
        padding_value: Fill value of padded arrays.
        fill_nulls: Per primitive column, the value that replaces nulls (one copy).

    Returns:
        A :class:`NumpyBatch`; primitive arrays and ragged values alias Arrow's buffers (read-only
        views, no copy) except where the module docstring lists a copy. ``list<list<T>>`` columns are
        :class:`DoublyRagged` in every layout; a null row of a nullable one (a sample without top-p
        candidates) is a sample of zero tokens, as in :func:`decode`.

    Raises:
        SchemaError: a missing column, nulls without a fill value, a null row of a ``list<T>`` or
            non-nullable column, a null inside a list row, ``top_p_ids`` and ``top_p_probs`` (decoded
            together) null for different samples, or batches of different schemas.
        InvalidRequestError: an unknown layout, an input that is not Arrow data, ``columns`` or
            ``fill_nulls`` of the wrong kind, or a fill or padding value the column's type cannot hold
            (``column`` names it).
    """
    _check_layout(layout)
    rows, plans = _plans(data, columns, fill_nulls)
    out = NumpyBatch(rows, tuple(plans), {}, {}, {}, {}, {})
    for name, plan in plans.items():
        if isinstance(plan, _Flat):
            out.arrays[name] = plan.values.to_numpy(zero_copy_only=True)
        elif isinstance(plan, _List):
            values = plan.values.to_numpy(zero_copy_only=True)
            offsets = plan.offsets.to_numpy(zero_copy_only=True)
            if layout == "padded":
                out.padded[name] = _pad_numpy(name, values, offsets, plan.max_len, padding_value)
            else:
                out.ragged[name] = Ragged(values, offsets)
        elif isinstance(plan, _List2):
            out.doubly_ragged[name] = DoublyRagged(
                *(a.to_numpy(zero_copy_only=True) for a in (plan.values, plan.outer, plan.inner))
            )
        else:
            out.arrow[name] = plan.array
    return out


class _SharedOffsets:
    """Offsets of the list columns decoded so far, to give columns of equal row lengths one tensor.

    torch's jagged tensors are compatible for elementwise operations (``logprobs * loss_mask``) only when
    they share their offsets tensor; equal values in two tensors are refused.
    """

    def __init__(self) -> None:
        self._seen: list[tuple[pa.Array, int]] = []

    def find(self, offsets: pa.Array) -> int | None:
        """The host slot of earlier offsets equal to ``offsets`` (in value: int32 and int64 offsets of the
        same rows match), or None."""
        for earlier, at in self._seen:
            if len(earlier) != len(offsets):
                continue
            if earlier.type.equals(offsets.type):  # Arrow's comparison: a fraction of numpy's fixed cost
                if earlier.equals(offsets):
                    return at
            elif np.array_equal(
                earlier.to_numpy(zero_copy_only=False), offsets.to_numpy(zero_copy_only=False)
            ):
                return at
        return None

    def add(self, offsets: pa.Array, at: int) -> None:
        self._seen.append((offsets, at))


def _padded(plans: Mapping[str, _Plan], pad: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each ``list<T>`` column of ``plans`` padded to ``[rows, max_len]`` plus its int64 lengths (new
    tensors over numpy memory, see :mod:`trajflight.codec._pad`). Checks every column's padding value
    before padding any."""
    import torch
    from torch.utils.dlpack import from_dlpack

    lists = {name: plan for name, plan in plans.items() if isinstance(plan, _List)}
    pads = {name: padding_torch(name, pad, from_dlpack(plan.values).dtype) for name, plan in lists.items()}
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, plan in lists.items():
        values = plan.values.to_numpy(zero_copy_only=True)
        offsets = plan.offsets.to_numpy(zero_copy_only=True)
        padded = pad_rows(values, offsets, plan.max_len, pads[name])
        out[name] = (torch.from_numpy(padded), torch.from_numpy(np.diff(offsets).astype(np.int64)))
    return out


def decode(
    data: BatchLike,
    *,
    columns: Sequence[str] | None = None,
    layout: Layout = "jagged",
    device: str | None = None,
    padding_value: float = 0,
    fill_nulls: Mapping[str, Any] | None = None,
) -> TorchBatch:
    """Decode one or more groups (a training batch) to torch tensors through DLPack.

    Args:
        data: A record batch, a table or a list of record batches of one schema.
        columns: Columns to decode (default all), in this order.
        layout: ``"jagged"``: ``list<T>`` columns as jagged nested tensors, equal to
            ``torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=...)`` (built at a
            third of its cost where torch allows, :mod:`trajflight.codec._jagged`);
            ``"ragged"``: as :class:`Ragged` values plus int32 offsets tensors in ``.ragged`` (the same
            memory, without any nested-tensor construction cost);
            ``"padded"``: as :class:`Padded` (``[rows, max_len]`` tensor plus int64 lengths, one copy,
            over numpy memory it owns: not resizable).
            With ``"jagged"`` and ``"ragged"``, list columns whose rows have the same lengths (a group's
            response ids, logprobs and loss mask) share one offsets tensor, so that torch accepts
            elementwise operations between their jagged tensors (``logprobs * loss_mask``).
        device: ``None``/``"cpu"`` keeps tensors on the host, aliasing Arrow; a CUDA device moves every
            tensor through one pinned staging buffer with one non-blocking copy on a side stream (the
            caller's current stream is made to wait for it).
        padding_value: Fill value of padded tensors.
        fill_nulls: Per primitive column, the value that replaces nulls (one copy).

    Returns:
        A :class:`TorchBatch`. On the CPU, primitive tensors and the values of ragged tensors alias
        Arrow's buffers (no copy; writes go through to the Arrow data) except where the module
        docstring lists a copy. ``list<list<T>>`` columns are :class:`DoublyRagged` in every layout; a
        null row of a nullable one (``top_p_*`` of a sample without candidates, ``None`` at encode) is a
        sample of zero tokens, ``outer_offsets[i] == outer_offsets[i + 1]``, while its response has
        tokens: index candidates per sample through ``outer_offsets``, not by response token position.
        Strings, structs and dictionaries stay Arrow arrays in ``.arrow``.

    Raises:
        SchemaError: a missing column, nulls without a fill value, a null row of a ``list<T>`` or
            non-nullable column, a null inside a list row, ``top_p_ids`` and ``top_p_probs`` (decoded
            together) null for different samples, or batches of different schemas.
        InvalidRequestError: an unknown layout or device, a CUDA device where torch has no CUDA, an input
            that is not Arrow data, ``columns`` or ``fill_nulls`` of the wrong kind, or a fill or padding
            value the column's type cannot hold (``column`` names it).
    """
    import torch
    from torch.utils.dlpack import from_dlpack

    _check_layout(layout)
    try:
        target = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:  # torch's words for a string or type it cannot parse
        raise InvalidRequestError(f"device must be 'cpu' or a CUDA device, got {device!r} ({exc})") from exc
    on_cpu = target is None or target.type == "cpu"
    if target is not None and target.type not in ("cpu", "cuda"):
        raise InvalidRequestError(f"device must be 'cpu' or a CUDA device, got {device!r}")
    if not on_cpu and not torch.cuda.is_available():
        raise InvalidRequestError(
            f"device {device!r} was asked for but torch.cuda.is_available() is False (a CPU build of torch, "
            "or no GPU visible); decode with device=None, or install a CUDA build of torch"
        )
    rows, plans = _plans(data, columns, fill_nulls)
    padded = _padded(plans, padding_value) if layout == "padded" else None
    # Host tensors first (zero-copy views of Arrow), in a flat list so a device move is one copy.
    host: list[torch.Tensor] = []
    slots: dict[str, tuple[int, ...]] = {}
    shared = _SharedOffsets()
    arrow: dict[str, pa.Array] = {}
    max_lens: dict[str, int] = {}
    for name, plan in plans.items():
        if isinstance(plan, _Flat):
            pieces: tuple[torch.Tensor, ...] = (from_dlpack(plan.values),)
        elif isinstance(plan, _List):
            if padded is not None:
                pieces = padded[name]
            else:
                values = from_dlpack(plan.values)
                max_lens[name] = plan.max_len
                at = shared.find(plan.offsets)
                if at is not None:  # the same rows as an earlier column: one offsets tensor for both
                    slots[name] = (len(host), at)
                    host.append(values)
                    continue
                shared.add(plan.offsets, len(host) + 1)
                pieces = (values, from_dlpack(plan.offsets))
        elif isinstance(plan, _List2):
            pieces = tuple(from_dlpack(a) for a in (plan.values, plan.outer, plan.inner))
        else:
            arrow[name] = plan.array
            continue
        slots[name] = tuple(range(len(host), len(host) + len(pieces)))
        host.extend(pieces)

    keepalive = None
    tensors_out = host
    if not on_cpu and host:
        from trajflight.codec._device import to_device

        tensors_out, keepalive = to_device(host, str(device))

    out = TorchBatch(rows, tuple(plans), {}, {}, {}, {}, arrow, "cpu" if on_cpu else str(device), keepalive)
    first_over: dict[int, torch.Tensor] = {}  # offsets slot -> the first jagged tensor over it
    for name, plan in plans.items():
        if name not in slots:
            continue
        got = [tensors_out[i] for i in slots[name]]
        if isinstance(plan, _Flat):
            out.tensors[name] = got[0]
        elif isinstance(plan, _List) and layout == "padded":
            out.padded[name] = Padded(got[0], got[1])
        elif isinstance(plan, _List) and layout == "ragged":
            out.ragged[name] = Ragged(got[0], got[1])
        elif isinstance(plan, _List):
            # Columns of one offsets tensor: the later ones are built from the first (cheaper).
            like = first_over.get(slots[name][1])
            out.tensors[name] = nested = jagged(got[0], got[1], max_lens[name], like=like)
            first_over.setdefault(slots[name][1], nested)
        else:
            out.doubly_ragged[name] = DoublyRagged(got[0], got[1], got[2])
    return out
