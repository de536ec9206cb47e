"""fp4quant/_build_info.json against the library that would load (fp4quant/ops/_native.py)."""

from __future__ import annotations

import json

import pytest

from fp4quant.ops import _native


def test_a_record_of_another_library_is_explained(monkeypatch, tmp_path):
    if _native.module is None:
        pytest.skip(f"no native extension: {_native.unavailable_reason}")
    record = json.loads(_native.BUILD_INFO.read_text())
    assert len(record["library_sha256"]) == 64 and record["library"].startswith("_C.")
    info = tmp_path / "_build_info.json"
    monkeypatch.setattr(_native, "BUILD_INFO", info)
    info.write_text(json.dumps(record))
    assert _native._load()[2] is None
    info.write_text(json.dumps({**record, "library_sha256": "0" * 64}))
    module, _, reason = _native._load()
    assert module is None
    assert reason.startswith(f"{record['library']} is not the library that _build_info.json describes (its checksum "
                             "differs: a failed or interrupted build?)")
