"""The paper's figures, from the tidy result CSVs.  Each names its hardware and profile."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from ..perfmodel import model_validation  # noqa: E402
from ..provenance import atomic_write_bytes  # noqa: E402
from . import style  # noqa: E402
from .origin import origin_of_frame, pdf_metadata  # noqa: E402

style.apply()  # Type 42 fonts, the series colours

FIGURES = ("throughput", "kernels", "allreduce", "convergence", "error", "projection", "sensitivity", "traffic",
           "breakdown", "validation", "topology")
ORDER = ["bf16", "fp4quant", "no_fwht", "single_scale", "naive_pack", "nvfp4", "mxfp4", "int4", "fp8"]


def _order(values) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in ORDER if v in present] + [v for v in present if v not in ORDER]


def speedup_sd(tokens_per_s: pd.Series, bf16: pd.Series) -> float:
    """SD of mean(tokens_per_s) / mean(bf16), unpaired repeats: both spreads, first order (NaN under 2 runs)."""
    a, b = tokens_per_s.mean(), bf16.mean()
    return float(a / b * ((tokens_per_s.std(ddof=1) / a) ** 2 + (bf16.std(ddof=1) / b) ** 2) ** 0.5)


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its runs' series (their communication, +compute where not exact); results
    written before runs had a compute have their communication as the series."""
    return df if "series" in df else df.assign(series=df.comm)


def _footer(fig, df: pd.DataFrame, profile: str) -> None:
    hw = "; ".join(sorted(set(df["hardware"].astype(str)))) if "hardware" in df else "unknown hardware"
    commit = sorted(set(df["commit"].astype(str)))[0][:12] if "commit" in df and len(df) else "?"
    # below the axes' labels (bbox_inches="tight" keeps it in the page)
    fig.text(0.01, -0.12, f"profile {profile} | {hw} | fp4quant {commit}", fontsize=6, color="0.35", ha="left", va="top")


def _finish(fig, df: pd.DataFrame, profile: str, out: str | Path) -> None:
    """Footer, then the PDF, whose metadata carries the provenance of ``df`` (see .origin)."""
    _footer(fig, df, profile)
    buf = io.BytesIO()
    fig.savefig(buf, format="pdf", bbox_inches="tight", metadata=pdf_metadata(origin_of_frame(df, profile)))
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())


def throughput(training: pd.DataFrame, out, profile: str) -> None:
    """End-to-end training tokens/s per TP communication (the throughput runs: mean, bars +- SD
    over the n runs), with the speedup over BF16."""
    training = with_series(training)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    order = _order(training.series)
    sns.barplot(data=training, x="series", y="tokens_per_s", order=order, ax=ax, hue="series", hue_order=order,
                palette=style.colours(order), legend=False, errorbar="sd", err_kws={"color": "0.55"},
                capsize=0.2)
    bf16 = training[training.series == "bf16"].tokens_per_s
    for i, comm in enumerate(order):
        g = training[training.series == comm]
        top = g.tokens_per_s.mean() + (g.tokens_per_s.std() if len(g) > 1 else 0)  # above the SD bar
        sd = speedup_sd(g.tokens_per_s, bf16) if comm != "bf16" else float("nan")
        spread = f" $\\pm$ {sd:.2f}" if sd == sd else ""
        ax.annotate(f"{g.speedup_vs_bf16.mean():.2f}x{spread}, n={len(g)}", (i, top), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 3), textcoords="offset points")
    first = training.iloc[0]
    ax.set(xlabel="TP communication", ylabel="training tokens / s (mean $\\pm$ SD)",
           title=f"{first.model}, TP={first.tp} x DP={first.dp}, seq {first.seq_len} x batch {first.batch_size}, "
                 f"{first.steps} steps, {first.backend}\n{first.network}")
    ax.title.set_fontsize(8)
    ax.tick_params(axis="x", rotation=20)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the labels above the tallest bar
    _finish(fig, training, profile, out)


def kernels(df: pd.DataFrame, out, profile: str) -> None:
    """Kernel throughput vs input size per thread count (median, bars: slowest..fastest run),
    under the memory-bound limit from a prefaulted copy (dashed); below each, the fraction of it
    (band: the range over the calls, each against the copy timed beside it, where the CSV has it)."""
    d = df if "threads" in df else df.assign(threads=0)
    measured = d[d.impl.isin(["native", "reference", "torchao"])].copy()
    measured["series"] = measured.preset.where(measured.impl == "native", measured.impl + " " + measured.preset)
    ops = [o for o in ("quantize", "dequantize", "dequantize_reduce") if o in set(measured.op)]
    counts = sorted(set(measured.threads))
    has_limit = "limit_gbps" in measured
    rows = [(t, kind) for t in counts for kind in (("gbps", "fraction") if has_limit else ("gbps",))]
    fig, axes = plt.subplots(len(rows), len(ops), figsize=(4.2 * len(ops), 2.6 * len(rows)), sharex=True, squeeze=False)
    series = _order(measured.series)
    colours, marks = palette(series), markers(series)
    for col, op in enumerate(ops):
        for row, (threads, kind) in enumerate(rows):
            ax = axes[row][col]
            o = measured[(measured.op == op) & (measured.threads == threads)]
            for name in _order(o.series):
                s = o[o.series == name].sort_values("size_bytes")
                if kind == "gbps":
                    err = [s.gbps - s.gbps_min, s.gbps_max - s.gbps] if "gbps_min" in s else None
                    # naive_pack sends fp4quant's bytes at about its speed: hollow and dashed, beneath it
                    ax.errorbar(s.size_bytes, s.gbps, yerr=err, marker=marks[name], ms=3, lw=1, capsize=2,
                                color=colours[name], label=name, **_beneath(name))
                else:
                    ax.plot(s.size_bytes, s.fraction, marker=marks[name], ms=3, lw=1, color=colours[name],
                            **_beneath(name))
                    if "fraction_min" in s and s.fraction_min.notna().all():  # each call against its paired copy
                        ax.fill_between(s.size_bytes, s.fraction_min, s.fraction_max, color=colours[name], alpha=0.15,
                                        lw=0)
            where = f"{threads} thread{'s' if threads != 1 else ''}" if threads else ""
            if kind == "gbps":
                if has_limit:
                    ref = o[(o.impl == "native") & (o.preset == "fp4quant")].sort_values("size_bytes")
                    ax.plot(ref.size_bytes, ref.limit_gbps, "k--", label="memory-bound limit (fp4quant's bytes)")
                ax.set(xscale="log", yscale="log", ylabel="GB/s of input", title=f"{op}, {where}")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=0.8)
                ax.set(xscale="log", yscale="log", ylabel="fraction of the limit", title=f"{op}, {where}: of the limit")
            ax.title.set_fontsize(8)
        axes[-1][col].set(xlabel="input bytes (float32)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7, bbox_to_anchor=(0.5, -0.04))
    _finish(fig, df, profile, out)


def _beneath(name: str) -> dict:
    """Line options that keep an ablation identical in bytes (naive_pack) visible beside, and
    beneath, the method's line."""
    return {"ls": "--", "mfc": "none", "zorder": 1} if name == "naive_pack" else {"zorder": 2}


def _allreduce_series(df: pd.DataFrame) -> pd.DataFrame:
    """The unchunked preset series of a collective benchmark, each with its speedup band."""
    d = df[(df.study == "presets")].copy()
    d["series"] = d.config + " " + d.algorithm
    d.loc[d.config == "none", "series"] = "uncompressed"
    d = d[~d.series.str.contains("chunk")] if "chunk_policy" not in d else d[d.chunk_policy.astype(str) == "none"]
    if "latency_max_s" not in d:  # benchmarks before the band was recorded: no band
        d = d.assign(latency_max_s=d.latency_s)
    if "latency_min_s" not in d:
        d = d.assign(latency_min_s=d.latency_s)
    base = d[d.config == "none"].set_index("size_bytes").latency_s
    b = base.reindex(d.size_bytes).to_numpy()
    # the band of the speedup: the uncompressed median over the compressed slowest .. fastest
    return d.assign(speedup_low=b / d.latency_max_s.to_numpy(), speedup_high=b / d.latency_min_s.to_numpy())


def _allreduce_row(d: pd.DataFrame, axes, where: str, colours: dict, marks: dict) -> None:
    """A series' colour and marker are its format's (as in every figure), its line its algorithm's:
    solid two-shot, dashed one-shot; only two-shot draws its band, so the panel stays readable."""
    a, b = axes
    dtype = d.dtype.iloc[0] if "dtype" in d else "float32"
    for name in _order(d.series):
        s = d[d.series == name].sort_values("size_bytes")
        fmt = name.split()[0]
        look = {"marker": marks[fmt], "ms": 3, "lw": 1, "color": colours[fmt], "label": name,
                "ls": "--" if name.endswith("one_shot") else "-", "mfc": "none" if name.endswith("one_shot") else None}
        band = not name.endswith("one_shot")
        a.plot(s.size_bytes, s.latency_s, **look)
        if band:
            a.fill_between(s.size_bytes, s.latency_min_s, s.latency_max_s, color=colours[fmt], alpha=0.15, lw=0)
        if name != "uncompressed":
            b.plot(s.size_bytes, s.speedup, **look)
            if band:
                b.fill_between(s.size_bytes, s.speedup_low, s.speedup_high, color=colours[fmt], alpha=0.15, lw=0)
    iters = f"{int(d.iters.min())}-{int(d.iters.max())}" if "iters" in d else "?"
    a.set(xscale="log", yscale="log", xlabel=f"message bytes per rank ({dtype})", ylabel="latency (s)",
          title=textwrap.fill(f"{where}: all-reduce, {d.world_size.iloc[0]} ranks, {d.backend.iloc[0]}; "
                              f"median of {iters} iterations, band min-max", 75))
    b.axhline(1.0, color="k", lw=0.8, ls="--")
    b.set(xscale="log", xlabel=f"message bytes per rank ({dtype})", ylabel="speedup over uncompressed",
          title=textwrap.fill(f"{where}: speedup (band: uncompressed median / compressed max..min)", 75))
    for ax in axes:
        ax.title.set_fontsize(7)
        ax.legend(fontsize=6, ncol=2)


def allreduce(df: pd.DataFrame, out, profile: str, emulated: pd.DataFrame | None = None,
              network: str = "") -> None:
    """Collective latency vs message size and the speedup over the uncompressed all-reduce,
    median with a min-max band: measured over loopback (``df``), and, where given, measured on
    the emulated cluster's shaped links (``emulated``, ``network`` naming the link) above it."""
    parts = ([("measured on the emulated cluster" + (f" ({network})" if network else ""), emulated)]
             if emulated is not None and len(emulated) else []) + [("measured over loopback (no shaping)", df)]
    frames = [(w, _allreduce_series(x)) for w, x in parts]
    # one look per format in every panel and figure: the uncompressed all-reduce is exact's
    formats = ["exact" if n == "uncompressed" else n.split()[0] for n in _order(pd.concat([f.series for _, f in frames]))]
    colours, marks = style.colours(formats), style.markers(formats)
    if "exact" in colours:
        colours["uncompressed"], marks["uncompressed"] = colours["exact"], marks["exact"]
    fig, axes = plt.subplots(len(frames), 2, figsize=(11, 3.9 * len(frames)), squeeze=False)
    for row, (where, d) in zip(axes, frames):
        _allreduce_row(d, row, where, colours, marks)
    fig.tight_layout()
    _finish(fig, pd.concat([x for _, x in parts], ignore_index=True), profile, out)


def breakdown(df: pd.DataFrame, out, profile: str) -> None:
    """Per-step time of each TP communication split by the trainer's timers (stacked bars:
    compute, quantize, wire, dequantize), mean over the steady steps of every seed, error bar
    the SD of the step's total over those steps."""
    from .collect import BREAKDOWN_PARTS

    if df.empty:  # every log predates the split codec timers
        raise ValueError("no step breakdown: the runs' logs have no split codec timers (fwd_codec_s ...); rerun them")
    per_step = df.pivot_table(index=["series", "run", "step"], columns="part", values="seconds").reset_index()
    order = _order(per_step.series)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(order), 3.6))
    colours = style.colours(BREAKDOWN_PARTS)
    bottom = pd.Series(0.0, index=order)
    for part in BREAKDOWN_PARTS:
        ms = per_step.groupby("series")[part].mean().reindex(order).fillna(0.0) * 1e3
        ax.bar(order, ms, bottom=bottom, color=colours[part], label=part)
        bottom += ms
    total = per_step[list(BREAKDOWN_PARTS)].sum(axis=1) * 1e3
    sd = total.groupby(per_step.series).std().reindex(order)
    ax.errorbar(order, bottom, yerr=sd, fmt="none", color="k", capsize=3, lw=1)
    for i, name in enumerate(order):
        ax.annotate(f"{bottom[name]:.0f} ms", (i, bottom[name] + (sd[name] if sd[name] == sd[name] else 0)),
                    ha="center", va="bottom", fontsize=7)
    steps = per_step.groupby("series").size().reindex(order)
    seeds = df.groupby("series").seed.nunique().reindex(order)
    ax.set(xlabel="TP communication", ylabel="ms per training step",
           title=f"measured: {df.model.iloc[0]} step split by the trainer's timers, {df.network.iloc[0]}\n"
                 f"mean over {int(steps.min())}+ steady steps ({int(seeds.max())} seed(s)); bar: SD of the step")
    ax.title.set_fontsize(7)
    ax.legend(fontsize=7, title="part", title_fontsize=7)
    _finish(fig, df, profile, out)


ROLLING = 10  # steps in the convergence figure's moving average


def palette(series) -> dict:
    """One colour per series, the same in every panel and figure (analysis.style)."""
    return style.colours(ORDER + _order(series))


def markers(series) -> dict:
    return style.markers(ORDER + _order(series))


def dashes(series) -> dict:
    """One line style per series, the same in every panel (solid for the first)."""
    return style.dashes(ORDER + _order(series))


OFF_SCALE_NATS = 0.2  # a difference panel's curve this far (and 3x the typical) from 0 at the end is drawn off its axis


def off_scale(final: pd.Series) -> list[str]:
    """The series (index) whose final difference ``final`` is so far from the rest that the
    panel's axis would flatten the others: beyond OFF_SCALE_NATS and 3x the median |final|."""
    limit = max(OFF_SCALE_NATS, 3 * float(final.abs().median()))
    return [k for k, v in final.items() if abs(v) > limit]


def convergence(curves: pd.DataFrame, training: pd.DataFrame, out, profile: str) -> None:
    """Left: training loss per step (a 10-step moving average) per TP communication, the band
    spanning the seeds.  Right: the paired difference to BF16 (same seed, same step), so that
    curves lying on each other stay visible; a curve far off the others (off_scale) is left off
    its axis and named with its final difference."""
    c = with_series(curves).sort_values("step").copy()
    c["loss"] = c.groupby(["series", "seed"]).loss.transform(lambda s: s.rolling(ROLLING, min_periods=1).mean())
    seeds = c.groupby("series").seed.nunique()
    order, colours, styles = _order(c.series), palette(c.series), dashes(c.series)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8))
    band = ("pi", 100) if seeds.max() > 1 else None  # min-max over seeds
    sns.lineplot(data=c, x="step", y="loss", hue="series", style="series", hue_order=order, style_order=order,
                 palette=colours, dashes=styles, errorbar=band, ax=a, legend=False)
    n = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    a.set(ylabel=f"training loss (nats/token), {ROLLING}-step mean",
          title=f"{c.model.iloc[0]}: loss" + (f", band = min-max over {n} seeds" if band else ", one seed"))
    a.title.set_fontsize(8)
    if "bf16" in set(c.series):
        base = c[c.series == "bf16"].set_index(["seed", "step"]).loss
        d = c[c.series != "bf16"].copy()
        d["difference"] = d.loss.to_numpy() - base.reindex(pd.MultiIndex.from_frame(d[["seed", "step"]])).to_numpy()
        d = d.dropna(subset=["difference"])
        last = d[d.step >= d.step.max() - ROLLING]
        final = last.groupby("series").difference.mean()
        away = off_scale(final)
        rest = [x for x in order if x != "bf16" and x not in away]
        sns.lineplot(data=d[d.series.isin(rest)], x="step", y="difference", hue="series", style="series",
                     hue_order=rest, style_order=rest, palette=colours, dashes=styles, errorbar=band, ax=b,
                     legend=False)
        b.axhline(0.0, color="k", lw=0.8)
        note = "; ".join(f"{x} off the axis ({final[x]:+.2f} at the end)" for x in away)
        b.set(ylabel="loss - BF16's (same seed and step)", title="paired difference to BF16" + (f"\n{note}" if note else ""))
        b.title.set_fontsize(8)
    else:
        b.set_axis_off()
    handles = [plt.Line2D([], [], color=colours[x], label=x, **({"dashes": styles[x]} if styles[x] else {}))
               for x in order]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, title="TP traffic",
               title_fontsize=7, frameon=False)
    _finish(fig, training, profile, out)


def error(df: pd.DataFrame, out, profile: str) -> None:
    """Quantization SQNR per preset and tensor kind."""
    d = df[(df.study == "presets") & (df.config != "bf16")]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    sns.barplot(data=d, x="config", y="sqnr_db", hue="kind", order=_order(d.config), ax=ax)
    ax.set(xlabel="format", ylabel="SQNR (dB), higher is better", title="quantize -> dequantize error")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=6, ncol=3)
    _finish(fig, df, profile, out)


def traffic_label(row) -> str:
    """A method of fp4quant.bench.traffic as one label: the preset, or no_fwht's rotation size."""
    if row.study == "presets":
        return row.method
    return f"{row.method} R={row.rotation}" if row.rotation != "none" else f"{row.method} R=none"


def traffic(df: pd.DataFrame, out, profile: str) -> None:
    """Top: SQNR on captured TP traffic per method, forward and backward apart, a box per method
    over the captured tensors (steps x sites x ranks), the 4-over-6 scale choice beside the
    default.  Bottom: the FP4 / E4M3-scale methods' paired difference to no_fwht on the same tensor."""
    tensor = ["direction", "site", "step", "rank"]
    d = df.assign(label=[traffic_label(r) for r in df.itertuples()])
    base = d[(d.study == "presets") & (d.method == "no_fwht")].set_index(tensor).sqnr_db
    d["vs_no_fwht"] = d.sqnr_db.to_numpy() - base.reindex(pd.MultiIndex.from_frame(d[tensor])).to_numpy()
    labels = _order(d[d.study == "presets"].label) + list(dict.fromkeys(d[d.study != "presets"].label))
    paired = [x for x in labels if x in ("fp4quant", "nvfp4") or x.startswith(("no_fwht R=", "nvfp4 R="))]
    directions = [x for x in ("fwd", "bwd") if x in set(d.direction)]
    fig, axes = plt.subplots(2, len(directions), figsize=(6.0 * len(directions), 6.4), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 1.3]})
    hues = [h for h in ("max_to_6", "4_over_6") if h in set(d.scale_select)]
    for col, direction in enumerate(directions):
        sub = d[d.direction == direction]
        for ax, y, order in ((axes[0][col], "sqnr_db", labels), (axes[1][col], "vs_no_fwht", paired)):
            sns.boxplot(data=sub[sub.label.isin(order)], x="label", y=y, hue="scale_select", hue_order=hues, ax=ax,
                        order=[x for x in order if x in set(sub.label)], fliersize=2, linewidth=0.7)
            ax.set(xlabel="")
            ax.tick_params(axis="x", rotation=35, labelsize=7)
            ax.legend(fontsize=6, title="micro-scale", title_fontsize=6)
        axes[0][col].set(ylabel="SQNR (dB), higher is better",
                         title={"fwd": "forward: activations after row-parallel layers",
                                "bwd": "backward: input gradients before column-parallel layers"}[direction])
        axes[0][col].title.set_fontsize(8)
        axes[1][col].axhline(0.0, color="k", lw=0.8)
        axes[1][col].set(ylabel="SQNR - no_fwht's, same tensor (dB)")
    steps = ", ".join(str(s) for s in sorted(set(d.step)))
    fig.suptitle(f"measured on captured TP traffic of {d.model.iloc[0]}, steps {steps} "
                 f"({d.groupby(['direction', 'label', 'scale_select']).size().min()}+ tensors per box; "
                 "R: signed Hadamard size before no_fwht)", fontsize=8)
    fig.tight_layout()
    _finish(fig, df, profile, out)


def projection(df: pd.DataFrame, out, profile: str, sensitivity: pd.DataFrame | None = None) -> None:
    """Left: the step model against the emulated cluster's measured tokens/s.  Right: its
    projection of FP4Quant's speedup over BF16 for Qwen-7B on H100 nodes, beside the paper's;
    with ``sensitivity`` (projection_sensitivity.csv), each bar's whisker spans the lowest to the
    highest speedup over every combination of the assumptions swept there."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    v = df[df.scenario.str.startswith("emulated")]
    long = pd.concat([v.assign(kind="measured", tps=v.measured_tokens_per_s),
                      v.assign(kind="predicted", tps=v.predicted_tokens_per_s)])
    sns.barplot(data=long, x="comm", y="tps", hue="kind", order=_order(v.comm), ax=a)
    errors = ", ".join(f"{r.comm} {100 * float(r.error):+.0f}%" for r in v.itertuples() if str(r.error) not in ("", "nan"))
    a.set(xlabel="TP communication", ylabel="tokens / s",
          title="emulated cluster: model vs measured\nmodel error: " + "\n".join(textwrap.wrap(errors, 70)))
    a.title.set_fontsize(8)
    a.tick_params(axis="x", rotation=20)
    p = df[~df.scenario.str.startswith("emulated") & (df.comm == "fp4quant")]
    labels = [s.split(", ", 2)[-1].replace(" across ", "\nacross ").replace(" in ", "\nin ") for s in p.scenario]
    bars = b.bar(labels, p.predicted_speedup, color=style.colours(["fp4quant"])["fp4quant"], label="model: FP4Quant / BF16")
    b.bar_label(bars, fmt="%.2fx", fontsize=8, label_type="center", color="white")
    if sensitivity is not None:
        band = sensitivity.groupby("scenario").speedup.agg(["min", "max"]).reindex(p.scenario)
        b.errorbar(range(len(p)), p.predicted_speedup, yerr=[p.predicted_speedup.to_numpy() - band["min"].to_numpy(),
                                                             band["max"].to_numpy() - p.predicted_speedup.to_numpy()],
                   fmt="none", ecolor="0.2", capsize=3, lw=0.9, label="range over the assumptions swept")
    b.axhline(1.56, color="0.4", ls="--", label="paper: up to 1.56x")
    b.axhline(1.0, color="k", lw=0.8)
    b.set(ylabel="training throughput over BF16", title="projection: Qwen-7B on H100 nodes (assumed figures)")
    b.title.set_fontsize(9)
    b.legend(fontsize=7, loc="upper left")
    _finish(fig, v, profile, out)


TOPOLOGY_ALGORITHMS = {"flat_fp4": "flat two-shot FP4", "hierarchical_fp4": "hierarchical FP4",
                       "hierarchical_bf16": "hierarchical BF16"}


def topology(df: pd.DataFrame, out, profile: str) -> None:
    """The projection by topology: per cluster and TP degree, each algorithm's end-to-end speedup
    over NCCL's BF16 all-reduce (the model's nominal inputs; the bar: its low to high over the
    uncertain ones), beside the paper's 1.56x."""
    df = df[df.algorithm.isin(list(TOPOLOGY_ALGORITHMS))]
    cells = list(dict.fromkeys(zip(df.cluster, df.tp)))
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(TOPOLOGY_ALGORITHMS)
    palette = list(style.colours(TOPOLOGY_ALGORITHMS).values())
    for k, (algo, label) in enumerate(TOPOLOGY_ALGORITHMS.items()):
        g = df[df.algorithm == algo].set_index(["cluster", "tp"]).reindex(cells)
        x = [i + (k - 1) * width for i in range(len(cells))]
        ax.bar(x, g.speedup, width, color=palette[k], label=label, hatch=["", "//", ".."][k], edgecolor="white")
        ax.errorbar(x, g.speedup, yerr=[g.speedup - g.speedup_low, g.speedup_high - g.speedup], fmt="none", ecolor="0.2",
                    capsize=2, lw=0.8)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.56, color="0.4", ls="--", lw=1, label="paper: up to 1.56x (cluster not stated)")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels(["\n".join(textwrap.wrap(c, 18)) + f"\nTP = {tp}" for c, tp in cells], fontsize=7)
    first = df.iloc[0]
    ax.set(ylabel="training throughput over NCCL BF16",
           title=f"projected: {first.model}, seq {first.seq_len} x batch {first.batch_size} (bars: nominal inputs; "
                 f"whiskers: low / high over the uncertain ones)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left")
    _finish(fig, df, profile, out)


SENSITIVITY_AXES = {"inter_node_bw_GBps": "inter-node GB/s per GPU", "latency_us": "latency per hop (us)",
                    "codec_hbm_fraction": "codec / HBM bandwidth", "tflops": "sustained TFLOP/s per GPU",
                    "overlap": "comm/compute overlap"}


def sensitivity(df: pd.DataFrame, out, profile: str) -> None:
    """The projected speedup against each assumption: a line with the others at the baseline,
    and a band from the lowest to the highest speedup over every value of the others."""
    fig, axes = plt.subplots(1, len(SENSITIVITY_AXES), figsize=(3.0 * len(SENSITIVITY_AXES), 3.2), sharey=True)
    base = df[df.baseline.astype(str) == "True"]
    colours = style.colours(df.scenario)
    for ax, (key, label) in zip(axes, SENSITIVITY_AXES.items()):
        for scenario, d in df.groupby("scenario", sort=False):
            b = base[base.scenario == scenario].iloc[0]
            others = [k for k in SENSITIVITY_AXES if k != key]
            alone = d[(d[others] == b[others]).all(axis=1)].sort_values(key)
            band = d.groupby(key).speedup.agg(["min", "max"]).reset_index()
            x = lambda v: v.astype(float)  # noqa: E731  (overlap: False/True as 0/1)
            ax.fill_between(x(band[key]), band["min"], band["max"], color=colours[scenario], alpha=0.15, lw=0)
            ax.plot(x(alone[key]), alone.speedup, "o-", color=colours[scenario], ms=3,
                    label=scenario.split(", ")[-1])
            ax.plot([float(b[key])], [b.speedup], "k*", ms=7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.56, color="0.4", ls="--", lw=0.8)
        ax.set(xlabel=label, xscale="log" if key == "inter_node_bw_GBps" else "linear")
        ticks = sorted(set(df[key].astype(float)))
        ax.set_xticks(ticks, ["off", "on"] if key == "overlap" else [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    axes[0].set(ylabel="FP4Quant / BF16 tokens/s")
    axes[0].legend(fontsize=6, loc="upper left")
    fig.suptitle("projected (step model, assumed H100 figures), Qwen-7B: line = others at baseline (*), "
                 "band = range over all others; dashed: paper's 1.56x", fontsize=8)
    _finish(fig, df, profile, out)


VALIDATION_PARTS = ("compute", "codec", "communication", "wait", "scalar", "total")


def validation(df: pd.DataFrame, out, profile: str) -> None:
    """The step model part by part against the emulated runs (model_validation.csv): per
    configuration, measured (mean over steady steps, and over repeats where the validation
    was repeated; bar: SD over the steps, or over the repeats) and predicted seconds of each
    component, the relative error above each pair (repeats: their mean and range)."""
    parts = [p for p in VALIDATION_PARTS if p in set(df.component)]  # older runs: no wait
    d = model_validation.summary(df[df.component.isin(parts)])
    configs = list(dict.fromkeys(d.config))
    ncols = min(3, len(parts))  # a grid: one row of six panels prints as an unreadable strip
    nrows = -(-len(parts) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 3.2 * nrows), squeeze=False)
    for ax in axes.flat[len(parts):]:
        ax.set_visible(False)
    kinds = dict(zip(("measured", "predicted"), style.COLOURS[2:4]))
    for ax, comp in zip(axes.flat, parts):
        c = d[d.component == comp].set_index("config").reindex(configs)
        x = range(len(configs))
        ax.bar([i - 0.2 for i in x], c.measured_s * 1e3, 0.4, yerr=c.measured_sd_s * 1e3, capsize=2,
               color=kinds["measured"], label="measured (emulated)")
        ax.bar([i + 0.2 for i in x], c.predicted_s * 1e3, 0.4, color=kinds["predicted"], label="predicted (model)")
        for i, r in zip(x, c.itertuples()):
            if str(r.rel_error) not in ("", "nan"):
                top = max(r.measured_s + r.measured_sd_s, r.predicted_s) * 1e3
                label = f"{100 * float(r.rel_error):+.0f}%"
                if r.repeats > 1:
                    label += f"\n[{100 * float(r.rel_error_min):+.0f}, {100 * float(r.rel_error_max):+.0f}]"
                ax.annotate(label, (i, top), ha="center", va="bottom", fontsize=5)
        ax.set_xticks(list(x), configs, rotation=35, ha="right", fontsize=6)
        ax.set(ylabel="ms per step" if ax in axes[:, 0] else "", title=comp)
        ax.title.set_fontsize(8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(textwrap.fill("step model vs runs measured on the emulated cluster (this machine's ranks, tc-shaped "
                               f"links); model inputs from {model_validation.probes_said(df)}, nothing fitted to the "
                               "runs", 38 * ncols), fontsize=7)
    fig.tight_layout()
    _finish(fig, df, profile, out)
