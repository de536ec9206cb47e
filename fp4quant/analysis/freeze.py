"""Freeze a complete workflow run into a reference folder, kept in git apart from what runs produce.

    python -m fp4quant.analysis freeze --profile cpu --to reference/<name>

copies data/<profile>/ (without token files and checkpoints), the figures and the LaTeX
tables into <to>/data/<profile>/, <to>/figures/, <to>/tables/, and writes <to>/README.md
saying what produced them.  It refuses a run whose results, figures and tables do not all
come from one machine, commit and torch (see .origin), whose figures and tables were made
for another profile or are missing, with a training run that is not complete, or with a
table comparing runs that do not belong together (see .comparable).  A study keyed on the
training code (``--study``) may be frozen before all its batches are done (``--partial``): the runs
its results name go in; the finished runs of the other batches (with the benchmarks built from them
alone) are carried in <to>/carried.tar.xz, which the results do not read, so that
``python -m fp4quant.analysis thaw`` can resume the study on another machine (.thaw); unfinished
runs stay behind, and the README says how many of each.

A frozen run stays small (``slim``): what a reviewer reads stays as plain files (the README,
figures, tables, result and benchmark CSVs with their .meta.json, each run's summary.json,
the cluster's records); the raw logs (is_raw: each training run's log.jsonl, the jobs' *.log,
the unit tests' output, the step model's validation folders) go into one archive,
<to>/raw.tar.xz, under their paths relative to <to> (``tar -xJf raw.tar.xz`` in <to> puts
them back), and a CSV over BIG_CSV_BYTES is xz-compressed in place as <name>.csv.xz (which
pandas reads as it is).
"""

from __future__ import annotations

import csv
import json
import lzma
import math
import shutil
import tarfile
import time
from pathlib import Path

from .comparable import RUN_FILES, TP_VARIED, Incomparable, check_complete, check_runs
from .figures import FIGURES
from .origin import MixedOrigin, check_same_origin, check_same_training_code, read_stamp
from .tables import TABLES

# large, and rebuilt by any run (traffic: captured tensors); build: the extension this machine
# compiled (git ignores it, so a reference holding it would differ between its clone and its freeze)
SKIPPED_DIRS = {"tokens", "checkpoints", ".snakemake", "traffic", "build"}
# the workflow's resume key of a run folder (workflow/scripts/fresh_run.py): bookkeeping that
# names this machine's paths, no result
SKIPPED_FILES = {"workflow_job.json"}
# files whose text may name the run's folder (logs, JUnit XML, build records): frozen with that
# folder's absolute path made relative to it, so a reference names no machine's paths
TEXT_SUFFIXES = {".log", ".xml", ".json", ".jsonl", ".txt", ".csv", ".md"}
# what marks a folder as a training run's: the trainer's files (written as it starts, trains and
# ends), the workflow's resume key and the cluster record written beside them
RUN_MARKS = (*RUN_FILES, "checkpoints", "workflow_job.json", "cluster.json")
# the result tables that compare training runs side by side, naming each in their run column
# (written by the analysis steps collect, throughput, study and study-tp, which checked them as they
# wrote them), and what their runs may differ in besides comparable.VARIED
COMPARED_TABLES = {"training.csv": (), "curves.csv": (), "throughput.csv": (), "breakdown.csv": (),
                   "convergence.csv": (), "tp_convergence.csv": TP_VARIED}
# the slim layout (see the module's docstring): the archive of the raw logs, the folders whose
# files are all raw (as runs of path parts: the unit tests' output, the step model's validation
# with its probes and runs), and the size above which a CSV is kept xz-compressed
RAW_ARCHIVE = "raw.tar.xz"
# a partial freeze's finished runs of the batches its results leave out, whole (summary.json beside the raw logs)
CARRIED_ARCHIVE = "carried.tar.xz"
RAW_FOLDERS = (("logs",), ("tests",), ("cluster", "validation"))
BIG_CSV_BYTES = 64_000
# the kinds of raw logs, as the README names what the archive holds
RAW_KINDS = (("each training run's `log.jsonl`", lambda r: r.name == "log.jsonl"),
             ("the jobs' `*.log`", lambda r: r.suffix == ".log"),
             ("the unit tests' output", lambda r: "tests" in r.parts[:-1]),
             ("the model validation's probes and runs", lambda r: "validation" in r.parts[:-1]))


def run_files(data: Path) -> list[Path]:
    """The files of one profile's run worth keeping (not token files, checkpoints, temporaries)."""
    return sorted(p for p in data.rglob("*") if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(data).parts)
                  and p.name not in SKIPPED_FILES and not p.name.startswith(".") and not p.name.endswith(".tmp"))


def training_runs(data: Path) -> list[Path]:
    """The folders under ``data`` that a training run wrote into (any of RUN_MARKS)."""
    return sorted({p.parent for name in RUN_MARKS for p in data.rglob(name)
                   if not SKIPPED_DIRS & set(p.parent.relative_to(data).parts)})


def compared_runs(data: Path) -> dict[Path, list[Path]]:
    """The runs each of the results' COMPARED_TABLES names (a run named relative to the folder the
    workflow ran in: the one above ``data``'s parent, as the workflow names them)."""
    root = data.resolve().parent.parent
    found = {}
    for table in sorted(p for p in (data / "results").rglob("*.csv") if p.name in COMPARED_TABLES):
        with open(table, newline="") as f:
            named = list(dict.fromkeys(row["run"] for row in csv.DictReader(f) if row.get("run")))
        runs = [root / r for r in named]  # an absolute run stays as it is
        outside = [r for r, p in zip(named, runs) if not p.resolve().is_relative_to(data.resolve())]
        if outside:  # the reference would hold a table of runs it does not hold
            raise FileNotFoundError(f"{table} compares run {outside[0]}, which is not in {data}: "
                                    "freeze the data folder the workflow ran in")
        found[table] = runs
    return found


def check_training_runs(data: Path, left: frozenset[Path] = frozenset()) -> None:
    """Every training run under ``data`` (but those ``left`` behind), or named by a table of its
    results, is complete, and the runs each table compares belong together (.comparable); one
    line naming the problem."""
    tables = compared_runs(data)
    check_complete(sorted({*(r for r in training_runs(data) if r not in left),
                           *(r for runs in tables.values() for r in runs)}))
    for table, runs in tables.items():
        try:
            check_runs(runs, also_varied=COMPARED_TABLES[table.name])
        except Incomparable as exc:  # which table compares them
            raise Incomparable(f"{table}: {exc}") from None


def results_runs(data: Path) -> list[Path]:
    """The training runs a study's results name (its COMPARED_TABLES), as found under ``data``."""
    named = {r.resolve() for runs in compared_runs(data).values() for r in runs}
    return [r for r in training_runs(data) if r.resolve() in named]


def check_study_results(data: Path, partial: bool = False) -> None:
    """A study's results describe the runs frozen with them: its tables name every training run
    under ``data`` (``partial``: the runs they name are those frozen, the others stay behind), each
    with the final validation loss its summary.json records.  Results built before a run was added
    or retrained are stale: one line naming the run."""
    tables = compared_runs(data)
    named = results_runs(data)
    unnamed = [r for r in training_runs(data) if r not in named]
    if unnamed and not partial:
        raise Incomparable(f"{unnamed[0]}: a run no table of {data}/results names (the results are older than it): "
                           "rebuild the study's results before freezing")
    root = data.resolve().parent.parent
    for table in tables:
        with open(table, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("run") and r.get("final_val_loss")]
        for row in rows:
            recorded = json.loads(((root / row["run"]) / "summary.json").read_text()).get("val_loss")
            if recorded is None or not math.isclose(float(row["final_val_loss"]), recorded, rel_tol=1e-12):
                raise Incomparable(f"{table}: run {row['run']} has final validation loss {row['final_val_loss']}, "
                                   f"but its summary.json says {recorded} (retrained since?): rebuild the study's "
                                   "results before freezing")


def made_from_run(figures: Path, tables: Path, data: Path) -> list[Path]:
    """The figures and tables the run's results make (the projection, the model's validation and
    the regime only where the run has them: the workflow makes them on the emulated cluster only)."""
    results = data / "results"
    optional = {"projection": results / "projection.csv", "validation": results / "model_validation.csv",
                "model_validation": results / "model_validation.csv", "regime": results / "regime.csv"}

    def has(name: str) -> bool:  # a result with a header and at least one row
        path = optional.get(name)
        return path is None or (path.exists() and len(path.read_text().splitlines()[:2]) == 2)

    return [figures / f"{n}.pdf" for n in FIGURES if has(n)] + [tables / f"{n}.tex" for n in (*TABLES, "regime") if has(n)]


def is_raw(rel: Path) -> bool:
    """Whether a file of a frozen run (``rel``: its path inside the reference folder) is a raw log,
    kept in RAW_ARCHIVE: a training run's per-step log.jsonl, a job's *.log, or any file of the
    RAW_FOLDERS."""
    parts = rel.parts[:-1]
    return (rel.name == "log.jsonl" or rel.suffix == ".log"
            or any(parts[i:i + len(f)] == f for f in RAW_FOLDERS for i in range(len(parts))))


def pack(folder: Path, files: list[Path], archive: Path) -> None:
    """Move ``files`` (under ``folder``) into the xz tar ``archive``, under their paths relative to
    ``folder``: owner-free entries in a fixed order, so that the same files give the same archive."""
    if not files:
        return
    with tarfile.open(archive, "w:xz") as tar:
        for p in files:
            info = tar.gettarinfo(p, arcname=p.relative_to(folder).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(p, "rb") as f:
                tar.addfile(info, f)
    for p in files:
        p.unlink()


def slim(folder: str | Path) -> dict[str, list[str]]:
    """Put a frozen run into the slim layout (the module's docstring): its raw logs (is_raw) into
    ``folder``/RAW_ARCHIVE under their paths relative to ``folder``, and each CSV over BIG_CSV_BYTES
    xz-compressed in place; folders left empty go.  Returns what it did ({"packed": [...],
    "compressed": [...]}: paths relative to ``folder``)."""
    folder = Path(folder)
    archive = folder / RAW_ARCHIVE
    if archive.exists():
        raise FileExistsError(f"{archive} already exists: {folder} is slim already")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    raw = [p for p in files if is_raw(p.relative_to(folder))]
    big = [p for p in files if p.suffix == ".csv" and p not in raw and p.stat().st_size > BIG_CSV_BYTES]
    pack(folder, raw, archive)
    for p in big:
        p.with_name(p.name + ".xz").write_bytes(lzma.compress(p.read_bytes()))
        p.unlink()
    for d in sorted((d for d in folder.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return {"packed": [p.relative_to(folder).as_posix() for p in raw],
            "compressed": [p.relative_to(folder).as_posix() for p in big]}


def left_behind(data: Path) -> tuple[frozenset[Path], frozenset[Path], frozenset[Path]]:
    """The training runs under ``data`` that a study's results do not name, as a partial freeze
    splits them, and what goes with the carried: (carried, left, carried results).  Carried:
    finished runs of configurations (run folders' parents) the results do not cover yet; left
    behind: unfinished runs, and finished ones whose captured traffic (``traffic/``) no result was
    built from yet; carried results: the ``*.meta.json`` of results built from carried runs' captures
    alone.  One line for what would leave a
    result stale or a file mislaid: results naming no run, a finished run beside runs they name (the
    results are older than it), a result built from a run left behind or from runs of both kinds
    (a ``*.meta.json`` naming them among its ``captures``), a run outside the TP study's layout
    (whose job logs is_left could not tell)."""
    runs, named = training_runs(data), results_runs(data)
    if not named:
        raise Incomparable(f"the results of {data} name none of its {len(runs)} training runs: build the results "
                           "of the batches to freeze first")
    unnamed = frozenset(runs) - frozenset(named)
    covered = {r.parent for r in named}
    for r in sorted(unnamed):
        if r.relative_to(data).parts[0] != "tp_runs":
            raise ValueError(f"{r}: --partial knows the TP study's layout only (runs under {data}/tp_runs)")
        if (r / "summary.json").exists() and r.parent in covered:
            raise Incomparable(f"{r}: a finished run beside runs the results name, which they do not (the results "
                               "are older than it): rebuild the study's results before freezing")
    built = {meta: captured_runs(data, meta, runs) for meta in sorted(data.rglob("*.meta.json"))}
    measured = frozenset().union(*built.values())
    # a finished run whose captured traffic nothing was built from yet goes with the unfinished: the
    # capture is not frozen, so carried without what was to be measured on it, it could never be
    unmeasured = {r for r in unnamed if (r / "traffic").is_dir() and r not in measured}
    finished = frozenset(r for r in unnamed if all((r / name).is_file() for name in RUN_FILES)) - unmeasured
    left = unnamed - finished
    for meta, sources in built.items():
        if sources & left:
            capture = sorted(sources & left)[0]
            raise Incomparable(f"{meta}: built from {capture}, of a run the results do not name: rebuild it "
                               "with the results' batches before freezing")
        if sources & finished and sources - finished:
            raise Incomparable(f"{meta}: built from {sorted(sources & finished)[0]}, of a batch the results leave out, and from "
                               f"{sorted(sources - finished)[0]}, which the results name: rebuild it with the "
                               "results' batches before freezing")
    return finished, left, frozenset(meta for meta, sources in built.items() if sources and sources <= finished)


def captured_runs(data: Path, meta: Path, runs: list[Path]) -> frozenset[Path]:
    """The training runs (of ``runs``) whose captured traffic a result was built from, as its
    ``*.meta.json`` names them among its ``captures``."""
    root = data.resolve().parent.parent
    sources = [(root / c).resolve() for c in json.loads(meta.read_text()).get("captures") or []]
    return frozenset(r for r in runs for s in sources if s.is_relative_to(r.resolve()))


def meta_of(path: Path) -> Path:
    """The ``*.meta.json`` that describes a result: the file beside it, or the file itself."""
    return path if path.name.endswith(".meta.json") else path.with_name(path.name + ".meta.json")


def is_left(rel: Path, left_rel: list[Path]) -> bool:
    """Whether a file (``rel``: its path in the profile's folder) belongs to a run left behind: a file
    in its folder, or a job's log named after it (the workflow names a run's training job's log by
    the run's last three folders, e.g. logs/tp_train_tp8_bf16_seed4.log)."""
    def job_log_of(r: Path) -> bool:
        return rel.parts[0] == "logs" and rel.stem.endswith("_".join(("", *r.parts[-3:])))

    return any(rel.is_relative_to(r) or job_log_of(r) for r in left_rel)


def freeze(profile: str, to: str | Path, data: str | Path = "data", figures: str | Path = "figures",
           tables: str | Path = "paper/tables", command: str = "make figures", study: bool = False,
           partial: bool = False) -> dict:
    """Copy one complete, consistent run into ``to`` in the slim layout; return its provenance.

    ``study``: a study keyed on the training code (``provenance: training_code``), whose figures and
    tables lie in its own folder and whose runs gather over commits and machines: every run must
    have one training code and torch (origin.check_same_training_code), every result one torch.
    ``partial`` (a study only): freeze the runs its results name (the batches they cover) and leave
    the others (unfinished, or of batches the results do not cover yet) behind, as the README says."""
    src, dest = Path(data) / profile, Path(to)
    if partial and not study:
        raise ValueError("--partial freezes the batches a study's results cover: give --study too")
    if not (src / "results").is_dir():
        raise FileNotFoundError(f"{src}/results: no results of profile {profile} to freeze (run the workflow first)")
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} already holds something; freeze into a new folder")
    carried, left, carried_results = left_behind(src) if partial else (frozenset(), frozenset(), frozenset())
    left_rel, carried_rel = [r.relative_to(src) for r in left], [r.relative_to(src) for r in carried]
    files = [p for p in run_files(src) if not is_left(p.relative_to(src), left_rel)]
    carried_files = [p for p in files if is_left(p.relative_to(src), carried_rel) or meta_of(p) in carried_results]
    made = [] if study else made_from_run(Path(figures), Path(tables), src)
    missing = [str(p) for p in made if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: the run is not complete (run the workflow first)")
    for p in made:
        stamped = read_stamp(p).get("profile")
        if stamped != profile:
            raise MixedOrigin(f"{p} was made for profile {stamped or '(none: it has no provenance stamp)'}, "
                              f"not {profile}; rerun the workflow for {profile} before freezing")
    results = [p for p in files if p.suffix in (".csv", ".json") and not p.name.endswith(".meta.json")
               and p.name != "meta.json"] + made
    if study:
        frozen = [r for r in training_runs(src) if r not in left]
        code = check_same_training_code(frozen)
        if not code:
            raise FileNotFoundError(f"{src}: no training runs: not a study to freeze")
        check_same_origin(results, keys=("torch",))
        check_study_results(src, partial)
        origin = {"hardware": code["hardware"], "commit": "; ".join(code["commits"]), "torch": code["torch"],
                  "code": code["code"]}
        if left or carried:  # a partial freeze of a finished study is a whole one
            origin["partial"] = (len(frozen) - len(carried), len(carried), len(left))
    else:
        origin = check_same_origin(results)
    check_training_runs(src, left)
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
    pack(dest, [dest / "data" / profile / p.relative_to(src) for p in carried_files], dest / CARRIED_ARCHIVE)
    packed = slim(dest)
    (dest / "README.md").write_text(readme(profile, dest, origin, command, packed))
    return origin


def packed_paragraph(packed: dict[str, list[str]]) -> str:
    """The README's first paragraph: what ``slim`` packed and compressed, and how to undo it."""
    said = []
    if packed["packed"]:
        raw = [Path(p) for p in packed["packed"]]
        kinds = [name for name, of in RAW_KINDS if any(of(r) for r in raw)]
        said.append(f"the raw logs ({', '.join(kinds)}; {len(raw)} files) are packed into `{RAW_ARCHIVE}` under "
                    f"their paths here: `tar -xJf {RAW_ARCHIVE}` in this folder puts them back")
    if packed["compressed"]:
        big = packed["compressed"]
        over = f"over {BIG_CSV_BYTES // 1000} KB"
        which = f"the {len(big)} CSVs {over} are" if len(big) > 1 else f"`{big[0]}`, the one CSV {over}, is"
        said.append(f"{which} xz-compressed in place (`<name>.csv.xz`: `xz -dk` it, or pandas reads it as it is)")
    return f"Kept small: {'; '.join(said)}.\n\n" if said else ""


def partial_line(profile: str, dest: Path, named: int, carried: int, left: int) -> str:
    """The README's line on a partial freeze: the runs the results name, those carried, those left."""
    line = f"- partial: the {named} runs the study's results name (the batches they cover)"
    if carried:
        runs = "1 finished run of another batch is" if carried == 1 else f"{carried} finished runs of other batches are"
        line += (f"; {runs} carried in `{CARRIED_ARCHIVE}`, which the results "
                 f"do not read (`python -m fp4quant.analysis thaw --from {dest}` puts them and this folder's runs back "
                 f"under data/{profile}, where the workflow resumes the study)")
    if left:
        line += (f"; {left} unfinished under data/{profile} (or with captured traffic not yet measured) "
                 "were left behind")
    return line + "\n"


def readme(profile: str, dest: Path, origin: dict, command: str,
           packed: dict[str, list[str]] | None = None) -> str:
    hardware = "; ".join(origin["hardware"])
    return (
        f"# Reference results: {hardware}\n\n"
        + packed_paragraph(packed or {"packed": [], "compressed": []}) +
        f"A {'partial' if 'partial' in origin else 'complete'} run of the workflow's profile `{profile}`, "
        f"frozen on {time.strftime('%Y-%m-%d')} with\n"
        f"`python -m fp4quant.analysis freeze --profile {profile} --to {dest}"
        f"{' --study --partial' if 'partial' in origin else ' --study' if 'code' in origin else ''}`.\n"
        "Compare a run of your own against it; a run never reads it.\n\n"
        f"- produced by: `{command}`\n"
        f"- hardware: {hardware}\n"
        f"- commit: {origin['commit']}\n"
        + (f"- training code: {origin['code']} (fp4quant.provenance.code_digest: the runs span the commits above, "
           "all of this one training code)\n" if "code" in origin else "")
        + (partial_line(profile, dest, *origin["partial"]) if "partial" in origin else "") +
        f"- torch: {origin['torch']}\n\n"
        f"`data/{profile}/`: the workflow's run summaries, benchmark CSVs and tidy results "
        + ("(without token files, checkpoints and captured traffic); its `figures/`: the study's figures.\n"
           if "code" in origin else
           "(without token files and checkpoints); `figures/`: the paper's figures; `tables/`: its LaTeX tables.\n")
    )
