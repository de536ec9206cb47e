"""Checkpoints that a kill at any moment cannot corrupt, verified before they are resumed.

Each rank writes its own shard (model, optimizer, step, RNG states) into
``checkpoints/step_N.tmp/``; rank 0 adds the run's log up to step N (``log.jsonl``: the
history a resume restores, since a workflow manager may delete the run's own log) and a
manifest (``manifest.json``: size and SHA-256 of every file, the configuration, the
mesh), then renames the folder to ``step_N`` and atomically rewrites
``checkpoints/latest`` (a pointer for people; resuming trusts the manifests).  A folder
only becomes visible complete; older ones are pruned.

Resuming takes the newest ``step_N`` whose files all match its manifest.  A damaged one
(truncated, zeroed, no manifest) is passed over with one warning for the previous one,
and renamed ``step_N.damaged`` (kept for inspection, out of the way of pruning);
when none is intact, resuming fails with one line.  The ranks agree on the outcome (one
all_gather_object per folder tried), so they all resume the same step or all fail.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..provenance import atomic_write_bytes, atomic_write_json, atomic_write_text
from .ranks import Ranks
from .train_config import ConfigError

MANIFEST = "manifest.json"
LOG = "log.jsonl"
STEP_FOLDER = re.compile(r"step_(\d{6,})")


class CheckpointError(ConfigError):
    """No checkpoint can be resumed (none intact, or written by another configuration)."""


class Damaged(Exception):
    """One checkpoint folder does not match its manifest."""


class Unsafe(Exception):
    """A shard that only a full unpickler could load: refused, never passed over silently."""


@dataclass
class Resumed:
    step: int
    state: dict[str, Any]  # this rank's shard
    manifest: dict[str, Any]
    log: str | None  # rank 0: the log lines of steps 0 .. step-1
    warning: str | None  # what was passed over to get here


def _dir(out: Path) -> Path:
    return out / "checkpoints"


def shard_name(rank: int) -> str:
    return f"rank{rank:04d}.pt"


def _entry(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def save(out: Path, step: int, ranks: Ranks, state: dict[str, Any], keep: int,
         log: str | None = None, meta: dict[str, Any] | None = None) -> None:
    """Write this rank's ``state``; rank 0 also ``log`` (its lines up to ``step``) and the
    manifest, with ``meta`` (configuration, mesh) in it.  Collective over ``ranks``."""
    rank, world = ranks.rank, ranks.world
    ckpt = _dir(out)
    tmp = ckpt / f"step_{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ranks.barrier()
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(tmp / shard_name(rank), buf.getvalue())
    entries = ranks.all_gather_object(_entry(buf.getvalue()))  # every shard is on disk once rank 0 has every digest
    if rank == 0:
        files = {shard_name(r): e for r, e in enumerate(entries)}
        log_bytes = (log or "").encode()
        atomic_write_bytes(tmp / LOG, log_bytes)
        files[LOG] = _entry(log_bytes)
        atomic_write_json(tmp / MANIFEST, {**(meta or {}), "step": step, "world": world, "files": files})
        final = ckpt / f"step_{step:06d}"
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_text(ckpt / "latest", f"{step}\n")
        for old in _steps(out)[keep:]:
            shutil.rmtree(ckpt / f"step_{old:06d}", ignore_errors=True)
    ranks.barrier()


def _steps(out: Path) -> list[int]:
    """Steps of the complete checkpoint folders, newest first."""
    found = [int(m.group(1)) for p in _dir(out).glob("step_*") if p.is_dir() and (m := STEP_FOLDER.fullmatch(p.name))]
    return sorted(found, reverse=True)


def _read(folder: Path, name: str, manifest: dict[str, Any]) -> bytes:
    entry = manifest["files"].get(name)
    if entry is None:
        raise Damaged(f"{name} is not in its manifest (written by a run of another world size?)")
    try:
        data = (folder / name).read_bytes()
    except OSError as exc:
        raise Damaged(f"{name} cannot be read ({exc.strerror})") from None
    if len(data) != entry["bytes"]:
        raise Damaged(f"{name} has {len(data)} bytes, its manifest says {entry['bytes']}")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise Damaged(f"{name} does not match its manifest's SHA-256")
    return data


def _load_state(data: bytes, name: str) -> dict[str, Any]:
    """A shard's state, unpickled with torch's weights-only loader: tensors and plain values
    only, so a crafted file (its checksum rewritten to match) cannot run code on resume."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        what = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise Unsafe(f"{name} holds more than tensors and plain values, refused unread "
                     f"(loading it could run code): {what[:200]}") from None
    except (RuntimeError, EOFError, ValueError) as exc:  # a file that matches its digest but is no torch.save
        raise Damaged(f"{name} is not a readable checkpoint ({type(exc).__name__})") from None


def _manifest_problem(manifest: Any) -> str | None:
    """What makes a parsed manifest unusable (None: nothing): every field resume reads, of its type."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()):
        return "files is not a table of sizes and digests"
    if not isinstance(manifest.get("config"), dict):
        return "config is missing"
    if not isinstance(manifest.get("step"), int):
        return "step is missing"
    schedule = manifest.get("schedule")
    if not (isinstance(schedule, list) and schedule and all(
            isinstance(part, dict) and isinstance(part.get("from_step"), int) and isinstance(part.get("steps"), int)
            for part in schedule)):
        return "schedule is missing"
    return None


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        problem = _manifest_problem(manifest)
        if problem:
            raise Damaged(f"{MANIFEST} is malformed ({problem})")
        return manifest
    except FileNotFoundError:
        raise Damaged(f"{MANIFEST} is missing (damaged, or written by an older fp4quant)") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise Damaged(f"{MANIFEST} is unreadable ({type(exc).__name__})") from None


def _read_log(folder: Path, manifest: dict[str, Any], step: int) -> str:
    text = _read(folder, LOG, manifest).decode()
    try:
        steps = [json.loads(line)["step"] for line in text.splitlines()]
    except (ValueError, KeyError, TypeError):
        steps = None
    if steps != list(range(step)):
        raise Damaged(f"{LOG} does not hold steps 0..{step - 1}")
    return text


def _pointer_warning(out: Path, steps: list[int]) -> str | None:
    pointer = _dir(out) / "latest"
    if not pointer.exists():
        return None
    try:
        named = int(pointer.read_text().strip())
    except (OSError, ValueError):
        return "checkpoints/latest is unreadable"
    return None if named in steps else f"checkpoints/latest names step {named}, which has no folder"


def resume(out: Path, ranks: Ranks, problems: Callable[[dict[str, Any]], list[str]]) -> Resumed | None:
    """The newest intact checkpoint in ``out`` (None: there is none to resume).  ``problems``
    lists what keeps this run from resuming a checkpoint, given its manifest; any problem
    is a CheckpointError on every rank, as is a folder of checkpoints with none intact."""
    rank = ranks.rank
    steps = _steps(out)
    if not steps:
        return None
    passed_over = [w] if (w := _pointer_warning(out, steps)) else []
    for step in steps:
        folder = _dir(out) / f"step_{step:06d}"
        state = log = manifest = None
        try:  # every failure here is this folder's: the ranks decide together below
            manifest = _read_manifest(folder)
            if manifest.get("step") != step:
                raise Damaged(f"{MANIFEST} describes step {manifest.get('step')}")
            refusal = problems(manifest)
            mine = ("refused", "; ".join(refusal)) if refusal else None
            if mine is None:
                state = _load_state(_read(folder, shard_name(rank), manifest), shard_name(rank))
                log = _read_log(folder, manifest, step) if rank == 0 else None
        except Unsafe as exc:
            mine = ("unsafe", f"checkpoint step {step}: {exc}")
        except Damaged as exc:
            mine = ("damaged", f"step {step}: {exc}")
        everyone = ranks.all_gather_object(mine)
        unsafe = [msg for kind, msg in filter(None, everyone) if kind == "unsafe"]
        if unsafe:
            raise CheckpointError(f"{out}: {unsafe[0]}")
        refused = [msg for kind, msg in filter(None, everyone) if kind == "refused"]
        if refused:
            raise CheckpointError(f"{out} holds a run of another configuration (checkpoint step {step}): {refused[0]}")
        damaged = [msg for kind, msg in filter(None, everyone) if kind == "damaged"]
        if damaged:
            passed_over.append(damaged[0])
            continue
        warning = None
        if passed_over:
            warning = "; ".join(passed_over) + f"; resuming from step {step}"
            newer = [later for later in steps if later > step]
            if newer:
                warning += " (the damaged ones are kept as step_*.damaged)"
            if rank == 0:  # out of the way of pruning and of later resumes, but not deleted
                for later in newer:
                    aside = _dir(out) / f"step_{later:06d}.damaged"
                    shutil.rmtree(aside, ignore_errors=True)
                    (_dir(out) / f"step_{later:06d}").rename(aside)
        return Resumed(step, state, manifest, log, warning)
    raise CheckpointError(f"no intact checkpoint in {_dir(out)} ({'; '.join(passed_over)}): "
                          "move it away to start the run over")


def warn(message: str) -> None:
    print(f"fp4quant.train: warning: {message}", file=sys.stderr)
