"""The Qwen2 architecture on tensor-parallel layers.

RMSNorm, rotary position embeddings, grouped-query attention with q/k/v biases, SwiGLU
MLP, as Hugging Face's Qwen2ForCausalLM, with the same parameter names (so its
checkpoints load by name, see hf.py).  Activations are sequence-first (T, B, H) inside
the model, which is what sequence parallelism shards (dim 0).  Per layer, TP traffic is
two all-reduces forward (after o_proj and down_proj) and two backward (before q/k/v and
before gate/up), each through the TPCommunicator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..parallel.communicator import TPCommunicator
from ..parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_input,
    vocab_parallel_cross_entropy,
)
from .model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotary_tables(cfg: ModelConfig, seq_len: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim), computed in float32 as Hugging Face does."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    freqs = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, heads, T, head_dim)."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPCommunicator, sp: bool, device=None, dtype=None):
        super().__init__()
        self.tp, self.sp, self.cfg = tp, sp, cfg
        d, kv = cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        mapped = dict(tp=tp, bias=True, sequence_parallel=sp, input_is_mapped=True, device=device, dtype=dtype)
        self.q_proj = ColumnParallelLinear(cfg.hidden_size, cfg.num_heads * d, **mapped)
        self.k_proj = ColumnParallelLinear(cfg.hidden_size, kv, **mapped)
        self.v_proj = ColumnParallelLinear(cfg.hidden_size, kv, **mapped)
        self.o_proj = RowParallelLinear(cfg.num_heads * d, cfg.hidden_size, tp, bias=False, sequence_parallel=sp,
                                        device=device, dtype=dtype)
        self.heads = cfg.num_heads // tp.world
        self.kv_heads = cfg.num_kv_heads // tp.world

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = column_input(x, self.tp, self.sp)  # (T, B, H): once for q, k and v
        T, B, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(T, B, self.heads, d).permute(1, 2, 0, 3)
        k = self.k_proj(x).view(T, B, self.kv_heads, d).permute(1, 2, 0, 3)
        v = self.v_proj(x).view(T, B, self.kv_heads, d).permute(1, 2, 0, 3)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.permute(2, 0, 1, 3).reshape(T, B, self.heads * d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPCommunicator, sp: bool, device=None, dtype=None):
        super().__init__()
        self.tp, self.sp = tp, sp
        mapped = dict(tp=tp, bias=False, sequence_parallel=sp, input_is_mapped=True, device=device, dtype=dtype)
        self.gate_proj = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, **mapped)
        self.up_proj = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, **mapped)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, tp, bias=False,
                                           sequence_parallel=sp, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = column_input(x, self.tp, self.sp)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPCommunicator, sp: bool, device=None, dtype=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        self.self_attn = Attention(cfg, tp, sp, device, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        self.mlp = MLP(cfg, tp, sp, device, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPCommunicator, sp: bool, device=None, dtype=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, sp, device, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp, sp, device, dtype) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)


class Qwen2ForCausalLM(nn.Module):
    """``forward(ids)`` gives this rank's vocabulary slice of the logits, (B, T, vocab / tp);
    ``loss(ids, labels)`` the mean next-token cross entropy over the whole vocabulary."""

    def __init__(self, cfg: ModelConfig, tp: TPCommunicator, sequence_parallel: bool = False,
                 activation_checkpointing: bool = False, device=None, dtype=None):
        super().__init__()
        cfg.check_tp(tp.world)
        self.cfg, self.tp, self.sp = cfg, tp, sequence_parallel and tp.world > 1
        self.activation_checkpointing = activation_checkpointing
        self.model = Qwen2Model(cfg, tp, self.sp, device, dtype)
        self.lm_head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, tp, bias=False,
                                            sequence_parallel=self.sp, device=device, dtype=dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # both split over the vocabulary alike

    @property
    def vocab_start(self) -> int:
        return self.model.embed_tokens.vocab_start

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        if self.sp and T % self.tp.world:
            raise ValueError(f"sequence parallelism needs the sequence length ({T}) divisible by TP ({self.tp.world})")
        if T > self.cfg.max_position:
            raise ValueError(f"sequence length {T} exceeds the model's max_position {self.cfg.max_position}")
        x = self.model.embed_tokens(ids.t())  # (T or T/tp, B, H)
        cos, sin = rotary_tables(self.cfg, T, ids.device, x.dtype)
        for layer in self.model.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = self.model.norm(x)
        return self.lm_head(x).transpose(0, 1)  # (B, T, vocab / tp)

    def loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self(ids), labels, self.tp, self.vocab_start)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every TP rank holds whole (norms, row-parallel biases): their gradients
        must be reduced over TP under sequence parallelism, and counted once in norms."""
        sharded = set()
        for m in self.modules():
            if isinstance(m, (ColumnParallelLinear, VocabParallelEmbedding)):
                sharded.update(id(p) for p in m.parameters(recurse=False))
            if isinstance(m, RowParallelLinear):
                sharded.add(id(m.weight))
        return [p for p in self.parameters() if id(p) not in sharded]
