"""Gather run folders and benchmark CSVs into tidy result tables (one row per observation)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..train.config import run_name

PROVENANCE_COLUMNS = ("hardware", "commit", "torch")


def training(run_dirs: list[str | Path], profile: str) -> pd.DataFrame:
    """One row per training run, from its summary.json."""
    rows = []
    for d in map(Path, run_dirs):
        s = json.loads((d / "summary.json").read_text())
        cfg = s["provenance"]["config"]
        rows.append({
            "network": network(d),
            "profile": profile, "run": str(d), "model": cfg["model"], "comm": cfg["comm"],
            "compute": cfg.get("compute", "exact"), "series": series(s), "compress": cfg["compress"],
            "seed": cfg["seed"], "tp": s["mesh"]["tp"], "dp": s["mesh"]["dp"], "world": s["mesh"]["world"],
            "backend": s["mesh"]["backend"], "device": s["mesh"]["device"], "steps": s["steps"],
            "seq_len": cfg["seq_len"], "batch_size": cfg["batch_size"],
            "final_loss": s["final_loss"], "val_loss": s["val_loss"], "tokens_per_s": s["tokens_per_s"],
            "step_time_s": s["step_time_s"], "fwd_bytes_sent": s["fwd_bytes_sent"], "bwd_bytes_sent": s["bwd_bytes_sent"],
            "bytes_uncompressed": s["bytes_uncompressed"],
            **{k: s["provenance"][k] for k in PROVENANCE_COLUMNS},
        })
    df = pd.DataFrame(rows)
    # over BF16 communication with exact compute, seed by seed
    base = df[df.series == "bf16"].groupby("seed").tokens_per_s.mean() if len(df) else pd.Series(dtype=float)
    df["speedup_vs_bf16"] = [r.tokens_per_s / base[r.seed] if r.seed in base.index else float("nan")
                             for r in df.itertuples()]
    return df.sort_values(["series", "seed"]).reset_index(drop=True)


def series(summary: dict) -> str:
    """What a run is compared as: its TP communication, the directions it compresses where not
    both, and its compute where not exact (fp4quant.train.config.run_name, e.g. fp4quant@fwd) --
    as the trainer labelled it by what its wire carried (exact at TP = 1, whatever --comm said)."""
    label = (summary.get("comm") or {}).get("label")
    if label:
        return label
    cfg = summary["provenance"]["config"]  # a summary written before runs were labelled
    return run_name(cfg["comm"], cfg.get("compress", "both"), cfg.get("compute", "exact"))


def network(run_dir: Path) -> str:
    """What connected the run's ranks: an emulated cluster's link, or loopback (and why)."""
    return network_of_record(run_dir / "cluster.json")


def network_of_record(record: str | Path | None) -> str:
    """The network a cluster record (fp4quant.cluster run --record) describes; loopback without one."""
    if record is None or not Path(record).exists():
        return "loopback"
    c = json.loads(Path(record).read_text())
    if not c["emulated"]:
        return f"loopback (emulated cluster unavailable: {c['reason']})"
    injected = (c.get("dilation") or {}).get("latency_injected_s")
    if c.get("latency_shaped"):
        latency = f", {c['link_latency_ms']:.0f} ms"
    elif injected:  # slept per wire step by the collectives (the kernel has no netem)
        latency = f", {injected * 1e3:.0f} ms latency injected per wire step"
    else:
        latency = ", latency not shaped"
    return f"emulated {c['nodes']} nodes, {c['link_rate_mbit']:.0f} Mbit/s links{latency}"


def curves(run_dirs: list[str | Path], profile: str) -> pd.DataFrame:
    """Every logged step of every run: the loss curves."""
    frames = []
    for d in map(Path, run_dirs):
        summary = json.loads((d / "summary.json").read_text())
        prov = summary["provenance"]
        cfg = prov["config"]
        log = pd.read_json(d / "log.jsonl", lines=True)
        log = log[["step", "loss", "lr", "tokens_per_s", "step_time_s"]].assign(
            profile=profile, comm=cfg["comm"], series=series(summary), seed=cfg["seed"], model=cfg["model"], run=str(d),
            **{k: prov[k] for k in PROVENANCE_COLUMNS})
        frames.append(log)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def benchmark(csv: str | Path, profile: str) -> pd.DataFrame:
    """A benchmark's CSV with the profile added."""
    return pd.read_csv(csv).assign(profile=profile)


def ablation(name: str, error: pd.DataFrame, kernels: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One ablation against the full method: codec error, kernel speed, training -- one row each."""
    rows = []
    presets = error[error.study == "presets"]
    for kind, g in presets.groupby("kind"):
        ours, abl = g[g.config == "fp4quant"], g[g.config == name]
        rows.append({"ablation": name, "measure": f"sqnr_db/{kind}", "fp4quant": float(ours.sqnr_db.iloc[0]),
                     "ablated": float(abl.sqnr_db.iloc[0])})
    q = kernels[(kernels.op == "quantize") & (kernels.impl.isin(["native", "reference"]))]
    if (q.impl == "native").any():  # the reference is timed too (at the same sizes), as a baseline only
        q = q[q.impl == "native"]
    if "threads" in q and len(q):  # all threads, as the runs use them
        q = q[q.threads == q.threads.max()]
    if len(q):
        size = q.size_bytes.max()
        at = q[q.size_bytes == size]
        for preset_row in (("fp4quant", name),):
            a, b = at[at.preset == preset_row[0]], at[at.preset == preset_row[1]]
            if len(a) and len(b):
                rows.append({"ablation": name, "measure": f"quantize_gbps/{size}", "fp4quant": float(a.gbps.iloc[0]),
                             "ablated": float(b.gbps.iloc[0])})
    seeds = set(runs[runs.series == "fp4quant"].seed) & set(runs[runs.series == name].seed)  # paired: same seeds
    for measure in ("final_loss", "val_loss", "tokens_per_s"):
        a = runs[(runs.series == "fp4quant") & runs.seed.isin(seeds)][measure]
        b = runs[(runs.series == name) & runs.seed.isin(seeds)][measure]
        if len(a) and len(b):
            rows.append({"ablation": name, "measure": measure, "fp4quant": float(a.mean()), "ablated": float(b.mean())})
    df = pd.DataFrame(rows)
    # SQNR is already a ratio in dB: its change is a difference in dB; the rest are relative
    in_db = df.measure.str.startswith("sqnr_db/")
    df["change"] = (df.ablated - df.fp4quant).where(in_db, df.ablated / df.fp4quant - 1)
    df["change_unit"] = in_db.map({True: "dB", False: "relative"})
    for key in PROVENANCE_COLUMNS:  # the training runs' hardware is the ablation's
        df[key] = runs[key].iloc[0] if key in runs and len(runs) else kernels[key].iloc[0]
    return df


BREAKDOWN_PARTS = ("compute", "quantize", "wire", "dequantize")  # stacked bottom to top


def breakdown(run_dirs: list[str | Path], profile: str, warmup: int) -> pd.DataFrame:
    """Every steady step of every run split by the trainer's timers (both directions summed):
    quantize, dequantize (the codec's two timers), wire (communication: issuing and waiting
    for the collectives) and compute (the rest of the step).  The first ``warmup`` steps of
    each run are left out (as of its tokens/s).  Logs without the split codec timers
    (written before them) have no rows."""
    rows = []
    for d in map(Path, run_dirs):
        summary = json.loads((d / "summary.json").read_text())
        prov = summary["provenance"]
        cfg = prov["config"]
        log = [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines() if line.strip()]
        if not log or "fwd_codec_s" not in log[0]:
            continue
        for r in log[warmup:]:
            part = {k: sum(r.get(f"{x}_{k}_s", 0.0) for x in ("fwd", "bwd")) for k in ("quantize", "dequantize", "comm")}
            seconds = {"quantize": part["quantize"], "dequantize": part["dequantize"], "wire": part["comm"],
                       "compute": r["step_time_s"] - part["quantize"] - part["dequantize"] - part["comm"]}
            for name in BREAKDOWN_PARTS:
                rows.append({"profile": profile, "run": str(d), "series": series(summary), "comm": cfg["comm"],
                             "seed": cfg["seed"], "model": cfg["model"], "network": network(d), "step": r["step"],
                             "part": name, "seconds": seconds[name], **{k: prov[k] for k in PROVENANCE_COLUMNS}})
    return pd.DataFrame(rows)
