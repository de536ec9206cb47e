"""The traffic benchmark on small synthetic captures: every method, sites, spread, provenance."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from fp4quant.bench import traffic
from fp4quant.parallel import TrafficCapture, load_captures

LAYERS = 2


def write_captures(folder, steps=(1, 3), ranks=(0, 1)):
    """Captures shaped like a 2-layer model's (2L + 1 calls per direction): activations with a
    few outlier channels forward, small heavy-tailed gradients backward."""
    meta = {"model": "synthetic", "tp": len(ranks), "comm": "bf16", "sequence_parallel": False,
            "model_config": {"num_layers": LAYERS}, "provenance": {"commit": "x"}}
    for step in steps:
        for rank in ranks:
            gen = torch.Generator().manual_seed(10 * step + rank)
            cap = TrafficCapture(folder, steps=steps, rank=rank, meta=meta)
            cap.start_step(step)
            for _ in range(2 * LAYERS + 1):
                act = torch.randn(8, 4, 64, generator=gen)
                act[..., 3] *= 50
                cap.record("fwd", act)
                cap.record("bwd", torch.randn(8, 4, 64, generator=gen) ** 3 * 1e-5)
            cap.save()


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_measures_every_method_on_every_captured_tensor(tmp_path):
    write_captures(tmp_path / "caps")
    out = tmp_path / "traffic.csv"
    assert traffic.main(["--captures", str(tmp_path / "caps"), "--out", str(out)]) == 0
    rows = read(out)
    n_methods = len(traffic.methods())
    assert len(rows) == 2 * 2 * 2 * (2 * LAYERS + 1) * n_methods  # directions x steps x ranks x calls x methods
    sites = {(r["direction"], r["site"]) for r in rows}
    assert ("fwd", "embed") in sites and ("fwd", "L1.mlp_out") in sites and ("bwd", "lm_head_in") in sites
    assert {r["rotation"] for r in rows} == {"none", "16", "128", "group"}
    assert {r["scale_select"] for r in rows} == {"max_to_6", "4_over_6"}
    assert all(float(r["sqnr_db"]) > 5 for r in rows)
    meta = json.loads((tmp_path / "traffic.csv.meta.json").read_text())
    assert meta["source"]["capture_steps"] == [1, 3] and meta["source"]["model"] == "synthetic"
    summary = read(traffic.summary_path(out))
    assert len(summary) == 2 * n_methods and all(int(r["tensors"]) == 20 for r in summary)
    for r in summary:
        assert float(r["sqnr_min_db"]) <= float(r["sqnr_median_db"]) <= float(r["sqnr_max_db"])
        assert float(r["sqnr_sd_db"]) >= 0 and r["commit"]
        assert float(r["vs_no_fwht_min_db"]) <= float(r["vs_no_fwht_median_db"]) <= float(r["vs_no_fwht_max_db"])
        if r["study"] == "presets" and r["method"] == "no_fwht":
            assert float(r["vs_no_fwht_min_db"]) == float(r["vs_no_fwht_max_db"]) == 0


def sqnr(rows, **match):
    return [float(r["sqnr_db"]) for r in rows if all(r[k] == v for k, v in match.items())]


def test_the_whole_group_rotation_is_fp4quant_and_4_over_6_never_loses(tmp_path):
    write_captures(tmp_path / "caps", steps=(0,), ranks=(0,))
    out = tmp_path / "t.csv"
    traffic.main(["--captures", str(tmp_path / "caps"), "--out", str(out)])
    rows = read(out)
    # the rotation study's whole-group Hadamard before no_fwht is the fp4quant preset's FWHT
    group = sqnr(rows, study="rotation", rotation="group", scale_select="max_to_6")
    assert group == pytest.approx(sqnr(rows, study="presets", method="fp4quant"), abs=1e-3)
    assert sqnr(rows, study="rotation", rotation="none", scale_select="max_to_6") == \
        sqnr(rows, study="presets", method="no_fwht")
    for rotation in ("none", "16", "128", "group"):
        default = sqnr(rows, study="rotation", method="no_fwht", rotation=rotation, scale_select="max_to_6")
        chosen = sqnr(rows, study="rotation", method="no_fwht", rotation=rotation, scale_select="4_over_6")
        assert len(chosen) == len(default) == 10
        assert all(c >= d - 1e-3 for c, d in zip(chosen, default))


def test_site_names_follow_the_models_call_order_or_say_call():
    assert traffic.site_names("fwd", 5, 2) == ["embed", "L0.attn_out", "L0.mlp_out", "L1.attn_out", "L1.mlp_out"]
    assert traffic.site_names("bwd", 5, 2) == ["lm_head_in", "L1.mlp_in", "L1.attn_in", "L0.mlp_in", "L0.attn_in"]
    assert traffic.site_names("fwd", 3, 2) == ["call0", "call1", "call2"]


def test_missing_captures_and_non_finite_tensors_are_errors(tmp_path, capsys):
    assert traffic.main(["--captures", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")]) == 2
    assert "no capture folder" in capsys.readouterr().err
    cap = TrafficCapture(tmp_path / "bad", steps=(0,), meta={})
    cap.start_step(0)
    cap.record("fwd", torch.tensor([1.0, float("nan")]))
    cap.save()
    with pytest.raises(ValueError, match="NaN or Inf"):
        traffic.measure(load_captures(tmp_path / "bad"))
