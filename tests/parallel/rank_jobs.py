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


def reduce_views(rank, world):
    """reduce_from_tp (exact and fp4quant wires) on tensors it must not modify in place: "ok" or
    what went wrong, by case."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    from fp4quant.parallel.mappings import reduce_from_tp

    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for preset in ("exact", "fp4quant"):
        tp = TPCommunicator(mesh.get_group(), CommConfig.from_preset(preset, "both"))
        tp.start_step(0)
        base = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
        total = sum(torch.randn(8, 64, generator=torch.Generator().manual_seed(r)) for r in range(world))
        tol = 1e-12 if preset == "exact" else 0.05  # fp4quant: an FP4 all-reduce's NMSE is about 1e-2

        def check(case, make, whole=total, rows=slice(None)):
            try:
                w = base.clone().requires_grad_()
                x, untouched = make(w)
                kept = untouched.detach().clone()
                y = reduce_from_tp(x, tp)
                (y * 2).sum().backward()  # identity backward: every value of w used gets 2
                problems = []
                error = float((y - whole[rows]).pow(2).sum() / whole[rows].pow(2).sum())
                if error > tol:
                    problems.append(f"not the sum (NMSE {error:.3g})")
                if not torch.equal(untouched.detach(), kept):
                    problems.append("modified its input")
                if not torch.equal(w.grad[rows], torch.full_like(w.grad[rows], 2.0)):
                    problems.append("wrong gradient")
                results[f"{preset}/{case}"] = "; ".join(problems) or "ok"
            except Exception as exc:  # noqa: BLE001 -- the message is what is checked
                results[f"{preset}/{case}"] = f"{type(exc).__name__}: {exc}"

        def dtensor_view(w):  # what torchtitan hands over: a local view of a DTensor
            d = DTensor.from_local(w * 1.0, mesh, (Partial(),), run_check=False)
            return d.to_local(), d.to_local()

        check("dtensor_to_local", dtensor_view)
        check("leaf", lambda w: (w, w))
        fresh = {}

        def slice_of_fresh(w):
            fresh["t"] = w * 1.0
            return fresh["t"][2:6], fresh["t"]

        check("slice", slice_of_fresh, rows=slice(2, 6))
        check("transpose", lambda w: ((w * 1.0).t(), w), whole=total.t())
        # a layer's fresh output: still reduced in place, no copy
        w = base.clone().requires_grad_()
        x = w * 1.0
        y = reduce_from_tp(x, tp)
        results[f"{preset}/fresh_in_place"] = "ok" if y.data_ptr() == x.data_ptr() else "copied"
    return results
