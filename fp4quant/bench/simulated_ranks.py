"""Training throughput of simulated TP ranks (threads of one process) against real ones
(torchrun processes over gloo), on this machine, in one run.

    python -m fp4quant.bench.simulated_ranks [--worlds 2] [--model small] [--comm fp4quant]
        [--steps 30] [--seq-len 128] [--batch-size 8] [--repeats 3] [--out data/bench/simulated_ranks.csv]

For every repeat and TP degree W, the same training run (fp4quant.train, the convergence
study's shapes by default) is launched twice, the two kinds alternating: W ranks under
torchrun (OMP_NUM_THREADS = cores / W each), and ``--simulate-tp`` (W threads sharing the
cores the same way).  Each repeat also trains the model at TP = 1 in one process (kind
``tp1``, on every core): the same arithmetic unsharded, the floor neither kind can beat by
much, since both compute every rank's shard on the same cores.  Each run's tokens/s is its summary's (the steps after the first
tenth); a row per run, with the run's final loss -- the two kinds train the same model the
same way, so their losses agree (tests/train/test_simulate.py holds them to 1e-5).  The
speed-up of a repeat is the simulated run's tokens/s over the real run's launched beside it;
their median and range over the repeats are printed and stored in <out>.meta.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..provenance import atomic_write_csv, atomic_write_json, provenance
from ..threads import cores

KINDS = ("real", "simulated")
FLOOR = "tp1"  # the whole model in one process


def launch(kind: str, world: int, train_args: list[str], out: Path) -> tuple[dict, float]:
    """One training run of ``kind``: (its summary, the process's wall seconds)."""
    n = cores()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if kind == FLOOR:
        env["OMP_NUM_THREADS"] = str(n)
        cmd = [sys.executable, "-m", "fp4quant.train", *train_args, "--tp", "1", "--out", str(out)]
    elif kind == "real":
        env["OMP_NUM_THREADS"] = str(max(1, n // world))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
               "-m", "fp4quant.train", *train_args, "--tp", str(world), "--out", str(out)]
    else:
        env["OMP_NUM_THREADS"] = str(n)  # the process's: shared out between the ranks
        cmd = [sys.executable, "-m", "fp4quant.train", *train_args, "--tp", str(world), "--simulate-tp",
               "--out", str(out)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{kind} run at W = {world} failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "summary.json").read_text()), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.bench.simulated_ranks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2", help="TP degrees, comma-separated")
    ap.add_argument("--model", default="small")
    ap.add_argument("--comm", default="fp4quant")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help="prepared tokens (default: the bundled corpus)")
    ap.add_argument("--out", default="data/bench/simulated_ranks.csv")
    a = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in a.worlds.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--worlds wants comma-separated integers, got {a.worlds!r}")
    if not worlds or min(worlds) < 2 or a.repeats < 1 or a.steps < 10:
        ap.error("--worlds must be >= 2, --repeats >= 1 and --steps >= 10 (the first tenth is left out)")
    train_args = ["--model", a.model, "--comm", a.comm, "--steps", str(a.steps), "--seq-len", str(a.seq_len),
                  "--batch-size", str(a.batch_size), "--eval-batches", "0", "--checkpoint-every", str(a.steps),
                  "--keep-checkpoints", "1"]
    if a.data:
        train_args += ["--data", a.data]
    prov = provenance("cpu", kind="measured", cores=cores(), worlds=worlds, repeats=a.repeats, train_args=train_args,
                      what="tokens/s of fp4quant.train: torchrun ranks over gloo vs --simulate-tp threads "
                           "(fp4quant.bench.simulated_ranks)")
    rows = []
    # the runs finished so far, rewritten after each: a failed run (or ^C) loses no finished one
    partial = Path(a.out + ".partial.csv")
    partial.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="simulated-ranks-"))
    try:
        for repeat in range(a.repeats):
            plan = [(1, FLOOR)] + [(w, k) for w in worlds for k in (KINDS if repeat % 2 == 0 else KINDS[::-1])]
            for world, kind in plan:  # neither kind always runs first
                out = scratch / f"{kind}-w{world}-r{repeat}"
                try:
                    summary, wall = launch(kind, world, train_args, out)
                except RuntimeError as exc:
                    kept = f"; the {len(rows)} runs finished are in {partial}" if rows else ""
                    print(f"fp4quant.bench.simulated_ranks: error: {exc} (repeat {repeat}){kept}", file=sys.stderr)
                    return 1
                rows.append({"world": world, "kind": kind, "repeat": repeat,
                             "tokens_per_s": summary["tokens_per_s"], "step_time_s": summary["step_time_s"],
                             "process_wall_s": wall, "final_loss": summary["final_loss"],
                             "hardware": prov["hardware"], "commit": prov["commit"]})
                print(f"W={world} {kind} repeat {repeat}: {summary['tokens_per_s']:.0f} tokens/s, "
                      f"final loss {summary['final_loss']:.6f}", file=sys.stderr)
                atomic_write_csv(partial, rows)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    speedups = {}
    for world in worlds:
        by = {(r["kind"], r["repeat"]): r["tokens_per_s"] for r in rows if r["world"] == world}
        floor = {i: r["tokens_per_s"] for r in rows if r["kind"] == FLOOR for i in [r["repeat"]]}
        ratios = [by["simulated", i] / by["real", i] for i in range(a.repeats)]
        of_tp1 = {k: [by[k, i] / floor[i] for i in range(a.repeats)] for k in KINDS}
        speedups[str(world)] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                "per_repeat": ratios,
                                **{f"{k}_of_tp1_median": statistics.median(v) for k, v in of_tp1.items()}}
        print(f"W={world}: simulated / real tokens/s = {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f} over {a.repeats} repeats); of TP = 1's tokens/s: "
              + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in of_tp1.items()), file=sys.stderr)
    atomic_write_csv(a.out, rows)
    atomic_write_json(a.out + ".meta.json", {**prov, "speedup": speedups})
    partial.unlink(missing_ok=True)
    print(f"wrote {len(rows)} rows to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
