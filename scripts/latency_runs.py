"""Summary of scripts/latency_runs.sh's runs: per run, its communication a step (the least
over the ranks of the step's seconds in the TP collectives, both directions; fp4quant.train's
``{fwd,bwd}_comm_least_s``) over its steady steps, as fp4quant.perfmodel.model_validation measures it.

    python scripts/latency_runs.py OUT_DIR --out OUT_DIR/summary.csv
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from fp4quant.perfmodel import model_validation
from fp4quant.provenance import atomic_write_csv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("--skip", type=float, default=0.2, help="fraction of each run's first steps dropped")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rows = []
    for log in sorted(a.root.glob("a*/rate*/*/b*/log.jsonl")):
        run = log.parent
        alternation, rate, comm, batch = run.parts[-4][1:], run.parts[-3][4:], run.parts[-2], run.name[1:]
        kept = model_validation.steady(model_validation.read_log(run), a.skip)
        comm_s = model_validation.measured_components(kept)["communication"]
        w = model_validation.run_workload(json.loads((run / "summary.json").read_text()))
        wire_steps = 2 * w.messages_per_direction * 2 * (w.tp - 1)  # both directions, a ring's or two-shot's 2 (W - 1)
        rows.append({"alternation": int(alternation), "rate_mbit": float(rate), "comm": comm, "batch_size": int(batch),
                     "steps": len(comm_s), "comm_ms": 1e3 * statistics.fmean(comm_s),
                     "comm_sd_ms": 1e3 * statistics.stdev(comm_s), "comm_ms_per_wire_step":
                         1e3 * statistics.fmean(comm_s) / wire_steps, "run": str(run)})
    if not rows:
        print(f"latency_runs.py: error: no runs under {a.root} (a*/rate*/COMM/b*/log.jsonl)", file=sys.stderr)
        return 2
    atomic_write_csv(a.out, rows)
    for r in rows:
        print(f"a{r['alternation']} {r['rate_mbit']:g} Mbit/s {r['comm']:>8} batch {r['batch_size']}: "
              f"{r['comm_ms']:6.1f} +- {r['comm_sd_ms']:4.1f} ms a step ({r['comm_ms_per_wire_step']:.2f} a wire step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
