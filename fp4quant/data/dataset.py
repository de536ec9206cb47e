"""Deterministic batches from a prepared token file (memory-mapped, never loaded whole).

Samples are windows of seq_len + 1 tokens starting at multiples of seq_len in the train
(or validation) split.  The global sample g (g = step * global_batch + dp_rank * batch + b)
is window perm_e[g mod K] of epoch e = g div K, with perm_e a permutation seeded by
(seed, e): the batch of any step is a pure function of (step, rank, seed), so a resumed
run reads exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

# Bytes read per step while verifying tokens.bin: a bounded buffer whatever the file's size, and a
# multiple of every integer itemsize, so each chunk holds whole token ids.
CHUNK_BYTES = 16 << 20


class DataError(ValueError):
    """A damaged prepared folder, reported in one line."""


def _redo(folder: Path, meta: dict | None) -> str:
    """How to prepare ``folder`` again: the same inputs and tokenizer when meta.json still says them
    (redone without --input, a user's folder would silently get the bundled corpus instead)."""
    cmd = ["python", "-m", "fp4quant.data", "prepare", "--out", str(folder)]
    if known := isinstance(meta, dict):
        source, tokenizer = meta.get("source"), meta.get("tokenizer")
        if isinstance(source, list) and source and all(isinstance(s, str) for s in source):
            cmd += ["--input", *source]
        if isinstance(tokenizer, str) and tokenizer != "bytes":
            cmd += ["--tokenizer", tokenizer]
    hint = "" if known else " (with the --input and --tokenizer it was made from)"
    return f"prepare it again with `{shlex.join(cmd)}`{hint}"


class TokenDataset:
    """A prepared folder, verified when opened: meta.json readable, tokens.bin of the length and
    SHA-256 it states, stored as integers, and every token id in [0, vocab_size)."""

    def __init__(self, folder: str | Path):
        self.folder = folder = Path(folder)
        meta_path = folder / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"no prepared data in {folder} (meta.json missing); "
                                    f"run `python -m fp4quant.data prepare --out {folder}`")
        redo = _redo(folder, None)
        try:
            self.meta = json.loads(meta_path.read_text())
            redo = _redo(folder, self.meta)
            dtype = np.dtype(self.meta["dtype"])
            n_tokens, self.n_train = int(self.meta["n_tokens"]), int(self.meta["n_train"])
            self.vocab_size = int(self.meta["vocab_size"])
        except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise DataError(f"{meta_path} is damaged ({type(exc).__name__}: {exc}); {redo}") from None
        if not 0 <= self.n_train <= n_tokens or n_tokens < 1 or self.vocab_size < 1:
            raise DataError(f"{meta_path} is damaged (n_train {self.n_train}, n_tokens {n_tokens}, "
                            f"vocab_size {self.vocab_size}); {redo}")
        if dtype.kind not in "iu":  # float ids would be cast (rounded, wrapped) to whatever they happen to hit
            raise DataError(f"{meta_path} is damaged (dtype {dtype.name}: token ids are stored as integers, "
                            f"uint16 or uint32); {redo}")
        expected_sha = self.meta.get("tokens_sha256")
        if not isinstance(expected_sha, str) or len(expected_sha) != 64:
            # every prepare writes it; a folder without one cannot be told apart from a damaged copy
            raise DataError(f"{meta_path} has no valid tokens_sha256, so {folder / 'tokens.bin'} cannot be "
                            f"verified; {redo}")
        tokens_path = folder / "tokens.bin"
        expected = n_tokens * dtype.itemsize
        if not tokens_path.exists() or tokens_path.stat().st_size != expected:
            raise DataError(f"{tokens_path} is missing or not {expected} bytes: the prepared folder is damaged; {redo}")
        sha, smallest, largest = _scan(tokens_path, dtype)
        if sha != expected_sha.lower():
            raise DataError(f"{tokens_path} does not match the tokens_sha256 in meta.json (SHA-256 {sha[:12]}..., "
                            f"expected {expected_sha[:12]}...): the prepared folder is damaged; {redo}")
        if smallest < 0 or largest >= self.vocab_size:
            bad = smallest if smallest < 0 else largest
            raise DataError(f"{tokens_path} holds token id {bad}, outside the vocabulary of {self.vocab_size} "
                            f"that meta.json states: the prepared folder is damaged; {redo}")
        self.tokens = np.memmap(tokens_path, dtype=dtype, mode="r")

    def _split(self, split: str) -> tuple[int, int]:
        if split == "train":
            return 0, self.n_train
        if split == "val":
            return self.n_train, len(self.tokens)
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")

    def windows(self, seq_len: int, split: str = "train") -> int:
        """How many windows of seq_len + 1 tokens (inputs and their next-token labels) the split holds."""
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        lo, hi = self._split(split)
        return max((hi - lo - 1) // seq_len, 0)

    def require_windows(self, seq_len: int, split: str = "train") -> int:
        """The split's window count; a DataError (one line) when it holds not even one window."""
        k = self.windows(seq_len, split)
        if k == 0:
            lo, hi = self._split(split)
            raise DataError(f"the {split} split of {self.folder} holds {hi - lo} tokens, too few for one window of "
                            f"--seq-len {seq_len} ({seq_len + 1} tokens); use a smaller --seq-len or more data")
        return k

    @lru_cache(maxsize=4)
    def _permutation(self, windows: int, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(windows)

    def sample_windows(self, step: int, dp_rank: int, dp_size: int, batch_size: int, seq_len: int, seed: int = 0,
                       split: str = "train") -> list[int]:
        """The window indices of one rank's batch (see the module doc)."""
        k = self.require_windows(seq_len, split)
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


def _scan(path: Path, dtype: np.dtype) -> tuple[str, int, int]:
    """(SHA-256, smallest id, largest id) of a token file, in one streaming pass.

    Each open reads the whole file once through a bounded buffer, at some 0.4-1.5 GB/s on one core
    (SHA-256 dominates; measured on a 2-core EPYC with SHA-NI, loaded and idle): the bundled corpus
    (10 MB) takes ~20 ms, a 10 GB file some 7-25 s in every process that opens it (the page cache
    shares the reads), small beside a run that needs that much data, and it is what tells a damaged
    copy from the prepared one.
    """
    h = hashlib.sha256()
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    smallest = largest = 0
    with open(path, "rb") as f:
        # a buffered read fills the buffer until the file ends, so chunks hold whole ids (a file that
        # changes meanwhile fails the checksum, which the caller checks before the ids)
        while n := f.readinto(buf):
            h.update(view[:n])
            ids = np.frombuffer(buf, dtype=dtype, count=n // dtype.itemsize)
            if dtype.kind == "i":  # unsigned ids cannot be negative
                smallest = min(smallest, int(ids.min()))
            largest = max(largest, int(ids.max()))
    return h.hexdigest(), smallest, largest
