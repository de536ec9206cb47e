"""A Hugging Face Qwen2 / Llama as the trainer's model (``--model hf:<config.json or folder>``).

The transformers model is built from the config (seeded: the same initial weights on every
rank; or loaded from the folder's safetensors when it holds any), then parallelized over
the TP process group with fp4quant's compressed styles (fp4quant.parallel.tp_plan): the
decoder's q/k/v/o and MLP projections become DTensor shards, embeddings, norms and the
head stay replicated.  Every style shares one TPCommunicator (``tp``), which the trainer
keys by the step and reads its statistics from.  The wrapper gives the trainer what it
needs of a model: ``loss``, ``replicated_parameters``, ``cfg``, ``sp``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from ..parallel.communicator import CommConfig, TPCommunicator
from .model_config import ModelConfig

PREFIX = "hf:"
MODEL_TYPES = ("qwen2", "llama")  # architectures whose base_model_tp_plan tp_plan covers


def is_hf(spec: str) -> bool:
    return spec.startswith(PREFIX)


def config_file(spec: str) -> Path:
    """The config.json of ``hf:<file or folder>``."""
    path = Path(spec.removeprefix(PREFIX))
    return path if path.is_file() else path / "config.json"


def read_config(spec: str, tp: int = 1) -> dict[str, Any]:
    """The config.json dict of ``hf:<path>``; ValueError (one line) for a missing or unreadable
    file, another architecture, or a TP size that does not divide the heads or the MLP."""
    path = config_file(spec)
    if not path.is_file():
        raise ValueError(f"--model {spec}: no config.json at {path}")
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model {spec}: {path} is not a readable JSON file ({type(exc).__name__})") from None
    if not isinstance(hf, dict) or hf.get("model_type") not in MODEL_TYPES:
        found = hf.get("model_type") if isinstance(hf, dict) else None
        raise ValueError(f"--model {spec}: model_type {found!r} is not one of {', '.join(MODEL_TYPES)}")
    try:
        model = ModelConfig.from_hf(hf)  # every field present and of its type
    except KeyError as exc:
        raise ValueError(f"--model {spec}: {path} lacks {exc.args[0]}") from None
    except ValueError as exc:
        raise ValueError(f"--model {spec}: {path}: {exc}") from None
    sizes = {"num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads,
             "intermediate_size": model.intermediate_size}
    for name, n in sizes.items():
        if n % tp:
            raise ValueError(f"--tp {tp} does not divide the model's {name} ({n})")
    return hf


class HFTensorParallel(nn.Module):
    """A transformers *ForCausalLM, tensor-parallel through fp4quant's compressed styles."""

    sp = False  # the plan keeps activations replicated between blocks (no sequence parallelism)

    def __init__(self, spec: str, group: dist.ProcessGroup | None, comm: CommConfig, seed: int,
                 device: torch.device):
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        hf = read_config(spec)
        self.cfg = ModelConfig.from_hf(hf)
        config = AutoConfig.for_model(**hf)
        folder = config_file(spec).parent
        if any(folder.glob("*.safetensors")) and config_file(spec).name == "config.json":
            model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32)
        else:
            with torch.random.fork_rng(devices=[]):  # the trainer's own RNG state is left as it was
                torch.manual_seed(seed)
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.model = model.to(device)
        if group is not None and dist.is_initialized():
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.tensor.parallel import parallelize_module

            from ..parallel.hf_plan import tp_plan
            from ..parallel.styles import communicators

            mesh = DeviceMesh.from_group(group, device.type)
            parallelize_module(self.model, mesh, tp_plan(self.model, comm=comm))
            found = communicators(self.model)
            if len(found) != 1:
                raise RuntimeError(f"the compressed styles use {len(found)} communicators, expected one")
            self.tp = found[0]
        else:  # one process: nothing to parallelize, nothing is sent
            self.tp = TPCommunicator(None, comm)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits

    def loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean token cross entropy; ``labels`` are the next tokens of ``ids`` (already shifted)."""
        logits = self(ids)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every TP rank holds whole: plain tensors and DTensors placed Replicate (a
        row-parallel bias): their gradients are counted once in the global norm, not per rank."""
        return [p for p in self.parameters() if not isinstance(p, DTensor) or all(pl.is_replicate() for pl in p.placements)]
