"""The transfer benchmark on 2 gloo ranks: what each primitive sends, and its CSV."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from distributed import REPO, free_port, launch


def test_transfers_time_every_primitive_at_every_size(tmp_path):
    out = tmp_path / "transfers.csv"
    launch("transfers", [sys.executable, "-m", "fp4quant.bench.transfers", "--sizes", "4096", "65536",
                         "--iters", "2", "--out", str(out)], 2, tmp_path, 120, None)
    df = pd.read_csv(out)
    assert set(df.primitive) == {"all_reduce", "exchange_all_to_all", "exchange_all_gather", "all_to_all_single",
                                 "all_gather_into_tensor", "isend_irecv"}
    assert set(df.size_bytes) == {4096, 65536} and len(df) == 12
    assert (df.sent_bytes == df.size_bytes).all()  # sizes that split evenly are sent as asked
    assert (df.latency_min_s <= df.latency_s).all() and (df.latency_s <= df.latency_max_s).all()
    assert df.MBps_per_rank.to_numpy() == pytest.approx((df.sent_bytes / df.latency_s / 1e6).to_numpy())
    assert set(df.world_size) == {2} and set(df.backend) == {"gloo"} and df.commit.notna().all()
    assert (tmp_path / "transfers.csv.meta.json").exists()


def test_one_rank_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    p = subprocess.run([sys.executable, "-m", "fp4quant.bench.transfers", "--out", str(tmp_path / "t.csv")],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "needs at least 2 ranks" in p.stderr
    assert not (tmp_path / "t.csv").exists()
