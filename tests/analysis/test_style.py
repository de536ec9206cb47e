"""One look for every figure: Type 42 fonts, and series told apart by more than colour."""

from __future__ import annotations

import pandas as pd

from fp4quant.analysis import figures, study_tp, style


def test_every_known_series_has_its_own_colour_marker_and_dash():
    names = list(style.SERIES)
    looks = [(style.colours(names)[n], style.markers(names)[n], style.dashes(names)[n]) for n in names]
    assert len({c for c, _, _ in looks}) == len(names) and len({m for _, m, _ in looks}) == len(names)
    assert len({str(d) for _, _, d in looks}) == len(names)
    assert "#F0E442" not in style.COLOURS  # Okabe-Ito's yellow: unreadable on white


def test_a_series_looks_the_same_whatever_else_a_figure_shows():
    assert figures.palette(["fp4quant"])["fp4quant"] == figures.palette(["nvfp4", "bf16", "fp4quant"])["fp4quant"]
    assert style.colours(["x", "fp4quant"])["fp4quant"] == style.colours(["fp4quant"])["fp4quant"]
    extra = style.colours(["bf16", "fp4quant", "torchao nvfp4"])
    assert len(set(extra.values())) == 3  # an unknown series takes a free colour


def test_figures_embed_type_42_fonts_not_type_3(tmp_path):
    rows = [{"tp": tp, "direction": d, "preset": p, "sqnr_db_median": 20.0 - tp / 4, "sqnr_db_min": 19.0 - tp / 4,
             "sqnr_db_max": 21.0 - tp / 4, "single_sqnr_db_median": 20.0, "hardware": "Intel Xeon, 2 cores (CPU)",
             "commit": "abc", "torch": "2.13.0+cpu"}
            for tp in (2, 16) for d in ("fwd", "bwd") for p in ("bf16", "fp4quant", "naive_pack")]
    out = tmp_path / "sqnr.pdf"
    study_tp.sqnr_figure(pd.DataFrame(rows), out, "test")  # text and a footer: glyphs matplotlib embeds as Type 3
    data = out.read_bytes()
    assert data.startswith(b"%PDF") and b"/Type3" not in data and b"/CIDFontType2" in data
