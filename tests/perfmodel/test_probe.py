"""The probe on one gloo rank: what it records, and that its FLOP/s is the paced steps' own."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys

import pytest

from fp4quant.models import ModelConfig
from fp4quant.perfmodel import probe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_one_rank_records_what_the_model_reads(tmp_path):
    out = tmp_path / "probe.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "fp4quant.perfmodel.probe", "--seq-len", "32", "--batch-size", "1",
                    "--link-sizes", "4096", "8192", "--link-iters", "1", "--steps", "2", "--out", str(out)],
                   env=env, check=True, timeout=300, capture_output=True)
    p = json.loads(out.read_text())
    cfg = ModelConfig.preset("tiny")
    paced = p["paced_step_s"][0]
    assert len(paced) == 2 and p["skew_s"] == 0.0  # one rank: nobody to wait for
    assert p["rank_flops"] == pytest.approx(cfg.flops_per_token(32) * 32 / statistics.fmean(paced))
    assert 1e7 < p["rank_flops"] < 1e13 and p["rank_flops_continuous"] > 0
    assert set(p["codec_values_per_s"]) == {"fp4quant", "fp4quant:sr"} and p["message_values"] == 32 * cfg.hidden_size
    assert all(v > 0 for ops in p["codec_values_per_s"].values() for v in ops.values())
    assert [r["size_bytes"] for r in p["link"]] == [4096, 8192] and all(r["iters"] >= 3 for r in p["link"])
    assert p["exact_allreduce_s"] >= 0 and p["world"] == 1


def test_codec_rates_time_each_op_at_the_two_shot_shapes():
    rates = probe.codec_rates(4096, 2, ["fp4quant", "bf16"], repeats=2)
    assert set(rates) == {"fp4quant", "fp4quant:sr"}  # bf16 has no codec
    assert set(rates["fp4quant"]) == {"quantize", "dequantize_reduce", "dequantize"}
