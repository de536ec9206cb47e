"""Megatron-style tensor-parallel layers, written plainly on the mappings.

Weights are stored sharded: a ColumnParallelLinear holds out_features / tp rows of the
full weight (rank r: rows [r * out/tp, (r+1) * out/tp)), a RowParallelLinear holds
in_features / tp columns, a VocabParallelEmbedding vocab / tp rows.  ``load_full``
copies this rank's shard out of a full (unsharded) tensor, for checkpoints such as
Hugging Face's.  With sequence parallelism the activations between TP regions are
sequence-sharded (T / tp, B, H) and the layers gather / scatter instead of reducing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .communicator import TPCommunicator
from .compute import linear
from .mappings import copy_to_tp, gather_from_sp, reduce_from_tp, scatter_to_sp


def _divide(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size {tp}")
    return n // tp


def _init_shard(weight: torch.Tensor, fan_in: int) -> None:
    # the same distribution as nn.Linear's default for the full layer
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)


def column_input(x: torch.Tensor, tp: TPCommunicator, sequence_parallel: bool) -> torch.Tensor:
    """What every column-parallel layer does to its input: all-gather the sequence (SP) or
    all-reduce the gradient backward.  Layers sharing one input (q, k, v) call it once
    and are built with input_is_mapped=True."""
    return gather_from_sp(x, tp) if sequence_parallel else copy_to_tp(x, tp)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows; the output stays split."""

    def __init__(self, in_features: int, out_features: int, tp: TPCommunicator, bias: bool = True,
                 sequence_parallel: bool = False, input_is_mapped: bool = False, device=None, dtype=None):
        super().__init__()
        self.tp, self.sequence_parallel, self.input_is_mapped = tp, sequence_parallel, input_is_mapped
        self.in_features, self.out_features = in_features, out_features
        self.out_local = _divide(out_features, tp.world, "out_features")
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(self.out_local, device=device, dtype=dtype)) if bias else None
        self.compute = self.compute_index = None  # exact F.linear unless a LinearCompute is attached
        _init_shard(self.weight, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_mapped:
            x = column_input(x, self.tp, self.sequence_parallel)
        return linear(self, x, self.bias)

    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        r, n = self.tp.rank, self.out_local
        with torch.no_grad():
            self.weight.copy_(weight[r * n : (r + 1) * n])
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias[r * n : (r + 1) * n])


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns; x arrives split, y is reduced over TP."""

    def __init__(self, in_features: int, out_features: int, tp: TPCommunicator, bias: bool = True,
                 sequence_parallel: bool = False, device=None, dtype=None):
        super().__init__()
        self.tp, self.sequence_parallel = tp, sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.in_local = _divide(in_features, tp.world, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        self.compute = self.compute_index = None  # exact F.linear unless a LinearCompute is attached
        _init_shard(self.weight, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(self, x, None)
        y = scatter_to_sp(y, self.tp) if self.sequence_parallel else reduce_from_tp(y, self.tp)
        return y + self.bias if self.bias is not None else y

    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        r, n = self.tp.rank, self.in_local
        with torch.no_grad():
            self.weight.copy_(weight[:, r * n : (r + 1) * n])
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias)


def vocab_shard_lookup(ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, lookup=F.embedding) -> torch.Tensor:
    """The embeddings of ``ids`` that fall in this rank's rows [vocab_start, vocab_start + rows),
    zeros for the others: one rank's part of a vocabulary-parallel lookup."""
    local = ids - vocab_start
    outside = (local < 0) | (local >= weight.shape[0])
    out = lookup(local.masked_fill(outside, 0), weight)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)


class VocabParallelEmbedding(nn.Module):
    """Embedding with the vocabulary split over TP: each rank looks up its own rows, zeros
    elsewhere, and the partial embeddings are reduced (or reduce-scattered with SP)."""

    def __init__(self, vocab_size: int, dim: int, tp: TPCommunicator, sequence_parallel: bool = False,
                 device=None, dtype=None):
        super().__init__()
        self.tp, self.sequence_parallel = tp, sequence_parallel
        self.vocab_size, self.dim = vocab_size, dim
        self.vocab_local = _divide(vocab_size, tp.world, "vocab_size")
        self.vocab_start = tp.rank * self.vocab_local
        self.weight = nn.Parameter(torch.empty(self.vocab_local, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world == 1:
            return F.embedding(ids, self.weight)
        out = vocab_shard_lookup(ids, self.weight, self.vocab_start)
        return scatter_to_sp(out, self.tp) if self.sequence_parallel else reduce_from_tp(out, self.tp)

    def load_full(self, weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.weight.copy_(weight[self.vocab_start : self.vocab_start + self.vocab_local])


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of logits split over the vocabulary; softmax statistics are reduced
    exactly (uncompressed: they are small and the loss must not depend on the codec)."""

    @staticmethod
    def forward(ctx, logits, labels, tp: TPCommunicator, vocab_start: int):
        logits = logits.float()
        vocab_local = logits.shape[-1]
        logit_max = logits.max(dim=-1).values
        tp.all_reduce_exact(logit_max, "max")
        shifted = logits - logit_max.unsqueeze(-1)
        local = labels - vocab_start
        outside = (local < 0) | (local >= vocab_local)
        local = local.masked_fill(outside, 0)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        tp.all_reduce_exact(target)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        tp.all_reduce_exact(sum_exp)
        loss = torch.log(sum_exp) - target
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, outside)
        ctx.count = loss.numel()
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        g = softmax.clone()
        onehot = torch.zeros_like(g).scatter_(-1, local.unsqueeze(-1), 1.0)
        g -= onehot * (~outside).unsqueeze(-1).to(g.dtype)
        return g * (grad / ctx.count), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp: TPCommunicator,
                                 vocab_start: int) -> torch.Tensor:
    """Mean token cross entropy; ``logits`` (..., vocab / tp) is this rank's slice starting at vocab_start."""
    if tp.world == 1:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return _VocabParallelCrossEntropy.apply(logits, labels, tp, vocab_start)
