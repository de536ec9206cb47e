"""What the paper's tables read: its sources (result folders of one origin each), their CSVs and
the checks every table makes of them; shared by fp4quant.analysis.paper and its table modules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .study import paired_difference
from .tables import number


class PaperError(ValueError):
    """A source that is missing, mixed or lacks what a table needs."""


@dataclass(frozen=True)
class Sources:
    results: Path
    study: Path | None = None
    study_tp: Path | None = None
    clusters: Path | None = None
    topology: Path | None = None


def read(folder: Path, name: str) -> pd.DataFrame:
    """``name``.csv of ``folder``, or its xz-compressed frozen copy."""
    for path in (folder / f"{name}.csv", folder / f"{name}.csv.xz"):
        if path.exists():
            return pd.read_csv(path)
    raise PaperError(f"{folder}: no {name}.csv (nor .csv.xz)")


def origin(df: pd.DataFrame, what: str) -> str:
    """The hardware of a source's rows (several machines joined by "; "), refusing rows of two commits
    or torches."""
    for key in ("commit", "torch"):
        if key in df and df[key].nunique() > 1:
            raise PaperError(f"{what} mixes {key}s: {', '.join(sorted(df[key].astype(str).unique()))}")
    return "; ".join(sorted(df.hardware.astype(str).unique())) if "hardware" in df else "unknown hardware"


def with_range(v: float, low: float, high: float, fmt: str) -> str:
    """v [low, high]; v alone where the range is undefined (one seed)."""
    if pd.isna(low) or pd.isna(high):
        return number(v, fmt)
    return f"{number(v, fmt)} [{number(low, fmt)}, {number(high, fmt)}]"


def need(df: pd.DataFrame, columns: list[str], what: str) -> None:
    """Refuse a source without a column a table reads (written by an older version, or another file)."""
    missing = [c for c in columns if c not in df]
    if missing:
        raise PaperError(f"{what} has no column {', '.join(missing)}: not the file the table reads, or written by "
                         "an older version")


def paired(conv: pd.DataFrame, config: str, base: str) -> dict:
    """config - base final validation loss over the seeds both ran: n, mean and 95% t interval
    (study.paired_difference)."""
    loss = lambda c: conv[conv.config == c].set_index("seed").final_val_loss  # noqa: E731
    d = paired_difference(loss(config), loss(base))
    return {"n": d["n_pairs"], "mean": d["diff_mean"], "low": d["ci_low"], "high": d["ci_high"]}
