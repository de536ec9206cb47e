"""Training: TP equivalence, compressed convergence, resume after a real kill, configuration errors."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from distributed import run_ranks
from fp4quant.train import ConfigError, TrainConfig, lr_at
from train.launch import kill_tree, short, torchrun


def test_tp2_matches_tp1_uncompressed(data, tmp_path):
    one = run_ranks("train.rank_jobs:train", 1, short(data, tmp_path / "tp1", tp=1, comm="exact"))[0]
    two = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "tp2", tp=2, comm="exact"))[0]
    assert len(one["losses"]) == 6
    for a, b in zip(one["losses"], two["losses"]):
        assert abs(a - b) < 2e-5 * abs(a), (one["losses"], two["losses"])
    # the step's small uncompressed all-reduces (loss statistics, gradient norm, non-finite check)
    # have a timer of their own: none at TP=1
    for name, timed in (("tp1", False), ("tp2", True)):
        for r in map(json.loads, (tmp_path / name / "log.jsonl").read_text().splitlines()):
            assert (r["scalar_comm_s"] > 0) == timed, (name, r)
            # the least over the ranks of the step's seconds in the TP collectives: this rank's at TP=1
            for d in ("fwd", "bwd"):
                assert 0 <= r[f"{d}_comm_least_s"] <= r[f"{d}_comm_s"], (name, r)
                if not timed:
                    assert r[f"{d}_comm_least_s"] == r[f"{d}_comm_s"], (name, r)


def test_the_least_time_in_the_collectives_is_the_least_over_the_ranks(data, tmp_path):
    ranks = run_ranks("train.rank_jobs:step_records", 2, short(data, tmp_path / "least", tp=2, comm="fp4quant"))
    for step, records in enumerate(zip(*ranks)):
        for d in ("fwd", "bwd"):
            least = min(r[f"{d}_comm_s"] for r in records)
            assert least > 0, (step, records)
            for r in records:  # every rank learns the same least, from the same all-reduce
                assert r[f"{d}_comm_least_s"] == least, (step, d, records)


def _link(spans_a, spans_b):
    """The link's time of two ranks' parts: per part, the later end less the later start."""
    return sum(max(0.0, max(ea, eb) - max(sa, sb)) for (sa, ea), (sb, eb) in zip(spans_a, spans_b))


def test_the_link_time_is_the_last_arrivals_to_the_last_departures(data, tmp_path):
    """comm_link_s: per timed part of the step's collectives, the last rank's end less the
    last rank's start (both ranks on this host, one clock), summed in order."""
    (records0, spans0, _), (records1, spans1, _) = run_ranks("train.rank_jobs:step_records_and_spans", 2,
                                                             short(data, tmp_path / "link", tp=2, comm="fp4quant"))
    assert len(spans0) == len(records0) > 0
    for step, (r0, r1, s0, s1) in enumerate(zip(records0, records1, spans0, spans1)):
        for d in ("fwd", "bwd"):
            assert len(s0[d]) == len(s1[d]) == 4 * r0[f"{d}_calls"], (step, d)  # each call's two exchanges: issue, wait
            link = _link(s0[d], s1[d])
            assert link > 0 and r0[f"{d}_comm_link_s"] == r1[f"{d}_comm_link_s"] == link, (step, d, r0, r1)


@pytest.mark.slow
def test_each_data_parallel_replica_logs_its_own_link_time(data, tmp_path):
    ranks = run_ranks("train.rank_jobs:step_records_and_spans", 4,
                      short(data, tmp_path / "dp_link", tp=2, comm="fp4quant", steps=2), timeout=240)
    replicas = {}
    for records, spans, (tp_rank, dp_rank) in ranks:
        replicas.setdefault(dp_rank, {})[tp_rank] = (records, spans)
    assert sorted(replicas) == [0, 1] and all(sorted(r) == [0, 1] for r in replicas.values())
    by_replica = {}  # (step, direction) -> {dp_rank: link time}
    for dp_rank, members in replicas.items():
        (records0, spans0), (records1, spans1) = members[0], members[1]
        for step, (r0, r1, s0, s1) in enumerate(zip(records0, records1, spans0, spans1)):
            for d in ("fwd", "bwd"):
                link = _link(s0[d], s1[d])
                assert r0[f"{d}_comm_link_s"] == r1[f"{d}_comm_link_s"] == link > 0, (dp_rank, step, d)
                by_replica.setdefault((step, d), {})[dp_rank] = link
    # the two replicas' collectives are apart: their link times differ (not one shared slot)
    assert any(v[0] != v[1] for v in by_replica.values())


@pytest.mark.slow
def test_sequence_parallel_and_activation_checkpointing_match(data, tmp_path):
    base = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "a", tp=2, comm="exact"))[0]["losses"]
    sp = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "b", tp=2, comm="exact", sequence_parallel=True,
                                                     activation_checkpointing=True))[0]["losses"]
    for a, b in zip(base, sp):
        assert abs(a - b) < 2e-5 * abs(a)


@pytest.mark.slow
def test_data_parallel_replicas_stay_identical(data, tmp_path):
    results = run_ranks("train.rank_jobs:train", 4, short(data, tmp_path / "dp", tp=2, comm="fp4quant", steps=3),
                        timeout=240)
    by_tp = {}
    for r in results:
        by_tp.setdefault(r["mesh"][0], set()).add(r["checksum"])
    assert all(len(v) == 1 for v in by_tp.values())  # each TP shard is identical across DP replicas
    assert results[0]["summary"]["mesh"] == {"world": 4, "tp": 2, "dp": 2, "backend": "gloo", "device": "cpu"}
    # the codec's split timers, per direction: quantize and dequantize, their sum the codec's total
    for r in map(json.loads, (tmp_path / "dp" / "log.jsonl").read_text().splitlines()):
        for d in ("fwd", "bwd"):
            assert r[f"{d}_quantize_s"] > 0 and r[f"{d}_dequantize_s"] > 0
            assert r[f"{d}_codec_s"] == pytest.approx(r[f"{d}_quantize_s"] + r[f"{d}_dequantize_s"], rel=1e-9)


@pytest.mark.slow
def test_fp4quant_loss_falls_and_tracks_bf16(data, tmp_path):
    kw = dict(tp=2, steps=40, warmup=4)
    bf16 = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "bf16", comm="bf16", **kw), timeout=300)[0]
    fp4 = run_ranks("train.rank_jobs:train", 2, short(data, tmp_path / "fp4", comm="fp4quant", **kw), timeout=300)[0]
    a, b = bf16["losses"], fp4["losses"]
    assert sum(b[-5:]) / 5 < 0.8 * sum(b[:5]) / 5  # it learns
    assert abs(sum(b[-5:]) - sum(a[-5:])) / sum(a[-5:]) < 0.05  # and stays close to BF16
    s = fp4["summary"]
    assert 0 < s["fwd_bytes_sent"] < s["bytes_uncompressed"] / 2 / 2  # fwd alone is half the traffic, 4x smaller


def test_lr_schedule():
    cfg = TrainConfig(out="x", steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(cfg, 0) == pytest.approx(0.1) and lr_at(cfg, 9) == pytest.approx(1.0)
    assert lr_at(cfg, 10) == pytest.approx(1.0) and lr_at(cfg, 100) == pytest.approx(0.1)
    assert all(lr_at(cfg, s) >= lr_at(cfg, s + 1) for s in range(10, 100))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(comm="fp3"), "--comm must be a preset"),
        (dict(compress="left"), "--compress must be one of"),
        (dict(steps=0), "--steps must be >= 1"),
        (dict(warmup=500), "--warmup must be in"),
        (dict(model="gpt"), "--model must be a preset"),
        (dict(device="tpu"), "--device must be"),
        (dict(backend="mpi"), "--backend must be auto, nccl or gloo"),
        (dict(backend="nccl", device="cpu"), "--backend nccl needs --device cuda"),
    ],
)
def test_bad_options_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(out="x", **kw)


def test_layout_errors_before_any_process_group(data):
    with pytest.raises(ConfigError, match="world size 3 is not divisible by --tp 2"):
        TrainConfig(out="x", tp=2, data=data).check_world(3)
    with pytest.raises(ConfigError, match="--tp 3 does not fit --model tiny"):
        TrainConfig(out="x", tp=3, data=data).check_world(3)
    with pytest.raises(ConfigError, match="no prepared data"):
        TrainConfig(out="x", data="/nonexistent").check_world(1)
    with pytest.raises(ConfigError, match="divisible by --tp"):
        TrainConfig(out="x", tp=2, seq_len=63, sequence_parallel=True, data=data).check_world(2)


def test_cli_reports_a_bad_layout_in_one_line(data, tmp_path):
    p = torchrun(["--model", "tiny", "--tp", "4", "--out", str(tmp_path / "never"), "--data", data], nproc=2,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert "fp4quant.train: error: world size 2 is not divisible by --tp 4" in err


@pytest.mark.slow
def test_resume_after_kill_reproduces_the_uninterrupted_losses(data, tmp_path):
    # 20 steps: the poller below, descheduled on a loaded machine, must not see the run finish
    args = ["--model", "tiny", "--tp", "2", "--comm", "fp4quant", "--steps", "20", "--seq-len", "64",
            "--batch-size", "2", "--checkpoint-every", "3", "--eval-batches", "0", "--data", data]
    straight = torchrun(args + ["--out", str(tmp_path / "straight")], stderr=subprocess.DEVNULL)
    assert straight.wait(timeout=300) == 0
    want = [json.loads(x)["loss"] for x in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]

    run = tmp_path / "killed"
    first = torchrun(args + ["--out", str(run)], stderr=subprocess.DEVNULL)
    log = run / "log.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill it between checkpoints, mid-run
        if log.exists() and len(log.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    kill_tree(first.pid)
    first.wait()
    time.sleep(0.5)  # the workers are gone too: the log stops growing
    steps_done = len(log.read_text().splitlines())
    time.sleep(1.0)
    assert len(log.read_text().splitlines()) == steps_done  # nothing survived the kill
    assert 5 <= steps_done < 20
    second = torchrun(args + ["--out", str(run)], stderr=subprocess.DEVNULL)
    assert second.wait(timeout=300) == 0
    got = [json.loads(x)["loss"] for x in log.read_text().splitlines()]
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == list(range(20))
    assert got == want  # bit-identical losses
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] in range(3, 20, 3) and summary["provenance"]["commit"]
    assert summary["provenance"]["config"]["comm"] == "fp4quant"
