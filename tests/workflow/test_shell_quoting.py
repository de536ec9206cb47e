"""Values of a configuration reach the rules' shell commands as words, never as shell syntax."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]

# Each would run `touch INJECTED` if it were spliced into a command unquoted.
INPUTS = ["README.md; touch INJECTED; echo", "it's $(touch INJECTED) `touch INJECTED`.txt"]
TOKENIZER = "bytes && touch INJECTED"
GPU_KERNELS = "kernels.csv | touch INJECTED"
TEST_ARGS = "-q tests/format/test_config.py; touch INJECTED"  # pytest's words, as a shell splits them


def hostile_config(tmp_path: Path, **data) -> Path:
    config = yaml.safe_load((REPO / "workflow/config/ci.yaml").read_text())
    config["data"] = data
    config["cluster"]["gpu_kernels"] = GPU_KERNELS
    config["tests"]["args"] = TEST_ARGS
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def words(command: str) -> list[str]:
    """The words and operators a POSIX shell reads in ``command`` (an unquoted ; & | ( ) < > is
    an operator of its own, a quoted one part of its word)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError as exc:  # e.g. a quote of a value left open: it was not quoted
        pytest.fail(f"{exc}: {command}")


def test_every_shell_command_quotes_the_configuration(tmp_path):
    config = hostile_config(tmp_path, inputs=INPUTS, tokenizer=TOKENIZER)
    r = subprocess.run([*SNAKEMAKE, "all", "-n", "-p", "--cores", "2", "--configfile", str(config)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    commands = [line.removeprefix("Shell command: ") for line in r.stdout.splitlines()
                if line.startswith("Shell command: ")]
    assert len(commands) > 20  # every rule of the CI configuration's DAG
    hostile = {*INPUTS, TOKENIZER, GPU_KERNELS, "INJECTED"}  # each value one word ("INJECTED": pytest's last)
    seen = set()
    for command in commands:
        found = words(command)
        assert ";" not in found, command  # the workflow's commands chain with && only
        injected = {w for w in found if "INJECTED" in w}
        assert injected <= hostile, command
        seen |= injected
    assert seen == hostile
    (tests,) = [words(c) for c in commands if " -m pytest " in c]
    start = tests.index("pytest") + 1
    assert tests[start:start + 4] == shlex.split(TEST_ARGS)  # the words pytest gets, ";" among them


def test_a_hostile_input_file_is_read_not_run(tmp_path):
    """prepare_data run for real: the input named "README.md; touch INJECTED; echo" is tokenized
    (unquoted, README.md would be, and then `touch INJECTED` would run)."""
    text = (REPO / "README.md").read_text()
    (tmp_path / "README.md").write_text(text)
    (tmp_path / INPUTS[0]).write_text(text)
    config = hostile_config(tmp_path, inputs=[INPUTS[0]])
    r = subprocess.run([*SNAKEMAKE, "data/ci/tokens/meta.json", "--cores", "1", "--configfile", str(config)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "data/ci/tokens/meta.json").exists()
    assert not (tmp_path / "INJECTED").exists()


def test_nodelist_launch_quotes_what_the_remote_shell_reads(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("launch", REPO / "workflow/scripts/launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    cwd = tmp_path / "runs; touch INJECTED"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    a = argparse.Namespace(kind="nodelist", nodes=["n1", "n2"], nproc_per_node=2, nnodes=2, port=29500)
    job = ["-m", "fp4quant.train", "--model", "tiny; touch INJECTED"]
    for rank, cmd in enumerate(launch.commands(a, job)):
        assert cmd[:3] == ["ssh", "--", f"n{rank + 1}"]  # a host, never an option of ssh
        remote = shlex.split(cmd[3])
        assert remote[:3] == ["cd", str(cwd), "&&"] and remote[-len(job):] == job
