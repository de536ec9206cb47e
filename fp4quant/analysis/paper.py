"""The paper (paper/main.tex): its figures, its three tables and every number its prose quotes,
built from results files alone, then main.pdf where latexmk is installed.

    python -m fp4quant.analysis paper --results reference/figures-zen4/data/cpu/results \\
        --study reference/study-convergence --clusters data/projection_clusters.csv \\
        --topology data/allreduce_2x2_emulated.csv [--study-tp data/study_tp] --out-dir paper/build

Sources, each a frozen or fresh result folder of one origin (one commit, machine and torch):
  --results   a run of the workflow (its results/ folder): the figures, the formats table, the
              emulated end-to-end throughput, the ablations' codec and kernel columns
  --study     the TP = 2 convergence study (its folder: results/, bench/): the ablations'
              training effect, and the convergence table where no TP study is given
  --study-tp  the TP-degree study (its folder: results/tp_summary.csv, tp_convergence.csv)
  --clusters  the topology projection, --topology its emulated 2 x 2 all-reduce
Each table says of each number whether it was measured, emulated or projected and on what;
numbers.tex defines one macro per number the prose quotes (tests/analysis/test_paper.py reads
the tables back against the CSVs).  Table 3 is built in paper_convergence, the sources' reading and
checks in paper_sources.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pandas as pd

from ..provenance import atomic_write_text
from . import figures, paper_convergence, study_tp, tradeoff
from .paper_sources import PaperError, Sources, need, origin, paired, read, with_range
from .tables import _tex, formats, mean_sd, number, table_float, tabular

PAPER_TEX = Path(__file__).resolve().parents[2] / "paper" / "main.tex"
PAPER_SPEEDUP = 1.56  # the paper's reported end-to-end speedup (Qwen-7B, H100 nodes): a quoted claim
ABLATIONS = {"no_fwht": "without the FWHT rotation", "single_scale": "one E4M3 scale, no FP32 group scale",
             "naive_pack": "packing without warp cooperation (same bytes)"}
# the results (under --results) the paper reads, all of one run
RESULTS_READ = ("error", "kernels", "throughput", "training", "collectives", "collectives_emulated", "breakdown",
                "projection", "projection_sensitivity", "model_validation", "regime", "ablation")
CLUSTERS = {"PCIe": "PCIe", "DGX": "DGX", "2 x 200G": "TwoNIC", "1 x 200G": "OneNIC"}  # macro names, first match
ALGORITHMS = {"flat_fp4": "flat FP4", "hierarchical_bf16": "hier. BF16", "hierarchical_fp4": "hier. FP4"}

_float = partial(table_float, generator=__name__)  # a table float that names this module


class Paper:
    """The build: ``numbers`` gathers the macros as the tables are made."""

    def __init__(self, src: Sources, out: Path):
        self.src, self.out = src, out
        self.numbers: dict[str, str] = {}
        self._frames: dict[tuple[Path, str], pd.DataFrame] = {}

    def read(self, folder: Path, name: str) -> pd.DataFrame:
        """``read``, parsing each source once a build (several tables and figures read it)."""
        key = (Path(folder), name)
        if key not in self._frames:
            self._frames[key] = read(folder, name)
        return self._frames[key].copy()

    def number(self, name: str, text: str) -> str:
        self.numbers[name] = text
        return text

    # ---- table 1: throughput -----------------------------------------------------------
    def throughput_table(self) -> str:
        blocks, notes = [], []
        letter = lambda: "abc"[len(notes)]  # noqa: E731  (the note of the block being added)
        # the prose quoting these is switched off without their source (fqHaveClusters, fqHaveTwoByTwo)
        for key in CLUSTERS.values():
            for word in ("Hier", "Flat", "HierRange", "FlatRange"):
                self.number(f"fqProj{key}{word}", "--")
        for name in ("fqEmuHierSpeedup", "fqEmuFlatSpeedup", "fqTwoByTwoMiB", "fqProjTP", "fqProjHoldsPaper"):
            self.number(name, "--")
        if self.src.clusters is not None:
            c = pd.read_csv(self.src.clusters)
            hw = origin(c, str(self.src.clusters))
            need(c, ["cluster", "tp", "algorithm", "speedup", "speedup_low", "speedup_high", "inter_node_bytes_per_node"],
                 str(self.src.clusters))
            top = int(c.tp.max())
            self.number("fqProjTP", str(top))
            rows, holds = [], []
            for (cluster, tp), g in c.groupby(["cluster", "tp"], sort=False):
                g = g.set_index("algorithm")
                missing = [a for a in ("nccl_bf16", *ALGORITHMS) if a not in g.index]
                if missing:
                    raise PaperError(f"{self.src.clusters}: {cluster} at TP {tp} has no {', '.join(missing)} row")
                mib = lambda a: number(g.loc[a, "inter_node_bytes_per_node"] / 2**20, ".1f")  # noqa: E731
                cells = [with_range(g.loc[a, "speedup"], g.loc[a, "speedup_low"], g.loc[a, "speedup_high"], ".2f")
                         for a in ALGORITHMS]
                rows.append([_tex(cluster), str(tp), mib("nccl_bf16"), mib("flat_fp4"), mib("hierarchical_fp4"), *cells])
                h = g.loc["hierarchical_fp4"]
                if tp == top and h.speedup_low <= PAPER_SPEEDUP <= h.speedup_high:
                    holds.append(_tex(cluster))
                key = next((v for k, v in CLUSTERS.items() if k in cluster), None)  # the clusters the prose names
                if tp == top and key is not None:
                    for a, word in (("hierarchical_fp4", "Hier"), ("flat_fp4", "Flat")):
                        self.number(f"fqProj{key}{word}", number(g.loc[a, "speedup"], ".2f"))
                        self.number(f"fqProj{key}{word}Range", f"[{number(g.loc[a, 'speedup_low'], '.2f')}, "
                                                               f"{number(g.loc[a, 'speedup_high'], '.2f')}]")
            self.number("fqProjHoldsPaper", "; ".join(holds) if holds else "none of the clusters")
            first = c.iloc[0]
            blocks.append(tabular(["cluster", "TP", "MiB: BF16 ring", "flat FP4", "hier. FP4",
                                    *[f"$\\times$ {a}" for a in ALGORITHMS.values()]], rows, "llrrr" + "r" * len(ALGORITHMS)))
            notes.append(f"({letter()}) Projected by the step model from assumed H100 figures ({_tex(hw)}; no "
                         f"measurement): {_tex(first.model)}, sequence {first.seq_len} x batch {first.batch_size}; MiB "
                         "each node sends between nodes per all-reduce (BF16 ring, flat two-shot FP4, hierarchical "
                         "FP4), and each algorithm's training throughput over NCCL's BF16 all-reduce, nominal inputs "
                         "[low, high over the uncertain ones].")
        rows, measured = [], []
        m = letter()  # the measured rows' block: emulated all-reduces (first rows, if any) and training
        if self.src.topology is not None:
            t = pd.read_csv(self.src.topology)
            hw = origin(t, str(self.src.topology))
            need(t, ["study", "series", "size_bytes", "latency_s", "latency_min_s", "latency_max_s", "iters"],
                 str(self.src.topology))
            t = t[t.study == "presets"]
            size = int(t.size_bytes.max())
            t = t[t.size_bytes == size].set_index("series")
            series = {"none/uncompressed": "gloo ring, BF16", "none/hierarchical": "hier. BF16",
                      "fp4quant/two_shot": "flat FP4", "fp4quant/hierarchical": "hier. FP4"}
            missing = [x for x in series if x not in t.index]
            if missing:
                raise PaperError(f"{self.src.topology}: no {', '.join(missing)} at {size} bytes")
            mib = number(size / 2**20, "g")
            base = t.loc["none/uncompressed"]
            for name, label in series.items():
                r = t.loc[name]
                rows.append([f"all-reduce {mib} MiB, 2 x 2 ranks: {label}", with_range(r.latency_s, r.latency_min_s,
                                                                                    r.latency_max_s, ".2f") + " s",
                             with_range(base.latency_s / r.latency_s, base.latency_s / r.latency_max_s,
                                    base.latency_s / r.latency_min_s, ".2f"), str(int(r.iters))])
            self.number("fqTwoByTwoMiB", mib)
            self.number("fqEmuHierSpeedup", number(base.latency_s / t.loc["fp4quant/hierarchical"].latency_s, ".2f"))
            self.number("fqEmuFlatSpeedup", number(base.latency_s / t.loc["fp4quant/two_shot"].latency_s, ".2f"))
            measured.append(f"({m}, first rows) Emulated: the all-reduce of {mib} MiB on two emulated nodes of "
                            f"two ranks (tc-shaped links; {_tex(hw)}), median [min, max] over the iterations; speedup "
                            "over the BF16 ring.")
        tp = figures.with_series(self.read(self.src.results, "throughput"))
        hw = origin(tp, "throughput")
        need(tp, ["series", "tokens_per_s", "speedup_vs_bf16", "network"], "throughput")
        bf16 = tp[tp.series == "bf16"].tokens_per_s
        for comm in figures._order(tp.series):
            g = tp[tp.series == comm]
            sd = figures.speedup_sd(g.tokens_per_s, bf16) if comm != "bf16" else math.nan  # both runs' spreads
            gain = mean_sd(g.speedup_vs_bf16, ".2f") if math.isnan(sd) else \
                f"{number(g.speedup_vs_bf16.mean(), '.2f')} $\\pm$ {number(sd, '.2f')}"
            rows.append([f"training: {_tex(comm)}", mean_sd(g.tokens_per_s, ".1f") + " tok/s", gain, str(len(g))])
        fq = tp[tp.series == "fp4quant"].speedup_vs_bf16
        if fq.empty:
            raise PaperError("throughput: no fp4quant runs")
        first = tp.iloc[0]
        self.number("fqEmuTrainSpeedup", number(fq.mean(), ".2f"))
        sd = figures.speedup_sd(tp[tp.series == "fp4quant"].tokens_per_s, bf16)
        self.number("fqEmuTrainSpeedupSD", number(sd, ".2f") if sd == sd else "--")  # both runs' spreads
        self.number("fqEmuTrainRuns", str(len(fq)))
        self.number("fqTrainNetwork", _tex(first.network))
        blocks.append(tabular(["measurement", "time or rate", "speedup", "n"], rows))
        measured.append(f"({m}{', last rows' if measured else ''}) Training "
                        f"throughput: {_tex(first.model)}, TP = {first.tp}, {first.steps} steps of sequence "
                        f"{first.seq_len} x batch {first.batch_size}, on {_tex(first.network)} ({_tex(hw)}); mean "
                        "$\\pm$ SD over n runs; speedup over BF16's mean.")
        notes += measured
        return _float("Throughput. " + " ".join(notes), "tab:throughput", *blocks)

    # ---- table 2: ablations ------------------------------------------------------------
    def ablation_table(self) -> str:
        err = self.read(self.src.results, "error")
        hw = origin(err, "error")
        need(err, ["study", "config", "kind", "sqnr_db"], "error")
        err = err[err.study == "presets"].set_index(["config", "kind"]).sqnr_db
        k = self.read(self.src.results, "kernels")
        origin(k, "kernels")
        need(k, ["op", "impl", "preset", "size_bytes", "threads", "gbps", "gbps_min", "gbps_max"], "kernels")
        q = k[(k.op == "quantize") & (k.impl == "native")]
        size = int(q.size_bytes.max()) if len(q) else 0
        q = q[q.size_bytes == size]
        q = q[q.threads == q.threads.max()].set_index("preset")
        kinds = ("outlier_channels", "small_gradient")
        missing = [x for x in ("fp4quant", *ABLATIONS) if x not in q.index] + \
                  [f"{x} on {kd}" for x in ("fp4quant", *ABLATIONS) for kd in kinds if (x, kd) not in err.index]
        if missing:
            raise PaperError(f"{self.src.results}: the ablation table needs the native quantize kernel's and the "
                             f"codec error's rows of fp4quant and every ablation; missing: {', '.join(missing)}")
        conv = None
        if self.src.study is not None:
            conv = self.read(self.src.study / "results", "convergence")
            study_hw = origin(conv, "the convergence study")
            conv = conv[conv.tp == 2] if "tp" in conv else conv
        f = q.loc["fp4quant"]
        aa = False  # a row whose kernel change is an A/A control
        rows = [["fp4quant (all three)", *[number(err["fp4quant", kd], ".2f") for kd in kinds],
                 with_range(f.gbps, f.gbps_min, f.gbps_max, ".2f"), "--", ""]]
        for name, what in ABLATIONS.items():
            a = q.loc[name]
            key = "fqAbl" + "".join(w.title() for w in name.split("_"))  # fqAblNoFwht, fqAblSingleScale, ...
            change = 100 * (a.gbps / f.gbps - 1)
            speed = (f"{number(a.gbps, '.2f')} ({number(change, '+.0f')}\\%, "
                     f"[{number(100 * (a.gbps_min / f.gbps_max - 1), '+.0f')}, {number(100 * (a.gbps_max / f.gbps_min - 1), '+.0f')}]\\%)")
            self.number(f"{key}Speed", number(change, "+.0f") + "\\%")
            sqnr = []
            for kd, word in zip(kinds, ("Outliers", "Small")):
                delta = err[name, kd] - err["fp4quant", kd]
                sqnr.append(f"{number(err[name, kd], '.2f')} ({number(delta, '+.2f')})")
                self.number(f"{key}{word}", number(delta, "+.2f"))
            self.number(f"{key}Loss", "--")
            if name == "naive_pack":
                train, seeds = "none: fp4quant's bytes", "--"
                # on a CPU both presets run one kernel: the change is the benchmark's noise, said so
                same = str(a.get("device", "cpu")) != "cuda"
                if same:
                    speed, aa = speed + " A/A", True
                self.number("fqAblNaivePackNote", "on this CPU both presets run the same kernel (the CPU kernels "
                            "never read the packing), so this change is the benchmark's noise, an A/A control; "
                            "the CUDA kernels, which differ, are not measured here" if same else
                            "the CUDA kernels store the codes with and without warp cooperation")
            elif conv is not None and name in set(conv.config) and (d := paired(conv, name, "fp4quant"))["n"]:
                train, seeds = with_range(d["mean"], d["low"], d["high"], "+.3f"), str(d["n"])
                self.number(f"{key}Loss", number(d["mean"], "+.3f"))
            else:
                train, seeds = "not run", "0"
            rows.append([f"{_tex(name)}: {what}", *sqnr, speed, train, seeds])
        caption = (f"Ablations, one mechanism removed at a time. Measured: SQNR (dB; change against fp4quant) of one "
                   f"quantize-dequantize on synthetic tensors with outlier channels and of small-magnitude gradients; "
                   f"the native quantize kernel's GB/s on {number(size / 2**20, 'g')} MiB at {int(q.threads.max())} "
                   "threads, median [min, max] over the timed calls, its change with the range from the slowest against "
                   f"the fastest ({_tex(hw)})"
                   + ("; A/A: both presets ran one kernel, so the change is the benchmark's noise. " if aa else ". ")
                   + (f"Training effect: final validation loss minus fp4quant's in the TP = 2 convergence study, paired "
                      f"by seed, mean [95\\% t interval] over the seeds ({_tex(study_hw)})." if conv is not None else
                      "Training effect: no convergence study given."))
        return _float(caption, "tab:ablation", tabular(
            ["ablation", "SQNR outliers", "SQNR small grad.", "quantize GB/s (change)", "val. loss $-$ fp4quant", "seeds"],
            rows))

    # ---- table 3: convergence (paper_convergence) ---------------------------------------
    def convergence_table(self) -> str:
        return paper_convergence.table(self)

    # ---- figures -----------------------------------------------------------------------
    def figures(self) -> list[str]:
        """Every figure from the sources (the run's profile on each footer); the names made."""
        r, fig = self.src.results, self.out / "figures"
        fig.mkdir(parents=True, exist_ok=True)
        profile = r.parent.name
        made = []

        def draw(name, fn, *args, **kw):
            try:
                fn(*args, fig / f"{name}.pdf", kw.pop("profile", profile), **kw)
            except (KeyError, AttributeError) as exc:
                # a column or row the figure reads is missing (results of an older version, or another file);
                # an AttributeError on anything but a frame is a bug, and is raised as such
                if isinstance(exc, AttributeError) and not isinstance(exc.obj, (pd.DataFrame, pd.Series)):
                    raise
                missing = exc.args[0] if isinstance(exc, KeyError) else exc.name
                raise PaperError(f"the {name} figure cannot be drawn from {r}: it has no column or row {missing!r} "
                                 "(written by an older version, or not the file the figure reads); rerun the "
                                 "workflow there") from None
            made.append(name)

        draw("error", figures.error, self.read(r, "error"))
        draw("kernels", figures.kernels, self.read(r, "kernels"))
        emulated = self.read(r, "collectives_emulated") if any(r.glob("collectives_emulated.csv*")) else None
        draw("allreduce", figures.allreduce, self.read(r, "collectives"), emulated=emulated,
             network=str(emulated.network.iloc[0]) if emulated is not None and "network" in emulated else "")
        draw("throughput", figures.throughput, self.read(r, "throughput"))
        draw("breakdown", figures.breakdown, self.read(r, "breakdown"))
        draw("convergence", figures.convergence, self.read(r, "curves"), self.read(r, "training"))
        draw("sensitivity", figures.sensitivity, self.read(r, "projection_sensitivity"))
        if any(r.glob("projection.csv*")):
            draw("projection", figures.projection, self.read(r, "projection"),
                 sensitivity=self.read(r, "projection_sensitivity"))
        if any(r.glob("model_validation.csv*")):
            draw("validation", figures.validation, self.read(r, "model_validation"))
        if self.src.clusters is not None:
            draw("topology", figures.topology, pd.read_csv(self.src.clusters), profile="projection")
        if self.src.study is not None:
            s = self.src.study
            draw("traffic", figures.traffic, self.read(s / "bench", "traffic"), profile="study")
            draw("tradeoff", tradeoff.tradeoff, self.read(s / "results", "convergence_summary"), profile="study",
                 traffic=self.read(s / "bench", "traffic_summary"))
        if self.src.study_tp is not None:
            t = self.src.study_tp / "results"
            draw("loss_gap_tp", study_tp.loss_gap_figure, self.read(t, "tp_summary"), self.read(t, "tp_convergence"),
                 profile="study_tp")
            if any((self.src.study_tp / "bench").glob("reduced_error_summary.csv*")):
                draw("sqnr_tp", study_tp.sqnr_figure, self.read(self.src.study_tp / "bench", "reduced_error_summary"),
                     profile="study_tp")
        return made

    # ---- the whole ---------------------------------------------------------------------
    def check_one_run(self) -> None:
        """The --results folder is one run's: each result the paper reads from it of one commit and
        torch (a file copied in from another run would be quoted as this one's), checked before
        anything is written."""
        seen: dict[str, dict[str, str]] = {"commit": {}, "torch": {}}
        for name in RESULTS_READ:
            if not any((self.src.results / f"{name}.csv{x}").exists() for x in ("", ".xz")):
                continue
            df = self.read(self.src.results, name)
            for key, values in seen.items():
                for v in df[key].astype(str).unique() if key in df else ():
                    values.setdefault(v, name)
        for key, values in seen.items():
            if len(values) > 1:
                raise PaperError(f"{self.src.results} mixes {key}s: " + ", ".join(
                    f"{v[:12]} ({name}.csv)" for v, name in sorted(values.items())) + ": give one run's results")

    def build(self, pdf: bool = True) -> Path | None:
        """Figures, tables, numbers and (``pdf``, where latexmk is) main.pdf, built in a sibling
        folder and swapped in whole: a build that fails leaves the last good one as it was, and its
        own files in <out>.failed (the LaTeX log among them)."""
        self.check_one_run()
        final = self.out
        stage, failed, old = (final.with_name(final.name + x) for x in (".building", ".failed", ".old"))
        for d in (stage, failed, old):
            shutil.rmtree(d, ignore_errors=True)
        self.out = stage
        try:
            made = self._build(pdf)
        except BaseException as exc:
            if stage.exists():
                stage.rename(failed)
            if isinstance(exc, PaperError):
                raise PaperError(str(exc).replace(str(stage), str(failed))) from None
            raise
        finally:
            self.out = final
        if final.exists():
            final.rename(old)
        stage.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        return final / made.name if made else None

    def _build(self, pdf: bool) -> Path | None:
        tables = self.out / "tables"
        tables.mkdir(parents=True, exist_ok=True)
        made = self.figures()
        formats(self.read(self.src.results, "error"), tables / "formats.tex", self.src.results.parent.name)
        atomic_write_text(tables / "throughput.tex", self.throughput_table())
        atomic_write_text(tables / "ablation.tex", self.ablation_table())
        atomic_write_text(tables / "convergence.tex", self.convergence_table())
        for name in ("validation", "projection", "topology", "traffic", "tradeoff", "loss_gap_tp", "sqnr_tp"):
            self.number(f"fqHave{name.replace('_', '').title()}", "1" if name in made else "0")
        self.number("fqHaveClusters", "1" if self.src.clusters is not None else "0")
        self.number("fqHaveTwoByTwo", "1" if self.src.topology is not None else "0")
        self.number("fqRunHardware", _tex(origin(self.read(self.src.results, "error"), "error")))
        atomic_write_text(self.out / "numbers.tex", "% generated by fp4quant.analysis.paper; do not edit\n" + "".join(
            f"\\newcommand{{\\{k}}}{{{v}}}\n" for k, v in sorted(self.numbers.items())))
        shutil.copyfile(PAPER_TEX, self.out / "main.tex")
        if not pdf or shutil.which("latexmk") is None:
            return None
        log = self.out / "latexmk.log"
        with open(log, "w") as f:
            done = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "main.tex"],
                                  cwd=self.out, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise PaperError(f"latexmk failed on {self.out / 'main.tex'} (exit {done.returncode}): see {log}")
        return self.out / "main.pdf"
