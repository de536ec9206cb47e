"""--simulate-tp: the ranks as threads of one process compute what torchrun's ranks compute."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from distributed import run_ranks

from fp4quant.train import simulate
from fp4quant.train.train_config import ConfigError, TrainConfig
from train.launch import cli, flags, short, torchrun


def _log(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def _real(data, out, nproc, **kw) -> list[dict]:
    p = torchrun(flags(**short(data, out, **kw)), nproc=nproc, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=400)
    assert p.returncode == 0, err[-2000:]
    return _log(out)


@pytest.fixture
def one_op_thread(monkeypatch):
    """The simulated ranks' op threads as torchrun's ranks' (OMP_NUM_THREADS=1 in launch.torchrun):
    the same GEMM blocking, so the same bits."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
@pytest.mark.parametrize("world, extra", [(2, {}), (4, {}), (2, {"sequence_parallel": True}),
                                          (4, {"comm": "bf16", "compress": "both"})],
                         ids=["w2", "w4", "w2-sp", "w4-bf16"])
def test_simulated_ranks_train_as_the_real_ranks(data, tmp_path, capsys, one_op_thread, world, extra):
    kw = {"tp": world, "comm": "fp4quant", "steps": 8, "checkpoint_every": 4, **extra}  # stochastic backward (default)
    real = _real(data, tmp_path / "real", world, **kw)
    status, err = cli(capsys, **short(data, tmp_path / "sim", simulate_tp=True, **kw))
    assert status == 0, err
    sim = _log(tmp_path / "sim")
    assert [r["step"] for r in sim] == list(range(8))
    for a, b in zip(sim, real):
        if extra.get("comm") == "bf16" and world > 2:
            # BF16 activations are summed by gloo's ring in its order, by the simulation in rank order
            assert abs(a["loss"] - b["loss"]) < 0.05, (a["step"], a["loss"], b["loss"])
            continue
        assert abs(a["loss"] - b["loss"]) <= 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * b["grad_norm"], a["step"]
        for key in ("fwd_bytes_sent", "bwd_bytes_sent", "fwd_calls", "bwd_calls", "fwd_bytes_uncompressed"):
            assert a[key] == b[key], key  # one rank's traffic, as a real rank logs it
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["mesh"] == {"world": world, "tp": world, "dp": 1, "backend": "simulated", "device": "cpu"}
    assert sorted(p.name for p in (tmp_path / "sim" / "checkpoints" / "step_000008").glob("rank*.pt")) == \
        [f"rank{r:04d}.pt" for r in range(world)]


@pytest.mark.slow
def test_a_simulated_run_continues_a_real_ones_checkpoint(data, tmp_path, capsys, one_op_thread):
    """The checkpoints are the real ranks' (a shard per rank): the simulation resumes one and
    computes the steps the real run computed after it."""
    kw = {"tp": 2, "comm": "fp4quant", "steps": 9, "checkpoint_every": 3, "keep_checkpoints": 3}
    straight = _real(data, tmp_path / "straight", 2, **kw)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "step_000006", tmp_path / "run" / "checkpoints" / "step_000006")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("6\n")
    status, err = cli(capsys, **short(data, tmp_path / "run", simulate_tp=True, **kw))
    assert status == 0, err
    got = _log(tmp_path / "run")
    assert [r["step"] for r in got] == list(range(9))
    assert [r["loss"] for r in got[:6]] == [r["loss"] for r in straight[:6]]  # the history, from the checkpoint
    for a, b in zip(got[6:], straight[6:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5, (a["step"], a["loss"], b["loss"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["resumed_from"] == 6


def test_what_cannot_be_simulated_is_refused_in_one_line(data, tmp_path, capsys, monkeypatch):
    for kw, words in (({"tp": 1}, "--simulate-tp needs --tp >= 2"),
                      ({"tp": 2, "device": "cuda"}, "runs its ranks on the CPU"),
                      ({"tp": 2, "model": "hf:missing/config.json"}, "not supported with --model hf:")):
        with pytest.raises(ConfigError, match=words):
            TrainConfig(out=str(tmp_path), simulate_tp=True, **kw)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    status, err = cli(capsys, **short(data, tmp_path / "x", tp=2, simulate_tp=True))
    assert status == 2 and err.count("\n") == 0
    assert "launch it without torchrun (WORLD_SIZE is 2)" in err


@pytest.mark.timeout(120)
def test_a_failing_rank_stops_every_rank_with_its_own_error(data, tmp_path, capsys, monkeypatch):
    from fp4quant.train import loop

    step = loop.Trainer.train_step

    def failing(self):
        if self.mesh.rank == 1 and self.step == 2:
            raise OSError(28, "No space left on device", str(tmp_path / "full"))
        return step(self)

    monkeypatch.setattr(loop.Trainer, "train_step", failing)
    status, err = cli(capsys, **short(data, tmp_path / "run", tp=2, simulate_tp=True))  # rank 0 not left waiting
    assert status == 2
    assert err == f"fp4quant.train: error: cannot write {tmp_path / 'full'}: No space left on device"


def test_the_cores_are_shared_out_between_the_ranks(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert [simulate.threads_per_rank(w) for w in (2, 4, 16)] == [4, 2, 1]
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(simulate, "cores", lambda: 2)
    assert simulate.threads_per_rank(2) == 1


def test_the_bf16_rounding_alone_is_a_labelled_tp1_control(data, tmp_path):
    """--rounding-alone: TP = 1 with BF16's rounding where the TP = 2 wire rounds, nothing sent."""
    one = run_ranks("train.rank_jobs:train", 1, short(data, tmp_path / "exact", tp=1, comm="exact"))[0]
    alone = run_ranks("train.rank_jobs:train", 1, short(data, tmp_path / "alone", tp=1, comm="bf16",
                                                       rounding_alone=True))[0]
    assert alone["losses"][0] != one["losses"][0] and abs(alone["losses"][0] - one["losses"][0]) < 1e-2
    summary = json.loads((tmp_path / "alone" / "summary.json").read_text())
    assert summary["comm"]["label"] == "bf16-alone" and summary["comm"]["rounding_alone"] is True
    assert summary["fwd_bytes_sent"] == 0
    with pytest.raises(ConfigError, match="--rounding-alone is a TP = 1 control"):
        TrainConfig(out=str(tmp_path), tp=2, comm="bf16", rounding_alone=True)
