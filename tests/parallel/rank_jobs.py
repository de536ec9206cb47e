"""Bodies of the multi-rank parallel-layer tests (run by distributed.run_ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fp4quant import comm
from fp4quant.parallel import (
    ColumnParallelLinear,
    CommConfig,
    RowParallelLinear,
    TPCommunicator,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)


def mlp_block(rank, world, full, x, labels, preset="exact", compress="both", sp=False):
    """A column -> row block, an embedding and a vocab-parallel loss on TP shards of `full`
    weights; returns the loss and the full-shape gradients this rank can see."""
    tp = TPCommunicator(dist.group.WORLD, CommConfig.from_preset(preset, compress))
    col = ColumnParallelLinear(16, 32, tp, bias=True, sequence_parallel=sp)
    row = RowParallelLinear(32, 16, tp, bias=True, sequence_parallel=sp)
    emb = VocabParallelEmbedding(64, 16, tp, sequence_parallel=sp)
    head = ColumnParallelLinear(16, 64, tp, bias=False, sequence_parallel=sp)
    col.load_full(full["col.w"], full["col.b"])
    row.load_full(full["row.w"], full["row.b"])
    emb.load_full(full["emb"])
    head.load_full(full["head"])
    comm.reset_stats()
    h = emb(x.t())  # (T or T/tp, B, 16)
    h = h + row(torch.relu(col(h)))
    logits = head(h).transpose(0, 1)  # (B, T, 64/tp)
    loss = vocab_parallel_cross_entropy(logits, labels, tp, emb.vocab_start)
    loss.backward()
    n = 64 // world
    return {
        "loss": loss.detach(),
        "col.w": col.weight.grad, "row.w": row.weight.grad, "row.b": row.bias.grad,
        "emb": emb.weight.grad, "head": head.weight.grad, "rows": (rank * n, (rank + 1) * n),
        "stats": comm.stats(),
    }
