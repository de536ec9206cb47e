"""The report of a GPU check run (scripts/gpu_check.sh), from the files its stages wrote:

    python scripts/gpu_report.py RESULTS_DIR

- stages: each stage's status, seconds, limit and cap; which failed, which a dry run skipped;
- CUDA tests (junit_cuda.xml) and compute-sanitizer's verdict per tool (sanitizer_<tool>.log);
- kernels (kernels_cuda.csv): every codec op's GB/s beside a device-to-device copy of the same
  input bytes measured in the same run (the copy rows; torch.clone in older files), as a
  fraction of that copy's GB/s (both count input bytes: the copy reads and writes them once,
  a quantize reads them and writes ~1/7 as much), per input dtype; torch's FP8 cast and
  torchao's NVFP4 (or "torchao: absent") beside them; warp-cooperative against naive packing;
  every row keyed by (op, impl, preset, dtype, size_bytes, threads), so that no two rows of
  a file meet in one cell;
- pipeline (pipeline_cuda.csv): one rank's codec stages of a two-shot all-reduce, per W;
- large (large.json): the tensor of 2^31 + 2^20 values;
- training: each run's final loss and tokens/s;
- projection (projection.csv): the H100 speedups the performance model predicts, with the
  measured codec rates or, where none were measured (a dry run), its assumed ones;
- what one GPU cannot show.

Writes RESULTS_DIR/report.json and report.md; a missing input leaves its part out and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fp4quant.provenance import atomic_write_json, atomic_write_text  # noqa: E402

KEY = ["op", "impl", "preset", "dtype", "size_bytes", "threads"]  # what distinguishes a kernel row
SANITIZERS = ("memcheck", "racecheck", "synccheck")
ONE_GPU_LIMITS = [
    "NCCL between GPUs: the collective tests ran at the world size of the visible GPUs (1 here), where "
    "a compressed all-reduce sends nothing to anyone: no compressed message crossed a wire.",
    "NVLink / NVSwitch bandwidth and latency inside a node, and the inter-node links (InfiniBand, "
    "RoCE) across nodes: the projection takes them from the performance model's assumptions.",
    "The TP=2 training runs put two ranks on one GPU over gloo, which stages CUDA tensors through "
    "host memory: they show that the training path works on CUDA tensors, not its speed on a node.",
    "The codec pipeline at W = 2, 4, 8 is one rank's codec work without the exchanges; contention "
    "between the codec kernels and NCCL's on the same GPU is not measured.",
]


def clean(v):
    """A JSON- and table-friendly scalar (numpy types to Python, NaN to None)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def records(df: pd.DataFrame, columns: list[str]) -> list[dict]:
    return [{c: clean(r[c]) for c in columns if c in df} for r in df.to_dict("records")]


def read_kernels(csv: Path) -> pd.DataFrame:
    df = pd.read_csv(csv)
    if "device" in df:
        df = df[df.device == "cuda"]
    for col, default in (("dtype", "float32"), ("threads", 1), ("impl", ""), ("preset", "")):
        if col not in df:
            df[col] = default
    df["preset"] = df.preset.fillna("").astype(str)
    df["impl"] = df.impl.fillna("").astype(str)
    return df.drop_duplicates(KEY, keep="last").reset_index(drop=True)


def kernels(csv: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(codec ops and anchors against the copy of the same bytes, warp against naive packing,
    the torchao rows) -- one row per (op, impl, preset, dtype, size, threads)."""
    df = read_kernels(csv)
    group = ["dtype", "size_bytes", "threads"]
    copies = {}
    for op in ("clone", "copy"):  # the paired copy where the file has it, else torch.clone
        for r in df[df.op == op].itertuples():
            copies[(r.dtype, r.size_bytes, r.threads)] = float(r.gbps)
    rows = []
    for r in df[~df.op.isin(["copy", "clone"])].to_dict("records"):
        copy = copies.get(tuple(r[k] for k in group))
        rows.append({**{k: clean(r[k]) for k in KEY}, "gbps": clean(r["gbps"]), "copy_gbps": copy,
                     "fraction_of_copy": r["gbps"] / copy if copy else None,
                     "fraction_of_limit": clean(r.get("fraction"))})
    quantize = {(r["dtype"], r["size_bytes"], r["threads"], r["preset"]): r["gbps"]
                for r in rows if r["op"] == "quantize" and r["impl"] == "native"}
    packing = []
    for (dtype, size, threads, preset), warp in sorted(quantize.items()):
        naive = quantize.get((dtype, size, threads, "naive_pack"))
        if preset == "fp4quant" and naive:
            packing.append({"dtype": dtype, "size_bytes": size, "threads": threads, "warp_gbps": warp,
                            "naive_gbps": naive, "warp_over_naive": warp / naive})
    return rows, packing, [r for r in rows if r["impl"] == "torchao"]


def pipeline(csv: Path) -> list[dict]:
    df = pd.read_csv(csv)
    if "device" in df:
        df = df[df.device == "cuda"] if (df.device == "cuda").any() else df
    df = df.drop_duplicates(["preset", "dtype", "world", "size_bytes"], keep="last")
    df = df.sort_values(["preset", "dtype", "world", "size_bytes"])
    cols = ["preset", "dtype", "world", "size_bytes", "quantize_s", "reduce_s", "dequantize_s", "total_s", "gbps",
            "copy_gbps", "fraction_of_limit"]
    return records(df, cols)


def junit(xml: Path) -> dict:
    suite = next(ET.parse(xml).getroot().iter("testsuite"))
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def sanitizer(log: Path) -> dict:
    text = log.read_text(errors="replace")
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    calls = re.search(r"(\d+) op calls", text)
    return {"tool": log.stem.removeprefix("sanitizer_"), "errors": int(m.group(1)) if m else None,
            "op_calls": int(calls.group(1)) if calls else None,
            "verdict": ("clean" if m and m.group(1) == "0" and calls else
                        "ERRORS" if m and m.group(1) != "0" else "incomplete (no summary: cut or crashed)")}


def training(results: Path) -> list[dict]:
    runs = []
    for summary in sorted(results.glob("train_*/summary.json")):
        s = json.loads(summary.read_text())
        runs.append({"run": summary.parent.name, "comm": s["provenance"]["config"]["comm"], **s["mesh"],
                     "final_loss": s.get("final_loss"), "val_loss": s.get("val_loss"),
                     "tokens_per_s": s.get("tokens_per_s")})
    return runs


def projection(csv: Path) -> tuple[list[dict], str]:
    df = pd.read_csv(csv)
    h100 = df[df.scenario.str.startswith("H100")]
    source = str(h100.hardware.iloc[0]) if "hardware" in h100 and len(h100) else "?"
    return records(h100, ["scenario", "comm", "predicted_tokens_per_s", "codec_s", "predicted_speedup"]), source


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        v = clean(v)
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows])


def mib(size) -> str:
    return f"{int(size) / 2**20:g} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    a = ap.parse_args(argv)
    res = a.results
    report: dict = {"results": str(res), "missing": []}
    parts = [f"# GPU check report: {res.name}"]
    prov = json.loads((res / "provenance.json").read_text()) if (res / "provenance.json").exists() else {}
    if prov:
        report["machine"] = {k: prov.get(k) for k in ("gpu_name", "hardware", "torch", "cuda", "nvidia_smi", "nvcc",
                                                      "cuda_archs", "python_modules", "commit", "dry_run")}
        absent = [m for m, ok in (prov.get("python_modules") or {}).items() if not ok]
        parts.append(f"Machine: {prov.get('gpu_name') or 'no GPU'} ({prov.get('hardware')}); torch {prov.get('torch')} "
                     f"(CUDA {prov.get('cuda')}); nvidia-smi: {prov.get('nvidia_smi') or 'none'}; built for "
                     f"FP4QUANT_CUDA_ARCHS={prov.get('cuda_archs')}; commit {prov.get('commit')}"
                     + (f"; python modules absent: {', '.join(absent)}" if absent else ""))
    if (res / "stages.tsv").exists():
        stages = pd.read_csv(res / "stages.tsv", sep="\t", dtype={"status": str})
        report["stages"] = records(stages, list(stages.columns))
        dry = [s["stage"] for s in report["stages"] if s["status"] == "skipped (dry run)"]
        bad = [s["stage"] for s in report["stages"] if s["status"] not in ("ok", "skipped (dry run)")]
        report["skipped_dry_run"], report["failed"] = dry, bad
        parts += ["## Stages", table(report["stages"], ["stage", "status", "seconds", "limit_s", "cap_s"])]
        if dry:
            parts.append("Skipped (dry run: they need a GPU, and count as not run, not as failed): " + ", ".join(dry))
        if bad:
            parts.append("Failed, skipped for want of an input or the budget, or interrupted: " + ", ".join(bad))
    if (res / "junit_cuda.xml").exists():
        report["tests_cuda"] = t = junit(res / "junit_cuda.xml")
        parts += ["## CUDA tests", f"{t['tests']} tests: {t['failures']} failed, {t['errors']} errors, {t['skipped']} "
                  "skipped (each kernel and preset bit for bit against the pure-PyTorch reference). The collective "
                  "suite ran at world size 1 (one GPU): no compressed message crossed a wire."]
    san = [sanitizer(res / f"sanitizer_{tool}.log") for tool in SANITIZERS if (res / f"sanitizer_{tool}.log").exists()]
    if san:
        report["sanitizer"] = san
        parts += ["## compute-sanitizer (scripts/gpu_ops.py once: every op of every preset at small sizes)",
                  table(san, ["tool", "verdict", "errors", "op_calls"])]
    if (res / "kernels_cuda.csv").exists():
        ops, packing, torchao = kernels(res / "kernels_cuda.csv")
        meta_path = res / "kernels_cuda.csv.meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        report.update(kernels=ops, packing=packing)
        report["torchao"] = meta.get("torchao") or ("present" if torchao else "absent")
        for dtype in sorted({r["dtype"] for r in ops}):
            mine = [r for r in ops if r["dtype"] == dtype]
            largest = max(r["size_bytes"] for r in mine)
            threads = max(r["threads"] for r in mine)
            at = [r for r in mine if r["size_bytes"] == largest and r["threads"] == threads]
            parts += [f"## Codec kernels, {dtype} input, {mib(largest)}: against a device-to-device copy of the same "
                      "bytes", table(at, ["op", "impl", "preset", "gbps", "copy_gbps", "fraction_of_copy",
                                          "fraction_of_limit"])]
        parts.append("Anchors: `cast_fp8` is torch's `x.to(torch.float8_e4m3fn)` of the same tensor; torchao: "
                     + (f"{report['torchao']} (its NVFP4 rows above)" if torchao else "absent (no NVFP4 row: torchao "
                        "cannot be imported here)"))
        parts += ["## Warp-cooperative against naive packing (quantize)",
                  table(packing, ["dtype", "size_bytes", "threads", "warp_gbps", "naive_gbps", "warp_over_naive"])]
    else:
        report["missing"].append("kernels_cuda.csv")
    if (res / "pipeline_cuda.csv").exists():
        report["pipeline"] = pipe = pipeline(res / "pipeline_cuda.csv")
        parts += ["## Two-shot codec pipeline: one rank's quantize, dequantize_reduce + requantize and dequantize "
                  "(no communication)",
                  table(pipe, ["preset", "dtype", "world", "size_bytes", "quantize_s", "reduce_s", "dequantize_s",
                               "total_s", "gbps", "copy_gbps", "fraction_of_limit"])]
    else:
        report["missing"].append("pipeline_cuda.csv")
    if (res / "large.json").exists():
        big = json.loads((res / "large.json").read_text())
        report["large"] = {k: big.get(k) for k in ("numel", "boundary", "passed", "failures", "dtypes",
                                                   "blocks_checked", "max_memory_allocated_gib")}
        parts += ["## Past 2^31 values",
                  f"{big['numel']} values ({', '.join(big.get('dtypes', {}))}): quantize, dequantize and "
                  f"dequantize_reduce {'matched' if big.get('passed') else 'DID NOT match'} the reference on blocks "
                  f"{big.get('blocks_checked')} (value {big.get('boundary')} lies in block "
                  f"{big.get('boundary', 0) // big.get('block', 1)})"
                  + ("" if big.get("passed") else ": " + "; ".join(big.get("failures", [])))]
    else:
        report["missing"].append("large.json")
    report["training"] = training(res)
    parts += ["## Training runs", table(report["training"], ["run", "comm", "tp", "backend", "device", "final_loss",
                                                             "val_loss", "tokens_per_s"])
              if report["training"] else "None ran."]
    if (res / "projection.csv").exists():
        report["projection"], source = projection(res / "projection.csv")
        report["projection_codec"] = source
        measured = "measured" in source
        parts += [f"## H100 projection ({source}: "
                  + ("the codec rates of this run's benchmark, bfloat16 inputs)" if measured else
                     "the performance model's assumed codec rates; no benchmark ran)"),
                  table(report["projection"], ["scenario", "comm", "predicted_tokens_per_s", "codec_s",
                                               "predicted_speedup"])]
    else:
        report["missing"].append("projection.csv")
    report["one_gpu_cannot_show"] = ONE_GPU_LIMITS
    parts += ["## What one GPU cannot show", "\n".join(f"- {line}" for line in ONE_GPU_LIMITS)]
    if report["missing"]:
        parts.append("Missing (their stages failed or did not run): " + ", ".join(report["missing"]))
    atomic_write_json(res / "report.json", report)
    atomic_write_text(res / "report.md", "\n\n".join(parts) + "\n")
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
