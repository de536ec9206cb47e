"""The throughput runs' table (throughput.csv) and the regime table (regime.tex)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis import tables, throughput
from fp4quant.models.model_config import ModelConfig

COMPONENTS = ("compute", "codec", "bandwidth", "latency")
ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def write_run(folder: Path, comm: str, seed: int, step_times, cluster: dict | None = None) -> Path:
    """A run folder as the trainer (and the cluster runner, ``cluster``) writes it."""
    folder.mkdir(parents=True)
    cfg = {"comm": comm, "seed": seed, "seq_len": 512, "batch_size": 8, "model": "tiny", "compress": "both"}
    summary = {"provenance": {**ORIGIN, "config": cfg}, "model": ModelConfig.preset("tiny").to_dict(),
               "mesh": {"world": 2, "tp": 2, "dp": 1, "backend": "gloo", "device": "cpu"}, "steps": len(step_times),
               "final_loss": 5.0, "val_loss": None, "tokens_per_s": 4096 * len(step_times) / sum(step_times),
               "step_time_s": sum(step_times) / len(step_times), "fwd_bytes_sent": 1, "bwd_bytes_sent": 1,
               "bytes_uncompressed": 4, "comm": {"dilation": {"latency_s": 0.1}}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "log.jsonl").write_text("".join(json.dumps({"step": i, "step_time_s": t}) + "\n"
                                              for i, t in enumerate(step_times)))
    if cluster is not None:
        (folder / "cluster.json").write_text(json.dumps({**ORIGIN, **cluster}))
    return folder


DILATED = {"emulated": True, "nodes": 2, "link_rate_mbit": 60.0, "link_latency_ms": 66.5, "latency_shaped": False,
           "dilation": {"time_dilation": 6650.0, "latency_shaped": False, "latency_injected_s": 0.0665,
                        "codec_bytes_per_s": 3.5e8}}


def test_throughput_leaves_out_the_warmup_and_compares_with_the_mean_bf16(tmp_path):
    runs = [write_run(tmp_path / f"{c}{s}", c, s, [60.0, t * (1 + 0.1 * s), t * (1 + 0.1 * s)], DILATED)
            for c, t in (("bf16", 8.0), ("fp4quant", 4.0)) for s in range(3)]
    df = throughput.throughput(runs, "cpu", warmup=1)
    bf16, fp4 = df[df.comm == "bf16"], df[df.comm == "fp4quant"]
    assert list(bf16.tokens_per_s) == pytest.approx([4096 / (8.0 * (1 + 0.1 * s)) for s in range(3)])
    assert list(bf16.step_time_s) == pytest.approx([8.0, 8.8, 9.6])
    assert fp4.speedup_vs_bf16.mean() == pytest.approx(fp4.tokens_per_s.mean() / bf16.tokens_per_s.mean())
    assert set(df.network) == {"emulated (2 nodes, every component dilated x6650)"}
    assert set(df.warmup_steps) == {1}
    with pytest.raises(ValueError, match="none after the 3 warm-up steps"):
        throughput.throughput(runs, "cpu", warmup=3)


def test_the_network_label_says_what_was_dilated(tmp_path):
    link_only = {**DILATED, "dilation": {**DILATED["dilation"], "codec_bytes_per_s": 0.0, "latency_injected_s": 0.0}}
    loopback = {"emulated": False, "reason": "no root", "nodes": 2, "dilation": None}
    labels = [throughput.network(write_run(tmp_path / name, "bf16", 0, [1.0], c))
              for name, c in (("full", DILATED), ("link", link_only), ("loop", loopback))]
    assert labels[0] == "emulated (2 nodes, every component dilated x6650)" and labels[1:] == [None, None]
    df = throughput.throughput([tmp_path / "loop"], "cpu", warmup=0)
    assert df.network.iloc[0] == "loopback (emulated cluster unavailable: no root)"
    with pytest.raises(ValueError, match=r"throughput runs on different networks: .*full.* vs loopback .*loop"):
        throughput.throughput([tmp_path / "full", tmp_path / "loop"], "cpu", warmup=0)  # not averaged together


def regime_frame() -> pd.DataFrame:
    rows = []
    for scenario, source, comm, n, sd in (("H100, Qwen-7B, TP=16 across two nodes", "projected", "bf16", 1, ""),
                                          ("emulated, tiny model", "predicted", "bf16", 1, ""),
                                          ("emulated, tiny model", "measured", "bf16", 3, 0.02)):
        shares = dict(zip(COMPONENTS, (0.11, 0.0, 0.6, 0.29)))
        rows.append({**ORIGIN, "scenario": scenario, "source": source, "comm": comm, "seq_len": 512, "batch_size": 8,
                     "n": n, "step_s": 12.345, **{f"{c}_share": v for c, v in shares.items()},
                     **{f"{c}_share_sd": sd for c in COMPONENTS}})
    df = pd.DataFrame(rows)
    df.loc[0, "hardware"] = "H100 (assumed)"
    return df


def test_regime_table_states_each_share_and_its_spread(tmp_path):
    out = tmp_path / "regime.tex"
    throughput.table(regime_frame(), out, "cpu")
    tex = out.read_text()
    body = [[c.strip() for c in line.rstrip("\\ ").split("&")] for line in tex.split("\\hline")[2].strip().splitlines()]
    assert body[0][1] == "target, projected" and body[0][5:] == ["11", "0", "60", "29"]
    assert body[1][1] == "emulated, predicted" and body[1][4] == tables.number(12.345, ".3g")
    assert body[2][1] == "emulated, measured (n=3)" and body[2][5] == "11 $\\pm$ 2"
    assert "compute \\% & codec \\% & bandwidth \\% & latency \\%" in tex
    assert "projected by the step model" in tex and "AMD EPYC, 2 cores (CPU)" in tex and "measured" in tex
