"""How the projected H100 speedup moves with each assumption behind it.

    python -m fp4quant.perfmodel.sensitivity --out projection_sensitivity.csv

The projection (``python -m fp4quant.perfmodel``) rests on stated figures for hardware no
one here has measured: the inter-node bandwidth per GPU, the per-hop latency, the codec's
share of the HBM bandwidth, the sustained compute and whether communication overlaps
compute.  This sweeps the full grid of them for Qwen-7B at TP=8 in one node and TP=16
across two, and writes one row per (scenario, grid point): FP4Quant's and BF16's modelled
tokens/s and the speedup.  Every figure here is *projected* by the step model
(fp4quant.perfmodel.model), none is measured.

The latency swept is that of the link the TP group's all-reduces cross: NVLink inside a
node at TP=8, InfiniBand across nodes at TP=16.  The inter-node bandwidth moves only TP=16.
The baseline point is the projection's: TargetCluster's figures, the assumed codec
efficiency (machines.H100_CODEC_EFFICIENCY) and no overlap.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from dataclasses import dataclass

from ..cluster.calibrate import TargetCluster
from ..models.model_config import ModelConfig
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from . import machines
from .model import Workload, step

SCENARIOS = (("TP=8 in one node", 8), ("TP=16 across two nodes", 16))
MODEL, SEQ_LEN, BATCH = "qwen-7b", 2048, 1


@dataclass(frozen=True)
class Assumptions:
    """One point of the grid, in the units a reader thinks in."""

    inter_node_bw_GBps: float
    latency_us: float  # per hop of the link the TP group crosses
    codec_hbm_fraction: float
    tflops: float  # sustained training TFLOP/s per GPU
    overlap: bool

    def machine(self, target: TargetCluster, tp: int) -> machines.Machine:
        hop = "inter_node_latency" if tp > target.gpus_per_node else "intra_node_latency"
        t = dataclasses.replace(target, inter_node_bw=self.inter_node_bw_GBps * 1e9,
                                flops_per_gpu=self.tflops * 1e12, **{hop: self.latency_us * 1e-6})
        m = machines.h100(tp, t)
        return dataclasses.replace(m, codec_values_per_s=machines.h100_codec(t, tp, self.codec_hbm_fraction))


# the swept values of each assumption (the ranges; the baseline is among them)
GRID = {
    "inter_node_bw_GBps": (25.0, 50.0, 100.0, 200.0, 400.0),
    "latency_us": (5.0, 10.0, 20.0),
    "codec_hbm_fraction": (0.3, 0.5, 0.7, 0.9),
    "tflops": (300.0, 400.0, 500.0, 600.0),
    "overlap": (False, True),
}


def baseline(target: TargetCluster, spans_nodes: bool) -> Assumptions:
    return Assumptions(target.inter_node_bw / 1e9,
                       (target.inter_node_latency if spans_nodes else target.intra_node_latency) * 1e6,
                       machines.H100_CODEC_EFFICIENCY, target.flops_per_gpu / 1e12, False)


def sweep(target: TargetCluster | None = None) -> list[dict]:
    """One row per scenario and grid point (and the baseline, flagged, if it is off the grid)."""
    target = target or TargetCluster()
    model = ModelConfig.preset(MODEL)
    rows = []
    for name, tp in SCENARIOS:
        w = Workload(model, tp, SEQ_LEN, BATCH)
        spans = tp > target.gpus_per_node
        base = baseline(target, spans)
        points = [Assumptions(*v) for v in itertools.product(*GRID.values())]
        for a in points + ([base] if base not in points else []):
            m = a.machine(target, tp)
            bf16, fp4 = step(w, m, "bf16", overlap=a.overlap), step(w, m, "fp4quant", overlap=a.overlap)
            rows.append({"scenario": f"H100, Qwen-7B, {name}", "tp": tp, **dataclasses.asdict(a),
                         "baseline": a == base, "bf16_tokens_per_s": bf16.tokens_per_s,
                         "fp4quant_tokens_per_s": fp4.tokens_per_s, "speedup": fp4.tokens_per_s / bf16.tokens_per_s,
                         "kind": "projected", "hardware": "H100 (assumed)"})
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Per scenario: the baseline speedup, its range over the grid and each assumption's own range
    (the others at the baseline)."""
    lines = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == scenario]
        base = next(r for r in rs if r["baseline"])
        lo, hi = min(r["speedup"] for r in rs), max(r["speedup"] for r in rs)
        parts = []
        for key in GRID:
            alone = [r["speedup"] for r in rs if all(r[k] == base[k] for k in GRID if k != key)]
            parts.append(f"{key} {min(alone):.2f}-{max(alone):.2f}x")
        lines.append(f"{scenario}: projected {base['speedup']:.2f}x at the baseline, {lo:.2f}-{hi:.2f}x over "
                     f"the grid; one at a time: " + ", ".join(parts))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.perfmodel.sensitivity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="CSV to write (and <out>.meta.json)")
    a = ap.parse_args(argv)
    rows = sweep()
    prov = provenance()
    for r in rows:
        r["commit"], r["torch"] = prov["commit"], prov["torch"]
    atomic_write_csv(a.out, rows)
    meta = provenance(kind="projected", model=MODEL, seq_len=SEQ_LEN, batch_size=BATCH,
                      target=dataclasses.asdict(TargetCluster()), grid={k: list(v) for k, v in GRID.items()},
                      summary=summary(rows))
    atomic_write_json(a.out + ".meta.json", meta)
    print("\n".join(meta["summary"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
