"""Bodies of the multi-rank tests of fp4quant.parallel.styles (run by distributed.run_ranks)."""

from __future__ import annotations

import collections
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode

from fp4quant import comm
from fp4quant.parallel.styles import (
    CompressedColwiseParallel,
    CompressedPrepareModuleInput,
    CompressedRowwiseParallel,
    CompressedSequenceParallel,
    communicators,
    start_step,
)

VOCAB, DIM, HIDDEN, LAYERS = 64, 64, 128, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class Net(nn.Module):
    """A user's own model: embedding, residual MLP blocks, a norm and a head."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def plan(kind: str, comm_spec="exact"):
    """A TP plan of Net: kind "stock" / "compressed" (both TP), "sp-stock" / "sp-compressed" (sequence
    parallel), "mixed" (stock and compressed modules side by side)."""
    compressed = kind in ("compressed", "sp-compressed")
    col = partial_style(CompressedColwiseParallel if compressed else ColwiseParallel, compressed, comm_spec)
    row = partial_style(CompressedRowwiseParallel if compressed else RowwiseParallel, compressed, comm_spec)
    seq = partial_style(CompressedSequenceParallel if compressed else SequenceParallel, compressed, comm_spec)
    if kind in ("stock", "compressed"):
        return {"emb": row(input_layouts=Replicate()), "blocks.*.w1": col(), "blocks.*.w2": row(),
                "head": col(output_layouts=Replicate())}
    if kind in ("sp-stock", "sp-compressed"):
        return {"emb": row(input_layouts=Replicate(), output_layouts=Shard(1)), "blocks.*.norm": seq(),
                "blocks.*.w1": col(input_layouts=Shard(1)), "blocks.*.w2": row(output_layouts=Shard(1)),
                "norm": seq(), "head": col(input_layouts=Shard(1), output_layouts=Replicate())}
    assert kind == "mixed"
    return {"emb": RowwiseParallel(input_layouts=Replicate()),
            "blocks.0.w1": CompressedColwiseParallel(comm=comm_spec), "blocks.0.w2": RowwiseParallel(),
            "blocks.1.w1": ColwiseParallel(), "blocks.1.w2": CompressedRowwiseParallel(comm=comm_spec),
            "head": CompressedColwiseParallel(output_layouts=Replicate(), comm=comm_spec)}


def partial_style(cls, compressed, comm_spec):
    return (lambda **kw: cls(comm=comm_spec, **kw)) if compressed else cls


def batch(seed=1, b=4, t=16):
    """Token ids and labels: a learnable map of the ids half of the time, noise otherwise (so the
    loss levels off near 2.7 nats instead of going to zero, where 2 % would be no tolerance)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    noise = torch.randint(0, VOCAB, (b, t), generator=g)
    return ids, torch.where(torch.rand(b, t, generator=g) < 0.5, (ids * 7 + 3) % VOCAB, noise)


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def step_results(model, ids, labels, run=None):
    """Logits, loss and full gradients of one forward and backward (``run``: the compiled model)."""
    logits = (model if run is None else run)(ids)
    full = _full(logits)
    loss = F.cross_entropy(full.reshape(-1, full.shape[-1]), labels.reshape(-1))
    loss.backward()
    grads = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
    return {"logits": _full(logits).detach(), "loss": loss.detach(), "grads": grads}


class GatedMLP(nn.Module):
    """Two column-parallel layers on one input (a gated MLP's gate and up), one row-parallel."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GatedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = GatedMLP()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class GatedNet(Net):
    """Net with gated MLP blocks: the block-level input's test model."""

    def __init__(self, seed=0):
        super().__init__(seed)
        torch.manual_seed(seed + 1)
        self.blocks = nn.ModuleList(GatedBlock() for _ in range(LAYERS))


def gated_plan(kind: str, comm_spec="exact"):
    """A TP plan of GatedNet.  "per-projection": w1 and w3 each reduce their input gradient;
    "block" / "block-sp": the MLP's input prepared once (Replicate / sequence-sharded input);
    "block-local": prepared with use_local_output=True (the projections then reduce);
    "block-stock": torchtitan's stock plan; "block-stock-input": the stock PrepareModuleInput
    before the compressed projections."""
    col = partial_style(CompressedColwiseParallel, True, comm_spec)
    row = partial_style(CompressedRowwiseParallel, True, comm_spec)
    if kind == "block-stock":
        col, row = ColwiseParallel, RowwiseParallel
    plan = {"emb": row(input_layouts=Replicate()), "blocks.*.mlp.w1": col(), "blocks.*.mlp.w3": col(),
            "blocks.*.mlp.w2": row(), "head": col(output_layouts=Replicate())}
    if kind == "block":
        plan["blocks.*.mlp"] = CompressedPrepareModuleInput(input_layouts=Replicate(), comm=comm_spec)
    elif kind == "block-local":
        plan["blocks.*.mlp"] = CompressedPrepareModuleInput(input_layouts=Replicate(), use_local_output=True,
                                                            comm=comm_spec)
    elif kind in ("block-stock", "block-stock-input"):
        plan["blocks.*.mlp"] = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate())
    elif kind == "block-sp":
        seq = partial_style(CompressedSequenceParallel, True, comm_spec)
        plan = {"emb": row(input_layouts=Replicate(), output_layouts=Shard(1)), "blocks.*.norm": seq(),
                "blocks.*.mlp": CompressedPrepareModuleInput(input_layouts=Shard(1), comm=comm_spec),
                "blocks.*.mlp.w1": col(), "blocks.*.mlp.w3": col(), "blocks.*.mlp.w2": row(output_layouts=Shard(1)),
                "norm": seq(), "head": col(input_layouts=Shard(1), output_layouts=Replicate())}
    else:
        assert kind == "per-projection"
    return plan


class Collectives(TorchDispatchMode):
    """Counts the collectives dispatched while active, by op name: torch.distributed's own
    (c10d: fp4quant's exact wire) and the functional ones of DTensor's redistributions."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def traced_results(model, ids, labels):
    """step_results, with fp4quant's statistics and the collectives any layer (DTensor's own
    included) called in the forward and backward."""
    comm.reset_stats()
    start_step(model, 0)
    with Collectives() as mode:
        logits = _full(model(ids))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
    grads = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads, "stats": comm.stats(),
            "collectives": dict(mode.counts)}


def gated_forward_backward(rank, world, kinds, comm_spec="exact"):
    """GatedNet whole in one process, then under each plan of gated_plan."""
    mesh = init_device_mesh("cpu", (world,))
    ids, labels = batch()
    out = {"single": step_results(GatedNet(), ids, labels)}
    for kind in kinds:
        model = parallelize_module(GatedNet(), mesh, gated_plan(kind, comm_spec))
        out[kind] = traced_results(model, ids, labels)
    return out


def dtensor_producers(rank, world, comm_spec="exact"):
    """Row-parallel outputs kept as Replicate DTensors (use_local_output=False) feeding
    column-parallel layers: the colwise layers take them prepared, and each producer reduces
    its consumer's partial gradient once."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM),
                          nn.Linear(DIM, VOCAB))
    ids, labels = batch()
    out = {"single": step_results(copy.deepcopy(whole), ids, labels)}
    model = parallelize_module(copy.deepcopy(whole), mesh, {
        "0": CompressedRowwiseParallel(input_layouts=Replicate(), use_local_output=False, comm=comm_spec),
        "1": CompressedColwiseParallel(comm=comm_spec),
        "3": CompressedRowwiseParallel(use_local_output=False, comm=comm_spec),
        "4": CompressedColwiseParallel(output_layouts=Replicate(), comm=comm_spec)})
    out["tp"] = traced_results(model, ids, labels)
    return out


def forward_backward(rank, world, kinds, comm_spec="exact"):
    """Logits and every parameter's full gradient: one process's whole model, then each plan."""
    mesh = init_device_mesh("cpu", (world,))
    ids, labels = batch()
    out = {"single": step_results(Net(), ids, labels)}
    for kind in kinds:
        model = parallelize_module(Net(), mesh, plan(kind, comm_spec))
        comm.reset_stats()
        start_step(model, 0)
        out[kind] = step_results(model, ids, labels)
        out[kind]["stats"] = comm.stats()
        out[kind]["weight_is_dtensor"] = isinstance(model.blocks[0].w1.weight, DTensor)
        out[kind]["communicators"] = len(communicators(model))
    return out


def train(rank, world, comm_spec, steps=50, lr=3e-3):
    """``steps`` AdamW steps of Net under the compressed TP plan; the loss of every step."""
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(Net(), mesh, plan("compressed", comm_spec))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        start_step(model, step)
        ids, labels = batch(seed=100 + step, b=8)
        loss = F.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    state = model.state_dict()
    return {"losses": losses, "state_is_dtensor": isinstance(state["blocks.0.w1.weight"], DTensor)}


def layer_error(rank, world, comm_spec, tokens=256, dim=256):
    """One column -> row MLP under the compressed styles against the same layers whole: the output
    and the input gradient (the two compressed collectives of a layer pair), and the energies of
    the ranks' partial sums that the error bound is stated in."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
    x = torch.randn(tokens, dim)
    dy = torch.randn(tokens, dim, generator=torch.Generator().manual_seed(1))
    tp = parallelize_module(copy.deepcopy(whole), mesh, {"0": CompressedColwiseParallel(comm=comm_spec),
                                                         "2": CompressedRowwiseParallel(comm=comm_spec)})
    start_step(tp, 0)
    xi = x.clone().requires_grad_()
    y = tp(xi)
    y.backward(dy)
    out = {"tp": {"y": y.detach(), "dx": xi.grad}}
    xi = x.clone().requires_grad_()
    pre = whole[0](xi)
    pre.retain_grad()
    h = whole[1](pre)
    y = whole[2](h)
    y.backward(dy)
    n = 2 * dim // world
    shards = [slice(r * n, (r + 1) * n) for r in range(world)]
    partials = {"y": [h[:, s] @ whole[2].weight[:, s].T for s in shards],
                "dx": [pre.grad[:, s] @ whole[0].weight[s] for s in shards]}
    out["whole"] = {"y": y.detach(), "dx": xi.grad}
    out["energy"] = {k: (sum(float(p.double().pow(2).sum()) for p in v), float(sum(v).double().pow(2).sum()))
                     for k, v in partials.items()}
    return out


def compiled(rank, world, comm_spec):
    """torch.compile of a model parallelized with the styles: forward and backward run."""
    mesh = init_device_mesh("cpu", (world,))
    eager = parallelize_module(Net(), mesh, plan("compressed", comm_spec))
    model = parallelize_module(Net(), mesh, plan("compressed", comm_spec))
    ids, labels = batch()
    start_step(eager, 0)
    ref = step_results(eager, ids, labels)
    start_step(model, 0)
    got = step_results(model, ids, labels, run=torch.compile(model))
    return {"ref": ref, "got": got}


class Two(nn.Module):
    def forward(self, x, y):
        return x + y


def bad_inputs(rank, world):
    """The one-line errors of bad input, by case."""
    errors = {}

    def record(name, fn):
        try:
            fn()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 -- the message is what is checked
            errors[name] = f"{type(exc).__name__}: {exc}"

    mesh2d = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    mesh = init_device_mesh("cpu", (world,))
    record("mesh_2d", lambda: CompressedColwiseParallel()._apply(nn.Linear(8, 8), mesh2d))
    record("not_divisible", lambda: parallelize_module(nn.Sequential(nn.Linear(8, 9)), mesh,
                                                       {"0": CompressedColwiseParallel()}))
    record("heads", lambda: CompressedColwiseParallel().in_units_of(8, "attention heads")._apply(
        nn.Linear(8, 8 * (world + 1)), mesh))
    record("module_type", lambda: parallelize_module(nn.Sequential(nn.Conv1d(4, 4, 1)), mesh,
                                                     {"0": CompressedRowwiseParallel()}))
    record("comm", lambda: CompressedRowwiseParallel(comm=3))
    record("preset", lambda: CompressedRowwiseParallel(comm="fp5"))
    model = parallelize_module(nn.Sequential(nn.Linear(8, 8)), mesh, {"0": CompressedRowwiseParallel()})
    record("rowwise_input", lambda: model(DTensor.from_local(torch.ones(2, 8), mesh, (Replicate(),))))
    two = parallelize_module(Two(), mesh, CompressedPrepareModuleInput(input_layouts=Replicate()))
    record("prepare_count", lambda: two(torch.ones(2), torch.ones(2)))
    dist.barrier()
    return errors


def dp_tp(rank, world, comm_spec="exact", per_rank=4):
    """DP x TP (world / 2 x 2): each DP replica takes its part of the batch, gradients are averaged
    over DP; against one process on the whole batch."""
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    dp, dp_rank = mesh["dp"].size(), mesh.get_local_rank("dp")
    ids, labels = batch(b=per_rank * dp)
    single = step_results(Net(), ids, labels)
    model = parallelize_module(Net(), mesh["tp"], plan("compressed", comm_spec))
    start_step(model, 0)
    part = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    got = step_results(model, ids[part], labels[part])
    for p in model.parameters():
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(local, group=mesh["dp"].get_group())
        local /= dp
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    return {"single_logits": single["logits"][part], "single_grads": single["grads"], "logits": got["logits"],
            "grads": grads}
