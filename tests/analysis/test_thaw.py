"""thaw puts a partially frozen study back under data/ as the workflow wrote it -- the runs its
results name, the carried runs of the other batches, the raw logs -- and refuses, in one line and
before writing anything, what the workflow would retrain or what would overwrite a file."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from fp4quant.analysis import thaw as thaw_module
from fp4quant.analysis.__main__ import main as analysis_main

from test_study import PROV
from test_study_tp import CODE, build_results, freeze_study, tp_run

TOKENS = b"\x01\x02\x03" * 100


@pytest.fixture
def frozen(tmp_path, capsys):
    """A TP study frozen with --partial: TP 16 named by its results, TP 2 bf16 seed 0 finished (carried),
    TP 8 bf16 seed 0 unfinished (left); the source folder and the reference folder."""
    src = tmp_path / "data" / "study_tp"
    (src / "tokens").mkdir(parents=True)
    (src / "tokens" / "tokens.bin").write_bytes(TOKENS)
    runs = [tp_run(src / "tp_runs", 16, c, s, [2.0 + 0.01 * s, 2.1, 2.05]) for c in ("bf16", "fp4quant") for s in (0, 1)]
    later = tp_run(src / "tp_runs", 2, "bf16", 0, [2.0, 2.1, 2.05])
    for run in [*runs, later]:
        summary = json.loads((run / "summary.json").read_text())
        summary["data_sha256"] = hashlib.sha256(TOKENS).hexdigest()
        (run / "summary.json").write_text(json.dumps(summary))
    unfinished = src / "tp_runs" / "tp8" / "bf16" / "seed0"
    unfinished.mkdir(parents=True)
    (unfinished / "log.jsonl").write_text(json.dumps({"step": 0, "loss": 2.3}) + "\n")
    build_results(src, runs)
    (src / "build").mkdir()  # the workflow's record of the extension this machine built
    (src / "build" / "info.json").write_text("{}")
    # the SQNR of TP 16 measured on its BF16 run's capture, and the degrees joined
    (src / "bench").mkdir()
    capture = "data/study_tp/tp_runs/tp16/bf16/seed0/traffic"
    for name, meta in (("reduced_error_tp16.csv", {"captures": [capture]}),
                       ("reduced_error.csv", {"captures": [capture], "parts": ["reduced_error_tp16.csv"]})):
        pd.DataFrame([{"tp": 16, "sqnr_db": 13.5, **PROV}]).to_csv(src / "bench" / name, index=False)
        (src / "bench" / f"{name}.meta.json").write_text(json.dumps({**meta, "torch": PROV["torch"]}))
    rc, err = freeze_study(tmp_path, capsys, "ref", "--partial")
    assert rc == 0, err
    return src, tmp_path / "ref", [*runs, later], unfinished


def test_the_freeze_leaves_this_machine_s_build_behind(frozen):
    """The extension's build record is this machine's and git ignores it: a frozen folder holding it
    would differ from its clone, and a second freeze into the folder would find it there."""
    src, ref, _, _ = frozen
    assert (src / "build" / "info.json").exists() and not (ref / "data" / "study_tp" / "build").exists()


def prepared(data):
    """A data folder where the workflow prepared the study's tokens and built the extension."""
    prof = data / "study_tp"
    (prof / "tokens").mkdir(parents=True)
    (prof / "tokens" / "tokens.bin").write_bytes(TOKENS)
    (prof / "tokens" / "meta.json").write_text("{}")
    (prof / "build").mkdir()
    (prof / "build" / "info.json").write_text("{}")
    return data


def thaw(ref, data, capsys):
    capsys.readouterr()
    rc = analysis_main(["thaw", "--from", str(ref), "--data", str(data)])
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(autouse=True)
def this_training_code(monkeypatch):
    monkeypatch.setattr(thaw_module, "code_digest", lambda: CODE)


def test_the_study_comes_back_as_the_workflow_wrote_it(frozen, tmp_path, capsys):
    src, ref, finished, unfinished = frozen
    data = prepared(tmp_path / "elsewhere")
    rc, err = thaw(ref, data, capsys)
    assert rc == 0 and "5 runs" in err[0], err
    for run in finished:
        back = data / run.relative_to(src.parent)
        for name in ("summary.json", "log.jsonl"):
            assert (back / name).read_bytes() == (run / name).read_bytes(), back / name
    assert not (data / unfinished.relative_to(src.parent)).exists()
    results = data / "study_tp" / "results" / "tp_summary.csv"
    assert results.read_bytes() == (src / "results" / "tp_summary.csv").read_bytes()
    # nothing older than what it was made from, which the workflow would take for stale and remake:
    # the runs, the SQNR of a degree's capture, their join, the results
    newest_run = max((data / r.relative_to(src.parent) / "summary.json").stat().st_mtime for r in finished)
    bench = data / "study_tp" / "bench"
    made = [newest_run, (bench / "reduced_error_tp16.csv").stat().st_mtime, (bench / "reduced_error.csv").stat().st_mtime,
            results.stat().st_mtime]
    assert made == sorted(made) and len(set(made)) == 4, made
    rc, err = thaw(ref, data, capsys)  # again: everything is there already
    assert rc == 0 and "0 files written" in err[0], err


def test_what_the_workflow_would_retrain_is_refused_before_writing(frozen, tmp_path, capsys, monkeypatch):
    src, ref, finished, _ = frozen
    data = tmp_path / "elsewhere"
    rc, err = thaw(ref, data, capsys)
    assert rc == 2 and len(err) == 1 and "tokens.bin is missing" in err[0] and "snakemake" in err[0], err
    prepared(data)
    (data / "study_tp" / "tokens" / "tokens.bin").write_bytes(b"other tokens")
    rc, err = thaw(ref, data, capsys)
    assert rc == 2 and len(err) == 1 and "not this study's data" in err[0], err
    (data / "study_tp" / "tokens" / "tokens.bin").write_bytes(TOKENS)
    monkeypatch.setattr(thaw_module, "code_digest", lambda: "0123456789abcdef")
    rc, err = thaw(ref, data, capsys)
    assert rc == 2 and len(err) == 1 and CODE in err[0] and "0123456789abcdef" in err[0], err
    assert not (data / "study_tp" / "tp_runs").exists()


def test_a_file_that_differs_is_never_overwritten(frozen, tmp_path, capsys):
    src, ref, finished, _ = frozen
    data = prepared(tmp_path / "elsewhere")
    mine = data / finished[-1].relative_to(src.parent) / "summary.json"
    mine.parent.mkdir(parents=True)
    mine.write_text("{}")
    rc, err = thaw(ref, data, capsys)
    assert rc == 2 and len(err) == 1 and str(mine) in err[0] and "differs" in err[0], err
    assert mine.read_text() == "{}" and not (data / "study_tp" / "results").exists()


def test_a_folder_not_frozen_as_a_study_is_refused(frozen, capsys, tmp_path):
    _, ref, _, _ = frozen
    readme = ref / "README.md"
    readme.write_text("\n".join(line for line in readme.read_text().splitlines()
                                if not line.startswith("- training code:")))
    rc, err = thaw(ref, prepared(tmp_path / "elsewhere"), capsys)
    assert rc == 2 and len(err) == 1 and "not a study frozen with --study" in err[0], err
