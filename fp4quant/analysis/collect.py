"""Gather run folders and benchmark CSVs into tidy result tables (one row per observation)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..format.config import PRESETS, QuantConfig
from ..train.train_config import run_name

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
    both, and its compute where not exact (fp4quant.train.train_config.run_name, e.g. fp4quant@fwd) --
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


def identical_bytes(name: str) -> bool:
    """Whether the preset ``name`` puts fp4quant's bytes on the wire: it differs from fp4quant only
    in how kernels store them (QuantConfig.packing), so its codec error and training are
    fp4quant's and only the kernels' speed can differ -- a kernel ablation, which trains nothing
    (naive_pack)."""
    if name not in PRESETS or name == "fp4quant":
        return False
    return QuantConfig.preset(name).replace(packing="warp") == QuantConfig.preset("fp4quant")


IDENTICAL_BYTES = "identical bytes"  # the change_unit of an ablation's training row that needs no run

# What the two kernels timed for fp4quant and naive_pack differ in, by where they ran.
PACKING_KERNELS = {
    "cpu": "nothing: the CPU kernels (csrc/cpu) never read QuantConfig.packing, so both presets run the same "
           "code and the ratio is an A/A control (its spread: the benchmark's noise)",
    "cuda": "how the codes are stored (QuantConfig.packing: warp-cooperative or naive stores, csrc/cuda)",
    "reference": "nothing: the pure-PyTorch reference ignores QuantConfig.packing (an A/A control)",
}


def differ_in(impl: str, device: str) -> str:
    """What the kernels of fp4quant and of naive packing differ in (PACKING_KERNELS), for the
    benchmark's rows of ``impl`` on ``device``."""
    return PACKING_KERNELS.get("reference" if impl == "reference" else str(device), "unknown")


def _kernel_rows(kernels: pd.DataFrame, op: str = "quantize") -> pd.DataFrame:
    """The kernel benchmark's rows of ``op`` that an ablation compares: the native kernels (the
    reference is timed too, fp4quant's quantize at the same sizes, as a baseline only), on all
    threads (as the runs use them)."""
    if not len(kernels) or "op" not in kernels:
        return kernels.iloc[:0]
    q = kernels[(kernels.op == op) & (kernels.impl.isin(["native", "reference"]))]
    if (q.impl == "native").any():
        q = q[q.impl == "native"]
    if "threads" in q and len(q):
        q = q[q.threads == q.threads.max()]
    return q


def ablation(name: str, error: pd.DataFrame, kernels: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One ablation against the full method: codec error, kernel speed, training -- one row each.

    The kernel row is quantize at the largest size on all threads; where the benchmark records
    its slowest and fastest runs, change_low and change_high bound the change (the ablated's
    slowest run against fp4quant's fastest, and the other way round).  An ablation that writes
    fp4quant's bytes (identical_bytes: naive_pack) and has no training runs gets one training row
    without numbers, change_unit "identical bytes": its runs would be fp4quant's."""
    rows = []
    presets = error[error.study == "presets"] if len(error) and "study" in error else error.iloc[:0]
    for kind, g in presets.groupby("kind"):
        ours, abl = g[g.config == "fp4quant"], g[g.config == name]
        if len(ours) and len(abl):
            rows.append({"ablation": name, "measure": f"sqnr_db/{kind}", "fp4quant": float(ours.sqnr_db.iloc[0]),
                         "ablated": float(abl.sqnr_db.iloc[0])})
    q = _kernel_rows(kernels)
    if len(q):
        size = q.size_bytes.max()
        at = q[q.size_bytes == size]
        a, b = at[at.preset == "fp4quant"], at[at.preset == name]
        if len(a) and len(b):
            a, b = a.iloc[0], b.iloc[0]
            row = {"ablation": name, "measure": f"quantize_gbps/{size}", "fp4quant": float(a.gbps),
                   "ablated": float(b.gbps)}
            if {"gbps_min", "gbps_max"} <= set(at) and pd.notna([a.gbps_min, a.gbps_max, b.gbps_min, b.gbps_max]).all():
                row.update(change_low=float(b.gbps_min / a.gbps_max - 1),
                           change_high=float(b.gbps_max / a.gbps_min - 1))
            if identical_bytes(name):  # on a CPU the same code: the change is the benchmark's noise
                row["kernels_differ_in"] = differ_in(a.impl, a.get("device", "cpu"))
            rows.append(row)
    trained = False
    if len(runs) and "series" in runs:
        seeds = set(runs[runs.series == "fp4quant"].seed) & set(runs[runs.series == name].seed)  # paired: same seeds
        for measure in ("final_loss", "val_loss", "tokens_per_s"):
            a = runs[(runs.series == "fp4quant") & runs.seed.isin(seeds)][measure]
            b = runs[(runs.series == name) & runs.seed.isin(seeds)][measure]
            if len(a) and len(b):
                trained = True
                # the seeds compared, and the SD of fp4quant's measure over all its seeds: the noise a
                # change of few seeds is read against (relative, as the change)
                every = runs[runs.series == "fp4quant"][measure]
                rows.append({"ablation": name, "measure": measure, "fp4quant": float(a.mean()),
                             "ablated": float(b.mean()), "seeds": len(seeds),
                             "fp4quant_seed_sd": float(every.std(ddof=1) / every.mean()) if len(every) > 1 else
                             float("nan")})
    if not trained and identical_bytes(name):
        rows.append({"ablation": name, "measure": "training", "fp4quant": float("nan"), "ablated": float("nan"),
                     "change_unit": IDENTICAL_BYTES})
    df = pd.DataFrame(rows)
    if not len(df):
        return df
    # SQNR is already a ratio in dB: its change is a difference in dB; the rest are relative
    in_db = df.measure.str.startswith("sqnr_db/")
    df["change"] = (df.ablated - df.fp4quant).where(in_db, df.ablated / df.fp4quant - 1)
    unit = in_db.map({True: "dB", False: "relative"})
    df["change_unit"] = df.change_unit.fillna(unit) if "change_unit" in df else unit
    late = [c for c in ("change_low", "change_high", "seeds", "fp4quant_seed_sd", "kernels_differ_in")
            if c in df]  # after the change
    df = df[[c for c in df if c not in late] + late]
    for key in PROVENANCE_COLUMNS:  # the training runs' hardware is the ablation's
        df[key] = runs[key].iloc[0] if key in runs and len(runs) else kernels[key].iloc[0]
    return df


PACKING_MEASURES = ("gbps", "gbps_min", "gbps_max", "iters", "fraction", "fraction_min", "fraction_max")


def packing(kernels: pd.DataFrame, name: str = "naive_pack") -> pd.DataFrame:
    """The kernel ablation of naive packing (ablation_naive_pack.csv): the kernel benchmark's rows
    of fp4quant (warp-cooperative packing) and of ``name`` (a preset that writes the same bytes
    with naive packing, see identical_bytes), side by side, one row per op, implementation, size
    and thread count, with the speed of fp4quant over the naive packing.

    speed_over_naive: fp4quant's median GB/s over the naive packing's (> 1: warp-cooperative
    packing is faster); speed_over_naive_low / _high: fp4quant's slowest run over the naive
    one's fastest, and fastest over slowest (the extremes the two spreads allow).
    paired_speed_over_naive (_low, _high): the same from the benchmark's paired fractions
    (fraction, fraction_min, fraction_max: each timed call against a copy timed beside it), so
    the memory's speed drifting between the two presets' measurements is taken out (both move
    the same bytes, so the ratio of fractions is a ratio of speeds).  What the benchmark did not
    record (older CSVs: no spread, fractions against one copy a size) is left out.
    kernels_differ_in: what the two kernels differ in where they ran (PACKING_KERNELS: on a CPU
    nothing, the same code runs for both)."""
    if not identical_bytes(name):
        raise ValueError(f"ablation {name}: not a preset that writes fp4quant's bytes with another packing")
    keys = [k for k in ("op", "impl", "device", "size_bytes", "numel", "threads") if k in kernels]
    measures = [m for m in PACKING_MEASURES if m in kernels]
    if "gbps" not in measures:
        raise ValueError(f"ablation {name}: the kernel benchmark's CSV has no gbps column")
    ours = kernels[kernels.preset == "fp4quant"]
    theirs = kernels[kernels.preset == name]
    if not len(ours) or not len(theirs):
        raise ValueError(f"ablation {name}: the kernel benchmark has no rows of "
                         f"{'fp4quant' if not len(ours) else name} (it measures every preset but bf16, "
                         "fp4quant.bench.kernels)")
    pair = ours[keys + measures].merge(theirs[keys + measures], on=keys, suffixes=("_fp4quant", f"_{name}"))
    if not len(pair):
        raise ValueError(f"ablation {name}: the kernel benchmark timed fp4quant and {name} at no common op, size "
                         "and thread count")
    df = pd.DataFrame({"profile": kernels.profile.iloc[0] if "profile" in kernels else "", "ablation": name},
                      index=pair.index)
    for k in keys:
        df[k] = pair[k]
    for preset in ("fp4quant", name):
        for m in measures:
            df[f"{preset}_{m}"] = pair[f"{m}_{preset}"]

    def ratio(measure: str, low: str, high: str, prefix: str) -> None:
        df[prefix] = df[f"fp4quant_{measure}"] / df[f"{name}_{measure}"]
        if {low, high} <= set(measures):
            df[f"{prefix}_low"] = df[f"fp4quant_{low}"] / df[f"{name}_{high}"]
            df[f"{prefix}_high"] = df[f"fp4quant_{high}"] / df[f"{name}_{low}"]

    ratio("gbps", "gbps_min", "gbps_max", "speed_over_naive")
    if {"fraction", "fraction_min", "fraction_max"} <= set(measures):  # CSVs of the paired copies (before: one
        ratio("fraction", "fraction_min", "fraction_max", "paired_speed_over_naive")  # limit a size, no spread)
    df["kernels_differ_in"] = [differ_in(i, d) for i, d in zip(pair.impl, pair.device if "device" in pair else
                                                               ["cpu"] * len(pair))]
    for key in (*PROVENANCE_COLUMNS, "cpu_isa"):
        if key in kernels:
            df[key] = ours[key].iloc[0]
    rank = df.op.map({op: i for i, op in enumerate(("quantize", "dequantize", "dequantize_reduce"))}).fillna(3)
    by = [k for k in ("threads", "size_bytes") if k in df]
    return df.assign(_rank=rank).sort_values([*by, "_rank"]).drop(columns="_rank").reset_index(drop=True)


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
