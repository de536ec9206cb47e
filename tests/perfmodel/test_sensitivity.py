"""The projection's sensitivity sweep and the model's compute/communication overlap."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from fp4quant.cluster.calibrate import TargetCluster
from fp4quant.models import ModelConfig
from fp4quant.perfmodel import Machine, Workload, machines, step
from fp4quant.perfmodel import sensitivity

RATES = {"fp4quant": {"quantize": 1e9, "dequantize_reduce": 1e9, "dequantize": 1e9}}


def machine(**kw) -> Machine:
    base = dict(name="m", rank_flops=1e12, inter_bw=1e9, inter_latency=1e-5, intra_bw=1e11, intra_latency=1e-6,
                ranks_per_node=1, codec_values_per_s=RATES)
    return Machine(**{**base, **kw})


@pytest.mark.parametrize("bw", [1e7, 1e9, 1e12])  # communication longer than, near, shorter than compute
def test_overlap_hides_the_wire_behind_compute_but_not_the_codec(bw):
    w = Workload(ModelConfig.preset("tiny"), 2, 128, 2)
    m = machine(inter_bw=bw)
    off, on = step(w, m, "fp4quant"), step(w, m, "fp4quant", overlap=True)
    assert (off.compute_s, off.comm_s, off.codec_s) == (on.compute_s, on.comm_s, on.codec_s)
    assert off.exposed_comm_s == off.comm_s
    assert on.exposed_comm_s == pytest.approx(max(on.comm_s - on.compute_s, 0.0))
    assert on.total_s == pytest.approx(on.compute_s + on.scalar_s + on.codec_s + max(on.comm_s - on.compute_s, 0.0))
    assert on.tokens_per_s >= off.tokens_per_s


@pytest.mark.parametrize("efficiency", [0.0, -0.1, 1.5, math.nan])
def test_codec_efficiency_outside_0_1_is_refused(efficiency):
    with pytest.raises(ValueError, match="codec efficiency"):
        machines.h100_codec(TargetCluster(), 16, efficiency)


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return pd.DataFrame(sensitivity.sweep())


def test_the_grid_is_complete_and_its_baseline_is_the_projection(rows):
    points = math.prod(len(v) for v in sensitivity.GRID.values())
    assert len(rows) == points * len(sensitivity.SCENARIOS)
    assert not rows.duplicated(["scenario", *sensitivity.GRID]).any()
    for name, tp in sensitivity.SCENARIOS:
        base = rows[(rows.tp == tp) & rows.baseline]
        assert len(base) == 1
        h100 = machines.h100(tp, TargetCluster())
        w = Workload(ModelConfig.preset("qwen-7b"), tp, 2048, 1)  # as python -m fp4quant.perfmodel projects
        expected = step(w, h100, "fp4quant").tokens_per_s / step(w, h100, "bf16").tokens_per_s
        assert base.speedup.iloc[0] == pytest.approx(expected, rel=1e-12)


def test_each_assumption_moves_the_speedup_the_way_it_should(rows):
    one_node, two_nodes = rows[rows.tp == 8], rows[rows.tp == 16]
    # inside one node the inter-node link carries nothing
    assert one_node.groupby([k for k in sensitivity.GRID if k != "inter_node_bw_GBps"]).speedup.nunique().max() == 1
    others = [k for k in sensitivity.GRID if k not in ("inter_node_bw_GBps", "latency_us")]
    for _, g in two_nodes.groupby(others):
        for key in ("inter_node_bw_GBps", "latency_us"):  # a faster link leaves less to gain
            for _, line in g.groupby([k for k in ("inter_node_bw_GBps", "latency_us") if k != key]):
                s = line.sort_values(key).speedup.to_numpy()
                assert (s[1:] <= s[:-1] + 1e-12).all(), key
    # a faster codec gains more
    for _, g in rows.groupby(["scenario", *[k for k in sensitivity.GRID if k != "codec_hbm_fraction"]]):
        s = g.sort_values("codec_hbm_fraction").speedup.to_numpy()
        assert (s[1:] >= s[:-1] - 1e-12).all()


def test_cli_writes_projected_rows_with_provenance_and_the_summary(tmp_path):
    out = tmp_path / "sens.csv"
    assert sensitivity.main(["--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df.kind) == {"projected"} and set(df.hardware) == {"H100 (assumed)"}
    assert {"commit", "torch"} <= set(df.columns)
    meta = json.loads((tmp_path / "sens.csv.meta.json").read_text())
    assert meta["kind"] == "projected" and meta["grid"] == {k: list(v) for k, v in sensitivity.GRID.items()}
    assert len(meta["summary"]) == len(sensitivity.SCENARIOS)
    for line, (name, tp) in zip(meta["summary"], sensitivity.SCENARIOS):
        d = df[df.tp == tp]
        assert name in line and f"{d.speedup.min():.2f}-{d.speedup.max():.2f}x over the grid" in line
