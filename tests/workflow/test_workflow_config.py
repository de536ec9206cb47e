"""The workflow's configuration: every mistake is one line naming the key, before any rule runs."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fp4quant.format import PRESETS

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
CI = yaml.safe_load((REPO / "workflow/config/ci.yaml").read_text())


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "workflow/scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


config_check = _load("config_check")


def with_change(change) -> dict:
    config = copy.deepcopy(CI)
    change(config)
    return config


def error_of(config) -> str:
    with pytest.raises(config_check.ConfigError) as info:
        config_check.check(config, SCHEMA)
    return str(info.value)


def test_the_shipped_configurations_pass():
    default = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())

    def overlay(base, over):  # as Snakemake merges a --configfile over the Snakefile's default.yaml
        return {k: overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                for k, v in {**base, **over}.items()}

    for name in ("default", "ci", "h100", "loopback", "compute", "study"):
        config_check.check(overlay(default, yaml.safe_load((REPO / f"workflow/config/{name}.yaml").read_text())), SCHEMA)


@pytest.mark.parametrize("change, message", [
    (lambda c: c["train"].update(stpes=c["train"].pop("steps")), "train.stpes is not a known key (did you mean steps?)"),
    (lambda c: c.update(trian=c.pop("train")), "trian is not a known key (did you mean train?)"),
    (lambda c: c["train"].pop("seeds"), "train.seeds is missing (required)"),
    (lambda c: c["train"].update(tp="zero"), "train.tp must be an integer, got 'zero'"),
    (lambda c: c["train"].update(tp=0), "train.tp must be >= 1, got 0"),
    (lambda c: c["train"].update(lr=0), "train.lr must be > 0, got 0"),
    (lambda c: c["launcher"].update(kind="slurm"), "launcher.kind must be one of torchrun, srun, nodelist, got 'slurm'"),
    (lambda c: c["train"].update(comms=[]), "train.comms must list at least 1 item, got []"),
    (lambda c: c["train"].update(comms=["bf16", "fp4quantt"]),
     "train.comms[1]: 'fp4quantt' is not a TP communication preset (did you mean fp4quant?)"),
    (lambda c: c["train"].update(comms=["bf16", "fp4quant@fwdd"]),
     "train.comms[1]: 'fp4quant@fwdd': @fwdd must name a direction: @none, @fwd, @bwd, @both"),
    (lambda c: c["train"].update(comms=["bf16@fwd"]), "train.comms[0]: 'bf16@fwd': @fwd changes nothing for bf16"),
    (lambda c: c["train"].update(comms=["fp4quant+quartet"]),
     "train.comms[0]: 'fp4quant+quartet': the compute is train.computes, not part of a comm"),
    (lambda c: c.update(study={"batches": [["bf16"], ["fp4quant@bwd"]]}),
     "study.batches[1][0]: 'fp4quant@bwd' is not in train.comms"),
    (lambda c: c.update(study={"batches": [["bf16", "fp4quant"], ["fp4quant"]]}),
     "study.batches[1][0]: 'fp4quant' is already in study.batches[0][1]"),
    (lambda c: c.update(study={"batches": []}), "study.batches must list at least 1 item, got []"),
    (lambda c: c["bench"].update(collective_presets=["bf16"]),
     "bench.collective_presets[0]: the collective benchmark does not measure 'bf16'"),
    (lambda c: c["cluster"].update(nodes=4),
     "cluster.nodes: 4 does not divide train.tp: 2 (each emulated node runs tp / nodes ranks of the TP group)"),
    (lambda c: (c["cluster"].update(enabled=False), c["train"].update(tp=4)),
     "train.tp: 4 does not divide the launcher's 2 ranks (1 node(s) x launcher.nproc_per_node 2)"),
    (lambda c: c["cluster"].pop("throughput"), "cluster.throughput is missing (required where cluster.enabled is true"),
    (lambda c: c["cluster"]["throughput"].pop("warmup_steps"), "cluster.throughput.warmup_steps is missing (required)"),
    (lambda c: c["cluster"]["throughput"].update(warmup_steps=2),
     "cluster.throughput.warmup_steps: 2 leaves none of the 2 steps to measure"),
    (lambda c: c["cluster"]["throughput"].update(comms=["bf61"]),
     "cluster.throughput.comms[0]: 'bf61' is not a TP communication preset (did you mean bf16?)"),
    (lambda c: c["cluster"].update(validation={"comms": ["fp4quant", "bf16; touch INJECTED"]}),
     "cluster.validation.comms[1]: 'bf16; touch INJECTED' is not a TP communication preset"),
    # a model names the run folders: a preset or a folder's path, nothing a shell would read
    (lambda c: c["train"].update(model="tiny; touch INJECTED2"), "train.model must match "),
    (lambda c: c["train"].update(model="-tiny"), "train.model must match "),
    (lambda c: c["bench"].update(traffic_model="$(touch INJECTED)"), "bench.traffic_model must match "),
    (lambda c: c["launcher"].update(kind="nodelist", nodes=["-oProxyCommand=touch INJECTED"]),
     "launcher.nodes[0] must match "),
    (lambda c: c["tests"].update(args="-k 'not slow"), "tests.args: No closing quotation in \"-k 'not slow\""),
])
def test_a_mistake_is_one_line_naming_the_key(change, message):
    assert error_of(with_change(change)).startswith(message)


def test_communication_presets_come_from_the_code():
    for comm in (*PRESETS, "exact"):
        config_check.check(with_change(lambda c, comm=comm: c["train"].update(comms=[comm])), SCHEMA)
    assert set(config_check.TRAIN_COMMS) == {*PRESETS, "exact"}


@pytest.mark.parametrize("edit, message", [
    (("  steps: 4", "  stpes: 4"), "config error: train.stpes is not a known key (did you mean steps?)"),
    (("comms: [bf16, fp4quant]", "comms: [bf16, fp4quantt]"),
     "config error: train.comms[1]: 'fp4quantt' is not a TP communication preset (did you mean fp4quant?)"),
    (("  nodes: 2", "  nodes: 4"), "config error: cluster.nodes: 4 does not divide train.tp: 2"),
])
def test_snakemake_reports_a_bad_configuration_in_one_line(edit, message, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (REPO / "workflow/config/ci.yaml").read_text()
    assert edit[0] in text
    bad.write_text(text.replace(*edit))
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-n", "--cores", "1",
                        "--configfile", str(bad)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "is extended by additional config" not in line]
    assert len(lines) == 1 and lines[0].startswith(message), r.stdout + r.stderr


def test_training_defaults_and_choices_are_stated_once():
    """The schema states no default of a training option (the trainer's TrainConfig does) and
    takes its choices from the package; the workflow passes only what a configuration sets."""
    import dataclasses
    import re

    from fp4quant.comm import ALGORITHMS
    from fp4quant.parallel.communicator import COMPRESS_CHOICES
    from fp4quant.train import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train = SCHEMA["properties"]["train"]["properties"]
    stated = [k for k, v in train.items() if k in fields and "default" in v]
    assert not stated, f"defaults of TrainConfig restated in the schema: {stated}"
    assert train["algorithm"]["enum"] == list(ALGORITHMS)
    assert train["compress"]["enum"] == list(COMPRESS_CHOICES)
    smk = (REPO / "workflow/rules/train.smk").read_text()
    options = re.search(r"TRAIN_OPTIONS = \(([^)]*)\)", smk).group(1)
    assert set(re.findall(r'"(\w+)"', options)) <= fields
    body = smk[smk.index("def train_args"):smk.index("rule train:")]
    assert not re.search(r"""\.get\(['"]\w+['"], """, body), "a default restated in train_args"
    for name in ("default", "ci", "h100", "loopback", "compute", "study"):
        section = yaml.safe_load((REPO / f"workflow/config/{name}.yaml").read_text()).get("train", {})
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        # h100 states its own choices; the CPU default states only what differs from the trainer
        if name == "default":
            required = set(SCHEMA["properties"]["train"]["required"])  # stated by every configuration
            same = [k for k, v in section.items() if k in defaults and k not in required and defaults[k] == v]
            assert not same, f"default.yaml restates TrainConfig defaults: {same}"


def test_the_study_trains_each_batch_with_its_directions(tmp_path):
    """workflow/config/study.yaml: study_batch<i> trains batch i's comms on every seed, a comm
    "<preset>@fwd" with --compress fwd; `study` needs every run (a dry run: nothing trains)."""
    import re

    def dry_run(target):
        r = subprocess.run([sys.executable, "-m", "snakemake", target, "--snakefile", str(REPO / "Snakefile"), "-n",
                            "-p", "--cores", "1", "--configfile", str(REPO / "workflow/config/study.yaml")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})  # this checkout's package
        assert r.returncode == 0, r.stdout + r.stderr
        printed.append(r.stdout)
        return re.findall(r"-m fp4quant\.train (.*?) --out (\S+)", r.stdout)

    printed = []
    study = yaml.safe_load((REPO / "workflow/config/study.yaml").read_text())
    seeds = study["train"]["seeds"]
    assert len(seeds) >= 3 and study["cluster"]["enabled"] is False
    batches = study["study"]["batches"]
    assert [c for b in batches for c in b] == study["train"]["comms"]  # every comm in one batch, in order
    second = dry_run("study_batch2")
    assert sorted(out for _, out in second) == sorted(f"data/study/runs/small/{c}/seed{s}" for c in batches[1]
                                                      for s in seeds)
    for args, out in second:
        name = out.split("/")[-2]
        assert f"--comm {name.split('@')[0]} " in args
        assert ("--compress " + name.split("@")[1]) in args if "@" in name else "--compress" not in args
    everything = dry_run("study")
    assert len([out for _, out in everything if "/runs/" in out]) == len(study["train"]["comms"]) * len(seeds)
    # the trade-off's SQNR: the traffic of a BF16 run of the study's model and length
    (capture,) = [args for args, out in everything if out == "data/study/traffic/small"]
    assert "--model small " in capture and "--comm bf16 --steps 400 " in capture
    assert "--capture-traffic-steps 1,200,399 " in capture


def test_the_tp_study_trains_every_degree_on_simulated_ranks(tmp_path):
    """workflow/config/study_tp.yaml: its margin and TP degrees are stated; study_tp_batch1 trains
    bf16 and fp4quant at TP = 16 on every seed with --simulate-tp, the BF16 run of the first seed
    saving its traffic; the controls' batch runs exact at TP 2 and 1 and BF16's rounding alone at
    TP 1 (--rounding-alone, no --simulate-tp); `study_tp` needs all of them, or with the
    study_tp_batch1.yaml overlay batch 1's alone, its SQNR from TP = 16's traffic, and with
    study_tp_batch2.yaml batches 1-2, its SQNR from every degree's traffic: each degree's measured
    by the batch that captures it, then joined; with study_tp_batches124.yaml batches 1, 2 and 4,
    and a batch the study lacks refused (dry runs)."""
    import re

    config = REPO / "workflow/config/study_tp.yaml"

    def dry_run(target, *overlays):
        r = subprocess.run([sys.executable, "-m", "snakemake", target, "--snakefile", str(REPO / "Snakefile"), "-n",
                            "-p", "--cores", "1", "--configfile", str(config), *overlays],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stdout + r.stderr
        # the runs are keyed on the training code, not the commit (provenance: training_code)
        keys = re.findall(r'fresh_run\.py \S+ \'\{"provenance": "([^"]*)"', r.stdout)
        assert keys and all(k.startswith("training code ") for k in keys), keys
        # and on the tokens alone: a rerun of the data or build rule (a new machine, an edited rule)
        # rewrites meta.json and info.json, which must not empty the study's runs
        hashed = re.findall(r"fresh_run\.py \S+ '\{.*?\}' (\S+)", r.stdout)
        assert hashed and set(hashed) == {"data/study_tp/tokens/tokens.bin"}, hashed
        printed.append(r.stdout)
        return re.findall(r"-m fp4quant\.train (.*?) --out (\S+)", r.stdout)

    printed = []
    study = yaml.safe_load(config.read_text())
    tp = study["study_tp"]
    assert tp["margin"] == 0.05 and tp["tps"] == [16, 8, 4, 2] and len(study["train"]["seeds"]) >= 5
    first = dry_run("study_tp_batch1")
    assert sorted(out for _, out in first) == sorted(f"data/study_tp/tp_runs/small-mha/tp16/{c}/seed{s}"
                                                     for c in ("bf16", "fp4quant") for s in range(5))
    for args, out in first:
        assert "--tp 16 " in args and "--simulate-tp" in args
        assert ("--capture-traffic-steps 1,200,399" in args) == out.endswith("tp16/bf16/seed0")
    controls = {out.split("small-mha/")[1]: args for args, out in dry_run("study_tp_batch4")}
    assert len(controls) == 15
    assert "--comm bf16 " in controls["tp1/bf16-alone/seed3"] and "--rounding-alone" in controls["tp1/bf16-alone/seed3"]
    assert "--simulate-tp" not in controls["tp1/exact/seed0"] and "--simulate-tp" in controls["tp2/exact/seed0"]
    assert len([o for _, o in dry_run("study_tp") if "/tp_runs/" in o]) == 4 * (5 + 5 + 3 + 3) + 15
    headline = dry_run("study_tp", str(REPO / "workflow/config/study_tp_batch1.yaml"))
    assert sorted(out for _, out in headline) == sorted(out for _, out in first)
    tp16_traffic = "data/study_tp/tp_runs/small-mha/tp16/bf16/seed0/traffic"
    # a batch measures the SQNR of the degrees whose traffic it captures (the traffic is not kept)
    assert re.findall(r"--captures (.*?) --presets", printed[0]) == [tp16_traffic], printed[0]
    assert re.findall(r"--captures (.*?) --presets", printed[-1]) == [tp16_traffic], printed[-1]
    assert re.findall(r"--parts (.*?) --out", printed[-1]) == ["data/study_tp/bench/reduced_error_tp16.csv"]
    # study_tp_batch2.yaml: bf16 and fp4quant at every degree, the SQNR from every degree's traffic
    both = dry_run("study_tp", str(REPO / "workflow/config/study_tp_batch2.yaml"))
    assert sorted(out for _, out in both) == sorted(f"data/study_tp/tp_runs/small-mha/tp{t}/{c}/seed{s}"
                                                    for t in (16, 8, 4, 2) for c in ("bf16", "fp4quant")
                                                    for s in range(5))
    captures = re.findall(r"--captures (.*?) --presets", printed[-1])
    assert sorted(captures) == sorted(f"data/study_tp/tp_runs/small-mha/tp{t}/bf16/seed0/traffic"
                                      for t in (16, 8, 4, 2)), captures
    (parts,) = re.findall(r"--parts (.*?) --out", printed[-1])
    assert sorted(parts.split()) == sorted(f"data/study_tp/bench/reduced_error_tp{t}.csv" for t in (16, 8, 4, 2))
    # study_tp_batches124.yaml: the complete batches 1, 2 and 4 (the controls), not batch 3's NVFP4 and FP8
    complete = dry_run("study_tp", str(REPO / "workflow/config/study_tp_batches124.yaml"))
    assert sorted(out for _, out in complete) == sorted([out for _, out in both]
                                                        + [f"data/study_tp/tp_runs/small-mha/{c}" for c in controls])
    # a batch the study does not have is refused in one line, before anything runs
    unknown = tmp_path / "unknown_batch.yaml"
    unknown.write_text("study_tp:\n  results_batches: [2, 5]\n")
    r = subprocess.run([sys.executable, "-m", "snakemake", "study_tp", "--snakefile", str(REPO / "Snakefile"), "-n",
                        "--cores", "1", "--configfile", str(config), str(unknown)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode != 0
    assert "config error: study_tp.results_batches names batch 5, but the study has batches 1 .. 4" in r.stderr, r.stderr


def test_a_study_keyed_on_the_training_code_refuses_a_tree_git_cannot_read(tmp_path):
    """Outside git every tree's digest would be "unknown": one key for any code, so it is refused."""
    env = {k: v for k, v in os.environ.items() if k != "FP4QUANT_CODE"}
    r = subprocess.run([sys.executable, "-m", "snakemake", "study_tp_batch1", "--snakefile", str(REPO / "Snakefile"),
                        "-n", "--cores", "1", "--configfile", str(REPO / "workflow/config/study_tp.yaml")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(REPO), "GIT_DIR": str(tmp_path / "no-git")})
    assert r.returncode != 0
    assert "config error: provenance: training_code keys the runs on the training code's digest" in r.stderr, r.stderr
