"""TransferQueue 0.1.11 (PyPI ``transferqueue``), SimpleStorage backend with 2 storage units.

TransferQueue runs its controller and storage units as Ray actors and moves data over ZMQ. The driver is
producer and consumer: each group goes in as 8 consecutive rows (``TransferQueueClient.put`` of a
``TensorDict`` whose ragged columns are jagged nested tensors built from the same numpy arrays), and the
consumer's ``get_meta`` (untimed: the grant, like a lease) then ``get_data`` returns nested tensors; for
the padded figures the consumer converts them with ``to_padded_tensor``, counted in the timing as
trajflight's decode is.

Install it without letting it change torch: ``pip install -c constraints.txt transferqueue==0.1.11``
(it does not pin torch).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from trajflight.workload import SyntheticGroup

from ._peer_ray import RAY_HINT, ensure_ray
from ._system import ALL_COLUMNS, RAGGED, GetVariant, System, SystemUnavailable, group_arrays

__all__ = ["TQ_HINT", "TransferQueueSystem"]

TQ_HINT = (
    "pip install -c constraints.txt transferqueue==0.1.11  (or pip install 'trajflight[peers]'; keeps torch)"
)
PARTITION = "bench"
SMALL_PARTITION = "bench-small"


def _tensordict(g: SyntheticGroup) -> Any:
    import torch
    from tensordict import TensorDict

    arrays = group_arrays(g)
    columns: dict[str, Any] = {}
    for name in ALL_COLUMNS:
        values = torch.from_numpy(arrays[name])
        if name in RAGGED:
            offsets = torch.from_numpy(arrays[name + "@offsets"]).long()
            columns[name] = torch.nested.nested_tensor_from_jagged(values, offsets)
        else:
            columns[name] = values
    return TensorDict(columns, batch_size=[g.num_samples])


def _tensordict_of_all(groups: Sequence[SyntheticGroup]) -> Any:
    """Every group's rows in one TensorDict (the per-column values joined with one copy)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    parts = [group_arrays(g) for g in groups]
    columns: dict[str, Any] = {}
    for name in ALL_COLUMNS:
        values = torch.from_numpy(np.concatenate([p[name] for p in parts]))
        if name in RAGGED:
            lengths = np.concatenate([np.diff(p[name + "@offsets"]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            columns[name] = torch.nested.nested_tensor_from_jagged(values, torch.from_numpy(offsets))
        else:
            columns[name] = values
    return TensorDict(columns, batch_size=[sum(g.num_samples for g in groups)])


def _to_torch(data: Any, layout: str) -> dict[str, Any]:
    out = {}
    for name, value in data.items():
        if layout == "padded" and getattr(value, "is_nested", False):
            value = value.to_padded_tensor(0)
        out[name] = value
    return out


class TransferQueueSystem(System):
    """TransferQueue's client over SimpleStorage (2 units) on the shared local Ray runtime."""

    name = "transferqueue"
    role = "peer"
    form = "TensorDict put per group, as its README"
    description = "TransferQueue 0.1.11, SimpleStorage, 2 storage units (Ray actors, ZMQ)"
    memory_note = "RSS of the 2 SimpleStorageUnit actors + the TransferQueueController actor"
    supports_batched = True

    def __init__(self, groups: Sequence[SyntheticGroup], *, storage_units: int = 2) -> None:
        super().__init__(groups)
        self.storage_units = storage_units
        self._tq: Any = None
        self._client: Any = None
        self._metas: dict[bool, Any] = {}
        self._small: Any = None
        self._task = 0

    def setup(self) -> None:
        if importlib.util.find_spec("transfer_queue") is None:
            raise SystemUnavailable("transferqueue is not installed", TQ_HINT)
        if importlib.util.find_spec("ray") is None:
            raise SystemUnavailable("transferqueue needs ray, which is not installed", RAY_HINT)
        # TransferQueue logs a warning per call on a 2-core machine (its thread count); keep the output
        # readable. Read by transfer_queue.utils.logging_utils at import.
        os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")
        ensure_ray()
        import transfer_queue as tq
        from omegaconf import OmegaConf

        self._tq = tq
        tq.init(
            OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": self.storage_units}}})
        )
        self._client = tq.get_client()

    def close(self) -> None:
        if self._tq is not None:
            self._tq.close()
            self._tq = None
            self._client = None

    def server_pids(self) -> list[int]:
        import psutil

        out = []
        for child in psutil.Process().children(recursive=True):
            try:
                name = child.name()
            except psutil.Error:
                continue
            if "SimpleStorageUnit" in name or "TransferQueueController" in name:
                out.append(child.pid)
        return out

    def put_all(self) -> None:
        put = self._client.put
        for g in self.groups:
            put(_tensordict(g), partition_id=PARTITION)

    def put_batched_all(self) -> None:
        self._client.put(_tensordict_of_all(self.groups), partition_id=PARTITION)

    def _meta(self, columns: Sequence[str], n: int, partition: str) -> Any:
        self._task += 1
        meta = self._client.get_meta(
            data_fields=list(columns),
            batch_size=n,
            partition_id=partition,
            mode="fetch",
            task_name=f"t{self._task}",
        )
        if meta.size != n:
            raise RuntimeError(f"TransferQueue granted {meta.size} samples, expected {n}")
        return meta

    def prepare_get(self) -> None:
        rows = sum(g.num_samples for g in self.groups)
        self._metas = {False: self._meta(ALL_COLUMNS, rows, PARTITION)}
        self._metas[True] = self._metas[False].select_fields(["response_ids", "response_logprobs"])

    def get(self, variant: GetVariant) -> Any:
        return _to_torch(self._client.get_data(self._metas[variant.subset]), variant.layout)

    def finish_get(self) -> None:
        self._metas = {}

    def drain(self) -> None:
        self._client.clear_partition(PARTITION)

    def small_roundtrip(self, index: int) -> None:
        g = self.groups[index % len(self.groups)]
        self._client.put(_tensordict(g), partition_id=SMALL_PARTITION)
        self._small = self._meta(ALL_COLUMNS, g.num_samples, SMALL_PARTITION)
        _to_torch(self._client.get_data(self._small), "jagged")

    def small_cleanup(self) -> None:
        if self._small is not None:
            self._client.clear_samples(self._small)
            self._small = None
