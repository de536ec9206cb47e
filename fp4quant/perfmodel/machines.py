"""The machines the model runs on: the emulated cluster (from its measurements) and H100
nodes (from stated assumptions, or the GPU kernel benchmark where one ran)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..cluster.calibrate import TargetCluster
from ..format.config import QuantConfig
from .model import Machine, fit_link

# values per second of each codec op on an H100 when no GPU kernel benchmark exists: the
# kernels are memory-bound, assumed at 70% of HBM bandwidth, BF16 in and 4.5-bit messages
# out (quantize, dequantize: 2 + 0.56 bytes per value of the all-reduce; the reduce, per
# value of the shard it writes, reads W messages' 0.56 and writes the re-quantized 0.56)
H100_CODEC_EFFICIENCY = 0.7
MESSAGE_BYTES_PER_VALUE = QuantConfig.preset("fp4quant").bits_per_value / 8  # the preset's message, 4.516 bits


def h100_codec(target: TargetCluster, world: int, efficiency: float = H100_CODEC_EFFICIENCY) -> dict[str, dict[str, float]]:
    """values/s of each op when the codec runs at ``efficiency`` of the HBM bandwidth in a TP
    group of ``world`` ranks (the dequantize-reduce's bytes per shard value grow with it)."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"codec efficiency must be in (0, 1] of the HBM bandwidth, got {efficiency}")
    if world < 2:
        raise ValueError(f"a TP group of at least 2 ranks has a codec, got {world}")
    bw = efficiency * target.hbm_bw
    per_value = 2 + MESSAGE_BYTES_PER_VALUE
    rates = {"quantize": bw / per_value, "dequantize_reduce": bw / ((world + 1) * MESSAGE_BYTES_PER_VALUE),
             "dequantize": bw / per_value}
    return {"fp4quant": rates}


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes a value of each input dtype (the kernels' GB/s count them)


def gpu_codec(csv: str | Path) -> dict[str, dict[str, float]]:
    """values/s per preset and op from a CUDA kernel benchmark (largest size measured), of BF16
    input where it was measured (what the all-reduce carries), else of float32 input: each
    dtype's GB/s counts its own bytes a value."""
    df = pd.read_csv(csv)
    df = df[(df.impl == "native") & (df.device == "cuda")]
    if "dtype" not in df:
        df = df.assign(dtype="float32")  # a benchmark from before the dtype column: float32 input
    if df.empty:
        raise ValueError(f"{csv}: no native CUDA kernel rows (impl native, device cuda)")
    unknown = sorted(set(df.dtype) - set(ITEMSIZE))
    if unknown:
        raise ValueError(f"{csv}: input dtype {unknown[0]} is not one of {', '.join(ITEMSIZE)}")
    dtype = "bfloat16" if (df.dtype == "bfloat16").any() else "float32"
    out: dict[str, dict[str, float]] = {}
    for (preset, op), g in df[df.dtype == dtype].groupby(["preset", "op"]):
        row = g.sort_values("size_bytes").iloc[-1]
        scale = 2 if op == "dequantize_reduce" else 1  # its GB/s counts both summed messages
        out.setdefault(preset, {})[op] = row.gbps * 1e9 / ITEMSIZE[dtype] / scale
    return out


def h100(tp: int, target: TargetCluster | None = None, gpu_kernels: str | Path | None = None) -> Machine:
    """H100 nodes running a TP group of ``tp`` GPUs (the assumed codec's reduce depends on it;
    a GPU kernel benchmark's was measured at its own group size)."""
    target = target or TargetCluster()
    codec = gpu_codec(gpu_kernels) if gpu_kernels else h100_codec(target, tp)
    return Machine(
        name="H100 (assumed)" if not gpu_kernels else "H100 (codec measured on a GPU)",
        rank_flops=target.flops_per_gpu, inter_bw=target.inter_node_bw, inter_latency=target.inter_node_latency,
        intra_bw=target.intra_node_bw, intra_latency=target.intra_node_latency, ranks_per_node=target.gpus_per_node,
        codec_values_per_s=codec,
    )


def emulated(calibration: dict, collectives_csv: str | Path) -> tuple[Machine, dict]:
    """The emulated cluster: its rank's measured FLOP/s and codec throughput (calibration) and
    the link's latency and bandwidth fitted to its measured uncompressed all-reduces
    (model.fit_link)."""
    df = pd.read_csv(collectives_csv)
    base = df[(df.config == "none") & (df.algorithm == "uncompressed")]
    world = int(base.world_size.iloc[0])
    burst = calibration.get("link_burst_bytes", 0)
    alpha, bw = fit_link(list(base.size_bytes), list(base.latency_s), world, burst)
    codec = {p: {op: g * 1e9 / 4 for op, g in ops.items()} for p, ops in calibration["codec_gbps"].items()}
    machine = Machine(name="emulated cluster", rank_flops=calibration["rank_flops"], inter_bw=bw, inter_latency=alpha,
                      intra_bw=bw, intra_latency=alpha, ranks_per_node=1, codec_values_per_s=codec,
                      burst_bytes=burst)
    return machine, {"fitted_latency_s": alpha, "fitted_bandwidth_Bps": bw, "world": world}
