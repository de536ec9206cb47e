"""The error of the all-reduced tensor against the number of ranks, on captured TP traffic.

    python -m fp4quant.bench.reduced_error --captures RUN_TP2/traffic RUN_TP16/traffic ...
        [--presets bf16,fp4quant,nvfp4,fp8] [--max-calls 8] --out data/study_tp/bench/reduced_error.csv

A compressed all-reduce at TP = W quantizes W partial sums, adds them, and quantizes the sum
again: its error grows with W in a way one message's error does not show.  Each captures
folder holds, at a few steps, every rank's contribution to each TP all-reduce of one run
(``fp4quant.train --capture-traffic-steps``; the TP study's BF16 run at each degree).  For each
step, direction and call, the W contributions are added exactly (float64), and by each
preset's all-reduce as the trainer sends it -- a ``TPCommunicator`` of ``CommConfig.from_preset``
(backward stochastic, streams keyed by rank and step), the real algorithm with its W ranks as
threads of this process (fp4quant.comm.local).  A row per (folder, step, direction, call,
preset): the SQNR of the result against the exact sum, and of one rank's message alone (rank
0's contribution through the same codec, ``single_sqnr_db``).

``<out stem>_summary.csv``: per (TP, direction, preset) the median, min and max over the
tensors of both SQNRs, and the pooled (energy-weighted) SQNR of the reduced tensors.

    python -m fp4quant.bench.reduced_error --parts OUT_TP2.csv OUT_TP16.csv ... --out reduced_error.csv

joins outputs of this tool, one TP degree each, into one (rows as measured, the summary anew): a
study's degrees finish in different sittings, and a capture, too big to keep, goes with its
sitting, so each degree is measured as its run ends.  The parts must agree on the presets, the
calls kept, the torch and the code, and hold different TP degrees.  The join's provenance is its
own run's, with the parts' captures, presets, calls, torch and code; each row keeps the hardware
and commit that measured it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

import torch

from .. import dequantize, quantize
from ..comm.local import LocalGroup, run_ranks
from ..parallel.capture import load_captures
from ..parallel.communicator import CommConfig, TPCommunicator
from ..provenance import atomic_write_csv, atomic_write_json, provenance

PRESETS = ("bf16", "fp4quant", "nvfp4", "fp8")


def sqnr_db(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """10 log10 of the exact tensor's energy over the error's; +inf only for no error, NaN
    where the approximation is not finite (an overflow is no perfect result)."""
    return db(float(exact.pow(2).sum()), float((approx.double() - exact).pow(2).sum()))


def db(energy: float, err: float) -> float:
    return math.nan if not math.isfinite(err) else math.inf if err == 0 else 10 * math.log10(energy / err)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max); all NaN if any value is (statistics.median, min and max would place a
    NaN anywhere, or skip it)."""
    if any(math.isnan(v) for v in values):
        return math.nan, math.nan, math.nan
    return statistics.median(values), min(values), max(values)


def reduce(parts: list[torch.Tensor], preset: str, direction: str, step: int, seed: int = 0) -> torch.Tensor:
    """``parts`` (one per rank) summed by ``preset``'s all-reduce at TP = len(parts), as the
    trainer sends ``direction``'s traffic at ``step``; rank 0's result."""
    config = CommConfig.from_preset(preset, seed=seed)

    def rank_main(handle):
        tp = TPCommunicator(handle, config)
        tp.start_step(step)
        return tp.all_reduce(parts[handle.rank].clone(), direction)

    return run_ranks(LocalGroup(len(parts)), rank_main)[0]


def single(x: torch.Tensor, preset: str, direction: str) -> torch.Tensor:
    """One message of ``x`` through ``preset``'s wire in ``direction`` (round to nearest)."""
    wire = CommConfig.from_preset(preset, stochastic_backward=False).options(direction).wire
    if wire.config is None or not wire.config.compressed:
        return x.to(wire.dtype).to(x.dtype) if wire.dtype is not None else x.clone()
    return dequantize(quantize(x, wire.config))


def measure(folders: list[str], presets: list[str], max_calls: int | None = None) -> list[dict]:
    rows = []
    for folder in folders:
        caps = load_captures(folder)
        tps = sorted({str(c.get("meta", {}).get("tp")) for c in caps})  # what the run recorded, not the files found
        if len(tps) != 1 or not tps[0].isdigit() or int(tps[0]) < 2:
            raise ValueError(f"{folder}: the captures record TP degrees {', '.join(tps)}, not one TP degree of 2 or more")
        world = int(tps[0])
        for step in sorted({c["step"] for c in caps}):
            by_rank = {c["rank"]: c for c in caps if c["step"] == step}
            if sorted(by_rank) != list(range(world)):
                raise ValueError(f"{folder}: step {step} has captures of ranks {sorted(by_rank)}, not 0..{world - 1}")
            for direction in ("fwd", "bwd"):
                calls = len(by_rank[0]["tensors"][direction])
                picked = range(calls) if not max_calls or calls <= max_calls else \
                    sorted({round(i * (calls - 1) / (max_calls - 1)) for i in range(max_calls)})
                for k in picked:
                    parts = [by_rank[r]["tensors"][direction][k].to(torch.float32) for r in range(world)]
                    exact = torch.stack([p.double() for p in parts]).sum(0)
                    if not torch.isfinite(exact).all():
                        raise ValueError(f"{folder}: step {step} {direction} call {k} holds NaN or Inf")
                    if float(exact.pow(2).sum()) == 0:
                        continue
                    for preset in presets:
                        out = reduce(parts, preset, direction, step)
                        energy, err = float(exact.pow(2).sum()), float((out.double() - exact).pow(2).sum())
                        rows.append({"tp": world, "step": step, "direction": direction, "call": k, "preset": preset,
                                     "numel": exact.numel(), "sqnr_db": db(energy, err),
                                     "single_sqnr_db": sqnr_db(single(parts[0], preset, direction), parts[0].double()),
                                     "energy": energy, "error_energy": err})
                    print(f"TP {world} step {step} {direction} call {k}: " + ", ".join(
                        f"{r['preset']} {r['sqnr_db']:.1f} dB" for r in rows[-len(presets):]), file=sys.stderr)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["tp"], r["direction"], r["preset"]), []).append(r)
    out = []
    for (tp, direction, preset), rs in sorted(groups.items()):
        sq, one = spread([r["sqnr_db"] for r in rs]), spread([r["single_sqnr_db"] for r in rs])
        out.append({"tp": tp, "direction": direction, "preset": preset, "tensors": len(rs),
                    **dict(zip(("sqnr_db_median", "sqnr_db_min", "sqnr_db_max"), sq)),
                    "sqnr_db_pooled": db(sum(r["energy"] for r in rs), sum(r["error_energy"] for r in rs)),
                    **dict(zip(("single_sqnr_db_median", "single_sqnr_db_min", "single_sqnr_db_max"), one))})
    return out


STAMP = ("hardware", "torch", "commit")  # each row's origin, from the provenance of its run of this tool
NUMBERS = {"tp": int, "step": int, "call": int, "numel": int, "sqnr_db": float, "single_sqnr_db": float,
           "energy": float, "error_energy": float}
AGREED = ("presets", "max_calls", "torch", "code")  # what the parts of one join must share


def join(parts: list[str]) -> tuple[list[dict], dict]:
    """The rows of several outputs of this tool (one TP degree each) and the provenance they share
    ({"captures": all of theirs, AGREED: theirs}); one line naming the parts that disagree."""
    rows, metas = [], {}
    for part in parts:
        meta = Path(part + ".meta.json")
        if not Path(part).is_file() or not meta.is_file():
            raise FileNotFoundError(f"{part if not Path(part).is_file() else meta} is missing: each part is an output "
                                    "of this tool with its .meta.json")
        metas[part] = json.loads(meta.read_text())
        with open(part, newline="") as f:
            part_rows = [{k: NUMBERS.get(k, str)(v) for k, v in r.items()} for r in csv.DictReader(f)]
        lacking = [k for k in ("tp", "direction", "preset", *STAMP) if part_rows and k not in part_rows[0]]
        if not part_rows or lacking:
            raise ValueError(f"{part}: {'no rows' if not part_rows else 'no column ' + lacking[0]}: not a part "
                             "this tool measured")
        tps = sorted({r["tp"] for r in part_rows})
        seen = sorted({r["tp"] for r in rows} & set(tps))
        if seen:
            raise ValueError(f"{part}: TP {seen[0]} is in an earlier part too: one part per TP degree")
        rows += part_rows
    first = parts[0]
    for key in AGREED:
        other = next((p for p in parts if metas[p].get(key) != metas[first].get(key)), None)
        if other:
            raise ValueError(f"{first} and {other} differ in {key} ({metas[first].get(key)} against "
                             f"{metas[other].get(key)}): measure them alike")
    shared = {k: metas[first].get(k) for k in AGREED}
    return rows, {"captures": [c for p in parts for c in metas[p].get("captures") or []], **shared}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.bench.reduced_error", description=__doc__.split("\n\n")[0])
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--captures", nargs="+", help="capture folders, one per TP degree")
    source.add_argument("--parts", nargs="+", help="outputs of this tool to join, one TP degree each")
    ap.add_argument("--presets", default=None, help=f"default: {','.join(PRESETS)}")
    ap.add_argument("--max-calls", type=int, default=None,
                    help="at most this many calls per step and direction, evenly spaced (default: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.parts and (a.presets is not None or a.max_calls is not None):
        ap.error("--parts joins parts as they were measured: --presets and --max-calls are theirs")
    presets = [p for p in (a.presets or ",".join(PRESETS)).split(",") if p]
    if a.max_calls is not None and a.max_calls < 2:
        ap.error(f"--max-calls {a.max_calls}: at least 2 (the first and the last call of each step)")
    try:
        if a.parts:
            rows, joined = join(a.parts)
            prov = {**provenance(parts=a.parts), **joined}
        else:
            for p in presets:
                CommConfig.from_preset(p)
            prov = provenance(captures=a.captures, presets=presets, max_calls=a.max_calls)
            rows = [{**r, **{k: prov[k] for k in STAMP}} for r in measure(a.captures, presets, a.max_calls)]
    except (FileNotFoundError, ValueError) as exc:
        print(f"fp4quant.bench.reduced_error: error: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)
    summary = out.with_name(out.stem + "_summary.csv")
    stamps = {r["tp"]: {k: r[k] for k in STAMP} for r in rows}  # a degree's rows come from one run of this tool
    atomic_write_csv(out, rows)
    atomic_write_json(str(out) + ".meta.json", prov)
    atomic_write_csv(summary, [{**r, **stamps[r["tp"]]} for r in summarize(rows)])
    atomic_write_json(str(summary) + ".meta.json", prov)
    print(f"wrote {out} ({len(rows)} rows) and {summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
