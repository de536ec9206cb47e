"""Train a tensor-parallel Qwen2 with compressed TP communication.  Always under torchrun:

    torchrun --nproc-per-node 2 -m fp4quant.train --model tiny --tp 2 --comm fp4quant --steps 300 --out data/runs/NAME
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m fp4quant.train --model qwen-7b --tp 16 ...

Writes NAME/log.jsonl (one line per step, rank 0), NAME/checkpoints/ (resumed from
automatically), NAME/summary.json (provenance and headline figures).  A bad
configuration fails on every rank with one line, before any process group is created.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from .config import ConfigError, TrainConfig, world_from_env

BOOLEAN = {"stochastic_backward", "sequence_parallel", "activation_checkpointing"}


def parse(argv=None) -> TrainConfig:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in BOOLEAN:
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.name == "out":
            ap.add_argument(flag, required=True, help="run folder (log.jsonl, checkpoints/, summary.json)")
        else:
            ap.add_argument(flag, type=int if f.default is None else type(f.default), default=f.default)
    args = ap.parse_args(argv)
    return TrainConfig(**vars(args))


def main(argv=None) -> int:
    try:
        cfg = parse(argv)
        meta = json.loads(Path(cfg.data, "meta.json").read_text()) if Path(cfg.data, "meta.json").exists() else {}
        cfg.check_world(world_from_env(), meta.get("vocab_size"))
    except ConfigError as exc:
        print(f"fp4quant.train: error: {exc}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    from .loop import Trainer

    if "RANK" in os.environ:
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        dist.init_process_group(cfg.backend if cfg.backend != "auto" else "nccl" if use_cuda else "gloo")
    try:
        summary = Trainer(cfg).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if summary.get("final_loss") is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {summary['final_loss']:.4f}, {summary['tokens_per_s']:.0f} tokens/s -> {cfg.out}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
