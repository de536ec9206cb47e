"""Atomic writes and provenance."""

from __future__ import annotations

import json
import os

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
    assert oct(path.stat().st_mode & 0o777) == "0o644"


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
