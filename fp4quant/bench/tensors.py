"""Synthetic tensors with the distributions that tensor-parallel traffic has."""

from __future__ import annotations

import torch

# hidden size of the activation-like tensors; a multiple of every group size swept
HIDDEN = 4096
OUTLIER_CHANNELS = 8
OUTLIER_GAIN = 100.0


def _student_t(shape, dof: int, gen: torch.Generator) -> torch.Tensor:
    z = torch.randn(shape, generator=gen)
    chi2 = (torch.randn((*shape, dof), generator=gen) ** 2).sum(-1)
    return z / torch.sqrt(chi2 / dof)


def _laplace(shape, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=gen) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs())


def _outlier_channels(shape, gen: torch.Generator) -> torch.Tensor:
    """Activations (tokens x hidden) where a few channels are ~100x larger, as in LLMs."""
    x = torch.randn(shape, generator=gen)
    channels = torch.randperm(shape[-1], generator=gen)[:OUTLIER_CHANNELS]
    x[:, channels] *= OUTLIER_GAIN
    return x


KINDS = {
    "gaussian": lambda shape, gen: torch.randn(shape, generator=gen),
    "laplace": _laplace,
    "student_t3": lambda shape, gen: _student_t(shape, 3, gen),
    "outlier_channels": _outlier_channels,
    # activation gradients: heavy-tailed and tiny (1e-6), outside an 8-bit scale's range
    "small_gradient": lambda shape, gen: _student_t(shape, 5, gen) * 1e-6,
}


def make(kind: str, numel: int, seed: int) -> torch.Tensor:
    """A float32 (numel / HIDDEN, HIDDEN) tensor of the given kind (numel: a multiple of HIDDEN)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tensor kind {kind!r}; known: {', '.join(KINDS)}")
    if numel % HIDDEN:
        raise ValueError(f"numel must be a multiple of {HIDDEN}, got {numel}")
    gen = torch.Generator().manual_seed(seed)
    return KINDS[kind]((numel // HIDDEN, HIDDEN), gen).contiguous()
