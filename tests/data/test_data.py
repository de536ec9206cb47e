"""Data preparation and deterministic batches."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from fp4quant.data import ByteTokenizer, DataError, TokenDataset, prepare, prepare_default_once
from fp4quant.data.__main__ import main as data_main


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    prepare(out)
    return out


def test_default_corpus_is_real_text(shakespeare):
    meta = json.loads((shakespeare / "meta.json").read_text())
    assert meta["n_tokens"] > 5_000_000 and meta["vocab_size"] == 256
    assert "Shakespeare" in meta["source"]
    text = ByteTokenizer().decode(np.fromfile(shakespeare / "tokens.bin", dtype=np.uint16)[:200_000])
    assert "HAMLET" in text.upper() or "Hamlet" in text or "KING" in text
    # English prose and verse: mostly letters and spaces
    letters = sum(c.isalpha() or c.isspace() for c in text) / len(text)
    assert letters > 0.9


def test_batches_are_a_pure_function_of_step_and_rank(shakespeare):
    ds = TokenDataset(shakespeare)
    a = ds.batch(7, 1, 2, 4, 128, seed=3)
    b = TokenDataset(shakespeare).batch(7, 1, 2, 4, 128, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, y = a
    assert x.shape == (4, 128) and torch.equal(x[:, 1:], y[:, :-1])  # labels are the next tokens
    assert not torch.equal(ds.batch(7, 0, 2, 4, 128, seed=3)[0], x)  # ranks read different data
    assert not torch.equal(ds.batch(8, 1, 2, 4, 128, seed=3)[0], x)


def test_ranks_and_steps_partition_an_epoch(shakespeare):
    ds = TokenDataset(shakespeare)
    seq, bs, dp = 4096, 2, 3
    k = ds.windows(seq)
    steps = k // (bs * dp)
    seen = [w for step in range(steps) for rank in range(dp) for w in ds.sample_windows(step, rank, dp, bs, seq)]
    assert len(seen) == len(set(seen)) == steps * bs * dp  # no window twice within an epoch
    assert set(seen) <= set(range(k))


def test_validation_split_is_disjoint(shakespeare):
    ds = TokenDataset(shakespeare)
    assert ds.windows(256, "val") > 0
    x, _ = ds.batch(0, 0, 1, 1, 256, split="val")
    assert x.shape == (1, 256)
    with pytest.raises(ValueError, match="split"):
        ds.batch(0, 0, 1, 1, 256, split="test")


def test_user_jsonl_and_text(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "' + "to be or not to be. " * 40 + '"}\n\n{"text": "that is the question"}\n')
    (tmp_path / "b.txt").write_text("whether 'tis nobler in the mind to suffer " * 30)
    meta = prepare(tmp_path / "out", [str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")], val_fraction=0.1)
    assert meta["documents"] == 3 and meta["n_train"] < meta["n_tokens"]
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="no field 'text'"):
        prepare(tmp_path / "out2", [str(tmp_path / "bad.jsonl")])
    with pytest.raises(FileNotFoundError, match="no such corpus"):
        prepare(tmp_path / "out3", [str(tmp_path / "missing.txt")])


def test_missing_or_damaged_folder_is_explained(tmp_path, shakespeare):
    with pytest.raises(FileNotFoundError, match="fp4quant.data prepare"):
        TokenDataset(tmp_path)
    (tmp_path / "meta.json").write_text((shakespeare / "meta.json").read_text())
    (tmp_path / "tokens.bin").write_bytes(b"\0" * 10)
    with pytest.raises(DataError, match="damaged"):
        TokenDataset(tmp_path)
    for meta in ("", (shakespeare / "meta.json").read_text()[:100], "[]"):
        (tmp_path / "meta.json").write_text(meta)
        with pytest.raises(DataError, match="meta.json is damaged"):
            TokenDataset(tmp_path)


def write_folder(folder, meta: dict, ids: np.ndarray) -> None:
    """A prepared folder made by hand: ``ids`` as stored, meta.json stating their dtype, length and checksum."""
    data = ids.tobytes()
    (folder / "tokens.bin").write_bytes(data)
    (folder / "meta.json").write_text(json.dumps({**meta, "dtype": ids.dtype.name, "n_tokens": ids.size,
                                                  "n_train": ids.size - 500,
                                                  "tokens_sha256": hashlib.sha256(data).hexdigest()}))


def test_token_ids_are_checked_against_the_vocabulary(tmp_path, shakespeare):
    meta = json.loads((shakespeare / "meta.json").read_text())
    n = 50_000
    ids = np.random.default_rng(0).integers(0, 256, n).astype(np.uint16)
    write_folder(tmp_path, meta, ids)
    assert TokenDataset(tmp_path).vocab_size == 256
    ids[n // 2] = 256  # one id past the vocabulary
    write_folder(tmp_path, meta, ids)
    with pytest.raises(DataError, match="holds token id 256, outside the vocabulary of 256"):
        TokenDataset(tmp_path)


def test_the_default_folder_prepares_itself_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert prepare_default_once() is True
    meta = json.loads((tmp_path / "data/tokens/shakespeare-bytes/meta.json").read_text())
    assert prepare_default_once() is False  # already there: nothing redone
    assert json.loads((tmp_path / "data/tokens/shakespeare-bytes/meta.json").read_text()) == meta


def test_hf_tokenizer_folder(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["to be or not to be that is the question"] * 50,
                            trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "c.txt").write_text("to be or not to be that is the question " * 2000)
    meta = prepare(tmp_path / "out", [str(tmp_path / "c.txt")], tokenizer=str(tmp_path / "tok"))
    assert meta["vocab_size"] <= 60 and meta["dtype"] == "uint16"
    assert tokenizers is not None


def test_cli(tmp_path):
    (tmp_path / "c.txt").write_text("words and more words " * 200)
    assert data_main(["prepare", "--out", str(tmp_path / "o"), "--input", str(tmp_path / "c.txt")]) == 0
    assert TokenDataset(tmp_path / "o").vocab_size == 256
