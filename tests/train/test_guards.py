"""What the trainer refuses, and how: ranks that disagree, out-of-vocabulary tokens, damaged
data, an unwritable --out, a diverging run, a misconfigured launch; one line each, also
under torchrun; the first step's collectives validated across ranks."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from distributed import run_ranks
from fp4quant.train import ConfigError, TrainConfig
from train.launch import cli, short, torchrun


def one_line(err: str, *words: str) -> None:
    assert len(err.splitlines()) == 1 and err.startswith("fp4quant.train: error: "), err
    assert all(w in err for w in words), err


def test_ranks_started_differently_fail_together(data, tmp_path):
    per_rank = [{}, {"comm": "fp4quant", "seed": 1, "out": str(tmp_path / "other")}]
    errors = run_ranks("train.rank_jobs:start", 2, {"per_rank": per_rank, **short(data, tmp_path / "run", tp=2)},
                       timeout=60)
    assert errors[0] == errors[1] is not None  # the same error on every rank
    assert "different configurations" in errors[0]
    assert "comm ('bf16' on rank 0; 'fp4quant' on rank 1)" in errors[0], errors[0]
    assert "seed (0 on rank 0; 1 on rank 1)" in errors[0] and "out (" in errors[0]


@pytest.fixture
def random_tokens(data, tmp_path):
    """A prepared folder whose tokens.bin is random bytes: ids up to 65535 under a vocabulary of 256."""
    folder = tmp_path / "random"
    folder.mkdir()
    meta = json.loads(Path(data, "meta.json").read_text())
    n = 100_000
    tokens = np.random.default_rng(0).integers(0, 256, 2 * n, dtype=np.uint8).tobytes()
    (folder / "tokens.bin").write_bytes(tokens)
    # its own checksum: a prepared folder whose ids, not whose bytes, are wrong
    (folder / "meta.json").write_text(json.dumps({**meta, "n_tokens": n, "n_train": n - 1000,
                                                  "tokens_sha256": hashlib.sha256(tokens).hexdigest()}))
    return str(folder)


def test_token_ids_outside_the_vocabulary_are_one_error(random_tokens, tmp_path, capsys):
    status, err = cli(capsys, **short(random_tokens, tmp_path / "tp1"))
    assert status == 2
    one_line(err, "tokens.bin holds token id", "outside the vocabulary of 256")
    errors = run_ranks("train.rank_jobs:start", 2, short(random_tokens, tmp_path / "tp2", tp=2), timeout=60)
    assert all(e is not None and "outside the vocabulary of 256" in e for e in errors), errors


@pytest.mark.parametrize("damage", ["empty meta", "truncated meta", "short tokens"])
def test_damaged_data_is_one_line(data, tmp_path, capsys, damage):
    folder = tmp_path / "damaged"
    folder.mkdir()
    meta, tokens = Path(data, "meta.json").read_text(), Path(data, "tokens.bin").read_bytes()
    (folder / "meta.json").write_text({"empty meta": "", "truncated meta": meta[: len(meta) // 2]}.get(damage, meta))
    (folder / "tokens.bin").write_bytes(tokens[:1000] if damage == "short tokens" else tokens)
    status, err = cli(capsys, **short(str(folder), tmp_path / "run"))
    assert status == 2
    one_line(err, "damaged", "prepare it again")


def test_unwritable_out_is_checked_first(data, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    status, err = cli(capsys, **short(data, tmp_path / "file" / "run"))
    assert status == 2
    one_line(err, "--out", "is not a writable folder")


@pytest.mark.slow
def test_one_line_errors_under_torchrun(data, tmp_path):
    (tmp_path / "file").write_text("")
    p = torchrun(["--model", "tiny", "--tp", "2", "--data", data, "--out", str(tmp_path / "file" / "run")],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith("fp4quant.train: error: --out")]
    assert len(ours) == 2, err  # one line per rank
    assert "fp4quant/" not in err, err  # no traceback through our code: what remains is torchrun's own report
    assert err.count("traceback : fp4quant.train: error: --out") == 2, err  # which names the error


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(data, tmp_path, capsys):
    out = tmp_path / "run"
    status, err = cli(capsys, **short(data, out, lr=1e20, warmup=0, steps=5, checkpoint_every=1, seq_len=32))
    assert status == 1
    one_line(err, "step 1:", "not finite", "last checkpoint: step 1")
    assert [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()] == [0]
    assert (out / "checkpoints" / "latest").read_text().strip() == "1"
    state = torch.load(out / "checkpoints" / "step_000001" / "rank0000.pt", weights_only=True)
    assert all(t.isfinite().all() for t in state["model"].values())
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize(
    "kw, message",
    [(dict(lr=float("inf")), "--lr must be finite"), (dict(lr=float("nan")), "--lr must be finite"),
     (dict(weight_decay=float("inf")), "--weight-decay must be finite"), (dict(out=""), "--out must name")],
)
def test_non_finite_or_empty_options(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{"out": "x", **kw})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_device_cuda_without_a_gpu(data, tmp_path, capsys):
    status, err = cli(capsys, **short(data, tmp_path / "run", device="cuda"))
    assert status == 2
    one_line(err, "--device cuda", "no CUDA GPU")


def test_world_size_without_torchrun(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    status, err = cli(capsys, **short(data, tmp_path / "run", tp=2, steps=1, seq_len=32))
    assert status == 2
    one_line(err, "WORLD_SIZE=2 but RANK is not set")
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_user_data_is_not_prepared_for_them(tmp_path, capsys):
    status, err = cli(capsys, **short(str(tmp_path / "mine"), tmp_path / "run"))
    assert status == 2
    one_line(err, "no prepared data at", "fp4quant.data prepare")
    assert not (tmp_path / "mine").exists()


@pytest.mark.slow
def test_the_default_data_prepares_itself_once(tmp_path):
    """A fresh clone: no data/tokens; two ranks start at once; one prepares, the other waits."""
    p = torchrun(["--model", "tiny", "--tp", "2", "--steps", "1", "--seq-len", "32", "--batch-size", "1",
                  "--eval-batches", "0", "--out", "run"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    assert err.count("preparing the bundled corpus") == 1, err
    assert (tmp_path / "data" / "tokens" / "shakespeare-bytes" / "meta.json").exists()
    assert len((tmp_path / "run" / "log.jsonl").read_text().splitlines()) == 1


def test_a_misconfigured_rank_fails_at_the_first_step(data, tmp_path):
    errors = run_ranks("train.rank_jobs:misconfigured_rank", 2, short(data, tmp_path / "run", tp=2, comm="fp4quant",
                                                                       steps=2, seq_len=32), timeout=60)
    assert all(e is not None and "differs from rank 0 in config.fwht" in e for e in errors), errors


def test_only_the_first_step_is_validated(data, tmp_path):
    results = run_ranks("train.rank_jobs:validations", 2, short(data, tmp_path / "run", tp=2, comm="fp4quant",
                                                                 steps=3, seq_len=32), timeout=60)
    first = results[0]["log"][0]
    for r in results:  # one validation per collective of step 0, none later
        assert r["steps"] == [0] * (first["fwd_calls"] + first["bwd_calls"]) and r["steps"], r["steps"]


@pytest.mark.parametrize("flags, words", [
    (dict(seed=-1), ("--seed", "[0, 2**64)")),
    (dict(seed="1e20"), ("--seed", "invalid int value")),
    (dict(lr=1e38), ("--lr", "float32")),
    (dict(steps="many"), ("--steps", "invalid int value")),
])
def test_bad_option_values_are_one_line(data, tmp_path, capsys, flags, words):
    status, err = cli(capsys, **short(data, tmp_path / "run", **flags))
    assert status == 2
    one_line(err, *words)


def test_an_hf_config_with_a_number_as_text_is_one_line(data, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads="4", num_key_value_heads=2)))
    status, err = cli(capsys, **short(data, tmp_path / "run", model=f"hf:{config}", tp=1))
    assert status == 2
    one_line(err, str(config), "num_heads", "'4'")


def test_a_model_folder_without_weights_is_one_line(data, tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    status, err = cli(capsys, **short(data, tmp_path / "run", model=str(tmp_path / "model")))
    assert status == 2
    one_line(err, "no *.safetensors", f"hf:{tmp_path / 'model' / 'config.json'}")


def test_a_compressed_wire_at_tp_1_is_labelled_by_what_it_sent(data, tmp_path, capsys):
    status, err = cli(capsys, **short(data, tmp_path / "run", comm="fp4quant", steps=2, seq_len=32))
    assert status == 0, err
    assert "--tp 1 sends no TP traffic" in err and "labelled exact" in err, err
    comm = json.loads((tmp_path / "run" / "summary.json").read_text())["comm"]
    assert comm["label"] == "exact" and comm["fwd"] == comm["bwd"] == "nothing sent (TP = 1)", comm


def in_mount_namespace(mount: str, command: list[str]) -> subprocess.CompletedProcess:
    """``command`` with ``mount`` (a shell line) done first, in a mount namespace of its own."""
    script = f"{mount} && exec \"$@\""
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", *command], capture_output=True, text=True,
                          timeout=300)


def mount_namespaces_work(tmp_path) -> bool:
    try:
        return in_mount_namespace(f"mount -t tmpfs -o size=64k none {tmp_path}", ["true"]).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def trainer(data, out, **kw) -> list[str]:
    import sys

    return [sys.executable, "-m", "fp4quant.train", "--model", "tiny", "--steps", "3", "--seq-len", "32",
            "--batch-size", "1", "--checkpoint-every", "1", "--data", data, "--out", str(out),
            *[x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]]


def test_a_full_disk_is_one_line_and_exit_2(data, tmp_path):
    """The run folder on a 300 KiB file system: the first checkpoint fills it."""
    full = tmp_path / "full"
    full.mkdir()
    if not mount_namespaces_work(full):
        pytest.skip("needs mount namespaces (root, unshare)")
    done = in_mount_namespace(f"mount -t tmpfs -o size=300k none {full}", trainer(data, full / "run"))
    err = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip() and "train bf16" not in line]
    assert done.returncode == 2, done.stderr
    assert len(err) == 1 and "No space left on device" in err[0], err


def test_a_read_only_checkpoints_folder_is_one_line(data, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    if not mount_namespaces_work(tmp_path / "run" / "checkpoints"):
        pytest.skip("needs mount namespaces (root, unshare)")
    ro = out / "checkpoints"
    done = in_mount_namespace(f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}", trainer(data, out))
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(err) == 1 and "checkpoints is not a writable folder" in err[0], err


def test_a_train_split_shorter_than_one_sequence_is_one_line(tmp_path, capsys):
    from fp4quant.data import prepare

    (tmp_path / "text.txt").write_text("a short corpus " * 100)  # 1500 tokens, 15 of them validation
    prepare(tmp_path / "tokens", [str(tmp_path / "text.txt")])
    status, err = cli(capsys, **short(str(tmp_path / "tokens"), tmp_path / "run", seq_len=4096))
    assert status == 2
    one_line(err, "train split", "--seq-len 4096")
