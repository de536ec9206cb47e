"""The paper build (fp4quant.analysis.paper) from the committed canonical results: its tables'
numbers read back against the CSVs they come from, no "nan", every number the prose quotes
defined, and (where latexmk and pdffonts exist) a PDF without Type 3 fonts."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis import paper
from fp4quant.analysis.tables import number

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "reference/figures-zen4/data/cpu/results"
STUDY = REPO / "reference/study-convergence"
STUDY_TP = REPO / "reference/study-tp/data/study_tp"
CLUSTERS = REPO / "data/projection_clusters.csv"
TOPOLOGY = REPO / "data/allreduce_2x2_emulated.csv"


PDF_TOOLS = bool(shutil.which("latexmk") and shutil.which("pdffonts"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build of the canonical paper for the module (`make paper`'s sources): its PDF too where
    latexmk is installed."""
    out = tmp_path_factory.mktemp("paper")
    paper.Paper(paper.Sources(RUN, STUDY, STUDY_TP, CLUSTERS, TOPOLOGY), out).build(pdf=PDF_TOOLS)
    return out


def test_the_module_builds_what_make_paper_builds():
    text = (REPO / "Makefile").read_text()
    words = re.search(r"^PAPER_SOURCES = ((?:.*\\\n)*.*)$", text, re.M).group(1).replace("\\\n", " ").split()
    assert dict(zip(words[::2], words[1::2])) == {
        "--results": str(RUN.relative_to(REPO)), "--study": str(STUDY.relative_to(REPO)),
        "--study-tp": str(STUDY_TP.relative_to(REPO)), "--clusters": str(CLUSTERS.relative_to(REPO)),
        "--topology": str(TOPOLOGY.relative_to(REPO))}, words


def rows(tex: Path, block: int = 0) -> list[list[str]]:
    """The body rows of the ``block``-th tabular of a generated table, cell by cell."""
    body = tex.read_text().split("\\begin{tabular}")[1 + block].split("\\end{tabular}")[0]
    lines = [x.strip() for x in body.split("\\hline")[2].strip().splitlines()]
    return [[c.strip() for c in x.removesuffix("\\\\").split(" & ")] for x in lines if x]


def macros(out: Path) -> dict[str, str]:
    return dict(re.findall(r"\\newcommand\{\\(\w+)\}\{(.*)\}", (out / "numbers.tex").read_text()))


def test_no_table_prints_nan(built):
    for tex in (built / "tables").glob("*.tex"):
        assert not re.search(r"\bnan\b", tex.read_text(), re.I), tex.name


def test_the_throughput_table_is_the_projection_and_the_emulation(built):
    c = pd.read_csv(CLUSTERS)
    got = rows(built / "tables/throughput.tex", 0)
    assert len(got) == len(c.groupby(["cluster", "tp"]))
    for row in got:
        g = c[(c.cluster == row[0]) & (c.tp == int(row[1]))].set_index("algorithm")
        assert row[2] == number(g.loc["nccl_bf16", "inter_node_bytes_per_node"] / 2**20, ".1f")
        for cell, algo in zip(row[5:], paper.ALGORITHMS):
            r = g.loc[algo]
            assert cell == f"{number(r.speedup, '.2f')} [{number(r.speedup_low, '.2f')}, {number(r.speedup_high, '.2f')}]"
    t = pd.read_csv(TOPOLOGY)
    t = t[t.study == "presets"]
    t = t[t.size_bytes == t.size_bytes.max()].set_index("series")
    measured = {r[0]: r for r in rows(built / "tables/throughput.tex", 1)}
    hier = measured["all-reduce 64 MiB, 2 x 2 ranks: hier. FP4"]
    assert hier[1].startswith(number(t.loc["fp4quant/hierarchical"].latency_s, ".2f") + " [")
    assert hier[2].startswith(number(t.loc["none/uncompressed"].latency_s / t.loc["fp4quant/hierarchical"].latency_s, ".2f"))
    tp = pd.read_csv(RUN / "throughput.csv")
    fq = tp[tp.comm == "fp4quant"].speedup_vs_bf16
    a, b = tp[tp.comm == "fp4quant"].tokens_per_s, tp[tp.comm == "bf16"].tokens_per_s  # unpaired: both spreads
    sd = a.mean() / b.mean() * math.hypot(a.std() / a.mean(), b.std() / b.mean())
    assert sd > 2 * fq.std()  # the BF16 runs' spread dominates: the fp4quant runs' alone understated it
    assert measured["training: fp4quant"][2] == f"{number(fq.mean(), '.2f')} $\\pm$ {number(sd, '.2f')}"
    assert macros(built)["fqEmuTrainSpeedupSD"] == number(sd, ".2f")
    assert macros(built)["fqEmuTrainSpeedup"] == number(fq.mean(), ".2f")
    dgx = c[(c.tp == 16) & c.cluster.str.contains("DGX") & (c.algorithm == "hierarchical_fp4")].iloc[0]
    assert macros(built)["fqProjDGXHier"] == number(dgx.speedup, ".2f")
    top = c[(c.tp == c.tp.max()) & (c.algorithm == "hierarchical_fp4")]
    holds = top[(top.speedup_low <= paper.PAPER_SPEEDUP) & (paper.PAPER_SPEEDUP <= top.speedup_high)].cluster
    assert macros(built)["fqProjHoldsPaper"] == "; ".join(holds) and len(holds) == 1


@pytest.mark.parametrize("clusters, topology, notes", [
    (True, True, ["(a) Projected", "(b, first rows) Emulated", "(b, last rows) Training"]),
    (False, True, ["(a, first rows) Emulated", "(a, last rows) Training"]),
    (True, False, ["(a) Projected", "(b) Training"]),
    (False, False, ["(a) Training"])])
def test_the_throughput_caption_names_each_block_by_its_letter(tmp_path, clusters, topology, notes):
    src = paper.Sources(RUN, clusters=CLUSTERS if clusters else None, topology=TOPOLOGY if topology else None)
    caption = paper.Paper(src, tmp_path).throughput_table().split("\\caption{")[1]
    assert re.findall(r"\(([ab])(?:, (?:first|last) rows)?\) \w+", caption) == [n[1] for n in notes], caption
    for note in notes:
        assert note in caption, (note, caption)
    assert caption.count("\\begin{tabular}") == clusters + 1


def test_the_ablation_table_is_the_kernels_the_codec_and_the_study(built):
    got = {r[0].split(":")[0].replace("\\_", "_"): r for r in rows(built / "tables/ablation.tex")}
    assert set(got) == {"fp4quant (all three)", *paper.ABLATIONS}
    k = pd.read_csv(RUN / "kernels.csv.xz")
    q = k[(k.op == "quantize") & (k.impl == "native")]
    q = q[q.size_bytes == q.size_bytes.max()]
    q = q[q.threads == q.threads.max()].set_index("preset")
    e = pd.read_csv(RUN / "error.csv")
    e = e[e.study == "presets"].set_index(["config", "kind"]).sqnr_db
    conv = pd.read_csv(STUDY / "results/convergence.csv")
    for name in paper.ABLATIONS:
        row = got[name]
        assert row[1] == f"{number(e[name, 'outlier_channels'], '.2f')} " \
                         f"({number(e[name, 'outlier_channels'] - e['fp4quant', 'outlier_channels'], '+.2f')})"
        assert row[3].startswith(f"{number(q.loc[name].gbps, '.2f')} ({number(100 * (q.loc[name].gbps / q.loc['fp4quant'].gbps - 1), '+.0f')}")
        if name == "naive_pack":  # on a CPU one kernel runs both: the change is an A/A control, said so
            assert row[4].startswith("none") and row[5] == "--" and row[3].endswith(" A/A")
            assert "A/A control" in macros(built)["fqAblNaivePackNote"]
            assert "A/A: both presets ran one kernel" in (built / "tables/ablation.tex").read_text()
            continue
        a = conv[conv.config == name].set_index("seed").final_val_loss
        b = conv[conv.config == "fp4quant"].set_index("seed").final_val_loss
        d = (a - b).dropna()
        assert row[4].startswith(number(d.mean(), "+.3f") + " [") and row[5] == str(len(d))
        key = "fqAbl" + "".join(w.title() for w in name.split("_"))
        assert macros(built)[f"{key}Loss"] == number(d.mean(), "+.3f")
        assert macros(built)[f"{key}Outliers"] == number(e[name, "outlier_channels"] - e["fp4quant", "outlier_channels"], "+.2f")


def test_the_convergence_table_is_the_tp_study(built):
    t = pd.read_csv(STUDY_TP / "results/tp_summary.csv")
    got = rows(built / "tables/convergence.tex")
    assert len(got) == len(t)
    for r, x in zip(got, t.itertuples()):
        assert r[:3] == [str(x.tp), x.config.replace("_", "\\_"), str(x.n)], r
        assert r[3] == f"{number(x.val_loss_mean, '.4f')} $\\pm$ {number(x.val_loss_sd, '.4f')}", r
        if pd.isna(x.diff_mean):
            assert r[4:] == ["", ""], r
        else:
            assert r[4] == f"{number(x.diff_mean, '+.3f')} [{number(x.ci_low, '+.3f')}, {number(x.ci_high, '+.3f')}]"
            assert r[5] == x.verdict.split(" (the 90")[0], r


def test_the_convergence_table_without_a_tp_study_is_the_tp2_study(tmp_path):
    s = pd.read_csv(STUDY / "results/convergence_summary.csv").set_index("config")
    got = rows_of(paper.Paper(paper.Sources(RUN, STUDY), tmp_path).convergence_table())
    assert [r[0].replace("\\_", "_") for r in got][:2] == ["bf16", "fp4quant"] and len(got) == len(s)
    for r in got:
        x = s.loc[r[0].replace("\\_", "_")]
        assert r[1] == str(x.n) and r[2] == f"{number(x.val_loss_mean, '.4f')} $\\pm$ {number(x.val_loss_sd, '.4f')}"
        if not pd.isna(x.diff_mean):
            assert r[3] == f"{number(x.diff_mean, '+.3f')} [{number(x.ci_low, '+.3f')}, {number(x.ci_high, '+.3f')}]"


def test_the_convergence_table_of_a_tp_study_carries_its_verdicts(tmp_path, capsys):
    from fp4quant.analysis.__main__ import main as analysis_main
    from test_study_tp import tp_run
    import numpy as np

    runs = []
    rng = np.random.default_rng(3)
    for s in range(5):
        base = 2.0 + 0.02 * s + rng.normal(0, 0.03, size=8)
        runs += [tp_run(tmp_path / "runs", 16, "bf16", s, base), tp_run(tmp_path / "runs", 16, "fp4quant", s, base + 0.01)]
    assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--margin", "0.05",
                          "--out-dir", str(tmp_path / "study/results"), "--figure", str(tmp_path / "f.pdf")]) == 0
    build = paper.Paper(paper.Sources(RUN, None, tmp_path / "study"), tmp_path / "out")
    got = rows_of(build.convergence_table())
    t = pd.read_csv(tmp_path / "study/results/tp_summary.csv")
    fq = t[t.config == "fp4quant"].iloc[0]
    assert got[1][:3] == ["16", "fp4quant", "5"] and got[1][5] == "within the margin"
    assert got[1][4] == f"{number(fq.diff_mean, '+.3f')} [{number(fq.ci_low, '+.3f')}, {number(fq.ci_high, '+.3f')}]"
    assert build.numbers["fqTPdegree"] == "16" and build.numbers["fqTPverdict"].startswith("within the margin")
    assert build.numbers["fqTPseeds"] == "5" and build.numbers["fqTPgap"] == got[1][4]
    assert build.numbers["fqHaveTPtrend"] == "0" and build.numbers["fqTPtrend"] == "--"  # one degree: no slope
    for s in range(5):  # TP = 2 with no gap: the gap grows by 0.01 / 3 a doubling
        base = 2.0 + 0.02 * s + rng.normal(0, 0.03, size=8)
        runs += [tp_run(tmp_path / "runs", 2, "bf16", s, base), tp_run(tmp_path / "runs", 2, "fp4quant", s, base)]
    assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--margin", "0.05",
                          "--out-dir", str(tmp_path / "study/results"), "--figure", str(tmp_path / "f.pdf")]) == 0
    build = paper.Paper(paper.Sources(RUN, None, tmp_path / "study"), tmp_path / "out2")
    build.convergence_table()
    assert build.numbers["fqHaveTPtrend"] == "1" and build.numbers["fqTPtrendDegrees"] == "2, 16"
    assert build.numbers["fqTPtrend"].startswith(number(0.01 / 3, "+.4f") + " ["), build.numbers["fqTPtrend"]


def test_the_tp_studys_controls_are_stated_once_two_seeds_pair_up(tmp_path):
    """Float32 on the wire against BF16 at TP = 2, and BF16's rounding alone against float32 at
    TP = 1: a sentence for the paper with each paired difference and its verdict; the table's
    caption names the controls apart from the TP degrees."""
    from fp4quant.analysis.__main__ import main as analysis_main
    from test_study_tp import tp_run
    import numpy as np

    rng = np.random.default_rng(5)

    def build(seeds, name):
        runs = []
        for s in seeds:
            base = 2.0 + 0.02 * s + rng.normal(0, 0.03, size=8)
            runs += [tp_run(tmp_path / name, 2, "bf16", s, base),
                     tp_run(tmp_path / name, 2, "fp4quant", s, base + 0.01 + rng.normal(0, 0.002)),
                     tp_run(tmp_path / name, 2, "exact", s, base + 0.004 + rng.normal(0, 0.002)),
                     tp_run(tmp_path / name, 1, "exact", s, base + 0.03),
                     tp_run(tmp_path / name, 1, "bf16-alone", s, base + 0.03 + rng.normal(0, 0.002))]
        assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--margin", "0.05",
                              "--out-dir", str(tmp_path / name / "study/results"),
                              "--figure", str(tmp_path / name / "f.pdf")]) == 0
        built = paper.Paper(paper.Sources(RUN, None, tmp_path / name / "study"), tmp_path / name / "out")
        return built, built.convergence_table()

    one, _ = build([0], "one")  # one seed: nothing to state yet
    assert one.numbers["fqHaveTPcontrols"] == "0" and one.numbers["fqTPcontrols"] == "--"
    five, tex = build(range(5), "five")
    assert five.numbers["fqHaveTPcontrols"] == "1"
    said = five.numbers["fqTPcontrols"]
    assert said.count("; ") == 1, said
    alone, wire = said.split("; ")  # by TP degree
    assert wire.startswith("float32 on the wire minus BF16 on the wire at TP = 2 is +0.00"), wire
    assert wire.endswith("nats over 5 seeds, within the margin"), wire
    assert alone.startswith("BF16's rounding applied without communication minus float32 at TP = 1 is "), alone
    assert alone.endswith("nats over 5 seeds, within the margin"), alone
    assert "Convergence at TP = 2; controls: float32 on the wire (exact)" in tex, tex


def rows_of(tex: str) -> list[list[str]]:
    body = tex.split("\\begin{tabular}")[1].split("\\end{tabular}")[0]
    return [[c.strip() for c in x.strip().removesuffix("\\\\").split(" & ")]
            for x in body.split("\\hline")[2].strip().splitlines() if x.strip()]


@pytest.mark.parametrize("full", [True, False], ids=["all-sources", "run-only"])
def test_every_number_the_prose_quotes_is_generated(built, tmp_path, full):
    out = built
    if not full:  # a run of the workflow alone: the macros of the sources it lacks switch their prose off
        out = tmp_path / "run-only"
        paper.Paper(paper.Sources(RUN), out).build(pdf=False)
    used = set(re.findall(r"\\(fq[A-Za-z]+)", (REPO / "paper/main.tex").read_text()))
    defined = macros(out)
    assert used and not used - set(defined), sorted(used - set(defined))
    assert not any(re.search(r"\bnan\b", v) for v in defined.values())


def test_a_source_of_two_commits_is_refused(tmp_path):
    bad = tmp_path / "results"
    shutil.copytree(RUN, bad)
    e = pd.read_csv(bad / "error.csv")
    e.loc[0, "commit"] = "0" * 40
    e.to_csv(bad / "error.csv", index=False)
    with pytest.raises(paper.PaperError, match="error mixes commits"):
        paper.Paper(paper.Sources(bad), tmp_path / "out").ablation_table()


@pytest.mark.skipif(not PDF_TOOLS, reason="needs latexmk and pdffonts")
def test_the_pdf_embeds_no_type3_font(built):
    pdf = built / "main.pdf"
    fonts = subprocess.run(["pdffonts", str(pdf)], capture_output=True, text=True, check=True).stdout
    assert "Type 3" not in fonts and "TrueType" in fonts  # the figures' text is embedded Type 42
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "Table 4" in text and not re.search(r"\bnan\b", text)


def test_results_of_an_older_version_are_refused_in_one_line(tmp_path, capsys):
    from fp4quant.analysis.__main__ import main as analysis_main

    old = REPO / "reference/figures-xeon/data/cpu/results"  # frozen before the validation figure read latency_run
    assert analysis_main(["paper", "--results", str(old), "--out-dir", str(tmp_path), "--no-pdf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fp4quant.analysis: error: the validation figure cannot be drawn from") and \
        "older version" in err[-1]


def test_a_run_without_an_ablation_s_kernels_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "results"
    shutil.copytree(RUN, bad)
    k = pd.read_csv(bad / "kernels.csv.xz")
    k[k.preset != "naive_pack"].to_csv(bad / "kernels.csv.xz", index=False)
    with pytest.raises(paper.PaperError, match="missing: naive_pack$"):
        paper.Paper(paper.Sources(bad), tmp_path / "out").ablation_table()


def test_a_result_copied_in_from_another_run_is_refused_before_anything_is_written(tmp_path):
    """A throughput.csv of another run in the --results folder would be quoted as the canonical run's."""
    import shutil

    run = tmp_path / "results"
    shutil.copytree(RUN, run)
    other = pd.read_csv(run / "throughput.csv").assign(commit="e" * 40)
    other.to_csv(run / "throughput.csv", index=False)
    out = tmp_path / "build"
    with pytest.raises(paper.PaperError, match=r"mixes commits: .*\(throughput\.csv\)"):
        paper.Paper(paper.Sources(run, STUDY, None, CLUSTERS, TOPOLOGY), out).build(pdf=False)
    assert not out.exists() or not any(out.rglob("*.pdf"))


def test_a_failed_build_leaves_the_last_good_one_as_it_was(tmp_path, capsys):
    """Staged and swapped in whole: a second build that fails (here, results of an older version)
    changes nothing of the first, and its own partial files are kept apart for inspection."""
    out = tmp_path / "build"
    paper.Paper(paper.Sources(RUN, STUDY, None, CLUSTERS, TOPOLOGY), out).build(pdf=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    run = tmp_path / "results"
    shutil.copytree(RUN, run)
    pd.read_csv(run / "throughput.csv").drop(columns=["network"]).to_csv(run / "throughput.csv", index=False)
    with pytest.raises(paper.PaperError):
        paper.Paper(paper.Sources(run, STUDY, None, CLUSTERS, TOPOLOGY), out).build(pdf=False)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and (tmp_path / "build.failed").is_dir() and not (tmp_path / "build.building").exists()
