"""The paper's table 3, convergence: the TP-degree study's paired gaps to BF16 with their verdicts
and controls where one is given, else the TP = 2 study's (or the run's own training); and the
numbers its prose quotes (fqTP*)."""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd

from . import figures, study_tp
from .paper_sources import PaperError, origin, paired, with_range
from .tables import _tex, mean_sd, number, table_float, tabular

if TYPE_CHECKING:
    from .paper import Paper

_float = partial(table_float, generator=__name__)  # a table float that names this module

CONTROL_WORDS = {(study_tp.CONTROL, study_tp.BASELINE): "float32 on the wire minus BF16 on the wire",
                 (study_tp.ALONE, study_tp.CONTROL): "BF16's rounding applied without communication minus float32"}


def control_sentence(rows: list[dict]) -> str:
    """The TP study's controls (study_tp.controls) with two or more paired seeds, in words."""
    said = [f"{CONTROL_WORDS[(r['config'], r['baseline'])]} at TP = {r['tp']} is "
            f"{with_range(r['diff_mean'], r['ci_low'], r['ci_high'], '+.3f')} nats over {int(r['n_pairs'])} seeds, "
            f"{_tex(study_tp.short_verdict(r['verdict']))}"
            for r in rows if r["n_pairs"] >= 2]
    return "; ".join(said)


def table(paper: Paper) -> str:
    """Table 3 (tables/convergence.tex), setting the fqTP* numbers on ``paper``."""
    for name in ("fqTPdegree", "fqTPgap", "fqTPseeds"):
        paper.number(name, "--")
    paper.number("fqTPverdict", "no paired comparison of fp4quant with BF16 yet")
    for name in ("fqTPtrend", "fqTPtrendDegrees", "fqTPcontrols"):
        paper.number(name, "--")
    paper.number("fqHaveTPtrend", "0")  # the prose on the gap against the degree needs two degrees
    paper.number("fqHaveTPcontrols", "0")  # the float32-vs-BF16 controls, once two seeds pair up
    if paper.src.study_tp is not None:
        t = paper.read(paper.src.study_tp / "results", "tp_summary")
        conv = paper.read(paper.src.study_tp / "results", "tp_convergence")
        hw = origin(conv.drop(columns=["commit"]), "the TP study")  # its runs span commits of one training code
        rows = []
        for r in t.itertuples():
            diff = "" if pd.isna(getattr(r, "diff_mean", math.nan)) else with_range(r.diff_mean, r.ci_low, r.ci_high, "+.3f")
            rows.append([str(r.tp), _tex(r.config), str(r.n), f"{number(r.val_loss_mean, '.4f')} $\\pm$ "
                         f"{number(r.val_loss_sd, '.4f') if not pd.isna(r.val_loss_sd) else '--'}", diff,
                         _tex(study_tp.short_verdict(getattr(r, "verdict", "")) if diff else "")])
        margin = float(t.margin.iloc[0])
        head = t[(t.config == "fp4quant") & t.diff_mean.notna()].sort_values("tp").iloc[-1:] if "diff_mean" in t else t[:0]
        if len(head):
            h = head.iloc[0]
            paper.number("fqTPdegree", str(h.tp))
            paper.number("fqTPgap", with_range(h.diff_mean, h.ci_low, h.ci_high, "+.3f"))
            paper.number("fqTPseeds", str(int(h.n_pairs)))
            paper.number("fqTPverdict", _tex(study_tp.short_verdict(h.verdict))
                        + f" (equivalence margin $\\pm${number(margin, 'g')} nats, declared before the runs)")
        if slope := study_tp.trend(conv):
            paper.number("fqHaveTPtrend", "1")
            paper.number("fqTPtrend", with_range(slope["slope"], slope["ci_low"], slope["ci_high"], "+.4f"))
            paper.number("fqTPtrendDegrees", ", ".join(map(str, slope["tps"])))
        if said := control_sentence(study_tp.controls(conv, margin)):
            paper.number("fqHaveTPcontrols", "1")
            paper.number("fqTPcontrols", said)
        first = conv.iloc[0]
        control = t.config.isin([study_tp.CONTROL, study_tp.ALONE])
        degrees = sorted(set(t[~control].tp))
        control_note = ("; controls: float32 on the wire (exact) and, at TP = 1, BF16's rounding without "
                        "communication (bf16-alone)" if control.any() else "")
        caption = (f"Convergence at TP = {', '.join(map(str, degrees))}{control_note} (measured, simulated ranks "
                   f"with the numerics of torchrun's; {_tex(hw)}): {_tex(first.model)}, {int(first.steps)} steps, "
                   f"{int(first.tokens):,} tokens a run; final validation loss mean $\\pm$ SD over the seeds; "
                   f"difference to BF16 at the same TP paired by seed [95\\% t interval]; against the margin "
                   f"$\\pm${number(margin, 'g')} nats declared before the runs: within it where both one-sided "
                   "tests reject at 5\\% (the 90\\% interval inside it), outside it where the whole 95\\% "
                   "interval lies beyond it, else not resolved.")
        return _float(caption, "tab:convergence", tabular(
            ["TP", "wire", "n", "val. loss", "$-$ BF16", "verdict"], rows, "llrrrl"))
    if paper.src.study is not None:
        conv = paper.read(paper.src.study / "results", "convergence")
        what = "the TP = 2 convergence study"
    else:  # the run's own training runs
        conv = figures.with_series(paper.read(paper.src.results, "training")).rename(
            columns={"series": "config", "val_loss": "final_val_loss"})
        what = "the run's training"
    hw = origin(conv, what)
    rows = []
    for config in figures._order(conv.config):
        g = conv[conv.config == config]
        d = paired(conv, config, "bf16") if config != "bf16" else None
        rows.append([_tex(config), str(len(g)), mean_sd(g.final_val_loss, ".4f"),
                     "" if d is None or d["n"] == 0 else with_range(d["mean"], d["low"], d["high"], "+.3f")])
    d = paired(conv, "fp4quant", "bf16")
    if d["n"] == 0:
        raise PaperError(f"{what}: no seed has both a bf16 and an fp4quant run")
    paper.number("fqTPdegree", str(int(conv.tp.iloc[0])) if "tp" in conv else "2")
    paper.number("fqTPgap", with_range(d["mean"], d["low"], d["high"], "+.3f"))
    paper.number("fqTPseeds", str(d["n"]))
    paper.number("fqTPverdict", "no equivalence test (no margin was declared for these runs)")
    first = conv.iloc[0]
    caption = (f"Convergence at TP = {int(first.tp) if 'tp' in conv else 2} only, {what} (measured, gloo ranks; "
               f"{_tex(hw)}); no TP-degree study was given. {int(first.steps)} steps; final validation loss mean "
               "$\\pm$ SD over the seeds; difference to BF16 paired by seed [95\\% t interval].")
    return _float(caption, "tab:convergence", tabular(["wire", "n", "val. loss", "$-$ BF16"], rows))
