"""Jagged nested tensors over ``(values, offsets)`` without the cost of torch's public constructor.

``torch.nested.nested_tensor_from_jagged`` reaches the ``NestedTensor`` constructor through torch's op
dispatch (``__torch_function__``, ``__torch_dispatch__`` and an argument normalisation by
``torch.fx``), which costs several times the construction itself; a decode of one small group builds
four of them. :func:`jagged` builds the same tensor straight from the constructor where this process's
torch has the one that was checked, and proves it first: the first call builds a probe both ways and
keeps the direct way only if the two agree on everything a caller can see (type, sizes, ragged
dimension, ``max_seqlen``, offsets, values aliasing, contents). Anything else (another torch, values
that require grad, whose public result is an autograd view of them) takes the public function.

Columns of the same rows (a group's response ids, logprobs and loss mask) share one offsets tensor; the
second and later of them are built from the first (``like=``): the sizes and strides that ``NestedTensor``
derives from the offsets (a nested int looked up in a weak registry, then multiplied) are taken from it,
which halves their cost. That way is proven on its own probe, against the public function, and falls
back to the direct one where the probe disagrees.

It does not guarantee more than the probe checks: a torch whose constructor changed in a way one probe
cannot see would need the probe extended. The direct way stays because it pays on the standard workload
(BENCHMARKS.md, "The codec").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["jagged", "quiet_torch_fx_notice"]

Builder = Callable[["torch.Tensor", "torch.Tensor", int], "torch.Tensor"]
Sibling = Callable[["torch.Tensor", "torch.Tensor", int], "torch.Tensor"]  # (values, like, max_seqlen)


def jagged(
    values: torch.Tensor, offsets: torch.Tensor, max_seqlen: int, *, like: torch.Tensor | None = None
) -> torch.Tensor:
    """The jagged nested tensor of rows ``values[offsets[i]:offsets[i+1]]``, aliasing both tensors.

    Equal to ``torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=max_seqlen)`` in all
    a caller can see; ``max_seqlen`` must be the longest row's length (it is not checked). ``like``, an
    earlier result of this function over the same ``offsets`` tensor, makes it cheaper (it is used only
    where its offsets are ``offsets`` and its values have the shape and strides of ``values``).
    """
    if values.requires_grad:
        return _public(values, offsets, max_seqlen)
    if like is not None and _fits(values, offsets, like):
        sibling = _sibling_builder()
        if sibling is not None:
            return sibling(values, like, max_seqlen)
    return _builder()(values, offsets, max_seqlen)


def _fits(values: torch.Tensor, offsets: torch.Tensor, like: torch.Tensor) -> bool:
    """Whether ``like``'s sizes and strides are those a tensor over ``values`` and ``offsets`` gets."""
    inner = getattr(like, "_values", None)
    return (
        getattr(like, "_offsets", None) is offsets
        and inner is not None
        and values.shape == inner.shape
        and values.stride() == inner.stride()
        and values.device == inner.device
    )


def _public(values: torch.Tensor, offsets: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    import torch

    quiet_torch_fx_notice()
    return torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=max_seqlen)


@functools.cache
def _builder() -> Builder:
    """The direct constructor where it was proven equal to the public one on a probe, else the public."""
    try:
        import torch
        from torch.nested._internal.nested_tensor import NestedTensor, _store_val_in_tensor
    except ImportError:
        return _public

    def direct(values: torch.Tensor, offsets: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        nested: torch.Tensor = NestedTensor(
            values, offsets, _ragged_idx=1, _metadata_cache={"max_seqlen": _store_val_in_tensor(max_seqlen)}
        )
        return nested

    try:
        values = torch.arange(7, dtype=torch.int32)
        offsets = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
        if _same(direct(values, offsets, 5), _public(values, offsets, 5), values, offsets):
            return direct
    except Exception:
        logging.getLogger(__name__).debug("direct nested-tensor construction unavailable", exc_info=True)
    return _public


@functools.cache
def _sibling_builder() -> Sibling | None:
    """A constructor of a jagged tensor from one over the same offsets, where proven on a probe."""
    try:
        import torch
        from torch._C import DispatchKey, DispatchKeySet
        from torch.nested._internal.nested_tensor import NestedTensor, _store_val_in_tensor
    except ImportError:
        return None
    keys = DispatchKeySet(DispatchKey.NestedTensor).add(DispatchKey.AutogradNestedTensor)

    def sibling(values: torch.Tensor, like: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        # NestedTensor.__new__ without its offsets-derived part: the sizes and strides are like's.
        size, strides = like._size, like._strides  # type: ignore[attr-defined]
        nested: NestedTensor = torch.Tensor._make_wrapper_subclass(
            NestedTensor,
            size,
            strides,
            0,
            torch.contiguous_format,
            values.dtype,
            torch.jagged,
            values.device,
            False,
            False,
            "sizes",
            False,
            True,
            keys,
            storage_size=values.untyped_storage().size(),
        )
        nested._ragged_idx = 1
        nested._size = size
        nested._strides = strides
        NestedTensor.__init__(
            nested,
            values,
            like._offsets,  # type: ignore[attr-defined]
            _ragged_idx=1,
            _metadata_cache={"max_seqlen": _store_val_in_tensor(max_seqlen)},
        )
        return nested

    try:
        offsets = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
        first = _builder()(torch.arange(7, dtype=torch.int32), offsets, 5)
        values = torch.arange(7, dtype=torch.float32) / 2
        got, want = sibling(values, first, 5), _public(values, offsets, 5)
        if (
            _same(got, want, values, offsets)
            and got.shape == want.shape
            and got.stride() == want.stride()
            and torch.equal((got * first).values(), (want * first).values())  # one nested int: compatible
        ):
            return sibling
    except Exception:
        logging.getLogger(__name__).debug(
            "nested-tensor construction from a sibling unavailable", exc_info=True
        )
    return None


def _same(got: torch.Tensor, want: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> bool:
    import torch

    return (
        type(got) is type(want)
        and got.is_nested
        and got.layout == want.layout
        and got.dim() == want.dim()
        and got.size(0) == want.size(0)
        and got.dtype == want.dtype
        and got.device == want.device
        and got._ragged_idx == want._ragged_idx  # type: ignore[attr-defined]
        and got._max_seqlen == want._max_seqlen  # type: ignore[attr-defined]
        and got.offsets() is offsets  # type: ignore[attr-defined]
        and want.offsets() is offsets  # type: ignore[attr-defined]
        and got.values().data_ptr() == values.data_ptr()
        and [t.tolist() for t in got.unbind()] == [t.tolist() for t in want.unbind()]
        and torch.equal(got.to_padded_tensor(-1), want.to_padded_tensor(-1))
    )


class _DropFxTracingNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("is_fx_tracing will return true")


@functools.cache
def quiet_torch_fx_notice() -> None:
    """Drop torch's one-time ``is_fx_tracing`` notice (and only it) from the logs.

    torch 2.13's ``nested_tensor_from_jagged`` calls ``torch.fx``'s ``is_fx_tracing()``, which logs a
    notice meant for tracer authors; it says nothing to a trajflight user.
    """
    logging.getLogger("torch.fx._symbolic_trace").addFilter(_DropFxTracingNotice())
