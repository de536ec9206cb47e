"""The alpha-beta step model."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.cluster.calibrate import TargetCluster
from fp4quant.models import ModelConfig
from fp4quant.perfmodel import Machine, Workload, allreduce_time, fit_alpha_beta, fit_link, step
from fp4quant.perfmodel import machines
from fp4quant.perfmodel.model import FORWARD_SHARE, shaped_allreduces
from fp4quant.perfmodel.__main__ import main as perfmodel_main

RATES = {"fp4quant": {"quantize": 1e9, "dequantize_reduce": 1e9, "dequantize": 1e9}}


def machine(**kw) -> Machine:
    base = dict(name="m", rank_flops=1e12, inter_bw=1e9, inter_latency=1e-5, intra_bw=1e11, intra_latency=1e-6,
                ranks_per_node=1, codec_values_per_s=RATES)
    return Machine(**{**base, **kw})


def test_allreduce_time_is_ring_alpha_beta():
    assert allreduce_time(1e6, 1, 1e9, 1e-5) == 0
    assert allreduce_time(1e6, 2, 1e9, 1e-5) == pytest.approx(1e6 / 1e9 + 2e-5)
    assert allreduce_time(1e6, 8, 1e9, 0) == pytest.approx(2 * 7 / 8 * 1e-3)


def test_step_counts_two_all_reduces_per_layer_each_way():
    w = Workload(ModelConfig.preset("tiny"), 2, 128, 2)
    s = step(w, machine(inter_latency=0.0), "bf16")
    values = 256 * 256
    assert s.comm_s == pytest.approx(2 * (2 * 4 + 1) * values * 2 / 1e9)
    assert s.codec_s == 0 and s.wire_bytes == pytest.approx(2 * 9 * values * 2)  # 2 (W-1)/W = 1 at W = 2


def test_compression_pays_when_communication_dominates_and_not_otherwise():
    w = Workload(ModelConfig.preset("tiny"), 2, 128, 2)
    slow = machine(inter_bw=1e7)
    assert step(w, slow, "fp4quant").tokens_per_s > 2 * step(w, slow, "bf16").tokens_per_s
    fast = machine(inter_bw=1e12, inter_latency=0.0, codec_values_per_s={"fp4quant": {k: 1e7 for k in RATES["fp4quant"]}})
    assert step(w, fast, "fp4quant").tokens_per_s < step(w, fast, "bf16").tokens_per_s
    inside = machine(ranks_per_node=8)  # TP inside a node uses the node's links
    assert step(w, inside, "bf16").comm_s < step(w, machine(), "bf16").comm_s


def test_fit_recovers_alpha_and_bandwidth():
    sizes = [1e4, 1e5, 1e6, 1e7]
    lat = [allreduce_time(s, 2, 5e8, 3e-4) for s in sizes]
    alpha, bw = fit_alpha_beta(sizes, lat, 2)
    assert alpha == pytest.approx(3e-4, rel=1e-6) and bw == pytest.approx(5e8, rel=1e-6)
    with pytest.raises(ValueError, match="do not grow with message size"):  # noise, not a negative bandwidth
        fit_alpha_beta([4096, 8192], [2e-3, 1e-3], 2)


def test_link_fit_takes_latency_from_a_message_inside_the_burst():
    """Token-bucket link: the smallest message rides on the burst (all overhead); the large
    ones set the bandwidth.  3 % noise on second-long messages must not move the latency."""
    bw, alpha, burst = 7.6e6, 3e-4, 131072
    sizes = [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    clean = [2 * alpha if s <= burst else allreduce_time(s, 2, bw, alpha) for s in sizes]
    for noise in ([1, 1, 1, 1.03, 0.97], [1, 1, 1, 0.97, 1.03]):
        fitted_alpha, fitted_bw = fit_link(sizes, [t * n for t, n in zip(clean, noise)], 2, burst)
        assert fitted_alpha == pytest.approx(alpha, rel=1e-9)
        assert fitted_bw == pytest.approx(bw, rel=0.06)
    # without a message inside the burst (or on a real link) it is the least-squares fit
    assert fit_link(sizes[2:], clean[2:], 2, burst) == pytest.approx(fit_alpha_beta(sizes[2:], clean[2:], 2))
    assert fit_link(sizes, clean, 2, 0.0) == pytest.approx(fit_alpha_beta(sizes, clean, 2))
    with pytest.raises(ValueError, match="at least two"):
        fit_link([4096], [1e-3], 2, burst)


def test_h100_projection_in_the_papers_regime():
    w8 = Workload(ModelConfig.preset("qwen-7b"), 8, 2048, 1)
    w16 = Workload(ModelConfig.preset("qwen-7b"), 16, 2048, 1)
    m8, m16 = machines.h100(8, TargetCluster()), machines.h100(16, TargetCluster())
    sp8 = step(w8, m8, "fp4quant").tokens_per_s / step(w8, m8, "bf16").tokens_per_s
    sp16 = step(w16, m16, "fp4quant").tokens_per_s / step(w16, m16, "bf16").tokens_per_s
    assert 1.0 < sp8 < sp16  # inter-node TP gains more: the slow links dominate
    assert 1.2 < sp16 < 3.0


def test_the_assumed_h100_reduce_reads_every_ranks_message_for_each_shard_value():
    target = TargetCluster()
    bw = machines.H100_CODEC_EFFICIENCY * target.hbm_bw
    for tp in (2, 8, 16):
        w = Workload(ModelConfig.preset("qwen-7b"), tp, 2048, 1)
        values = w.tokens * w.model.hidden_size
        s = step(w, machines.h100(tp, target), "fp4quant")
        per_call = (values * (2 + machines.MESSAGE_BYTES_PER_VALUE) / bw  # dequantize: BF16 out, a message in
                    + values / tp * (tp + 1) * machines.MESSAGE_BYTES_PER_VALUE / bw)  # W messages in, one out
        assert s.dequantize_s == pytest.approx(2 * w.messages_per_direction * per_call)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        machines.h100_codec(target, 1)


def cli_inputs(tmp_path, shapes=(("bf16", 800.0, 128), ("fp4quant", 1700.0, 128))):
    """A calibration, an uncompressed all-reduce benchmark and one run folder per (comm, tokens/s,
    sequence length): the perfmodel CLI's arguments but --out."""
    cal = {"target": vars(TargetCluster()), "rank_flops": 5e10, "link_rate_bps": 6e7, "link_latency_s": 0.06,
           "time_dilation": 8000, "message_values": 65536,
           "codec_gbps": {"fp4quant": {"quantize": 4.0, "dequantize_reduce": 4.0, "dequantize": 6.0}}}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    pd.DataFrame({"config": ["none"] * 3, "algorithm": ["uncompressed"] * 3, "world_size": [2] * 3,
                  "size_bytes": [1e4, 1e5, 1e6], "latency_s": [allreduce_time(s, 2, 7.5e6, 1e-3) for s in (1e4, 1e5, 1e6)]}
                 ).to_csv(tmp_path / "coll.csv", index=False)
    runs = []
    for i, (comm, tps, seq_len) in enumerate(shapes):
        d = tmp_path / f"run{i}-{comm}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({
            "provenance": {"config": {"comm": comm, "seq_len": seq_len, "batch_size": 2}},
            "model": ModelConfig.preset("tiny").to_dict(), "mesh": {"tp": 2, "dp": 1}, "tokens_per_s": tps}))
        runs.append(str(d))
    return ["--calibration", str(tmp_path / "cal.json"), "--collectives", str(tmp_path / "coll.csv"), "--runs", *runs]


def test_cli_validates_and_projects(tmp_path):
    out = tmp_path / "proj.csv"
    assert perfmodel_main([*cli_inputs(tmp_path), "--out", str(out)]) == 0
    df = pd.read_csv(out)
    emu = df[df.scenario.str.startswith("emulated")].set_index("comm")
    assert emu.loc["fp4quant", "measured_tokens_per_s"] == 1700.0
    assert emu.loc["fp4quant", "error"] == pytest.approx(emu.loc["fp4quant", "predicted_tokens_per_s"] / 1700 - 1)
    assert set(df.scenario) >= {"H100, Qwen-7B, TP=8 in one node", "H100, Qwen-7B, TP=16 across two nodes"}
    assert (out.parent / "proj.csv.meta.json").exists()


def test_cli_refuses_runs_of_two_workloads_in_one_line(tmp_path, capsys):
    """Runs of two shapes gave a "measured speedup" of two workloads, labelled with the last."""
    out = tmp_path / "proj.csv"
    shapes = (("bf16", 800.0, 128), ("fp4quant", 1700.0, 512))
    assert perfmodel_main([*cli_inputs(tmp_path, shapes), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"differ in seq_len: the runs compared must train one workload", err[0]), err
    assert not out.exists()


def test_cli_reads_a_presets_seeds_as_repeats_median_and_range(tmp_path):
    """Three seeds of each preset: the median tokens/s with its range, not the last run's."""
    shapes = [(c, t, 128) for c, ts in (("bf16", (800.0, 700.0, 900.0)), ("fp4quant", (1700.0, 1500.0, 1600.0)))
              for t in ts]
    out = tmp_path / "proj.csv"
    assert perfmodel_main([*cli_inputs(tmp_path, shapes), "--out", str(out)]) == 0
    emu = pd.read_csv(out).query("scenario.str.startswith('emulated')", engine="python").set_index("comm")
    assert list(emu.loc["fp4quant", ["measured_tokens_per_s", "measured_tokens_per_s_min",
                                     "measured_tokens_per_s_max", "measured_runs"]]) == [1600.0, 1500.0, 1700.0, 3]
    assert emu.loc["fp4quant", "measured_speedup"] == pytest.approx(1600 / 800)


def test_cli_leaves_the_warmup_out_of_the_measured_tokens_per_s(tmp_path):
    """--warmup: the runs' tokens/s over the steps after the warm-up, as the throughput table counts
    them (the trainer's own figure keeps a slow first step in)."""
    args = cli_inputs(tmp_path)
    for i, run in enumerate(args[args.index("--runs") + 1:]):
        summary = json.loads((Path(run) / "summary.json").read_text())
        summary.update(steps=4)
        summary["provenance"]["config"].update(seq_len=128, batch_size=2)
        (Path(run) / "summary.json").write_text(json.dumps(summary))
        (Path(run) / "log.jsonl").write_text("".join(json.dumps({"step": k, "step_time_s": 60.0 if k == 0 else 1.0 + i})
                                                     + "\n" for k in range(4)))
    out = tmp_path / "proj.csv"
    assert perfmodel_main([*args, "--warmup", "1", "--out", str(out)]) == 0
    emu = pd.read_csv(out).query("scenario.str.startswith('emulated')", engine="python").set_index("comm")
    assert emu.loc["bf16", "measured_tokens_per_s"] == pytest.approx(256 / 1.0)  # 128 x 2 tokens a step
    assert emu.loc["fp4quant", "measured_tokens_per_s"] == pytest.approx(256 / 2.0)


def test_cli_names_a_missing_run_in_one_line(tmp_path, capsys):
    args = cli_inputs(tmp_path)
    assert perfmodel_main([*args, str(tmp_path / "gone"), "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gone/summary.json" in err[0], err


def test_token_bucket_credit_only_helps_messages_and_is_capped():
    w = Workload(ModelConfig.preset("tiny"), 2, 128, 2)
    plain = step(w, machine(inter_bw=1e7, inter_latency=0.0), "bf16")
    bucket = step(w, machine(inter_bw=1e7, inter_latency=0.0, burst_bytes=1e4), "bf16")
    # bf16 has no codec: each direction starts with a full bucket, then it refills only in the
    # compute since the last all-reduce of its direction (a third of the step's compute forward,
    # two thirds backward); the second phase follows the first at once and gets nothing (the
    # 64 KiB first phase drains the bucket)
    n = w.messages_per_direction
    credit = sum(1e4 + (n - 1) * min(1e4, 1e7 * plain.compute_s * share / n) for share in (FORWARD_SHARE, 1 - FORWARD_SHARE))
    assert bucket.comm_s == pytest.approx(plain.comm_s - credit / 1e7)
    huge = step(w, machine(inter_bw=1e7, inter_latency=0.0, burst_bytes=1e12), "bf16")
    assert huge.comm_s == 0.0 and huge.compute_s == plain.compute_s


def test_shaped_allreduces_follow_one_bucket_through_the_phases():
    # no bucket: the alpha-beta all-reduce, count times
    assert shaped_allreduces(5, 1e5, 2, 1e6, 1e-3, 0.0, 0.01, 0.001, 0.001) == pytest.approx(5 * allreduce_time(1e5, 2, 1e6, 1e-3))
    assert shaped_allreduces(5, 1e5, 1, 1e6, 1e-3, 1e4, 0.0, 0.0, 0.0) == 0.0
    # phases of 400 bytes, a 1000-byte bucket, no idle time: what a phase leaves carries on
    # (1000 -> 600 -> 200 free, then 200 of 400 paid, then everything paid)
    got = [shaped_allreduces(k, 800, 2, 1e6, 0.0, 1000, 0.0, 0.0, 0.0) for k in (1, 2, 3)]
    assert got == pytest.approx([0.0, 600 / 1e6, 1400 / 1e6])
    # the latency and the idle gaps refill it, never above its depth
    assert shaped_allreduces(3, 800, 2, 1e6, 4e-4, 1000, 0.0, 0.0, 0.0) == pytest.approx(3 * 2 * 4e-4)
    assert shaped_allreduces(3, 800, 2, 1e6, 0.0, 1000, 1.0, 0.0, 0.0) == pytest.approx(0.0)
    assert shaped_allreduces(3, 4000, 2, 1e6, 0.0, 1000, 1.0, 1.0, 1.0) == pytest.approx(3 * 2 * 1000 / 1e6)


@pytest.mark.parametrize("change, message", [
    ({"inter_bw": -50e9}, "inter_bw must be positive and finite"),
    ({"inter_bw": float("nan")}, "inter_bw must be positive and finite"),
    ({"inter_bw": 0.0}, "inter_bw must be positive and finite"),
    ({"intra_latency": -1e-6}, "intra_latency must be at least 0"),
    ({"ranks_per_node": 0}, "ranks_per_node must be at least 1"),
])
def test_an_impossible_machine_is_refused_not_modelled(change, message):
    """A negative, zero or NaN bandwidth gave a negative, infinite or NaN tokens/s."""
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(machines.h100(8), **change)


def test_an_impossible_workload_is_refused_not_modelled():
    qwen = ModelConfig.preset("qwen-7b")
    for tp in (0, -4):
        with pytest.raises(ValueError, match="tp must be at least 1"):
            Workload(qwen, tp, 2048, 1)
    with pytest.raises(ValueError, match="TP 12 does not fill whole nodes of 8 ranks"):
        step(Workload(qwen, 12, 2048, 1), machines.h100(12), "fp4quant")
