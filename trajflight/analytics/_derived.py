"""Derived per-sample columns analysts always compute, made from the stored ones with pyarrow and numpy.

Each derived column is defined once here (:data:`DERIVED`), with the stored columns it needs; the
definitions are in :func:`add_derived`'s docstring.

A null input row gives a null derived value. Nothing here aliases its input: each column is a new array.
This module does not guarantee anything about NaN inputs beyond IEEE arithmetic (a NaN logprob makes its
sample's mean NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajflight.errors import InvalidRequestError, SchemaError, brief

__all__ = ["DERIVED", "DERIVED_COLUMNS", "Derived", "add_derived", "inputs_of"]


@dataclass(frozen=True, slots=True)
class Derived:
    """One derived column: its name, the stored columns it is made of, its type and how it is made."""

    name: str
    inputs: tuple[str, ...]
    type: pa.DataType
    make: Callable[[Mapping[str, pa.Array]], pa.Array]


def _lengths(array: pa.Array) -> pa.Array:
    return pc.cast(pc.list_value_length(array), pa.int64())


def _segment_means(
    values: np.ndarray, valid: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``[offsets[i], offsets[i+1])`` of ``values``: the mean over its valid entries, and how
    many there were (a segment with none has mean 0 and count 0)."""
    sums = np.concatenate(([0.0], np.cumsum(np.where(valid, values, 0.0), dtype=np.float64)))
    counts = np.concatenate(([0], np.cumsum(valid, dtype=np.int64)))
    total = sums[offsets[1:]] - sums[offsets[:-1]]
    count = counts[offsets[1:]] - counts[offsets[:-1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    return mean, count


def _floats(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The values of a flat float array as float64 with a validity mask (nulls become 0, masked out)."""
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    values = pc.fill_null(pc.cast(array, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    return values, valid


def _offsets(array: pa.Array) -> np.ndarray:
    # A list array's offsets index its (unsliced) values: they stay right for a sliced array too.
    return np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)


def _result(values: np.ndarray, present: np.ndarray, rows_valid: pa.Array) -> pa.Array:
    mask = ~(present & np.asarray(rows_valid.to_numpy(zero_copy_only=False), dtype=bool))
    return pa.array(values, type=pa.float64(), mask=mask)


def _mean_logprob(columns: Mapping[str, pa.Array]) -> pa.Array:
    array = columns["response_logprobs"]
    values, valid = _floats(array.values)
    mean, count = _segment_means(values, valid, _offsets(array))
    return _result(mean, count > 0, array.is_valid())


def _top_p_entropy(columns: Mapping[str, pa.Array]) -> pa.Array:
    outer = columns["top_p_probs"]
    inner = outer.values  # one list of candidate probabilities per response token
    probs, valid = _floats(inner.values)
    inner_offsets = _offsets(inner)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(valid & (probs > 0), probs * np.log(np.where(probs > 0, probs, 1.0)), 0.0)
    p_sum = np.concatenate(([0.0], np.cumsum(np.where(valid, probs, 0.0))))
    pl_sum = np.concatenate(([0.0], np.cumsum(plogp)))
    s = p_sum[inner_offsets[1:]] - p_sum[inner_offsets[:-1]]
    sl = pl_sum[inner_offsets[1:]] - pl_sum[inner_offsets[:-1]]
    token_ok = (s > 0) & np.asarray(inner.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        # -sum q ln q with q = p / s equals ln s - (sum p ln p) / s.
        entropy = np.where(
            token_ok, np.log(np.where(token_ok, s, 1.0)) - sl / np.where(token_ok, s, 1.0), 0.0
        )
    entropy = np.maximum(entropy, 0.0)  # rounding can leave a one-candidate set at -1e-17
    mean, count = _segment_means(entropy, token_ok, _offsets(outer))
    return _result(mean, count > 0, outer.is_valid())


def _tokens(columns: Mapping[str, pa.Array]) -> pa.Array:
    return pc.add(_lengths(columns["prompt_ids"]), _lengths(columns["response_ids"]))


DERIVED: dict[str, Derived] = {
    d.name: d
    for d in (
        Derived("prompt_length", ("prompt_ids",), pa.int64(), lambda c: _lengths(c["prompt_ids"])),
        Derived("response_length", ("response_ids",), pa.int64(), lambda c: _lengths(c["response_ids"])),
        Derived("tokens", ("prompt_ids", "response_ids"), pa.int64(), _tokens),
        Derived("mean_logprob", ("response_logprobs",), pa.float64(), _mean_logprob),
        Derived("top_p_entropy", ("top_p_probs",), pa.float64(), _top_p_entropy),
    )
}

#: The names of the derived columns, in the order a scan appends them.
DERIVED_COLUMNS: tuple[str, ...] = tuple(DERIVED)


def inputs_of(names: list[str] | tuple[str, ...]) -> list[str]:
    """The stored columns the derived columns ``names`` are made of, each once, in order."""
    out: list[str] = []
    for name in names:
        for column in DERIVED[name].inputs:
            if column not in out:
                out.append(column)
    return out


def _combined(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def add_derived(table: pa.Table, names: list[str] | tuple[str, ...]) -> pa.Table:
    """``table`` with the derived columns ``names`` appended (in that order), made from its columns.

    The derived columns, per sample (one row):

    * ``prompt_length`` (int64): the number of prompt tokens, ``len(prompt_ids)``.
    * ``response_length`` (int64): the number of response tokens, ``len(response_ids)``.
    * ``tokens`` (int64): the whole sequence the model saw, ``prompt_length + response_length`` (not the
      response-only count that ``GroupInfo.tokens`` budgets leases by).
    * ``mean_logprob`` (float64): the mean of ``response_logprobs`` over the sample's response tokens, null
      values skipped; null for a sample with no (non-null) logprob.
    * ``top_p_entropy`` (float64, nats): the mean over the sample's response tokens of the entropy of that
      token's top-p candidate set, the candidates' probabilities renormalised to sum to one:
      ``H_t = -sum_j q_j ln q_j`` with ``q_j = p_j / sum_k p_k`` over ``top_p_probs[t]``; tokens whose
      candidate set is empty or sums to zero are skipped, and a sample with no such token is null. A
      token with one candidate has entropy 0.

    A null input row gives a null derived value. A derived column whose name the table already has is
    replaced. The stored columns are not copied; each derived column is a new array.

    Raises:
        InvalidRequestError: a name is not a derived column. SchemaError: the table lacks an input.
    """
    for name in names:
        spec = DERIVED.get(name)
        if spec is None:
            raise InvalidRequestError(
                f"no derived column {brief(name)}; the derived columns are {', '.join(DERIVED_COLUMNS)}"
            )
        missing = [c for c in spec.inputs if c not in table.schema.names]
        if missing:
            raise SchemaError(f"derived column {name} needs the column {missing[0]}", column=missing[0])
        columns = {c: _combined(table.column(c)) for c in spec.inputs}
        value = spec.make(columns) if table.num_rows else pa.array([], type=spec.type)
        if name in table.schema.names:
            table = table.set_column(table.schema.get_field_index(name), name, value)
        else:
            table = table.append_column(pa.field(name, spec.type), value)
    return table
