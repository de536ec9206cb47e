"""Atomic writes and provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp4quant import provenance as prov


def test_provenance_names_commit_torch_hardware():
    info = prov.provenance(config={"a": 1})
    assert info["torch"] == torch.__version__
    assert "CPU" in info["hardware"] or "GPU" in info["hardware"] or "visible" in info["hardware"]
    assert info["commit"] and info["config"] == {"a": 1}


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "r.json"
    prov.atomic_write_json(path, {"x": 1})
    prov.atomic_write_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert sorted(os.listdir(path.parent)) == ["r.json"]  # no temp files left


@pytest.fixture
def umask():
    """Set the process's umask for one test (restored after it)."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o027, 0o640), (0o022, 0o644), (0o077, 0o600)])
def test_atomic_writes_take_the_mode_open_would_give(tmp_path, umask, mask, mode):
    umask(mask)
    writes = {"bytes": lambda p: prov.atomic_write_bytes(p, b"x"), "text": lambda p: prov.atomic_write_text(p, "x"),
              "json": lambda p: prov.atomic_write_json(p, {"x": 1}),
              "csv": lambda p: prov.atomic_write_csv(p, [{"x": 1}])}
    for name, write in writes.items():
        write(tmp_path / name)
        write(tmp_path / name)  # replacing a file too
        assert oct((tmp_path / name).stat().st_mode & 0o777) == oct(mode), name
        with open(tmp_path / f"plain_{name}", "w"):
            pass
        assert (tmp_path / f"plain_{name}").stat().st_mode & 0o777 == mode  # what open() gives


def test_failed_write_leaves_old_content_and_no_temp(tmp_path):
    path = tmp_path / "r.csv"
    prov.atomic_write_csv(path, [{"a": 1}])

    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        prov.atomic_write_csv(path, [{"a": Boom()}])
    assert path.read_text() == "a\n1\n"
    assert os.listdir(tmp_path) == ["r.csv"]


def test_csv_columns_are_the_union_of_keys(tmp_path):
    path = prov.atomic_write_csv(tmp_path / "r.csv", [{"a": 1}, {"b": 2, "a": 3}])
    assert path.read_text() == "a,b\n1,\n3,2\n"


def git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                           *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository of one commit, as the source tree provenance describes."""
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("out/\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "one")
    monkeypatch.setattr(prov, "REPO_ROOT", tmp_path)
    return tmp_path


def commit() -> str:
    return prov.git_commit.__wrapped__()  # uncached: the tree changes within a test


def test_a_clean_tree_is_its_commit(repo):
    assert commit() == git(repo, "rev-parse", "HEAD") and prov.uncommitted_digest() is None
    (repo / "out").mkdir()
    (repo / "out" / "result.csv").write_text("a\n1\n")  # ignored: no change of the source
    assert commit() == git(repo, "rev-parse", "HEAD")


def test_two_uncommitted_edits_are_two_provenances(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "code.py").write_text("x = 2\n")
    first = commit()
    (repo / "code.py").write_text("x = 3\n")
    second = commit()
    assert first.startswith(head + "+dirty.") and second.startswith(head + "+dirty.") and first != second
    (repo / "code.py").write_text("x = 2\n")
    assert commit() == first  # the same edit, the same provenance
    git(repo, "add", "code.py")
    assert commit() == first  # staged or not
    (repo / "new.py").write_text("y = 1\n")  # an untracked source file is part of the tree
    with_new = commit()
    (repo / "new.py").write_text("y = 2\n")
    assert len({first, with_new, commit()}) == 3
    (repo / "new.py").unlink()
    (repo / "code.py").unlink()  # a deletion is an edit too
    assert commit() not in {first, with_new} and commit().startswith(head + "+dirty.")


def test_without_git_provenance_falls_back(repo, monkeypatch):
    monkeypatch.setenv("PATH", str(repo / "no-bin"))
    monkeypatch.setenv("FP4QUANT_COMMIT", "abc123")
    assert commit() == "abc123"
    monkeypatch.delenv("FP4QUANT_COMMIT")
    assert commit() == "unknown"


def test_training_code_digest_follows_the_training_sources_only(repo):
    """A study gathers runs over commits that leave the training code as it was: the digest of a
    tree is its commit's when clean, moves with a training source (tracked, untracked, its mode),
    and stays put when anything else changes."""
    for rel in ("fp4quant/train/loop.py", "fp4quant/analysis/figures.py", "csrc/codec.cpp"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"# {rel}\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two")
    first = prov.code_digest(root=repo)
    assert first == prov.code_digest("HEAD", root=repo) != prov.code_digest("HEAD~1", root=repo)
    (repo / "fp4quant/analysis/figures.py").write_text("changed = True\n")
    (repo / "code.py").write_text("x = 2\n")
    assert prov.code_digest(root=repo) == first  # not training code
    git(repo, "commit", "-qam", "three")
    assert prov.code_digest("HEAD", root=repo) == first
    (repo / "csrc/codec.cpp").write_text("// changed\n")
    assert prov.code_digest(root=repo) != first
    (repo / "csrc/codec.cpp").write_text("# csrc/codec.cpp\n")
    assert prov.code_digest(root=repo) == first  # the same content again
    (repo / "fp4quant/train/new.py").write_text("y = 1\n")  # untracked, not ignored: it may be imported
    assert prov.code_digest(root=repo) != first
    (repo / "fp4quant/train/new.py").unlink()
    (repo / "csrc/README.md").write_text("notes\n")  # beside the code, not code: no change
    (repo / "fp4quant/environment.py").write_text("TABLE = ()\n")  # the environment table: not imported to train
    assert prov.code_digest(root=repo) == first
    (repo / "fp4quant/train/loop.py").chmod(0o755)
    assert prov.code_digest(root=repo) != first


def test_the_training_code_is_all_a_training_run_imports():
    """TRAINING_SOURCES must hold every fp4quant module the trainer loads, or a study would keep
    runs whose code changed."""
    probe = ("import sys, fp4quant.train.__main__, fp4quant.train.loop, fp4quant.train.simulate, fp4quant.data;"
             "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items()) if n.startswith('fp4quant')"
             " and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    root = prov.REPO_ROOT
    loaded = [Path(f).resolve().relative_to(root).as_posix() for f in out.split()]
    outside = [f for f in loaded if not f.endswith(".so")
               and not any(f == s or f.startswith(s + "/") for s in prov.TRAINING_SOURCES)]
    assert loaded and not outside, f"loaded by the trainer but not in TRAINING_SOURCES: {outside}"
