"""What every benchmarked system implements, and the workload as each of them is fed it.

A :class:`System` moves the standard workload (``trajflight.workload.make_workload``) from the producer
to torch tensors on the consumer. The harness calls, per repetition::

    put_all()                         # timed: every group, one put per group, until visible to readers
    prepare_get()                     # untimed: the consumer's grant (a lease, a metadata fetch)
    get(columns, layout) x variants   # timed: to torch tensors in this process, jagged or padded
    finish_get(); drain()             # untimed: release, then delete everything

then, where the system offers one, ``put_batched_all()`` (timed: the whole workload in one call) and
``drain()``; for latency, ``small_roundtrip(i)`` (timed: put one group, then lease/get it to torch)
followed by the untimed ``small_cleanup()``; and, where the system measures it, ``handoff(n)`` (one group
from a writer process to a trainer process already waiting for it).

"Payload" is the values only (no offsets, no padding), as BENCHMARKS.md defines it. The standard workload
carries two user columns beside the standard ones (``USER_COLUMNS``: int64 per sample, the generator's
sample and group numbers), passed to trajflight with ``extra=`` and moved by every system, so the
user-column path is measured too.

Each system has a ``form``: how it is driven (``"one object per batch"``, ``"one do_put per group"``...);
``strongest`` marks the peer's strongest ordinary form (BENCHMARKS.md, "The systems"), the one ratios
and targets compare trajflight with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from trajflight.codec import encode_group
from trajflight.workload import SyntheticGroup

__all__ = [
    "ALL_COLUMNS",
    "SUBSET_COLUMNS",
    "USER_COLUMNS",
    "GetVariant",
    "System",
    "SystemUnavailable",
    "encode_with_users",
    "group_arrays",
    "payload_of",
    "torch_from_arrays",
    "user_columns",
]

Layout = Literal["jagged", "padded"]

# The two user columns of the standard workload: int64, one value per sample.
USER_COLUMNS: tuple[str, ...] = ("user_sample_id", "user_group_id")
# The payload columns every system stores; "all" reads these (trajflight's reads also carry its key
# columns, a few bytes per row, decoded like the rest).
ALL_COLUMNS: tuple[str, ...] = (
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "loss_mask",
    "reward",
    "advantage",
    *USER_COLUMNS,
)
SUBSET_COLUMNS: tuple[str, ...] = ("response_ids", "response_logprobs")
RAGGED = frozenset({"prompt_ids", "response_ids", "response_logprobs", "loss_mask"})


@dataclass(frozen=True, slots=True)
class GetVariant:
    """One get figure: which columns and which tensor layout."""

    name: str
    columns: tuple[str, ...] | None  # None: every column the system stores
    layout: Layout

    @property
    def subset(self) -> bool:
        """Whether this is the 2-column subset."""
        return self.columns is not None


GET_VARIANTS: tuple[GetVariant, ...] = (
    GetVariant("get_all_jagged", None, "jagged"),
    GetVariant("get_all_padded", None, "padded"),
    GetVariant("get_subset_jagged", SUBSET_COLUMNS, "jagged"),
    GetVariant("get_subset_padded", SUBSET_COLUMNS, "padded"),
)


class SystemUnavailable(Exception):
    """The system cannot run here (an optional package is missing); ``hint`` says how to install it."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


class System:
    """Base class of a benchmarked system. Subclasses override the data-path methods.

    Attributes:
        name: Short name used in tables and JSON.
        role: ``"system"`` (trajflight), ``"reference"`` (memcpy, bare Flight) or ``"peer"``.
        form: How the system is driven, in a few words (shown in every table).
        strongest: Whether this is the peer's strongest ordinary form (ratios and targets use those).
        description: One line for the report.
        memory_note: How server memory is counted for this system.
        gets_after_batched: Time the gets after :meth:`put_batched_all` (the form in which a user of the
            system moves a batch, as the peers' strongest forms do), and those after :meth:`put_all` as
            a second, labelled figure; False: the gets follow :meth:`put_all` only.
    """

    name = "?"
    role = "peer"
    form = ""
    strongest = True
    description = ""
    memory_note = ""
    has_servers = True
    include_shmem = False
    supports_batched = False
    gets_after_batched = False

    def __init__(self, groups: Sequence[SyntheticGroup]) -> None:
        self.groups = list(groups)
        self.users = [user_columns(g) for g in self.groups]  # made before any clock, for every system

    # lifecycle -----------------------------------------------------------------------------------
    def setup(self) -> None:
        """Start servers and connect (untimed). Raise :class:`SystemUnavailable` if it cannot run."""

    def close(self) -> None:
        """Stop everything :meth:`setup` started."""

    def server_pids(self) -> list[int]:
        """Processes whose memory counts as the servers'."""
        return []

    # data path -----------------------------------------------------------------------------------
    def put_all(self) -> None:
        """Put every group, one call per group, until the consumer can see them."""
        raise NotImplementedError

    def put_batched_all(self) -> None:
        """Put every group in one call (where the system's public API has one; ``supports_batched``)."""
        raise NotImplementedError

    def prepare_get(self) -> None:
        """Obtain the consumer's right to read every group (untimed)."""

    def get(self, variant: GetVariant) -> Any:
        """Read every group to torch tensors in this process, as ``variant`` asks."""
        raise NotImplementedError

    def finish_get(self) -> None:
        """Give the read grant back so the same groups can be read again (untimed)."""

    def drain(self) -> None:
        """Delete every stored group (untimed)."""

    def small_roundtrip(self, index: int) -> None:
        """Put group ``index`` alone, then grant and read it to torch (jagged, all columns)."""
        raise NotImplementedError

    def small_cleanup(self) -> None:
        """Delete what :meth:`small_roundtrip` stored (untimed)."""

    def handoff(self, iters: int) -> list[float] | None:
        """Seconds, ``iters`` times, from a writer process starting to put one group to a trainer process,
        already waiting for it, holding it as torch tensors; None where the system does not measure it."""
        return None

    def extra_metrics(self, repeats: int) -> dict[str, Any]:
        """System-specific figures (trajflight: controller lease cycles), measured after the rest."""
        return {}


def payload_of(groups: Sequence[SyntheticGroup], columns: Sequence[str] | None = None) -> int:
    """Payload bytes of ``groups`` (values only, the user columns included); ``columns`` limits it to
    those columns."""
    users = 8 * len(USER_COLUMNS)  # int64 each, per sample
    if columns is None:
        return sum(g.payload_bytes + users * g.num_samples for g in groups)
    per = {
        "prompt_ids": lambda g: g.prompt.nbytes * g.num_samples,
        "response_ids": lambda g: g.response_values.nbytes,
        "response_logprobs": lambda g: g.logprobs.nbytes,
        "loss_mask": lambda g: g.loss_mask.nbytes,
        "reward": lambda g: g.reward.nbytes,
        "advantage": lambda g: g.advantage.nbytes,
        **{name: lambda g: 8 * g.num_samples for name in USER_COLUMNS},
    }
    return sum(per[c](g) for g in groups for c in columns)


def group_arrays(g: SyntheticGroup) -> dict[str, np.ndarray]:
    """One group as flat numpy arrays: ``<col>`` values and ``<col>@offsets`` for ragged columns.

    The prompt is repeated per sample (the row layout every system stores); everything else aliases
    the group's arrays.
    """
    k = g.num_samples
    p = len(g.prompt)
    return {
        "prompt_ids": np.tile(g.prompt, k),
        "prompt_ids@offsets": np.arange(k + 1, dtype=np.int32) * p,
        "response_ids": g.response_values,
        "response_ids@offsets": g.response_offsets,
        "response_logprobs": g.logprobs,
        "response_logprobs@offsets": g.response_offsets,
        "loss_mask": g.loss_mask,
        "loss_mask@offsets": g.response_offsets,
        "reward": g.reward,
        "advantage": g.advantage,
        **user_columns(g),
    }


def user_columns(g: SyntheticGroup) -> dict[str, np.ndarray]:
    """The group's user columns (``USER_COLUMNS``): the generator's sample number (``group_id * K + i``)
    and group number of each sample, int64."""
    k = g.num_samples
    return {
        "user_sample_id": np.arange(k, dtype=np.int64) + g.group_id * k,
        "user_group_id": np.full(k, g.group_id, dtype=np.int64),
    }


def encode_with_users(
    g: SyntheticGroup, job_id: str, epoch: int, users: dict[str, np.ndarray] | None = None
) -> pa.RecordBatch:
    """The group encoded with :func:`~trajflight.codec.encode_group`, its user columns passed with
    ``extra=`` (``users``, or made here)."""
    extra = user_columns(g) if users is None else users
    return encode_group(job_id=job_id, epoch=epoch, group_id=g.group_id, **g.columns(extra=extra))


def torch_from_arrays(
    parts: Sequence[dict[str, np.ndarray]], columns: Sequence[str], layout: Layout
) -> dict[str, Any]:
    """Join per-group arrays into one batch of torch tensors, as a consumer of a numpy store does.

    Ragged columns become jagged nested tensors (``layout="jagged"``) or padded ``[rows, max_len]``
    tensors (``"padded"``); the values of several groups are joined with one copy (as trajflight's
    decode joins chunks), offsets are rebased. The result owns its memory.
    """
    import torch

    out: dict[str, Any] = {}
    for name in columns:
        values = np.concatenate([p[name] for p in parts]) if len(parts) > 1 else np.array(parts[0][name])
        tensor = torch.from_numpy(values)
        if name not in RAGGED:
            out[name] = tensor
            continue
        lengths = np.concatenate([np.diff(p[name + "@offsets"]) for p in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        nested = torch.nested.nested_tensor_from_jagged(
            tensor, torch.from_numpy(offsets), max_seqlen=int(lengths.max(initial=0))
        )
        out[name] = nested if layout == "jagged" else nested.to_padded_tensor(0)
    return out
