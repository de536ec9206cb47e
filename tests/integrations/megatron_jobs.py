"""Rank bodies of test_megatron.py (run by tests/distributed.py's run_ranks on gloo).

The model, the batch and the CPU stand-ins are the example's (examples/megatron_tp_train.py).
A spy wraps every torch.distributed collective (and the copies of all_gather_into_tensor /
reduce_scatter_tensor Megatron bound at import) during a step, and records each call: the phase
(fwd / bwd), its size, whether its group spans the TP ranks, and whether it ran inside the
TPCommunicator.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

import torch
import torch.distributed as dist

from distributed import REPO

import fp4quant.comm as fcomm
from fp4quant.integrations import megatron as fp4_megatron

BATCH, SEQ, VOCAB = 2, 32, 128
DIST_FUNCTIONS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "_all_gather_base",
                  "_reduce_scatter_base", "all_gather", "reduce_scatter", "all_to_all_single", "all_to_all",
                  "broadcast", "send", "recv", "isend", "irecv", "batch_isend_irecv")
MEGATRON_BOUND = ("dist_all_gather_func", "dist_reduce_scatter_func")  # module globals of layers / mappings


def example():
    sys.path.insert(0, str(REPO / "examples"))
    return importlib.import_module("megatron_tp_train")


def setup(world: int, sequence_parallel: bool):
    ex = example()
    ex.cpu_stand_ins()
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    return ex, parallel_state.get_tensor_model_parallel_group()


def _nbytes(args, kwargs) -> int:
    sizes = [0]
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(t, torch.Tensor):
                sizes.append(t.numel() * t.element_size())
            elif isinstance(t, dist.P2POp):
                sizes.append(t.tensor.numel() * t.tensor.element_size())
    return max(sizes)


class Spy:
    """Records the collectives of a step: (phase, function, bytes, on the TP ranks, inside fp4quant)."""

    def __init__(self, tp_group):
        self.tp_ranks = dist.get_process_group_ranks(tp_group)
        self.records: list[tuple[str, str, int, bool, bool]] = []
        self.phase = "fwd"
        self.depth = 0

    def _ranks(self, args, kwargs):
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))

    def wrap(self, name, fn):
        def spy(*args, **kwargs):
            self.records.append((self.phase, name, _nbytes(args, kwargs), self._ranks(args, kwargs) == self.tp_ranks,
                                 self.depth > 0))
            return fn(*args, **kwargs)

        return spy

    def inside(self, fn):
        def call(*args, **kwargs):
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return call

    @contextlib.contextmanager
    def installed(self, tp=None):
        from megatron.core.tensor_parallel import layers, mappings

        saved = []
        targets = [(dist, n) for n in DIST_FUNCTIONS if hasattr(dist, n)]
        targets += [(m, n) for m in (layers, mappings) for n in MEGATRON_BOUND]
        for owner, name in targets:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, self.wrap(name, getattr(owner, name)))
        if tp is not None:  # the communicator's own collectives: instance attributes over its methods
            for name in ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_exact"):
                setattr(tp, name, self.inside(getattr(tp, name)))
        try:
            yield self
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)
            if tp is not None:
                for name in ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_exact"):
                    delattr(tp, name)


def step(ex, model, tp_group, tp=None) -> dict:
    """One forward and backward of the batch of step 0: loss, gradients, stats and spied collectives."""
    for p in model.parameters():
        p.grad = None
    ids, labels = ex.batch(0, BATCH, SEQ, VOCAB)
    before = fcomm.stats()
    spy = Spy(tp_group)
    with spy.installed(tp):
        loss = ex.loss_of(model, ids, labels)
        spy.phase = "bwd"
        loss.backward()
    after = fcomm.stats()
    stats = {d: {k: after.get(d, {}).get(k, 0) - before.get(d, {}).get(k, 0)
                 for k in ("calls", "bytes_sent", "bytes_uncompressed")} for d in ("fwd", "bwd")}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return dict(loss=loss.detach().clone(), grads=grads, stats=stats, records=spy.records)


def compare(rank: int, world: int, comm: str, sequence_parallel: bool) -> dict:
    """Stock Megatron, then enable(comm), then disable(): one step of each on the same weights."""
    ex, tp_group = setup(world, sequence_parallel)
    from megatron.core.tensor_parallel import layers

    model = ex.tiny_gpt(world, sequence_parallel, seq_len=SEQ, vocab=VOCAB)
    originals = {n: getattr(layers, n) for n in fp4_megatron.REBOUND}
    stock = step(ex, model, tp_group)
    tp = fp4_megatron.enable(comm, model=model)
    rebound = [n for n in fp4_megatron.REBOUND if getattr(layers, n) is not originals[n]]
    fp4_megatron.start_step(0)
    enabled = step(ex, model, tp_group, tp)
    fp4_megatron.disable()
    restored = all(getattr(layers, n) is originals[n] for n in fp4_megatron.REBOUND)
    again = step(ex, model, tp_group)
    return dict(stock=stock, enabled=enabled, again=again, rebound=rebound, restored=restored,
                still_enabled=fp4_megatron.enabled(), layers=model.config.num_layers)


def _layer_outputs(build, x, fn) -> dict:
    torch.manual_seed(0)
    layer = build()
    x = x.clone().requires_grad_(True)
    y = fn(layer, x)
    y.backward(torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).sin())
    return dict(y=y.detach(), dx=x.grad, dw=[p.grad for p in layer.parameters()])


def layer_paths(rank: int, world: int) -> dict:
    """The paths the GPT does not take, stock against enable("exact"): a column-parallel layer
    gathering its output, a row-parallel layer splitting its input, a frozen column-parallel
    weight, and the forward reduction of views autograd forbids modifying in place."""
    ex, tp_group = setup(world, False)
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import layers

    config = ModelParallelConfig(tensor_model_parallel_size=world, use_cpu_initialization=True)
    init = torch.nn.init.normal_
    cases = {
        "column_gather_output": (lambda: layers.ColumnParallelLinear(16, 8, config=config, init_method=init,
                                                                     gather_output=True, tp_group=tp_group),
                                 lambda l, x: l(x)[0], (4, 2, 16)),
        "row_split_input": (lambda: layers.RowParallelLinear(16, 8, config=config, init_method=init, bias=True,
                                                             input_is_parallel=False, skip_bias_add=False,
                                                             tp_group=tp_group),
                            lambda l, x: l(x)[0], (4, 2, 16)),
        "column_frozen": (lambda: _frozen(layers.ColumnParallelLinear(16, 8, config=config, init_method=init,
                                                                      tp_group=tp_group)),
                          lambda l, x: l(x)[0], (4, 2, 16)),
    }
    x = {name: torch.randn(shape, generator=torch.Generator().manual_seed(1)) for name, (_, _, shape) in cases.items()}

    def views(reduce):
        out = {}
        for name, make in {"split": lambda y: y.split(2, dim=0)[0], "unbind": lambda y: y.unbind(0)[0],
                           "transpose": lambda y: y.t(), "view": lambda y: y.view(-1)}.items():
            w = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank + 2), requires_grad=True)
            v = make(w * 2)
            true = v.detach().contiguous().clone()
            dist.all_reduce(true, group=tp_group)
            r = reduce(v, group=tp_group)
            r.backward(torch.ones_like(r))
            out[name] = (r.detach(), w.grad, true)
        return out

    stock = {name: _layer_outputs(build, x[name], fn) for name, (build, fn, _) in cases.items()}
    stock_views = views(layers.reduce_from_tensor_model_parallel_region)
    fp4_megatron.enable("exact")
    before = fcomm.stats()
    enabled = {name: _layer_outputs(build, x[name], fn) for name, (build, fn, _) in cases.items()}
    enabled_views = views(layers.reduce_from_tensor_model_parallel_region)
    after = fcomm.stats()
    fp4_megatron.disable()
    calls = {d: after.get(d, {}).get("calls", 0) - before.get(d, {}).get("calls", 0) for d in ("fwd", "bwd")}
    return dict(stock=stock, enabled=enabled, stock_views=stock_views, enabled_views=enabled_views, calls=calls)


def _frozen(layer):
    layer.weight.requires_grad_(False)
    return layer
