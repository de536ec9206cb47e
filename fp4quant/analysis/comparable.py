"""Which training runs belong together: the one rule by which the analysis steps put runs side by side.

A study (workflow/config/study.yaml) compares runs that differ only in what it varies: the TP
communication, the directions it compresses and the compute -- together the run name
(fp4quant.train.train_config.run_name, e.g. fp4quant@fwd) -- and the seed.  Besides those, runs may
differ only in bookkeeping that changes nothing trained or measured (the fields a resumed run
may change, fp4quant.train.consistency.BOOKKEEPING, less eval_batches: the validation batches a
loss is measured on).  Anything else -- the model and its architecture, the steps and their
learning-rate schedule, the shape, the optimizer, the TP and data-parallel mesh, the device
the run resolved to, the data -- makes a difference between two runs meaningless, and
``check_runs`` refuses it in one line naming the field, its values and the runs holding each.

A run is complete when it holds RUN_FILES: the trainer writes log.jsonl as it trains and
summary.json when it ends, and the analysis reads both (the loss curves, the summary).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..train.consistency import BOOKKEEPING

RUN_FILES = ("summary.json", "log.jsonl")
VARIED = ("comm", "compress", "compute", "seed")  # what a study compares: the run name and the seed
# bookkeeping that is still compared: it decides which validation batches a run's loss is measured on
MEASURED = ("eval_batches",)
IGNORED = frozenset(BOOKKEEPING) - set(MEASURED) | set(VARIED)
# checksums a summary may record beside a path as spelled; where every run records one, it is
# compared, and the data's path (which may move, fp4quant.train.consistency) is not
CHECKSUMS = {"data_sha256": "data", "model_config_sha256": None}
SHOWN_RUNS = 3  # runs named per value; the rest counted


class Incomparable(ValueError):
    """Runs that do not belong together, or one that is not complete, in one line."""


def check_complete(run_dirs: Iterable[str | Path]) -> None:
    """Every run folder holds RUN_FILES; FileNotFoundError naming the first missing one."""
    for d in map(Path, run_dirs):
        missing = [name for name in RUN_FILES if not (d / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{d}: {' and '.join(missing)} missing: the training run is not complete "
                                    "(rerun it, or leave it out)")


def identity(summary: dict[str, Any]) -> dict[str, Any]:
    """What must be the same in runs compared with each other, by field: the configuration's
    fields (fp4quant.train.train_config.TrainConfig) but the ignored ones, then what the run resolved to."""
    cfg = summary["provenance"]["config"]
    ident = {k: v for k, v in cfg.items() if k not in IGNORED}
    ident["data"] = cfg.get("data")  # as spelled: compared unless the data's checksum is recorded
    if "steps" in summary:  # the steps trained (an extended run: every schedule it decayed over, below)
        ident["steps"] = summary["steps"]
    mesh = summary.get("mesh") or {}
    ident.update({f"mesh.{k}": mesh.get(k) for k in ("tp", "dp", "device")})  # device: cpu float32, cuda bf16
    ident.update({f"architecture.{k}": v for k, v in sorted((summary.get("model") or {}).items())})
    ident["lr_schedule"] = summary.get("lr_schedule")
    ident.update({k: summary.get(k) for k in CHECKSUMS})
    return ident


def read_identity(run: Path) -> dict[str, Any]:
    path = run / "summary.json"
    try:
        summary = json.loads(path.read_text())
        return identity(summary)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # torn, or no training configuration
        raise Incomparable(f"{path} records no training configuration ({type(exc).__name__}: {exc}), "
                           "so it cannot be compared with other runs") from None


def _show(value: Any) -> str:
    return "(not recorded)" if value is None else value if isinstance(value, str) else json.dumps(value)


def _runs(runs: list[str]) -> str:
    named = ", ".join(runs[:SHOWN_RUNS]) + (f" and {len(runs) - SHOWN_RUNS} more" if len(runs) > SHOWN_RUNS else "")
    return f"run{'s' if len(runs) > 1 else ''} {named}"


def differences(idents: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, list[str]]]]:
    """The fields on which runs (name -> identity) differ, each with its values and the runs holding them."""
    if not idents:
        return []
    recorded = {k for k in CHECKSUMS if all(i.get(k) is not None for i in idents.values())}
    skipped = set(CHECKSUMS) - recorded | {CHECKSUMS[k] for k in recorded if CHECKSUMS[k]}
    fields = list(dict.fromkeys(k for i in idents.values() for k in i if k not in skipped))
    found = []
    for field in fields:
        values: dict[str, list[str]] = {}
        for run, ident in idents.items():
            values.setdefault(_show(ident.get(field)), []).append(run)
        if len(values) > 1:
            found.append((field, values))
    return found


# what the TP-degree study varies besides VARIED: the TP degree, and the TP = 1 control of BF16's rounding
TP_VARIED = ("tp", "mesh.tp", "rounding_alone")


def check_runs(run_dirs: Iterable[str | Path], also_varied: tuple[str, ...] = ()) -> None:
    """The runs are complete and belong together (see the module's docstring), differing only in
    VARIED and ``also_varied``; otherwise one line naming the first field that differs, its values
    and runs, and the other fields that differ."""
    runs = [Path(d) for d in run_dirs]
    check_complete(runs)
    found = [(f, v) for f, v in differences({str(d): read_identity(d) for d in runs}) if f not in also_varied]
    if not found:
        return
    field, values = found[0]
    shown = " vs ".join(f"{v} ({_runs(r)})" for v, r in values.items())
    also = f"; they also differ in {', '.join(f for f, _ in found[1:])}" if len(found) > 1 else ""
    raise Incomparable(f"runs differ in {field}: {shown}{also}; runs compared with each other may differ only "
                       f"in {', '.join(VARIED + also_varied)}")
