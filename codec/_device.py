"""Host <-> GPU handoff through one pinned staging buffer per batch.

* :func:`stage_to_host` (producers): every CUDA tensor among a group's inputs is copied with
  ``non_blocking=True`` into one pinned host buffer, then one synchronisation; the inputs are replaced
  by CPU views of that buffer, which Arrow then aliases without a further copy.
* :func:`to_device` (consumers): CPU tensors (views of Arrow buffers) are packed into one pinned buffer
  (the one host copy) and moved to the GPU with one ``non_blocking`` copy on a side stream; the caller's
  current stream waits for it, so kernels queued afterwards see the data.

Neither function guarantees anything about streams other than the caller's current stream: a consumer
that uses the tensors on another stream must make that stream wait on the current one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trajflight.codec._containers import DoublyRagged, Padded, Ragged

if TYPE_CHECKING:
    import torch

__all__ = ["stage_to_host", "to_device"]

_ALIGN = 64  # bytes; every tensor in the staging buffer starts on a cache line


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    starts, total = [], 0
    for t in tensors:
        total = (total + _ALIGN - 1) // _ALIGN * _ALIGN
        starts.append(total)
        total += t.numel() * t.element_size()
    return starts, total


def _view(buffer: torch.Tensor, start: int, like: torch.Tensor) -> torch.Tensor:
    nbytes = like.numel() * like.element_size()
    return buffer[start : start + nbytes].view(like.dtype).view(like.shape)


def _is_cuda_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor) and obj.device.type == "cuda"


def _may_hold_tensors(items: list[Any] | tuple[Any, ...]) -> bool:
    # Per-sample Python lists of ints hold no tensors: look at the first item only, so staging costs
    # O(samples), never O(tokens), on the Python-list path.
    return bool(items) and (_is_cuda_tensor(items[0]) or isinstance(items[0], Ragged | Padded | DoublyRagged))


def _collect(obj: Any, out: list[torch.Tensor]) -> None:
    if _is_cuda_tensor(obj):
        if obj.is_nested:
            out.extend((obj.values(), obj.offsets()))
        else:
            out.append(obj)
    elif isinstance(obj, Ragged | Padded | DoublyRagged):
        for name in obj.__dataclass_fields__:
            _collect(getattr(obj, name), out)
    elif isinstance(obj, list | tuple) and _may_hold_tensors(obj):
        for item in obj:
            _collect(item, out)


def _substitute(obj: Any, cursor: Iterator[torch.Tensor]) -> Any:
    """Replace CUDA tensors in ``obj`` by the next host views, in :func:`_collect`'s traversal order."""
    if _is_cuda_tensor(obj):
        if obj.is_nested:
            return Ragged(next(cursor), next(cursor))
        return next(cursor)
    if isinstance(obj, Ragged | Padded | DoublyRagged):
        return type(obj)(*(_substitute(getattr(obj, name), cursor) for name in obj.__dataclass_fields__))
    if isinstance(obj, list | tuple) and _may_hold_tensors(obj):
        items = [_substitute(item, cursor) for item in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def stage_to_host(inputs: dict[str, Any]) -> dict[str, Any]:
    """Return ``inputs`` with every CUDA tensor replaced by a CPU view of one pinned host buffer.

    Jagged nested CUDA tensors become :class:`Ragged` (values, offsets) views. Inputs without CUDA
    tensors are returned unchanged (same object). The returned views own the pinned buffer jointly
    (it is freed when the last view is); the copy has completed when this returns.
    """
    torch_module = sys.modules.get("torch")
    if torch_module is None or not torch_module.cuda.is_initialized():
        return inputs  # no CUDA context, so no CUDA tensor can exist
    found: list[torch.Tensor] = []
    for value in inputs.values():
        _collect(value, found)
    if not found:
        return inputs
    tensors = [t.detach() for t in found]
    starts, total = _layout(tensors)
    pinned = torch_module.empty(total, dtype=torch_module.uint8, pin_memory=True)
    views = []
    for tensor, start in zip(tensors, starts, strict=True):
        view = _view(pinned, start, tensor)
        view.copy_(tensor, non_blocking=True)
        views.append(view)
    torch_module.cuda.synchronize()
    cursor = iter(views)
    return {name: _substitute(value, cursor) for name, value in inputs.items()}


def to_device(tensors: Sequence[torch.Tensor], device: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Move CPU tensors to ``device`` through one pinned buffer and one non-blocking copy.

    Args:
        tensors: Contiguous CPU tensors (typically aliasing Arrow buffers); they are only read.
        device: A CUDA device string such as ``"cuda"`` or ``"cuda:1"``.

    Returns:
        The device tensors (views into one device allocation, in input order) and the pinned staging
        buffer, which the caller must keep alive as long as the copy may be in flight (the returned
        :class:`TorchBatch` holds it).
    """
    import torch

    target = torch.device(device)
    starts, total = _layout(tensors)
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    for tensor, start in zip(tensors, starts, strict=True):
        _view(pinned, start, tensor).copy_(tensor)  # the one host-side copy
    side = torch.cuda.Stream(device=target)  # type: ignore[no-untyped-call]
    current = torch.cuda.current_stream(target)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        on_device = torch.empty(total, dtype=torch.uint8, device=target)
        on_device.copy_(pinned, non_blocking=True)
    current.wait_stream(side)
    # The allocation was made on the side stream but is used on the current one from now on.
    on_device.record_stream(current)
    return [_view(on_device, start, t) for t, start in zip(tensors, starts, strict=True)], pinned
