"""One look for every figure: fonts a venue accepts, and one colour, marker and dash per series.

Fonts: matplotlib embeds Type 3 fonts in PDFs by default, and venues' checkers refuse them;
``apply`` switches to Type 42 (TrueType), mathtext included.  Colours: Okabe and Ito's
colour-blind-safe set (yellow left out: unreadable on white), extended by Tol's muted dark
tones.  Every series also has its own marker and dash, so none is told apart by colour alone,
and a series has the same look in every figure.
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib as mpl
from cycler import cycler

# Okabe & Ito (2008), without yellow; then Tol's "muted" wine, olive and indigo
COLOURS = ("#000000", "#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933",
           "#332288", "#777777")
MARKERS = ("D", "o", "s", "^", "v", "P", "X", "h", "*", "<", ">")
DASHES = ("", (4, 1.5), (1, 1), (3, 1.25, 1.5, 1.25), (5, 1, 1, 1), (2, 2), (6, 2), (1, 2), (4, 1, 1, 1, 1, 1),
          (3, 3), (8, 2))
# the series every figure may show, in their fixed order: the baseline, the method, its ablations,
# the other formats, and the controls
SERIES = ("bf16", "fp4quant", "no_fwht", "single_scale", "naive_pack", "nvfp4", "mxfp4", "int4", "fp8", "exact",
          "bf16-alone")


def apply() -> None:
    """Type 42 fonts in PDF and PostScript, and the series colours as the default cycle."""
    mpl.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "axes.prop_cycle": cycler(color=COLOURS)})


def _index(names: Iterable[str]) -> dict[str, int]:
    """Each name's slot: a known series its own, the others the free slots in order of appearance."""
    names = list(dict.fromkeys(names))
    slots = {s: i for i, s in enumerate(SERIES)}
    out = {n: slots[n] for n in names if n in slots}
    free = [i for i in range(len(COLOURS)) if i not in out.values()]
    for n in names:
        if n not in out:
            out[n] = free.pop(0) if free else len(out) % len(COLOURS)
    return out


def colours(names: Iterable[str]) -> dict[str, str]:
    return {n: COLOURS[i % len(COLOURS)] for n, i in _index(names).items()}


def markers(names: Iterable[str]) -> dict[str, str]:
    return {n: MARKERS[i % len(MARKERS)] for n, i in _index(names).items()}


def dashes(names: Iterable[str]) -> dict[str, tuple]:
    return {n: DASHES[i % len(DASHES)] for n, i in _index(names).items()}
