"""The regime of a training step: each component's share of it, on the target and on the emulated cluster.

    python -m fp4quant.perfmodel.regime shapes --calibration CAL.json [--tokens 256 1024 4096 ...]
    python -m fp4quant.perfmodel.regime table --calibration CAL.json --runs RUN_DIR ... --out regime.csv

A scale model only stands for its target when every component of the step takes the same
share of it there as on the target.  The components, as the step model (model.step) counts them:

compute    the rank's training FLOPs over its FLOP/s
codec      the compressed all-reduces' quantize, dequantize-reduce and dequantize
bandwidth  the all-reduces' bytes over the link's bandwidth (less a token bucket's credit)
latency    2 (W-1) per-hop latencies per TP all-reduce, and the step's scalar reductions
           (model.Workload.scalar_allreduces; in the trainer's timers, the SCALAR_ALLREDUCES of
           the vocabulary-parallel loss, the ones the emulated cluster sleeps the latency for)

``shapes`` shows the emulated shares of the tiny model's candidate workloads beside the
target's (to choose the throughput runs' shape); ``table`` writes, per scenario and preset,
the projected shares of the target (Qwen-7B on H100 nodes), the emulated workload's shares
predicted from the calibration, and those measured by the trainer's timers in the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from ..cluster.calibrate import TargetCluster
from ..models.model_config import ModelConfig
from .machines import h100, h100_codec
from .model import Machine, Workload, step

COMPONENTS = ("compute", "codec", "bandwidth", "latency")
SCALAR_ALLREDUCES = 3  # the vocabulary-parallel loss: logit max, target logit, sum of exponentials
TARGET_MODEL, TARGET_SEQ_LEN, TARGET_BATCH = "qwen-7b", 2048, 1
TARGETS = [("H100, Qwen-7B, TP=16 across two nodes", 16), ("H100, Qwen-7B, TP=8 in one node", 8)]
EMULATED_TP = 2  # the emulated cluster's TP group: one rank on each of its two nodes


def parts(w: Workload, m: Machine, preset: str) -> dict[str, float]:
    """Seconds of each component (COMPONENTS) of the modelled step; they add up to its total
    (the scalar reductions, latency-bound, count as latency; a rank's wait for a slower peer,
    the skew, as compute, as the trainer's timers leave it there)."""
    s = step(w, m, preset)
    lat = m.inter_latency if w.tp > m.ranks_per_node else m.intra_latency
    hops = 2 * (w.tp - 1) if w.tp > 1 else 0
    tp_latency = 2 * w.messages_per_direction * hops * lat
    return {"compute": s.compute_s + s.skew_s, "codec": s.codec_s, "bandwidth": s.exposed_comm_s - tp_latency,
            "latency": tp_latency + s.scalar_s}


def shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds[c] for c in COMPONENTS)
    return {c: seconds[c] / total for c in COMPONENTS}


def emulated_machine(cal: dict) -> Machine:
    """The emulated cluster as its calibration sets it up: the rank's measured FLOP/s, the
    shaped link's rate, burst and dilated per-hop latency, and each codec op at the slower of
    this CPU's measured rate and the dilated target codec's (the ranks stretch it to that)."""
    target = TargetCluster(**cal["target"])
    dilation = float(cal["time_dilation"])
    dilated = h100_codec(target, EMULATED_TP)["fp4quant"]
    codec = {p: {op: min(g * 1e9 / 4, dilated[op] / dilation) for op, g in rates.items()}
             for p, rates in cal["codec_gbps"].items()}
    bw = float(cal["link_rate_bps"]) / 8
    return Machine(name="emulated cluster (calibration)", rank_flops=float(cal["rank_flops"]), inter_bw=bw,
                   inter_latency=float(cal["link_latency_s"]), intra_bw=bw, intra_latency=float(cal["link_latency_s"]),
                   ranks_per_node=1, codec_values_per_s=codec, burst_bytes=float(cal.get("link_burst_bytes", 0)))


def target_workload(tp: int) -> Workload:
    return Workload(ModelConfig.preset(TARGET_MODEL), tp, TARGET_SEQ_LEN, TARGET_BATCH)


def codec_seconds(record: dict) -> float:
    """A step's codec seconds from the trainer's log line: codec_s where the timers are split
    (quantize_s + dequantize_s), else quantize_s (which then counts every codec op)."""
    total = 0.0
    for d in ("fwd", "bwd"):
        total += record[f"{d}_codec_s"] if f"{d}_codec_s" in record else record[f"{d}_quantize_s"]
    return total


def measured_parts(records: list[dict], tp: int, latency_s: float) -> dict[str, float]:
    """Mean seconds per step of each component from a run's log lines: codec and communication
    from the collectives' timers; latency the per-hop latency slept (latency_s, the run's
    dilation) over the wire steps of its TP all-reduces and scalar reductions; bandwidth the
    rest of the communication time; compute the rest of the step."""
    if not records:
        raise ValueError("no steps to measure (every step is a warm-up step)")
    hops = 2 * (tp - 1)
    out = {c: 0.0 for c in COMPONENTS}
    for r in records:
        comm = r["fwd_comm_s"] + r["bwd_comm_s"]
        codec = codec_seconds(r)
        tp_latency = (r["fwd_calls"] + r["bwd_calls"]) * hops * latency_s
        scalar_latency = SCALAR_ALLREDUCES * hops * latency_s
        out["codec"] += codec
        out["latency"] += tp_latency + scalar_latency
        out["bandwidth"] += comm - tp_latency
        out["compute"] += r["step_time_s"] - comm - codec - scalar_latency
    return {c: v / len(records) for c, v in out.items()}


def read_run(run: str | Path, warmup: int) -> dict:
    """A run's summary, its log lines after the first ``warmup`` steps ("steady") and their
    tokens/s (over their summed step times)."""
    if warmup < 0:
        raise ValueError(f"warm-up steps must be >= 0, got {warmup}")
    run = Path(run)
    summary = json.loads((run / "summary.json").read_text())
    lines = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if x.strip()]
    steady = [r for r in lines if r["step"] >= warmup]
    if not steady:
        raise ValueError(f"{run}: {len(lines)} steps logged, none after the {warmup} warm-up steps")
    cfg = summary["provenance"]["config"]
    tokens = summary["mesh"]["dp"] * cfg["batch_size"] * cfg["seq_len"]
    seconds = sum(r["step_time_s"] for r in steady)
    return {"summary": summary, "steady": steady, "tokens_per_s": tokens * len(steady) / seconds,
            "step_time_s": seconds / len(steady)}


def _row(scenario: str, source: str, preset: str, w: Workload, seconds: dict, n: int = 1, sd: dict | None = None,
         tokens_per_s: float | None = None) -> dict:
    row = {"scenario": scenario, "source": source, "comm": preset, "model_hidden": w.model.hidden_size,
           "layers": w.model.num_layers, "tp": w.tp, "seq_len": w.seq_len, "batch_size": w.batch_size,
           "message_bytes_bf16": 2 * w.tokens * w.model.hidden_size, "n": n,
           "step_s": sum(seconds[c] for c in COMPONENTS)}
    for c, share in shares(seconds).items():
        row[f"{c}_s"] = seconds[c]
        row[f"{c}_share"] = share
        row[f"{c}_share_sd"] = sd[c] if sd else ""
    row["tokens_per_s"] = tokens_per_s if tokens_per_s is not None else w.dp * w.tokens / row["step_s"]
    return row


def regime_rows(cal: dict, runs: list[str | Path], warmup: int, presets=("bf16", "fp4quant")) -> list[dict]:
    """The regime table's rows: target (projected), emulated (predicted), emulated (measured,
    mean and SD of the shares over the runs of each preset)."""
    target = TargetCluster(**cal["target"])
    rows = []
    for scenario, tp in TARGETS:
        for p in presets:
            rows.append(_row(scenario, "projected", p, target_workload(tp), parts(target_workload(tp), h100(tp, target), p)))
    by_preset: dict[str, list[dict]] = {}
    for d in runs:
        run = read_run(d, warmup)
        by_preset.setdefault(run["summary"]["provenance"]["config"]["comm"], []).append(run)
    if not by_preset:
        raise ValueError("no throughput runs given")
    emu = emulated_machine(cal)
    scenario = f"emulated, tiny model, 2 nodes (dilation x{cal['time_dilation']:.0f})"
    for p in [q for q in presets if q in by_preset] + [q for q in by_preset if q not in presets]:
        group = by_preset[p]
        s = group[0]["summary"]
        cfg = s["provenance"]["config"]
        w = Workload(ModelConfig(**s["model"]), s["mesh"]["tp"], cfg["seq_len"], cfg["batch_size"], s["mesh"]["dp"])
        shapes = {(r["summary"]["provenance"]["config"]["seq_len"], r["summary"]["provenance"]["config"]["batch_size"])
                  for r in group}
        if len(shapes) > 1:
            raise ValueError(f"the {p} runs have different shapes (seq_len, batch_size): {sorted(shapes)}")
        rows.append(_row(scenario, "predicted", p, w, parts(w, emu, p)))
        latency = (s["comm"].get("hooks") or {}).get("latency_s", 0.0)
        per_run = [measured_parts(r["steady"], w.tp, latency) for r in group]
        mean = {c: statistics.fmean(x[c] for x in per_run) for c in COMPONENTS}
        # one run has no spread: none written (never a 0 that reads as a measured one)
        sd = {c: statistics.stdev(shares(x)[c] for x in per_run) for c in COMPONENTS} if len(per_run) > 1 else None
        tps = [r["tokens_per_s"] for r in group]
        rows.append(_row(scenario, "measured", p, w, mean, len(group), sd, statistics.fmean(tps)))
    return rows


def shape_rows(cal: dict, token_counts: list[int], seq_len: int) -> list[dict]:
    """bf16 shares of the tiny model at each token count (seq_len x batch), beside the target's."""
    target = TargetCluster(**cal["target"])
    rows = [_row(scenario, "projected", "bf16", target_workload(tp), parts(target_workload(tp), h100(tp, target), "bf16"))
            for scenario, tp in TARGETS]
    emu = emulated_machine(cal)
    for tokens in token_counts:
        if tokens % seq_len:
            raise ValueError(f"{tokens} tokens is not a whole number of {seq_len}-token sequences")
        w = Workload(ModelConfig.preset("tiny"), EMULATED_TP, seq_len, tokens // seq_len)
        for p in ("bf16", "fp4quant"):
            rows.append(_row("emulated, tiny model, 2 nodes", "predicted", p, w, parts(w, emu, p)))
    return rows


def describe(row: dict) -> str:
    split = ", ".join(f"{c} {100 * row[c + '_share']:.0f}%" for c in COMPONENTS)
    return (f"{row['scenario']} [{row['source']}] {row['comm']}: seq {row['seq_len']} x batch {row['batch_size']}, "
            f"step {row['step_s']:.3g} s: {split}")


def main(argv=None) -> int:
    from ..provenance import atomic_write_csv, atomic_write_json, provenance

    ap = argparse.ArgumentParser(prog="python -m fp4quant.perfmodel.regime", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("shapes", help="the tiny model's emulated shares at candidate shapes, beside the target's")
    s.add_argument("--calibration", required=True)
    s.add_argument("--seq-len", type=int, default=512)
    s.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8192])
    t = sub.add_parser("table", help="regime.csv: projected, predicted and measured shares")
    t.add_argument("--calibration", required=True)
    t.add_argument("--runs", nargs="+", required=True, help="throughput runs on the emulated cluster")
    t.add_argument("--warmup", type=int, required=True, help="leading steps of each run left out")
    t.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        cal = json.loads(Path(a.calibration).read_text())
        if a.command == "shapes":
            for row in shape_rows(cal, a.tokens, a.seq_len):
                print(describe(row))
            return 0
        rows = regime_rows(cal, a.runs, a.warmup)
    except (OSError, ValueError, KeyError) as exc:
        print(f"fp4quant.perfmodel.regime: error: {exc}", file=sys.stderr)
        return 2
    bad = [r for r in rows if not all(math.isfinite(r[f"{c}_s"]) for c in COMPONENTS)]
    if bad:
        print(f"fp4quant.perfmodel.regime: error: not finite: {describe(bad[0])}", file=sys.stderr)
        return 2
    prov = provenance()
    for r in rows:
        r["hardware"] = prov["hardware"] if r["scenario"].startswith("emulated") else "H100 (assumed)"
        r["commit"], r["torch"] = prov["commit"], prov["torch"]
    atomic_write_csv(a.out, rows)
    atomic_write_json(a.out + ".meta.json", provenance(calibration=cal, warmup_steps=a.warmup, runs=[str(r) for r in a.runs]))
    for row in rows:
        print(describe(row), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
