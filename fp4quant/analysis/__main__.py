"""`python -m fp4quant.analysis collect|throughput|ablation|study|study-tp|figure|table|freeze|thaw ...`: the workflow's analysis steps.

Each step first checks that its inputs come from one machine, commit and torch version
(.origin), and that the training runs it puts side by side are complete and belong together
(.comparable), and refuses otherwise in one line; `freeze` copies a complete run into a reference folder,
and `thaw` puts a frozen study back under data/ to resume it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from ..provenance import atomic_write_csv, atomic_write_text
from . import STUDY_FIGURES, claims, collect, figures, paper, study, study_tp, tables, throughput, tradeoff
from .comparable import TP_VARIED, Incomparable, check_complete, check_runs
from .figures import FIGURES
from .freeze import freeze
from .origin import MixedOrigin, check_same_origin, check_same_training_code, origin_of_frame
from .tables import TABLES as PAPER_TABLES
from .thaw import thaw

TABLES = (*PAPER_TABLES, "regime")

# the result CSVs each figure and table reads (in the --results folder)
READS = {"throughput": ["throughput"], "regime": ["regime"], "kernels": ["kernels"], "allreduce": ["collectives"],
         "projection": ["projection"],
         "breakdown": ["breakdown"], "validation": ["model_validation"], "model_validation": ["model_validation"],
         "sensitivity": ["projection_sensitivity"], "topology": ["projection_clusters"],
         "convergence": ["curves", "training"], "error": ["error"], "formats": ["error"], "ablation": ["ablation"],
         "end_to_end": ["training", "throughput"],
         "traffic": ["traffic"], "tradeoff": ["convergence_summary"]}


def _write(df: pd.DataFrame, path: Path) -> None:
    atomic_write_csv(path, df.to_dict("records"))


def run_inputs(runs: list[str]) -> list[Path]:
    """What a training run's provenance is recorded in: its summary, and its cluster record if any."""
    return [p for d in map(Path, runs) for p in (d / "summary.json", d / "cluster.json")
            if p.name == "summary.json" or p.exists()]


def check_run_set(runs: list[str], *others) -> None:
    """Training runs compared in one table, and the other inputs of a step: runs that are complete
    (first: a missing summary would otherwise be reported as an input without an origin), one
    origin, and runs that belong together."""
    check_complete(runs)
    check_same_origin([*run_inputs(runs), *others])
    check_runs(runs)


def cmd_collect(a) -> None:
    check_run_set(a.runs, a.error, a.kernels, a.collectives,
                  *([a.cluster_collectives] if a.cluster_collectives else []))
    out = Path(a.out_dir)
    runs = collect.training(a.runs, a.profile)
    _write(runs, out / "training.csv")
    _write(collect.curves(a.runs, a.profile), out / "curves.csv")
    error = collect.benchmark(a.error, a.profile)
    kernels = collect.benchmark(a.kernels, a.profile)
    _write(error, out / "error.csv")
    _write(kernels, out / "kernels.csv")
    _write(collect.benchmark(a.collectives, a.profile), out / "collectives.csv")
    if a.cluster_collectives:  # measured on the emulated cluster: the all-reduce figure's top row
        emulated = collect.benchmark(a.cluster_collectives, a.profile)
        _write(emulated.assign(network=collect.network_of_record(a.cluster_record)), out / "collectives_emulated.csv")
    abl = [collect.ablation(name, error, kernels, runs) for name in a.ablations]
    _write(pd.concat(abl, ignore_index=True) if abl else pd.DataFrame(), out / "ablation.csv")


def cmd_throughput(a) -> None:
    check_run_set(a.runs)
    _write(throughput.throughput(a.runs, a.profile, a.warmup), Path(a.out))
    if a.breakdown_out:  # the same steps split by the trainer's timers
        _write(collect.breakdown(a.runs, a.profile, a.warmup), Path(a.breakdown_out))


def cmd_ablation(a) -> None:
    if collect.identical_bytes(a.name):  # a kernel ablation (naive_pack): the kernel benchmark's rows alone
        check_same_origin([Path(a.kernels)])
        _write(collect.packing(collect.benchmark(a.kernels, a.profile), a.name), Path(a.out))
        return
    if not a.runs or not a.error:
        raise ValueError(f"ablation {a.name} needs --runs and --error (only an ablation that sends fp4quant's "
                         "bytes, naive_pack, needs the kernel benchmark alone)")
    check_run_set(a.runs, a.error, a.kernels)
    runs = collect.training(a.runs, a.profile)
    df = collect.ablation(a.name, collect.benchmark(a.error, a.profile), collect.benchmark(a.kernels, a.profile), runs)
    _write(df, Path(a.out))


def cmd_study(a) -> None:
    """The convergence study's results: its runs (convergence.csv), their summary (CSV and
    Markdown), and, in their own folder, the training and curves tables the convergence figure reads."""
    check_run_set(a.runs)
    out = Path(a.out_dir)
    conv = study.runs(a.runs, a.profile)
    table = study.summary(conv, a.order)
    _write(conv, out / "convergence.csv")
    _write(table, out / "convergence_summary.csv")
    atomic_write_text(out / "convergence_summary.md", study.markdown(table, conv))
    _write(collect.training(a.runs, a.profile), Path(a.tables_dir) / "training.csv")
    _write(collect.curves(a.runs, a.profile), Path(a.tables_dir) / "curves.csv")
    print(study.markdown(table, conv), file=sys.stderr)


def cmd_study_tp(a) -> None:
    """The TP-degree study's results: its runs (tp_convergence.csv), their summary against BF16
    at each TP with the equivalence verdicts (CSV and Markdown), and the loss-gap figure."""
    check_complete(a.runs)
    code = check_same_training_code(a.runs)["code"]  # its runs gather over commits and machines: one code
    check_runs(a.runs, also_varied=TP_VARIED)
    out = Path(a.out_dir)
    # code: the digest each run records, or (a run of before it was recorded) its commit's
    conv = study.runs(a.runs, a.profile)
    conv = conv.assign(code=code, hours=[study_tp.run_hours(r) for r in conv.run],
                       cpus=[study_tp.run_cpus(r) for r in conv.run])
    table = study_tp.summary(conv, a.margin, a.order)
    text = study_tp.markdown(table, conv, study_tp.controls(conv, a.margin), a.cores_per_run)
    _write(conv, out / "tp_convergence.csv")
    _write(table, out / "tp_summary.csv")
    # the summary's rows are per (TP, config), not per run: its origin (the runs') beside it, as a
    # benchmark's .meta.json, so that a freeze can check it
    atomic_write_text(out / "tp_summary.csv.meta.json", json.dumps(origin_of_frame(conv, a.profile), sort_keys=True))
    atomic_write_text(out / "tp_summary.md", text)
    study_tp.loss_gap_figure(table, conv, a.figure, a.profile)
    print(text, file=sys.stderr)


def cmd_study_tp_sqnr(a) -> None:
    # each degree is measured in the sitting that trains its capture (bench.reduced_error --parts):
    # its rows may span commits and CPUs, of one torch
    check_same_origin([Path(a.summary)], keys=("torch",))
    study_tp.sqnr_figure(pd.read_csv(a.summary), a.out, a.profile)


def check_inputs(a) -> None:
    """The figure or table's inputs (--inputs: every input of the figure set) come from one origin."""
    paths = [Path(p) for p in a.inputs] or [Path(a.results) / f"{name}.csv" for name in READS[a.name]]
    traffic = getattr(a, "traffic", None)
    check_same_origin(paths + ([Path(traffic)] if traffic and Path(traffic) not in paths else []))


def cmd_figure(a) -> None:
    check_inputs(a)
    r = Path(a.results)
    read = lambda name: pd.read_csv(r / f"{name}.csv")  # noqa: E731
    if a.name == "throughput":
        figures.throughput(read("throughput"), a.out, a.profile)
    elif a.name == "kernels":
        figures.kernels(read("kernels"), a.out, a.profile)
    elif a.name == "allreduce":
        emulated = r / "collectives_emulated.csv"
        if emulated.exists():  # drawn beside the loopback one: it must come from the same run
            check_same_origin([r / "collectives.csv", emulated])
        emu = pd.read_csv(emulated) if emulated.exists() else None
        network = str(emu.network.iloc[0]) if emu is not None and len(emu) else ""
        figures.allreduce(read("collectives"), a.out, a.profile, emu, network)
    elif a.name == "breakdown":
        figures.breakdown(read("breakdown"), a.out, a.profile)
    elif a.name == "validation":
        figures.validation(read("model_validation"), a.out, a.profile)
    elif a.name == "projection":
        figures.projection(read("projection"), a.out, a.profile)
    elif a.name == "topology":
        figures.topology(read("projection_clusters"), a.out, a.profile)
    elif a.name == "sensitivity":
        figures.sensitivity(read("projection_sensitivity"), a.out, a.profile)
    elif a.name == "traffic":  # --results: the folder of bench/traffic.csv
        figures.traffic(read("traffic"), a.out, a.profile)
    elif a.name == "tradeoff":
        tradeoff.tradeoff(read("convergence_summary"), a.out, a.profile,
                         pd.read_csv(a.traffic) if a.traffic else None)
    elif a.name == "convergence":
        figures.convergence(read("curves"), read("training"), a.out, a.profile)
    else:
        figures.error(read("error"), a.out, a.profile)


def cmd_table(a) -> None:
    check_inputs(a)
    r = Path(a.results)
    if a.name == "formats":
        tables.formats(pd.read_csv(r / "error.csv"), a.out, a.profile)
    elif a.name == "ablation":
        tables.ablation(pd.read_csv(r / "ablation.csv"), a.out, a.profile)
    elif a.name == "model_validation":
        tables.model_validation(pd.read_csv(r / "model_validation.csv"), a.out, a.profile)
    elif a.name == "regime":
        throughput.table(pd.read_csv(r / "regime.csv"), a.out, a.profile)
    else:
        tables.end_to_end(pd.read_csv(r / "training.csv"), a.out, a.profile, pd.read_csv(r / "throughput.csv"))


def cmd_claims(a) -> int:
    generated = claims.table(a.root)
    if a.check is None:
        sys.stdout.write(generated)
        return 0
    if claims.quoted(a.check) != generated:
        print(f"fp4quant.analysis: {a.check}'s claims table differs from the evidence's: replace it with the output of "
              f"`python -m fp4quant.analysis claims`", file=sys.stderr)
        return 1
    return 0


def cmd_paper(a) -> None:
    """The paper's figures, tables and numbers from the given results, and main.pdf where latexmk is."""
    opt = lambda v: Path(v) if v else None  # noqa: E731
    clusters = a.clusters or next((str(p) for p in [Path(a.results) / "projection_clusters.csv"] if p.exists()), None)
    src = paper.Sources(Path(a.results), opt(a.study), opt(a.study_tp), opt(clusters), opt(a.topology))
    pdf = paper.Paper(src, Path(a.out_dir)).build(pdf=not a.no_pdf)
    print(f"fp4quant.analysis paper: {pdf or Path(a.out_dir) / 'main.tex'}"
          + ("" if pdf else " (no PDF: latexmk not found, or --no-pdf)"), file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.analysis", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="tidy result CSVs from run folders and benchmark CSVs")
    c.add_argument("--profile", required=True)
    c.add_argument("--runs", nargs="+", required=True, help="training run folders (each with summary.json)")
    c.add_argument("--error", required=True)
    c.add_argument("--kernels", required=True)
    c.add_argument("--collectives", required=True)
    c.add_argument("--ablations", nargs="*", default=[])
    c.add_argument("--cluster-collectives", default=None, help="collective benchmark CSV measured on the emulated cluster")
    c.add_argument("--cluster-record", default=None, help="its cluster record (the link, for the figure)")
    c.add_argument("--out-dir", required=True)
    h = sub.add_parser("throughput", help="the throughput runs' tokens/s, as a CSV (throughput.csv)")
    h.add_argument("--profile", required=True)
    h.add_argument("--runs", nargs="+", required=True, help="throughput run folders (each with summary.json)")
    h.add_argument("--warmup", type=int, required=True, help="leading steps of each run left out of its tokens/s")
    h.add_argument("--out", required=True)
    h.add_argument("--breakdown-out", default=None, help="also the steps' breakdown by the trainer's timers (breakdown.csv)")
    b = sub.add_parser("ablation", help="one ablation against the full method, as a CSV")
    b.add_argument("name")
    b.add_argument("--profile", required=True)
    b.add_argument("--runs", nargs="*", default=[], help="training run folders (not for naive_pack: same bytes)")
    b.add_argument("--error", default=None, help="error benchmark CSV (not for naive_pack)")
    b.add_argument("--kernels", required=True)
    b.add_argument("--out", required=True)
    s = sub.add_parser("study", help="the convergence study's results from its run folders")
    s.add_argument("--profile", required=True)
    s.add_argument("--runs", nargs="+", required=True, help="training run folders (each with summary.json)")
    s.add_argument("--order", nargs="*", default=[], help="the configurations' order in the summary")
    s.add_argument("--out-dir", required=True, help="convergence.csv, convergence_summary.csv and .md")
    s.add_argument("--tables-dir", required=True, help="training.csv and curves.csv (the convergence figure's)")
    st = sub.add_parser("study-tp", help="the TP-degree study's results and loss-gap figure from its run folders")
    st.add_argument("--profile", required=True)
    st.add_argument("--runs", nargs="+", required=True, help="training run folders (each with summary.json)")
    st.add_argument("--order", nargs="*", default=[], help="the configurations' order in the summary")
    st.add_argument("--margin", type=float, required=True, help="the equivalence margin (nats), declared before the runs")
    st.add_argument("--out-dir", required=True, help="tp_convergence.csv, tp_summary.csv and .md")
    st.add_argument("--figure", required=True, help="the loss gap against TP (PDF)")
    st.add_argument("--cores-per-run", type=int, default=None,
                    help="the cores each run had (the workflow's threads_per_run): the cost in core-hours")
    pp = sub.add_parser("paper", help="the paper's figures, tables and numbers from results files, and its PDF")
    pp.add_argument("--results", required=True, help="a run's results folder (data/<profile>/results, or a frozen one)")
    pp.add_argument("--study", default=None, help="the TP = 2 convergence study's folder (results/, bench/)")
    pp.add_argument("--study-tp", default=None, help="the TP-degree study's folder (results/, bench/)")
    pp.add_argument("--clusters", default=None, help="the topology projection (projection_clusters.csv)")
    pp.add_argument("--topology", default=None, help="its emulated 2 x 2 all-reduce (allreduce_2x2_emulated.csv)")
    pp.add_argument("--out-dir", required=True)
    pp.add_argument("--no-pdf", action="store_true", help="write the sources only")
    sq = sub.add_parser("study-tp-sqnr", help="the SQNR of the all-reduced traffic against TP (a figure)")
    sq.add_argument("--profile", required=True)
    sq.add_argument("--summary", required=True, help="bench.reduced_error's summary CSV")
    sq.add_argument("--out", required=True)
    f = sub.add_parser("figure", help="one of the paper's figures")
    f.add_argument("name", choices=list(dict.fromkeys(FIGURES + STUDY_FIGURES)))
    f.add_argument("--traffic", default=None,
                   help="tradeoff: bench.traffic's summary CSV (SQNR on captured TP traffic), drawn beside the loss gap")
    t = sub.add_parser("table", help="one of the paper's tables")
    t.add_argument("name", choices=TABLES)
    for p in (f, t):
        p.add_argument("--results", required=True, help="folder of the tidy result CSVs")
        p.add_argument("--profile", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--inputs", nargs="*", default=[],
                       help="files that must come from one machine, commit and torch (default: the CSVs it reads)")
    z = sub.add_parser("freeze", help="copy a complete run (data, figures, tables) into a reference folder")
    z.add_argument("--profile", required=True)
    z.add_argument("--to", required=True, help="the reference folder to create, e.g. reference/figures-<machine>")
    z.add_argument("--data", default="data", help="the folder holding <profile>/")
    z.add_argument("--figures", default="figures")
    z.add_argument("--tables", default="paper/tables")
    z.add_argument("--produced-by", default="make figures", help="the command that produced the run (for the README)")
    z.add_argument("--study", action="store_true",
                   help="a study keyed on the training code (provenance: training_code): its figures and tables in "
                        "its own folder, its runs of one training code over several commits and machines")
    z.add_argument("--partial", action="store_true",
                   help="with --study: freeze the runs its results name (the batches they cover) and leave the rest behind")
    w = sub.add_parser("thaw", help="put a frozen study back under data/, where the workflow resumes it")
    w.add_argument("--from", dest="ref", required=True, help="the study's frozen folder, e.g. reference/study-tp")
    w.add_argument("--data", default="data", help="the folder holding <profile>/")
    k = sub.add_parser("claims", help="the README's claims table, from the canonical evidence (reference/, data/)")
    k.add_argument("--root", default=".", help="the repository root the evidence paths are relative to")
    k.add_argument("--check", default=None, metavar="README",
                   help="exit 1 when this file's generated table differs from the evidence's")
    a = ap.parse_args(argv)
    try:
        if a.command == "claims":
            return cmd_claims(a)
        if a.command == "thaw":
            done = thaw(a.ref, a.data)
            print(f"thawed {a.ref} into {a.data}/{done['profile']}: {done['runs']} runs, {done['written']} files written, "
                  f"{done['kept']} already there", file=sys.stderr)
            return 0
        if a.command == "freeze":
            origin = freeze(a.profile, a.to, a.data, a.figures, a.tables, a.produced_by, study=a.study,
                            partial=a.partial)
            of = f"training code {origin['code']}" if "code" in origin else f"commit {origin['commit'][:12]}"
            print(f"froze profile {a.profile} ({'; '.join(origin['hardware'])}, {of}) into {a.to}", file=sys.stderr)
        else:
            {"collect": cmd_collect, "throughput": cmd_throughput, "ablation": cmd_ablation, "study": cmd_study,
             "study-tp": cmd_study_tp, "study-tp-sqnr": cmd_study_tp_sqnr, "figure": cmd_figure, "table": cmd_table,
             "paper": cmd_paper}[a.command](a)
    except (MixedOrigin, Incomparable, FileNotFoundError, FileExistsError, ValueError, study.StudyError) as exc:
        print(f"fp4quant.analysis: error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, AttributeError, IndexError) as exc:
        if a.command not in ("figure", "table"):
            raise
        # a results CSV without a column (or a row) the figure or table reads
        print(f"fp4quant.analysis: error: {a.command} {a.name}: the results in {a.results} lack what it reads "
              f"({type(exc).__name__}: {exc}): empty, or written by another version of the workflow?", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
