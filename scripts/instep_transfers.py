"""In-step transfers of two kinds side by side, to tell where the step model's latency goes wrong.

The probe (fp4quant.perfmodel.probe) times the link's latency as the gapped steps meet it:
each collective's wait idled (time.sleep, as long as the link fit says the bytes take) and
ended by a small real transfer of 4096 bytes.  This script alternates, in one process group
and on the same link, those steps with steps whose transfers carry the run's own bytes and
idle nothing (the trainer's compute and codec between them, its exchanges' sizes: the BF16
all-reduce of the message, or the two-shot's all-to-all and all-gather of fp4quant's
shards): the second kind is the run's communication with a stand-in for its arithmetic.

    python -m fp4quant.cluster run --rate-mbit 60 --nodes 2 -- scripts/instep_transfers.py \
        --rate-mbit 60 --out OUT/transfers_60.csv            # the rate only labels the rows
    python scripts/instep_transfers.py summarize OUT/transfers_*.csv [--run RATE:COMM:RUN_DIR ...] \
        --out OUT/summary.csv

Two more kinds since 150045e: ``message_no_sleep``, the ``message`` steps with the gaps'
sleeps of half a microsecond (about 70 us each on this VM, outside the transfers' timer)
skipped, and ``collective``, the trainer's own all-reduce of each whole tensor in those steps
(calibrate.InStepCollectives: its seconds in the collectives, as the trainer's timer).

Rows: rate_mbit, alternation, comm, kind (small_after_gap, message, message_no_sleep,
collective), step, wire_steps,
seconds (the least over the ranks, as the trainer counts a step's communication),
seconds_per_wire_step.  ``summarize`` gives per (rate, comm, kind) the median of the steps'
seconds a wire step and its min-max over all steps and over the alternations' medians, and
with --run the trainer's own steady steps (fp4quant.perfmodel.model_validation's communication, over
its wire steps) beside them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fp4quant.cluster.calibrate import CollectiveGaps, rank_step_seconds
from fp4quant.comm.plan import shard_values
from fp4quant.format import QuantConfig
from fp4quant.format.packed import layout
from fp4quant.models.model_config import ModelConfig
from fp4quant.parallel import CommConfig
from fp4quant.perfmodel.probe import LATENCY_MESSAGE_BYTES, collective_gaps, link_timings, workload_link_sizes
from fp4quant.perfmodel.model_validation import measured_components, read_log, steady
from fp4quant.provenance import atomic_write_csv, atomic_write_json, provenance
from fp4quant.threads import pin_threads


def message_bytes(comm: str, values: int, world: int) -> int:
    """Bytes of the run's all-reduce of ``values`` values (the two-shot's: a shard's message
    to every rank, as CollectiveGaps's exchanges send latency_bytes // world to each)."""
    config = QuantConfig.preset(comm)
    if not config.compressed:
        return 2 * values
    return world * layout(shard_values(values, world, config.block), config).nbytes


def measure(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--comms", nargs="+", default=["bf16", "fp4quant"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--rate-mbit", type=float, required=True, help="the link's rate (a label of the rows)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    pin_threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise SystemExit("instep_transfers: needs at least 2 ranks (run it under fp4quant.cluster run)")
    values = ModelConfig.preset(a.model).hidden_size * a.seq_len * a.batch_size
    presets = [c for c in a.comms if QuantConfig.preset(c).compressed]
    link = link_timings(workload_link_sizes(values, presets), 20, 16 << 20)
    gaps = collective_gaps(link, values, world, presets)  # the probe's idle waits
    rows = []
    for alternation in range(a.alternations):
        for comm in a.comms:
            codec = CommConfig.from_preset(comm) if QuantConfig.preset(comm).compressed else None
            # a gap of a microsecond: the hooks run, and the transfer itself is the wait
            for kind, gap, nbytes in (("small_after_gap", gaps[comm], LATENCY_MESSAGE_BYTES),
                                      ("message", 1e-6, message_bytes(comm, values, world)),
                                      ("message_no_sleep", 1e-6, message_bytes(comm, values, world)),
                                      ("collective", 0.0, message_bytes(comm, values, world))):
                transfers: list[dict] = []
                dist.barrier()
                if kind == "collective":  # the trainer's own all-reduce of each whole tensor
                    rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps,
                                      in_step_collectives=CommConfig.from_preset(comm), transfers=transfers)
                else:  # message_no_sleep: "message" with CollectiveGaps's sleeps (about 70 us each) skipped
                    sleep = CollectiveGaps._sleep
                    if kind == "message_no_sleep":
                        CollectiveGaps._sleep = lambda self, seconds: None
                    try:
                        rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps, collective_gap_s=gap,
                                          codec=codec, codec_s=[] if codec else None, latency_bytes=nbytes,
                                          transfers=transfers)
                    finally:
                        CollectiveGaps._sleep = sleep
                seconds = torch.tensor([t["seconds"] for t in transfers], dtype=torch.float64)
                dist.all_reduce(seconds, op=dist.ReduceOp.MIN)
                for i, (s, t) in enumerate(zip(seconds.tolist(), transfers)):
                    rows.append({"rate_mbit": a.rate_mbit, "alternation": alternation, "comm": comm, "kind": kind,
                                 "step": i, "transfer_bytes": nbytes, "gap_s": gap, "wire_steps": t["wire_steps"],
                                 "seconds": s, "seconds_per_wire_step": s / t["wire_steps"]})
                if rank == 0:
                    per = [r["seconds_per_wire_step"] for r in rows[-len(transfers):]]
                    print(f"{a.rate_mbit:g} Mbit/s #{alternation} {comm} {kind}: "
                          f"{statistics.median(per) * 1e3:.2f} ms a wire step ({min(per) * 1e3:.2f}-{max(per) * 1e3:.2f})",
                          file=sys.stderr)
    if rank == 0:
        atomic_write_csv(a.out, rows)
        atomic_write_json(a.out + ".meta.json", provenance(argv=argv, link=link, gaps_s=gaps, world=world))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def summarize(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csvs", nargs="+")
    ap.add_argument("--run", action="append", default=[], metavar="RATE:COMM:RUN_DIR",
                    help="a training run on that link (its steady steps' communication a wire step)")
    ap.add_argument("--skip", type=float, default=0.2)
    ap.add_argument("--world", type=int, default=2, help="the runs' TP ranks")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    groups: dict[tuple, list[dict]] = {}
    for path in a.csvs:
        for r in csv.DictReader(open(path)):
            groups.setdefault((float(r["rate_mbit"]), r["comm"], r["kind"]), []).append(r)
    out = []
    for (rate, comm, kind), rs in sorted(groups.items()):
        per = [float(r["seconds_per_wire_step"]) for r in rs]
        by_alt = [statistics.median(float(r["seconds_per_wire_step"]) for r in rs if r["alternation"] == k)
                  for k in sorted({r["alternation"] for r in rs})]
        out.append({"rate_mbit": rate, "comm": comm, "kind": kind, "steps": len(per),
                    "median_s": statistics.median(per), "min_s": min(per), "max_s": max(per),
                    "alternation_median_min_s": min(by_alt), "alternation_median_max_s": max(by_alt)})
    for spec in a.run:
        rate, comm, run = spec.split(":", 2)
        records = steady(read_log(Path(run)), a.skip)
        comm_s = measured_components(records)["communication"]
        # a two-shot or ring all-reduce over W ranks: 2 (W - 1) wire steps
        per = [c / ((r["fwd_calls"] + r["bwd_calls"]) * 2 * (a.world - 1)) for c, r in zip(comm_s, records)]
        out.append({"rate_mbit": float(rate), "comm": comm, "kind": "training_run", "steps": len(per),
                    "median_s": statistics.median(per), "min_s": min(per), "max_s": max(per)})
    atomic_write_csv(a.out, out)
    for r in out:
        print(f"{r['rate_mbit']:g} Mbit/s {r['comm']:9s} {r['kind']:16s} median {r['median_s'] * 1e3:.2f} ms "
              f"({r['min_s'] * 1e3:.2f}-{r['max_s'] * 1e3:.2f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(summarize(argv[1:]) if argv[:1] == ["summarize"] else measure(argv))
