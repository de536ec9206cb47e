"""TrainConfig: every option of a training run, validated before any process group exists."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..comm import ALGORITHMS
from ..data import DEFAULT_FOLDER
from ..format.config import PRESETS, QuantConfig
from ..models.model_config import MODEL_PRESETS, ModelConfig
from ..models.hf_tp import is_hf, read_config
from ..parallel.communicator import COMPRESS_CHOICES
from ..parallel.compute import COMPUTE_KINDS


# AdamW's betas (the loop's); its first step moves a parameter by up to lr / (1 - beta1)
ADAM_BETAS = (0.9, 0.95)
ADAM_STEP_GAIN = 1 / (1 - ADAM_BETAS[0])
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(ValueError):
    """A bad training configuration, reported in one line before anything starts."""


@dataclass(frozen=True)
class TrainConfig:
    out: str
    model: str = "tiny"  # a preset name, a Hugging Face folder to start from, or hf:<config.json or folder> (transformers)
    tp: int = 1
    comm: str = "bf16"  # TP traffic: a QuantConfig preset (bf16: BF16 on the wire), or "exact" (own dtype)
    compress: str = "both"  # which directions use it: none, fwd, bwd, both
    algorithm: str = "two_shot"
    stochastic_backward: bool = True
    compute: str = "exact"  # the linear layers' GEMMs: exact, or quartet (FP4 pseudo-quantized, fp4quant.parallel.compute)
    sequence_parallel: bool = False
    steps: int = 300
    seq_len: int = 256
    batch_size: int = 4  # sequences per data-parallel rank per step
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int | None = None  # steps of linear warmup; default: a tenth of the steps
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    data: str = DEFAULT_FOLDER  # prepared on first use when it is the default and missing
    activation_checkpointing: bool = False
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    eval_batches: int = 8
    device: str = "auto"  # auto (CUDA when available), cpu, cuda
    validate_every_step: bool = False  # validate every collective across ranks (the first step always is)
    sync_timing: bool = False  # on CUDA, synchronize around timed codec/comm steps: the log's times are GPU durations
    backend: str = "auto"  # process group: auto (nccl on CUDA, else gloo), nccl, gloo (several ranks on one GPU)
    # steps (comma-separated, e.g. "1,30,59") whose TP traffic is saved to <out>/traffic/ (fp4quant.parallel.capture)
    capture_traffic_steps: str = ""
    # the --tp ranks as threads of this process (no torchrun): the real ranks' numerics (fp4quant.train.simulate)
    simulate_tp: bool = False
    # at --tp 1, round what each TP all-reduce would carry as --comm bf16's wire does, sending nothing:
    # the wire's rounding without communication (a control; the run is labelled "<comm>-alone")
    rounding_alone: bool = False

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(bool(self.out.strip()), "--out must name a run folder, got an empty string")
        for name in ("lr", "min_lr_ratio", "weight_decay", "clip"):
            need(math.isfinite(getattr(self, name)), f"--{name.replace('_', '-')} must be finite, got {getattr(self, name)}")
        need(self.comm in PRESETS or self.comm == "exact",
             f"--comm must be a preset ({', '.join(PRESETS)}) or exact, got {self.comm!r}")
        need(self.compute in COMPUTE_KINDS, f"--compute must be one of {COMPUTE_KINDS}, got {self.compute!r}")
        need(self.compress in COMPRESS_CHOICES, f"--compress must be one of {COMPRESS_CHOICES}, got {self.compress!r}")
        need(self.algorithm in ALGORITHMS, f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        need(self.device in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {self.device!r}")
        need(self.backend in ("auto", "nccl", "gloo"), f"--backend must be auto, nccl or gloo, got {self.backend!r}")
        need(not (self.backend == "nccl" and self.device == "cpu"), "--backend nccl needs --device cuda (or auto)")
        for name in ("tp", "steps", "seq_len", "batch_size", "checkpoint_every", "keep_checkpoints"):
            need(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        need(0 < self.lr * ADAM_STEP_GAIN < FLOAT32_MAX,
             f"--lr must be > 0 and below {FLOAT32_MAX / ADAM_STEP_GAIN:.3g} (AdamW's first step, lr / (1 - beta1), "
             f"must be a float32), got {self.lr}")
        need(0 <= self.seed < 2**64, f"--seed must be an integer in [0, 2**64), got {self.seed}")
        need(0 <= self.min_lr_ratio <= 1, f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup is None:
            object.__setattr__(self, "warmup", self.steps // 10)
        need(0 <= self.warmup <= self.steps, f"--warmup must be in [0, steps={self.steps}], got {self.warmup}")
        need(self.weight_decay >= 0 and self.clip > 0, "--weight-decay must be >= 0 and --clip > 0")
        need(self.eval_batches >= 0, f"--eval-batches must be >= 0, got {self.eval_batches}")
        try:
            steps = self.capture_steps
        except ValueError:
            raise ConfigError("--capture-traffic-steps must be comma-separated step numbers, "
                              f"got {self.capture_traffic_steps!r}") from None
        need(all(0 <= s < self.steps for s in steps),
             f"--capture-traffic-steps must lie in [0, steps={self.steps}), got {self.capture_traffic_steps!r}")
        need(not (steps and self.activation_checkpointing),
             "--capture-traffic-steps needs --no-activation-checkpointing (recomputed forwards would be captured twice)")
        if self.simulate_tp:
            need(self.tp >= 2, f"--simulate-tp needs --tp >= 2 (ranks to simulate), got --tp {self.tp}")
            need(self.device != "cuda", "--simulate-tp runs its ranks on the CPU: use --device cpu (or auto)")
            need(not is_hf(self.model), "--simulate-tp is not supported with --model hf:... (the transformers "
                                        "model's layers are sharded through DTensor, which needs a process group)")
        if self.rounding_alone:
            need(self.tp == 1 and self.comm == "bf16" and not self.sequence_parallel and not is_hf(self.model),
                 "--rounding-alone is a TP = 1 control of --comm bf16's rounding: it needs --tp 1, --comm bf16, no "
                 "--sequence-parallel and a preset or Qwen2 folder model")
        if is_hf(self.model):
            self.model_config()  # the file, its architecture, the TP size
            for flag, on in (("--compute quartet", self.compute != "exact"), ("--sequence-parallel", self.sequence_parallel),
                             ("--activation-checkpointing", self.activation_checkpointing),
                             ("--capture-traffic-steps", bool(steps))):
                need(not on, f"{flag} is not supported with --model hf:... (the transformers model through the styles)")
        else:
            need(self.model in MODEL_PRESETS or Path(self.model, "config.json").exists(),
                 f"--model must be a preset ({', '.join(MODEL_PRESETS)}), a Hugging Face folder or hf:<config.json "
                 f"or folder>, got {self.model!r}")
            need(self.model in MODEL_PRESETS or any(Path(self.model).glob("*.safetensors")),
                 f"--model {self.model}: no *.safetensors in the folder to start from (for a model initialized from "
                 f"its config, give hf:{Path(self.model, 'config.json')})")

    @property
    def capture_steps(self) -> tuple[int, ...]:
        """The steps whose TP traffic is captured (ValueError for a malformed list)."""
        return tuple(sorted({int(s) for s in self.capture_traffic_steps.split(",") if s.strip()}))

    @property
    def capture_folder(self) -> Path:
        return Path(self.out) / "traffic"

    def model_config(self) -> ModelConfig:
        if self.model in MODEL_PRESETS:
            return ModelConfig.preset(self.model)
        try:
            if is_hf(self.model):
                return ModelConfig.from_hf(read_config(self.model, self.tp))
            import json

            return ModelConfig.from_hf(json.loads(Path(self.model, "config.json").read_text()))
        except (ValueError, KeyError) as exc:  # KeyError: a config.json without a field the architecture needs
            raise ConfigError(f"--model {self.model}: {exc}" if isinstance(exc, KeyError) else str(exc)) from None

    def check_world(self, world: int, vocab_size: int | None = None) -> None:
        """Everything that can be checked before a process group exists."""
        if self.simulate_tp and world > 1:
            raise ConfigError(f"--simulate-tp runs its {self.tp} ranks in one process: launch it without torchrun "
                              f"(WORLD_SIZE is {world})")
        if world % self.tp and not self.simulate_tp:
            raise ConfigError(f"world size {world} is not divisible by --tp {self.tp}")
        cfg = self.model_config()  # an hf: model's TP fit is checked there (its embeddings and head are not sharded)
        try:
            if not is_hf(self.model):
                cfg.check_tp(self.tp)
        except ValueError as exc:
            raise ConfigError(f"--tp {self.tp} does not fit --model {self.model}: {exc}") from None
        if self.seq_len > cfg.max_position:
            raise ConfigError(f"--seq-len {self.seq_len} exceeds the model's max_position {cfg.max_position}")
        if self.sequence_parallel and self.seq_len % self.tp:
            raise ConfigError(f"--sequence-parallel needs --seq-len ({self.seq_len}) divisible by --tp ({self.tp})")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("--device cuda, but torch sees no CUDA GPU (use --device auto or cpu)")
        meta = Path(self.data, "meta.json")
        if not meta.exists():
            raise ConfigError(f"no prepared data at {self.data} (run `python -m fp4quant.data prepare --out {self.data}`)")
        if vocab_size is not None and vocab_size > cfg.vocab_size:
            raise ConfigError(f"the data's vocabulary ({vocab_size}) is larger than the model's ({cfg.vocab_size})")

    def check_out(self) -> None:
        """--out (and its checkpoints/, if there) can be created and written: checked first, a
        run must not fail at its first checkpoint."""
        for folder in (Path(self.out), Path(self.out, "checkpoints")):
            if folder.name == "checkpoints" and not folder.exists():
                continue
            try:
                folder.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
                    pass
            except OSError as exc:
                raise ConfigError(f"--out {self.out}: {folder} is not a writable folder ({exc.strerror or exc})") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def directional(comm: str, compress: str) -> bool:
    """Whether ``compress`` changes what ``comm`` sends: only a compressed preset has directions
    to leave out (exact and bf16 send the same whatever it says)."""
    return comm in PRESETS and QuantConfig.preset(comm).compressed and compress != "both"


def run_name(comm: str, compress: str = "both", compute: str = "exact") -> str:
    """What a run is compared as: ``<comm>[@<compress>][+<compute>]``, e.g. fp4quant@fwd (the
    fp4quant codec forward only, BF16 backward), fp4quant+quartet; the inverse of parse_run_name."""
    return comm + (f"@{compress}" if directional(comm, compress) else "") + (f"+{compute}" if compute != "exact" else "")


def parse_run_name(name: str) -> tuple[str, str, str]:
    """(comm, compress, compute) of a run name (see run_name); ConfigError naming what is wrong."""
    rest, _, compute = name.partition("+")
    comm, at, compress = rest.partition("@")
    compute = compute or "exact"
    compress = compress if at else "both"
    if comm not in PRESETS and comm != "exact":
        raise ConfigError(f"{name!r}: {comm!r} is not a TP communication preset ({', '.join(PRESETS)}) or exact")
    if compress not in COMPRESS_CHOICES:
        raise ConfigError(f"{name!r}: @{compress} must name a direction: @{', @'.join(COMPRESS_CHOICES)}")
    if at and not directional(comm, compress):
        raise ConfigError(f"{name!r}: @{compress} changes nothing for {comm} (only a compressed preset has "
                          "directions to leave out, and @both is the default)")
    if compute not in COMPUTE_KINDS:
        raise ConfigError(f"{name!r}: +{compute} must be a compute ({', '.join(COMPUTE_KINDS)})")
    return comm, compress, compute


def world_from_env() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside torchrun).  A WORLD_SIZE above 1 without
    RANK is not a torchrun worker: refuse rather than train alone as if on one rank."""
    raw = os.environ.get("WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"WORLD_SIZE must be a positive integer, got {raw!r}")
    if int(raw) > 1 and "RANK" not in os.environ:
        raise ConfigError(f"WORLD_SIZE={raw} but RANK is not set: launch with torchrun (or unset WORLD_SIZE)")
    return int(raw)
