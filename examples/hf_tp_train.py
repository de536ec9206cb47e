"""Train a small Hugging Face Qwen2 with FP4-compressed tensor parallelism in both directions.

    torchrun --standalone --nproc-per-node 2 examples/hf_tp_train.py --steps 30 --comm fp4quant

The model is built from a config (no download); the plan is the model's own
``base_model_tp_plan`` with fp4quant's compressed styles (fp4quant.parallel.tp_plan).  Each
step keys the stochastic-rounding streams by the step (``start_step``).  Rank 0 prints one
JSON line per step and, last, the bytes each direction sent against its uncompressed size.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from transformers import Qwen2Config, Qwen2ForCausalLM

from fp4quant import comm
from fp4quant.parallel import start_step, tp_plan


def batch(step: int, batch_size: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Arithmetic sequences of tokens (a learnable pattern), the same on every TP rank."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--comm", default="fp4quant", help="a preset (fp4quant, nvfp4, bf16, ...) or exact")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    config = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = Qwen2ForCausalLM(config)
    parallelize_module(model, mesh, tp_plan(model, comm=args.comm))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        start_step(model, step)
        ids = batch(step, args.batch_size, args.seq_len, config.vocab_size)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(json.dumps({"step": step, "loss": round(float(loss), 5)}), flush=True)
    if dist.get_rank() == 0:
        print(json.dumps(comm.traffic()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
