"""Bodies of the torchtitan integration tests (run by distributed.run_ranks on gloo, TP = 2).

Each job trains torchtitan's llama3 debug model for a few steps through the example's runner
(examples/torchtitan_tp_train.py: torchtitan's own config, override and parallelize path) and
returns, per run, the losses and fp4quant's traffic of every step.  A job whose ranks cannot
import torchtitan returns {"skip": why}.
"""

from __future__ import annotations

import warnings

import torch.distributed as dist


def _load():
    """The example module, or the reason torchtitan cannot be used here."""
    try:
        import examples.torchtitan_tp_train as example

        example.cpu_shim()
        import fp4quant.integrations.torchtitan  # noqa: F401
    except ImportError as e:
        return None, f"torchtitan is not importable here ({type(e).__name__}: {e})"
    return example, None


def runs(rank, world, runs: dict, steps: int = 3):
    """{name: train(**kwargs)} for each named run, in order (the same on every rank)."""
    example, skip = _load()
    if skip:
        return {"skip": skip}
    from fp4quant.integrations.torchtitan import exact_fallbacks

    out = {}
    for name, kwargs in runs.items():
        before = exact_fallbacks["count"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = example.train(steps=steps, **kwargs)
        result["exact_fallbacks"] = exact_fallbacks["count"] - before
        result["warnings"] = [str(w.message) for w in caught if str(w.message).startswith("fp4quant/torchtitan")]
        out[name] = result
    dist.barrier()
    return out


def refusals(rank, world):
    """What the integration refuses, each as (case, exception type name, message)."""
    example, skip = _load()
    if skip:
        return {"skip": skip}
    import spmd_types as spmd
    from torchtitan.distributed.parallel_dims import MeshAxisName
    from torchtitan.models.common.config_utils import make_ffn_config
    from torchtitan.protocols.sharding import SpmdLayout

    from fp4quant.integrations import torchtitan as fp4_titan
    from fp4quant.integrations import torchtitan_boundary as boundary

    found = {}

    def attempt(case, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded and checked by the test
            found[case] = (type(e).__name__, str(e))
        else:
            found[case] = None

    def full_dtensor():
        example.Run(example.job_config("exact", backend="full_dtensor", ac="none"))

    def dist_gemm():  # torchtitan's fused all-gather + GEMM feed-forward (tp_gemm_backend="dist_gemm")
        fp4_titan.feed_forward(make_ffn_config(dim=256, hidden_dim=768, w1_param_init={}, w2w3_param_init={},
                                               tp_gemm_backend="dist_gemm"))

    def no_boundary():
        config = example.job_config("exact", ac="none")  # sharding configs are set by update_from_config only
        fp4_titan.feed_forward(config.model_spec.model.layers[0].feed_forward)

    def all_to_all():
        TP, DP, CP = MeshAxisName.TP, MeshAxisName.DP, MeshAxisName.CP
        boundary._kind(SpmdLayout({DP: spmd.R, CP: spmd.R, TP: spmd.S(1)}),
                       SpmdLayout({DP: spmd.R, CP: spmd.R, TP: spmd.S(2)}), "a test boundary")

    def bad_preset():
        config = example.job_config("exact", ac="none")
        config.model_spec.model.update_from_config(config=config)
        fp4_titan.feed_forward(config.model_spec.model.layers[0].feed_forward, comm="no-such-preset")

    for case, fn in (("full_dtensor", full_dtensor), ("dist_gemm", dist_gemm), ("no_boundary", no_boundary),
                     ("all_to_all", all_to_all), ("bad_preset", bad_preset)):
        attempt(case, fn)
    dist.barrier()
    return found


def spmd_types_blocks(rank, world, sp: bool):
    """torchtitan's default backend, spmd_types, one block at a time (torch 2.13 cannot run the whole
    model under it, stock or not: its FSDP refuses spmd_types' plain-tensor parameters): layer 0's
    feed-forward and attention blocks, parallelized by torchtitan's Module.parallelize, stock and
    through fp4quant (exact, fp4quant) on the same weights and input.  Per block and run: the
    output, the input gradient and fp4quant's (fwd, bwd) calls."""
    example, skip = _load()
    if skip:
        return {"skip": skip}
    import spmd_types as spmd
    import torch
    from torchtitan.config.override import apply_overrides
    from torchtitan.distributed import ParallelDims, utils as dist_utils

    from fp4quant import comm as fp4comm

    out = {}
    for comm in ("stock", "exact", "fp4quant"):
        config = example.job_config(comm, sp=sp, ac="none", backend="spmd_types")
        parallel_dims = ParallelDims.from_config(config.parallelism, world)
        dist_utils.set_spmd_backend("spmd_types")
        config.model_spec.model.update_from_config(config=config)
        if config.override.imports:
            apply_overrides(config.override, config)
        context = dist_utils.get_spmd_context(parallel_dims=parallel_dims)
        for block in ("feed_forward", "attention"):
            module = getattr(config.model_spec.model.layers[0], block).build()
            torch.manual_seed(0)
            with torch.no_grad():
                for p in module.parameters():
                    p.normal_(0, 0.05)
            module.parallelize(parallel_dims)
            x = torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(1))
            if sp:
                x = x.chunk(world, dim=1)[rank].contiguous()
            x.requires_grad_(True)
            fp4comm.reset_stats()
            with context():
                y = module(x) if block == "feed_forward" else module(x, None, None)
                w = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
                with spmd.no_typecheck():
                    (y * w).sum().backward()
            stats = fp4comm.stats()
            out[comm, block] = {"class": type(module).__name__, "y": y.detach(), "grad": x.grad,
                                "calls": tuple(stats.get(d, {}).get("calls", 0) for d in ("fwd", "bwd"))}
    dist.barrier()
    return out
