"""Validate the step model on the emulated cluster's runs and project to H100 clusters.

    python -m fp4quant.perfmodel --calibration CAL.json --collectives EMULATED.csv \
        --runs RUN_DIR ... [--gpu-kernels kernels_cuda.csv] --out projection.csv

Rows: scenario, TP communication, predicted tokens/s (and its compute / communication /
codec split), measured tokens/s and the model's error where a run exists, and the
speedup over BF16.  <out>.meta.json holds every assumption.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ..cluster.calibrate import TargetCluster
from ..models.model_config import ModelConfig
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from . import machines
from .model import Workload, step
from .regime import read_run

PAPER_SPEEDUP = 1.56  # Qwen-7B, H100 nodes, FP4Quant over BF16 (the paper's headline)
PROJECTIONS = [("H100, Qwen-7B, TP=8 in one node", 8), ("H100, Qwen-7B, TP=16 across two nodes", 16)]


def rows_for(scenario: str, w: Workload, m, presets, measured: dict[str, list[float]]) -> list[dict]:
    """A row per preset: the model's step, and where runs were measured the median of their
    tokens/s with its range over them (the seeds) and the model's error against the median."""
    rows, base = [], None
    med = {p: statistics.median(v) for p, v in measured.items()}
    for preset in presets:
        s = step(w, m, preset)
        base = s.tokens_per_s if preset == "bf16" else base
        meas = med.get(preset)
        rows.append({
            "scenario": scenario, "comm": preset, "hidden_size": w.model.hidden_size, "layers": w.model.num_layers,
            "tp": w.tp, "seq_len": w.seq_len, "batch_size": w.batch_size,
            "predicted_tokens_per_s": s.tokens_per_s, "compute_s": s.compute_s, "comm_s": s.comm_s,
            "codec_s": s.codec_s, "wire_bytes_per_step": s.wire_bytes,
            "measured_tokens_per_s": meas if meas is not None else "",
            "measured_tokens_per_s_min": min(measured[preset]) if meas is not None else "",
            "measured_tokens_per_s_max": max(measured[preset]) if meas is not None else "",
            "measured_runs": len(measured.get(preset, [])),
            "error": (s.tokens_per_s / meas - 1) if meas else "",
            "predicted_speedup": s.tokens_per_s / base if base else "",
        })
    if "bf16" in med:
        for r in rows:
            if r["comm"] in med:
                r["measured_speedup"] = med[r["comm"]] / med["bf16"]
    return rows


def measured_runs(run_dirs: list[str], warmup: int | None = None) -> tuple[Workload, dict[str, list[float]]]:
    """The one workload the emulated cluster's runs trained, and the tokens/s of each preset's runs
    (its seeds: repeats; over the steps after the first ``warmup``, as the throughput table counts
    them, or the trainer's own figure without it); a ValueError naming two runs that differ in
    shape (a speedup of two workloads would be no measurement)."""
    measured, workloads = {}, []
    for d in map(Path, run_dirs):
        s = json.loads((d / "summary.json").read_text())
        cfg = s["provenance"]["config"]
        rate = s["tokens_per_s"] if warmup is None else read_run(d, warmup)["tokens_per_s"]
        measured.setdefault(cfg["comm"], []).append(float(rate))
        workloads.append((Workload(ModelConfig(**s["model"]), s["mesh"]["tp"], cfg["seq_len"], cfg["batch_size"],
                                   s["mesh"]["dp"]), d))
    (first, a), *rest = workloads
    for w, b in rest:
        if w != first:
            diff = [f for f in ("tp", "seq_len", "batch_size", "dp", "model") if getattr(w, f) != getattr(first, f)]
            raise ValueError(f"runs {a} and {b} differ in {', '.join(diff)}: the runs compared must train one workload")
    return first, measured


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--collectives", required=True, help="collective benchmark CSV measured on the emulated cluster")
    ap.add_argument("--runs", nargs="+", required=True, help="training runs on the emulated cluster")
    ap.add_argument("--gpu-kernels", default=None, help="CUDA kernel benchmark CSV (else assumed codec rates)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="leave the runs' first N steps out of their measured tokens/s (default: the trainer's figure)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:  # everything read and checked before anything is written
        cal = json.loads(Path(a.calibration).read_text())
        target = TargetCluster(**cal["target"])
        emu, fit = machines.emulated(cal, a.collectives)
        workload, measured = measured_runs(a.runs, a.warmup)
        presets = ["bf16"] + [p for p in measured if p != "bf16"]
        rows = rows_for("emulated cluster (validation)", workload, emu, presets, measured)
        for name, tp in PROJECTIONS:
            w = Workload(ModelConfig.preset("qwen-7b"), tp, 2048, 1)
            gpu = machines.h100(tp, target, a.gpu_kernels)
            rows += rows_for(name, w, gpu, ["bf16", "fp4quant"], {})
    except (OSError, KeyError, TypeError, ValueError, IndexError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"python -m fp4quant.perfmodel: error: {what}", file=sys.stderr)
        return 2
    prov = provenance()
    for r in rows:
        r["hardware"] = prov["hardware"] if r["scenario"].startswith("emulated") else gpu.name
        r["commit"], r["torch"] = prov["commit"], prov["torch"]
    atomic_write_csv(a.out, rows)
    meta = provenance(calibration=cal, emulated_fit=fit, h100=dataclasses.asdict(gpu), paper_speedup=PAPER_SPEEDUP)
    atomic_write_json(a.out + ".meta.json", meta)
    for r in rows:
        err = f", error {100 * r['error']:+.1f}%" if r["error"] != "" else ""
        print(f"{r['scenario']}: {r['comm']}: {r['predicted_tokens_per_s']:.1f} tokens/s predicted{err}, "
              f"speedup {r['predicted_speedup']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
