"""The emulated all-reduce, predicted from its dilated components and set beside the measurement.

    python -m fp4quant.perfmodel.allreduce --collectives collectives.csv \
        --record collectives.cluster.json --transfers transfers.csv --size 67108864 \
        --out allreduce_prediction.csv

The inputs come from one link: the collective benchmark run under the cluster runner
(fp4quant.bench.allreduce_sweep: each algorithm's median seconds and its codec timers), the
runner's record of it (the dilated latency each wire step sleeps), and the transfer benchmark
on the same link (fp4quant.bench.transfers: each gloo primitive's rate per rank by size).
Nothing is fitted to the all-reduces.  Each algorithm's seconds:

uncompressed   gloo's ring all_reduce: its sent bytes at the all_reduce rate measured at
               that size (the workflow measures up to a quarter of it: a shaped link's rate
               per byte is flat at megabytes, so the largest size's rate stands beyond it),
               plus 2 (W-1) latencies
two-shot       the codec timers' seconds, plus the all-to-all phase's bytes at the
               exchange_all_to_all rate and the all-gather phase's at the exchange_all_gather
               rate (each measured at the phase's size; the exchanges of fp4quant.comm.exchange
               the algorithm uses, else torch's all_to_all_single and all_gather_into_tensor
               where a transfer benchmark lacks them: the row's phase_primitives says which),
               plus 2 (W-1) latencies; one after another
chunked        pipelined (fp4quant.comm.algorithms: a chunk's collective is in flight while
               the codec works on its neighbours), so the host's work -- the codec and the
               2 (W-1) latencies each chunk sleeps before it issues -- runs beside the wire,
               which with transfers always in flight moves at the link's sustained rate (the
               ring all_reduce's at the message's size); the longer of the two, plus one
               chunk's host work to fill and drain the pipeline

Rows: algorithm, measured_s (median; min and max), predicted_s, the components (and
phase_primitives: the transfer benchmark's rows whose rates the wire took), the
speedup over uncompressed measured and predicted, and ratio_rel_error (predicted /
measured - 1): the issue's check of the emulation (within 15% at 64 MiB).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from ..provenance import atomic_write_csv, atomic_write_json, provenance


class PredictionError(ValueError):
    """The inputs cannot give a prediction (a missing row, primitive or record field)."""


def rate_at(transfers: pd.DataFrame, primitive: str, sent_bytes: float) -> float:
    """Bytes/s per rank of ``primitive`` at ``sent_bytes``: interpolated in log size between the
    measured sizes, the nearest one's outside them."""
    t = transfers[transfers.primitive == primitive].sort_values("sent_bytes")
    if t.empty:
        raise PredictionError(f"the transfer benchmark has no {primitive!r} rows")
    sizes, rates = t.sent_bytes.to_numpy(dtype=float), t.MBps_per_rank.to_numpy(dtype=float) * 1e6
    if not (rates > 0).all():  # NaN included: a time from no rate is no prediction
        raise PredictionError(f"the transfer benchmark's {primitive!r} rates are not all positive: {sorted(rates)}")
    if sent_bytes <= sizes[0]:
        return float(rates[0])
    if sent_bytes >= sizes[-1]:
        return float(rates[-1])
    i = int((sizes < sent_bytes).sum())  # sizes[i - 1] < sent_bytes <= sizes[i]
    w = (math.log(sent_bytes) - math.log(sizes[i - 1])) / (math.log(sizes[i]) - math.log(sizes[i - 1]))
    return float(rates[i - 1] + w * (rates[i] - rates[i - 1]))


def phase_primitives(transfers: pd.DataFrame) -> tuple[str, str]:
    """The primitives of two-shot's all-to-all and all-gather phases in ``transfers``."""
    if {"exchange_all_to_all", "exchange_all_gather"} <= set(transfers.primitive):
        return ("exchange_all_to_all", "exchange_all_gather")
    return ("all_to_all_single", "all_gather_into_tensor")


def predict(row: pd.Series, transfers: pd.DataFrame, world: int, latency_s: float) -> dict:
    """Predicted seconds of one all-reduce (a collective benchmark row) and its components."""
    steps = 2 * (world - 1)  # wire steps of an all-reduce, each sleeping the dilated latency
    if row.algorithm == "uncompressed":
        wire = row.wire_bytes / rate_at(transfers, "all_reduce", row.wire_bytes)
        return {"codec_s": 0.0, "wire_s": wire, "latency_s": steps * latency_s, "chunks": 1,
                "predicted_s": wire + steps * latency_s, "phase_primitives": "all_reduce"}
    if row.algorithm != "two_shot":
        raise PredictionError(f"no prediction for algorithm {row.algorithm!r} (uncompressed and two_shot only)")
    codec = float(row.codec_s_rank0)
    chunks = max(1, math.ceil(row.size_bytes / row.chunk_bytes)) if pd.notna(row.chunk_bytes) and row.chunk_bytes else 1
    phase = row.wire_bytes / 2  # the all-to-all's and the all-gather's: (W-1) rows of the message each
    if chunks == 1:
        used = phase_primitives(transfers)
        wire = sum(phase / rate_at(transfers, p, phase) for p in used)
        return {"codec_s": codec, "wire_s": wire, "latency_s": steps * latency_s, "chunks": 1,
                "predicted_s": codec + wire + steps * latency_s, "phase_primitives": " ".join(used)}
    wire = row.wire_bytes / rate_at(transfers, "all_reduce", row.wire_bytes)
    host = codec + chunks * steps * latency_s
    return {"codec_s": codec, "wire_s": wire, "latency_s": chunks * steps * latency_s, "chunks": chunks,
            "predicted_s": max(host, wire) + host / chunks, "phase_primitives": "all_reduce"}


def prediction_rows(collectives: pd.DataFrame, transfers: pd.DataFrame, record: dict, size: int) -> list[dict]:
    """One row per algorithm measured at ``size`` bytes, uncompressed first."""
    needed = {"size_bytes", "algorithm", "series", "wire_bytes", "latency_s", "latency_min_s", "latency_max_s",
              "iters", "codec_s_rank0", "chunk_bytes"}
    if needed - set(collectives):
        raise PredictionError(f"the collective benchmark has no column {sorted(needed - set(collectives))[0]}: "
                              "not a CSV of fp4quant.bench.allreduce_sweep")
    if {"primitive", "sent_bytes", "MBps_per_rank"} - set(transfers):
        raise PredictionError("the transfer benchmark has no primitive, sent_bytes or MBps_per_rank column: "
                              "not a CSV of fp4quant.bench.transfers")
    rows = collectives[collectives.size_bytes == size]
    base = rows[rows.algorithm == "uncompressed"]
    if base.empty or len(rows) < 2:
        raise PredictionError(f"the collective benchmark has no uncompressed and compressed rows at {size} bytes")
    try:
        world = int(record["nodes"]) * int(record.get("nproc_per_node", 1))
        latency = float(record["dilation"]["latency_injected_s"]) if not record.get("latency_shaped") else 0.0
    except (KeyError, TypeError) as exc:
        raise PredictionError(f"the cluster record lacks {exc}: not a record of fp4quant.cluster run") from None
    out = []
    for _, r in pd.concat([base, rows[rows.algorithm != "uncompressed"]]).iterrows():
        p = predict(r, transfers, world, latency)
        out.append({"series": r.series, "algorithm": r.algorithm, "size_bytes": size, "wire_bytes": r.wire_bytes,
                    "measured_s": r.latency_s, "measured_min_s": r.latency_min_s, "measured_max_s": r.latency_max_s,
                    "iters": r.iters, **p})
    b = out[0]
    for o in out:
        o["speedup_measured"] = b["measured_s"] / o["measured_s"]
        o["speedup_predicted"] = b["predicted_s"] / o["predicted_s"]
        o["ratio_rel_error"] = o["speedup_predicted"] / o["speedup_measured"] - 1
        o["time_rel_error"] = o["predicted_s"] / o["measured_s"] - 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collectives", required=True,
                    help="fp4quant.bench.allreduce_sweep's CSV, run under the cluster runner")
    ap.add_argument("--record", required=True, help="the cluster runner's record of that run (--record)")
    ap.add_argument("--transfers", required=True, nargs="+", help="fp4quant.bench.transfers' CSVs on the same link")
    ap.add_argument("--size", type=int, default=64 << 20, help="bytes of the all-reduce (default 64 MiB)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        record = json.loads(Path(a.record).read_text())
        transfers = pd.concat([pd.read_csv(p) for p in a.transfers], ignore_index=True)
        rows = prediction_rows(pd.read_csv(a.collectives), transfers, record, a.size)
    except (OSError, PredictionError, KeyError, ValueError) as exc:
        print(f"fp4quant.perfmodel.allreduce: error: {exc}", file=sys.stderr)
        return 2
    prov = provenance(collectives=a.collectives, transfers=a.transfers, record=a.record, size=a.size)
    atomic_write_csv(a.out, [{**r, **{k: prov[k] for k in ("hardware", "commit", "torch")}} for r in rows])
    atomic_write_json(f"{a.out}.meta.json", {**prov, "link_rate_mbit": record.get("link_rate_mbit"),
                                               "latency_injected_s": record.get("dilation", {}).get("latency_injected_s")})
    for r in rows:
        print(f"{r['series']:>32}: measured {r['measured_s']:7.3f} s ({r['measured_min_s']:.3f}-{r['measured_max_s']:.3f}),"
              f" predicted {r['predicted_s']:7.3f} s; speedup {r['speedup_measured']:.2f}x measured,"
              f" {r['speedup_predicted']:.2f}x predicted ({r['ratio_rel_error']:+.0%})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
