"""The step's regime: component shares on the target and the emulated cluster, predicted and measured."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from fp4quant.cluster.calibrate import TargetCluster
from fp4quant.models.model_config import ModelConfig
from fp4quant.perfmodel import regime
from fp4quant.perfmodel.machines import h100, h100_codec
from fp4quant.perfmodel.model import Workload, step

REPO = Path(__file__).resolve().parents[2]


def calibration(dilation: float = 6650.0, cpu_gbps: float = 5.0) -> dict:
    """A calibration as fp4quant.cluster.calibrate writes it: every component dilated alike."""
    t = TargetCluster()
    return {"target": asdict(t), "time_dilation": dilation, "rank_flops": t.flops_per_gpu / dilation,
            "link_rate_bps": 8 * t.inter_node_bw / dilation, "link_latency_s": t.inter_node_latency * dilation,
            "link_burst_bytes": int(t.inter_node_bw / dilation * 0.004),
            "codec_gbps": {"fp4quant": dict.fromkeys(("quantize", "dequantize_reduce", "dequantize"), cpu_gbps)}}


def test_parts_add_up_to_the_step_and_the_scalar_reductions():
    w, m = regime.target_workload(16), h100(16)
    for preset in ("bf16", "fp4quant"):
        p, s = regime.parts(w, m, preset), step(w, m, preset)
        assert sum(p.values()) == pytest.approx(s.total_s)
        assert p["compute"] == s.compute_s + s.skew_s and p["codec"] == s.codec_s
        assert s.scalar_s > 0
        assert p["latency"] == pytest.approx(2 * w.messages_per_direction * 30 * 10e-6 + s.scalar_s)
        assert sum(regime.shares(p).values()) == pytest.approx(1.0)
    assert regime.parts(w, m, "bf16")["codec"] == 0 < regime.parts(w, m, "fp4quant")["codec"]
    # fp4quant sends ~3.5x fewer bytes: the same latency, a smaller bandwidth part
    assert regime.parts(w, m, "fp4quant")["bandwidth"] < regime.parts(w, m, "bf16")["bandwidth"] / 3


def test_the_target_across_nodes_is_bandwidth_bound_and_inside_a_node_compute_bound():
    across = regime.shares(regime.parts(regime.target_workload(16), h100(16), "bf16"))
    inside = regime.shares(regime.parts(regime.target_workload(8), h100(8), "bf16"))
    assert max(across, key=across.get) == "bandwidth" and max(inside, key=inside.get) == "compute"


def test_the_emulated_machine_is_the_calibration_with_the_codec_stretched_to_the_dilated_target():
    cal = calibration(dilation=1000.0, cpu_gbps=5.0)
    m = regime.emulated_machine(cal)
    assert m.rank_flops == cal["rank_flops"] and m.inter_latency == cal["link_latency_s"]
    assert m.inter_bw == cal["link_rate_bps"] / 8 and m.burst_bytes == cal["link_burst_bytes"]
    target = h100_codec(TargetCluster(), regime.EMULATED_TP)["fp4quant"]
    cpu = 5e9 / 4  # values/s of float32 input at 5 GB/s
    for op, rate in m.codec_values_per_s["fp4quant"].items():
        assert rate == pytest.approx(min(cpu, target[op] / 1000.0))
    fast = regime.emulated_machine(calibration(dilation=1.0, cpu_gbps=5.0))  # the CPU is the slower: not stretched
    assert fast.codec_values_per_s["fp4quant"]["quantize"] == pytest.approx(cpu)


def test_emulated_shares_do_not_depend_on_the_dilation_when_the_target_codec_is_the_slower():
    w = Workload(ModelConfig.preset("tiny"), 2, 512, 8)
    a = regime.shares(regime.parts(w, regime.emulated_machine(calibration(6650.0)), "fp4quant"))
    b = regime.shares(regime.parts(w, regime.emulated_machine(calibration(19000.0)), "fp4quant"))
    for c in regime.COMPONENTS:
        # within 2 points: the token bucket holds 4 ms of traffic at any rate, undilated, and each
        # direction's first all-reduce starts on a full one
        assert a[c] == pytest.approx(b[c], abs=0.02)


def test_the_default_throughput_shape_splits_the_step_as_the_target_across_two_nodes():
    """The shape the default configuration runs (workflow/config/default.yaml) is in the target's
    regime: each component within 10 points of Qwen-7B's at TP=16 across two H100 nodes."""
    run = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())["cluster"]["throughput"]
    w = Workload(ModelConfig.preset("tiny"), 2, run["seq_len"], run["batch_size"])
    emulated = regime.shares(regime.parts(w, regime.emulated_machine(calibration()), "bf16"))
    target = regime.shares(regime.parts(regime.target_workload(16), h100(16), "bf16"))
    for c in regime.COMPONENTS:
        assert emulated[c] == pytest.approx(target[c], abs=0.10), (c, emulated, target)
    # the training runs' shape (128 x 2) is not: there latency takes most of the step
    small = regime.shares(regime.parts(Workload(ModelConfig.preset("tiny"), 2, 128, 2),
                                       regime.emulated_machine(calibration()), "bf16"))
    assert small["latency"] > 0.6


def record(step_time, comm=(1.0, 1.0), codec=(0.0, 0.0), calls=(9, 9), step=0, split=False) -> dict:
    r = {"step": step, "step_time_s": step_time, "fwd_comm_s": comm[0], "bwd_comm_s": comm[1],
         "fwd_calls": calls[0], "bwd_calls": calls[1]}
    if split:  # the split timers: codec_s = quantize_s + dequantize_s
        r.update(fwd_quantize_s=codec[0] / 2, fwd_dequantize_s=codec[0] / 2, fwd_codec_s=codec[0],
                 bwd_quantize_s=codec[1] / 2, bwd_dequantize_s=codec[1] / 2, bwd_codec_s=codec[1])
    else:
        r.update(fwd_quantize_s=codec[0], bwd_quantize_s=codec[1])
    return r


@pytest.mark.parametrize("split", [False, True])
def test_measured_parts_split_the_logged_step(split):
    # 18 all-reduces of 2 hops at 0.1 s, 3 scalar reductions: 4.2 s of latency
    r = record(10.0, comm=(2.5, 2.5), codec=(0.4, 0.6), split=split)
    p = regime.measured_parts([r, r], tp=2, latency_s=0.1)
    assert p["codec"] == pytest.approx(1.0)
    assert p["latency"] == pytest.approx(21 * 2 * 0.1)
    assert p["bandwidth"] == pytest.approx(5.0 - 3.6)
    assert p["compute"] == pytest.approx(10.0 - 5.0 - 1.0 - 0.6)
    assert sum(p.values()) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="no steps"):
        regime.measured_parts([], tp=2, latency_s=0.1)


def write_run(folder: Path, comm: str, seed: int, step_times, latency_s=0.1, seq_len=512, batch=8) -> Path:
    folder.mkdir(parents=True)
    summary = {"provenance": {"config": {"comm": comm, "seed": seed, "seq_len": seq_len, "batch_size": batch}},
               "mesh": {"tp": 2, "dp": 1}, "model": ModelConfig.preset("tiny").to_dict(),
               "comm": {"dilation": {"latency_s": latency_s}}, "tokens_per_s": 1.0}
    (folder / "summary.json").write_text(json.dumps(summary))
    codec = (0.3, 0.3) if comm != "bf16" else (0.0, 0.0)
    lines = [record(t, comm=(2.5, 2.5), codec=codec, step=i) for i, t in enumerate(step_times)]
    (folder / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_regime_rows_project_predict_and_measure(tmp_path):
    runs = [write_run(tmp_path / f"{c}{s}", c, s, [99.0] + [t + s] * 3)
            for c, t in (("bf16", 10.0), ("fp4quant", 8.0)) for s in range(3)]
    rows = regime.regime_rows(calibration(), runs, warmup=1)
    sources = [(r["source"], r["comm"]) for r in rows]
    assert sources == [("projected", "bf16"), ("projected", "fp4quant")] * 2 + [
        ("predicted", "bf16"), ("measured", "bf16"), ("predicted", "fp4quant"), ("measured", "fp4quant")]
    measured = {r["comm"]: r for r in rows if r["source"] == "measured"}
    assert measured["bf16"]["n"] == 3
    # the warm-up step (99 s) is left out: mean step 11 s, tokens/s the mean of the runs'
    assert measured["bf16"]["step_s"] == pytest.approx(11.0)
    assert measured["bf16"]["tokens_per_s"] == pytest.approx(sum(4096 / (10.0 + s) for s in range(3)) / 3)
    assert measured["bf16"]["compute_share_sd"] > 0 and measured["bf16"]["codec_share"] == 0
    assert measured["fp4quant"]["codec_s"] == pytest.approx(0.6)
    for r in rows:
        assert sum(r[f"{c}_share"] for c in regime.COMPONENTS) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="none after the 4 warm-up steps"):
        regime.regime_rows(calibration(), runs, warmup=4)


def test_runs_of_two_shapes_are_refused(tmp_path):
    runs = [write_run(tmp_path / "a", "bf16", 0, [1.0, 1.0]),
            write_run(tmp_path / "b", "bf16", 1, [1.0, 1.0], seq_len=256)]
    with pytest.raises(ValueError, match="different shapes"):
        regime.regime_rows(calibration(), runs, warmup=0)


def test_cli_writes_the_table_and_reports_bad_input_in_one_line(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(calibration()))
    runs = [str(write_run(tmp_path / c, c, 0, [5.0, 5.0, 5.0])) for c in ("bf16", "fp4quant")]
    out = tmp_path / "regime.csv"
    assert regime.main(["table", "--calibration", str(cal), "--runs", *runs, "--warmup", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("\n") == 1 + 4 + 4 and "H100 (assumed)" in text
    assert json.loads((tmp_path / "regime.csv.meta.json").read_text())["warmup_steps"] == 1
    capsys.readouterr()
    assert regime.main(["table", "--calibration", str(cal), "--runs", *runs, "--warmup", "-1",
                        "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "warm-up steps must be >= 0" in err
    assert regime.main(["shapes", "--calibration", str(cal), "--tokens", "1000", "--seq-len", "512"]) == 2
    assert "not a whole number" in capsys.readouterr().err
    assert regime.main(["shapes", "--calibration", str(cal), "--tokens", "4096"]) == 0
    assert "seq 512 x batch 8" in capsys.readouterr().out
