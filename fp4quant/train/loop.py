"""The training loop: tensor + data parallel Qwen2 with compressed TP communication.

One step: each DP rank reads its batch (a pure function of the step), runs forward and
backward (TP traffic through the TPCommunicator, compressed as configured), reduces
replicated-parameter gradients over TP under sequence parallelism, averages gradients
over DP (uncompressed), clips by the global norm, and takes an AdamW step with a
warmup + cosine learning rate.  Rank 0 appends one JSON line per step to log.jsonl and
keeps the lines in memory: each checkpoint stores them, so a resumed run restores its
whole history even when log.jsonl was deleted (as Snakemake does to an interrupted job's
outputs).  A non-finite loss or gradient norm stops the run before the optimizer step,
so the last checkpoint stays the last good state.  The first step this process runs
validates its collectives across ranks (fp4quant.comm's validate=True): a misconfigured
job fails in seconds instead of hanging.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import comm
from ..data import TokenDataset
from ..format.config import PRESETS, QuantConfig
from ..models import Qwen2ForCausalLM
from ..models.hf import load_safetensors
from ..models.hf_tp import HFTensorParallel, config_file, is_hf
from ..models.init import initialize
from ..parallel import CommConfig, ComputeConfig, LinearCompute, TPCommunicator, TrafficCapture
from ..provenance import atomic_write_json, atomic_write_text, provenance
from ..threads import pin_threads
from . import checkpoint
from .shards import load_local_state, local, local_tree, restore_optimizer_placements
from .train_config import ADAM_BETAS, ConfigError, TrainConfig, run_name
from .consistency import check_ranks_agree, resume_differences
from .ownership import RunLock
from .ranks import ProcessRanks, Ranks


# the seed of the validation batches' order, whatever the run's seed: every run of a comparison
# is validated on the same tokens
VALIDATION_SEED = 0


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became non-finite; the run stopped before applying it."""


def _one_host(ranks: Ranks) -> bool:
    """Whether every rank runs under this kernel, whose monotonic clock they then share (the
    boot's id where Linux has one, else the host's name; one all_gather_object)."""
    if ranks.world == 1:
        return True
    try:
        me = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        me = socket.gethostname()
    return len(set(ranks.all_gather_object(me))) == 1


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two provenances name different code, versions or hardware (not just another time)."""
    return any(a.get(k) != b.get(k) for k in ("commit", "code", "torch", "cuda", "hardware", "host"))


class Trainer:
    """One rank's training: ``ranks`` torch.distributed's (the default) or a simulated rank's
    (fp4quant.train.simulate)."""

    def __init__(self, cfg: TrainConfig, data: TokenDataset | None = None, ranks: Ranks | None = None):
        self.cfg = cfg
        self.ranks = ranks if ranks is not None else ProcessRanks()
        if not self.ranks.simulated:  # a simulated rank's threads are set by its driver
            pin_threads()
        self.out = Path(cfg.out)
        self.device = torch.device("cuda" if not self.ranks.simulated and (
            cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())) else "cpu")
        if self.device.type == "cuda":  # before any collective: NCCL's object collectives use the current device
            # more ranks than GPUs share them (gloo; NCCL refuses two ranks on one GPU by itself)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        check_ranks_agree(cfg, {"device_type": self.device.type}, self.ranks)  # before any other collective
        self.mesh = self.ranks.mesh(cfg.tp)
        # the ranks share perf_counter's clock, and the collectives' times are theirs (not kernel
        # launches): the link's time (comm_link_s) is logged.  Simulated ranks have no link.
        self.link_timed = (not self.ranks.simulated and _one_host(self.ranks)
                           and (self.device.type == "cpu" or cfg.sync_timing))
        self.is_logger = self.mesh.rank == 0
        self.comm_config = CommConfig.from_preset(cfg.comm, cfg.compress, cfg.stochastic_backward,
                                                  algorithm=cfg.algorithm, seed=cfg.seed,
                                                  validate=cfg.validate_every_step, sync_timing=cfg.sync_timing,
                                                  rounding_alone=cfg.rounding_alone)
        self.capture = None
        if cfg.capture_steps and self.mesh.dp_rank == 0:  # the DP replicas send the same kind of traffic
            meta = {"model": cfg.model, "model_config": cfg.model_config().to_dict(), "tp": cfg.tp,
                    "sequence_parallel": cfg.sequence_parallel, "comm": cfg.comm, "compress": cfg.compress,
                    "steps": list(cfg.capture_steps), "provenance": provenance(self.device, config=cfg.to_dict())}
            self.capture = TrafficCapture(cfg.capture_folder, cfg.capture_steps, rank=self.mesh.tp_rank, meta=meta)
        self.compute = LinearCompute(ComputeConfig(cfg.compute, cfg.seed), rank=self.mesh.tp_rank)
        self.data = data if data is not None else TokenDataset(cfg.data)
        self.model = self._build_model()
        self.tp = self.model.tp  # the one communicator of the model's TP traffic: keyed by the step, its stats logged
        self.scalar_allreduce_s = 0.0  # seconds in this loop's own uncompressed all-reduces (_all_reduce_scalar)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=ADAM_BETAS, eps=1e-8,
        )
        self.replicated = {id(p) for p in self.model.replicated_parameters()}
        self.step = 0
        self.tokens_per_step = self.mesh.dp * cfg.batch_size * cfg.seq_len
        self.history: list[str] = []  # rank 0: the log lines of steps 0 .. step-1
        self.schedule = [{"from_step": 0, "steps": cfg.steps}]  # the --steps each part of the run decayed over
        # what ran each part of the run (a resume under other code, torch or hardware starts a part):
        # the summary's provenance is the first part's, taken when the run started
        self.segments = [{"from_step": 0, "provenance": provenance(self.device)}]
        self.last_checkpoint: int | None = None
        self.validate_next_step = True
        self.label = run_name(cfg.comm if self.mesh.tp > 1 else "exact", cfg.compress if self.mesh.tp > 1 else "both",
                              cfg.compute)
        if cfg.rounding_alone:
            self.label = run_name(cfg.comm, "both", cfg.compute).replace(cfg.comm, f"{cfg.comm}-alone", 1)

    # ---- setup -------------------------------------------------------------------------

    def _build_model(self) -> Qwen2ForCausalLM | HFTensorParallel:
        cfg = self.cfg
        if is_hf(cfg.model):  # TrainConfig refused quartet compute, sequence parallelism, activation checkpointing
            return HFTensorParallel(cfg.model, self.mesh.tp_group, self.comm_config, cfg.seed, self.device)
        model = Qwen2ForCausalLM(cfg.model_config(), TPCommunicator(self.mesh.tp_group, self.comm_config,
                                                                    capture=self.capture),
                                 cfg.sequence_parallel, cfg.activation_checkpointing)
        # every linear layer of the blocks; the LM head stays exact, as in Quartet
        self.compute.attach(model.model)
        if Path(cfg.model, "config.json").exists():
            load_safetensors(model, cfg.model)
        else:
            initialize(model, cfg.seed)
        return model.to(self.device)

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": local_tree(self.model.state_dict()),  # this rank's shards, DTensor or not
            "optimizer": local_tree(self.optimizer.state_dict()),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
            "config": self.cfg.to_dict(),
            "mesh": {"world": self.mesh.world, "tp": self.mesh.tp, "dp": self.mesh.dp},
        }

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint records besides the configuration, and a resume must match."""
        identity = {"mesh": {"world": self.mesh.world, "tp": self.mesh.tp, "dp": self.mesh.dp,
                             "device": self.device.type},
                    "data_sha256": self.data.meta.get("tokens_sha256")}
        if is_hf(self.cfg.model):  # the path alone does not say which model it held
            identity["model_config_sha256"] = hashlib.sha256(config_file(self.cfg.model).read_bytes()).hexdigest()
        return identity

    def _resume_problems(self, manifest: dict[str, Any]) -> list[str]:
        problems = resume_differences(manifest["config"], self.cfg)
        for key, now in self._identity().items():
            if manifest.get(key) != now:
                problems.append(f"{key}: {manifest.get(key)!r} in the checkpoint, {now!r} now")
        return problems

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint in ``out``, if there is one, restoring
        log.jsonl to the history it stores.  A checkpoint of another configuration, or a
        folder of checkpoints none of which is intact, is a CheckpointError."""
        found = checkpoint.resume(self.out, self.ranks, self._resume_problems)
        if found is None:
            return False
        step, state = found.step, found.state
        if found.warning and self.is_logger:
            checkpoint.warn(found.warning)
        load_local_state(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        restore_optimizer_placements(self.optimizer)
        torch.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng_cuda"])
        self.step = self.last_checkpoint = step
        self.schedule = found.manifest["schedule"]
        now = {"from_step": step, "provenance": self.segments[0]["provenance"]}
        # a checkpoint of before segments were kept records the provenance of its last save only
        self.segments = found.manifest.get("segments") or [{"from_step": None, "provenance": found.manifest["provenance"]}]
        if _differs(self.segments[-1]["provenance"], now["provenance"]):
            self.segments.append(now)
        if self.schedule[-1]["steps"] != self.cfg.steps:  # extended (resume_differences allows only more steps)
            self.schedule = [*self.schedule, {"from_step": step, "steps": self.cfg.steps}]
        if self.is_logger:
            self.history = found.log.splitlines()
        return True

    # ---- one step ----------------------------------------------------------------------

    def _reduce_gradients(self) -> float:
        """TP reduction of replicated gradients (SP), DP averaging, and the global grad norm, on
        this rank's shards (a DTensor gradient's local part)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = {id(p): local(p.grad) for p in params}
        if self.model.sp:
            self._all_reduce_flat([grads[id(p)] for p in params if id(p) in self.replicated], self.mesh.tp_group, 1.0,
                                  ordered=True)
        if self.mesh.dp > 1:
            self._all_reduce_flat(list(grads.values()), self.mesh.dp_group, 1.0 / self.mesh.dp)
        sharded_sq = sum(float(grads[id(p)].float().pow(2).sum()) for p in params if id(p) not in self.replicated)
        replicated_sq = sum(float(grads[id(p)].float().pow(2).sum()) for p in params if id(p) in self.replicated)
        if self.mesh.tp > 1:
            t = torch.tensor([sharded_sq], dtype=torch.float64, device=self.device)
            t0 = time.perf_counter()
            self.ranks.ordered_sum(t, self.mesh.tp_group)
            self.scalar_allreduce_s += time.perf_counter() - t0
            sharded_sq = float(t)
        norm = math.sqrt(sharded_sq + replicated_sq)
        if norm > self.cfg.clip:
            for g in grads.values():
                g.mul_(self.cfg.clip / (norm + 1e-6))
        return norm

    def _all_reduce_scalar(self, t: torch.Tensor, group=None, op: str = "sum") -> None:
        """The all-reduce of a step's small uncompressed reduction, timed: with the model's
        all_reduce_exact (counted under the stats key "exact"), the record's scalar_comm_s (a
        wait for a slower peer included)."""
        t0 = time.perf_counter()
        self.ranks.all_reduce(t, group=group, op=op)
        self.scalar_allreduce_s += time.perf_counter() - t0

    def _all_reduce_flat(self, grads: list[torch.Tensor], group, scale: float, ordered: bool = False) -> None:
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if ordered:  # a TP sum: in rank order (Ranks.ordered_sum)
            self.ranks.ordered_sum(flat, group)
        else:
            self.ranks.all_reduce(flat, group=group)
        if scale != 1.0:
            flat.mul_(scale)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _forward_loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return self.model.loss(ids, labels)
        return self.model.loss(ids, labels)

    def train_step(self) -> dict[str, Any]:
        cfg = self.cfg
        lr = lr_at(cfg, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # stochastic rounding streams depend on the step only: a resumed run replays them
        self.tp.start_step(self.step, validate=self.validate_next_step)
        self.compute.start_step(self.step)
        self.validate_next_step = False
        before = comm.stats()
        comm.take_spans()  # the step's own spans from here on
        scalar_before = self.scalar_allreduce_s
        self._sync()
        t0 = time.perf_counter()
        ids, labels = self.data.batch(self.step, self.mesh.dp_rank, self.mesh.dp, cfg.batch_size, cfg.seq_len, cfg.seed)
        loss = self._forward_loss(ids.to(self.device), labels.to(self.device))
        loss.backward()
        if self.capture is not None:  # every TP collective of the step is done
            self.capture.save()
        grad_norm = self._reduce_gradients()
        loss_value = loss.detach().float()
        if self.mesh.dp > 1:  # the logged loss is the mean over DP ranks
            self._all_reduce_scalar(loss_value, group=self.mesh.dp_group)
            loss_value /= self.mesh.dp
        # every TP collective of the step is done (the optimizer step issues none): the step's
        # counters per direction
        after = comm.stats()
        spans = comm.take_spans()
        counted = {}
        for direction, route in self.tp.routes.items():
            a, b = after.get(route.stats_key, {}), before.get(route.stats_key, {})
            for key in ("bytes_sent", "bytes_uncompressed", "codec_s", "quantize_s", "dequantize_s", "comm_s", "calls"):
                counted[f"{direction}_{key}"] = a.get(key, 0) - b.get(key, 0)
        comm_least_s, comm_link_s = self._stop_if_not_finite(
            float(loss_value), grad_norm, {d: counted[f"{d}_comm_s"] for d in self.tp.routes},
            {d: spans.get(route.stats_key, []) for d, route in self.tp.routes.items()} if self.link_timed else None)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        step_time = time.perf_counter() - t0
        record = {"step": self.step, "loss": float(loss_value), "lr": lr, "grad_norm": grad_norm,
                  "step_time_s": step_time, "tokens_per_s": self.tokens_per_step / step_time,
                  "scalar_comm_s": self.scalar_allreduce_s - scalar_before + after.get("exact", {}).get("comm_s", 0.0)
                  - before.get("exact", {}).get("comm_s", 0.0), **counted}
        for direction in self.tp.routes:
            record[f"{direction}_comm_least_s"] = comm_least_s[direction]
            if comm_link_s is not None:
                record[f"{direction}_comm_link_s"] = comm_link_s[direction]
        self.step += 1
        return record

    def _stop_if_not_finite(self, loss: float, grad_norm: float, comm_s: dict[str, float],
                            spans: dict[str, list[tuple[float, float]]] | None = None
                            ) -> tuple[dict[str, float], dict[str, float] | None]:
        """Raise TrainingDiverged on every rank when any rank's loss or gradient norm is not finite.

        Returns, per direction, from the same all-reduce (no collective of its own):

        - the least over the ranks of ``comm_s`` (this rank's seconds in the step's
          collectives): a rank's timers count its waits for a slower peer as communication,
          and the rank that arrives last at the collectives waits least, so the least is the
          closer measure of the link's time; where the ranks take turns being last, each
          turn's wait stays in every rank's sum.  The least is over the world: with DP
          replicas, over every replica's TP ranks (the same work).
        - with ``spans`` (this rank's timed parts of the step's collectives, per direction,
          as (start, end) on the host's clock: fp4quant.comm.take_spans), the link's time
          (_link_seconds); None without.  Every rank must time the same number of parts:
          the TP collectives are issued alike everywhere (else they would not match)."""
        flags = [0.0 if math.isfinite(loss) and math.isfinite(grad_norm) else 1.0] + [-s for s in comm_s.values()]
        parts = [part for direction in comm_s for part in (spans or {}).get(direction, [])]
        reduced = torch.tensor(flags + self._replica_timeline(parts), dtype=torch.float64, device=self.device)
        if self.mesh.world > 1:  # every rank stops together, none waits in a collective
            self._all_reduce_scalar(reduced, op="max")
        values = reduced.tolist()
        least = dict(zip(comm_s, (-v for v in values[1 : 1 + len(comm_s)])))
        link = None
        if spans is not None:
            slot = 1 + len(comm_s) + 2 * self.mesh.dp_rank * len(parts)
            link = self._link_seconds(values[slot : slot + 2 * len(parts)],
                                      {d: len(spans.get(d, [])) for d in comm_s})
        if values[0]:
            kept = f"step {self.last_checkpoint}" if self.last_checkpoint is not None else "none"
            raise TrainingDiverged(f"step {self.step}: loss {loss}, gradient norm {grad_norm} (not finite on this rank "
                                   f"or another): stopped before applying the step; last checkpoint: {kept} "
                                   f"in {self.out / 'checkpoints'}")
        return least, link

    def _replica_timeline(self, parts: list[tuple[float, float]]) -> list[float]:
        """Every DP replica's slot of 2 x len(parts) zeros, this rank's replica's holding each
        part's start and end: a MAX over the world's ranks then leaves each replica's latest
        start and end of every part (the clock's readings are > 0)."""
        timeline = [0.0] * (2 * len(parts) * self.mesh.dp)
        first = 2 * self.mesh.dp_rank * len(parts)
        for i, (start, end) in enumerate(parts):
            timeline[first + 2 * i], timeline[first + 2 * i + 1] = start, end
        return timeline

    @staticmethod
    def _link_seconds(replica_timeline: list[float], counts: dict[str, int]) -> dict[str, float]:
        """Per direction (``counts``: its parts, in order), the link's time in the step's
        collectives: summed over its parts, the last rank's leaving less the last rank's
        arrival (0 where the last to leave left before the last arrived), over one DP
        replica's ranks (``replica_timeline``: its latest start and end of each part).  Each
        part's lies between the last arriver's own time in it and the last leaver's: no rank
        waits in it for a slower peer to arrive, whichever is last."""
        link, k = {}, 0
        for direction, n in counts.items():
            link[direction] = sum(max(0.0, replica_timeline[2 * i + 1] - replica_timeline[2 * i])
                                  for i in range(k, k + n))
            k += n
        return link

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ---- evaluation, the run ---------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> list[float] | None:
        """The validation loss of each of the eval_batches batches (mean over DP ranks).  The
        batches are the same for every seed (VALIDATION_SEED): runs are compared on the same tokens."""
        if self.cfg.eval_batches == 0 or self.data.windows(self.cfg.seq_len, "val") == 0:
            return None
        self.model.eval()
        losses = []
        for i in range(self.cfg.eval_batches):
            ids, labels = self.data.batch(i, self.mesh.dp_rank, self.mesh.dp, self.cfg.batch_size, self.cfg.seq_len,
                                          VALIDATION_SEED, split="val")
            losses.append(float(self._forward_loss(ids.to(self.device), labels.to(self.device))))
        self.model.train()
        t = torch.tensor(losses, dtype=torch.float64, device=self.device)
        if self.mesh.dp > 1:
            self.ranks.all_reduce(t, group=self.mesh.dp_group)
        return (t / self.mesh.dp).tolist()

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        lock = RunLock(self.out)
        problem = lock.acquire() if self.mesh.rank == 0 else None
        # every rank learns rank 0's outcome before touching the folder
        problem = self.ranks.broadcast_object(problem, src=0)
        if problem is not None:
            raise ConfigError(problem)
        try:
            return self._run()
        finally:
            lock.release()

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        resumed_from = self.step if self.resume() else None
        if self.mesh.tp == 1 and cfg.comm in PRESETS and QuantConfig.preset(cfg.comm).compressed and self.is_logger:
            checkpoint.warn(f"--tp 1 sends no TP traffic, so --comm {cfg.comm} changes nothing: the run is labelled "
                            f"{self.label}")
        log = None
        if self.is_logger:  # the log holds exactly the steps behind the model: restored, or started afresh
            atomic_write_text(self.out / "log.jsonl", "".join(line + "\n" for line in self.history))
            log = (self.out / "log.jsonl").open("a")
        if self.is_logger and self.compute.config.quantized:
            print(f"fp4quant.train: {self.compute.config.describe(self.device)}", file=sys.stderr)
        label = cfg.comm if not self.compute.config.quantized else f"{cfg.comm}, compute {cfg.compute}"
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {label}", unit="step", file=sys.stderr,
                   disable=not self.is_logger)
        self.model.train()
        try:
            while self.step < cfg.steps:
                record = self.train_step()
                if log:
                    self.history.append(json.dumps(record))
                    log.write(self.history[-1] + "\n")
                    log.flush()
                    bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                bar.update()
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self._save()
        finally:  # before an error is reported: the bar's last line comes first
            bar.close()
            if log:
                log.close()
        summary = self.summary(self.evaluate(), resumed_from)
        if self.is_logger:
            atomic_write_json(self.out / "summary.json", summary)
        return summary

    def _save(self) -> None:
        meta = {"config": self.cfg.to_dict(), **self._identity(), "schedule": self.schedule,
                "provenance": provenance(self.device), "segments": self.segments}
        checkpoint.save(self.out, self.step, self.ranks, self._state(), self.cfg.keep_checkpoints,
                        "".join(line + "\n" for line in self.history) if self.is_logger else None, meta)
        self.last_checkpoint = self.step

    def summary(self, val_losses: list[float] | None, resumed_from: int | None) -> dict[str, Any]:
        records = [json.loads(line) for line in self.history]
        steady = records[len(records) // 10 :] or records  # leave out the first tenth (warm-up of caches)
        tail = records[-10:]

        def total(key):
            return sum(r[key] for r in records)

        return {
            "provenance": {**self.segments[0]["provenance"], "config": self.cfg.to_dict()},
            "segments": self.segments,
            "mesh": {"world": self.mesh.world, "tp": self.mesh.tp, "dp": self.mesh.dp,
                     "backend": self.ranks.backend, "device": self.device.type},
            "model": self.model.cfg.to_dict(),
            # what the TP wire carried, and the name the run is compared under: at TP = 1 nothing
            # crosses it, so a compressed --comm compresses nothing and the run is exact's
            "comm": {"fwd": str(self.comm_config.fwd) if self.tp.sends else "nothing sent (TP = 1)",
                     "bwd": str(self.comm_config.bwd) if self.tp.sends else "nothing sent (TP = 1)",
                     "rounding_alone": self.cfg.rounding_alone,
                     "label": self.label, "algorithm": self.cfg.algorithm,
                     "hooks": comm.hooks.describe()},  # what shaped the collectives' time (the emulated cluster's)
            **{k: v for k, v in self._identity().items() if k != "mesh"},  # the data's (and an hf: model's) checksum
            "steps": self.step,
            "resumed_from": resumed_from,
            "lr_schedule": self.schedule,
            "final_loss": sum(r["loss"] for r in tail) / len(tail) if tail else None,
            "val_loss": sum(val_losses) / len(val_losses) if val_losses else None,
            "val_batch_losses": val_losses,  # for the standard error of val_loss (fp4quant.analysis.study)
            "tokens_per_s": self.tokens_per_step * len(steady) / sum(r["step_time_s"] for r in steady) if steady else None,
            "step_time_s": sum(r["step_time_s"] for r in steady) / len(steady) if steady else None,
            "fwd_bytes_sent": total("fwd_bytes_sent") if records else 0,
            "bwd_bytes_sent": total("bwd_bytes_sent") if records else 0,
            "bytes_uncompressed": (total("fwd_bytes_uncompressed") + total("bwd_bytes_uncompressed")) if records else 0,
        }
