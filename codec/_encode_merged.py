"""The merged tier of :func:`~trajflight.codec.encode_groups`: many groups through one encode_group call.

For groups in the common form (every group of the same columns as numpy arrays: ragged columns as
``(values, offsets)`` or :class:`Ragged`/:class:`DoublyRagged` whose offsets run from 0 to the values'
length, one flat prompt or ``(values, offsets)``, 1-D reward/advantage, a Python int or 1-D array policy
version, one dtype per column across the groups, user columns (``extra``) of 1-D numpy arrays, one value
per sample, under the same names in the same order in every group; no sample ids, finish reasons or
telemetry), :func:`merged` checks per group only what merging could hide (each column's sample count, the
offsets' ends), concatenates the groups into one pseudo-group of all samples (one copy of the payload;
a flat prompt tiled once per sample, as encode_group stores it) and runs :func:`encode_group` once on it,
so every per-sample check has one code path. It then builds the columns that depend on the group
(group_id, sample_index, sample_id) vectorised, as encode_group builds them per group.

Why the result is what the groups one by one give: merging keeps every sample's rows and every value's
dtype, and every value lies in some row (the offsets' ends are checked), so each element-wise check
(dtype, range, row lengths, offsets that decrease) sees the same values; the checks per group (sample
counts) run before merging. The Arrow schema is a function of the columns' names and types, which are
the same.

It never refuses: where the form is another or the merged encode fails, it returns None and the caller
encodes group by group, which words the error for the group at fault (or builds what merging could not,
such as columns past 2**31 - 1 values in all). The arrays it builds are new: nothing aliases the inputs.
It does not guarantee that it applies: any input outside the common form above takes the per-group route.
It stays beside that route because it pays on the standard workload (BENCHMARKS.md, "The codec").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec._containers import DoublyRagged, Ragged
from trajflight.codec._encode import default_sample_ids, encode_group
from trajflight.codec._schema import TrajectorySchema
from trajflight.errors import SchemaError

__all__ = ["merged"]

_INT32_MAX = int(np.iinfo(np.int32).max)
# The merged tier's columns, by form.
_RAGGED = ("response_ids", "response_logprobs", "loss_mask")
_DOUBLY_RAGGED = ("top_p_ids", "top_p_probs")
_PER_SAMPLE = ("reward", "advantage")
_MERGEABLE = frozenset({"group_id", "prompt_ids", "extra", *_RAGGED, *_DOUBLY_RAGGED, *_PER_SAMPLE})
_REQUIRED = frozenset({"group_id", "prompt_ids", "response_ids", "response_logprobs", "reward"})
_OFFSET_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))  # native order
_VALUE_KINDS = frozenset("biuf")


def _pair(
    obj: object, samples: int | None, response: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(values, offsets)`` of a ragged input in the merged tier's form, or None: numpy values (1-D, of a
    value kind) and native int32/int64 offsets from 0 to ``len(values)``, ``samples + 1`` of them.

    Offsets that are the very array of the group's ``response`` pair (as a rollout engine shares them)
    were checked with it: only the values' length is compared with the response's.
    """
    if isinstance(obj, tuple) and len(obj) == 2:
        values, offsets = obj
    elif isinstance(obj, Ragged):
        values, offsets = obj.values, obj.offsets
    else:
        return None
    if type(values) is not np.ndarray or type(offsets) is not np.ndarray:
        return None
    if values.ndim != 1 or values.dtype.kind not in _VALUE_KINDS:
        return None
    if response is not None and offsets is response[1]:
        return (values, offsets) if len(values) == len(response[0]) else None
    if not _bounds(offsets, len(values)) or (samples is not None and len(offsets) != samples + 1):
        return None
    return values, offsets


def _bounds(offsets: np.ndarray, last: int) -> bool:
    """Whether ``offsets`` are 1-D native int32/int64 from 0 to ``last``: every value lies in some row,
    so the merged checks read each value the group's own would."""
    return (
        offsets.ndim == 1
        and offsets.dtype in _OFFSET_DTYPES
        and len(offsets) > 0
        and offsets[0] == 0
        and offsets[-1] == last
    )


def _triple(obj: object, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(values, outer, inner)`` of a :class:`DoublyRagged` in the merged tier's form, or None."""
    if not isinstance(obj, DoublyRagged):
        return None
    values, outer, inner = obj.values, obj.outer_offsets, obj.inner_offsets
    if type(values) is not np.ndarray or type(outer) is not np.ndarray or type(inner) is not np.ndarray:
        return None
    if values.ndim != 1 or values.dtype.kind not in _VALUE_KINDS or len(outer) != samples + 1:
        return None
    if not (_bounds(inner, len(values)) and _bounds(outer, len(inner) - 1)):
        return None
    return values, outer, inner


def _one_dtype(arrays: list[np.ndarray]) -> bool:
    """Whether the arrays share one dtype of a value kind: concatenated, each value keeps its dtype."""
    dtype = arrays[0].dtype
    return dtype.kind in _VALUE_KINDS and all(a.dtype == dtype for a in arrays)


class _Offsets:
    """Merged offsets, built once per distinct list of per-group offsets arrays (columns that share their
    offsets share the merged ones, so encode_group finds their row lengths agree by address)."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, ...], np.ndarray] = {}

    def merge(self, parts: list[np.ndarray]) -> np.ndarray:
        """One offsets array for the concatenated rows of ``parts`` (each from 0 to its last value)."""
        key = tuple(map(id, parts))  # the parts stay alive (referenced by the groups) during the call
        merged = self._built.get(key)
        if merged is None:
            merged = self._built[key] = _merge_offsets(parts)
        return merged


def _merge_offsets(parts: list[np.ndarray]) -> np.ndarray:
    """Rebase and concatenate offsets arrays that each start at 0, as int32 where every part is int32 and
    the rows span at most 2**31 - 1 values, else as int64 (narrowed to int32 where every value fits, as
    encode_group narrows: exactly, so its checks see the same values).

    The int32 sums wrap only where a part holds a value past its own last one (so it decreases after it,
    and encode_group refuses the part): the wrapped value is negative, and the merged offsets decrease
    too. Valid parts give the int64 result exactly, and invalid ones are refused either way.
    """
    counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)) - 1
    narrow = all(p.dtype == np.int32 for p in parts)
    merged: np.ndarray = np.empty(int(counts.sum()) + 1, dtype=np.int32 if narrow else np.int64)
    merged[0] = 0
    body = merged[1:]
    np.concatenate([p[1:] for p in parts], out=body, casting="same_kind")
    ends = np.cumsum(counts)
    # Each part's last offset, its span, read from the concatenation (merged[end] is body[end - 1]).
    lasts = np.where(counts > 0, merged[ends], 0).astype(np.int64)
    bases = np.cumsum(lasts) - lasts
    if narrow and int(lasts.sum()) > _INT32_MAX:
        return _merge_offsets([p.astype(np.int64) for p in parts])  # past int32: encode_group refuses it
    if len(body) > 64 * len(parts):  # long parts (one offset per token): add in place, one pass
        for start, stop, base in zip((ends - counts).tolist(), ends.tolist(), bases.tolist(), strict=True):
            if base:
                np.add(body[start:stop], base, out=body[start:stop])
    else:
        np.add(body, np.repeat(bases, counts).astype(merged.dtype), out=body)
    if narrow or merged.min() < 0 or merged.max() > _INT32_MAX:
        return merged
    return merged.astype(np.int32)


def merged(
    job_id: str, epoch: int, groups: Sequence[Mapping[str, Any]], ids: list[int], schema: TrajectorySchema
) -> tuple[pa.RecordBatch, tuple[int, ...]] | None:
    """The groups as one pseudo-group through one encode_group call, or None where the precise tier must
    build them (another form, or a refusal, which the precise tier words for the group at fault)."""
    if type(schema) is not TrajectorySchema:
        return None
    names = _names(groups[0])
    if names is None:
        return None
    ragged: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in _RAGGED if n in names}
    doubly: dict[str, list[tuple[np.ndarray, ...]]] = {n: [] for n in _DOUBLY_RAGGED if n in names}
    per_sample: dict[str, list[np.ndarray]] = {n: [] for n in _PER_SAMPLE if n in names}
    users = _user_names(groups[0].get("extra"), schema) if "extra" in names else ()
    if users is None:
        return None
    extra: dict[str, list[np.ndarray]] = {n: [] for n in users}
    prompts: list[np.ndarray] = []
    prompt_pairs: list[tuple[np.ndarray, np.ndarray]] = []
    versions: list[Any] = []
    counts: list[int] = []
    # A group of the same keys as a first group without None values gives the same columns (each value is
    # read below, where None is no form of the merged tier): the set of names is built only otherwise.
    keys = frozenset(groups[0]) if len(names) + ("policy_version" in groups[0]) == len(groups[0]) else None
    for group in groups:
        if (keys is None or group.keys() != keys) and _names(group) != names:
            return None  # other columns: the precise tier encodes and compares the schemas
        response = _pair(group["response_ids"], None)
        if response is None:
            return None
        k = len(response[1]) - 1
        counts.append(k)
        for name, parts in ragged.items():
            pair = response if name == "response_ids" else _pair(group[name], k, response)
            if pair is None:
                return None
            parts.append(pair)
        for name, triples in doubly.items():
            triple = _triple(group[name], k)
            if triple is None:
                return None
            triples.append(triple)
        for name, arrays in per_sample.items():
            array = group[name]
            if type(array) is not np.ndarray or array.ndim != 1 or len(array) != k:
                return None
            arrays.append(array)
        if "extra" in names and not _user_arrays(group["extra"], users, k, extra):
            return None
        prompt = group["prompt_ids"]
        if type(prompt) is np.ndarray and prompt.ndim == 1:
            if not k:
                return None  # no copy of the prompt would be checked
            prompts.append(prompt)
        else:
            pair = _pair(prompt, k)
            if pair is None:
                return None
            prompt_pairs.append(pair)
        versions.append(group.get("policy_version", 0))
    arguments = _merged_arguments(ragged, doubly, per_sample, prompts, prompt_pairs, versions, counts)
    if arguments is None or not all(map(_one_dtype, extra.values())):
        return None
    if extra:
        arguments["extra"] = {name: _concatenate(arrays) for name, arrays in extra.items()}
    try:
        batch = encode_group(job_id=job_id, epoch=epoch, group_id=ids[0], schema=schema, **arguments)
        return _with_group_columns(batch, job_id, epoch, ids, counts), tuple(counts)
    except Exception:  # the precise tier raises the group's own error, or builds what merging could not
        return None


def _names(group: Mapping[str, Any]) -> frozenset[str] | None:
    """The columns a group gives (None values left out, as encode_group leaves them), where the merged
    tier takes them all, or None."""
    names = frozenset(k for k, v in group.items() if v is not None and k != "policy_version")
    return names if _REQUIRED <= names <= _MERGEABLE else None


def _user_names(extra: object, schema: TrajectorySchema) -> tuple[str, ...] | None:
    """The user columns of a first group, in order, where the merged tier takes them (a dict of string
    names the schema declares as no nested type, or does not declare), or None."""
    if type(extra) is not dict or not all(type(name) is str for name in extra):
        return None
    for name in extra:
        if name in schema and not pa.types.is_primitive(schema.field(name).type):
            return None  # a list column given one value per sample: the precise tier says what is wrong
    return tuple(extra)


def _user_arrays(
    extra: object, names: tuple[str, ...], samples: int, out: dict[str, list[np.ndarray]]
) -> bool:
    """Append a group's user columns to ``out``: whether they are in the merged tier's form (the same
    names, in the same order, as the first group's; each a 1-D numpy array of a value kind, one value per
    sample; concatenated, every value keeps its row and its dtype)."""
    if type(extra) is not dict or tuple(extra) != names:
        return False
    for name, array in extra.items():
        if type(array) is not np.ndarray or array.ndim != 1 or len(array) != samples:
            return False
        if array.dtype.kind not in _VALUE_KINDS:
            return False
        out[name].append(array)
    return True


def _merged_arguments(
    ragged: dict[str, list[tuple[np.ndarray, np.ndarray]]],
    doubly: dict[str, list[tuple[np.ndarray, ...]]],
    per_sample: dict[str, list[np.ndarray]],
    prompts: list[np.ndarray],
    prompt_pairs: list[tuple[np.ndarray, np.ndarray]],
    versions: list[Any],
    counts: list[int],
) -> dict[str, Any] | None:
    """encode_group's column arguments for all samples of the groups, or None for a form the merged tier
    does not take (a dtype that differs between groups, mixed prompt or policy version forms)."""
    if prompts and prompt_pairs:
        return None  # flat prompts in some groups, per-sample ones in others
    columns = [[v for v, _ in pairs] for pairs in ragged.values()]
    columns += [[t[0] for t in triples] for triples in doubly.values()]
    columns += [*per_sample.values(), [v for v, _ in prompt_pairs] or prompts]
    version = _merged_versions(versions, counts)
    if version is None or not all(map(_one_dtype, columns)):
        return None  # checked before anything is copied
    offsets = _Offsets()
    arguments: dict[str, Any] = {"policy_version": version}
    for name, pairs in ragged.items():
        arguments[name] = (_concatenate([v for v, _ in pairs]), offsets.merge([o for _, o in pairs]))
    for name, triples in doubly.items():
        outer = offsets.merge([t[1] for t in triples])
        inner = offsets.merge([t[2] for t in triples])
        arguments[name] = DoublyRagged(_concatenate([t[0] for t in triples]), outer, inner)
    for name, arrays in per_sample.items():
        arguments[name] = _concatenate(arrays)
    if prompt_pairs:
        values = _concatenate([v for v, _ in prompt_pairs])
        arguments["prompt_ids"] = (values, offsets.merge([o for _, o in prompt_pairs]))
    else:
        arguments["prompt_ids"] = _tiled_prompts(prompts, counts)
    return arguments


def _empty(size: int, dtype: np.dtype) -> np.ndarray:
    """A new numpy array of ``size`` items in memory from Arrow's default pool (the array owns the buffer).

    Not numpy's own allocation: glibc hands a large freed block back to the kernel, and a new one of
    megabytes is paid for again in page faults; Arrow's pool keeps freed pages for the next batch, as
    encode_group + join relies on (BENCHMARKS.md, "The codec", has what it saves).
    """
    return np.frombuffer(pa.allocate_buffer(size * dtype.itemsize), dtype=dtype, count=size)


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` (of one dtype) into memory from Arrow's pool (see :func:`_empty`)."""
    out = _empty(sum(len(a) for a in arrays), arrays[0].dtype)
    np.concatenate(arrays, out=out)
    return out


def _tiled_prompts(prompts: list[np.ndarray], counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each group's flat prompt once per sample, as ``(values, offsets)``: the copy encode_group makes of
    a shared prompt, made once into one array."""
    lengths = np.fromiter(map(len, prompts), dtype=np.int64, count=len(prompts))
    rows = np.asarray(counts, dtype=np.int64)
    values = _empty(int(lengths @ rows), prompts[0].dtype)
    position = 0
    for prompt, k in zip(prompts, counts, strict=True):
        size = len(prompt) * k
        values[position : position + size].reshape(k, len(prompt))[...] = prompt
        position += size
    offsets = np.zeros(int(rows.sum()) + 1, dtype=np.int64)
    np.cumsum(np.repeat(lengths, rows), out=offsets[1:])
    return values, offsets


def _merged_versions(versions: list[Any], counts: list[int]) -> Any | None:
    """One policy version per sample (one int where every group has the same), or None where the groups
    do not all give a Python int or all a 1-D numpy array (one per sample) of one dtype."""
    if all(type(v) is int for v in versions):
        if all(v == versions[0] for v in versions):
            return versions[0]
        try:
            return np.repeat(np.array(versions, dtype=np.int64), counts)
        except OverflowError:
            return None
    arrays = [v for v in versions if type(v) is np.ndarray and v.ndim == 1]
    if len(arrays) != len(versions) or any(len(a) != k for a, k in zip(arrays, counts, strict=True)):
        return None
    return _concatenate(arrays) if _one_dtype(arrays) else None  # small: one int64 per sample


def _with_group_columns(
    batch: pa.RecordBatch, job_id: str, epoch: int, ids: list[int], counts: list[int]
) -> pa.RecordBatch:
    """``batch`` (the merged pseudo-group) with group_id, sample_index and sample_id per group, as
    encode_group builds them for each group."""
    rows = np.asarray(counts, dtype=np.int64)
    total = int(rows.sum())
    if total != batch.num_rows:
        raise SchemaError(f"merged {batch.num_rows} rows, expected {total}")  # caught: the precise tier
    starts = np.cumsum(rows) - rows
    group_ids = np.repeat(np.asarray(ids, dtype=np.int64), rows)
    indices = (np.arange(total, dtype=np.int64) - np.repeat(starts, rows)).astype(np.int32)
    built = {
        "group_id": pa.Array.from_buffers(pa.int64(), total, [None, pa.py_buffer(group_ids)], null_count=0),
        "sample_index": pa.Array.from_buffers(pa.int32(), total, [None, pa.py_buffer(indices)], null_count=0),
        "sample_id": default_sample_ids(job_id, int(epoch), ids, counts),
    }
    names = batch.schema.names
    columns = [built.get(name, column) for name, column in zip(names, batch.columns, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
