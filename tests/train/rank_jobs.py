"""Bodies of the multi-rank training tests (run by distributed.run_ranks)."""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import torch

from fp4quant import QuantConfig, comm
from fp4quant.comm import Wire, validate
from fp4quant.data import DataError
from fp4quant.parallel.communicator import Route
from fp4quant.train import ConfigError, TrainConfig, Trainer
from fp4quant.train.shards import local


def train(rank, world, **kwargs):
    """Run a short training; return rank 0's per-step losses and every rank's final parameters' checksum."""
    cfg = TrainConfig(**kwargs)
    trainer = Trainer(cfg)
    summary = trainer.run()
    losses = []
    if rank == 0:
        losses = [json.loads(line)["loss"] for line in Path(cfg.out, "log.jsonl").read_text().splitlines()]
    checksum = sum(float(local(p).detach().double().sum()) for p in trainer.model.parameters())
    return {"losses": losses, "summary": summary, "checksum": checksum, "mesh": (trainer.mesh.tp_rank, trainer.mesh.dp_rank)}


def step_records(rank, world, steps=2, **kwargs):
    """Every rank's records of ``steps`` training steps (Trainer.train_step, no log)."""
    trainer = Trainer(TrainConfig(**kwargs))
    trainer.model.train()
    return [trainer.train_step() for _ in range(steps)]


def step_records_and_spans(rank, world, steps=2, **kwargs):
    """step_records, with the spans of each step's collectives this rank timed (what the
    trainer's second fp4quant.comm.take_spans of a step returned) and its (tp, dp) ranks."""
    taken = []
    real = comm.take_spans

    def take():
        spans = real()
        taken.append(spans)
        return spans

    comm.take_spans = take
    try:
        trainer = Trainer(TrainConfig(**kwargs))
        trainer.model.train()
        records = [trainer.train_step() for _ in range(steps)]
    finally:
        comm.take_spans = real
    spans = [{k: [list(span) for span in v] for k, v in step.items()} for step in taken[1::2]]
    return records, spans, (trainer.mesh.tp_rank, trainer.mesh.dp_rank)


def start(rank, world, per_rank=None, **kwargs):
    """Build a Trainer from ``kwargs`` updated by ``per_rank[rank]``; the error's text, or None if it started."""
    try:
        Trainer(TrainConfig(**{**kwargs, **(per_rank or [{}] * world)[rank]}))
    except (ConfigError, DataError) as exc:
        return str(exc)
    return None


def misconfigured_rank(rank, world, **kwargs):
    """Rank 1 sends its forward traffic under another preset than rank 0, which no TrainConfig
    field shows (as a rank running other code would): the first step's validation must name it."""
    trainer = Trainer(TrainConfig(**kwargs))
    if rank == 1:  # the communicator's forward route, resolved when it was built, replaced
        route = trainer.tp.routes["fwd"]
        trainer.tp.routes["fwd"] = Route(*(dataclasses.replace(o, wire=Wire.of(QuantConfig.preset("no_fwht")))
                                           for o in (route.options, route.validating)))
    try:
        trainer.run()
    except ValueError as exc:
        return str(exc)
    return None


def validations(rank, world, **kwargs):
    """The steps during which cross-rank validations ran (one per collective), and rank 0's log."""
    trainer = Trainer(TrainConfig(**kwargs))
    steps = []
    exchange = validate.exchange

    def counted(*args):
        steps.append(trainer.step)
        return exchange(*args)

    validate.exchange = counted
    try:
        trainer.run()
    finally:
        validate.exchange = exchange
    log = [json.loads(line) for line in Path(kwargs["out"], "log.jsonl").read_text().splitlines()] if rank == 0 else []
    return {"steps": steps, "log": log}
