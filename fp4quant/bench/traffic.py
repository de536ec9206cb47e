"""Quantization error on the tensors that actually cross the wire in TP training.

    python -m fp4quant.bench.traffic --captures RUN/traffic [--out data/cpu/bench/traffic.csv]

The captures come from a training run with ``--capture-traffic-steps`` (fp4quant.parallel.capture):
each rank's contribution to every TP collective, per direction and call, at a few steps.
Every such tensor is compressed (one message, as bench.error does) by

  presets     fp4quant, no_fwht, nvfp4, mxfp4, int4, fp8 as they are;
  rotation    no_fwht after a signed Hadamard of size 16, 128 or the whole group (two-level,
              as fp4quant does), inverse-rotated after decoding; "none" is no_fwht itself;
  4-over-6    each of those rotations, and nvfp4, with the micro-scale chosen per micro-group
              by fp4quant.reference.scale_select (the same wire format).

Output: ``--out`` with one row per tensor (direction, site, step, rank) and method: NMSE and
SQNR = -10 log10(NMSE) in dB, as bench.error defines them; ``<out stem>_summary.csv`` with
one row per direction and method: the SQNR of the pooled error and the median, min, max and
SD of the per-tensor SQNRs over steps, sites and ranks, and the median, min and max of the
paired difference to no_fwht on the same tensor; ``.meta.json`` provenance beside each.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import dequantize, quantize
from ..format.config import QuantConfig
from ..parallel.capture import load_captures
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from ..reference import scale_select
from ..reference.fwht import fwht, ifwht
from .error import nmse

PRESET_NAMES = ("fp4quant", "no_fwht", "nvfp4", "mxfp4", "int4", "fp8")
ROTATIONS = ("none", "16", "128", "group")  # "group": the whole FWHT group, as fp4quant rotates
SIGN_SEED = 0  # the signs fp4quant's FWHT uses (QuantConfig.fwht_seed)

Codec = Callable[[torch.Tensor], torch.Tensor]  # float32 tensor -> its decoded approximation


def _rotated(codec: Codec, size: int) -> Codec:
    """``codec`` applied after a signed Hadamard of ``size`` (zero-padded), undone after decoding."""
    def run(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        padded = F.pad(flat, (0, -flat.numel() % size))
        y = fwht(padded, size, signs=SIGN_SEED)
        return ifwht(codec(y), size, signs=SIGN_SEED)[: flat.numel()].view_as(x)
    return run


def _plain(config: QuantConfig) -> Codec:
    return lambda x: dequantize(quantize(x, config))


def _four_over_six(config: QuantConfig) -> Codec:
    return lambda x: dequantize(scale_select.quantize(x, config))


def methods(group: int | None = None) -> list[tuple[dict, Codec]]:
    """(labels, codec) of every method measured; ``group``: the coarse group of the rotation
    study (default: the no_fwht preset's)."""
    out = []
    for name in PRESET_NAMES:
        config = QuantConfig.preset(name)
        out.append(({"study": "presets", "method": name, "rotation": "group" if config.fwht != "none" else "none",
                     "scale_select": "max_to_6"}, _plain(config)))
    base = QuantConfig.preset("no_fwht", **({"group": group} if group else {}))
    for rotation in ROTATIONS:
        size = base.group if rotation == "group" else None if rotation == "none" else int(rotation)
        for select, make in (("max_to_6", _plain), ("4_over_6", _four_over_six)):
            codec = make(base)
            out.append(({"study": "rotation", "method": "no_fwht", "rotation": rotation, "scale_select": select},
                        _rotated(codec, size) if size else codec))
    out.append(({"study": "rotation", "method": "nvfp4", "rotation": "none", "scale_select": "4_over_6"},
                _four_over_six(QuantConfig.preset("nvfp4"))))
    return out


def site_names(direction: str, calls: int, num_layers: int) -> list[str]:
    """What each call of a direction is, in the call order of fp4quant.models.qwen2 without
    sequence parallelism; ``call<k>`` where the count does not match that order."""
    if calls != 2 * num_layers + 1:
        return [f"call{k}" for k in range(calls)]
    if direction == "fwd":  # the embedding's reduce, then each layer's attention and MLP outputs
        return ["embed"] + [f"L{l}.{part}" for l in range(num_layers) for part in ("attn_out", "mlp_out")]
    # backward: the LM head's input gradient, then each layer's MLP and attention inputs, last layer first
    return ["lm_head_in"] + [f"L{l}.{part}" for l in reversed(range(num_layers)) for part in ("mlp_in", "attn_in")]


def measure(captures: list[dict], group: int | None = None) -> list[dict]:
    todo = list(methods(group))
    tensors = []
    for cap in captures:
        sp = cap["meta"].get("sequence_parallel", False)
        layers = cap["meta"].get("model_config", {}).get("num_layers", 0) if not sp else -1
        for direction, xs in cap["tensors"].items():
            for site, x in zip(site_names(direction, len(xs), layers), xs):
                tensors.append(({"direction": direction, "site": site, "step": cap["step"], "rank": cap["rank"]}, x))
    rows = []
    for where, x in tqdm(tensors, desc="traffic", unit="tensor", file=sys.stderr):
        x = x.to(torch.float32)
        if not torch.isfinite(x).all():
            raise ValueError(f"captured tensor {where} holds NaN or Inf: the run it comes from was not healthy")
        energy = float(x.double().pow(2).sum())
        if energy == 0:  # nothing to measure an error against (a rank with no tokens of its vocabulary shard)
            continue
        for labels, codec in todo:
            e = nmse(codec(x), x)
            rows.append({**where, **labels, "numel": x.numel(), "rms": math.sqrt(energy / x.numel()), "nmse": e,
                         "sqnr_db": -10 * math.log10(e) if e > 0 else math.inf if e == 0 else math.nan})
    return rows


BASELINE = {"study": "presets", "method": "no_fwht"}  # what the paired differences are taken against
TENSOR = ("direction", "site", "step", "rank")


def summarize(rows: list[dict]) -> list[dict]:
    """Per direction and method: the pooled SQNR (energy-weighted), the spread of the per-tensor
    SQNRs, and the spread of their paired differences to no_fwht's on the same tensor."""
    keys = ("direction", "study", "method", "rotation", "scale_select")
    groups: dict[tuple, list[dict]] = {}
    base = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
        if all(r[k] == v for k, v in BASELINE.items()):
            base[tuple(r[k] for k in TENSOR)] = r["sqnr_db"]
    out = []
    for key, rs in groups.items():
        sq = [r["sqnr_db"] for r in rs]
        delta = [r["sqnr_db"] - base[tuple(r[k] for k in TENSOR)] for r in rs]
        err = sum(r["nmse"] * r["rms"] ** 2 * r["numel"] for r in rs)
        energy = sum(r["rms"] ** 2 * r["numel"] for r in rs)
        out.append({**dict(zip(keys, key)), "tensors": len(rs), "steps": len({r["step"] for r in rs}),
                    "sites": len({r["site"] for r in rs}), "sqnr_pooled_db": -10 * math.log10(err / energy),
                    "sqnr_median_db": statistics.median(sq), "sqnr_min_db": min(sq), "sqnr_max_db": max(sq),
                    "sqnr_sd_db": statistics.stdev(sq) if len(sq) > 1 else 0.0,
                    "vs_no_fwht_median_db": statistics.median(delta), "vs_no_fwht_min_db": min(delta),
                    "vs_no_fwht_max_db": max(delta)})
    return out


def summary_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + "_summary" + out.suffix)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captures", required=True, help="a capture folder (a run's traffic/)")
    ap.add_argument("--out", default="data/cpu/bench/traffic.csv")
    ap.add_argument("--group", type=int, default=None, help="coarse group of the rotation study (default: no_fwht's)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (the tensors are small: more threads mostly contend, ~10x slower on a busy machine)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    try:
        captures = load_captures(args.captures)
        QuantConfig.preset("no_fwht", **({"group": args.group} if args.group else {}))
    except (FileNotFoundError, ValueError) as exc:
        print(f"fp4quant.bench.traffic: error: {exc}", file=sys.stderr)
        return 2
    first = captures[0]["meta"]
    source = {"model": first.get("model"), "tp": first.get("tp"), "comm": first.get("comm"),
              "capture_steps": sorted({c["step"] for c in captures}), "ranks": sorted({c["rank"] for c in captures}),
              "capture_provenance": first.get("provenance", {})}
    prov = provenance(captures=str(args.captures), group=args.group, source=source)
    rows = measure(captures, args.group)
    for row in rows:
        row.update(model=source["model"], hardware=prov["hardware"], torch=prov["torch"], commit=prov["commit"])
    summary = summarize(rows)
    for row in summary:
        row.update(model=source["model"], capture_steps=" ".join(map(str, source["capture_steps"])),
                   hardware=prov["hardware"], torch=prov["torch"], commit=prov["commit"])
    atomic_write_csv(args.out, rows)
    atomic_write_json(str(args.out) + ".meta.json", prov)
    atomic_write_csv(summary_path(args.out), summary)
    atomic_write_json(str(summary_path(args.out)) + ".meta.json", prov)
    print(f"wrote {len(rows)} rows to {args.out} and {len(summary)} to {summary_path(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
