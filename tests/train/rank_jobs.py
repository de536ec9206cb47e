"""Bodies of the multi-rank training tests (run by distributed.run_ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fp4quant.train import TrainConfig, Trainer


def train(rank, world, **kwargs):
    """Run a short training; return rank 0's per-step losses and every rank's final parameters' checksum."""
    cfg = TrainConfig(**kwargs)
    trainer = Trainer(cfg)
    summary = trainer.run()
    losses = []
    if rank == 0:
        losses = [json.loads(line)["loss"] for line in Path(cfg.out, "log.jsonl").read_text().splitlines()]
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    return {"losses": losses, "summary": summary, "checksum": checksum, "mesh": (trainer.mesh.tp_rank, trainer.mesh.dp_rank)}
