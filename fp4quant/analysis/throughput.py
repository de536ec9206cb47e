"""The throughput runs' tokens/s (throughput.csv) and the regime table (regime.tex).

Training runs measure convergence; throughput comes from short dedicated runs on the
emulated cluster, every component dilated (fp4quant.cluster), in a workload shape whose
step splits like the target's (fp4quant.perfmodel.regime).  Without the cluster (a real
one, or loopback) the training runs themselves are the throughput runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .collect import training
from .tables import _tex, _where, _write, number


def steady(run: str | Path, warmup: int) -> tuple[float, float]:
    """(tokens/s, mean step seconds) of a run's logged steps after the first ``warmup``."""
    if warmup < 0:
        raise ValueError(f"warm-up steps must be >= 0, got {warmup}")
    log = pd.read_json(Path(run) / "log.jsonl", lines=True)
    summary = json.loads((Path(run) / "summary.json").read_text())
    kept = log[log.step >= warmup]
    if not len(kept):
        raise ValueError(f"{run}: {len(log)} steps logged, none after the {warmup} warm-up steps")
    cfg = summary["provenance"]["config"]
    tokens = summary["mesh"]["dp"] * cfg["batch_size"] * cfg["seq_len"]
    return tokens * len(kept) / kept.step_time_s.sum(), kept.step_time_s.mean()


def network(run_dir: Path) -> str | None:
    """"emulated (N nodes, every component dilated xF)" for a run on the fully dilated cluster,
    else None (collect.network says what it ran on)."""
    record = run_dir / "cluster.json"
    if not record.exists():
        return None
    c = json.loads(record.read_text())
    d = c.get("dilation")
    if not c.get("emulated") or not d or not d.get("time_dilation"):
        return None
    if not (d.get("codec_bytes_per_s") and (d.get("latency_injected_s") or d.get("latency_shaped"))):
        return None  # the link alone was dilated (cluster run --link-only)
    return f"emulated ({c['nodes']} nodes, every component dilated x{d['time_dilation']:.0f})"


def throughput(run_dirs: list[str | Path], profile: str, warmup: int) -> pd.DataFrame:
    """One row per throughput run (collect.training's columns; tokens/s and step time over the
    steps after the first ``warmup``); the speedup is over the mean BF16 tokens/s of the runs
    (repeats of a throughput run are not paired)."""
    df = training(run_dirs, profile)
    rates = [steady(r, warmup) for r in df.run]
    df["tokens_per_s"] = [r[0] for r in rates]
    df["step_time_s"] = [r[1] for r in rates]
    df["warmup_steps"] = warmup
    labels = [network(Path(r)) for r in df.run]
    df["network"] = [lab or net for lab, net in zip(labels, df.network)]
    if df.network.nunique() > 1:  # a loopback fallback is not dilated: its tokens/s are on another scale
        first = df.groupby("network").run.first()
        raise ValueError("throughput runs on different networks: " + " vs ".join(
            f"{net} ({run})" for net, run in first.items()) + "; rerun them on one")
    bf16 = df[df.series == "bf16"].tokens_per_s
    df["speedup_vs_bf16"] = df.tokens_per_s / bf16.mean() if len(bf16) else float("nan")
    return df


def table(regime: pd.DataFrame, out, profile: str) -> None:
    """Each component's share of the step: target (projected), emulated (predicted, measured)."""
    components = [c.removesuffix("_share") for c in regime.columns if c.endswith("_share")]  # fp4quant.perfmodel.regime's
    rows = []
    for r in regime.itertuples():
        shares = []
        for c in components:
            s = number(100 * getattr(r, f"{c}_share"), ".0f")
            sd = getattr(r, f"{c}_share_sd")
            if r.source == "measured" and r.n > 1 and pd.notna(sd):
                s += f" $\\pm$ {number(100 * sd, '.0f')}"
            shares.append(s)
        where = "target" if r.source == "projected" else "emulated"
        rows.append([_tex(r.scenario), f"{where}, {r.source}" + (f" (n={r.n})" if r.source == "measured" else ""),
                     _tex(r.comm), f"{r.seq_len}x{r.batch_size}", number(r.step_s, ".3g")] + shares)
    emulated = regime[regime.source != "projected"]
    hardware = "; ".join(sorted(set(emulated.hardware.astype(str)))) if len(emulated) else "?"
    caption = ("The step's regime: each component's share (\\%) of a training step. Target: projected by the "
               "step model for Qwen-7B on H100 nodes (assumed figures, fp4quant.cluster.TargetCluster). Emulated: "
               "the tiny model's throughput runs on two emulated nodes of " + _tex(hardware) + ", every "
               "component dilated by one factor: predicted by the step model from the calibration, and measured "
               "by the trainer's timers (mean $\\pm$ SD of the share over n runs; latency: the slept per-hop "
               "latency of each wire step, bandwidth: the rest of the collectives' time, compute: the rest of the "
               "step). " + _where(regime, profile))
    _write(out, regime, profile, ["scenario", "source", "TP comm", "seq x batch", "step s"]
           + [f"{c} %" for c in components], rows, caption, "tab:regime")
