"""The collective benchmark runs end to end under torchrun (2 gloo ranks, --quick)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from distributed import REPO, free_port


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_benchmark_quick(tmp_path):
    out = tmp_path / "collectives.csv"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "fp4quant.bench.allreduce_sweep", "--quick", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail("benchmark timed out:\n" + log[-4000:])
    assert proc.returncode == 0, log[-4000:]

    df = pd.read_csv(out)
    assert {"series", "config", "algorithm", "chunk_bytes", "size_bytes", "latency_s", "algbw_GBps", "wire_bytes",
            "speedup", "backend", "world_size", "hardware", "torch", "commit"} <= set(df.columns)
    assert set(df.size_bytes) == {4096, 65536, 1 << 20}
    assert set(df.backend) == {"gloo"} and set(df.world_size) == {2}
    assert {"none/uncompressed", "fp4quant/one_shot", "fp4quant/two_shot", "nvfp4/two_shot"} <= set(df.series)
    assert (df.latency_s > 0).all()
    base = df[df.config == "none"].set_index("size_bytes")
    assert (base.speedup == 1.0).all() and (base.wire_bytes == base.index).all()  # 2 (W-1)/W = 1 at W=2
    big = df[(df.size_bytes == 1 << 20) & (df.config == "fp4quant")]
    assert (big.wire_bytes < (1 << 20) / 6).all()  # 4.52 bits per value instead of 32
    chunked = df[df.chunk_bytes.notna()]  # the 256 KiB sweep, with and without overlap
    assert len(chunked) and (chunked.size_bytes >= 2 * chunked.chunk_bytes).all()
    meta = json.loads((tmp_path / "collectives.csv.meta.json").read_text())
    assert meta["world_size"] == 2 and "gloo/2" in meta["summary"]["auto_thresholds"]


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "0"], "--sizes 0: each size must be a positive multiple of 4 bytes (float32)"),
    (["--sizes", "4096", "3"], "--sizes 3: each size must be a positive multiple of 4 bytes"),
    (["--sizes", "4098", "--dtype", "float32"], "--sizes 4098: each size must be a positive multiple of 4"),
    (["--chunk-bytes", "abc"], "--chunk-bytes wants 'auto', a number of bytes or 0"),
    (["--chunk-sweep", "0"], "--chunk-sweep sizes must be positive"),
])
def test_sizes_that_time_nothing_are_one_line_before_any_rank_starts(argv, message, capsys):
    """--sizes 0 divided by zero on every rank; --sizes 3 timed zero-element all-reduces."""
    from fp4quant.bench.allreduce_sweep import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
