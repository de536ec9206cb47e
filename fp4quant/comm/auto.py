"""``algorithm="auto"``: uncompressed, one-shot or two-shot, by message size and world size.

The thresholds come from the collective benchmark (``python -m fp4quant.bench.allreduce_sweep``,
``data/collectives.csv``): ``thresholds_from_rows`` derives them from its rows and the
benchmark prints the table entries it measured.  A message of ``b`` bytes (the input
tensor's bytes) is compressed when ``b >= compress_min_bytes`` (never when it is None:
compression did not win at any measured size), and then sent two-shot when
``b >= two_shot_min_bytes`` (one-shot otherwise; one-shot always when None).  A
threshold is the smallest measured size from which the faster choice stays faster at
every larger measured size (robust to a noisy point).

Measured entries are keyed by (backend, world size); a world size not measured on a
backend uses the nearest measured one; a backend with no measurement at all (NCCL until
someone runs the benchmark on GPUs) compresses every message two-shot, the paper's
algorithm, rather than guess a threshold.  ``set_table`` installs entries derived from
another run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    compress_min_bytes: int | None  # None: never compress
    two_shot_min_bytes: int | None  # None: always one-shot when compressing


# Filled from data/collectives.csv (its .meta.json has the run: 2 gloo ranks over
# loopback on a 2-core AMD EPYC VM shared with other work; fp4quant preset with the
# default chunking; thresholds_from_rows).  Compression won at no size from 4 KiB to
# 256 MiB there (the codec costs each rank about as long as the whole uncompressed
# all-reduce takes over loopback), so gloo never compresses under "auto"; two-shot beat
# one-shot only at 256 MiB (within noise).  Only world size 2 fits on 2 cores; others
# use it.
TABLE: dict[tuple[str, int], Thresholds] = {
    ("gloo", 2): Thresholds(compress_min_bytes=None, two_shot_min_bytes=256 << 20),
}

UNMEASURED = Thresholds(compress_min_bytes=0, two_shot_min_bytes=0)


def set_table(entries: Mapping[tuple[str, int], Thresholds]) -> None:
    """Replace the table's entries for the backends in ``entries``."""
    for backend in {b for b, _ in entries}:
        for key in [k for k in TABLE if k[0] == backend]:
            del TABLE[key]
    TABLE.update(entries)


def lookup(backend: str, world: int) -> Thresholds:
    measured = [w for b, w in TABLE if b == backend]
    if not measured:
        return UNMEASURED
    nearest = min(measured, key=lambda w: (abs(w - world), w))
    return TABLE[(backend, nearest)]


def choose(nbytes: int, world: int, backend: str, layout=None) -> str:
    """"uncompressed", "one_shot", "two_shot" or "hierarchical" for a message of ``nbytes``
    input bytes; ``layout`` (a comm.layout.NodeLayout, where known): several nodes of several
    ranks compress only what crosses the nodes, hierarchically."""
    t = lookup(backend, world)
    if t.compress_min_bytes is None or nbytes < t.compress_min_bytes:
        return "uncompressed"
    if layout is not None and len(layout.nodes) > 1 and layout.ranks_per_node > 1:
        return "hierarchical"
    if t.two_shot_min_bytes is not None and nbytes >= t.two_shot_min_bytes:
        return "two_shot"
    return "one_shot"


def stable_threshold(sizes_wins: list[tuple[int, bool]]) -> int | None:
    """Smallest size from which every larger measured size is a win; None if the largest is not."""
    threshold = None
    for size, win in sorted(sizes_wins, reverse=True):
        if not win:
            break
        threshold = size
    return threshold


def _policy(row: Mapping[str, Any]) -> str:
    if row.get("chunk_policy") not in (None, ""):
        return str(row["chunk_policy"])
    return "none" if str(row.get("chunk_bytes", "")) in ("", "0", "nan", "None") else "fixed"


def thresholds_from_rows(
    rows: Iterable[Mapping[str, Any]], config: str = "fp4quant", chunk_policy: str = "auto"
) -> dict[tuple[str, int], Thresholds]:
    """Table entries from benchmark rows (dicts with backend, world_size, config, algorithm,
    chunk_policy or chunk_bytes, size_bytes, latency_s): the uncompressed all-reduce
    (config "none") against ``config`` run with ``chunk_policy`` ("auto": the default
    chunking of all_reduce, what algorithm="auto" runs; "none": unchunked)."""
    lat: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for row in rows:
        name = str(row["config"])
        if name == "none":
            algo = "uncompressed"
        elif name == config and _policy(row) == chunk_policy and str(row.get("overlap", True)) != "False":
            algo = str(row["algorithm"])
        else:
            continue
        key = (str(row["backend"]), int(row["world_size"]))
        lat.setdefault(key, {}).setdefault(int(row["size_bytes"]), {})[algo] = float(row["latency_s"])
    table = {}
    for key, by_size in lat.items():
        complete = {s: v for s, v in by_size.items() if {"uncompressed", "one_shot", "two_shot"} <= set(v)}
        compress = [(s, min(v["one_shot"], v["two_shot"]) < v["uncompressed"]) for s, v in complete.items()]
        two_shot = [(s, v["two_shot"] <= v["one_shot"]) for s, v in complete.items()]
        table[key] = Thresholds(stable_threshold(compress), stable_threshold(two_shot))
    return table
