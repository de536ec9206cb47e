"""The convergence study at the paper's TP degrees (workflow/config/study_tp.yaml): does each
wire format's final validation loss stay within a margin of BF16's, declared before the runs,
as the number of ranks whose quantized partial sums are added grows from 2 to 16?

tp_convergence.csv  one row per run (fp4quant.analysis.study.runs: config, tp, seed, final
                    validation loss and its standard error over the validation batches...)
tp_summary.csv      one row per (TP, config): mean and SD over seeds; against BF16 at the same
                    TP, paired by seed (same initialization, batches and validation tokens): the
                    mean difference with its 95% t interval, the 90% interval and the p-values
                    of the two one-sided tests (TOST) against +-margin, and the verdict
tp_summary.md       the same as a table, the verdict sentences, fp4quant's gap against the TP
                    degree (its slope per doubling, over seeds), the control runs (float32 on the
                    wire against BF16; BF16's rounding alone at TP = 1 against float32), and the
                    pairs whose two runs trained on different CPU models

The verdict of a difference d (config - BF16) with margin m:
  within the margin   both one-sided tests reject at 5% (the 90% interval lies inside (-m, +m))
  outside the margin  the whole 95% interval lies beyond +m (worse) or below -m (better)
  not resolved        otherwise: how far the 90% interval reaches past the margin is stated
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pandas as pd
from scipy import stats

from . import style
from .figures import _finish, _order, palette
from .study import BASELINE, CONFIDENCE, StudyError, batch_paired_se, mean_interval, paired_difference

ALPHA = 0.05  # each one-sided test's level: TOST's interval is the (1 - 2 ALPHA) = 90% one
CONTROL = "exact"  # float32 on the wire: the control of the float32-vs-BF16 comparison
ALONE = "bf16-alone"  # TP = 1 with BF16's rounding where the wire rounds (fp4quant.train --rounding-alone)


def tost(d: np.ndarray, margin: float) -> dict:
    """Two one-sided t tests of the mean of the paired differences ``d`` against -margin and
    +margin, and the 90% interval; NaN for fewer than two pairs."""
    n = len(d)
    if n < 2:
        return {"ci90_low": math.nan, "ci90_high": math.nan, "p_lower": math.nan, "p_upper": math.nan}
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    half = float(stats.t.ppf(1 - ALPHA, n - 1) * se)
    if se == 0:  # identical differences: the tests are decided by the mean alone
        return {"ci90_low": mean, "ci90_high": mean, "p_lower": float(mean <= -margin),
                "p_upper": float(mean >= margin)}
    return {"ci90_low": mean - half, "ci90_high": mean + half,
            "p_lower": float(stats.t.sf((mean + margin) / se, n - 1)),  # H0: d <= -margin
            "p_upper": float(stats.t.cdf((mean - margin) / se, n - 1))}  # H0: d >= +margin


def verdict(row: dict, margin: float) -> str:
    """The comparison's outcome in words (see the module doc)."""
    if not (row["n_pairs"] >= 2):
        return "not resolved: fewer than two paired seeds"
    if max(row["p_lower"], row["p_upper"]) < ALPHA:
        return "within the margin"
    if row["ci_low"] > margin:
        return "outside the margin (worse)"
    if row["ci_high"] < -margin:
        return "outside the margin (better)"
    past = max(row["ci90_high"] - margin, -margin - row["ci90_low"])
    return f"not resolved, by {past:.3f} nats (the 90% interval reaches {row['ci90_low']:+.3f} .. {row['ci90_high']:+.3f})"


def short_verdict(text: str) -> str:
    """A verdict without its interval detail (" (the 90% interval reaches ..)"), as the tables quote it."""
    return str(text).split(" (the 90")[0]


def compare(conv: pd.DataFrame, config: str, baseline: str, tp: int, margin: float) -> dict:
    """``config`` against ``baseline`` at TP ``tp``, paired by seed."""
    g = conv[(conv.config == config) & (conv.tp == tp)].set_index("seed").sort_index()
    b = conv[(conv.config == baseline) & (conv.tp == tp)].set_index("seed").sort_index()
    row = paired_difference(g.final_val_loss, b.final_val_loss)
    seeds = sorted(set(g.index) & set(b.index))
    d = np.array([g.final_val_loss[s] - b.final_val_loss[s] for s in seeds], dtype=float)
    row.update(tost(d, margin))
    row["diff_batch_se"] = float(np.mean([batch_paired_se(_batches(g, s), _batches(b, s)) for s in seeds])) \
        if seeds else math.nan
    if "cpus" in conv:  # a run's numerics differ between CPU models from its first step: name such pairs
        row["pairs_across_cpus"] = ", ".join(str(s) for s in seeds if g.cpus[s] != b.cpus[s])
    row["verdict"] = verdict(row, margin)
    return row


def _batches(g: pd.DataFrame, seed) -> list[float]:
    return json.loads(g.val_batch_losses[seed])


def summary(conv: pd.DataFrame, margin: float, order: list[str] | None = None) -> pd.DataFrame:
    """One row per (TP, config) of ``conv`` (tp_convergence.csv), each config other than BF16
    compared with BF16 at its TP."""
    if not math.isfinite(margin) or margin <= 0:
        raise StudyError(f"the equivalence margin must be a positive number of nats, got {margin}")
    if conv.final_val_loss.isna().any():  # study.runs refuses them; a table built otherwise must too
        bad = conv[conv.final_val_loss.isna()].iloc[0]
        raise StudyError(f"{bad.config} at TP {bad.tp} seed {bad.seed} has no final validation loss (NaN)")
    names = [c for c in (order or []) if c in set(conv.config)] + sorted(set(conv.config) - set(order or []))
    rows = []
    for tp in sorted(set(conv.tp)):
        for name in names:
            g = conv[(conv.config == name) & (conv.tp == tp)]
            if g.empty:
                continue
            row = {"tp": int(tp), "config": name, "n": len(g), "steps": int(g.steps.iloc[0]),
                   "tokens": int(g.tokens.iloc[0]), "ranks": str(g.ranks.iloc[0]),
                   "val_loss_mean": float(g.final_val_loss.mean()),
                   "val_loss_sd": float(g.final_val_loss.std(ddof=1)) if len(g) > 1 else math.nan,
                   "margin": margin}
            if name != BASELINE and not conv[(conv.config == BASELINE) & (conv.tp == tp)].empty:
                row.update(compare(conv, name, BASELINE, tp, margin))
            rows.append(row)
    return pd.DataFrame(rows)


def controls(conv: pd.DataFrame, margin: float) -> list[dict]:
    """The float32-vs-BF16 question: float32 (exact) against BF16 on the wire at each TP both ran,
    and, at TP = 1, BF16's rounding alone (no communication) against float32."""
    out = []
    for tp in sorted(set(conv.tp)):
        have = set(conv[conv.tp == tp].config)
        if {CONTROL, BASELINE} <= have:
            out.append({"tp": int(tp), "config": CONTROL, "baseline": BASELINE,
                        **compare(conv, CONTROL, BASELINE, tp, margin)})
        if {ALONE, CONTROL} <= have:
            out.append({"tp": int(tp), "config": ALONE, "baseline": CONTROL,
                        **compare(conv, ALONE, CONTROL, tp, margin)})
    return out


def trend(conv: pd.DataFrame, config: str = "fp4quant") -> dict | None:
    """Does ``config``'s gap to BF16 grow with the number of ranks?  Each seed's paired gaps at the
    degrees it has (at least two) give that seed's least-squares slope against log2(TP); the mean
    slope over the seeds, with its 95% t interval, is the change of the gap per doubling of TP.
    A seed's runs at the several degrees share its initialization and batches, so the seeds, not
    the (seed, TP) points, are the independent samples.  None with fewer than two such seeds."""
    slopes = []
    for seed in sorted(set(conv.seed)):
        mine = conv[(conv.config == config) & (conv.seed == seed)].set_index("tp").final_val_loss
        base = conv[(conv.config == BASELINE) & (conv.seed == seed)].set_index("tp").final_val_loss
        tps = sorted(set(mine.index) & set(base.index))
        if len(tps) >= 2:
            slopes.append(float(np.polyfit(np.log2(tps), [mine[t] - base[t] for t in tps], 1)[0]))
    if len(slopes) < 2:
        return None
    mean, _, low, high = mean_interval(np.array(slopes))
    tps = sorted(set(conv[conv.config == config].tp) & set(conv[conv.config == BASELINE].tp))
    return {"config": config, "slope": mean, "ci_low": low, "ci_high": high, "n_seeds": len(slopes), "tps": tps}


def trend_sentence(t: dict | None) -> str:
    if t is None:
        return ""
    where = "lies above 0" if t["ci_low"] > 0 else "lies below 0" if t["ci_high"] < 0 else "spans 0"
    return (f"Against the TP degree: {t['config']} - {BASELINE} changes by {t['slope']:+.4f} nats per doubling of "
            f"TP [{t['ci_low']:+.4f}, {t['ci_high']:+.4f}] (95%; the mean over {t['n_seeds']} seeds of each seed's "
            f"least-squares slope against log2 TP over TP = {', '.join(map(str, t['tps']))}): the interval {where}.")


def run_hours(run: str | Path) -> float:
    """A run's compute time in hours: the median step time of its log times its logged steps, so
    that a process paused for a while (or a busy machine) counts as one typical step; evaluation
    and start-up are not counted; NaN without a step log."""
    log = Path(run) / "log.jsonl"
    if not log.exists():
        return float("nan")
    times = [r["step_time_s"] for r in map(json.loads, log.read_text().splitlines()) if "step_time_s" in r]
    return float(np.median(times)) * len(times) / 3600 if times else float("nan")


def run_cpus(run: str | Path) -> str:
    """The CPUs a run trained on: every part's (a run resumed on another machine has two)."""
    s = json.loads((Path(run) / "summary.json").read_text())
    parts = [seg["provenance"] for seg in s.get("segments") or []] or [s["provenance"]]
    return "; ".join(sorted({str(p.get("hardware")) for p in parts}))


def across_cpus(rows: list[dict]) -> str:
    """A sentence on the pairs whose two runs trained on different CPUs (or one ran a part on
    another): a seed's run takes another path on another CPU model from its first step, as on
    another seed, so such a pair's difference also holds the two CPUs' difference."""
    mixed = list(dict.fromkeys(f"TP {r['tp']} {r['config']} seed(s) {r['pairs_across_cpus']}" for r in rows
                               if isinstance(r.get("pairs_across_cpus"), str) and r["pairs_across_cpus"]))
    if not mixed:
        return "Each pair's two runs trained on one CPU model."
    return f"Pairs whose two runs trained on different CPU models: {'; '.join(mixed)}."


def cost(conv: pd.DataFrame, cores_per_run: int | None) -> str:
    """The study's cost, a sentence: run-hours (core-hours at ``cores_per_run``) of the runs with a
    step log, in all and by TP ("--" for a degree with none)."""
    if "hours" not in conv or conv.hours.isna().all():
        return ""
    timed = conv.hours.notna()
    k, unit = (cores_per_run, "core-hours") if cores_per_run else (1, "hours of one process each")
    by_tp = ", ".join(f"{int(tp)}: {k * g.hours.sum():.1f}" if g.hours.notna().any() else f"{int(tp)}: --"
                      for tp, g in sorted(conv.groupby("tp"), key=lambda item: -item[0]))
    return (f"Cost: {int(timed.sum())} of {len(conv)} runs timed, {k * conv.hours.sum():.1f} {unit} (each run's "
            f"median step time times its steps{f', {cores_per_run} core(s) a run' if cores_per_run else ''}; "
            f"evaluation and start-up not counted); by TP: {by_tp}.")


def headline(table: pd.DataFrame, config: str = "fp4quant") -> str:
    """The sentence the README quotes: ``config`` against BF16 at the largest TP."""
    if "diff_mean" not in table:
        return f"{config}: no comparison with {BASELINE}"
    rows = table[(table.config == config) & table.diff_mean.notna()]
    if rows.empty:
        return f"{config}: no comparison with {BASELINE}"
    r = rows.sort_values("tp").iloc[-1]
    n = int(r.n_pairs)
    # the 90% interval beside the 95% one: the verdict "within" is the 90% interval's (TOST)
    interval = (f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] (95%; 90%: [{r.ci90_low:+.3f}, {r.ci90_high:+.3f}]; {n} seeds)"
                if n > 1 else "(one seed: no interval)")
    return (f"{config} at TP = {int(r.tp)}: {r.diff_mean:+.3f} nats against {BASELINE} {interval}: {r.verdict} "
            f"(margin +-{r.margin:g} nats)")


def markdown(table: pd.DataFrame, conv: pd.DataFrame, control_rows: list[dict],
             cores_per_run: int | None = None) -> str:
    f = lambda v, fmt: "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)  # noqa: E731
    first = conv.iloc[0]
    margin = float(table.margin.iloc[0])
    commits = sorted({str(c)[:12] for c in conv.commit})
    lines = [f"<!-- provenance: {'; '.join(sorted(set(conv.hardware.astype(str))))}; training code {first.code} "
             f"(commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}), torch {first.torch} -->",
             f"Final validation loss (nats/token), model {first.model}, {int(first.steps)} steps of "
             f"{int(first.tokens) // int(first.steps)} tokens, {int(first.val_batches)} validation batches (the same "
             f"for every run); ranks: {', '.join(sorted(set(conv.ranks.astype(str))))}.  Difference: config - "
             f"{BASELINE} at the same TP, paired by seed; {int(CONFIDENCE * 100)}% CI (t, n-1 df); equivalence margin "
             f"+-{margin:g} nats (declared before the runs), two one-sided tests at {ALPHA:g} each.", "",
             f"**{headline(table)}.**", "",
             "| TP | config | n | val loss mean ± SD | - bf16 [95% CI] | 90% CI | TOST p | SE of the gap (val set) "
             "| verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    def bracket(low, high):  # an interval, or nothing where one seed leaves it undefined
        return "" if math.isnan(low) or math.isnan(high) else f" [{low:+.4f}, {high:+.4f}]"

    for r in table.to_dict("records"):
        diff = (f"{r['diff_mean']:+.4f}{bracket(r['ci_low'], r['ci_high'])}"
                if not math.isnan(r.get("diff_mean", math.nan)) else "")
        ci90 = bracket(r.get("ci90_low", math.nan), r.get("ci90_high", math.nan)).strip() if diff else ""
        p = f(max(r.get("p_lower", math.nan), r.get("p_upper", math.nan)), ".3f") if diff else ""
        sd = f" ± {f(r['val_loss_sd'], '.4f')}" if not math.isnan(r["val_loss_sd"]) else ""
        lines.append(f"| {r['tp']} | {r['config']} | {r['n']} | {r['val_loss_mean']:.4f}{sd} "
                     f"| {diff} | {ci90} | {p} | {f(r.get('diff_batch_se', math.nan), '.4f')} | {verdict_of(r)} |")
    if control_rows:
        lines += ["", "Controls: float32 on the wire (exact) against BF16 on the wire; BF16's rounding applied alone "
                      "at TP = 1 (no communication, `--rounding-alone`) against float32.", "",
                  "| TP | config - baseline | n | mean [95% CI] | verdict against +-margin |", "|---|---|---|---|---|"]
        for r in control_rows:
            diff = f"{r['diff_mean']:+.4f}{bracket(r['ci_low'], r['ci_high'])}" if r["n_pairs"] else ""
            lines.append(f"| {r['tp']} | {r['config']} - {r['baseline']} | {r['n_pairs']} | {diff} "
                         f"| {verdict_of(r) if diff else ''} |")
    if slope := trend_sentence(trend(conv)):
        lines += ["", slope]
    if "cpus" in conv:
        lines += ["", across_cpus(table.to_dict("records") + control_rows)]
    if spent := cost(conv, cores_per_run):
        lines += ["", spent]
    return "\n".join(lines) + "\n"


def verdict_of(row: dict) -> str:
    """A summary row's verdict; none for the baseline's own row (a NaN there)."""
    v = row.get("verdict")
    return v if isinstance(v, str) else ""


def loss_gap_figure(table: pd.DataFrame, conv: pd.DataFrame, out, profile: str) -> None:
    """Each config's paired difference to BF16 against the TP degree: the mean, its 95%
    interval, each seed's difference, and the margin as a band."""
    gaps = table[table.get("diff_mean", pd.Series(index=table.index, dtype=float)).notna()] \
        if "diff_mean" in table else table.iloc[0:0]
    if gaps.empty:
        raise StudyError("no configuration has a paired comparison with bf16: nothing to draw")
    margin = float(table.margin.iloc[0])
    configs = _order(gaps.config)
    colours, marks = palette(configs), style.markers(configs)
    tps = sorted(set(gaps.tp))
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    ax.axhspan(-margin, margin, color="0.92", zorder=0, label=f"margin +-{margin:g}")
    ax.axhline(0, color="0.5", lw=0.6)
    width = 0.12
    for i, name in enumerate(configs):
        g = gaps[gaps.config == name].sort_values("tp")
        x = np.array([tps.index(t) for t in g.tp]) + (i - (len(configs) - 1) / 2) * width
        ax.errorbar(x, g.diff_mean, yerr=[g.diff_mean - g.ci_low, g.ci_high - g.diff_mean], fmt=marks[name],
                    color=colours[name], ms=5, capsize=3, lw=1.2, label=f"{name} - bf16 (mean, 95% CI)")
        for xi, tp in zip(x, g.tp):
            mine = conv[(conv.config == name) & (conv.tp == tp)].set_index("seed").final_val_loss
            base = conv[(conv.config == BASELINE) & (conv.tp == tp)].set_index("seed").final_val_loss
            seeds = sorted(set(mine.index) & set(base.index))
            ax.scatter([xi + 0.04] * len(seeds), [mine[s] - base[s] for s in seeds], s=6, color=colours[name],
                       alpha=0.5, lw=0)
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_xlim(-0.5, len(tps) - 0.5)  # one slot per degree, so that a study's first degree is not squeezed
    ax.set_xlabel("TP degree (ranks whose partial sums each all-reduce adds)")
    ax.set_ylabel("final val. loss - bf16 (nats)")
    ax.legend(fontsize=6, loc="best")
    _finish(fig, conv, profile, out)


def sqnr_figure(summary: pd.DataFrame, out, profile: str) -> None:
    """SQNR of the all-reduced tensors against TP per preset and direction (median, min-max
    over the captured tensors), beside one message's SQNR (dashed)."""
    presets = _order(summary.preset)
    colours, marks = palette(presets), style.markers(presets)
    fig, axes = plt.subplots(1, 2, figsize=(7, 3), sharey=True)
    for ax, direction in zip(axes, ("fwd", "bwd")):
        d = summary[summary.direction == direction]
        for name in presets:
            g = d[d.preset == name].sort_values("tp")
            if g.empty:
                continue
            ax.errorbar(g.tp, g.sqnr_db_median, yerr=[g.sqnr_db_median - g.sqnr_db_min, g.sqnr_db_max - g.sqnr_db_median],
                        fmt=marks[name] + "-", color=colours[name], ms=4, capsize=2, lw=1, label=name)
            ax.plot(g.tp, g.single_sqnr_db_median, ls="--", marker="_", ms=8, color=colours[name], lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(d.tp)), [str(t) for t in sorted(set(d.tp))])
        ax.set_title({"fwd": "forward (activations)", "bwd": "backward (input gradients)"}[direction], fontsize=8)
        ax.set_xlabel("TP degree")
    axes[0].set_ylabel("SQNR of the reduced tensor (dB)")
    axes[0].legend(fontsize=6, title="solid: all-reduce; dashed, bar: one message", title_fontsize=6)
    _finish(fig, summary, profile, out)
