"""A topology-aware model of one TP all-reduce and of the training step around it.

A TP group of ``tp`` GPUs spans ``nodes = tp / gpus_per_node`` nodes (one node when it fits).
What each algorithm sends over each link class, for an all-reduce of B bytes of BF16 (N
values) and M bytes of compressed messages (fp4quant: 4.516 bits a value), W = tp ranks,
L ranks a node:

nccl_bf16          NCCL's own choice of ring or tree (the faster).  Ring: every GPU sends
                   2 (W-1)/W B over NVLink, and 2 (W-1)/W B leave each node through its
                   NICs (busBw = min(NVLink, NICs)).  Tree (several nodes): about B leaves a
                   node, 2 (L-1)/L B move over NVLink (why two-node tree busBw exceeds the
                   NICs' line rate: NVIDIA/nccl#812, nccl-tests#196)
flat_fp4           fp4quant's two-shot over all W ranks: an all-to-all and an all-gather of
                   (W-1)/W M each; L (W-L)/W M a phase leave a node (2 x 8 ranks: 4.5 N
                   bytes a node, more than the BF16 ring's 3.75 N)
hierarchical_fp4   a BF16 reduce-scatter and all-gather inside the node ((L-1)/L B each over
                   NVLink) and the two-shot among each rail on B/L: 2 (n-1)/n M leave a node
                   (0.56 N for 2 nodes)
hierarchical_bf16  the same hierarchy uncompressed: 2 (n-1)/n B leave a node

Each phase takes its bytes over its link class's bandwidth (the NICs of a node together, at
``net_efficiency`` of line rate; NVLink at the measured ring bus bandwidth) plus a latency;
phases run one after another (the collectives of this project run one chunk on CUDA).  The
codec reads and writes HBM at ``codec_efficiency`` of its bandwidth (swept: the kernels
have not run on a GPU yet).  The step: compute at the GPU's sustained FLOP/s, plus two
blocking all-reduces a layer each way and one at the embedding and head (perfmodel.model).

Every input is stated in ``Cluster`` and ``Assumptions`` with its source (docs/results/
topology.md); ``table`` reports each cell at the nominal inputs and its low / high over every
combination of the uncertain ones.  Nothing is fitted to the paper's 1.56x.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from dataclasses import dataclass, field, replace

from ..format.config import QuantConfig
from ..models.model_config import ModelConfig

ALGORITHMS = ("nccl_bf16", "flat_fp4", "hierarchical_fp4", "hierarchical_bf16")
MESSAGE_BITS = QuantConfig.preset("fp4quant").bits_per_value  # 4.516 bits a value on the wire
LAUNCH_S = 5e-6  # a codec kernel's launch


# NCCL's own cost model (src/graph/tuning.cc), microseconds: per protocol, a collective's base
# latency, then a latency per ring step (per tree level) over NVLink, PCIe or the network, and
# the share of the bus bandwidth the protocol reaches; a multi-node Simple ring all-reduce's
# latency x 1.9 ("plateau effect of ring").  NCCL runs the fastest algorithm x protocol.
NCCL_PROTOCOLS = {
    "simple": {"base": {"ring": 8.4e-6, "tree": 0.0}, "bw": {"ring": 1.0, "tree": 1.0},
               "step": {"nvlink": {"ring": 3.4e-6, "tree": 28e-6}, "pcie": {"ring": 5.7e-6, "tree": 28e-6},
                        "net": {"ring": 9.6e-6, "tree": 50e-6}}},
    "ll128": {"base": {"ring": 10.0e-6, "tree": 4.4e-6}, "bw": {"ring": 0.92, "tree": 0.915},
              "step": {"nvlink": {"ring": 1.9e-6, "tree": 1.2e-6}, "pcie": {"ring": 2.5e-6, "tree": 1.9e-6},
                       "net": {"ring": 4.0e-6, "tree": 8.5e-6}}},
}
NCCL_RING_PLATEAU = 1.9


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    intra_bw: float  # bytes/s a GPU inside a node: NCCL ring bus bandwidth over NVLink (or PCIe)
    nics_per_node: int
    nic_bw: float  # bytes/s a NIC, each direction (line rate)
    intra_link: str = "nvlink"  # or "pcie": the latency class of a step inside a node
    hbm_bw: float = 3.35e12  # H100 SXM HBM3
    flops_per_gpu: float = 400e12  # sustained BF16 training FLOP/s (~40% of 989 dense)
    source: str = ""


# The clusters of the projection: figures are the hardware's and their sources' (docs/results/topology.md)
CLUSTERS = (
    Cluster("DGX H100: NVLink, 8 x 400G NICs", 8, 370e9, 8, 50e9,
            source="NVLink ring busBw ~370 GB/s (shared/PAPER.md); one NDR 400 Gb/s port a GPU (DGX H100)"),
    Cluster("H100 NVLink, 2 x 200G NICs", 8, 370e9, 2, 25e9,
            source="a scarce-bandwidth node: two 200 Gb/s ports"),
    Cluster("H100 NVLink, 1 x 200G NIC", 8, 370e9, 1, 25e9,
            source="a scarce-bandwidth node: one 200 Gb/s port"),
    Cluster("H100 PCIe, 1 x 200G NIC", 8, 20e9, 1, 25e9, intra_link="pcie",
            flops_per_gpu=300e12, hbm_bw=2.0e12,
            source="PCIe Gen5 through the host: ~20 GB/s ring busBw; H100 PCIe: 756 TFLOP/s dense, 2.0 TB/s"),
)


@dataclass(frozen=True)
class Assumptions:
    """The model's uncertain inputs: nominal values and the (low, high) range each is swept over."""

    net_efficiency: float = 0.9  # NCCL's share of the NICs' line rate
    codec_efficiency: float = 0.5  # of HBM bandwidth, the codec kernels (unmeasured on a GPU)
    compute_scale: float = 1.0  # sustained FLOP/s over Cluster.flops_per_gpu
    nccl_latency_scale: float = 1.0  # of NCCL's own latency model (it chooses its algorithms by it)
    ranges: dict = field(default_factory=lambda: {
        # DGX-A100, 8 x 200 Gb/s: 192 GB/s ring busBw (NVIDIA/nccl#812) = 0.96 of line rate; 0.8: a busier fabric
        "net_efficiency": (0.8, 0.96),
        # an eager kernel to a memory-bound one (issue: 0.2-0.8 of HBM)
        "codec_efficiency": (0.2, 0.8),
        # 30%-50% MFU around the nominal 40%
        "compute_scale": (0.75, 1.25),
        # NCCL's model is conservative for medium messages (its ring "plateau" factor); half of it to all of it
        "nccl_latency_scale": (0.5, 1.0),
    })

    def corners(self) -> list[Assumptions]:
        names = list(self.ranges)
        return [replace(self, **dict(zip(names, values)))
                for values in itertools.product(*(self.ranges[n] for n in names))]


@dataclass(frozen=True)
class AllReduce:
    comm_s: float  # on the links (a phase over both link classes takes the slower one's time)
    codec_s: float
    inter_bytes_per_node: float  # bytes leaving each node

    @property
    def total_s(self) -> float:
        return self.comm_s + self.codec_s


def _codec_s(values: float, ranks: int, c: Cluster, a: Assumptions, value_bytes: float = 2.0) -> float:
    """quantize ``values`` (read value_bytes, write the message), dequantize-reduce ``ranks``
    messages into a 1/ranks shard and re-quantize it, dequantize the gathered shards: bytes
    through HBM at the codec's efficiency, plus three launches."""
    msg = values * MESSAGE_BITS / 8
    moved = values * value_bytes + msg + msg + msg / ranks + msg + values * 2
    return moved / (a.codec_efficiency * c.hbm_bw) + 3 * LAUNCH_S


def _exchange_s(c: Cluster, multi_node: bool, a: Assumptions) -> float:
    """Latency of one all-to-all or all-gather of point-to-point transfers in flight at once
    (NCCL's Simple protocol: a base and one step)."""
    simple = NCCL_PROTOCOLS["simple"]
    return a.nccl_latency_scale * (simple["base"]["ring"] + simple["step"]["net" if multi_node else c.intra_link]["ring"])


def nccl_bf16(values: float, tp: int, c: Cluster, a: Assumptions) -> tuple[float, float, str]:
    """NCCL's all-reduce of ``values`` BF16 values: (seconds, bytes leaving a node, its choice
    as "algorithm/protocol"), the fastest of ring and tree x Simple and LL128 by its own model."""
    L = min(tp, c.gpus_per_node)
    n, W, B = tp // L, tp, 2.0 * values
    net = a.net_efficiency * c.nics_per_node * c.nic_bw
    steps, inter_steps = 2 * (W - 1), 2 * (n - 1)
    choices = []
    for name, proto in NCCL_PROTOCOLS.items():
        step = proto["step"]
        lat = proto["base"]["ring"] + (steps - inter_steps) * step[c.intra_link]["ring"] + inter_steps * step["net"]["ring"]
        lat *= NCCL_RING_PLATEAU if n > 1 and name == "simple" else 1.0
        ring_bw = proto["bw"]["ring"] * (c.intra_bw if n == 1 else min(c.intra_bw, net))
        choices.append((2 * (W - 1) / W * B / ring_bw + a.nccl_latency_scale * lat,
                        2 * (W - 1) / W * B if n > 1 else 0.0, f"ring/{name}"))
        if n > 1:
            tree_lat = proto["base"]["tree"] + 2 * ((L - 1) * step[c.intra_link]["tree"]
                                                   + (n - 1).bit_length() * step["net"]["tree"])
            tree = max(2 * (L - 1) / L * B / c.intra_bw, B / net) / proto["bw"]["tree"]
            choices.append((tree + a.nccl_latency_scale * tree_lat, B, f"tree/{name}"))
    return min(choices)


def allreduce(algorithm: str, values: float, tp: int, c: Cluster, a: Assumptions) -> AllReduce:
    """One all-reduce of ``values`` BF16 values over ``tp`` GPUs of cluster ``c``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if tp < 1 or c.gpus_per_node < 1:
        raise ValueError(f"TP {tp} over nodes of {c.gpus_per_node} GPUs: both must be at least 1")
    L = min(tp, c.gpus_per_node)
    if tp % L:
        raise ValueError(f"TP {tp} does not fill whole nodes of {c.gpus_per_node} GPUs")
    n, W = tp // L, tp
    B, M = 2.0 * values, values * MESSAGE_BITS / 8
    net = a.net_efficiency * c.nics_per_node * c.nic_bw  # a node's NICs together
    if algorithm == "nccl_bf16":
        seconds, inter_bytes, _ = nccl_bf16(values, tp, c, a)
        return AllReduce(seconds, 0.0, inter_bytes)
    if algorithm == "flat_fp4":
        # two phases (all-to-all, all-gather): each rank's (W-1)/W M, (L-1)/W of it over NVLink
        # and, from each node, L (W-L)/W M across; a phase takes the slower link class's time
        intra = (L - 1) / W * M / c.intra_bw
        inter = L * (W - L) / W * M / net if n > 1 else 0.0
        return AllReduce(2 * (max(intra, inter) + _exchange_s(c, n > 1, a)), _codec_s(values, W, c, a),
                         2 * L * (W - L) / W * M)
    # the hierarchy: reduce-scatter and all-gather inside the node, the rail's two-shot between
    rs_ag = 2 * ((L - 1) / L * B / c.intra_bw + _exchange_s(c, False, a)) if L > 1 else 0.0
    sum_s = B / (a.codec_efficiency * c.hbm_bw) if L > 1 else 0.0  # the intra-node sum reads L shards
    if algorithm == "hierarchical_fp4":
        inter = 2 * ((n - 1) / n * M / net + _exchange_s(c, True, a)) if n > 1 else 0.0
        codec = _codec_s(values / L, n, c, a, value_bytes=4.0) + sum_s if n > 1 else sum_s
        return AllReduce(rs_ag + inter, codec, 2 * (n - 1) / n * M)
    inter = 2 * ((n - 1) / n * B / net + _exchange_s(c, True, a)) if n > 1 else 0.0
    return AllReduce(rs_ag + inter, sum_s, 2 * (n - 1) / n * B)


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    tp: int
    seq_len: int
    batch_size: int

    @property
    def values(self) -> int:  # of one TP all-reduce: the block's output, tokens x hidden
        return self.seq_len * self.batch_size * self.model.hidden_size

    @property
    def allreduces(self) -> int:  # a step: two a layer each way, one each way at the embedding / head
        return 2 * (2 * self.model.num_layers + 1)


def step_s(w: Workload, algorithm: str, c: Cluster, a: Assumptions) -> tuple[float, AllReduce]:
    """A training step's seconds and one of its all-reduces."""
    compute = w.model.flops_per_token(w.seq_len) * w.seq_len * w.batch_size / w.tp / (c.flops_per_gpu * a.compute_scale)
    ar = allreduce(algorithm, w.values, w.tp, c, a)
    return compute + w.allreduces * ar.total_s, ar


def table(clusters=CLUSTERS, tps=(8, 16), model: str = "qwen-7b", seq_len: int = 2048, batch_size: int = 1,
          assumptions: Assumptions | None = None) -> list[dict]:
    """One row per cluster x TP x algorithm: the predicted all-reduce time and end-to-end
    speedup over NCCL's BF16, nominal and their low / high over the assumptions' ranges."""
    a = assumptions or Assumptions()
    rows = []
    for c in clusters:
        for tp in tps:
            w = Workload(ModelConfig.preset(model), tp, seq_len, batch_size)
            for algo in ALGORITHMS:
                per = []
                for case in [a, *a.corners()]:
                    base, _ = step_s(w, "nccl_bf16", c, case)
                    step, ar = step_s(w, algo, c, case)
                    per.append((ar.total_s, base / step))
                nominal_step, ar = step_s(w, algo, c, a)
                base_s, _, nccl_algorithm = nccl_bf16(w.values, tp, c, a)
                rows.append({
                    "cluster": c.name, "tp": tp, "nodes": max(1, tp // c.gpus_per_node), "algorithm": algo,
                    "bf16_bus_bw_GBps": 2 * (tp - 1) / tp * 2 * w.values / base_s / 1e9, "nccl_algorithm": nccl_algorithm,
                    "allreduce_s": ar.total_s, "allreduce_s_low": min(p[0] for p in per),
                    "allreduce_s_high": max(p[0] for p in per),
                    "inter_node_bytes_per_node": ar.inter_bytes_per_node,
                    "speedup": per[0][1], "speedup_low": min(p[1] for p in per), "speedup_high": max(p[1] for p in per),
                    "model": model, "seq_len": seq_len, "batch_size": batch_size, "source": c.source,
                })
    return rows


# ---- a real cluster: the measured all-reduces in the same step ------------------------------

MEASURED_SERIES = {"none/uncompressed": "nccl_bf16", "fp4quant/two_shot": "flat_fp4",
                   "fp4quant/hierarchical": "hierarchical_fp4", "none/hierarchical": "hierarchical_bf16"}


def _interpolate(sizes: list[float], seconds: list[float], size: float) -> float:
    """Seconds at ``size``, linear in log-log between the measured sizes (the nearest outside)."""
    import math

    pts = sorted(zip(sizes, seconds))
    if size <= pts[0][0] or len(pts) == 1:
        return pts[0][1] * (size / pts[0][0]) if size > pts[0][0] else pts[0][1]
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if size <= s1:
            f = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    s0, t0 = pts[-1]
    return t0 * size / s0  # past the largest: bandwidth-bound


def measured_rows(bench_rows, w: Workload, flops_per_gpu: float, cluster: str) -> list[dict]:
    """The all-reduce benchmark of a real cluster (fp4quant.bench.allreduce_sweep on its nodes,
    BF16 input) in the step: each series' seconds at the workload's message, interpolated
    between the measured sizes, min and max over its iterations as the range."""
    by: dict[str, dict[str, list[float]]] = {}
    for r in bench_rows:
        algo = MEASURED_SERIES.get(r["series"])
        if algo is None or r.get("dtype", "bfloat16") != "bfloat16":
            continue
        d = by.setdefault(algo, {"size": [], "s": [], "lo": [], "hi": []})
        d["size"].append(float(r["size_bytes"]))
        for k, col in (("s", "latency_s"), ("lo", "latency_min_s"), ("hi", "latency_max_s")):
            d[k].append(float(r[col]))
    if "nccl_bf16" not in by:
        dtypes = sorted({r.get("dtype", "bfloat16") for r in bench_rows})
        raise ValueError("the benchmark has no uncompressed all-reduce of bfloat16 input (series none/uncompressed) "
                         f"to compare with (its dtypes: {', '.join(dtypes)}; the step sends BF16 activations)")
    compute = w.model.flops_per_token(w.seq_len) * w.seq_len * w.batch_size / w.tp / flops_per_gpu
    size = 2.0 * w.values

    def step(algo, key):
        return compute + w.allreduces * _interpolate(by[algo]["size"], by[algo][key], size)

    rows = []
    for algo in [a for a in ALGORITHMS if a in by]:
        t = {k: _interpolate(by[algo]["size"], by[algo][k], size) for k in ("s", "lo", "hi")}
        rows.append({"cluster": cluster, "tp": w.tp, "algorithm": algo, "allreduce_s": t["s"],
                     "allreduce_s_low": t["lo"], "allreduce_s_high": t["hi"],
                     "speedup": step("nccl_bf16", "s") / step(algo, "s"),
                     "speedup_low": step("nccl_bf16", "lo") / step(algo, "hi"),
                     "speedup_high": step("nccl_bf16", "hi") / step(algo, "lo"),
                     "model": "", "seq_len": w.seq_len, "batch_size": w.batch_size,
                     "source": "measured all-reduces (fp4quant.bench.allreduce_sweep), compute assumed"})
    return rows


# ---- the emulated cluster: the same accounting at its dilated rates ------------------------

EMULATED_ALGORITHMS = {"none/uncompressed": "gloo_bf16", "fp4quant/two_shot": "flat_fp4",
                       "fp4quant/hierarchical": "hierarchical_fp4", "none/hierarchical": "hierarchical_bf16"}
LOOPBACK_BPS = 1.0e9  # a namespace's loopback between two gloo ranks (shared/PAPER.md: ~1.1 GB/s); assumed


def emulated_allreduce(algorithm: str, nbytes: int, value_bytes: int, nodes: int, ranks_per_node: int,
                       calibration: dict, link: dict, loopback_bps: float = LOOPBACK_BPS) -> float:
    """Seconds of one all-reduce of ``nbytes`` (``value_bytes`` a value) on the emulated cluster
    of ``calibration``: its shaped link at the bandwidth and latency fitted to the uncompressed
    all-reduces measured on it (``link``: machines.emulated's fit, a node's egress), the
    latency slept per wire step between nodes, each codec op stretched to the dilated target
    codec (``codec_bytes_per_s``, values at 2 bytes: fp4quant.cluster.dilation), loopback
    inside a node."""
    latency, link = link["fitted_latency_s"], link["fitted_bandwidth_Bps"]
    codec = calibration["codec_bytes_per_s"]
    L, n = ranks_per_node, nodes
    W, N = L * n, nbytes // value_bytes
    B, M = float(nbytes), N * MESSAGE_BITS / 8

    def codec_s(values, message_bytes):
        return (2 * values + message_bytes) / codec

    if algorithm == "gloo_bf16":  # a ring over the W ranks: each node's egress carries one ring edge
        return 2 * (W - 1) * latency + 2 * (W - 1) / W * B / link
    if algorithm == "flat_fp4":  # all-to-all and all-gather, each W-1 wire steps; L (W-L)/W M a phase leave a node
        wire = 2 * ((W - 1) * latency + L * (W - L) / W * M / link)
        return wire + codec_s(N, M) + codec_s(0, M + M / W) + codec_s(N, M)
    intra = 2 * (L - 1) / L * B / loopback_bps  # reduce-scatter and all-gather inside the node
    if algorithm == "hierarchical_fp4":
        shard = N / L
        wire = 2 * ((n - 1) * latency + (n - 1) / n * M / link)  # a node's L rails, M / L each
        return intra + wire + codec_s(shard, M / L) + codec_s(0, M / L + M / L / n) + codec_s(shard, M / L)
    if algorithm == "hierarchical_bf16":
        return intra + 2 * ((n - 1) * latency + (n - 1) / n * B / link)
    raise ValueError(f"no emulated model of {algorithm!r}")


def emulated_validation(rows, calibration: dict, link: dict, nodes: int, ranks_per_node: int) -> list[dict]:
    """The benchmark's rows on the emulated cluster (fp4quant.bench.allreduce_sweep) beside the
    model's prediction (``link``: the link fitted on another run's uncompressed all-reduces, one
    rank a node): one row per series and size, with the measured spread."""
    out = []
    for r in rows:
        algorithm = EMULATED_ALGORITHMS.get(r["series"])
        if algorithm is None:
            continue
        value_bytes = 2 if r["dtype"] == "bfloat16" else 4
        predicted = emulated_allreduce(algorithm, int(r["size_bytes"]), value_bytes, nodes, ranks_per_node,
                                       calibration, link)
        measured = float(r["latency_s"])
        out.append({"series": r["series"], "algorithm": algorithm, "size_bytes": int(r["size_bytes"]),
                    "dtype": r["dtype"], "iters": int(r["iters"]), "measured_s": measured,
                    "measured_min_s": float(r["latency_min_s"]), "measured_max_s": float(r["latency_max_s"]),
                    "predicted_s": predicted, "rel_error": predicted / measured - 1,
                    "nodes": nodes, "ranks_per_node": ranks_per_node,
                    **{k: r[k] for k in ("hardware", "commit", "torch") if k in r}})
    return out


def measured_cluster_rows(path: str, model: str, seq_len: int, batch_size: int, flops_per_gpu: float,
                          prov: dict) -> list[dict]:
    """measured_rows of the benchmark CSV ``path``: one real cluster's all-reduces at one TP degree
    (its world size) and hardware, or ValueError naming what the rows mix."""
    import csv

    with open(path, newline="") as f:
        bench = list(csv.DictReader(f))
    if not bench:
        raise ValueError(f"{path}: no benchmark rows")
    for key in ("world_size", "hardware"):
        seen = sorted({str(r.get(key)) for r in bench})
        if len(seen) != 1:
            raise ValueError(f"{path}: rows of {key} {' and '.join(seen)}: one benchmark of one cluster and TP "
                             "degree a file")
    w = Workload(ModelConfig.preset(model), int(bench[0]["world_size"]), seq_len, batch_size)
    hw = bench[0]["hardware"]
    return [{**r, "model": model, "hardware": hw, "commit": prov["commit"], "torch": prov["torch"]}
            for r in measured_rows(bench, w, flops_per_gpu, f"measured: {hw}")]


def main(argv=None) -> int:
    """python -m fp4quant.perfmodel.topology --out projection_clusters.csv
        [--emulated BENCH.csv --calibration CAL.json --nodes 2 --ranks-per-node 2 --emulated-out VALIDATION.csv]"""
    import argparse
    import csv
    import json
    import sys

    from ..provenance import atomic_write_csv, atomic_write_json, provenance

    ap = argparse.ArgumentParser(prog="python -m fp4quant.perfmodel.topology", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None,
                    help="the projection table (cluster x TP x algorithm); without it, only --emulated's check")
    def positive(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
        return int(text)

    ap.add_argument("--model", default="qwen-7b")
    ap.add_argument("--seq-len", type=positive, default=2048)
    ap.add_argument("--batch-size", type=positive, default=1)
    ap.add_argument("--tp", type=positive, nargs="+", default=[8, 16])
    ap.add_argument("--emulated", default=None, help="the all-reduce benchmark on the emulated cluster (CSV)")
    ap.add_argument("--calibration", default=None, help="its calibration (JSON)")
    ap.add_argument("--link-collectives", default=None,
                    help="the uncompressed all-reduces measured on that link, one rank a node (the emulated "
                         "cluster's collective benchmark): the link's effective bandwidth and latency are fitted to them")
    ap.add_argument("--nodes", type=positive, default=2)
    ap.add_argument("--ranks-per-node", type=positive, default=2)
    ap.add_argument("--emulated-out", default=None)
    ap.add_argument("--measured", default=None,
                    help="the all-reduce benchmark on real GPU nodes (CSV): added as rows with measured all-reduces")
    ap.add_argument("--measured-flops", type=float, default=Cluster("", 8, 0, 0, 0).flops_per_gpu,
                    help="sustained FLOP/s a GPU for the measured rows' compute")
    a = ap.parse_args(argv)
    if a.emulated and not (a.calibration and a.emulated_out and a.link_collectives):
        ap.error("--emulated needs --calibration, --link-collectives and --emulated-out")
    if not (a.out or a.emulated):
        ap.error("nothing to write: give --out (the projection), --emulated (its check on the emulated cluster), "
                 "or both")
    prov = provenance()
    try:  # everything read and checked before anything is written
        rows = table(tps=tuple(a.tp), model=a.model, seq_len=a.seq_len, batch_size=a.batch_size)
        for r in rows:
            r.update(hardware="H100 (assumed)", commit=prov["commit"], torch=prov["torch"])  # the origin check knows it
        if a.measured:
            rows += measured_cluster_rows(a.measured, a.model, a.seq_len, a.batch_size, a.measured_flops, prov)
        checked = None
        if a.emulated:
            from .machines import emulated as emulated_machine

            with open(a.emulated, newline="") as f:
                bench = list(csv.DictReader(f))
            cal = json.loads(Path(a.calibration).read_text())
            _, link = emulated_machine(cal, a.link_collectives)
            checked = emulated_validation(bench, cal, link, a.nodes, a.ranks_per_node)
    except (OSError, KeyError, ValueError) as exc:
        print(f"python -m fp4quant.perfmodel.topology: error: {exc}", file=sys.stderr)
        return 2
    assumptions = Assumptions()
    if a.out:
        atomic_write_csv(a.out, rows)
        atomic_write_json(a.out + ".meta.json", provenance(
            clusters=[c.__dict__ for c in CLUSTERS],
            assumptions={"nominal": {k: getattr(assumptions, k) for k in assumptions.ranges},
                         "ranges": assumptions.ranges},
            nccl_model={"protocols": NCCL_PROTOCOLS, "ring_plateau": NCCL_RING_PLATEAU,
                        "source": "NVIDIA/nccl src/graph/tuning.cc (Simple protocol)"},
            message_bits=MESSAGE_BITS, codec_launch_s=LAUNCH_S))
    if checked is not None:
        atomic_write_csv(a.emulated_out, checked)
        for r in checked:
            print(f"{r['series']} {r['size_bytes'] >> 20} MiB: measured {r['measured_s']:.3f} s, predicted "
                  f"{r['predicted_s']:.3f} s ({100 * r['rel_error']:+.1f}%)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
