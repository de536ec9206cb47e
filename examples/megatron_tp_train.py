"""Train a tiny Megatron-Core GPT whose tensor-parallel traffic goes through fp4quant.

    torchrun --standalone --nproc-per-node 2 examples/megatron_tp_train.py --comm fp4quant
    torchrun --standalone --nproc-per-node 2 examples/megatron_tp_train.py --comm exact --sequence-parallel

Megatron-Core's own GPT (the local layer spec: no Transformer Engine), on CPU over gloo, TP =
the number of processes.  ``fp4quant.integrations.megatron.enable`` sends every collective of its
ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding through one TPCommunicator;
each step keys the stochastic-rounding streams (``start_step``).  Rank 0 prints one JSON line per
step and, last, the bytes each direction sent against its uncompressed size.

Megatron-Core is written for CUDA; two stand-ins let it run on CPU here (``cpu_stand_ins``): its
RNG tracker (dropout is off, so it forks nothing) and ``torch.cuda.current_device`` ("cpu").  Its
local spec's torch LayerNorm refuses sequence parallelism (Megatron wants Apex's there), so the
model's norms are torch's LayerNorm with their weights marked sequence-parallel, whose gradients
the loop sums over TP as Megatron's finalize_model_grads would.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.distributed as dist

from fp4quant import comm
from fp4quant.integrations import megatron as fp4_megatron


class CPURNGTracker:
    """Megatron's CUDA RNG tracker, for CPU runs without dropout: forks nothing."""

    def reset(self):
        pass

    def get_states(self):
        return {}

    def set_states(self, states):
        pass

    def add(self, name, seed):
        pass

    def is_initialized(self):
        return True

    @contextlib.contextmanager
    def fork(self, name=None):
        yield


def cpu_stand_ins() -> None:
    """Let Megatron-Core's CUDA-minded code run on CPU (this process only)."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    mrandom._CUDA_RNG_STATE_TRACKER = CPURNGTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


class SequenceParallelLayerNorm:
    """torch's LayerNorm, built as Megatron builds its norms, weights marked sequence-parallel
    (their gradients are partial sums over the TP ranks' sequence shards)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_):
        norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def tiny_gpt(tp: int, sequence_parallel: bool = False, layers: int = 2, hidden: int = 64, heads: int = 4,
             vocab: int = 128, seq_len: int = 32, seed: int = 0):
    """Megatron-Core's GPTModel, local spec, RoPE, on CPU; the same full weights whatever ``tp``."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel,
                               use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
                               bias_activation_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
                               gradient_accumulation_fusion=False, persist_layer_norm=False)
    layer = get_gpt_layer_local_spec()
    layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
    block = TransformerBlockSubmodules(layer_specs=[layer] * layers, layer_norm=SequenceParallelLayerNorm)
    torch.manual_seed(seed)  # CPU initialization draws the full weight, then keeps this rank's shard
    return GPTModel(config, block, vocab_size=vocab, max_sequence_length=seq_len, position_embedding_type="rope")


def batch(step: int, batch_size: int, seq_len: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Arithmetic sequences of tokens (a learnable pattern), the same on every TP rank: (ids, labels)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    ids = (start + stride * torch.arange(seq_len + 1)) % vocab
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_of(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy (Megatron's vocab-parallel one)."""
    s = ids.shape[1]
    positions = torch.arange(s).expand_as(ids)
    causal = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)  # True: masked
    return model(ids, positions, causal, labels=labels).float().mean()


def sum_sequence_parallel_grads(model, group) -> None:
    """What Megatron's finalize_model_grads does for sequence-parallel weights (exact: small)."""
    for p in model.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--comm", default="fp4quant", help="a preset (fp4quant, nvfp4, bf16, ...) or exact")
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    from megatron.core import parallel_state

    cpu_stand_ins()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    model = tiny_gpt(dist.get_world_size(), args.sequence_parallel, seq_len=args.seq_len)
    fp4_megatron.enable(args.comm, model=model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    vocab = model.vocab_size
    totals = {}
    for step in range(args.steps):
        comm.reset_stats()
        fp4_megatron.start_step(step)
        loss = loss_of(model, *batch(step, args.batch_size, args.seq_len, vocab))
        loss.backward()
        sum_sequence_parallel_grads(model, parallel_state.get_tensor_model_parallel_group())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        traffic = comm.traffic()  # this step's calls and bytes per direction
        totals = {d: {k: totals.get(d, {}).get(k, 0) + v for k, v in t.items()} for d, t in traffic.items()}
        if dist.get_rank() == 0:
            print(json.dumps({"step": step, "loss": round(float(loss), 5), **traffic}), flush=True)
    if dist.get_rank() == 0:
        print(json.dumps(totals), flush=True)
    fp4_megatron.disable()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
