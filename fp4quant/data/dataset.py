"""Deterministic batches from a prepared token file (memory-mapped, never loaded whole).

Samples are windows of seq_len + 1 tokens starting at multiples of seq_len in the train
(or validation) split.  The global sample g (g = step * global_batch + dp_rank * batch + b)
is window perm_e[g mod K] of epoch e = g div K, with perm_e a permutation seeded by
(seed, e): the batch of any step is a pure function of (step, rank, seed), so a resumed
run reads exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    """A damaged prepared folder, reported in one line."""


class TokenDataset:
    """A prepared folder, checked when opened: meta.json readable, tokens.bin of the length
    it states, and every token id inside the vocabulary (one pass over the memory map)."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        meta_path = folder / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(
                f"no prepared data in {folder} (meta.json missing); run `python -m fp4quant.data prepare --out {folder}`"
            )
        redo = f"prepare it again with `python -m fp4quant.data prepare --out {folder}`"
        try:
            self.meta = json.loads(meta_path.read_text())
            dtype = np.dtype(self.meta["dtype"])
            n_tokens, self.n_train = int(self.meta["n_tokens"]), int(self.meta["n_train"])
            self.vocab_size = int(self.meta["vocab_size"])
        except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise DataError(f"{meta_path} is damaged ({type(exc).__name__}: {exc}); {redo}") from None
        if not 0 <= self.n_train <= n_tokens or n_tokens < 1 or self.vocab_size < 1:
            raise DataError(f"{meta_path} is damaged (n_train {self.n_train}, n_tokens {n_tokens}, "
                            f"vocab_size {self.vocab_size}); {redo}")
        tokens_path = folder / "tokens.bin"
        expected = n_tokens * dtype.itemsize
        if not tokens_path.exists() or tokens_path.stat().st_size != expected:
            raise DataError(f"{tokens_path} is missing or not {expected} bytes: the prepared folder is damaged; {redo}")
        self.tokens = np.memmap(tokens_path, dtype=dtype, mode="r")
        largest = int(self.tokens.max())
        if largest >= self.vocab_size:
            raise DataError(f"{tokens_path} holds token id {largest}, outside the vocabulary of {self.vocab_size} "
                            f"that meta.json states: the prepared folder is damaged; {redo}")

    def _split(self, split: str) -> tuple[int, int]:
        if split == "train":
            return 0, self.n_train
        if split == "val":
            return self.n_train, len(self.tokens)
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")

    def windows(self, seq_len: int, split: str = "train") -> int:
        lo, hi = self._split(split)
        return max((hi - lo - 1) // seq_len, 0)

    @lru_cache(maxsize=4)
    def _permutation(self, windows: int, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(windows)

    def sample_windows(self, step: int, dp_rank: int, dp_size: int, batch_size: int, seq_len: int, seed: int = 0,
                       split: str = "train") -> list[int]:
        """The window indices of one rank's batch (see the module doc)."""
        k = self.windows(seq_len, split)
        if k == 0:
            raise ValueError(f"the {split} split has fewer than {seq_len + 1} tokens")
        out = []
        for b in range(batch_size):
            g = (step * dp_size + dp_rank) * batch_size + b
            out.append(int(self._permutation(k, seed, g // k)[g % k]))
        return out

    def batch(self, step: int, dp_rank: int, dp_size: int, batch_size: int, seq_len: int, seed: int = 0,
              split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels), each int64 (batch_size, seq_len), for one data-parallel rank."""
        lo, _ = self._split(split)
        rows = []
        for w in self.sample_windows(step, dp_rank, dp_size, batch_size, seq_len, seed, split):
            start = lo + w * seq_len
            rows.append(np.asarray(self.tokens[start : start + seq_len + 1], dtype=np.int64))
        window = torch.from_numpy(np.stack(rows))
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()
