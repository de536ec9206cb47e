"""The convergence study (workflow/config/study.yaml): what each TP communication does to the
validation loss of a model trained to well below byte-bigram level.

convergence.csv     one row per run: config (its run name, e.g. fp4quant@fwd), seed, steps,
                    tokens, final_val_loss and its standard error over the validation batches
                    (SD of the per-batch losses / sqrt(batches)), the bits per value it sent
summary             one row per config: mean and SD over seeds, n, and the paired difference
                    to BF16 (same seed: same initialization, batches and validation tokens) with
                    a 95% confidence interval from the t distribution over the seeds; beside it
                    the validation set's own noise in that difference (the per-batch paired SE)
                    and the projected H100 speedup over BF16 (fp4quant.perfmodel, assumed figures)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ..format.config import QuantConfig
from ..models.model_config import ModelConfig
from ..perfmodel import machines
from ..perfmodel.__main__ import PROJECTIONS
from ..perfmodel.model import Workload, step
from ..train.train_config import parse_run_name
from .collect import PROVENANCE_COLUMNS, series

BASELINE = "bf16"  # what every configuration is compared with
CONFIDENCE = 0.95
# bits of the tensors the trainer communicates, uncompressed: float32 on CPU, BF16 under CUDA autocast
DTYPE_BITS = {"cpu": 32, "cuda": 16}


class StudyError(ValueError):
    """Runs the study cannot summarize, in one line."""


def standard_error(values) -> float:
    """SD (ddof 1) / sqrt(n); NaN for fewer than two values."""
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")


def wire_bits_per_value(config: str, device: str) -> float:
    """Bits per value on the wire of a run name, averaged over the two directions (they carry the
    same number of values, fp4quant.perfmodel.model): the format's QuantConfig.bits_per_value
    where that direction is compressed, else 16 (BF16); exact sends the tensors' own dtype."""
    comm, compress, _ = parse_run_name(config.replace("-alone", "", 1))  # -alone: the rounding, nothing sent
    if comm == "exact":
        return float(DTYPE_BITS[device])
    q = QuantConfig.preset(comm)
    return sum(q.bits_per_value if q.compressed and compress in (d, "both") else 16.0 for d in ("fwd", "bwd")) / 2


def runs(run_dirs: list[str | Path], profile: str) -> pd.DataFrame:
    """convergence.csv: one row per run folder (each with summary.json and its validation batches)."""
    rows = []
    for d in map(Path, run_dirs):
        s = json.loads((d / "summary.json").read_text())
        cfg = s["provenance"]["config"]
        batches = s.get("val_batch_losses")
        if s.get("val_loss") is None or not batches:
            raise StudyError(f"{d}: no validation loss per batch (the study needs eval_batches >= 2)")
        if not all(math.isfinite(x) for x in batches):
            raise StudyError(f"{d}: a validation batch's loss is not finite")
        sent = s["fwd_bytes_sent"] + s["bwd_bytes_sent"]  # measured, beside the format's nominal bits
        rows.append({
            "config": series(s), "tp": s["mesh"]["tp"], "seed": cfg["seed"], "steps": s["steps"],
            "ranks": s["mesh"].get("backend") or "one process",  # gloo, nccl, simulated (threads of one process)
            "tokens": s["steps"] * cfg["seq_len"] * cfg["batch_size"] * s["mesh"]["dp"],
            "final_val_loss": s["val_loss"], "val_se": standard_error(batches), "val_batches": len(batches),
            "final_train_loss": s["final_loss"],
            "wire_bits_per_value": wire_bits_per_value(series(s), s["mesh"]["device"]),
            "bytes_sent": sent,
            "tokens_per_s": s["tokens_per_s"], "model": cfg["model"], "profile": profile, "run": str(d),
            "val_batch_losses": json.dumps(batches),
            **{k: s["provenance"][k] for k in PROVENANCE_COLUMNS},
            "code": s["provenance"].get("code", ""),  # the training code's digest (a study may span commits)
            "parts": len(s.get("segments") or [None]),  # resumed under other code, torch or hardware: more than one
        })
    df = pd.DataFrame(rows)
    dup = df[df.duplicated(["config", "tp", "seed"])]
    if len(dup):
        raise StudyError(f"two runs of {dup.config.iloc[0]} at TP {dup.tp.iloc[0]} seed {dup.seed.iloc[0]}")
    return df


def paired_difference(values: pd.Series, base: pd.Series, confidence: float = CONFIDENCE) -> dict:
    """values - base over the seeds both have (Series indexed by seed): n, mean, SD and the
    two-sided ``confidence`` interval of the mean from the t distribution with n - 1 degrees of
    freedom (NaN bounds for fewer than two pairs)."""
    seeds = sorted(set(values.index) & set(base.index))
    d = np.array([values[s] - base[s] for s in seeds], dtype=float)
    mean, sd, low, high = mean_interval(d, confidence)
    return {"n_pairs": len(d), "diff_mean": mean, "diff_sd": sd, "ci_low": low, "ci_high": high}


def mean_interval(d: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """The mean of independent samples ``d``, their SD and the two-sided ``confidence`` interval of
    the mean from the t distribution with n - 1 degrees of freedom (NaN where n is too small)."""
    n = len(d)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    mean = float(np.mean(d))
    sd = float(np.std(d, ddof=1)) if n > 1 else float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)) if n > 1 else float("nan")
    return mean, sd, mean - half, mean + half


def batch_paired_se(a: list[float], b: list[float]) -> float:
    """The standard error of the mean of a - b over validation batches (the same batches)."""
    if len(a) != len(b):
        raise StudyError(f"validation batches differ in number ({len(a)} and {len(b)}): not the same tokens")
    return standard_error(np.asarray(a) - np.asarray(b))


def projected_speedup(config: str, scenario: tuple[str, int] = PROJECTIONS[-1]) -> float:
    """The step model's H100 speedup over BF16 of ``config``'s traffic for Qwen-7B in ``scenario``
    (assumed figures, fp4quant.perfmodel.machines.h100).  exact is BF16 there: the tensors'
    own dtype under autocast."""
    comm, compress, compute = parse_run_name(config)
    if compute != "exact":
        return float("nan")  # the step model knows no FP4 compute
    gpu = machines.h100(scenario[1])
    w = Workload(ModelConfig.preset("qwen-7b"), scenario[1], 2048, 1)
    preset = "bf16" if comm == "exact" else comm
    return step(w, gpu, preset, compress).tokens_per_s / step(w, gpu, "bf16").tokens_per_s


def summary(conv: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """One row per config (in ``order``, then the rest): mean ± SD over seeds, the paired
    difference to BF16 with its t interval, and the checks of the validation set's size."""
    base = conv[conv.config == BASELINE].set_index("seed")
    names = [c for c in (order or []) if c in set(conv.config)] + sorted(set(conv.config) - set(order or []))
    rows = []
    for name in names:
        g = conv[conv.config == name].set_index("seed").sort_index()
        row = {"config": name, "n": len(g), "steps": int(g.steps.iloc[0]), "tokens": int(g.tokens.iloc[0]),
               "val_loss_mean": float(g.final_val_loss.mean()),
               "val_loss_sd": float(g.final_val_loss.std(ddof=1)) if len(g) > 1 else float("nan"),
               "val_se": float(g.val_se.mean()),  # the validation set's noise in one run's loss
               "wire_bits_per_value": float(g.wire_bits_per_value.mean())}
        if name != BASELINE and len(base):
            row.update(paired_difference(g.final_val_loss, base.final_val_loss))
            seeds = sorted(set(g.index) & set(base.index))
            row["diff_batch_se"] = float(np.mean([batch_paired_se(json.loads(g.val_batch_losses[s]),
                                                                  json.loads(base.val_batch_losses[s]))
                                                  for s in seeds])) if seeds else float("nan")
            # the validation set resolves the gap when its standard error (of the paired gap: the
            # same batches in both runs) is at most a quarter of it; a smaller gap it does not resolve
            row["val_se_le_quarter_gap"] = bool(row["diff_batch_se"] <= abs(row["diff_mean"]) / 4)
        try:
            row["projected_h100_speedup"] = projected_speedup(name)
        except KeyError:  # a codec the assumed machine has no rate for
            row["projected_h100_speedup"] = float("nan")
        for k in PROVENANCE_COLUMNS:
            row[k] = g[k].iloc[0]
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, conv: pd.DataFrame) -> str:
    """The summary as a Markdown table, with the run's shape and its provenance."""
    f = lambda v, fmt: "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)  # noqa: E731
    first = conv.iloc[0]
    lines = [f"<!-- provenance: {'; '.join(sorted(set(conv.hardware.astype(str))))}, commit {first.commit}, "
             f"torch {first.torch} -->",
             f"Final validation loss (nats/token), model {first.model}, {int(first.steps)} steps, "
             f"{int(first.tokens)} tokens, {int(first.val_batches)} validation batches (the same for every run).  "
             f"Difference: config - {BASELINE}, paired by seed, {int(CONFIDENCE * 100)}% CI (t, n-1 df).", "",
             "| config | n | val loss mean ± SD | SE (val set) | bits/value | - bf16 (mean [95% CI]) "
             "| SE of the gap (val set) | that SE <= gap/4 | H100 speedup (projected) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        diff = (f"{r.diff_mean:+.4f} [{f(r.ci_low, '+.4f')}, {f(r.ci_high, '+.4f')}]"
                if hasattr(r, "diff_mean") and not math.isnan(r.diff_mean) else "")
        ok = {True: "yes", False: "no"}.get(getattr(r, "val_se_le_quarter_gap", None), "")
        lines.append(f"| {r.config} | {r.n} | {r.val_loss_mean:.4f} ± {f(r.val_loss_sd, '.4f')} | {r.val_se:.4f} "
                     f"| {r.wire_bits_per_value:.2f} | {diff} | {f(getattr(r, 'diff_batch_se', float('nan')), '.4f')} "
                     f"| {ok} | {f(r.projected_h100_speedup, '.2f')} |")
    return "\n".join(lines) + "\n"
