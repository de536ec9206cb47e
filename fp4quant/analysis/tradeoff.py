"""The convergence study's trade-off figure (workflow/rules/study.smk): the loss gap to BF16
against bits on the wire, beside the SQNR on captured TP traffic and the projected H100 speedup."""

from __future__ import annotations

import pandas as pd

from ..format.config import QuantConfig
from .figures import _finish, _order, palette, plt  # the figures' matplotlib, its backend set


def traffic_sqnr(traffic: pd.DataFrame) -> pd.DataFrame:
    """bench.traffic's summary as the trade-off plots it: each preset (and 4-over-6 on the
    unrotated and the whole-group rotation) per direction, its pooled SQNR and its bits per
    value on the wire."""
    presets = traffic[(traffic.study == "presets") & (traffic.scale_select == "max_to_6")]
    four = traffic[(traffic.scale_select == "4_over_6") & traffic.rotation.isin(["none", "group"])
                   & traffic.method.isin(["no_fwht", "nvfp4"])]
    rows = [{"label": r.method, "direction": r.direction, "sqnr_db": r.sqnr_pooled_db,
             "bits": QuantConfig.preset(r.method).bits_per_value} for r in presets.itertuples()]
    rows += [{"label": f"{'fp4quant' if r.rotation == 'group' and r.method == 'no_fwht' else r.method} + 4 over 6",
              "direction": r.direction, "sqnr_db": r.sqnr_pooled_db,
              "bits": QuantConfig.preset(r.method).bits_per_value} for r in four.itertuples()]
    return pd.DataFrame(rows, columns=["label", "direction", "sqnr_db", "bits"])


def dodged(bits: pd.Series, step: float = 0.02) -> dict:
    """x positions (log scale) for points at ``bits`` (indexed by name): those within 3% of one
    another set apart by ``step`` decades each, so that none hides another."""
    out, group = {}, []
    for name, b in list(bits.sort_values().items()) + [(None, float("inf"))]:
        if group and (name is None or b > group[0][1] * 1.03):
            for i, (n, v) in enumerate(group):
                out[n] = v * 10 ** (step * (i - (len(group) - 1) / 2))
            group = []
        if name is not None:
            group.append((name, b))
    return out


def tradeoff(summary: pd.DataFrame, out, profile: str, traffic: pd.DataFrame | None = None) -> None:
    """The convergence study's trade-off (fp4quant.analysis.study): left, each configuration's
    validation-loss gap to BF16 (mean over seeds, bars: the paired 95% t interval) against the
    bits per value it sent; middle (with ``traffic``, bench.traffic's summary): the pooled
    SQNR of each format on the TP traffic captured in training, forward and backward; right,
    the step model's projected H100 speedup over BF16 of the same traffic (assumed figures)."""
    d = summary[summary.config != "bf16"].dropna(subset=["diff_mean"])
    colours = palette(summary.config)
    widths = [1.4, 1.1, 1] if traffic is not None else [1.4, 1]
    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.8), gridspec_kw={"width_ratios": widths})
    a, b = axes[0], axes[-1]
    x = dodged(d.set_index("config").wire_bits_per_value)
    for r in d.itertuples():
        err = [[r.diff_mean - r.ci_low], [r.ci_high - r.diff_mean]] if pd.notna(r.ci_low) else None
        a.errorbar([x[r.config]], [r.diff_mean], yerr=err, fmt="o", ms=4, capsize=3, color=colours[r.config],
                   label=r.config)
    a.axhline(0.0, color="k", lw=0.8)
    a.set(xscale="log", xlabel="bits per value on the wire (the format's, mean of forward and backward;\n"
                               "points of about the same bits set apart)",
          ylabel="validation loss - BF16's (same seed)",
          title=f"measured: {int(d.n_pairs.min()) if len(d) else 0}+ seeds per point, "
                "bars: 95% t interval of the paired mean")
    a.set_xticks([4.5, 8, 16, 32], ["4.5", "8", "16", "32"])
    a.minorticks_off()
    a.title.set_fontsize(8)
    a.legend(fontsize=6, ncol=2, loc="upper right", frameon=False)
    if traffic is not None:
        t = traffic_sqnr(traffic).sort_values(["bits", "label"], kind="stable")
        c = axes[1]
        rows = list(dict.fromkeys(t.label))  # one row per format, fewest bits at the top
        for direction, mark in (("fwd", "o"), ("bwd", "s")):
            g = t[t.direction == direction]
            c.scatter(g.sqnr_db, [rows.index(x) for x in g.label], marker=mark, s=20, label=direction,
                      color=[colours.get(x.split(" + ")[0], "0.4") for x in g.label], edgecolor="k", linewidths=0.5)
        bits = t.groupby("label").bits.first()
        c.set_yticks(range(len(rows)), [f"{x} ({bits[x]:.2f} b)" for x in rows], fontsize=6)
        c.invert_yaxis()
        c.grid(axis="x", lw=0.3)
        c.set(xlabel="SQNR on captured TP traffic (dB, pooled), higher is better",
              title=f"measured: {traffic.model.iloc[0]}'s traffic, steps {traffic.capture_steps.iloc[0]}\n"
                    "circles forward, squares backward; bits per value in brackets")
        c.title.set_fontsize(8)
    p = summary.dropna(subset=["projected_h100_speedup"])
    order = _order(p.config)
    p = p.set_index("config").loc[order]
    bars = b.bar(order, p.projected_h100_speedup, color=[colours[c] for c in order])
    b.bar_label(bars, fmt="%.2fx", fontsize=6)
    b.axhline(1.0, color="k", lw=0.8)
    b.set(ylabel="tokens/s over BF16", title="projected: Qwen-7B, TP=16 across two H100 nodes\n(assumed figures; "
          "every format at fp4quant's codec rate unless measured)")
    b.title.set_fontsize(8)
    b.tick_params(axis="x", rotation=45, labelsize=7)
    fig.tight_layout()
    _finish(fig, summary, profile, out)
