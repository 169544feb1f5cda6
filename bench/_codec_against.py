"""The codec of this tree against another tree's, in one process: the same operations, interleaved.

Two runs of a benchmark, one per tree, meet different spells of a shared machine; here both codecs are
loaded side by side and each repetition times one, then the other (the order alternating), so a slow
spell lands on both. :func:`load_codec` imports another tree's ``codec/`` folder (``git archive <commit>
codec``) as the package ``trajflight._codec_against``, its imports of ``trajflight.codec`` rewritten to it
as its modules are loaded (no bytecode is written, so the other tree's files are only read).

Run it with ``python bench/bench_codec.py --against DIR`` (BENCHMARKS.md, "The codec").
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import io
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from trajflight.bench._stats import cpu_per_call
from trajflight.keys import Partition
from trajflight.workload import SyntheticGroup

__all__ = ["compare", "format_comparison", "load_codec"]

NAME = "trajflight._codec_against"
LIST_COLUMNS = ["prompt_ids", "response_ids", "response_logprobs", "loss_mask"]


class _Rewriting(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``trajflight._codec_against[.x]`` in ``root`` and loads it with the package name rewritten."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != NAME and not fullname.startswith(NAME + "."):
            return None
        rest = fullname[len(NAME) + 1 :].replace(".", "/")
        package = self.root / rest if rest else self.root
        if (package / "__init__.py").is_file():
            spec = importlib.util.spec_from_file_location(
                fullname, package / "__init__.py", loader=self, submodule_search_locations=[str(package)]
            )
        else:
            spec = importlib.util.spec_from_file_location(fullname, self.root / f"{rest}.py", loader=self)
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is None or spec.origin is None:
            raise ImportError(f"{module.__name__} has no source file")
        origin = spec.origin
        source = Path(origin).read_text().replace("trajflight.codec", NAME)
        exec(compile(source, origin, "exec"), module.__dict__)


def load_codec(root: str | Path) -> ModuleType:
    """Import the codec folder ``root`` (another tree's ``codec/``) as ``trajflight._codec_against``."""
    root = Path(root).resolve()
    if not (root / "__init__.py").is_file():
        raise SystemExit(f"{root} is not a codec folder (no __init__.py); pass DIR/codec of the other tree")
    sys.meta_path.insert(0, _Rewriting(root))
    return importlib.import_module(NAME)


def _ipc(batch: pa.RecordBatch) -> pa.RecordBatch:
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(pa.BufferReader(sink.getvalue())).read_next_batch()


def _operations(codec: ModuleType, groups: Sequence[SyntheticGroup]) -> dict[str, Callable[[], object]]:
    """The standard workload's codec operations, through ``codec``'s public names only."""
    columns = [g.columns() for g in groups]
    many = [{"group_id": g.group_id, **c} for g, c in zip(groups, columns, strict=True)]
    batches = [
        codec.encode_group(job_id="bench", epoch=0, group_id=g.group_id, **c)
        for g, c in zip(groups, columns, strict=True)
    ]
    received = [_ipc(b) for b in batches]
    keys = [Partition("bench", 0, g.group_id) for g in groups]
    table = pa.Table.from_batches(batches)
    schema = codec.STANDARD_SCHEMA

    def encode() -> None:
        for g, c in zip(groups, columns, strict=True):
            codec.encode_group(job_id="bench", epoch=0, group_id=g.group_id, **c)

    def validate() -> None:
        for batch, key in zip(received, keys, strict=True):
            codec.validate_group(batch, schema, expect=key, full=True)

    return {
        "encode_group x G (numpy)": encode,
        "encode_groups (one call)": lambda: codec.encode_groups(job_id="bench", epoch=0, groups=many),
        "validate_group x G (after IPC)": validate,
        "decode x G (jagged, all columns)": lambda: [codec.decode(b) for b in batches],
        "decode one batch (jagged, list columns)": lambda: codec.decode(table, columns=LIST_COLUMNS),
        "decode one batch (padded, list columns)": lambda: codec.decode(
            table, columns=LIST_COLUMNS, layout="padded"
        ),
        "decode x G (padded, list columns)": lambda: [
            codec.decode(b, columns=LIST_COLUMNS, layout="padded") for b in batches
        ],
        "decode_numpy one batch (padded, list columns)": lambda: codec.decode_numpy(
            table, columns=LIST_COLUMNS, layout="padded"
        ),
    }


def compare(
    this: ModuleType, other: ModuleType, groups: Sequence[SyntheticGroup], rounds: int, calls: int = 3
) -> list[dict[str, Any]]:
    """Each operation through ``other`` and ``this``, ``rounds`` times each, interleaved; CPU seconds.

    A round warms each side, then takes the mean of ``calls`` runs with the garbage collector paused.
    """
    sides = {"other": _operations(other, groups), "this": _operations(this, groups)}
    rows = []
    for name in sides["this"]:
        times: dict[str, list[float]] = {"other": [], "this": []}
        for r in range(rounds):
            for side in ("other", "this") if r % 2 == 0 else ("this", "other"):
                times[side].append(cpu_per_call(sides[side][name], calls))
        row: dict[str, Any] = {"operation": name}
        for side, values in times.items():
            q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
            row[side] = {"median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3}
        row["ratio_this_other"] = statistics.median(times["this"]) / statistics.median(times["other"])
        rows.append(row)
    return rows


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    lines = [
        "| operation (G groups) | other tree: median [q1-q3] ms | this tree: median [q1-q3] ms "
        "| this/other |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        cells = [
            f"{row[s]['median_ms']:.2f} [{row[s]['q1_ms']:.2f}-{row[s]['q3_ms']:.2f}]"
            for s in ("other", "this")
        ]
        lines.append(f"| {row['operation']} | {cells[0]} | {cells[1]} | {row['ratio_this_other']:.2f} |")
    return "\n".join(lines)
