"""Models on the tensor-parallel layers: the Qwen2 architecture, its presets, HF checkpoint loading."""

from .model_config import MODEL_PRESETS, ModelConfig
from .hf import from_pretrained, load_safetensors, load_state_dict
from .memory import memory_per_rank
from .qwen2 import Qwen2ForCausalLM

__all__ = ["MODEL_PRESETS", "ModelConfig", "Qwen2ForCausalLM", "from_pretrained", "load_safetensors",
           "load_state_dict", "memory_per_rank"]
