"""The figures of a GPU check run (scripts/gpu_check.sh), from the files its stages wrote:

    python scripts/gpu_report.py RESULTS_DIR

- kernels: every codec op's GB/s beside a device-to-device copy of the same input bytes
  (torch.clone, measured in the same run), as a fraction of that copy's GB/s (both count input
  bytes: the copy reads and writes them once, a quantize reads them and writes ~1/7 as much);
- packing: warp-cooperative (fp4quant) against naive packing (naive_pack), quantize, per size;
- training: each run's final loss and tokens/s;
- projection: the H100 speedups the performance model predicts with the measured codec rates.

Writes RESULTS_DIR/report.json and report.md; a missing input leaves its part out and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fp4quant.provenance import atomic_write_json, atomic_write_text  # noqa: E402


def kernels(csv: Path) -> tuple[list[dict], list[dict]]:
    """(codec ops against the copy, warp against naive packing), per size."""
    df = pd.read_csv(csv)
    df = df[df.device == "cuda"] if "device" in df else df
    copy = df[df.op == "clone"].set_index("size_bytes").gbps
    ours = df[df.impl == "native"]
    rows = [{"op": r.op, "preset": r.preset, "size_bytes": int(r.size_bytes), "gbps": r.gbps,
             "copy_gbps": copy.get(r.size_bytes), "fraction_of_copy": r.gbps / copy[r.size_bytes]}
            for r in ours.itertuples() if r.size_bytes in copy.index]
    quantize = ours[ours.op == "quantize"].set_index(["preset", "size_bytes"]).gbps
    packing = [{"size_bytes": int(size), "warp_gbps": quantize[("fp4quant", size)],
                "naive_gbps": quantize[("naive_pack", size)],
                "warp_over_naive": quantize[("fp4quant", size)] / quantize[("naive_pack", size)]}
               for size in sorted(set(ours.size_bytes))
               if ("fp4quant", size) in quantize.index and ("naive_pack", size) in quantize.index]
    return rows, packing


def training(results: Path) -> list[dict]:
    runs = []
    for summary in sorted(results.glob("train_*/summary.json")):
        s = json.loads(summary.read_text())
        runs.append({"run": summary.parent.name, "comm": s["provenance"]["config"]["comm"], **s["mesh"],
                     "final_loss": s.get("final_loss"), "val_loss": s.get("val_loss"), "tokens_per_s": s.get("tokens_per_s")})
    return runs


def projection(csv: Path) -> list[dict]:
    df = pd.read_csv(csv)
    df = df[df.scenario.str.startswith("H100")]
    return [{"scenario": r.scenario, "comm": r.comm, "predicted_tokens_per_s": r.predicted_tokens_per_s,
             "codec_s": r.codec_s, "predicted_speedup": r.predicted_speedup} for r in df.itertuples()]


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    a = ap.parse_args(argv)
    report: dict = {"results": str(a.results), "missing": []}
    parts = [f"# GPU check report: {a.results.name}"]
    if (a.results / "stages.tsv").exists():
        report["stages"] = pd.read_csv(a.results / "stages.tsv", sep="\t").to_dict("records")
        parts += ["## Stages", table(report["stages"], ["stage", "status", "seconds", "limit_s"])]
    if (a.results / "kernels_cuda.csv").exists():
        ops, packing = kernels(a.results / "kernels_cuda.csv")
        report.update(kernels=ops, packing=packing)
        largest = max((r["size_bytes"] for r in ops), default=0)
        parts += [f"## Codec kernels against a device-to-device copy of the same bytes ({largest >> 20} MiB)",
                  table([r for r in ops if r["size_bytes"] == largest],
                        ["op", "preset", "gbps", "copy_gbps", "fraction_of_copy"]),
                  "## Warp-cooperative against naive packing (quantize)",
                  table(packing, ["size_bytes", "warp_gbps", "naive_gbps", "warp_over_naive"])]
    else:
        report["missing"].append("kernels_cuda.csv")
    report["training"] = training(a.results)
    parts += ["## Training runs", table(report["training"], ["run", "comm", "tp", "backend", "device", "final_loss",
                                                             "val_loss", "tokens_per_s"])]
    if (a.results / "projection_gpu.csv").exists():
        report["projection"] = projection(a.results / "projection_gpu.csv")
        parts += ["## H100 projection with the measured codec rates",
                  table(report["projection"], ["scenario", "comm", "predicted_tokens_per_s", "codec_s",
                                               "predicted_speedup"])]
    else:
        report["missing"].append("projection_gpu.csv")
    if report["missing"]:
        parts.append("Missing (their stages failed or did not run): " + ", ".join(report["missing"]))
    atomic_write_json(a.results / "report.json", report)
    atomic_write_text(a.results / "report.md", "\n\n".join(parts) + "\n")
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
