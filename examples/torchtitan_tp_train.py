"""Train torchtitan's llama3 debug model at TP = 2 on CPU / gloo, its TP traffic through fp4quant.

    torchrun --standalone --nproc-per-node 2 examples/torchtitan_tp_train.py --steps 3 --comm fp4quant
    torchrun --standalone --nproc-per-node 2 examples/torchtitan_tp_train.py --comm stock     # torchtitan as shipped

What a torchtitan user adds to a job (``python -m torchtitan.train --module llama3 --config
llama3_debugmodel ...``) is the override line of fp4quant.integrations.torchtitan, torchtitan's
own extension mechanism::

    --override.imports \
        fp4quant.integrations.torchtitan.attention fp4quant.integrations.torchtitan.feed_forward \
        fp4quant.integrations.torchtitan.embedding fp4quant.integrations.torchtitan.output_norm \
        fp4quant.integrations.torchtitan.selective_ac

and, to key the stochastic-rounding streams by the step (reproducible across a resume),
``fp4quant.integrations.torchtitan.start_step(model, step)`` before each step.  This script
puts those entries into ``config.override.imports`` and runs torchtitan's model path the way
its Trainer does: the ``llama3_debugmodel`` job config, ``update_from_config``,
``apply_overrides``, the model built on the meta device, the model's ``parallelize_fn``
(TP, activation checkpointing, FSDP), ``init_weights``, torchtitan's chunked loss, optimizer,
LR schedule and gradient clipping.  torchtitan 0.3.0 has no CPU / gloo option, so the CPU
shim (``cpu_shim``) does what its Trainer would need a GPU for: it makes the meshes on "cpu"
(torchtitan picks "cuda" when none is found), stands in for the one module of the import path
that needs triton (MoE expert-parallel kernels, CUDA only) when triton is absent, uses SDPA
(causal) in place of FlexAttention (compiled with inductor), random token batches in place of
the c4_test dataset and tokenizer files, and ``spmd_backend="partial_dtensor"``
(torch 2.13's FSDP takes no spmd_types parameters).

Rank 0 prints one JSON line per step (loss, and fp4quant's calls and bytes of the step in each
direction) and, last, the totals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types

import torch
import torch.distributed as dist

AC_CHOICES = ("none", "selective", "full")
SHIMMED = "torchtitan.distributed.minimal_async_ep.kernels"


def cpu_shim() -> None:
    """What torchtitan 0.3.0 needs to import and build its meshes on a CPU-only machine."""
    try:
        import triton  # noqa: F401
    except ImportError:
        if SHIMMED not in sys.modules:
            stub = types.ModuleType(SHIMMED, "stand-in for torchtitan's triton kernels of MoE expert "
                                             "parallelism (CUDA only): triton is not installed")

            def __getattr__(name):
                if name.startswith("__"):
                    raise AttributeError(name)

                def unavailable(*args, **kwargs):
                    raise RuntimeError(f"{SHIMMED}.{name} needs triton (CUDA), which is not installed")
                return unavailable

            stub.__getattr__ = __getattr__
            sys.modules[SHIMMED] = stub
    import torchtitan.distributed.parallel_dims as parallel_dims

    if not torch.cuda.is_available():
        parallel_dims.device_type = "cpu"


def job_config(comm: str, *, sp: bool = True, ac: str = "selective", keep: bool = True, seq_len: int = 64,
               batch_size: int = 2, steps: int = 3, backend: str = "partial_dtensor"):
    """torchtitan's llama3 debug job at TP = world size, with fp4quant's overrides unless ``comm``
    is "stock"; ``keep``: the AC override that keeps fp4quant's forward collectives (else AC
    recomputes them)."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from fp4quant.integrations import torchtitan as fp4_titan

    if ac not in AC_CHOICES:
        raise ValueError(f"ac must be one of {AC_CHOICES}, got {ac!r}")
    config = llama3_debugmodel()
    config.parallelism.tensor_parallel_degree = dist.get_world_size()
    config.parallelism.enable_sequence_parallel = sp
    config.parallelism.spmd_backend = backend
    config.training.seq_len, config.training.local_batch_size, config.training.steps = seq_len, batch_size, steps
    config.debug.seed = 0
    config.activation_checkpoint = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[ac]
    for layer in config.model_spec.model.layers:  # FlexAttention needs inductor: SDPA, causal, on CPU
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    if comm != "stock":
        kwargs = {"comm": comm}
        config.override.imports = [(target, kwargs) for target in fp4_titan.OVERRIDES]
        if keep and ac != "none":
            config.override.imports.append(f"{fp4_titan.__name__}.{ac}_ac")
    return config


class Run:
    """The model, loss, optimizer and schedule of a job config, built as torchtitan's Trainer does."""

    def __init__(self, config):
        from torchtitan.config.override import apply_overrides
        from torchtitan.distributed import ParallelDims, utils as dist_utils

        self.config = config
        self.parallel_dims = pd = ParallelDims.from_config(config.parallelism, dist.get_world_size())
        torch.autograd.set_multithreading_enabled(False)  # as torchtitan's init_distributed
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
        dist_utils.set_determinism(pd, torch.device("cpu"), config.debug, distinct_seed_mesh_dims=["pp"])
        spec = config.model_spec
        spec.model.update_from_config(config=config)
        self.overrides = apply_overrides(config.override, config) if config.override.imports else []
        with torch.device("meta"):
            model = spec.model.build()
        model = spec.parallelize_fn(model, parallel_dims=pd, training=config.training,
                                    parallelism=config.parallelism, compile_config=config.compile,
                                    ac_config=config.activation_checkpoint, dump_folder=config.dump_folder)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.model = model
        self.loss_fn = config.loss.build(compile_config=config.compile)
        if hasattr(self.loss_fn, "set_lm_head"):  # ChunkedLossWrapper, as the Trainer sets it up
            self.loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        self.optimizers = config.optimizer.build(model_parts=[model])
        self.schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=config.training.steps)
        self.context = dist_utils.get_spmd_context(parallel_dims=pd, spmd_typechecking=False)

    def step(self, step: int, tokens: torch.Tensor) -> float:
        """One training step on ``tokens`` (B, L + 1); the loss."""
        import spmd_types as spmd
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.spmd_types import annotate_input_spmd_types

        from fp4quant.integrations.torchtitan import start_step

        start_step(self.model, step)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        kwargs = {}
        if self.parallel_dims.spmd_backend == "spmd_types":
            inputs, labels, kwargs = annotate_input_spmd_types(self.parallel_dims, inputs, labels, kwargs)
        self.optimizers.zero_grad()
        with self.context():
            pred = self.model(inputs, **kwargs)
            loss, _ = self.loss_fn(pred, labels, torch.tensor(labels.numel()))
            del pred
            with spmd.no_typecheck():
                loss.backward()
        dist_utils.clip_grad_norm_(list(self.model.parameters()), self.config.training.max_norm, foreach=True)
        self.optimizers.step()
        self.schedulers.step()
        return loss.item()


def batch(step: int, batch_size: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Arithmetic sequences of tokens (a learnable pattern), the same on every TP rank."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def train(comm: str = "fp4quant", steps: int = 3, **job) -> dict:
    """Build and train; per step the loss and fp4quant's traffic ({direction: calls, bytes_sent,
    bytes_uncompressed}), and the override log lines."""
    from fp4quant import comm as fp4comm

    config = job_config(comm, steps=steps, **job)
    run = Run(config)
    vocab = config.model_spec.model.vocab_size
    records = []
    for step in range(steps):
        fp4comm.reset_stats()
        t0 = time.perf_counter()
        loss = run.step(step, batch(step, config.training.local_batch_size, config.training.seq_len, vocab))
        records.append({"step": step, "loss": loss, "seconds": time.perf_counter() - t0, **fp4comm.traffic()})
    return {"steps": records, "overrides": run.overrides}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--comm", default="fp4quant", help="a preset (fp4quant, nvfp4, bf16, ...), exact, or stock "
                                                      "(torchtitan without fp4quant)")
    ap.add_argument("--ac", choices=AC_CHOICES, default="selective", help="activation checkpointing")
    ap.add_argument("--no-keep", action="store_true", help="without the AC override (AC re-sends the forward "
                                                          "collectives in its recompute)")
    ap.add_argument("--no-sp", action="store_true", help="without sequence parallelism")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=2)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    cpu_shim()
    result = train(args.comm, args.steps, sp=not args.no_sp, ac=args.ac, keep=not args.no_keep,
                   seq_len=args.seq_len, batch_size=args.batch_size)
    if dist.get_rank() == 0:
        for record in result["steps"]:
            print(json.dumps(record), flush=True)
        total = {d: {k: sum(r[d][k] for r in result["steps"]) for k in ("calls", "bytes_sent", "bytes_uncompressed")}
                 for d in ("fwd", "bwd")}
        print(json.dumps(total), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
