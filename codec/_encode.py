"""Encoding: one GRPO group (K samples of one prompt) -> one ``pyarrow.RecordBatch``.

Memory: from contiguous numpy arrays and CPU tensors of the schema's dtypes the batch aliases the
caller's memory (no payload copy; Arrow keeps the sources alive, so do not write to them afterwards).
Per-sample arrays are concatenated, padded inputs packed and other dtypes converted: one copy each.
Python lists go through one ``pyarrow.array`` conversion (for integer columns, after a check that a
float is refused, not truncated). CUDA tensors are staged through one pinned host buffer
(:mod:`trajflight.codec._device`) and the batch aliases that buffer.

It does not guarantee that the returned batch is independent of the inputs: copy them first
(``np.copy``/``tensor.clone()``) if the rollout engine reuses its buffers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec._arrays import (
    doubly_ragged_array,
    is_tensor,
    ragged_array,
    repeated_row,
    scalar_array,
)
from trajflight.codec._device import stage_to_host
from trajflight.codec._infer import infer_type
from trajflight.codec._schema import STANDARD_SCHEMA, TrajectorySchema
from trajflight.codec._telemetry import telemetry_array
from trajflight.codec._validate import check_nulls, check_ragged_lengths, ragged_columns_agree
from trajflight.errors import SchemaError
from trajflight.keys import Partition

__all__ = ["default_sample_ids", "encode_group"]

_FINISH_REASON_TYPE = pa.dictionary(pa.int8(), pa.string())
_INT32_MAX = int(np.iinfo(np.int32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)
# Arguments without a default: None is not "left out" for them, as it is for the optional ones.
_REQUIRED_ARGUMENTS = ("prompt_ids", "response_ids", "response_logprobs", "reward", "policy_version")


def _check_key(job_id: object, epoch: object, group_id: object) -> Partition:
    if not isinstance(job_id, str) or not job_id:
        raise SchemaError(f"job_id must be a non-empty string, got {job_id!r}", column="job_id")
    if not job_id.isascii():
        try:
            job_id.encode()
        except UnicodeEncodeError as exc:
            raise SchemaError(
                f"job_id {job_id!r} is not valid UTF-8 text ({exc.reason} at position {exc.start}); "
                "Arrow strings are UTF-8: pass a job id without lone surrogates",
                column="job_id",
            ) from None
    for name, value in (("epoch", epoch), ("group_id", group_id)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | np.integer)
            or value < 0
            or value > _INT64_MAX
        ):
            raise SchemaError(
                f"{name} must be a non-negative integer that fits int64 (0..{_INT64_MAX}), got {value!r}",
                column=name,
            )
    return Partition(job_id, int(epoch), int(group_id))  # type: ignore[call-overload]


def _check_arguments(inputs: Mapping[str, Any], extra: object, schema: object) -> None:
    """The arguments' kinds, before any column is built: what would otherwise fail inside pyarrow."""
    for name in _REQUIRED_ARGUMENTS:
        if inputs[name] is None:
            raise SchemaError(
                f"{name} is required and was None; pass it in one of the forms encode_group documents",
                column=name,
            )
    if not isinstance(schema, TrajectorySchema):
        raise SchemaError(
            f"schema must be a TrajectorySchema (STANDARD_SCHEMA or STANDARD_SCHEMA.extend(...)), got "
            f"{type(schema).__name__}"
        )
    if extra is None:
        return
    if not isinstance(extra, Mapping):
        raise SchemaError(
            f"extra must be a mapping of column name to values, got {type(extra).__name__}; pass "
            "extra={'name': values}"
        )
    for name in extra:
        if not isinstance(name, str):
            raise SchemaError(f"extra column names must be strings, got {name!r}")
        if name in _STANDARD_ARGUMENTS:
            raise SchemaError(
                f"extra column {name!r} is a standard column; pass it as the keyword argument {name}=",
                column=name,
            )


def _is_flat_prompt(prompt: Any) -> bool:
    """A single prompt shared by the K samples: a 1-D array/tensor or a flat list of ints."""
    if isinstance(prompt, np.ndarray) or (is_tensor(prompt) and not prompt.is_nested):
        return bool(prompt.ndim == 1)
    return isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int | np.integer))


def _prompt_array(prompt: Any, rows: int) -> pa.ListArray:
    if not _is_flat_prompt(prompt):
        return ragged_array(prompt, pa.int32(), column="prompt_ids")
    # One prompt shared by the K samples: stored once per row, as the row-per-sample layout needs.
    return repeated_row(prompt, pa.int32(), rows, column="prompt_ids")


def _key_columns(key: Partition, rows: int) -> list[pa.Array]:
    """The columns job_id, epoch, group_id and sample_index of a group of ``rows`` samples."""
    indices = np.arange(rows, dtype=np.int32)  # what pa.array(np.arange(...)) wraps, without its overhead
    return [
        _job_column(key.job_id, rows),
        _int64_column(key.epoch, rows),
        _int64_column(key.group_id, rows),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(indices)], null_count=0),
    ]


def _job_column(job_id: str, rows: int) -> pa.Array:
    """``job_id`` (checked: non-empty UTF-8) for each of ``rows`` samples: its bytes repeated, offsets
    stepping by their length.

    Raises:
        SchemaError: the repeated bytes would pass 2**31 - 1 (a string column's int32 offsets).
    """
    value = job_id.encode()
    if len(value) * rows > _INT32_MAX:
        raise SchemaError(
            f"job_id of {len(value)} bytes, repeated for {rows} samples, passes 2**31 - 1 bytes; use a "
            "shorter job id",
            column="job_id",
        )
    offsets = np.arange(0, (rows + 1) * len(value), len(value), dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(value * rows)]
    return pa.Array.from_buffers(pa.string(), rows, buffers, null_count=0)


def _int64_column(value: int, rows: int) -> pa.Array:
    """``value`` (a checked key: 0..2**63 - 1) for each of ``rows`` samples, built as sample_index is."""
    values = np.empty(rows, dtype=np.int64)
    values.fill(value)
    return pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(values)], null_count=0)


def _sample_ids(key: Partition, rows: int) -> pa.Array:
    """The default sample ids ``"{job_id}/{epoch}/{group_id}/{sample_index}"``."""
    return default_sample_ids(key.job_id, key.epoch, [key.group_id], [rows])


def _given_sample_ids(sample_ids: Any, rows: int) -> pa.Array:
    """The caller's sample ids: one per sample (a lone string is not repeated) and no id twice.

    Raises:
        SchemaError: one id for the group, or an id given to two samples (naming the second's row).
    """
    if isinstance(sample_ids, str | bytes) or (isinstance(sample_ids, np.ndarray) and sample_ids.ndim == 0):
        raise SchemaError(
            f"sample_ids must hold one id per sample ({rows} here), got the single "
            f"{type(sample_ids).__name__} {sample_ids!r}; pass a list of ids, or leave sample_ids out for "
            "the default '{job_id}/{epoch}/{group_id}/{sample_index}'",
            column="sample_id",
        )
    array = scalar_array(sample_ids, pa.string(), column="sample_id", rows=rows)
    ids = array.to_pylist()  # a group's few ids: a pyarrow.compute kernel's fixed cost is more
    if len(set(ids)) != len(ids):
        _check_unique_ids(ids)
    return array


def _check_unique_ids(ids: list[str | None]) -> None:
    """Raise on the first id that an earlier sample already has; nulls are left to ``check_nulls``."""
    first: dict[str, int] = {}
    for row, id_ in enumerate(ids):
        if id_ is None:
            continue
        if id_ in first:
            raise SchemaError(
                f"column 'sample_id' row {row} repeats {id_!r} of row {first[id_]}: a sample id identifies "
                "one sample; give every sample its own id",
                column="sample_id",
                row=row,
            )
        first[id_] = row


@lru_cache(maxsize=256)
def _id_layout(samples: int, width: int) -> tuple[list[bytes], np.ndarray]:
    """``[b"", b"0", ..., b"{samples - 1}"]`` and the offsets (int64, read-only) of the ids that a prefix of
    ``width`` bytes joined with them makes: a pure function of two ints, so a job's few group sizes build
    it once (BENCHMARKS.md, "The codec", has what that saves)."""
    parts = [b"", *(str(i).encode() for i in range(samples))]
    offsets = np.cumsum([0, *(width + len(p) for p in parts[1:])], dtype=np.int64)
    offsets.flags.writeable = False
    return parts, offsets


def default_sample_ids(job_id: str, epoch: int, ids: Sequence[int], counts: Sequence[int]) -> pa.Array:
    """The default ids ``"{job_id}/{epoch}/{group_id}/{sample_index}"`` of the samples of several groups
    (``counts[i]`` samples of group ``ids[i]``, in order), as :func:`encode_group` gives them group by
    group: each group's prefix joined with its digits (one ``bytes.join``), no Python string per id.

    Raises:
        SchemaError: the ids would pass 2**31 - 1 bytes (a string column's int32 offsets).
        UnicodeEncodeError: a job id that is not valid UTF-8 (a lone surrogate).
    """
    prefixes = [f"{job_id}/{epoch}/{gid}/".encode() for gid in ids]
    layouts = [_id_layout(k, len(p)) for p, k in zip(prefixes, counts, strict=True)]
    chunks = [p.join(parts) for p, (parts, _) in zip(prefixes, layouts, strict=True)]
    if not layouts:
        return pa.array([], pa.string())
    if len(layouts) == 1:
        offsets = layouts[0][1]  # one group: its layout's offsets as they are
    else:
        sizes = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
        bases = np.cumsum(sizes) - sizes
        offsets = np.concatenate([o[:-1] for _, o in layouts] + [bases[-1:] + sizes[-1:]])
        offsets[:-1] += np.repeat(bases, counts)
    if offsets[-1] > _INT32_MAX:
        raise SchemaError("sample ids past 2**31 - 1 bytes", column="sample_id")
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(chunks))]
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1, buffers, null_count=0)


def _finish_reason_array(value: Any, rows: int) -> pa.Array:
    if isinstance(value, pa.Array | pa.ChunkedArray):
        array = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    else:
        array = scalar_array(value, pa.string(), column="finish_reason", rows=rows)
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    if len(array.dictionary) > np.iinfo(np.int8).max:
        raise SchemaError(
            f"column 'finish_reason' has {len(array.dictionary)} distinct values; at most 127 fit int8 codes",
            column="finish_reason",
        )
    return array.cast(_FINISH_REASON_TYPE)


def _check_per_sample_shape(name: str, value: Any, declared: pa.DataType | None) -> None:
    """Refuse an array of more dimensions than the column has, saying how such a column is stored.

    Rows of a 2-D array are a list column's rows (inferred, or declared ``list<T>``); more dimensions,
    or 2-D for a declared column of single values, have no column form of their own.
    """
    if not (isinstance(value, np.ndarray) or (is_tensor(value) and not value.is_nested)):
        return
    is_list = declared is not None and (pa.types.is_list(declared) or pa.types.is_large_list(declared))
    if value.ndim <= 1 or (value.ndim == 2 and (declared is None or is_list)):
        return
    shape = tuple(value.shape)
    raise SchemaError(
        f"column {name!r}: expected one value per sample (a 1-D array, or 2-D for a list column), got shape "
        f"{shape}; store each sample's values as one row: pass x.reshape({shape[0]}, -1) for a list column "
        f"(declared as pa.list_(<type>) where the schema declares {name!r}), or "
        "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(x) to keep each sample's shape "
        f"{shape[1:]} (a fixed_shape_tensor column; decode returns it as an Arrow array)",
        column=name,
    )


def _user_column(name: str, value: Any, declared: pa.DataType | None, rows: int) -> pa.Array:
    _check_per_sample_shape(name, value, declared)
    type_ = declared if declared is not None else infer_type(value, column=name)
    if pa.types.is_list(type_) and pa.types.is_list(type_.value_type):
        array = doubly_ragged_array(value, type_.value_type.value_type, column=name, null_entries=True)
    elif pa.types.is_list(type_) and pa.types.is_primitive(type_.value_type):
        array = ragged_array(value, type_.value_type, column=name, null_entries=True)
    else:
        array = scalar_array(value, type_, column=name, rows=rows)
    if len(array) != rows:
        raise SchemaError(
            f"column {name!r} has {len(array)} entries but the group has {rows} samples", column=name
        )
    return array


def encode_group(
    *,
    job_id: str,
    epoch: int,
    group_id: int,
    prompt_ids: Any,
    response_ids: Any,
    response_logprobs: Any,
    reward: Any,
    loss_mask: Any | None = None,
    advantage: Any | None = None,
    policy_version: Any = 0,
    sample_ids: Sequence[str] | None = None,
    top_p_ids: Any | None = None,
    top_p_probs: Any | None = None,
    finish_reason: Any | None = None,
    telemetry: Any | None = None,
    extra: Mapping[str, Any] | None = None,
    schema: TrajectorySchema = STANDARD_SCHEMA,
) -> pa.RecordBatch:
    """Build the record batch of one trajectory group (one row per sample).

    Ragged token columns (``prompt_ids``, ``response_ids``, ``response_logprobs``, ``loss_mask``) take
    any input of :mod:`trajflight.codec._arrays`: per-sample Python lists, per-sample arrays or tensors,
    a torch nested jagged tensor, ``(values, offsets)``, :class:`Padded`, a 2-D array, or a pyarrow
    array. CUDA tensors are accepted anywhere and staged through one pinned host buffer. A null entry
    inside a row of these or of the top-p columns is refused (decode could not decode the group); user
    columns keep theirs.

    Args:
        job_id: The training run.
        epoch: The job's incarnation (non-negative).
        group_id: The group's id, unique within job and epoch (non-negative).
        prompt_ids: Per-sample prompts, or one flat prompt (1-D array or list of ints) shared by all
            samples of the group.
        response_ids: Per-sample response token ids; fixes the number of samples K.
        response_logprobs: Per-token logprobs, same lengths as ``response_ids``. NaN/inf are kept.
        reward: One value per sample (sequence, array or tensor).
        loss_mask: Per-token mask (bools, numpy/torch bool arrays, or 0/1 integers), stored as uint8;
            default: every response token is trained on.
        advantage: One value per sample, ``None`` entries become nulls; omitted when not given.
        policy_version: The weights version, one int for the group or one per sample (ints: a float or
            a bool is refused, whole or not, as integer arrays of another dtype are).
        sample_ids: Globally unique ids, one per sample (a list, array or pyarrow array of strings: a
            single string is refused, not repeated); default
            ``"{job_id}/{epoch}/{group_id}/{sample_index}"``. Ids repeated within the group are refused
            (uniqueness across groups is the caller's).
        top_p_ids: Per sample, per response token, the candidate token ids (doubly ragged); ``None`` for
            a sample without candidates (a null row, decoded as a sample of zero tokens).
        top_p_probs: The candidates' probabilities, same shape as ``top_p_ids``: ``None`` for the same
            samples (one column ``None`` where the other is not is refused). Either column may be given
            alone.
        finish_reason: One string per sample (stored as ``dictionary<int8, string>``).
        telemetry: Per-sample engine telemetry: a list of dicts, a dict of per-sample columns or a
            pyarrow struct array.
        extra: User columns by name, typed by ``schema`` where it declares them, else inferred: from the
            values' dtype for arrays, tensors and the ragged containers (:class:`Ragged`,
            :class:`Padded`, :class:`DoublyRagged`, ``(values, offsets)``, per-sample tensors), by
            ``pyarrow`` for Python lists; one scalar is repeated for every sample; ``None`` leaves the
            column out. A per-sample array (``[K, ...]``) is stored as ``x.reshape(K, -1)`` (a list
            column) or as ``pyarrow.FixedShapeTensorArray.from_numpy_ndarray(x)`` (keeps the shape).
        schema: The job's schema (the standard one extended with user columns).

    Returns:
        A validated ``pyarrow.RecordBatch`` whose buffers alias contiguous inputs of matching dtype.

    Raises:
        SchemaError: naming the column (and row) of the first problem, also for arguments of the wrong
            kind (``None`` for a required column, a key past int64, a ``schema`` that is not a
            :class:`TrajectorySchema`, one string for ``sample_ids``); nothing is returned half-built.
    """
    key = _check_key(job_id, epoch, group_id)
    inputs: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_logprobs": response_logprobs,
        "reward": reward,
        "loss_mask": loss_mask,
        "advantage": advantage,
        "policy_version": policy_version,
        "top_p_ids": top_p_ids,
        "top_p_probs": top_p_probs,
        "telemetry": telemetry,
    }
    if (
        extra is not None
        or type(schema) is not TrajectorySchema
        or prompt_ids is None
        or response_ids is None
        or response_logprobs is None
        or reward is None
        or policy_version is None
    ):
        _check_arguments(inputs, extra, schema)
        inputs.update(extra or {})
    inputs = stage_to_host({k: v for k, v in inputs.items() if v is not None})

    responses = ragged_array(inputs["response_ids"], pa.int32(), column="response_ids")
    rows = len(responses)
    job_ids, epochs, group_ids, sample_indices = _key_columns(key, rows)
    arrays: dict[str, pa.Array] = {
        "job_id": job_ids,
        "epoch": epochs,
        "group_id": group_ids,
        "sample_index": sample_indices,
        "sample_id": _given_sample_ids(sample_ids, rows)
        if sample_ids is not None
        else _sample_ids(key, rows),
        "policy_version": scalar_array(
            inputs["policy_version"], pa.int64(), column="policy_version", rows=rows
        ),
        "prompt_ids": _prompt_array(inputs["prompt_ids"], rows),
        "response_ids": responses,
        "response_logprobs": ragged_array(
            inputs["response_logprobs"], pa.float32(), column="response_logprobs"
        ),
    }
    if "loss_mask" in inputs:
        arrays["loss_mask"] = ragged_array(inputs["loss_mask"], pa.uint8(), column="loss_mask")
    else:
        ones = np.ones(len(responses.values), dtype=np.uint8)
        arrays["loss_mask"] = pa.ListArray.from_arrays(responses.offsets, pa.array(ones))
    arrays["reward"] = scalar_array(inputs["reward"], pa.float32(), column="reward", rows=rows)
    if "advantage" in inputs:
        arrays["advantage"] = scalar_array(inputs["advantage"], pa.float32(), column="advantage", rows=rows)
    if "top_p_ids" in inputs:
        arrays["top_p_ids"] = doubly_ragged_array(inputs["top_p_ids"], pa.int32(), column="top_p_ids")
    if "top_p_probs" in inputs:
        arrays["top_p_probs"] = doubly_ragged_array(inputs["top_p_probs"], pa.float32(), column="top_p_probs")
    if finish_reason is not None:
        arrays["finish_reason"] = _finish_reason_array(finish_reason, rows)
    if "telemetry" in inputs:
        arrays["telemetry"] = telemetry_array(inputs["telemetry"], schema.field("telemetry").type, rows)
    for name in extra or {}:
        if name not in inputs:
            continue  # None: left out, as the optional keyword arguments are
        declared = schema.field(name).type if name in schema else None
        arrays[name] = _user_column(name, inputs[name], declared, rows)

    for name, array in arrays.items():
        if len(array) != rows:
            raise SchemaError(
                f"column {name!r} has {len(array)} rows but response_ids has {rows}: every column needs "
                "one entry per sample",
                column=name,
            )
    arrow = schema._group_schema(list(arrays), [array.type for array in arrays.values()])
    batch = pa.RecordBatch.from_arrays(list(arrays.values()), schema=arrow)
    # The key columns were built here; what came from the caller is checked.
    if any([array.null_count for array in arrays.values()]):
        check_nulls(batch, schema)
    if not ragged_columns_agree(arrays):
        check_ragged_lengths(batch)
    return batch


_STANDARD_ARGUMENTS = frozenset(STANDARD_SCHEMA.names)
