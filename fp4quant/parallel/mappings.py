"""The conjugate autograd functions of tensor parallelism, on a TPCommunicator.

copy_to_tp       (f) identity forward, all-reduce of the gradient backward ("bwd")
reduce_from_tp   (g) all-reduce forward ("fwd"), identity backward
gather_from_sp   all-gather of the sequence forward ("fwd"), reduce-scatter backward ("bwd")
scatter_to_sp    reduce-scatter forward ("fwd"), all-gather backward ("bwd")
Sequence-parallel activations are (T / tp, B, H): sequence first, so dim 0 is gathered.
"""

from __future__ import annotations

import torch

from .communicator import TPCommunicator


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # a copy: autograd may hand the same gradient buffer to other consumers
        return ctx.tp.all_reduce(grad.contiguous().clone(), "bwd"), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp: TPCommunicator):
        if not x.is_contiguous():
            return tp.all_reduce(x.contiguous(), "fwd")
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
    return _CopyToTP.apply(x, tp) if tp.world > 1 else x


def reduce_from_tp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp) if tp.world > 1 else x


def gather_from_sp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _GatherFromSP.apply(x, tp) if tp.world > 1 else x


def scatter_to_sp(x: torch.Tensor, tp: TPCommunicator) -> torch.Tensor:
    return _ScatterToSP.apply(x, tp) if tp.world > 1 else x
