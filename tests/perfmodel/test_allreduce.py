"""The emulated all-reduce predicted from its components: the transfer rates' interpolation,
each algorithm's sum, the ratio's error, and bad input in one line."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from fp4quant.perfmodel import allreduce

MB = 1e6
TRANSFERS = pd.DataFrame([
    {"primitive": p, "sent_bytes": s, "MBps_per_rank": r}
    for p, rates in {"all_reduce": (7.0, 7.0, 6.0), "all_to_all_single": (7.0, 3.5, 3.5),
                     "all_gather_into_tensor": (7.0, 5.0, 4.0)}.items()
    for s, r in zip((1e5, 1e6, 1e8), rates)])
RECORD = {"nodes": 2, "nproc_per_node": 1, "latency_shaped": False, "dilation": {"latency_injected_s": 0.05}}


def bench_row(series, algorithm, latency_s, wire_bytes, codec_s=0.0, chunk_bytes=float("nan"), size=64 << 20):
    return {"series": series, "algorithm": algorithm, "size_bytes": size, "chunk_bytes": chunk_bytes,
            "wire_bytes": wire_bytes, "latency_s": latency_s, "latency_min_s": 0.9 * latency_s,
            "latency_max_s": 1.1 * latency_s, "iters": 5, "codec_s_rank0": codec_s}


COLLECTIVES = pd.DataFrame([
    bench_row("none/uncompressed", "uncompressed", 12.0, 64 << 20),
    bench_row("fp4quant/two_shot", "two_shot", 6.0, 2e7, codec_s=0.5),
    bench_row("fp4quant/two_shot+chunkauto", "two_shot", 3.0, 2e7, codec_s=0.5, chunk_bytes=4 << 20),
    bench_row("none/uncompressed", "uncompressed", 1.0, 1 << 20, size=1 << 20),
])


def test_rates_interpolate_in_log_size_and_hold_outside_the_measured_sizes():
    assert allreduce.rate_at(TRANSFERS, "all_to_all_single", 1e5) == pytest.approx(7 * MB)
    assert allreduce.rate_at(TRANSFERS, "all_to_all_single", math.sqrt(1e5 * 1e6)) == pytest.approx(5.25 * MB)
    assert allreduce.rate_at(TRANSFERS, "all_reduce", 1e7) == pytest.approx(6.5 * MB)
    assert allreduce.rate_at(TRANSFERS, "all_reduce", 1e3) == 7 * MB and allreduce.rate_at(TRANSFERS, "all_reduce", 1e9) == 6 * MB
    with pytest.raises(allreduce.PredictionError, match="no 'isend_irecv' rows"):
        allreduce.rate_at(TRANSFERS, "isend_irecv", 1e6)


def test_each_algorithm_is_its_components_summed_as_the_module_says():
    rows = {r["series"]: r for r in allreduce.prediction_rows(COLLECTIVES, TRANSFERS, RECORD, 64 << 20)}
    assert list(rows) == ["none/uncompressed", "fp4quant/two_shot", "fp4quant/two_shot+chunkauto"]
    n = 64 << 20
    plain = n / allreduce.rate_at(TRANSFERS, "all_reduce", n) + 2 * 0.05
    assert rows["none/uncompressed"]["predicted_s"] == pytest.approx(plain)
    phase = 1e7  # half the compressed wire bytes, each phase at its own primitive's rate
    two = 0.5 + phase / allreduce.rate_at(TRANSFERS, "all_to_all_single", phase) \
        + phase / allreduce.rate_at(TRANSFERS, "all_gather_into_tensor", phase) + 2 * 0.05
    assert rows["fp4quant/two_shot"]["predicted_s"] == pytest.approx(two)
    # 16 chunks: the host's codec and 16 x 2 latencies beside the wire at the ring's rate, plus a chunk's host work
    host, wire = 0.5 + 16 * 2 * 0.05, 2e7 / allreduce.rate_at(TRANSFERS, "all_reduce", 2e7)
    chunked = rows["fp4quant/two_shot+chunkauto"]
    assert chunked["chunks"] == 16 and chunked["predicted_s"] == pytest.approx(max(host, wire) + host / 16)
    for r in rows.values():
        assert r["speedup_measured"] == pytest.approx(12.0 / r["measured_s"])
        assert r["speedup_predicted"] == pytest.approx(plain / r["predicted_s"])
        assert r["ratio_rel_error"] == pytest.approx(r["speedup_predicted"] / r["speedup_measured"] - 1)


def test_two_shot_phases_take_the_exchanges_rates_where_the_benchmark_has_them():
    exchanges = pd.DataFrame([{"primitive": p, "sent_bytes": s, "MBps_per_rank": 6.5}
                              for p in ("exchange_all_to_all", "exchange_all_gather") for s in (1e5, 1e8)])
    transfers = pd.concat([TRANSFERS, exchanges])
    assert allreduce.phase_primitives(transfers) == ("exchange_all_to_all", "exchange_all_gather")
    assert allreduce.phase_primitives(TRANSFERS) == ("all_to_all_single", "all_gather_into_tensor")
    rows = {r["series"]: r for r in allreduce.prediction_rows(COLLECTIVES, transfers, RECORD, 64 << 20)}
    assert rows["fp4quant/two_shot"]["predicted_s"] == pytest.approx(0.5 + 2 * 1e7 / (6.5 * MB) + 2 * 0.05)


def test_a_shaped_latency_is_not_added_twice():
    rows = allreduce.prediction_rows(COLLECTIVES, TRANSFERS, {**RECORD, "latency_shaped": True}, 64 << 20)
    assert all(r["latency_s"] == 0.0 for r in rows)


def test_the_cli_writes_provenance_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    paths = {k: tmp_path / f"{k}.{ext}" for k, ext in (("collectives", "csv"), ("transfers", "csv"), ("record", "json"))}
    COLLECTIVES.to_csv(paths["collectives"], index=False)
    TRANSFERS.to_csv(paths["transfers"], index=False)
    paths["record"].write_text(json.dumps(RECORD))
    out = tmp_path / "prediction.csv"
    args = [f"--{k}={v}" for k, v in paths.items()] + [f"--out={out}"]
    assert allreduce.main(args) == 0
    df = pd.read_csv(out)
    assert len(df) == 3 and {"hardware", "commit", "torch", "ratio_rel_error"} <= set(df)
    assert json.loads((tmp_path / "prediction.csv.meta.json").read_text())["size"] == 64 << 20
    assert allreduce.main(args[:-1] + ["--size=4096", f"--out={tmp_path / 'x.csv'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("fp4quant.perfmodel.allreduce: error: the collective benchmark has no uncompressed and "
                       "compressed rows at 4096 bytes")
    paths["record"].write_text(json.dumps({"nodes": 2}))
    assert allreduce.main(args) == 2
    assert "the cluster record lacks 'dilation'" in capsys.readouterr().err
    paths["record"].write_text(json.dumps(RECORD))
    COLLECTIVES.drop(columns=["algorithm"]).to_csv(paths["collectives"], index=False)
    assert allreduce.main(args) == 2
    assert "the collective benchmark has no column algorithm" in capsys.readouterr().err.strip().splitlines()[-1]
    COLLECTIVES.to_csv(paths["collectives"], index=False)
    TRANSFERS.assign(MBps_per_rank=TRANSFERS.MBps_per_rank.where(TRANSFERS.primitive != "all_reduce", 0.0)
                     ).to_csv(paths["transfers"], index=False)
    assert allreduce.main(args) == 2  # a zero rate divided by zero
    assert "'all_reduce' rates are not all positive" in capsys.readouterr().err.strip().splitlines()[-1]
