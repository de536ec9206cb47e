"""Put a frozen study back under data/, where its workflow resumes it on another machine.

    python -m fp4quant.analysis thaw --from reference/study-tp [--data data]

A study keyed on the training code (``freeze --study``) gathers its runs over sittings, and a
sitting may end on a machine that keeps nothing: what it trained lives on only as a frozen folder
(.freeze: the runs its results name, the finished runs of the other batches in carried.tar.xz).  Thaw
writes that folder's files -- plain ones, the raw logs and the carried runs -- back under
<data>/<profile>/ as the workflow wrote them (a ``<name>.csv.xz`` as ``<name>.csv``; each newer
than what it was made from, see ``tier``), so that ``snakemake`` finds those runs done and
trains only the rest.

The workflow reruns a job whose inputs are newer than its outputs, and a thawed run must not be
retrained: so the study's inputs must be there first (the tokens and the built extension: run
the workflow's ``prepare_data`` and ``build_extension`` targets), and each thawed run must have
been trained on those tokens (its summary's ``data_sha256``) by this checkout's training code
(``fp4quant.provenance.code_digest``), which is what the workflow keys a study's runs on.  A file
already there is kept when it is the same, and refused when it differs (nothing is overwritten);
each problem in one line, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import tarfile
import time
from pathlib import Path

from ..provenance import code_digest
from .freeze import CARRIED_ARCHIVE, RAW_ARCHIVE, meta_of

# what the workflow's preparation writes before any run (rules prepare_data and build_extension)
INPUTS = ("tokens/tokens.bin", "tokens/meta.json", "build/info.json")


def frozen_files(ref: Path) -> tuple[str, dict[str, bytes]]:
    """The profile a study's frozen folder holds, and its files as the workflow wrote them: their
    paths relative to the data folder (``<profile>/...``) and their bytes."""
    top = ref / "data"
    profiles = sorted(p.name for p in top.iterdir() if p.is_dir()) if top.is_dir() else []
    if len(profiles) != 1:
        raise FileNotFoundError(f"{top}: holds the profiles {profiles or '(none)'}, not one: not a frozen study")
    files: dict[str, bytes] = {}
    for p in sorted(q for q in (top / profiles[0]).rglob("*") if q.is_file()):
        rel = p.relative_to(top).as_posix()
        if p.name.endswith(".csv.xz"):  # kept compressed by freeze.slim
            files[rel.removesuffix(".xz")] = lzma.decompress(p.read_bytes())
        else:
            files[rel] = p.read_bytes()
    for name in (RAW_ARCHIVE, CARRIED_ARCHIVE):
        if not (ref / name).is_file():
            continue
        try:
            with tarfile.open(ref / name) as tar:
                for member in tar.getmembers():
                    path = Path(member.name)
                    if not member.isfile() or path.is_absolute() or ".." in path.parts:
                        raise ValueError(f"{ref / name}: {member.name} is not a plain file under the folder")
                    if path.parts[0] != "data":  # not a profile's data (a freeze's tests, say)
                        continue
                    rel = Path(*path.parts[1:]).as_posix()
                    if path.parts[1:2] != (profiles[0],) or rel in files:
                        raise ValueError(f"{ref / name}: {member.name} is not a file of data/{profiles[0]} "
                                         "the folder does not hold already")
                    files[rel] = tar.extractfile(member).read()
        except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
            raise ValueError(f"{ref / name}: not a readable xz tar archive ({exc})") from None
    return profiles[0], files


def tier(rel: str, files: dict[str, bytes]) -> int:
    """The order in which the workflow made a file: a run's files (0); what is built from runs or
    their captures (1); a join of such parts (2: its .meta.json lists them as ``parts``); the
    results and figures (3).  Thawed files get mtimes in this order, so that none is older than a
    file it was made from, which Snakemake would take for stale and remake."""
    parts = Path(rel).parts
    if "tp_runs" in parts or "runs" in parts:
        return 0
    if parts[1] in ("results", "figures"):
        return 3
    meta = meta_of(Path(rel)).as_posix()
    return 2 if meta in files and "parts" in json.loads(files[meta]) else 1


def frozen_code(ref: Path) -> str:
    """The training code a study's frozen folder names in its README (freeze --study writes it)."""
    readme = ref / "README.md"
    found = re.search(r"^- training code: ([0-9a-f]+)", readme.read_text(), re.M) if readme.is_file() else None
    if not found:
        raise ValueError(f"{ref}: not a study frozen with --study (its README names no training code): only a "
                         "study's runs, keyed on the training code, resume on another checkout")
    return found.group(1)


def check_thawable(ref: Path, data: Path, profile: str, files: dict[str, bytes]) -> None:
    """Each run thawed is of this checkout's training code and the tokens under ``data``, the
    workflow's inputs are there (older than what is thawed), and no file there differs."""
    code, here = frozen_code(ref), code_digest()
    if code != here:
        raise ValueError(f"{ref}: its runs are of training code {code}, this checkout's is {here}: thaw them into a "
                         "checkout of that training code (the workflow would not retrain them here)")
    missing = [f"{data}/{profile}/{p}" for p in INPUTS if not (data / profile / p).is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: run the workflow's data preparation and build first "
                                f"(snakemake --cores all {data}/{profile}/tokens/meta.json {data}/{profile}/build/info.json "
                                "--configfile ...), so that the runs thawed are newer than their inputs")
    tokens = hashlib.sha256((data / profile / "tokens/tokens.bin").read_bytes()).hexdigest()
    for rel, content in files.items():
        if Path(rel).name != "summary.json":
            continue
        try:
            summary = json.loads(content)
        except ValueError:
            raise ValueError(f"{ref}: {rel} is not JSON: a damaged frozen run") from None
        trained = (summary.get("provenance") or {}).get("code")
        if trained != code:
            raise ValueError(f"{ref}: {rel} was trained by training code {trained}, not the folder's {code}")
        if summary.get("data_sha256") != tokens:
            raise ValueError(f"{ref}: {rel} was trained on tokens {str(summary.get('data_sha256'))[:12]}, but "
                             f"{data}/{profile}/tokens/tokens.bin is {tokens[:12]}: not this study's data")
    for rel, content in files.items():
        target = data / rel
        if target.exists() and (not target.is_file() or target.read_bytes() != content):
            raise FileExistsError(f"{target} exists and differs from {ref}'s copy: move it away first "
                                  "(thaw overwrites nothing)")


def thaw(ref: str | Path, data: str | Path = "data") -> dict:
    """Write a study's frozen folder ``ref`` back under ``data``; return what it did ({"profile",
    "runs": runs thawed, "written": files written, "kept": files already there})."""
    ref, data = Path(ref), Path(data)
    profile, files = frozen_files(ref)
    check_thawable(ref, data, profile, files)
    written = kept = 0
    now = time.time()
    tiers = {rel: tier(rel, files) for rel in files}
    for rel in sorted(files, key=lambda r: (tiers[r], r)):
        target = data / rel
        if target.exists():
            kept += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".thaw.tmp")
        tmp.write_bytes(files[rel])
        os.utime(tmp, (now + tiers[rel], now + tiers[rel]))
        os.replace(tmp, target)
        written += 1
    runs = sum(Path(r).name == "summary.json" for r in files)
    return {"profile": profile, "runs": runs, "written": written, "kept": kept}
