"""TrafficCapture: each rank's contribution to every TP collective at the chosen steps, saved atomically."""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from fp4quant.parallel import CommConfig, TPCommunicator, TrafficCapture, load_captures
from fp4quant.parallel.capture import capture_file


@pytest.mark.parametrize("preset", ["exact", "fp4quant"])
def test_captures_what_each_rank_sends_at_the_chosen_steps(tmp_path, preset):
    results = run_ranks("parallel.capture_jobs:reduce_and_capture", 2, {"folder": str(tmp_path), "preset": preset})
    caps = load_captures(tmp_path)
    assert [(c["step"], c["rank"]) for c in caps] == [(0, 0), (0, 1), (2, 0), (2, 1)]  # step 1 was not chosen
    for cap in caps:
        sent = results[cap["rank"]]["sent"][cap["step"]]
        assert cap["meta"] == {"model": "test"}
        for d in ("fwd", "bwd"):
            assert len(cap["tensors"][d]) == len(sent[d])
            for a, b in zip(cap["tensors"][d], sent[d]):
                assert torch.equal(a, b)  # the contribution before the in-place reduction
    if preset == "exact":  # and it is the contribution: the ranks' captures sum to the result
        for step in (0, 2):
            total = caps[step]["tensors"]["fwd"][0] + caps[step + 1]["tensors"]["fwd"][0]
            assert torch.equal(total, results[0]["got"][step]["fwd"][0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step000000-rank0.pt", "step000000-rank1.pt",
                                                          "step000002-rank0.pt", "step000002-rank1.pt"]


def test_off_records_nothing_and_single_rank_sends_nothing(tmp_path):
    capture = TrafficCapture(tmp_path, steps=(3,))
    tp = TPCommunicator(None, CommConfig(), capture=capture)
    tp.start_step(0)
    assert not capture.recording and capture.save() is None
    tp.start_step(3)
    assert capture.recording
    assert tp.all_reduce(torch.ones(4), "fwd").sum() == 4  # TP = 1: no collective, nothing captured
    assert capture.save() == capture_file(tmp_path, 3, 0) and not capture.recording
    assert load_captures(tmp_path)[0]["tensors"] == {"fwd": [], "bwd": []}


def test_bad_steps_and_folders_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one step"):
        TrafficCapture(tmp_path, steps=())
    with pytest.raises(ValueError, match="integers >= 0"):
        TrafficCapture(tmp_path, steps=(-1,))
    capture = TrafficCapture(tmp_path, steps=(0,))
    capture.start_step(0)
    with pytest.raises(ValueError, match="direction"):
        capture.record("sideways", torch.ones(1))
    with pytest.raises(FileNotFoundError, match="no capture folder"):
        load_captures(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no capture files"):
        load_captures(tmp_path)
    torch.save({"step": 5, "rank": 0, "tensors": {}}, tmp_path / "step000001-rank0.pt")
    with pytest.raises(ValueError, match="not a capture file"):
        load_captures(tmp_path)
