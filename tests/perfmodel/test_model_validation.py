"""The part-by-part validation: measured components from a synthetic log, predictions from
a probe, the CSV's arithmetic, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from fp4quant.models import ModelConfig
from fp4quant.perfmodel import model_validation
from fp4quant.perfmodel.model import Workload, step

MODEL = ModelConfig.preset("tiny")
CODEC = {"fp4quant": {"quantize": 1e9, "dequantize_reduce": 2e9, "dequantize": 1.5e9},
         "fp4quant:sr": {"quantize": 5e8, "dequantize_reduce": 1e9, "dequantize": 1e9}}
# a probe as fp4quant.perfmodel.probe writes it: per comm, the gapped steps' compute, skew and
# scalar all-reduces (and, for a compressed comm, the codec inside its own all-reduces); the
# codec in loops; the link's all-reduces (the smallest's mean beside its median)
PROBE = {
    "rank_flops": 2e10, "world": 2, "exact_allreduce_s": 1e-4, "message_values": 65536, "skew_s": 0.003,
    "load_average_1min": 1.0,
    "compute_by_comm": {"bf16": {"rank_flops": 2e10, "skew_s": 0.003, "scalar_allreduce_s": 4e-4},
                        "fp4quant": {"rank_flops": 2e10, "skew_s": 0.003, "scalar_allreduce_s": 4e-4,
                                     "collective_codec_values_per_s": CODEC}},
    "codec_values_per_s": CODEC,
    "link": [{"size_bytes": s, "latency_s": 1e-3 + s / 5e6, "latency_mean_s": 1e-3 + s / 5e6}
             for s in (4096, 65536, 1 << 20, 2 << 20, 4 << 20)],
}


def step_record(i: int, scalar: float = 0.012) -> dict:
    """A step as the trainer logs it: the codec timers split, the collectives' seconds and their
    least over the ranks (here the slower rank's waits: 0.005 and 0.010 s), the scalar all-reduces."""
    r = {"step": i, "step_time_s": 0.100 + 0.002 * (i % 3), "scalar_comm_s": scalar}
    for d, (q, dq, c) in {"fwd": (0.001, 0.002, 0.020), "bwd": (0.0015, 0.0025, 0.030)}.items():
        r.update({f"{d}_codec_s": q + dq, f"{d}_quantize_s": q, f"{d}_dequantize_s": dq, f"{d}_comm_s": c,
                  f"{d}_comm_least_s": c - 0.005 * (d == "fwd") - 0.010 * (d == "bwd")})
    return r


def make_run(path, comm="fp4quant", steps=10, rate=60.0, emulated=True, scalar=0.012, batch_size=2):
    path.mkdir(parents=True)
    (path / "log.jsonl").write_text("".join(json.dumps(step_record(i, scalar)) + "\n" for i in range(steps)))
    (path / "summary.json").write_text(json.dumps({
        "model": MODEL.to_dict(), "mesh": {"tp": 2, "dp": 1},
        "provenance": {"config": {"comm": comm, "seq_len": 128, "batch_size": batch_size}}}))
    (path / "cluster.json").write_text(json.dumps({"link_rate_mbit": rate, "link_burst_bytes": 131072,
                                                   "emulated": emulated}))
    return path


def test_measured_components_are_the_trainers_timers_over_steady_steps(tmp_path):
    run = make_run(tmp_path / "run")
    (tmp_path / "probe.json").write_text(json.dumps(PROBE))
    rows, fits = model_validation.case_rows(tmp_path / "probe.json", [run], skip=0.2)
    got = {r["component"]: r for r in rows}
    assert set(got) == set(model_validation.COMPONENTS)
    steady = [step_record(i) for i in range(2, 10)]  # 20% of 10 steps, at least 2, dropped
    total = sum(r["step_time_s"] for r in steady) / len(steady)
    assert got["total"]["measured_s"] == pytest.approx(total)
    assert got["quantize"]["measured_s"] == pytest.approx(0.0025)
    assert got["dequantize"]["measured_s"] == pytest.approx(0.0045)
    assert got["codec"]["measured_s"] == pytest.approx(0.007)
    assert got["communication"]["measured_s"] == pytest.approx(0.035)  # the least over the ranks
    assert got["wait"]["measured_s"] == pytest.approx(0.050 - 0.035)  # the rest of the collectives' seconds
    assert got["scalar"]["measured_s"] == pytest.approx(0.012)
    assert got["compute"]["measured_s"] == pytest.approx(total - 0.007 - 0.050 - 0.012)  # what the timers leave
    parts = ("compute", "codec", "communication", "wait", "scalar")
    assert sum(got[c]["measured_s"] for c in parts) == pytest.approx(got["total"]["measured_s"])
    assert got["total"]["measured_sd_s"] == pytest.approx(pd.Series([r["step_time_s"] for r in steady]).std())
    # predictions: the model on the probe's machine, the burst from the run's record
    machine, fit = model_validation.machine_from_probe(PROBE, 131072, comm="fp4quant")
    s = step(Workload(MODEL, 2, 128, 2), machine, "fp4quant")
    assert got["codec"]["predicted_s"] == pytest.approx(s.codec_s)
    assert got["quantize"]["predicted_s"] + got["dequantize"]["predicted_s"] == pytest.approx(s.codec_s)
    assert got["compute"]["predicted_s"] == pytest.approx(s.compute_s)
    assert got["scalar"]["predicted_s"] == pytest.approx(5 * 4e-4)  # 5 scalar all-reduces at the probe's time
    assert got["communication"]["predicted_s"] == pytest.approx(s.exposed_comm_s)  # no skew inside
    assert got["wait"]["predicted_s"] == pytest.approx(0.003)  # the probe's skew
    assert got["total"]["predicted_s"] == pytest.approx(s.total_s)
    assert sum(got[c]["predicted_s"] for c in parts) == pytest.approx(s.total_s)
    assert s.total_s == pytest.approx(s.compute_s + s.scalar_s + s.skew_s + s.exposed_comm_s + s.codec_s)
    for r in rows:
        assert r["rel_error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert r["config"] == "fp4quant @ 60 Mbit/s"
    assert fit["fitted_bandwidth_Bps"] == pytest.approx(5e6, rel=1e-6)


def test_a_run_on_loopback_is_named_so(tmp_path):
    run = make_run(tmp_path / "run", emulated=False)  # the cluster fell back to loopback
    (tmp_path / "probe.json").write_text(json.dumps(PROBE))
    rows, fits = model_validation.case_rows(tmp_path / "probe.json", [run], skip=0.2)
    assert {r["config"] for r in rows} == {"fp4quant (loopback; 60 Mbit/s asked)"}
    assert fits["fp4quant (loopback; 60 Mbit/s asked)"]["emulated"] is False


def test_the_codec_in_the_model_splits_stochastic_backward_and_shards_the_reduce():
    machine, _ = model_validation.machine_from_probe(PROBE, 0, comm="fp4quant")
    s = step(Workload(MODEL, 2, 128, 2), machine, "fp4quant")
    n, values = 2 * MODEL.num_layers + 1, 128 * 2 * MODEL.hidden_size
    rne, sr = CODEC["fp4quant"], CODEC["fp4quant:sr"]
    assert s.quantize_s == pytest.approx(n * values * (1 / rne["quantize"] + 1 / sr["quantize"]))
    per = lambda r: values / 2 / r["dequantize_reduce"] + values / r["dequantize"]  # noqa: E731
    assert s.dequantize_s == pytest.approx(n * (per(rne) + per(sr)))
    bf16 = step(Workload(MODEL, 2, 128, 2), machine, "bf16")
    assert bf16.codec_s == 0 and bf16.scalar_s == pytest.approx(5 * 4e-4) and bf16.skew_s == 0.003


def test_main_writes_the_csv_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "probe.json").write_text(json.dumps(PROBE))
    runs = [make_run(tmp_path / c, comm=c, scalar=0.01) for c in ("bf16", "fp4quant")]
    out = tmp_path / "model_validation.csv"
    case = ["--case", str(tmp_path / "probe.json"), *map(str, runs)]
    assert model_validation.main([*case, *case, "--out", str(out)]) == 0  # the link twice: two repeats
    df = pd.read_csv(out)
    assert {"config", "component", "measured_s", "predicted_s", "rel_error"} <= set(df.columns)
    assert set(df[df.comm == "bf16"].component) == set(model_validation.COMPONENTS) and set(df.repeat) == {1, 2}
    fits = json.loads((tmp_path / "model_validation.csv.meta.json").read_text())["fits"]
    assert len(fits) == 2 and all(len(f) == 2 for f in fits.values())  # every repeat's fit kept
    capsys.readouterr()
    short = make_run(tmp_path / "short", steps=4)
    assert model_validation.main(["--case", str(tmp_path / "probe.json"), str(short), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fewer than 3 steady" in err[0]
    assert model_validation.main(["--case", str(tmp_path / "probe.json"), "--out", str(tmp_path / "x.csv")]) == 2
    with pytest.raises(ValueError, match="skip"):
        model_validation.steady([{}] * 10, 1.0)


def test_skew_is_the_slowest_ranks_excess_over_the_mean_step():
    from fp4quant.perfmodel.probe import skew_seconds

    assert skew_seconds([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]) == 0.0
    # steps: (1, 3) -> 1, (2, 2) -> 0, (4, 2) -> 1: mean 2/3
    assert skew_seconds([[1.0, 2.0, 4.0], [3.0, 2.0, 2.0]]) == pytest.approx(2 / 3)


def test_the_machine_takes_the_probes_compute_for_the_runs_comm_and_the_mean_latency():
    by_comm = {"bf16": PROBE["compute_by_comm"]["bf16"],
               "fp4quant": {"rank_flops": 3e10, "skew_s": 0.001, "scalar_allreduce_s": 2e-3}}
    link = [{"size_bytes": 4096, "latency_s": 1e-3, "latency_mean_s": 3e-3}] + PROBE["link"][1:]
    probe = {**PROBE, "compute_by_comm": by_comm, "link": link}
    fp4, _ = model_validation.machine_from_probe(probe, 131072, comm="fp4quant")
    assert (fp4.rank_flops, fp4.skew_s, fp4.scalar_allreduce_s) == (3e10, 0.001, 2e-3)
    bf16, _ = model_validation.machine_from_probe(probe, 131072, comm="bf16")
    assert (bf16.rank_flops, bf16.skew_s, bf16.scalar_allreduce_s) == (2e10, 0.003, 4e-4)
    # the smallest message rides on the burst: its mean over the probe's many is the latency
    assert fp4.inter_latency == pytest.approx(3e-3 / 2)
    median, _ = model_validation.machine_from_probe(PROBE, 131072, comm="fp4quant")  # mean = median
    assert median.inter_latency == pytest.approx((1e-3 + 4096 / 5e6) / 2)


def test_the_machine_takes_the_latency_the_in_step_transfers_met_under_its_comm():
    base = {"rank_flops": 3e10, "skew_s": 0.001, "scalar_allreduce_s": 2e-3}
    by_comm = {"bf16": {**base, "wire_step_latency_s": 7e-4}, "fp4quant": {**base, "wire_step_latency_s": 1.4e-3}}
    probe = {**PROBE, "compute_by_comm": by_comm}
    fp4, fit = model_validation.machine_from_probe(probe, 131072, comm="fp4quant")
    assert (fp4.inter_latency, fp4.intra_latency, fit["latency_source"]) == (1.4e-3, 1.4e-3, "in-step transfers")
    bf16, _ = model_validation.machine_from_probe(probe, 131072, comm="bf16")
    assert bf16.inter_latency == 7e-4
    _, fitted = model_validation.machine_from_probe(PROBE, 131072, comm="fp4quant")  # a probe without them: the link's fit
    assert fitted["latency_source"] == "link fit"


def test_the_latency_for_a_comm_is_the_one_the_model_was_given_at_that_share_of_the_messages():
    machine, _ = model_validation.machine_from_probe(PROBE, 30000)  # a 60 Mbit/s-like link: messages near the burst
    half = Workload(MODEL, 2, 128, 2, message_fraction=0.5)
    for latency in (2e-4, 1.3e-3, 4e-3):
        given = replace(machine, inter_latency=latency, intra_latency=latency)
        comm_s = step(half, given, "fp4quant").comm_s
        assert model_validation.latency_for_comm(half, machine, "fp4quant", comm_s) == pytest.approx(latency, rel=1e-9)
    bytes_only = step(half, replace(machine, inter_latency=0.0, intra_latency=0.0), "fp4quant").comm_s
    assert model_validation.latency_for_comm(half, machine, "fp4quant", 0.5 * bytes_only) == 0.0  # faster than the bytes
    with pytest.raises(ValueError, match="more than the model gives with 1 s a wire step"):
        model_validation.latency_for_comm(half, machine, "fp4quant", 1e6)
    with pytest.raises(ValueError, match=r"message_fraction must be in \(0, 1\], got 0"):
        Workload(MODEL, 2, 128, 2, message_fraction=0)


def test_the_machine_takes_the_latency_fitted_to_the_in_step_collectives_of_its_comm():
    run = Workload(MODEL, 2, 128, 2)
    base = {"rank_flops": 3e10, "skew_s": 0.001, "scalar_allreduce_s": 2e-3, "wire_step_latency_s": 7e-4}
    plain, _ = model_validation.machine_from_probe({**PROBE, "compute_by_comm": {"fp4quant": base}}, 30000, comm="fp4quant")
    truth = replace(plain, inter_latency=1.6e-3, intra_latency=1.6e-3)
    measured = step(replace(run, message_fraction=0.5), truth, "fp4quant").comm_s
    entry = {**base, "collective_fraction": 0.5, "collective_comm_s": measured, "collective_wire_steps": 36}
    probe = {**PROBE, "compute_by_comm": {"fp4quant": entry}}
    m, fit = model_validation.machine_from_probe(probe, 30000, comm="fp4quant", workload=run)
    assert m.inter_latency == m.intra_latency == pytest.approx(1.6e-3, rel=1e-9)
    assert fit["latency_source"] == "in-step collectives of 0.5 of each tensor"
    assert fit["fitted_latency_s"] == m.inter_latency and fit["in_step_transfer_latency_s"] == 7e-4
    # the run's full messages predicted with it, not the collectives' own time
    assert step(run, m, "fp4quant").comm_s == pytest.approx(step(run, truth, "fp4quant").comm_s)
    assert step(run, m, "fp4quant").comm_s > measured
    without, _ = model_validation.machine_from_probe(probe, 30000, comm="fp4quant")  # no workload: the in-step transfers'
    assert without.inter_latency == 7e-4


def test_the_machine_takes_the_codec_inside_the_runs_own_all_reduces_in_the_probes_steps():
    inside = {"fp4quant": {"quantize": 7e8, "dequantize_reduce": 9e8, "dequantize": 8e8},
              "fp4quant:sr": {"quantize": 3e8, "dequantize_reduce": 4e8, "dequantize": 6e8}}
    gapped = {k: {op: 2 * v for op, v in ops.items()} for k, ops in inside.items()}  # not the model's
    fp4 = {**PROBE["compute_by_comm"]["fp4quant"], "codec_values_per_s": gapped,
           "collective_codec_values_per_s": inside}
    probe = {**PROBE, "compute_by_comm": {**PROBE["compute_by_comm"], "fp4quant": fp4}}
    m, _ = model_validation.machine_from_probe(probe, 131072, comm="fp4quant")
    assert m.codec_values_per_s == inside
    bf16, _ = model_validation.machine_from_probe(probe, 131072, comm="bf16")  # none in BF16's steps: the loops', unused
    assert bf16.codec_values_per_s == PROBE["codec_values_per_s"]
    assert step(Workload(MODEL, 2, 128, 2), bf16, "bf16").codec_s == 0


def test_a_comm_the_probe_did_not_time_takes_bf16s_compute_and_an_empty_summary_keeps_its_columns():
    probe = {**PROBE, "compute_by_comm": {"bf16": {"rank_flops": 3e10, "skew_s": 0.001, "scalar_allreduce_s": 2e-3}}}
    m, _ = model_validation.machine_from_probe(probe, 131072, comm="nvfp4")
    assert (m.rank_flops, m.skew_s, m.scalar_allreduce_s) == (3e10, 0.001, 2e-3)
    empty = model_validation.summary(pd.DataFrame(columns=["config", "comm", "component", "measured_s", "measured_sd_s",
                                                   "predicted_s", "rel_error"]))
    assert empty.empty and {"config", "rel_error_min", "rel_error_max", "repeats"} <= set(empty.columns)


def test_bracketing_probes_average_the_per_step_inputs_and_keep_the_first_probes_link(tmp_path, capsys):
    def entry(flops, codec, latency, steps):
        return {"rank_flops": flops, "skew_s": latency, "scalar_allreduce_s": 2 * latency, "wire_step_latency_s": latency,
                "collective_gap_s": 0.01, "step_s": steps,
                "codec_values_per_s": {"fp4quant": {"quantize": codec, "dequantize_reduce": codec, "dequantize": codec}}}

    before = {**PROBE, "compute_by_comm": {"bf16": entry(2e10, 1e9, 1e-3, [[0.1], [0.1]]),
                                           "fp4quant": entry(3e10, 1e9, 2e-3, [[0.1], [0.2]])}}
    after = {"world": 2, "message_values": 65536, "gaps_from": "probe.json", "rank_flops": 4e10,
             "compute_by_comm": {"bf16": entry(4e10, 3e9, 3e-3, [[0.3], [0.3]]),
                                 "fp4quant": entry(6e10, 3e9, 4e-3, [[0.3], [0.4]])}}
    got = model_validation.bracketed([before, after], ["probe.json", "after.json"])
    fp4 = got["compute_by_comm"]["fp4quant"]
    # rates by their mean times (seconds a FLOP / a value averaged), seconds by their mean
    assert fp4["rank_flops"] == pytest.approx(4e10) and fp4["rank_flops_by_probe"] == [3e10, 6e10]
    assert fp4["codec_values_per_s"]["fp4quant"]["quantize"] == pytest.approx(1.5e9)
    assert (fp4["skew_s"], fp4["wire_step_latency_s"], fp4["scalar_allreduce_s"]) == pytest.approx((3e-3, 3e-3, 6e-3))
    assert fp4["step_s"] == [[0.1, 0.3], [0.2, 0.4]] and got["rank_flops"] == pytest.approx(1 / (0.5 / 2e10 + 0.5 / 4e10))
    assert got["link"] == PROBE["link"] and model_validation.bracketed([before], ["probe.json"]) is before
    m, _ = model_validation.machine_from_probe(got, 131072, comm="fp4quant")
    assert (m.rank_flops, m.inter_latency) == pytest.approx((4e10, 3e-3))
    with pytest.raises(ValueError, match="first probe must be a full probe"):
        model_validation.bracketed([after, after], ["after.json", "after.json"])
    with pytest.raises(ValueError, match="must be bracketing probes"):
        model_validation.bracketed([before, before], ["probe.json", "again.json"])
    with pytest.raises(ValueError, match="no steps timed under fp4quant"):
        model_validation.bracketed([before, {**after, "compute_by_comm": {"bf16": after["compute_by_comm"]["bf16"]}}],
                           ["probe.json", "after.json"])
    with pytest.raises(ValueError, match="4 ranks"):
        model_validation.bracketed([before, {**after, "world": 4}], ["probe.json", "after.json"])
    # on the command line: the case's JSONs are its probes, in order, then its runs
    (tmp_path / "probe.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(after))
    run = make_run(tmp_path / "fp4quant", scalar=0.01)
    out = tmp_path / "v.csv"
    assert model_validation.main(["--case", str(tmp_path / "probe.json"), str(tmp_path / "after.json"), str(run),
                          "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df.probe) == {f"{tmp_path / 'probe.json'} {tmp_path / 'after.json'}"}
    fits = json.loads((tmp_path / "v.csv.meta.json").read_text())["fits"]
    assert next(iter(fits.values()))[0]["rank_flops_by_probe"] == [3e10, 6e10]
    capsys.readouterr()
    assert model_validation.main(["--case", str(tmp_path / "probe.json"), str(run), str(tmp_path / "after.json"),
                          "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "probe JSONs, then at least one run directory" in err[0]


def test_captions_say_whether_the_predictions_were_bracketed():
    one = pd.DataFrame({"probe": ["a/probe.json", "b/probe.json"], "latency_run": [None, None]})
    two = pd.DataFrame({"probe": ["a/probe.json a/probe_after.json", "b/probe.json b/probe_after.json"],
                        "latency_run": [None, None]})
    assert model_validation.probes_said(one) == "a probe of the same links and ranks"
    assert "before and after the runs" in model_validation.probes_said(two)
    empty = pd.DataFrame({"probe": [], "latency_run": []})
    assert model_validation.probes_said(empty) == "a probe of the same links and ranks"
    latency = two.assign(latency_run=["a/latency/bf16", "b/latency/fp4quant"])
    assert "fewer tokens a step" in model_validation.probes_said(latency)
    assert "fewer tokens" not in model_validation.probes_said(latency.assign(latency_run=["a/latency/bf16", None]))


def test_a_latency_run_gives_the_latency_the_runs_are_predicted_with(tmp_path):
    # a link fast enough that latency is part of both comms' time
    probe = {**PROBE, "link": [{**r, "latency_s": 1e-3 + r["size_bytes"] / 5e7} for r in PROBE["link"]]}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    runs = [make_run(tmp_path / c, comm=c, scalar=0.01) for c in ("bf16", "fp4quant")]
    latency = [make_run(tmp_path / "latency" / c, comm=c, scalar=0.01, batch_size=1)
               for c in ("fp4quant", "bf16")]
    rows, fits = model_validation.case_rows(tmp_path / "probe.json", runs, skip=0.2, latency_runs=latency)
    half = Workload(MODEL, 2, 128, 1)
    measured = 0.020 - 0.005 + 0.030 - 0.010  # the synthetic log's least over the ranks, both directions
    for comm in ("bf16", "fp4quant"):
        plain, _ = model_validation.machine_from_probe(probe, 131072, comm=comm)
        fit = fits[f"{comm} @ 60 Mbit/s"]
        alpha = model_validation.latency_for_comm(half, plain, comm, measured)
        assert alpha > 0 and fit["fitted_latency_s"] == pytest.approx(alpha)
        assert fit["latency_run"] == str(tmp_path / "latency" / comm) and "128 tokens" in fit["latency_source"]
        fitted = replace(plain, inter_latency=alpha, intra_latency=alpha)
        assert step(half, fitted, comm).comm_s == pytest.approx(measured)  # the latency run, reproduced
        got = {r["component"]: r for r in rows if r["comm"] == comm}
        assert got["communication"]["predicted_s"] == pytest.approx(step(Workload(MODEL, 2, 128, 2), fitted,
                                                                         comm).exposed_comm_s)
    # without latency runs the probe's latency: another prediction
    plain_rows, _ = model_validation.case_rows(tmp_path / "probe.json", runs, skip=0.2)
    comm_of = lambda rs: [r["predicted_s"] for r in rs if r["component"] == "communication"]  # noqa: E731
    assert comm_of(plain_rows) != pytest.approx(comm_of(rows))


def test_latency_runs_that_would_echo_or_not_match_their_case_are_refused(tmp_path, capsys):
    (tmp_path / "probe.json").write_text(json.dumps(PROBE))
    run = make_run(tmp_path / "fp4quant")
    same = make_run(tmp_path / "same")  # the run's own tokens a step
    with pytest.raises(ValueError, match="echo"):
        model_validation.case_rows(tmp_path / "probe.json", [run], 0.2, [same])
    other_rate = make_run(tmp_path / "rate120", batch_size=1, rate=120.0)
    with pytest.raises(ValueError, match="120.0 Mbit/s link"):
        model_validation.case_rows(tmp_path / "probe.json", [run], 0.2, [other_rate])
    bf16 = make_run(tmp_path / "bf16", comm="bf16", batch_size=1)
    with pytest.raises(ValueError, match="none under fp4quant"):
        model_validation.case_rows(tmp_path / "probe.json", [run], 0.2, [bf16])
    half = make_run(tmp_path / "half", batch_size=1)
    again = make_run(tmp_path / "again", batch_size=1)
    with pytest.raises(ValueError, match="a second latency run under fp4quant"):
        model_validation.case_rows(tmp_path / "probe.json", [run], 0.2, [half, again])
    out = tmp_path / "v.csv"
    case = ["--case", str(tmp_path / "probe.json"), f"latency:{half}", str(run)]
    assert model_validation.main([*case, "--out", str(out)]) == 0
    fits = json.loads((tmp_path / "v.csv.meta.json").read_text())["fits"]
    assert fits["fp4quant @ 60 Mbit/s"][0]["latency_run"] == str(half)
    assert set(pd.read_csv(out).run) == {str(run)}  # the latency run is not validated
    capsys.readouterr()
    assert model_validation.main(["--case", str(tmp_path / "probe.json"), f"latency:{half}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least one run directory" in err[0]
