"""What a prepared folder must be to be trained on (checked on open), and what `data prepare`
says about input it cannot use: one line each, never a traceback."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from fp4quant.data import DataError, TokenDataset, dataset, prepare
from fp4quant.data.__main__ import main as data_main

TEXT = "whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune\n" * 60


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A prepared folder of about 5,000 byte tokens (uint16)."""
    root = tmp_path_factory.mktemp("small")
    (root / "c.txt").write_text(TEXT)
    prepare(root / "tokens", [str(root / "c.txt")], val_fraction=0.1)
    return root / "tokens"


@pytest.fixture
def copy(small, tmp_path):
    return shutil.copytree(small, tmp_path / "copy")


def rewrite(folder, ids: np.ndarray, **meta) -> None:
    """tokens.bin as ``ids`` under a meta.json that states them truly: dtype, length and checksum."""
    data = ids.tobytes()
    (folder / "tokens.bin").write_bytes(data)
    old = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**old, "dtype": ids.dtype.name, "n_tokens": ids.size,
                                                  "n_train": ids.size - 100,
                                                  "tokens_sha256": hashlib.sha256(data).hexdigest(), **meta}))


def one_line(exc: pytest.ExceptionInfo, *words: str) -> None:
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1 and all(w in msg for w in words), msg


def test_substituted_tokens_of_the_same_size_are_refused(copy):
    ids = np.fromfile(copy / "tokens.bin", dtype=np.uint16)
    rng = np.random.default_rng(0)
    where = rng.choice(ids.size, 200, replace=False)
    ids[where] = (ids[where] + rng.integers(1, 256, where.size)) % 256  # every id still inside the vocabulary
    ids.tofile(copy / "tokens.bin")
    with pytest.raises(DataError) as exc:
        TokenDataset(copy)
    one_line(exc, str(copy / "tokens.bin"), "does not match the tokens_sha256", "python -m fp4quant.data prepare",
             "--input")  # redone from the same input, not the bundled corpus


def test_a_change_in_any_chunk_is_found(copy, monkeypatch):
    monkeypatch.setattr(dataset, "CHUNK_BYTES", 1024)  # the file is hashed in many chunks
    assert TokenDataset(copy).windows(64) > 0
    ids = np.fromfile(copy / "tokens.bin", dtype=np.uint16)
    ids[-1] = (ids[-1] + 1) % 256  # the last id of the last, partial chunk
    ids.tofile(copy / "tokens.bin")
    with pytest.raises(DataError, match="does not match the tokens_sha256"):
        TokenDataset(copy)


def test_negative_ids_under_a_signed_dtype_are_refused(copy):
    ids = np.fromfile(copy / "tokens.bin", dtype=np.uint16).astype(np.int16)
    rewrite(copy, ids)
    assert TokenDataset(copy).tokens.dtype == np.int16  # a signed dtype with valid ids is fine
    ids[1000] = -3
    rewrite(copy, ids)
    with pytest.raises(DataError) as exc:
        TokenDataset(copy)
    one_line(exc, str(copy / "tokens.bin"), "holds token id -3, outside the vocabulary of 256", "prepare")


def test_a_float_dtype_is_refused(copy):
    rewrite(copy, np.fromfile(copy / "tokens.bin", dtype=np.uint16).astype(np.float32))
    with pytest.raises(DataError) as exc:
        TokenDataset(copy)
    one_line(exc, str(copy / "meta.json"), "dtype float32", "integers", "python -m fp4quant.data prepare")


@pytest.mark.parametrize("sha", [None, "", "abc", 42])
def test_a_missing_or_malformed_checksum_is_refused(copy, sha):
    meta = json.loads((copy / "meta.json").read_text())
    if sha is None:
        del meta["tokens_sha256"]
    else:
        meta["tokens_sha256"] = sha
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError) as exc:
        TokenDataset(copy)
    one_line(exc, str(copy / "meta.json"), "no valid tokens_sha256", "cannot be verified", "prepare it again")


def test_a_split_shorter_than_one_window_is_one_line(small):
    ds = TokenDataset(small)
    n_train = ds.n_train
    assert ds.require_windows(n_train - 1) == 1  # exactly seq_len + 1 tokens: one window
    with pytest.raises(DataError) as exc:
        ds.require_windows(n_train)
    one_line(exc, "train split", str(small), f"holds {n_train} tokens", f"--seq-len {n_train}")
    with pytest.raises(DataError, match="the val split .* --seq-len 4096"):
        ds.batch(0, 0, 1, 1, 4096, split="val")
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        ds.windows(0)


def run(capsys, *argv: str) -> tuple[int, str]:
    """``python -m fp4quant.data`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    try:
        status = data_main(list(argv))
    except SystemExit as exc:  # argparse's errors exit
        status = exc.code
    return status, capsys.readouterr().err


def bad_inputs(tmp_path) -> dict[str, tuple[list[str], str]]:
    """name: (arguments, what the one line says)."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "binary.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "number.jsonl").write_text('{"text": 5}\n')
    (tmp_path / "nothing").mkdir()
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("not json")
    (tmp_path / "file").write_text("x")
    good = str(tmp_path / "good.txt")
    (tmp_path / "good.txt").write_text(TEXT)
    return {
        "missing file": (["--input", str(tmp_path / "missing.txt")], "no such corpus file or folder"),
        "folder without text": (["--input", str(tmp_path / "nothing")], "no .txt/.jsonl/.json/.md files under"),
        "empty file": (["--input", str(tmp_path / "empty.txt")], "has only 2 tokens"),
        "binary file": (["--input", str(tmp_path / "binary.txt")], "binary.txt: not UTF-8 text"),
        "binary JSON line": (["--input", str(tmp_path / "binary.jsonl")], "binary.jsonl:2: not UTF-8 text"),
        "JSON line not an object": (["--input", str(tmp_path / "list.jsonl")], "list.jsonl:1: a JSON list"),
        "JSON field not text": (["--input", str(tmp_path / "number.jsonl")], "field 'text' is a JSON int"),
        "empty input path": (["--input", ""], "an empty --input path"),
        "no input after --input": (["--input"], "expected at least one argument"),
        "bad tokenizer.json": (["--input", good, "--tokenizer", str(tmp_path / "tok")], "not a Hugging Face tokenizer"),
        "no tokenizer.json": (["--input", good, "--tokenizer", str(tmp_path / "nothing")], "no tokenizer.json in"),
        "out is a file": (["--input", good, "--out", str(tmp_path / "file")], "is a file, not a folder"),
        "out under a file": (["--input", good, "--out", str(tmp_path / "file" / "o")], "is a file, not a folder"),
        "empty out": (["--input", good, "--out", ""], "--out must name a folder"),
        "val fraction": (["--input", good, "--val-fraction", "0.7"], "val_fraction must be in [0, 0.5)"),
        "val fraction not a number": (["--val-fraction", "x"], "invalid float value: 'x'"),
        "unknown option": (["--inptu", good], "unrecognized arguments: --inptu"),
    }


def test_data_prepare_refuses_bad_input_in_one_line(tmp_path, capsys):
    for name, (args, words) in bad_inputs(tmp_path).items():
        argv = ["prepare", *args] if "--out" in args else ["prepare", "--out", str(tmp_path / "out"), *args]
        status, err = run(capsys, *argv)
        assert status == 2, (name, err)
        assert len(err.splitlines()) == 1 and err.startswith("fp4quant.data: error: ") and words in err, (name, err)
    assert not (tmp_path / "out").exists()  # a refused run leaves nothing behind
    for argv in ([], ["tokenize"]):
        status, err = run(capsys, *argv)
        assert status == 2 and len(err.splitlines()) == 1, err


def test_preparing_again_replaces_a_folder_whole(small, tmp_path):
    out = shutil.copytree(small, tmp_path / "again")
    (tmp_path / "other.txt").write_text(TEXT.upper())
    meta = prepare(out, [str(tmp_path / "other.txt")])
    assert TokenDataset(out).meta["tokens_sha256"] == meta["tokens_sha256"]
    assert meta["tokens_sha256"] != json.loads((small / "meta.json").read_text())["tokens_sha256"]
