"""The probe on one gloo rank: what it records, and that its FLOP/s is the gapped steps' own;
the link sizes and gaps it derives from the run; the gaps where the run's collectives are."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys

import math

import pytest
import torch

from fp4quant import ops
from fp4quant.cluster.calibrate import CollectiveGaps, InStepCollectives, rank_step_seconds
from fp4quant.format.config import QuantConfig
from fp4quant.models import ModelConfig, Qwen2ForCausalLM
from fp4quant.parallel import CommConfig, TPCommunicator
from fp4quant.perfmodel import Machine, Workload, allreduce_time, probe, step


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
    assert set(p["compute_by_comm"]) == {"bf16", "fp4quant"}
    for c in p["compute_by_comm"].values():
        steps = c["step_s"][0]
        assert len(steps) == 2 and c["skew_s"] == 0.0 and c["collective_gap_s"] == 0.0  # one rank: no waits
        assert c["rank_flops"] == pytest.approx(cfg.flops_per_token(32) * 32 / statistics.fmean(steps))
        assert c["scalar_allreduce_s"] >= 0
    assert p["rank_flops"] == p["compute_by_comm"]["bf16"]["rank_flops"]
    assert 1e7 < p["rank_flops"] < 1e13 and p["rank_flops_continuous"] > 0
    assert set(p["codec_values_per_s"]) == {"fp4quant", "fp4quant:sr"} and p["message_values"] == 32 * cfg.hidden_size
    assert all(v > 0 for ops in p["codec_values_per_s"].values() for v in ops.values())
    assert [r["size_bytes"] for r in p["link"]] == [4096, 8192] and [r["iters"] for r in p["link"]] == [100, 3]
    assert all(r["latency_min_s"] <= r["latency_mean_s"] <= r["latency_max_s"] for r in p["link"])
    assert p["exact_allreduce_s"] >= 0 and p["world"] == 1


def test_probe_two_ranks_time_the_latency_with_each_comms_own_transfers(tmp_path):
    out = tmp_path / "probe.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "fp4quant.perfmodel.probe", "--seq-len", "32", "--batch-size", "1",
                    "--link-sizes", "4096", "4194304", "--link-iters", "1", "--steps", "2", "--out", str(out)],
                   env=env, check=True, timeout=300, capture_output=True)
    p = json.loads(out.read_text())
    assert p["world"] == 2 and set(p["compute_by_comm"]) == {"bf16", "fp4quant"}
    for c in p["compute_by_comm"].values():  # each wait ended in real transfers: a latency per wire step
        assert c["collective_gap_s"] > 0 and len(c["step_s"]) == 2 and len(c["step_s"][0]) == 2
        assert 0 < c["wire_step_latency_s"] < 1.0
        # the run's own all-reduces of half of each tensor: 2 x 2 wire steps for each of a step's 2 x 9
        assert c["collective_fraction"] == 0.5 and c["collective_wire_steps"] == 36
        assert len(c["collective_comm_s_by_step"]) == 2 and c["collective_comm_s"] == pytest.approx(
            statistics.fmean(c["collective_comm_s_by_step"])) and 0 < c["collective_comm_s"] < 10
    # a bracketing probe after the runs: the gapped steps alone, cut by the same waits
    after = tmp_path / "after.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "fp4quant.perfmodel.probe", "--seq-len", "32", "--batch-size", "1", "--steps", "2",
                    "--gaps-from", str(out), "--out", str(after)], env=env, check=True, timeout=300, capture_output=True)
    b = json.loads(after.read_text())
    assert b["gaps_from"] == str(out) and "link" not in b and "codec_values_per_s" not in b
    for name, c in b["compute_by_comm"].items():
        assert c["collective_gap_s"] == p["compute_by_comm"][name]["collective_gap_s"] and len(c["step_s"][0]) == 2
    assert "codec_values_per_s" in b["compute_by_comm"]["fp4quant"] and b["world"] == 2
    assert all(c["collective_wire_steps"] == 36 for c in b["compute_by_comm"].values())
    for probed in (p, b):  # the codec inside the run's own all-reduces of whole tensors: compressed comms only
        assert set(probed["compute_by_comm"]["fp4quant"]["collective_codec_values_per_s"]) == {"fp4quant", "fp4quant:sr"}
        assert all(v > 0 for r in probed["compute_by_comm"]["fp4quant"]["collective_codec_values_per_s"].values()
                   for v in r.values())
        assert "collective_codec_values_per_s" not in probed["compute_by_comm"]["bf16"]


def test_a_bracketing_probe_refuses_a_probe_of_another_shape_in_one_line(tmp_path):
    path = tmp_path / "probe.json"
    earlier = {"world": 2, "message_values": 4096, "link": [], "compute_by_comm": {"bf16": {}, "fp4quant": {}}}
    path.write_text(json.dumps(earlier))
    assert probe.read_earlier(str(path), 2, 4096, {"bf16", "fp4quant"}) == earlier
    with pytest.raises(ValueError, match="probed 2 ranks and 4096-value messages, this probe 2 and 8192"):
        probe.read_earlier(str(path), 2, 8192, {"bf16", "fp4quant"})
    with pytest.raises(ValueError, match="--presets differ"):
        probe.read_earlier(str(path), 2, 4096, {"bf16", "nvfp4"})
    with pytest.raises(ValueError, match="not a full probe"):
        path.write_text(json.dumps({k: v for k, v in earlier.items() if k != "link"}))
        probe.read_earlier(str(path), 2, 4096, {"bf16", "fp4quant"})
    with pytest.raises(ValueError, match="missing.json"):
        probe.read_earlier(str(tmp_path / "missing.json"), 2, 4096, {"bf16", "fp4quant"})


def test_codec_rates_time_each_op_at_the_two_shot_shapes():
    rates = probe.codec_rates(4096, 2, ["fp4quant", "bf16"], repeats=2)
    assert set(rates) == {"fp4quant", "fp4quant:sr"}  # bf16 has no codec
    assert set(rates["fp4quant"]) == {"quantize", "dequantize_reduce", "dequantize"}


def test_link_sizes_are_the_runs_messages_and_multiples():
    sizes = probe.workload_link_sizes(65536, ["fp4quant", "bf16"])
    fp4 = math.ceil(65536 * QuantConfig.preset("fp4quant").bits_per_value / 8)
    assert sizes == sorted({probe.LATENCY_MESSAGE_BYTES, fp4, 131072, 2 * 131072, 4 * 131072, 8 * 131072})


def test_collective_gaps_are_the_link_fit_at_each_message():
    sizes = [4096, 65536, 1 << 20]
    link = [{"size_bytes": s, "latency_s": allreduce_time(s, 2, 5e6, 1e-3)} for s in sizes]
    gaps = probe.collective_gaps(link, 65536, 2, ["fp4quant", "bf16"])
    bits = QuantConfig.preset("fp4quant").bits_per_value
    assert gaps == pytest.approx({"bf16": allreduce_time(131072, 2, 5e6, 1e-3),
                                  "fp4quant": allreduce_time(65536 * bits / 8, 2, 5e6, 1e-3)})
    assert probe.collective_gaps(link, 65536, 1, ["fp4quant"]) == {"bf16": 0.0, "fp4quant": 0.0}


def test_collective_gaps_sit_where_the_runs_all_reduces_are():
    cfg = ModelConfig.preset("tiny")
    net = Qwen2ForCausalLM(cfg, TPCommunicator.virtual_group(2))
    net.tp.world = 1
    gaps = CollectiveGaps(net, 1e-4)
    ids = torch.randint(0, cfg.vocab_size // 2, (1, 16))
    net.loss(ids, ids).backward()
    # a run's all-reduces: the embedding and each block forward, each block and the LM head backward
    assert gaps.naps == 2 * (2 * cfg.num_layers + 1) and gaps.slept_s >= gaps.naps * 1e-4
    gaps.reset()
    assert (gaps.naps, gaps.slept_s) == (0, 0.0)
    gaps.remove()
    net.loss(ids, ids).backward()
    assert gaps.naps == 0


def test_collective_gaps_with_a_codec_run_it_on_the_tensors_the_run_sends(monkeypatch):
    cfg = ModelConfig.preset("tiny")
    net = Qwen2ForCausalLM(cfg, TPCommunicator.virtual_group(2))
    net.tp.world = 1
    gaps = CollectiveGaps(net, 1e-4, CommConfig.from_preset("fp4quant", compress="bwd"), world=2)
    sent = []
    real = ops.quantize_rows
    monkeypatch.setattr(ops, "quantize_rows",
                        lambda x, config, *args: sent.append((tuple(x.shape), config.rounding)) or real(x, config, *args))
    ids = torch.randint(0, cfg.vocab_size // 2, (1, 16))
    net.loss(ids, ids).backward()
    per_direction = 2 * cfg.num_layers + 1
    assert gaps.naps == 2 * per_direction and gaps.slept_s >= gaps.naps * 1e-4
    # forward is BF16 on the wire (no codec); backward each input gradient, (W, N / W) rows, stochastic
    assert gaps.codec_calls == {"fwd": 0, "bwd": per_direction}
    assert sent == [((2, 16 * cfg.hidden_size // 2), "stochastic")] * per_direction
    assert all(v > 0 for v in gaps.codec_s["bwd"].values()) and set(gaps.codec_s["fwd"].values()) == {0.0}
    assert gaps.codec_total_s == pytest.approx(sum(gaps.codec_s["bwd"].values()))
    gaps.reset()
    assert gaps.codec_calls == {"fwd": 0, "bwd": 0} and gaps.codec_total_s == 0.0
    with pytest.raises(ValueError, match="world of at least 2"):
        CollectiveGaps(net, 1e-4, CommConfig.from_preset("fp4quant"), world=1)


def test_in_step_codec_rates_are_the_mean_seconds_a_call_over_ranks_and_steps():
    def steps(q):  # one rank's two steps: 3 forward calls each, backward none
        return [{"fwd": {"quantize": q, "dequantize_reduce": 2 * q, "dequantize": 4 * q, "calls": 3},
                 "bwd": {"quantize": 0.0, "dequantize_reduce": 0.0, "dequantize": 0.0, "calls": 0}}] * 2
    rates = probe.in_step_codec_rates("fp4quant", [steps(3e-3), steps(6e-3)], 4096, 4)
    assert set(rates) == {"fp4quant"}  # no backward calls: no "fp4quant:sr"
    # 12 calls in 2 x 3 + 2 x 6 = 18 ms of quantize: 1.5 ms a call; the reduce counts the shard
    assert rates["fp4quant"] == pytest.approx({"quantize": 4096 / 1.5e-3, "dequantize_reduce": 1024 / 3e-3,
                                               "dequantize": 4096 / 6e-3})


def test_collective_codec_rates_split_the_decoding_as_the_gapped_steps_do():
    values, world = 1000, 2
    split = {"fp4quant": {"quantize": 1e9, "dequantize_reduce": 500 / 1e-6, "dequantize": 1000 / 3e-6}}
    steps = [{"fwd": {"quantize": 4e-6, "decode": 8e-6, "calls": 2}, "bwd": {"quantize": 0.0, "decode": 0.0, "calls": 0}}]
    rates = probe.collective_codec_rates("fp4quant", [steps, steps], values, world, split)
    assert set(rates) == {"fp4quant"}  # no backward calls: no stochastic rates
    # 4 us a call of decoding, split 1:3 as the gapped steps' 1 and 3 us a call
    assert rates["fp4quant"] == pytest.approx({"quantize": 1000 / 2e-6, "dequantize_reduce": 500 / 1e-6,
                                               "dequantize": 1000 / 3e-6})


def test_in_step_latency_is_the_least_rank_per_step_over_the_wire_steps():
    ranks = [[{"seconds": 4e-3, "wire_steps": 4}, {"seconds": 1e-3, "wire_steps": 4}],
             [{"seconds": 2e-3, "wire_steps": 4}, {"seconds": 3e-3, "wire_steps": 4}]]
    assert probe.in_step_latency(ranks) == pytest.approx((2e-3 + 1e-3) / 8)  # the later rank's time each step
    assert probe.in_step_latency_by_step(ranks) == pytest.approx([2e-3 / 4, 1e-3 / 4])
    assert probe.in_step_latency_by_step([[{"seconds": 1e-3, "wire_steps": 0}]]) == [None]
    assert probe.in_step_latency([[], []]) is None and probe.in_step_latency([]) is None
    with pytest.raises(ValueError, match="different numbers of steps"):
        probe.in_step_latency([ranks[0], ranks[1][:1]])
    with pytest.raises(ValueError, match="different numbers of steps"):
        probe.in_step_latency_by_step([ranks[0], ranks[1][:1]])


def test_in_step_transfers_need_peers():
    net = Qwen2ForCausalLM(ModelConfig.preset("tiny"), TPCommunicator.virtual_group(2))
    net.tp.world = 1
    with pytest.raises(ValueError, match="world of at least 2 and at least 2 bytes a rank, got world 1"):
        CollectiveGaps(net, 1e-4, world=1, latency_bytes=4096)


def test_in_step_collectives_need_peers_a_share_and_no_gaps():
    net = Qwen2ForCausalLM(ModelConfig.preset("tiny"), TPCommunicator.virtual_group(2))
    net.tp.world = 1
    with pytest.raises(ValueError, match="in-step collectives need a world of at least 2, got 1"):
        InStepCollectives(net, CommConfig.from_preset("fp4quant"), 1, 0.5)
    with pytest.raises(ValueError, match=r"fraction of the run's tensors must be in \(0, 1\], got 1.5"):
        InStepCollectives(net, CommConfig.from_preset("fp4quant"), 2, 1.5)
    with pytest.raises(ValueError, match="in-step collectives replace the gaps"):
        rank_step_seconds("tiny", 16, 1, 2, 1, collective_gap_s=1e-3, in_step_collectives=CommConfig.from_preset("bf16"))


def test_codec_rates_count_the_shard_for_the_reduce_as_the_model_does(monkeypatch):
    monkeypatch.setattr(probe, "codec_seconds", lambda values, world, config, repeats: {
        "quantize": 1e-3, "dequantize_reduce": 2e-3, "dequantize": 4e-3})
    rates = probe.codec_rates(4096, 4, ["fp4quant"], repeats=1)["fp4quant"]
    assert rates == pytest.approx({"quantize": 4096 / 1e-3, "dequantize_reduce": 1024 / 2e-3, "dequantize": 4096 / 4e-3})
    # the model's step gives back the seconds measured (values / W out of the reduce)
    machine = Machine(name="m", rank_flops=1e12, inter_bw=1e9, inter_latency=0.0, intra_bw=1e9, intra_latency=0.0,
                      ranks_per_node=1, codec_values_per_s={"fp4quant": rates})
    cfg = ModelConfig.preset("tiny")
    w = Workload(cfg, 4, 4096 // cfg.hidden_size, 1)
    s = step(w, machine, "fp4quant")
    n = 2 * w.messages_per_direction
    assert s.quantize_s == pytest.approx(n * 1e-3) and s.dequantize_s == pytest.approx(n * (2e-3 + 4e-3))
