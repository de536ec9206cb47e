"""The topology model: what each algorithm sends across nodes, NCCL's bus bandwidth against
published nccl-tests figures, the committed projection table equal to what the model gives, and
its prediction of the emulated 2 x 2 cluster against the committed measurement."""

from __future__ import annotations

import csv
import json
import re

import pytest

from distributed import REPO
from fp4quant.perfmodel import topology as t
from fp4quant.perfmodel.machines import emulated as emulated_machine

DGX = t.CLUSTERS[0]
NOMINAL = t.Assumptions()


@pytest.mark.parametrize("algorithm, bytes_per_value", [
    ("nccl_bf16", None),  # ring or tree: checked below
    ("flat_fp4", 8 * 8 / 16 * 2 * t.MESSAGE_BITS / 8),  # L (W-L)/W M a phase, two phases: 4.5 N
    ("hierarchical_fp4", t.MESSAGE_BITS / 8),  # 2 (n-1)/n M: 0.56 N
    ("hierarchical_bf16", 2.0),  # 2 (n-1)/n B
])
def test_bytes_leaving_a_node_at_tp16_over_two_nodes(algorithm, bytes_per_value):
    n = 1_000_000
    ar = t.allreduce(algorithm, n, 16, DGX, NOMINAL)
    if bytes_per_value is None:  # NCCL: the ring's 3.75 N or the tree's 2 N
        assert ar.inter_bytes_per_node in (pytest.approx(3.75 * n), pytest.approx(2.0 * n))
    else:
        assert ar.inter_bytes_per_node == pytest.approx(bytes_per_value * n)
    assert t.allreduce(algorithm, n, 8, DGX, NOMINAL).inter_bytes_per_node == 0  # one node: nothing crosses


def large_busbw(cluster, tp, assumptions=NOMINAL) -> float:
    values = 2e9  # 4 GB of BF16: bandwidth-bound
    seconds, _, _ = t.nccl_bf16(values, tp, cluster, assumptions)
    return 2 * (tp - 1) / tp * 2 * values / seconds


def test_nccl_bus_bandwidth_against_published_figures():
    # DGX-A100, 8 x 200 Gb/s, ring: 192 GB/s (NVIDIA/nccl#812); NVLink 3 ring ~230 GB/s
    a100 = t.Cluster("DGX A100", 8, 230e9, 8, 25e9)
    ring_only = t.nccl_bf16  # the ring's figure: force it by a tree that cannot win
    seconds = 2 * 15 / 16 * 4e9 / min(230e9, 0.96 * 8 * 25e9)
    assert 2 * 15 / 16 * 4e9 / seconds == pytest.approx(192e9, rel=0.01)
    assert ring_only(2e9, 16, a100, t.Assumptions(net_efficiency=0.96))[0] <= seconds * 1.001  # NCCL takes the faster
    # two DGX H100 (8 x NDR): 400-450 GB/s for large messages (docs/results/topology.md)
    assert 380e9 <= large_busbw(DGX, 16) <= 450e9
    assert large_busbw(DGX, 8) == pytest.approx(DGX.intra_bw, rel=0.02)


def test_fewer_nics_make_the_hierarchy_pay_more():
    speedups = {}
    for r in t.table(tps=(16,)):
        if r["algorithm"] == "hierarchical_fp4":
            speedups[r["cluster"]] = r["speedup"]
            assert r["speedup_low"] <= r["speedup"] <= r["speedup_high"]
    dgx, two, one = (speedups[c.name] for c in t.CLUSTERS[:3])
    assert dgx < two < one


def test_the_committed_projection_is_the_models():
    with open(REPO / "data" / "projection_clusters.csv") as f:
        committed = list(csv.DictReader(f))
    now = t.table()
    assert len(committed) == len(now)
    for c, n in zip(committed, now):
        for key in ("cluster", "tp", "algorithm", "speedup", "speedup_low", "speedup_high", "allreduce_s"):
            assert str(c[key]) == str(n[key]) or float(c[key]) == pytest.approx(float(n[key]), rel=1e-9), key


def test_the_emulated_two_by_two_cluster_is_predicted_within_15_percent_at_64_mib():
    with open(REPO / "data" / "allreduce_2x2_emulated.csv") as f:
        bench = list(csv.DictReader(f))
    cluster = REPO / "reference/figures-zen4/data/cpu/cluster"
    cal = json.loads((cluster / "calibration.json").read_text())
    _, link = emulated_machine(cal, cluster / "collectives.csv")  # fitted on another run: one rank a node
    rows = [r for r in t.emulated_validation(bench, cal, link, 2, 2) if r["size_bytes"] == 64 << 20]
    assert {r["algorithm"] for r in rows} == {"gloo_bf16", "flat_fp4", "hierarchical_fp4", "hierarchical_bf16"}
    for r in rows:
        assert r["iters"] >= 5 and abs(r["rel_error"]) < 0.15, r
    measured = {r["algorithm"]: r["measured_s"] for r in rows}
    predicted = {r["algorithm"]: r["predicted_s"] for r in rows}
    for times in (measured, predicted):  # hierarchical FP4 the fastest, measured as the model says
        assert times["hierarchical_fp4"] < times["flat_fp4"] < times["gloo_bf16"]


def test_the_emulated_check_alone_writes_only_its_own_file(tmp_path):
    """The workflow's topology_emulated checks the model on the emulated cluster without rewriting
    the projection table another rule owns."""
    cluster = REPO / "reference/figures-zen4/data/cpu/cluster"
    out = tmp_path / "validation.csv"
    assert t.main(["--emulated", str(REPO / "data" / "allreduce_2x2_emulated.csv"), "--calibration",
                   str(cluster / "calibration.json"), "--link-collectives", str(cluster / "collectives.csv"),
                   "--emulated-out", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["validation.csv"]


def test_measured_rows_interpolate_between_sizes():
    assert t._interpolate([1e6, 4e6], [1.0, 4.0], 2e6) == pytest.approx(2.0)
    assert t._interpolate([1e6, 4e6], [1.0, 4.0], 8e6) == pytest.approx(8.0)
    bench = [{"series": s, "size_bytes": str(size), "latency_s": str(sec), "latency_min_s": str(sec * 0.9),
              "latency_max_s": str(sec * 1.1), "dtype": "bfloat16"}
             for s, k in (("none/uncompressed", 2.0), ("fp4quant/hierarchical", 1.0))
             for size, sec in ((16 << 20, 1e-4 * k), (64 << 20, 4e-4 * k))]
    w = t.Workload(t.ModelConfig.preset("qwen-7b"), 16, 2048, 1)
    rows = {r["algorithm"]: r for r in t.measured_rows(bench, w, 400e12, "measured: test")}
    assert rows["nccl_bf16"]["speedup"] == 1.0
    assert rows["hierarchical_fp4"]["speedup_low"] < rows["hierarchical_fp4"]["speedup"] > 1.0


def _bench_rows(world, hardware="H100 test", dtype="bfloat16"):
    return [{"series": s, "size_bytes": str(size), "latency_s": str(sec), "latency_min_s": str(sec * 0.9),
             "latency_max_s": str(sec * 1.1), "dtype": dtype, "world_size": str(world), "hardware": hardware}
            for s, k in (("none/uncompressed", 2.0), ("fp4quant/hierarchical", 1.0))
            for size, sec in ((16 << 20, 1e-4 * k), (64 << 20, 4e-4 * k))]


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return str(path)


@pytest.mark.parametrize("rows, message", [
    (_bench_rows(16) + _bench_rows(8), "rows of world_size 16 and 8"),
    (_bench_rows(16) + _bench_rows(16, hardware="other"), "rows of hardware H100 test and other"),
    (_bench_rows(16, dtype="float32"), r"no uncompressed all-reduce of bfloat16 input .*its dtypes: float32"),
])
def test_a_measured_benchmark_that_mixes_runs_is_one_line_and_writes_nothing(tmp_path, capsys, rows, message):
    """Rows of two TP degrees (or clusters) would be pooled into one speedup: refused, and so is a
    benchmark of float32 input, whose sizes are not the BF16 step's messages."""
    out = tmp_path / "p.csv"
    assert t.main(["--out", str(out), "--measured", _write(tmp_path / "b.csv", rows)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()


def test_a_measured_benchmark_of_one_tp_gives_rows_at_its_tp(tmp_path):
    out = tmp_path / "p.csv"
    assert t.main(["--out", str(out), "--tp", "16", "--measured", _write(tmp_path / "b.csv", _bench_rows(8))]) == 0
    measured = [r for r in csv.DictReader(open(out)) if r["cluster"].startswith("measured")]
    assert {r["tp"] for r in measured} == {"8"} and {r["hardware"] for r in measured} == {"H100 test"}


@pytest.mark.parametrize("argv, message", [
    (["--tp", "-8"], "'-8' is not a positive integer"),
    (["--tp", "0"], "'0' is not a positive integer"),
    (["--emulated", "x.csv"], "--emulated needs --calibration"),
    ([], None),  # neither --out nor --emulated: nothing to write
])
def test_impossible_arguments_are_one_line_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "p.csv"
    with pytest.raises(SystemExit) as exc:
        t.main(["--out", str(out), *argv] if message else [])
    assert exc.value.code == 2 and (message or "nothing to write") in capsys.readouterr().err and not out.exists()


def test_missing_files_and_tp_that_fills_no_nodes_are_one_line(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert t.main(["--out", str(out), "--measured", str(tmp_path / "none.csv")]) == 2
    assert "none.csv" in capsys.readouterr().err and not out.exists()
    assert t.main(["--out", str(out), "--tp", "12"]) == 2
    assert "TP 12 does not fill whole nodes of 8 GPUs" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match="at least 1"):
        t.allreduce("flat_fp4", 1e6, -8, DGX, NOMINAL)
