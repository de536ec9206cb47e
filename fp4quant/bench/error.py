"""Quantization error of every preset on the tensor kinds of TP traffic, and the group sweep.

    python -m fp4quant.bench.error [--out data/error.csv] [--numel 1048576] [--seeds 3]

Rows (one per tensor kind x configuration): NMSE = ||dequantize(quantize(x)) - x||^2 /
||x||^2 averaged over seeds, its spread, SQNR = -10 log10(NMSE) in dB, and the bits per
value on the wire.  Configurations: every preset; the fp4quant and no_fwht methods at
group 64..2048 (the sweep that chose the default group); and variants of fp4quant's
scale rounding and FWHT signs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator

import torch
from tqdm import tqdm

from .. import dequantize, quantize
from ..format.config import PRESETS, QuantConfig
from ..format.packed import layout
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from .tensors import HIDDEN, KINDS, make

SWEEP_GROUPS = (64, 128, 256, 512, 1024, 2048)


def configurations() -> Iterator[tuple[str, str, QuantConfig]]:
    """(study, label, config) triples."""
    for name in PRESETS:
        yield "presets", name, QuantConfig.preset(name)
    for method in ("fp4quant", "no_fwht"):
        for group in SWEEP_GROUPS:
            yield "group_sweep", method, QuantConfig.preset(method, group=group)
    yield "variants", "fp4quant scale_round=up", QuantConfig.preset("fp4quant", scale_round="up")
    yield "variants", "fp4quant fwht_seed=None", QuantConfig.preset("fp4quant", fwht_seed=None)
    yield "variants", "fp4quant group=16 (one level)", QuantConfig.preset("fp4quant", group=16)


def nmse(approx: torch.Tensor, exact: torch.Tensor) -> float:
    a, e = approx.double(), exact.double()
    return float(((a - e) ** 2).sum() / (e**2).sum())


def measure(numel: int, seeds: int, kinds=tuple(KINDS)) -> list[dict]:
    configs = list(configurations())
    rows = []
    with tqdm(total=len(configs) * len(kinds) * seeds, desc="error", unit="run", file=sys.stderr) as bar:
        for kind in kinds:
            tensors = [make(kind, numel, seed) for seed in range(seeds)]
            for study, label, config in configs:
                errors = []
                for x in tensors:
                    errors.append(nmse(dequantize(quantize(x, config)), x))
                    bar.update()
                mean = sum(errors) / len(errors)
                # one seed has no spread: NaN, never a 0 that reads as a measured one
                std = math.sqrt(sum((e - mean) ** 2 for e in errors) / (len(errors) - 1)) if len(errors) > 1 \
                    else math.nan
                rows.append({
                    "study": study,
                    "config": label,
                    "kind": kind,
                    "group": config.group if config.compressed else "",
                    "bits_per_value": round(8 * layout(numel, config).nbytes / numel, 4),
                    "nmse": mean,
                    "nmse_std": std,
                    "sqnr_db": -10 * math.log10(mean) if mean > 0 else math.inf if mean == 0 else math.nan,
                    "numel": numel,
                    "seeds": seeds,
                })
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/error.csv")
    ap.add_argument("--numel", type=int, default=1 << 20, help=f"values per tensor (a multiple of {HIDDEN})")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.numel < HIDDEN or args.numel % HIDDEN:
        ap.error(f"--numel {args.numel}: a positive multiple of {HIDDEN} (the tensors' rows)")
    if args.seeds < 1:
        ap.error(f"--seeds {args.seeds}: at least 1")
    prov = provenance(numel=args.numel, seeds=args.seeds)
    rows = measure(args.numel, args.seeds)
    for row in rows:
        row.update(hardware=prov["hardware"], torch=prov["torch"], commit=prov["commit"])
    atomic_write_csv(args.out, rows)
    atomic_write_json(args.out + ".meta.json", prov)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
