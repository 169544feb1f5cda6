"""What each second tier and memo of the codec pays on the standard workload: each switched off in turn.

The codec keeps a cheap tier beside a precise one, or a memo, only where it pays (STYLE 17, 18). For every
one it keeps, :data:`SWITCHES` names the operation it serves on the standard workload (G=64 groups x K=8)
and how to switch it off: the module attributes to replace by the precise route alone. :func:`run_tiers`
times the operation with the tier on and off, interleaved round by round (the order alternates) so that a
slow spell of the shared machine lands on both, and reports median and quartiles of each.

Run it with ``python bench/bench_codec.py --tiers`` (BENCHMARKS.md, "The codec").
"""

from __future__ import annotations

import io
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from trajflight.bench._stats import cpu_per_call
from trajflight.codec import (
    STANDARD_SCHEMA,
    _arrays,
    _encode,
    _encode_many,
    _encode_merged,
    _jagged,
    _pylists,
    _validate,
    decode,
    encode_group,
    encode_groups,
    validate_group,
)
from trajflight.codec._schema import TrajectorySchema
from trajflight.keys import Partition
from trajflight.workload import SyntheticGroup

__all__ = ["SWITCHES", "Switch", "run_tiers"]

LIST_COLUMNS = ["prompt_ids", "response_ids", "response_logprobs", "loss_mask"]


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Switch:
    """One tier or memo and how to switch it off.

    Attributes:
        name: What is switched off.
        operation: The key of the operation it serves, in :func:`operations`.
        patches: ``(owner, attribute, replacement)``: with these in place only the precise route runs.
    """

    name: str
    operation: str
    patches: tuple[tuple[object, str, object], ...]

    @contextmanager
    def off(self) -> Iterator[None]:
        """The codec with this tier switched off (the attributes restored on exit)."""
        with ExitStack() as stack:
            for owner, attribute, replacement in self.patches:
                stack.enter_context(mock.patch.object(owner, attribute, new=replacement))
            yield


def _ipc(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as a storage server receives it: through an IPC stream."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(pa.BufferReader(sink.getvalue())).read_next_batch()


def python_lists(group: SyntheticGroup) -> dict[str, Any]:
    """The group's columns as per-sample Python lists (what a rollout engine without numpy hands over)."""
    o = group.response_offsets
    rows = range(group.num_samples)
    return {
        "prompt_ids": [group.prompt.tolist()] * group.num_samples,
        "response_ids": [group.response_values[o[i] : o[i + 1]].tolist() for i in rows],
        "response_logprobs": [group.logprobs[o[i] : o[i + 1]].tolist() for i in rows],
        "loss_mask": [group.loss_mask[o[i] : o[i + 1]].tolist() for i in rows],
        "reward": group.reward.tolist(),
        "advantage": group.advantage.tolist(),
    }


def operations(groups: Sequence[SyntheticGroup]) -> dict[str, Callable[[], object]]:
    """The workload's operations that a tier serves, each over the whole workload, by key."""
    columns = [g.columns() for g in groups]
    lists = [python_lists(g) for g in groups]
    batches = [g.encode("bench", 0) for g in groups]
    received = [_ipc(b) for b in batches]
    keys = [Partition("bench", 0, g.group_id) for g in groups]
    table = pa.Table.from_batches(batches)
    many = [{"group_id": g.group_id, **c} for g, c in zip(groups, columns, strict=True)]

    def encode_numpy() -> None:
        for g, c in zip(groups, columns, strict=True):
            encode_group(job_id="bench", epoch=0, group_id=g.group_id, **c)

    def encode_lists() -> None:
        for g, d in zip(groups, lists, strict=True):
            encode_group(job_id="bench", epoch=0, group_id=g.group_id, **d)

    def validate() -> None:
        for batch, key in zip(received, keys, strict=True):
            validate_group(batch, STANDARD_SCHEMA, expect=key, full=True)

    return {
        "encode_group x G (numpy)": encode_numpy,
        "encode_group x G (Python lists)": encode_lists,
        "encode_groups (one call)": lambda: encode_groups(job_id="bench", epoch=0, groups=many),
        "validate_group x G (after IPC)": validate,
        "decode x G (jagged, all columns)": lambda: [decode(b) for b in batches],
        "decode x G (padded, list columns)": lambda: [
            decode(b, columns=LIST_COLUMNS, layout="padded") for b in batches
        ],
        "decode one batch (padded, list columns)": lambda: decode(
            table, columns=LIST_COLUMNS, layout="padded"
        ),
    }


def _group_schema_unmemoised(
    schema: TrajectorySchema, names: Sequence[str], types: Sequence[pa.DataType]
) -> pa.Schema:
    fields = [
        schema.field(n).with_type(t) if n in schema else pa.field(n, t)
        for n, t in zip(names, types, strict=True)
    ]
    arrow = pa.schema(fields)
    schema.check(arrow)
    return arrow


def _check_unmemoised(schema: TrajectorySchema, arrow: pa.Schema) -> None:
    schema._check(arrow)


_FAST_VALUES = _arrays._fast_values


def _fast_values_but_for_scalar_columns(values: Any, value_type: pa.DataType) -> pa.Array | None:
    """``_fast_values`` stepping aside where scalar_array calls it, kept where the ragged builders do."""
    if sys._getframe(1).f_code is _arrays.scalar_array.__code__:
        return None
    return _FAST_VALUES(values, value_type)


def _sample_ids_as_strings(job_id: str, epoch: int, ids: Sequence[int], counts: Sequence[int]) -> pa.Array:
    """The default sample ids as the simplest route builds them: one pa.array of f-strings."""
    return pa.array(
        [f"{job_id}/{epoch}/{gid}/{i}" for gid, k in zip(ids, counts, strict=True) for i in range(k)],
        pa.string(),
    )


SWITCHES: tuple[Switch, ...] = (
    Switch(
        "cheap builders (_fast_ragged, _fast_list)",
        "encode_group x G (numpy)",
        ((_arrays, "_fast_ragged", _none), (_arrays, "_fast_list", _none)),
    ),
    Switch(
        "cheap tiled prompt (_fast_repeated_row)",
        "encode_group x G (numpy)",
        ((_arrays, "_fast_repeated_row", _none),),
    ),
    Switch(
        "cheap scalar columns (_fast_values in scalar_array)",
        "encode_group x G (numpy)",
        ((_arrays, "_fast_values", _fast_values_but_for_scalar_columns),),
    ),
    Switch(
        "cheap int64 scalar (_fast_int64)", "encode_group x G (numpy)", ((_arrays, "_fast_int64", _none),)
    ),
    Switch(
        "ragged agreement before the batch",
        "encode_group x G (numpy)",
        ((_encode, "ragged_columns_agree", _false),),
    ),
    Switch(
        "group schema memo (TrajectorySchema._group_schema)",
        "encode_group x G (numpy)",
        ((TrajectorySchema, "_group_schema", _group_schema_unmemoised),),
    ),
    Switch(
        "byte-joined sample ids (against pa.array of f-strings)",
        "encode_group x G (numpy)",
        ((_encode, "default_sample_ids", _sample_ids_as_strings),),
    ),
    Switch(
        "sample id layout memo (_id_layout, lru_cache)",
        "encode_group x G (numpy)",
        ((_encode, "_id_layout", _encode._id_layout.__wrapped__),),
    ),
    Switch("merged tier (_encode_merged)", "encode_groups (one call)", ((_encode_many, "merged", _none),)),
    Switch(
        "Arrow-pool buffers of the merged tier (_empty)",
        "encode_groups (one call)",
        ((_encode_merged, "_empty", lambda size, dtype: np.empty(size, dtype)),),
    ),
    Switch(
        "Python-int proof (_python_ints)",
        "encode_group x G (Python lists)",
        ((_pylists, "_python_ints", _false),),
    ),
    Switch(
        "cheap validation tier (_validate_cheap)",
        "validate_group x G (after IPC)",
        ((_validate, "_plan", _none), (_validate, "ragged_agree", _false)),
    ),
    Switch(
        "validation plan memo",
        "validate_group x G (after IPC)",
        ((_validate, "_plan", _validate._make_plan),),
    ),
    Switch(
        "schema check memo (TrajectorySchema.check)",
        "validate_group x G (after IPC)",
        ((TrajectorySchema, "check", _check_unmemoised),),
    ),
    Switch(
        "direct nested-tensor constructor (_jagged)",
        "decode x G (jagged, all columns)",
        ((_jagged, "_builder", lambda: _jagged._public),),
    ),
)


@dataclass(frozen=True, slots=True)
class TierResult:
    """One switch's figures: CPU seconds per run of its operation with the tier on and off."""

    switch: Switch
    on: list[float]
    off: list[float]

    def row(self) -> dict[str, Any]:
        """The figures as a JSON-ready row (milliseconds; ratio of the medians, off over on)."""
        out: dict[str, Any] = {"switched_off": self.switch.name, "operation": self.switch.operation}
        for label, values in (("on", self.on), ("off", self.off)):
            q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
            out[f"{label}_median_ms"] = median * 1e3
            out[f"{label}_q1_ms"], out[f"{label}_q3_ms"] = q1 * 1e3, q3 * 1e3
        out["ratio_off_on"] = statistics.median(self.off) / statistics.median(self.on)
        return out


def run_tiers(
    groups: Sequence[SyntheticGroup], rounds: int, names: Sequence[str] = (), calls: int = 3
) -> list[TierResult]:
    """Time each switch's operation with the tier on and off, ``rounds`` times each, alternating the order.

    A round warms the operation (memos filled, pages touched, as in a steady stream of puts), then takes
    the mean of ``calls`` runs with the garbage collector paused, as ``timeit`` does. Times are the
    process's CPU seconds (``time.process_time``, every thread): on a machine shared with other work,
    waiting for a core is not counted, so the two sides compare what the codec itself spends.
    ``names`` selects switches by a substring of their name (all when empty).
    """
    ops = operations(groups)
    out = []
    for switch in SWITCHES:
        if names and not any(n in switch.name for n in names):
            continue
        fn = ops[switch.operation]
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                with ExitStack() as stack:
                    if not on:
                        stack.enter_context(switch.off())
                    times[on].append(cpu_per_call(fn, calls))
        out.append(TierResult(switch, times[True], times[False]))
    return out


def format_tiers(results: Sequence[TierResult]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| switched off | operation (G groups) | on: median [q1-q3] ms | off: median [q1-q3] ms | off/on |",
        "|---|---|---:|---:|---:|",
    ]
    for result in results:
        r = result.row()
        lines.append(
            f"| {r['switched_off']} | {r['operation']} | {r['on_median_ms']:.2f} "
            f"[{r['on_q1_ms']:.2f}-{r['on_q3_ms']:.2f}] | {r['off_median_ms']:.2f} "
            f"[{r['off_q1_ms']:.2f}-{r['off_q3_ms']:.2f}] | {r['ratio_off_on']:.2f} |"
        )
    return "\n".join(lines)
