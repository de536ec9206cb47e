"""The conjugate autograd functions of tensor parallelism, on a TPCommunicator.

copy_to_tp       (f) identity forward, all-reduce of the gradient backward ("bwd")
reduce_from_tp   (g) all-reduce forward ("fwd"), identity backward
gather_from_sp   all-gather of the sequence forward ("fwd"), reduce-scatter backward ("bwd")
scatter_to_sp    reduce-scatter forward ("fwd"), all-gather backward ("bwd")
Sequence-parallel activations are (T / tp, B, H): sequence first, so dim 0 is gathered.

Only reduce_from_tp could work in place (the collectives of fp4quant.comm write into the
tensor they are given): it does so on a layer's fresh output, and on a contiguous copy of
anything else -- a view (``DTensor.to_local()``'s result, which autograd forbids modifying
in place; a slice, whose base others may hold), a non-contiguous tensor, a leaf that
requires grad.  The other mappings send a copy or a new tensor.
"""

from __future__ import annotations

import torch

from .communicator import TPCommunicator


def reducible_in_place(x: torch.Tensor) -> bool:
    """Whether an all-reduce may write into ``x``: contiguous, not a view of another tensor (a
    ``DTensor.to_local()`` result is one), not a leaf that requires grad."""
    return x.is_contiguous() and x._base is None and not (x.is_leaf and x.requires_grad)


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone(memory_format=torch.contiguous_format)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # a copy: autograd may hand the same gradient buffer to other consumers
        return ctx.tp.all_reduce(_copy(grad), "bwd"), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        if not reducible_in_place(x):
            return tp.all_reduce(_copy(x), "fwd")
        ctx.mark_dirty(x)  # reduced in place: a layer's fresh output, which nothing else holds
        return tp.all_reduce(x, "fwd")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        ctx.tp = tp
        return tp.all_gather(x, "fwd")

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.reduce_scatter(grad.contiguous(), "bwd"), None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        ctx.tp = tp
        return tp.reduce_scatter(x, "fwd")

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_gather(grad.contiguous(), "bwd"), None


def copy_to_tp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _CopyToTP.apply(x, tp) if tp.sends else x


def reduce_from_tp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp) if tp.sends else x


def gather_from_sp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _GatherFromSP.apply(x, tp) if tp.world > 1 else x


def scatter_to_sp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _ScatterToSP.apply(x, tp) if tp.world > 1 else x
