"""That a run is one run: every rank trains the same configuration, and a checkpoint is
only resumed by the configuration that wrote it.

Resuming compares the checkpoint's stored configuration with the new one field by field.
Allowed to differ:
  - ``steps``, only upwards (extending a run).  The warmup (resolved: a tenth of
    ``--steps`` unless given) must stay the same, so extending a run with the default
    warmup needs ``--warmup`` set to the checkpoint's value; the cosine decay after the
    resumed step follows the new ``--steps``, and the summary lists each schedule used.
  - bookkeeping that does not change what is trained: ``out`` (the folder may move),
    ``eval_batches``, ``keep_checkpoints``, ``checkpoint_every``, ``device`` as spelled
    (the resolved device type is compared instead: auto and cuda on a GPU are the same),
    and ``simulate_tp`` (simulated ranks compute what real ones do: either resumes the other).
  - ``data`` as a path: the data is compared by content (tokens_sha256 of its meta.json).
Any other difference is refused in one line naming the fields.
"""

from __future__ import annotations

from typing import Any

from .ranks import Ranks
from .train_config import ConfigError, TrainConfig

# what a resumed run may change (validation, timing and capture do not change what is computed)
BOOKKEEPING = ("out", "eval_batches", "keep_checkpoints", "checkpoint_every", "device", "data", "validate_every_step",
               "sync_timing", "capture_traffic_steps", "simulate_tp")


def check_ranks_agree(cfg: TrainConfig, identity: dict[str, Any], ranks: Ranks) -> None:
    """Every rank holds the same configuration (one all_gather_object); otherwise every rank
    raises the same ConfigError naming the fields and the ranks.  ``identity`` adds resolved
    facts that must agree too (the device type)."""
    if ranks.world == 1:
        return
    mine = {**cfg.to_dict(), **identity}
    everyone = ranks.all_gather_object(mine)
    problems = []
    for key in mine:
        values: dict[Any, list[int]] = {}
        for rank, theirs in enumerate(everyone):
            values.setdefault(repr(theirs.get(key)), []).append(rank)
        if len(values) > 1:
            problems.append(f"{key} (" + "; ".join(f"{v} on rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}"
                                                   for v, r in values.items()) + ")")
    if problems:
        raise ConfigError("the ranks were started with different configurations: " + "; ".join(problems))


def resume_differences(stored: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """What keeps ``cfg`` from resuming a checkpoint of configuration ``stored`` (empty: it may)."""
    new = cfg.to_dict()
    problems = []
    for key in sorted(set(stored) | set(new)):
        if key in BOOKKEEPING or stored.get(key) == new.get(key):
            continue
        if key == "steps" and new["steps"] >= stored["steps"]:
            continue
        problem = f"{key}: {stored.get(key)!r} in the checkpoint, {new.get(key)!r} now"
        if key == "steps":
            problem += " (a run can only be extended)"
        if key == "warmup" and new["steps"] != stored.get("steps"):
            problem += f" (it defaults to a tenth of --steps: give --warmup {stored.get(key)} to extend the run)"
        problems.append(problem)
    return problems
