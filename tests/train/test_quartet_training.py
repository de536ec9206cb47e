"""Training with Quartet's FP4 compute beside compressed TP communication."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from distributed import run_ranks
from train.launch import short


def test_quartet_composes_with_compressed_tp_and_resumes_bit_exactly(data, tmp_path):
    """TP=2, fp4quant on the wire, Quartet compute: it learns, and a run stopped at a
    checkpoint and resumed replays the uninterrupted run's losses bit for bit."""
    kw = dict(tp=2, comm="fp4quant", compute="quartet", steps=6, checkpoint_every=3)
    whole = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "whole", **kw), timeout=300)[0]
    # an interruption after step 3: the run's folder as the checkpoint at step 3 left it
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "whole", cut)
    shutil.rmtree(cut / "checkpoints/step_000006")
    (cut / "summary.json").unlink()
    resumed = run_ranks("train.rank_jobs:train", 2, short(data, cut, **kw), timeout=300)[0]
    assert resumed["summary"]["resumed_from"] == 3
    assert resumed["losses"] == whole["losses"]  # bit-identical: the backward's streams are keyed by step
    assert resumed["checksum"] == whole["checksum"]
    assert whole["summary"]["provenance"]["config"]["compute"] == "quartet"
    s = whole["summary"]
    assert 0 < s["fwd_bytes_sent"] < s["bytes_uncompressed"] / 4  # compressed TP traffic beside FP4 compute
    exact = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "exact", **{**kw, "compute": "exact"}),
                      timeout=300)[0]
    assert exact["losses"] != whole["losses"]  # the compute did change
    assert abs(whole["losses"][-1] - exact["losses"][-1]) < 0.1 * exact["losses"][-1]
    log = [json.loads(line) for line in Path(tmp_path / "whole/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(6))
