"""A run's history survives reruns: the log restored from checkpoints, checkpoints verified
against their manifests, and a run folder never resumed by another configuration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distributed import run_ranks
from fp4quant.train import TrainConfig, loop
from fp4quant.train.consistency import resume_differences
from fp4quant.train.__main__ import main
from train.launch import cli, flags

STEPS = 8  # checkpoints at steps 6 and 8 (every 3, the last two kept, and the final step)


def run_kw(data, out, **kw):
    return {**dict(out=str(out), data=data, model="tiny", steps=STEPS, seq_len=32, batch_size=1, checkpoint_every=3,
                   eval_batches=1), **kw}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def same_history(got: list[dict], want: list[dict]) -> None:
    """Every step once, in order, with the uninterrupted run's values (step times aside)."""
    assert [r["step"] for r in got] == list(range(STEPS))
    for a, b in zip(got, want):
        assert (a["loss"], a["lr"], a["grad_norm"]) == (b["loss"], b["lr"], b["grad_norm"]), a["step"]


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    """A finished run, trained once per module."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(flags(**run_kw(data, out))) == 0
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run to damage, and its uninterrupted log and summary."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out, records(finished), json.loads((finished / "summary.json").read_text())


def snakemake_cleanup(out: Path) -> None:
    """What Snakemake does to an interrupted job: delete its declared outputs, not checkpoints/."""
    (out / "log.jsonl").unlink()
    (out / "summary.json").unlink()


def test_rerun_after_interruption_restores_the_whole_log(run, data, capsys):
    out, want, _ = run
    shutil.rmtree(out / "checkpoints" / "step_000008")  # interrupted after the checkpoint of step 6
    (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in want[:7]))
    snakemake_cleanup(out)
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    same_history(records(out), want)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == 6 and summary["steps"] == STEPS


def test_a_run_resumed_under_other_code_keeps_its_start_and_names_each_part(run, data, capsys, monkeypatch):
    """The summary's provenance is the run's start; a resume under another commit or training
    code adds a part (segments), which a study's analysis checks against its training code."""
    out, want, want_summary = run
    shutil.rmtree(out / "checkpoints" / "step_000008")
    snakemake_cleanup(out)
    started = want_summary["provenance"]
    assert want_summary["segments"] == [{"from_step": 0, "provenance": {k: v for k, v in started.items() if k != "config"}}]
    real = loop.provenance
    monkeypatch.setattr(loop, "provenance", lambda *a, **kw: {**real(*a, **kw), "commit": "f" * 40, "code": "0" * 16})
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["commit"] == started["commit"] and summary["provenance"]["time"] == started["time"]
    assert [s["from_step"] for s in summary["segments"]] == [0, 6]
    assert summary["segments"][1]["provenance"]["code"] == "0" * 16
    same_history(records(out), want)


def test_rerun_when_the_last_checkpoint_is_the_final_step(run, data, capsys):
    out, want, want_summary = run
    snakemake_cleanup(out)
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    same_history(records(out), want)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_loss"] == want_summary["final_loss"] is not None
    assert summary["tokens_per_s"] == want_summary["tokens_per_s"] is not None
    assert summary["val_loss"] == want_summary["val_loss"]


def test_a_torn_last_log_line_is_tolerated(run, data, capsys):
    out, want, _ = run
    shutil.rmtree(out / "checkpoints" / "step_000008")
    with (out / "log.jsonl").open("a") as f:
        f.write('{"step": 8, "loss": 4.1')  # the disk filled up mid-line
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    same_history(records(out), want)


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damage_zero(path: Path) -> None:
    path.write_bytes(b"\0" * path.stat().st_size)


@pytest.mark.parametrize("damage", [damage_truncate, damage_zero], ids=["truncated", "zeroed"])
@pytest.mark.parametrize("name", ["rank0000.pt", "manifest.json", "log.jsonl"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(run, data, capsys, damage, name):
    out, want, _ = run
    damage(out / "checkpoints" / "step_000008" / name)
    snakemake_cleanup(out)
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    assert err.count("warning") == 1 and "step 8" in err and "resuming from step 6" in err, err
    same_history(records(out), want)
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == 6
    assert (out / "checkpoints" / "step_000008.damaged" / name).exists()  # set aside, not deleted


@pytest.mark.parametrize("edit, problem", [(lambda m: [m], "a JSON list"),
                                            (lambda m: {k: v for k, v in m.items() if k != "schedule"}, "schedule"),
                                            (lambda m: {**m, "files": {"rank0000.pt": 7}}, "files")])
def test_a_malformed_manifest_is_passed_over_with_one_warning(run, data, capsys, edit, problem):
    out, want, _ = run
    path = out / "checkpoints" / "step_000008" / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    snakemake_cleanup(out)
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    assert err.count("warning") == 1 and "malformed" in err and problem in err and "resuming from step 6" in err, err
    same_history(records(out), want)


def test_a_garbage_latest_pointer_is_passed_over(run, data, capsys):
    out, want, _ = run
    (out / "checkpoints" / "latest").write_bytes(b"\x00garbage\xff")
    snakemake_cleanup(out)
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 0, err
    assert err.count("warning") == 1 and "latest is unreadable" in err and "resuming from step 8" in err, err
    same_history(records(out), want)


def test_no_intact_checkpoint_is_one_error(run, data, capsys):
    out, _, _ = run
    for step in (6, 8):
        damage_truncate(out / "checkpoints" / f"step_{step:06d}" / "rank0000.pt")
    status, err = cli(capsys, **run_kw(data, out))
    assert status == 2
    assert len(err.splitlines()) == 1 and "no intact checkpoint" in err and "step 8" in err and "step 6" in err, err


class _RunsCode:
    """What a crafted shard would carry: unpickling it calls a function of the attacker's choice."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused(run, data, capsys, tmp_path):
    """A shard whose pickle calls a function (the manifest's digest rewritten to match) is
    refused in one line, on resume nothing of it runs, and it is not passed over silently."""
    import hashlib
    import io

    import torch

    out, _, _ = run
    marker = tmp_path / "code-ran"
    folder = out / "checkpoints" / "step_000008"
    state = torch.load(folder / "rank0000.pt", weights_only=True)
    state["config"] = {**state["config"], "payload": _RunsCode(marker)}
    buf = io.BytesIO()
    torch.save(state, buf)
    (folder / "rank0000.pt").write_bytes(buf.getvalue())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["rank0000.pt"] = {"bytes": len(buf.getvalue()), "sha256": hashlib.sha256(buf.getvalue()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    status, err = cli(capsys, **run_kw(data, out))
    assert not marker.exists()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "step 8" in err and "rank0000.pt" in err and "could run code" in err, err
    assert folder.exists()  # kept where it was, for whoever investigates


def test_a_run_of_another_configuration_is_refused(run, data, capsys):
    out, want, _ = run
    status, err = cli(capsys, **run_kw(data, out, comm="fp4quant", lr=0.1, steps=12))
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "another configuration" in err and "comm: 'bf16'" in err and "lr: 0.003" in err and "warmup" in err
    status, err = cli(capsys, **run_kw(data, out, steps=4, batch_size=2))
    assert status == 2 and "batch_size: 1" in err and "steps: 8 in the checkpoint, 4 now" in err, err
    assert records(out) == want  # nothing trained, nothing rewritten


def test_a_run_can_be_extended_and_bookkeeping_may_change(run, data, capsys):
    out, want, _ = run
    status, err = cli(capsys, **run_kw(data, out, steps=10, warmup=0, eval_batches=2, keep_checkpoints=1,
                                       checkpoint_every=5))
    assert status == 0, err
    got = records(out)
    assert [r["step"] for r in got] == list(range(10)) and got[:STEPS] == want
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lr_schedule"] == [{"from_step": 0, "steps": 8}, {"from_step": 8, "steps": 10}]
    assert summary["resumed_from"] == 8


def test_resume_rule():
    stored = TrainConfig(out="a", steps=100).to_dict()
    assert resume_differences(stored, TrainConfig(out="b", steps=100, eval_batches=0, checkpoint_every=7)) == []
    assert resume_differences(stored, TrainConfig(out="a", steps=200, warmup=10)) == []
    (warmup,) = resume_differences(stored, TrainConfig(out="a", steps=200))
    assert warmup.startswith("warmup: 10 in the checkpoint, 20 now") and "--warmup 10" in warmup
    assert [p.split(":")[0] for p in resume_differences(stored, TrainConfig(out="a", steps=50, warmup=10, seed=1))] \
        == ["seed", "steps"]


@pytest.mark.slow
def test_ranks_fall_back_together_when_one_shard_is_damaged(data, tmp_path):
    kw = run_kw(data, tmp_path / "tp2", tp=2, steps=4, checkpoint_every=2)
    want = run_ranks("train.rank_jobs:train", 2, kw, timeout=120)[0]["losses"]
    damage_zero(tmp_path / "tp2" / "checkpoints" / "step_000004" / "rank0001.pt")  # only rank 1 sees the damage
    snakemake_cleanup(tmp_path / "tp2")
    results = run_ranks("train.rank_jobs:train", 2, kw, timeout=120)
    assert [r["summary"]["resumed_from"] for r in results] == [2, 2]
    assert results[0]["losses"] == want
