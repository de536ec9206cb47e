"""--capture-traffic-steps: a run saves what crosses the wire at the chosen steps, and nothing else changes."""

from __future__ import annotations

import pytest

from distributed import run_ranks
from fp4quant.models.model_config import ModelConfig
from fp4quant.parallel import load_captures
from fp4quant.train import ConfigError, TrainConfig
from train.launch import short


def test_a_run_captures_both_directions_of_every_layer(data, tmp_path):
    kw = short(data, tmp_path / "cap", tp=2, comm="fp4quant", steps=4)
    plain = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "plain", tp=2, comm="fp4quant", steps=4))[0]
    captured = run_ranks("train.rank_jobs:train", 2, {**kw, "capture_traffic_steps": "1,3"})[0]
    assert captured["losses"] == plain["losses"]  # capturing changes nothing that is computed
    caps = load_captures(tmp_path / "cap" / "traffic")
    assert [(c["step"], c["rank"]) for c in caps] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    cfg = ModelConfig.preset("tiny")
    for cap in caps:
        assert cap["meta"]["model"] == "tiny" and cap["meta"]["steps"] == [1, 3] and cap["meta"]["provenance"]["commit"]
        for direction in ("fwd", "bwd"):
            xs = cap["tensors"][direction]
            assert len(xs) == 2 * cfg.num_layers + 1  # embedding / LM head, then two per layer
            assert all(x.shape[-1] == cfg.hidden_size and x.numel() == 64 * 2 * cfg.hidden_size for x in xs)
    # the ranks' contributions differ (each holds its shard's partial sum)
    assert not caps[0]["tensors"]["fwd"][1].equal(caps[1]["tensors"]["fwd"][1])


@pytest.mark.parametrize("steps, why", [("1,x", "comma-separated"), ("6", r"\[0, steps=6\)"), ("-1", r"\[0, steps")])
def test_bad_capture_steps_are_one_line_errors(steps, why):
    with pytest.raises(ConfigError, match=why):
        TrainConfig(out="x", steps=6, capture_traffic_steps=steps)


def test_capture_refuses_activation_checkpointing():
    with pytest.raises(ConfigError, match="activation-checkpointing"):
        TrainConfig(out="x", steps=6, capture_traffic_steps="1", activation_checkpointing=True)
    assert TrainConfig(out="x", steps=6, capture_traffic_steps=" 3, 1,3").capture_steps == (1, 3)
