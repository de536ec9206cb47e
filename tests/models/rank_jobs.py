"""Bodies of the multi-rank model tests (run by distributed.run_ranks)."""

from __future__ import annotations

import torch.distributed as dist

from fp4quant.models import ModelConfig, Qwen2ForCausalLM, load_state_dict
from fp4quant.parallel import CommConfig, TPCommunicator


def hf_logits(rank, world, cfg: dict, state, ids, sp=False, preset="exact"):
    """This rank's vocabulary slice of the logits of our model loaded from an HF state dict."""
    tp = TPCommunicator(dist.group.WORLD, CommConfig.from_preset(preset))
    model = Qwen2ForCausalLM(ModelConfig(**cfg), tp, sequence_parallel=sp)
    load_state_dict(model, state)
    model.eval()
    return model(ids).detach()
