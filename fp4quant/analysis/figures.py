"""The paper's five figures, from the tidy result CSVs.  Each names its hardware and profile."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from ..provenance import atomic_write_bytes  # noqa: E402
from .origin import origin_of_frame, pdf_metadata  # noqa: E402

FIGURES = ("throughput", "kernels", "allreduce", "convergence", "error", "projection", "sensitivity", "traffic")
ORDER = ["bf16", "fp4quant", "no_fwht", "single_scale", "naive_pack", "nvfp4", "mxfp4", "int4", "fp8"]


def _order(values) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in ORDER if v in present] + [v for v in present if v not in ORDER]


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
    sns.barplot(data=training, x="series", y="tokens_per_s", order=order, ax=ax, color="#4C72B0", errorbar="sd",
                capsize=0.2)
    for i, comm in enumerate(order):
        g = training[training.series == comm]
        top = g.tokens_per_s.mean() + (g.tokens_per_s.std() if len(g) > 1 else 0)  # above the SD bar
        ax.annotate(f"{g.speedup_vs_bf16.mean():.2f}x, n={len(g)}", (i, top), ha="center", va="bottom", fontsize=7,
                    xytext=(0, 3), textcoords="offset points")
    first = training.iloc[0]
    ax.set(xlabel="TP communication", ylabel="training tokens / s (mean $\\pm$ SD)",
           title=f"{first.model}, TP={first.tp} x DP={first.dp}, seq {first.seq_len} x batch {first.batch_size}, "
                 f"{first.steps} steps, {first.backend}\n{first.network}")
    ax.title.set_fontsize(8)
    ax.tick_params(axis="x", rotation=20)
    _finish(fig, training, profile, out)


def kernels(df: pd.DataFrame, out, profile: str) -> None:
    """Kernel throughput vs input size per thread count (median, bars: slowest..fastest run),
    under the memory-bound limit from a prefaulted copy (dashed); below each, the fraction of it."""
    d = df if "threads" in df else df.assign(threads=0)
    measured = d[d.impl.isin(["native", "reference", "torchao"])].copy()
    measured["series"] = measured.preset.where(measured.impl == "native", measured.impl + " " + measured.preset)
    ops = [o for o in ("quantize", "dequantize", "dequantize_reduce") if o in set(measured.op)]
    counts = sorted(set(measured.threads))
    has_limit = "limit_gbps" in measured
    rows = [(t, kind) for t in counts for kind in (("gbps", "fraction") if has_limit else ("gbps",))]
    fig, axes = plt.subplots(len(rows), len(ops), figsize=(4.2 * len(ops), 2.6 * len(rows)), sharex=True, squeeze=False)
    series = _order(measured.series)
    palette = dict(zip(series, sns.color_palette("tab10", len(series))))
    for col, op in enumerate(ops):
        for row, (threads, kind) in enumerate(rows):
            ax = axes[row][col]
            o = measured[(measured.op == op) & (measured.threads == threads)]
            for name in _order(o.series):
                s = o[o.series == name].sort_values("size_bytes")
                if kind == "gbps":
                    err = [s.gbps - s.gbps_min, s.gbps_max - s.gbps] if "gbps_min" in s else None
                    ax.errorbar(s.size_bytes, s.gbps, yerr=err, marker="o", ms=3, lw=1, capsize=2, color=palette[name],
                                label=name)
                else:
                    ax.plot(s.size_bytes, s.fraction, marker="o", ms=3, lw=1, color=palette[name])
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


def allreduce(df: pd.DataFrame, out, profile: str) -> None:
    """Collective latency vs message size, and the speedup over the uncompressed all-reduce."""
    d = df[(df.study == "presets")].copy()
    d["series"] = d.config + " " + d.algorithm
    d.loc[d.config == "none", "series"] = "uncompressed"
    d = d[~d.series.str.contains("chunk")] if "chunk_policy" not in d else d[d.chunk_policy.astype(str) == "none"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    sns.lineplot(data=d, x="size_bytes", y="latency_s", hue="series", marker="o", ax=a)
    a.set(xscale="log", yscale="log", xlabel="message bytes (float32)", ylabel="latency (s)",
          title=f"all-reduce, {d.world_size.iloc[0]} ranks, {d.backend.iloc[0]}")
    a.legend(fontsize=6)
    sns.lineplot(data=d[d.config != "none"], x="size_bytes", y="speedup", hue="series", marker="o", ax=b)
    b.axhline(1.0, color="k", lw=0.8, ls="--")
    b.set(xscale="log", xlabel="message bytes (float32)", ylabel="speedup over uncompressed", title="speedup")
    b.legend(fontsize=6)
    _finish(fig, df, profile, out)


ROLLING = 10  # steps in the convergence figure's moving average


def palette(series) -> dict:
    """One colour per TP communication, the same in every panel and figure."""
    colours = sns.color_palette("tab10", n_colors=len(ORDER))
    fixed = dict(zip(ORDER, colours))
    extra = [v for v in _order(series) if v not in fixed]
    return {**fixed, **dict(zip(extra, sns.color_palette("Set2", n_colors=max(len(extra), 1))))}


def dashes(series) -> dict:
    """One line style per TP communication, the same in every panel (solid for the first)."""
    styles = ["", (4, 1.5), (1, 1), (3, 1.25, 1.5, 1.25), (5, 1, 1, 1), (2, 2), (6, 2), (1, 2), (4, 1, 1, 1, 1, 1)]
    return {v: styles[i % len(styles)] for i, v in enumerate(ORDER + [x for x in _order(series) if x not in ORDER])}


def convergence(curves: pd.DataFrame, training: pd.DataFrame, out, profile: str) -> None:
    """Left: training loss per step (a 10-step moving average) per TP communication, the band
    spanning the seeds.  Right: the paired difference to BF16 (same seed, same step), so that
    curves lying on each other stay visible."""
    c = with_series(curves).sort_values("step").copy()
    c["loss"] = c.groupby(["series", "seed"]).loss.transform(lambda s: s.rolling(ROLLING, min_periods=1).mean())
    seeds = c.groupby("series").seed.nunique()
    order, colours, styles = _order(c.series), palette(c.series), dashes(c.series)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    band = ("pi", 100) if seeds.max() > 1 else None  # min-max over seeds
    sns.lineplot(data=c, x="step", y="loss", hue="series", style="series", hue_order=order, style_order=order,
                 palette=colours, dashes=styles, errorbar=band, ax=a)
    n = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    a.set(ylabel=f"training loss (nats/token), {ROLLING}-step mean",
          title=f"{c.model.iloc[0]}: loss" + (f", band = min-max over {n} seeds" if band else ", one seed"))
    a.title.set_fontsize(8)
    if "bf16" in set(c.series):
        base = c[c.series == "bf16"].set_index(["seed", "step"]).loss
        d = c[c.series != "bf16"].copy()
        d["difference"] = d.loss.to_numpy() - base.reindex(pd.MultiIndex.from_frame(d[["seed", "step"]])).to_numpy()
        d = d.dropna(subset=["difference"])
        rest = [x for x in order if x != "bf16"]
        sns.lineplot(data=d, x="step", y="difference", hue="series", style="series", hue_order=rest, style_order=rest,
                     palette=colours, dashes=styles, errorbar=band, ax=b)
        b.axhline(0.0, color="k", lw=0.8)
        b.set(ylabel="loss - BF16's (same seed and step)", title="paired difference to BF16")
        b.title.set_fontsize(8)
    else:
        b.set_axis_off()
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


def projection(df: pd.DataFrame, out, profile: str) -> None:
    """Left: the step model against the emulated cluster's measured tokens/s.  Right: its
    projection of FP4Quant's speedup over BF16 for Qwen-7B on H100 nodes, beside the paper's."""
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
    bars = b.bar(labels, p.predicted_speedup, color="#4C72B0", label="model: FP4Quant / BF16")
    b.bar_label(bars, fmt="%.2fx", fontsize=8)
    b.axhline(1.56, color="C3", ls="--", label="paper: up to 1.56x")
    b.axhline(1.0, color="k", lw=0.8)
    b.set(ylabel="training throughput over BF16", title="projection: Qwen-7B on H100 nodes (assumed figures)")
    b.title.set_fontsize(9)
    b.legend(fontsize=7, loc="upper left")
    _finish(fig, v, profile, out)


SENSITIVITY_AXES = {"inter_node_bw_GBps": "inter-node GB/s per GPU", "latency_us": "latency per hop (us)",
                    "codec_hbm_fraction": "codec / HBM bandwidth", "tflops": "sustained TFLOP/s per GPU",
                    "overlap": "comm/compute overlap"}


def sensitivity(df: pd.DataFrame, out, profile: str) -> None:
    """The projected speedup against each assumption: a line with the others at the baseline,
    and a band from the lowest to the highest speedup over every value of the others."""
    fig, axes = plt.subplots(1, len(SENSITIVITY_AXES), figsize=(3.0 * len(SENSITIVITY_AXES), 3.2), sharey=True)
    base = df[df.baseline.astype(str) == "True"]
    palette = dict(zip(dict.fromkeys(df.scenario), sns.color_palette(n_colors=df.scenario.nunique())))
    for ax, (key, label) in zip(axes, SENSITIVITY_AXES.items()):
        for scenario, d in df.groupby("scenario", sort=False):
            b = base[base.scenario == scenario].iloc[0]
            others = [k for k in SENSITIVITY_AXES if k != key]
            alone = d[(d[others] == b[others]).all(axis=1)].sort_values(key)
            band = d.groupby(key).speedup.agg(["min", "max"]).reset_index()
            x = lambda v: v.astype(float)  # noqa: E731  (overlap: False/True as 0/1)
            ax.fill_between(x(band[key]), band["min"], band["max"], color=palette[scenario], alpha=0.15, lw=0)
            ax.plot(x(alone[key]), alone.speedup, "o-", color=palette[scenario], ms=3,
                    label=scenario.split(", ")[-1])
            ax.plot([float(b[key])], [b.speedup], "k*", ms=7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.56, color="C3", ls="--", lw=0.8)
        ax.set(xlabel=label, xscale="log" if key == "inter_node_bw_GBps" else "linear")
        ticks = sorted(set(df[key].astype(float)))
        ax.set_xticks(ticks, ["off", "on"] if key == "overlap" else [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    axes[0].set(ylabel="FP4Quant / BF16 tokens/s")
    axes[0].legend(fontsize=6, loc="upper left")
    fig.suptitle("projected (step model, assumed H100 figures), Qwen-7B: line = others at baseline (*), "
                 "band = range over all others; dashed: paper's 1.56x", fontsize=8)
    _finish(fig, df, profile, out)
