"""Where results come from, and the rule that one figure set never mixes two origins.

Every result the project writes records its provenance (fp4quant.provenance): the hardware,
the commit and the torch version that produced it -- in a run's summary.json, a benchmark
CSV's columns and its .meta.json, a cluster record, and (written here) a figure's PDF
metadata and a LaTeX table's first lines.  ``check_same_origin`` reads them all and refuses
a mix in one line naming two inputs that differ, so that a figure can never put a training
run of one machine or commit beside a benchmark of another.

Hardware is compared per kind: CPU descriptions with CPU descriptions, GPU names with GPU
names (a GPU profile's codec-error benchmark legitimately runs on the host's CPU).  Only
descriptions of a machine that measured something count (fp4quant.provenance.hardware:
"<cpu>, <n> cores (CPU)" or "<gpu> (<n> visible)"); a projection's modelled machine
(fp4quant.perfmodel.machines: "H100 (assumed)", "H100 (codec measured on a GPU)") is not one.
A description of neither kind is refused, naming it: it was not written by either, so the
machine it stands for cannot be compared, and skipping it would let a result of another
machine through unchecked.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

KEYS = ("hardware", "commit", "torch")
FIX = "recompute every result on one machine and commit (make figures-clean figures; " \
      "or remove data/<profile>/ and rerun snakemake)"
TEX_MARK = "% provenance: "
PDF_KEYWORDS = re.compile(rb"/Keywords \(((?:[^\\)]|\\.)*)\)")


class MixedOrigin(ValueError):
    """Inputs of one figure set that come from different hardware, commits or torch versions."""


Record = tuple[str, dict[str, str]]  # (which input, its hardware / commit / torch)


def pick(d: dict) -> list[dict[str, str]] | None:
    """The origins ``d`` or its "provenance" entry records (None: neither has every key).  A
    figure or table made from CPU and GPU results lists both hardware descriptions: one origin each."""
    for candidate in (d, d.get("provenance") if isinstance(d, dict) else None):
        if isinstance(candidate, dict) and all(k in candidate for k in KEYS):
            hardware = candidate["hardware"]
            return [{"hardware": str(h), "commit": str(candidate["commit"]), "torch": str(candidate["torch"])}
                    for h in (hardware if isinstance(hardware, list) else [hardware])]
    return None


def records(path: str | Path) -> list[Record]:
    """The provenance records one input holds (a CSV: one per distinct origin among its rows)."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file (an input whose origin must be checked)")
    try:
        found = _csv_records(p) if p.suffix == ".csv" else _file_records(p) if p.suffix in (".json", ".pdf", ".tex") \
            else None
    except (ValueError, csv.Error) as exc:  # a torn or foreign file
        raise MixedOrigin(f"{p} cannot be read ({type(exc).__name__}: {exc}), so its origin cannot be checked; {FIX}") \
            from None
    if found is None:
        raise MixedOrigin(f"{p} records no provenance ({', '.join(KEYS)}), so its origin cannot be checked; {FIX}")
    return found


def read_stamp(path: str | Path) -> dict:
    """What a figure (PDF metadata) or LaTeX table (comment line) was stamped with ({}: nothing)."""
    p = Path(path)
    if p.suffix == ".pdf":
        m = PDF_KEYWORDS.search(p.read_bytes())
        return json.loads(re.sub(rb"\\(.)", rb"\1", m.group(1))) if m else {}
    line = next((x for x in p.read_text().splitlines() if x.startswith(TEX_MARK)), None)
    return json.loads(line[len(TEX_MARK):]) if line else {}


def _file_records(p: Path) -> list[Record] | None:
    origins = pick(json.loads(p.read_text()) if p.suffix == ".json" else read_stamp(p))
    return [(str(p), o) for o in origins] if origins else None


def _csv_records(p: Path) -> list[Record] | None:
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and all(k in rows[0] for k in KEYS):
        seen: dict[tuple, Record] = {}
        for i, row in enumerate(rows):
            origin = tuple(row[k] for k in KEYS)
            where = f"{p} (run {row['run']})" if row.get("run") else f"{p} (row {i + 2})"
            seen.setdefault(origin, (where, dict(zip(KEYS, origin))))
        return list(seen.values())
    meta = p.with_name(p.name + ".meta.json")
    if meta.exists():
        found = _file_records(meta)
        return [(f"{p} ({meta.name})", o) for _, o in found] if found else None
    return [] if not rows else None  # an empty table has nothing to mix


CPU_HARDWARE = re.compile(r", \d+ cores \(CPU\)$")
GPU_HARDWARE = re.compile(r" \(\d+ visible\)$")
# the step model's machines (fp4quant.perfmodel.machines.h100: its figures assumed, or its codec
# rate taken from a GPU benchmark, which records its own hardware)
PROJECTED_HARDWARE = re.compile(r"^.+ \((assumed|codec measured on a GPU)\)$")


def hardware_kind(hardware: str) -> str | None:
    """'cpu' or 'gpu' (a machine that measured, fp4quant.provenance.hardware), 'projected' (the
    step model's machine), or None for a description that neither wrote."""
    if CPU_HARDWARE.search(hardware):
        return "cpu"
    if GPU_HARDWARE.search(hardware):
        return "gpu"
    return "projected" if PROJECTED_HARDWARE.search(hardware) else None


def _comparable(key: str, value: str) -> str:
    if key == "hardware":
        return GPU_HARDWARE.sub("", value)  # how many GPUs a job saw is not the hardware
    return value


def _show(key: str, value: str) -> str:
    if key == "commit":
        base, _, dirty = value.partition("+")
        return base[:12] + ("+" + dirty if dirty else "")
    return value if key != "torch" else f"torch {value}"


def check_same_origin(paths: Iterable[str | Path], keys: tuple[str, ...] = KEYS) -> dict:
    """The common provenance of ``paths`` (files, or run folders holding summary.json) in ``keys``;
    raise MixedOrigin naming two that differ.  Hardware may differ only between a CPU and a GPU, so
    the result's "hardware" is a list: one description per kind present."""
    first: dict[tuple[str, str], Record] = {}  # (key, hardware kind or "") -> first record seen
    for path in paths:
        for where, origin in records(path):
            for k in keys:
                scope = (k, hardware_kind(origin[k]) if k == "hardware" else "")
                if scope[1] is None:
                    raise MixedOrigin(f"{where} records hardware {origin[k]!r}, which is neither a machine's "
                                      "(\"<cpu>, <n> cores (CPU)\" or \"<gpu> (<n> visible)\") nor the step model's "
                                      f"(\"H100 (assumed)\"), so its origin cannot be checked; {FIX}")
                if scope[1] == "projected":  # no machine measured it: nothing to compare
                    continue
                seen = first.setdefault(scope, (where, origin))
                if _comparable(k, seen[1][k]) != _comparable(k, origin[k]):
                    raise MixedOrigin(f"mixed results: {seen[0]} comes from {_show(k, seen[1][k])} but {where} "
                                      f"from {_show(k, origin[k])}; {FIX}")
    if not first:
        return {}
    found = {"hardware": sorted(rec[1]["hardware"] for (k, _), rec in first.items() if k == "hardware")}
    return found | {k: first[(k, "")][1][k] for k in ("commit", "torch") if (k, "") in first}


def origin_of_frame(df, profile: str) -> dict | None:
    """The provenance of a result table's rows (a pandas DataFrame) and the workflow profile, to
    stamp on a figure or table made from them: its commits joined by "; " (one, unless the rows
    are a study's runs of one training code, check_same_training_code) and that code's digest."""
    if not len(df) or not all(k in df for k in KEYS):
        return None
    origin = {"hardware": sorted(set(df["hardware"].astype(str))), "commit": "; ".join(sorted(set(df["commit"].astype(str)))),
              "torch": str(df["torch"].iloc[0]), "profile": profile}
    if "code" in df:
        origin["code"] = "; ".join(sorted(set(df["code"].astype(str))))
    return origin


def training_code(provenance: dict, where: str) -> str:
    """The training code's digest a provenance records (fp4quant.provenance.code_digest); for a
    run of before the digest was recorded, that of its commit, where git has it."""
    from ..provenance import code_digest  # git, only where a record lacks the digest

    if provenance.get("code") and provenance["code"] != "unknown":  # "unknown": recorded outside git
        return str(provenance["code"])
    commit = str(provenance.get("commit", ""))
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise MixedOrigin(f"{where} records no training-code digest, and its commit {commit!r} is not a clean "
                          "commit to take it from; retrain the run")
    digest = code_digest(commit)
    if digest in ("unknown", os.environ.get("FP4QUANT_CODE")):  # git could not read it: the fallback is no answer
        raise MixedOrigin(f"{where} records no training-code digest, and git cannot read its commit {commit[:12]} "
                          "(a shallow clone?); retrain the run, or fetch that commit")
    return digest


def check_same_training_code(run_dirs: Iterable[str | Path]) -> dict:
    """A study's runs may come from several commits and machines, but not from two training codes
    or torch versions: every part of every run (its summary's segments, each a resume) must have
    one code digest and torch.  Raise MixedOrigin naming two runs that differ; return the
    common code and torch, and the commits and hardware seen."""
    first: dict[str, tuple[str, str]] = {}
    commits, hardware = set(), set()
    for d in map(Path, run_dirs):
        p = d / "summary.json"
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file (a run whose origin must be checked)")
        s = json.loads(p.read_text())
        parts = [seg.get("provenance") for seg in s.get("segments") or []] or [s.get("provenance")]
        for prov in parts:
            if not isinstance(prov, dict):
                raise MixedOrigin(f"{p} records no provenance, so its training code cannot be checked; retrain the run")
            found = {"code": training_code(prov, str(p)), "torch": str(prov.get("torch"))}
            for k, v in found.items():
                seen = first.setdefault(k, (str(p), v))
                if seen[1] != v:
                    what = "training code" if k == "code" else k
                    raise MixedOrigin(f"mixed runs: {seen[0]} ran {what} {seen[1]} but {p} {v}; retrain the study's "
                                      f"runs at one {what} (snakemake retrains those that differ)")
            commits.add(str(prov.get("commit")))
            hardware.add(str(prov.get("hardware")))
    return {"code": first["code"][1], "torch": first["torch"][1], "commits": sorted(commits),
            "hardware": sorted(hardware)} if first else {}


def stamp_tex(text: str, origin: dict | None) -> str:
    """A generated LaTeX table with its provenance as a comment line after the first."""
    if origin is None:
        return text
    head, _, rest = text.partition("\n")
    return f"{head}\n{TEX_MARK}{json.dumps(origin, sort_keys=True)}\n{rest}"


def pdf_metadata(origin: dict | None) -> dict[str, str]:
    """PDF metadata (for matplotlib's savefig) that carries the provenance."""
    return {} if origin is None else {"Keywords": json.dumps(origin, sort_keys=True)}
