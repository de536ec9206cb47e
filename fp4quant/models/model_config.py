"""Model configurations: the Qwen2 architecture's hyper-parameters and named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position: int = 32768
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # a config.json may spell a number as a string
            v = getattr(self, f.name)
            kind = {"int": int, "float": (int, float), "bool": bool}[f.type]
            if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
                raise ValueError(f"ModelConfig.{f.name} must be {f.type}, got {v!r}")
            if not isinstance(v, bool) and not v > 0:
                raise ValueError(f"ModelConfig.{f.name} must be positive, got {v}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check_tp(self, tp: int) -> None:
        """ValueError unless every sharded dimension divides by the tensor-parallel size."""
        for name, n in (("num_heads", self.num_heads), ("num_kv_heads", self.num_kv_heads),
                        ("intermediate_size", self.intermediate_size), ("vocab_size", self.vocab_size)):
            if n % tp:
                raise ValueError(f"tensor-parallel size {tp} does not divide {name} ({n})")

    def num_parameters(self) -> int:
        h, i, L, v = self.hidden_size, self.intermediate_size, self.num_layers, self.vocab_size
        kv = self.num_kv_heads * self.head_dim
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (+bias), k, v (+bias), o
        layer = attn + 3 * h * i + 2 * h
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        return L * layer + embed + h

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x matmul parameters + attention (forward 2, backward 4)."""
        matmul = self.num_parameters() - self.vocab_size * self.hidden_size * (0 if self.tie_word_embeddings else 1)
        attn = 2 * self.num_layers * seq_len * self.hidden_size  # QK^T and AV, per token, forward
        return 6 * matmul + 3 * 2 * attn

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        if name not in MODEL_PRESETS:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_PRESETS)}")
        return cls(**MODEL_PRESETS[name])

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face Qwen2 config.json dict."""
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            rope_theta=hf.get("rope_theta", 10000.0), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            max_position=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
        )


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # a few million parameters over the byte vocabulary; 8 heads / 4 KV heads: TP 1, 2 or 4
    "tiny": dict(vocab_size=256, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8, num_kv_heads=4,
                 max_position=4096),
    # about 10 million parameters over the byte vocabulary (the convergence study, workflow/config/study.yaml)
    "small": dict(vocab_size=256, hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=8, num_kv_heads=4,
                  max_position=4096),
    # "small" with 16 heads of 24 and as many KV heads (multi-head attention, as Qwen-7B): 10.8 million
    # parameters, TP up to 16 (the convergence study at the paper's TP degrees, workflow/config/study_tp.yaml)
    "small-mha": dict(vocab_size=256, hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=16,
                      num_kv_heads=16, max_position=4096),
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                       num_kv_heads=2, rope_theta=1000000.0, tie_word_embeddings=True),
    # Qwen-7B's shapes (multi-head attention) in the Qwen2 architecture
    "qwen-7b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                    num_kv_heads=32, max_position=8192),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                       num_kv_heads=4, rope_theta=1000000.0),
}
