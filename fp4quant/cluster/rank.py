"""A rank of the emulated cluster: install its time dilation as the collectives' hooks, then
run the job as ``python`` would.  The cluster runner starts every rank through it:

    torchrun ... -m fp4quant.cluster.rank -m fp4quant.train --tp 2 ...
    torchrun ... -m fp4quant.cluster.rank path/to/script.py ARGS

The runner passes the dilation in two variables (FP4QUANT_CLUSTER_LATENCY_S,
FP4QUANT_CLUSTER_CODEC_BPS; docs/environment.md), read here and nowhere else: the job
itself -- the trainer, a benchmark -- knows nothing of the emulation.
"""

from __future__ import annotations

import math
import os
import runpy
import sys

from .. import comm
from .dilation import Dilation

LATENCY_VARIABLE = "FP4QUANT_CLUSTER_LATENCY_S"
CODEC_VARIABLE = "FP4QUANT_CLUSTER_CODEC_BPS"


def _non_negative(name: str, raw: str | None) -> float:
    raw = (raw or "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {raw!r}")
    return value


def dilation_from_env(env=None) -> Dilation:
    """The dilation the runner set for this rank (nothing dilated where it set none)."""
    env = os.environ if env is None else env
    return Dilation(_non_negative(LATENCY_VARIABLE, env.get("FP4QUANT_CLUSTER_LATENCY_S")),
                    _non_negative(CODEC_VARIABLE, env.get("FP4QUANT_CLUSTER_CODEC_BPS")))


def variables(d: Dilation) -> dict[str, str]:
    """What the runner sets for its ranks to pass ``d``."""
    return {LATENCY_VARIABLE: repr(d.latency_s), CODEC_VARIABLE: repr(d.codec_bytes_per_s)}


def main(argv: list[str]) -> None:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit("usage: python -m fp4quant.cluster.rank (-m MODULE | SCRIPT) [ARGS...]")
    try:
        dilation = dilation_from_env()
    except ValueError as exc:
        sys.exit(f"fp4quant.cluster.rank: {exc}")
    if dilation.active:
        comm.hooks.install(dilation)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
