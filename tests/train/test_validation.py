"""Validation reads the same batches whatever the run's seed, and the summary keeps each
batch's loss (for the standard error of the validation loss)."""

from __future__ import annotations

import json

import pytest

from fp4quant.data import TokenDataset
from fp4quant.train.__main__ import main
from train.launch import flags


def test_every_seed_validates_on_the_same_windows(data, tmp_path, monkeypatch):
    seen: dict[int, list[list[int]]] = {}
    real = TokenDataset.sample_windows

    def record(self, step, dp_rank, dp_size, batch_size, seq_len, seed=0, split="train"):
        windows = real(self, step, dp_rank, dp_size, batch_size, seq_len, seed, split)
        if split == "val":
            seen.setdefault(run_seed, []).append(windows)
        return windows

    monkeypatch.setattr(TokenDataset, "sample_windows", record)
    summaries = {}
    for run_seed in (0, 3):
        out = tmp_path / f"seed{run_seed}"
        assert main(flags(out=str(out), data=data, model="tiny", steps=2, seq_len=32, batch_size=2, eval_batches=3,
                          seed=run_seed)) == 0
        summaries[run_seed] = json.loads((out / "summary.json").read_text())
    assert len(seen[0]) == 3 and seen[0] == seen[3]
    train_first = real(TokenDataset(data), 0, 0, 1, 2, 32, 3)  # training batches still follow the seed
    assert train_first != real(TokenDataset(data), 0, 0, 1, 2, 32, 0)
    for s in summaries.values():
        assert len(s["val_batch_losses"]) == 3
        assert s["val_loss"] == pytest.approx(sum(s["val_batch_losses"]) / 3)
