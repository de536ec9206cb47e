"""Freeze a complete workflow run into a reference folder, kept in git apart from what runs produce.

    python -m fp4quant.analysis freeze --profile cpu --to reference/cpu-amd-epyc-2core

copies data/<profile>/ (without token files and checkpoints), the figures and the LaTeX
tables into <to>/data/<profile>/, <to>/figures/, <to>/tables/, and writes <to>/README.md
saying what produced them.  It refuses a run whose results, figures and tables do not all
come from one machine, commit and torch (see .origin), or whose figures and tables were made
for another profile or are missing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .figures import FIGURES
from .origin import MixedOrigin, check_same_origin, read_stamp
from .tables import TABLES

SKIPPED_DIRS = {"tokens", "checkpoints", ".snakemake", "traffic"}  # large, and rebuilt by any run (traffic: captured tensors)
# the workflow's resume key of a run folder (workflow/scripts/fresh_run.py): bookkeeping that
# names this machine's paths, no result
SKIPPED_FILES = {"workflow_job.json"}
# files whose text may name the run's folder (logs, JUnit XML, build records): frozen with that
# folder's absolute path made relative to it, so a reference names no machine's paths
TEXT_SUFFIXES = {".log", ".xml", ".json", ".jsonl", ".txt", ".csv", ".md"}


def run_files(data: Path) -> list[Path]:
    """The files of one profile's run worth keeping (not token files, checkpoints, temporaries)."""
    return sorted(p for p in data.rglob("*") if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(data).parts)
                  and p.name not in SKIPPED_FILES and not p.name.startswith(".") and not p.name.endswith(".tmp"))


def made_from_run(figures: Path, tables: Path, data: Path) -> list[Path]:
    """The figures and tables the run's results make (projection, traffic, the model's validation,
    the step breakdown and the regime only where the run has them: runs before the split codec
    timers have no breakdown)."""
    results = data / "results"
    optional = {"projection": results / "projection.csv", "traffic": data / "bench" / "traffic.csv",
                "validation": results / "model_validation.csv", "model_validation": results / "model_validation.csv",
                "breakdown": results / "breakdown.csv", "regime": results / "regime.csv"}
    def has(name: str) -> bool:  # a result with a header and at least one row
        path = optional.get(name)
        return path is None or (path.exists() and len(path.read_text().splitlines()[:2]) == 2)

    return [figures / f"{n}.pdf" for n in FIGURES if has(n)] + [tables / f"{n}.tex" for n in (*TABLES, "regime") if has(n)]


def freeze(profile: str, to: str | Path, data: str | Path = "data", figures: str | Path = "figures",
           tables: str | Path = "paper/tables", command: str = "make figures") -> dict:
    """Copy one complete, consistent run into ``to``; return its provenance."""
    src, dest = Path(data) / profile, Path(to)
    if not (src / "results").is_dir():
        raise FileNotFoundError(f"{src}/results: no results of profile {profile} to freeze (run the workflow first)")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} already holds something; freeze into a new folder")
    files = run_files(src)
    made = made_from_run(Path(figures), Path(tables), src)
    missing = [str(p) for p in made if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: the run is not complete (run the workflow first)")
    for p in made:
        stamped = read_stamp(p).get("profile")
        if stamped != profile:
            raise MixedOrigin(f"{p} was made for profile {stamped or '(unknown: made before figures were stamped)'}, "
                              f"not {profile}; rerun the workflow for {profile} before freezing")
    origin = check_same_origin([p for p in files if p.suffix in (".csv", ".json") and not p.name.endswith(".meta.json")
                                and p.name != "meta.json"] + made)
    root = f"{src.resolve().parent.parent}/"  # the folder the run ran in (data/<profile> below it)
    for p in files:
        target = dest / "data" / profile / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
        if p.suffix in TEXT_SUFFIXES:  # as bytes: a log's carriage returns stay as they are
            data_bytes = p.read_bytes()
            if root.encode() in data_bytes:
                target.write_bytes(data_bytes.replace(root.encode(), b""))
    for p in made:
        target = dest / ("figures" if p.suffix == ".pdf" else "tables") / p.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
    (dest / "README.md").write_text(readme(profile, dest, origin, command))
    return origin


def readme(profile: str, dest: Path, origin: dict, command: str) -> str:
    hardware = "; ".join(origin["hardware"])
    return (
        f"# Reference results: {hardware}\n\n"
        f"A complete run of the workflow's profile `{profile}`, frozen on {time.strftime('%Y-%m-%d')} with\n"
        f"`python -m fp4quant.analysis freeze --profile {profile} --to {dest}`.\n"
        "Compare a run of your own against it; a run never reads it.\n\n"
        f"- produced by: `{command}`\n"
        f"- hardware: {hardware}\n"
        f"- commit: {origin['commit']}\n"
        f"- torch: {origin['torch']}\n\n"
        f"`data/{profile}/`: the workflow's raw logs, run summaries, benchmark CSVs and tidy results "
        "(without token files and checkpoints); `figures/`: the paper's figures; `tables/`: its LaTeX tables.\n"
    )
