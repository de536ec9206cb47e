"""The step model checked part by part against training runs on the emulated cluster.

    python -m fp4quant.perfmodel.model_validation --out model_validation.csv \
        --case PROBE.json [AFTER.json ...] [latency:RUN_DIR ...] RUN_DIR [RUN_DIR ...] [--case ...]

Each case is one link: a probe measured on it (fp4quant.perfmodel.probe; later ones bracket
the runs, see bracketed), the runs on it, each with the cluster record ``cluster.json``
beside its log, and per comm a latency run ``latency:RUN_DIR`` (the trainer on the same link
with fewer tokens a step, so other bytes).  Over each run's steady steps (the first ``--skip``
fraction dropped) the trainer's own timers give the measured components: codec (quantize_s,
dequantize_s), communication (comm_least_s: the least over the ranks), wait (comm_s -
comm_least_s), scalar (scalar_comm_s), compute (the rest of step_time_s), total.  The model
(fp4quant.perfmodel.model.step) predicts each from the probe alone, its link latency per wire
step the one that gives the latency run's communication (latency_for_comm; without latency
runs, the probe's in-step collectives): the trainer meets the link as the probe does not
(README: the step model, part by part).  Nothing is fitted to the runs validated.

Rows: config, comm, component, measured_s and its SD, predicted_s, rel_error (predicted /
measured - 1); on the communication row, measured_link_s (the logs' comm_link_s, the link's
time without waits for a peer; empty where the trainer did not time it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..models.model_config import ModelConfig
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from .model import Machine, Workload, fit_link, step

LATENCY_PREFIX = "latency:"  # a --case argument naming a latency run (LatencyRun), not a run to validate
COMPONENTS = ("compute", "quantize", "dequantize", "codec", "communication", "wait", "scalar", "total")


def read_log(run: Path) -> list[dict]:
    path = run / "log.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    return [json.loads(line) for line in lines if line.strip()]


def steady(records: list[dict], skip: float) -> list[dict]:
    """The steps after the first ``skip`` fraction (at least the first two dropped)."""
    if not 0 <= skip < 1:
        raise ValueError(f"skip must be a fraction in [0, 1), got {skip}")
    drop = max(2, int(len(records) * skip))
    if len(records) - drop < 3:
        raise ValueError(f"{len(records)} steps leave fewer than 3 steady ones after dropping {drop}")
    return records[drop:]


def measured_components(records: list[dict]) -> dict[str, list[float]]:
    """Per step: each component's seconds (see the module doc)."""
    out: dict[str, list[float]] = {c: [] for c in COMPONENTS}
    for r in records:
        codec = quant = dequant = comm = least = 0.0
        for d in ("fwd", "bwd"):
            codec += r[f"{d}_codec_s"]
            quant += r[f"{d}_quantize_s"]
            dequant += r[f"{d}_dequantize_s"]
            comm += r[f"{d}_comm_s"]
            least += r[f"{d}_comm_least_s"]
        total, scalar = r["step_time_s"], r["scalar_comm_s"]
        for name, value in (("total", total), ("codec", codec), ("communication", least), ("wait", comm - least),
                            ("scalar", scalar), ("compute", total - codec - comm - scalar), ("quantize", quant),
                            ("dequantize", dequant)):
            out[name].append(value)
    return out


def link_seconds(records: list[dict]) -> list[float] | None:
    """Per step, comm_link_s of both directions (the link's time in the TP collectives: no
    rank's wait for a slower peer in it, whichever rank is last; fp4quant.train logs it where
    the ranks share a clock); None where it did not."""
    if not all(f"{d}_comm_link_s" in r for r in records for d in ("fwd", "bwd")):
        return None
    return [r["fwd_comm_link_s"] + r["bwd_comm_link_s"] for r in records]


@dataclass(frozen=True)
class LatencyRun:
    """A short run of the trainer on a case's link under one comm, with other bytes a step
    than the runs it helps predict (fewer tokens): the model's latency per wire step is the
    one at which it gives this run's communication (machine_from_probe)."""

    run: Path
    comm: str
    workload: Workload
    link_rate_mbit: float | None
    comm_s: float  # its communication a step: the mean over its steady steps (module doc)


def run_workload(summary: dict) -> Workload:
    """The workload of a training run, from its summary.json."""
    cfg = summary["provenance"]["config"]
    return Workload(ModelConfig(**summary["model"]), summary["mesh"]["tp"], cfg["seq_len"], cfg["batch_size"],
                    summary["mesh"]["dp"])


def read_latency_run(run: Path, skip: float) -> LatencyRun:
    summary = json.loads((run / "summary.json").read_text())
    communication = measured_components(steady(read_log(run), skip))["communication"]
    return LatencyRun(run, summary["provenance"]["config"]["comm"], run_workload(summary),
                      _record(run).get("link_rate_mbit"), statistics.fmean(communication))


def latency_for_comm(w: Workload, m: Machine, comm: str, comm_s: float, most_s: float = 1.0) -> float:
    """The least latency per wire step at which the model's communication of ``w`` on ``m``
    under ``comm`` lasts ``comm_s`` a step (0 where the bytes alone take that long).  The
    model's communication never falls as the latency grows (a shaped link refills during it
    as much as it can save), so a bisection finds it."""
    def comm_at(latency: float) -> float:
        return step(w, replace(m, inter_latency=latency, intra_latency=latency), comm).comm_s

    if comm_at(0.0) >= comm_s:
        return 0.0
    if comm_at(most_s) < comm_s:
        raise ValueError(f"{comm}: {comm_s:.4g} s a step in the collectives is more than the model gives with "
                         f"{most_s:g} s a wire step of latency")
    low, high = 0.0, most_s
    for _ in range(60):  # to well under a nanosecond
        mid = (low + high) / 2
        low, high = (mid, high) if comm_at(mid) < comm_s else (low, mid)
    return high


def machine_from_probe(probe: dict, burst_bytes: float, comm: str | None = None, workload: Workload | None = None,
                       latency_run: LatencyRun | None = None) -> tuple[Machine, dict]:
    """The emulated machine as the probe measured it (see fp4quant.perfmodel.probe), its
    compute as the probe timed it under ``comm``'s waits where the probe has that; its
    latency per wire step the one at which the model gives the communication of
    ``latency_run`` (a run of the trainer under ``comm`` with other bytes: latency_for_comm),
    else, with ``workload`` (the run's) and the probe's in-step collectives of ``comm``, of
    those (at their share of each tensor)."""
    link = sorted(probe["link"], key=lambda r: r["size_bytes"])
    by_comm = probe["compute_by_comm"]
    compute = by_comm.get(comm) or by_comm["bf16"]  # a comm it did not time: BF16's waits
    # medians for the bandwidth's slope; the smallest message's mean over the probe's many for
    # the latency, which a run's many small all-reduces add up to
    latencies = [r["latency_mean_s"] if i == 0 else r["latency_s"] for i, r in enumerate(link)]
    alpha, bw = fit_link([r["size_bytes"] for r in link], latencies, probe["world"], burst_bytes)
    # the latency as the run's own primitives met it after compute, where the probe timed that
    source = "in-step transfers" if "wire_step_latency_s" in compute else "link fit"
    alpha = compute.get("wire_step_latency_s", alpha)
    # the codec inside the run's own all-reduces in the probe's steps (a comm without a codec,
    # BF16, has none there: the probe's loops stand in, unused)
    table = compute.get("collective_codec_values_per_s") or probe["codec_values_per_s"]
    codec = {k: dict(ops) for k, ops in table.items()}
    m = Machine(name="emulated cluster (probed)", rank_flops=compute["rank_flops"], inter_bw=bw, inter_latency=alpha,
                intra_bw=bw, intra_latency=alpha, ranks_per_node=1, codec_values_per_s=codec,
                burst_bytes=burst_bytes,
                scalar_allreduce_s=compute["scalar_allreduce_s"], skew_s=compute["skew_s"])
    fit = {"fitted_latency_s": alpha, "latency_source": source, "fitted_bandwidth_Bps": bw,
           "burst_bytes": burst_bytes}
    if latency_run is not None:
        if comm is None or latency_run.comm != comm:
            raise ValueError(f"{latency_run.run}: a latency run under {latency_run.comm} cannot give the latency "
                             f"of {comm}")
        alpha = latency_for_comm(latency_run.workload, m, comm, latency_run.comm_s)
        fit.update(probed_latency_s=fit["fitted_latency_s"], fitted_latency_s=alpha,
                   latency_source=f"the trainer's collectives in a run of {latency_run.workload.tokens} tokens a step",
                   latency_run=str(latency_run.run), latency_run_comm_s=latency_run.comm_s)
        m = replace(m, inter_latency=alpha, intra_latency=alpha)
    elif workload is not None and comm is not None and "collective_comm_s" in compute:
        fraction = compute["collective_fraction"]
        alpha = latency_for_comm(replace(workload, message_fraction=fraction), m, comm, compute["collective_comm_s"])
        m = replace(m, inter_latency=alpha, intra_latency=alpha)
        fit.update(fitted_latency_s=alpha, in_step_transfer_latency_s=fit["fitted_latency_s"],
                   latency_source=f"in-step collectives of {fraction:g} of each tensor")
    return m, fit


def _harmonic(values: list[float]) -> float:
    """A rate averaged as its times are (values/s -> mean seconds a value)."""
    return 1.0 / statistics.fmean(1.0 / v for v in values)


def _merge_compute(entries: list[dict]) -> dict:
    """One comm's compute_by_comm entries of several probes, as one: rates by their mean
    times (harmonic), seconds by their mean, every rank's steps together; keys that not every
    probe has, and per-rank detail (codec_values_per_s_by_rank), are left out."""
    merged: dict = {}
    for key in set.intersection(*(set(e) for e in entries)):
        values = [e[key] for e in entries]
        if key == "rank_flops":
            merged[key] = _harmonic(values)
        elif key == "step_s":
            merged[key] = [sum(ranks, []) for ranks in zip(*values)]
        elif key in ("codec_values_per_s", "collective_codec_values_per_s"):
            merged[key] = {k: {op: _harmonic([v[k][op] for v in values]) for op in values[0][k]}
                           for k in set.intersection(*(set(v) for v in values))}
        elif all(isinstance(v, (int, float)) for v in values):
            merged[key] = statistics.fmean(values)
    return merged


def bracketed(probes: list[dict], names: list[str]) -> dict:
    """The first probe (a full one) with its per-step inputs (compute_by_comm: compute, codec,
    in-step latency, scalar all-reduces, skew) averaged with the bracketing probes'
    (probe --gaps-from) timed after the runs; the link, burst and loops are the first's."""
    first, later = probes[0], probes[1:]
    if "link" not in first:
        raise ValueError(f"{names[0]}: a case's first probe must be a full probe (it has no link timings)")
    for p, name in zip(later, names[1:]):
        if "gaps_from" not in p:
            raise ValueError(f"{name}: a case's later probes must be bracketing probes (fp4quant.perfmodel.probe "
                             f"--gaps-from); this one is a full probe")
        if (p["world"], p["message_values"]) != (first["world"], first["message_values"]):
            raise ValueError(f"{name}: it probed {p['world']} ranks and {p['message_values']}-value messages, "
                             f"{names[0]} {first['world']} and {first['message_values']}")
    if not later:
        return first
    by_comm = {}
    for comm, entry in first["compute_by_comm"].items():
        missing = [name for p, name in zip(later, names[1:]) if comm not in p["compute_by_comm"]]
        if missing:
            raise ValueError(f"{', '.join(missing)}: no steps timed under {comm}, which {names[0]} timed")
        entries = [entry] + [p["compute_by_comm"][comm] for p in later]
        by_comm[comm] = {**_merge_compute(entries), "rank_flops_by_probe": [e["rank_flops"] for e in entries],
                         "wire_step_latency_s_by_probe": [e.get("wire_step_latency_s") for e in entries],
                         "collective_comm_s_by_probe": [e.get("collective_comm_s") for e in entries]}
    return {**first, "compute_by_comm": by_comm, "rank_flops": by_comm["bf16"]["rank_flops"],
            "skew_s": by_comm["bf16"]["skew_s"]}


def predicted_components(w: Workload, m: Machine, comm: str) -> dict[str, float]:
    """The model's seconds a step of each component (COMPONENTS)."""
    s = step(w, m, comm)
    return {"compute": s.compute_s, "scalar": s.scalar_s, "quantize": s.quantize_s, "dequantize": s.dequantize_s,
            "codec": s.codec_s, "communication": s.exposed_comm_s, "wait": s.skew_s, "total": s.total_s}


def _record(run: Path) -> dict:
    path = run / "cluster.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _latency_run_for(latency: dict[str, LatencyRun], run: Path, comm: str, w: Workload,
                     rate: float | None) -> LatencyRun | None:
    """The case's latency run under ``comm`` (None in a case without latency runs), checked
    against the run it helps predict."""
    if not latency:
        return None
    lr = latency.get(comm)
    if lr is None:
        raise ValueError(f"{run}: its case has latency runs under {', '.join(sorted(latency))} but none under {comm}")
    if lr.workload.tokens == w.tokens:
        raise ValueError(f"{lr.run}: its {w.tokens} tokens a step are {run}'s: a latency fitted to it would echo "
                         f"the run, not predict it (give the latency run another batch size or sequence length)")
    if lr.link_rate_mbit != rate:
        raise ValueError(f"{lr.run}: ran on a {lr.link_rate_mbit} Mbit/s link, {run} on {rate} Mbit/s")
    return lr


def case_rows(probe_path: Path | list[Path], runs: list[Path], skip: float,
              latency_runs: list[Path] = ()) -> tuple[list[dict], dict]:
    """Rows of the runs on one link; ``probe_path``: its probe, or its probe and the
    bracketing probes after the runs (see bracketed); ``latency_runs``: one LatencyRun per
    comm of the runs (their latency then comes from it)."""
    paths = probe_path if isinstance(probe_path, list) else [probe_path]
    probe = bracketed([json.loads(p.read_text()) for p in paths], [str(p) for p in paths])
    latency: dict[str, LatencyRun] = {}
    for path in latency_runs:
        lr = read_latency_run(path, skip)
        if lr.comm in latency:
            raise ValueError(f"{path}: a second latency run under {lr.comm} in one case (the first: "
                             f"{latency[lr.comm].run})")
        latency[lr.comm] = lr
    rows, fits = [], {}
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        cfg = summary["provenance"]["config"]
        record = _record(run)
        w = run_workload(summary)
        rate = record.get("link_rate_mbit")
        latency_run = _latency_run_for(latency, run, cfg["comm"], w, rate)
        burst = float(record.get("link_burst_bytes", 0))
        machine, fit = machine_from_probe(probe, burst, cfg["comm"], w, latency_run)
        if not rate:
            name = f"{cfg['comm']} ({run.name})"
        elif record["emulated"]:
            name = f"{cfg['comm']} @ {rate:g} Mbit/s"
        else:  # the cluster fell back to loopback: the rate was asked for, not shaped
            name = f"{cfg['comm']} (loopback; {rate:g} Mbit/s asked)"
        fits[name] = {**fit, "run": str(run), "emulated": record.get("emulated"), "probes": [str(p) for p in paths],
                      **{k: probe["compute_by_comm"].get(cfg["comm"], {}).get(k)
                         for k in ("rank_flops_by_probe", "wire_step_latency_s_by_probe", "collective_comm_s_by_probe")}}
        records = steady(read_log(run), skip)
        measured = measured_components(records)
        link = link_seconds(records)
        predicted = predicted_components(w, machine, cfg["comm"])
        for comp in COMPONENTS:
            values = measured[comp]
            mean = statistics.fmean(values)
            pred = predicted[comp]
            rows.append({
                "config": name, "comm": cfg["comm"], "link_rate_mbit": rate if rate else "", "component": comp,
                "measured_s": mean, "measured_sd_s": statistics.stdev(values) if len(values) > 1 else 0.0,
                "predicted_s": pred, "rel_error": pred / mean - 1 if mean > 0 else ("" if pred == 0 else float("inf")),
                "steps": len(values), "run": str(run), "probe": " ".join(str(p) for p in paths),
                "probe_load_1min": probe["load_average_1min"],
                "latency_run": str(latency_run.run) if latency_run else "",
                "measured_link_s": statistics.fmean(link) if link and comp == "communication" else "",
            })
    return rows, fits


def probes_said(df) -> str:
    """How the rows' predictions were probed, in words (for captions)."""
    probes = df["probe"].astype(str)
    said = ("probes of the same links and ranks before and after the runs (their mean)"
            if len(probes) and all(" " in p for p in probes) else "a probe of the same links and ranks")
    latency = df["latency_run"].astype("string").fillna("")
    if len(latency) and all(latency):
        said += ", the latency from the trainer's runs on each link with fewer tokens a step"
    return said


def summary(df):
    """One row per (config, component) over its repeats (model_validation.csv's rows):
    measured_s and predicted_s their means,
    measured_sd_s the SD of the repeats' means (one repeat: its SD over steady steps),
    rel_error the mean of the repeats' errors and rel_error_min / _max their range."""
    import pandas as pd

    columns = ["config", "comm", "component", "repeats", "measured_s", "measured_sd_s", "predicted_s", "rel_error",
               "rel_error_min", "rel_error_max"]
    out = []
    for (config, component), g in df.groupby(["config", "component"], sort=False):
        errors = pd.to_numeric(g.rel_error, errors="coerce").dropna()
        out.append({"config": config, "comm": g.comm.iloc[0], "component": component, "repeats": len(g),
                    "measured_s": g.measured_s.mean(),
                    "measured_sd_s": g.measured_s.std() if len(g) > 1 else g.measured_sd_s.iloc[0],
                    "predicted_s": g.predicted_s.mean(),
                    "rel_error": errors.mean() if len(errors) else "",
                    "rel_error_min": errors.min() if len(errors) else "", "rel_error_max": errors.max() if len(errors) else ""})
    return pd.DataFrame(out, columns=columns)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", nargs="+", action="append", required=True, metavar="PROBE_JSON RUN_DIR",
                    help="a probe, any bracketing probes after the runs (.json), and the runs on its link, "
                         f"with {LATENCY_PREFIX}RUN_DIR for each comm's latency run if any (repeat per link)")
    ap.add_argument("--skip", type=float, default=0.2, help="fraction of each run's first steps dropped")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rows, fits = [], {}
    try:
        for case in a.case:
            n = next((i for i, arg in enumerate(case) if not arg.endswith(".json")), len(case))
            latency = [Path(arg[len(LATENCY_PREFIX):]) for arg in case[n:] if arg.startswith(LATENCY_PREFIX)]
            runs = [Path(arg) for arg in case[n:] if not arg.startswith(LATENCY_PREFIX)]
            if n == 0 or not runs or any(arg.endswith(".json") for arg in case[n:]):
                raise ValueError(f"--case needs its probe JSONs, then at least one run directory, got {case}")
            r, f = case_rows([Path(p) for p in case[:n]], runs, a.skip, latency)
            rows += r
            for name, fit in f.items():  # each repeat's fit, in the order of the cases
                fits.setdefault(name, []).append(fit)
    except (ValueError, KeyError, OSError) as exc:
        print(f"fp4quant.perfmodel.model_validation: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    prov = provenance()
    seen: dict[tuple[str, str], int] = {}
    for r in rows:  # a configuration met again (another case on the same link) is a repeat
        key = (r["config"], r["component"])
        seen[key] = seen.get(key, 0) + 1
        r.update(repeat=seen[key], hardware=prov["hardware"], commit=prov["commit"], torch=prov["torch"])
    atomic_write_csv(a.out, rows)
    atomic_write_json(a.out + ".meta.json", provenance(fits=fits, skip=a.skip, cases=a.case))
    for r in rows:
        print(f"{r['config']:>24} {r['component']:>13}: measured {1e3 * r['measured_s']:8.2f} ms, "
              f"predicted {1e3 * r['predicted_s']:8.2f} ms ({100 * r['rel_error']:+.0f}%)"
              if r["rel_error"] != "" else f"{r['config']:>24} {r['component']:>13}: 0", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
