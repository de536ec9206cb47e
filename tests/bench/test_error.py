"""The error benchmark runs end to end and its numbers have the expected shape."""

from __future__ import annotations

import pandas as pd
import pytest

from fp4quant.bench import error, tensors


def test_writes_csv_with_provenance(tmp_path):
    out = tmp_path / "error.csv"
    assert error.main(["--out", str(out), "--numel", "16384", "--seeds", "1"]) == 0
    df = pd.read_csv(out)
    assert {"config", "kind", "nmse", "sqnr_db", "bits_per_value", "hardware", "torch", "commit"} <= set(df.columns)
    assert set(df.kind) == set(tensors.KINDS)
    presets = df[df.study == "presets"].set_index(["config", "kind"])
    assert presets.loc[("bf16", "gaussian"), "nmse"] < 1e-4
    # single_scale underflows on 1e-6 gradients; the dual scale does not
    assert presets.loc[("single_scale", "small_gradient"), "nmse"] > 0.9
    assert presets.loc[("fp4quant", "small_gradient"), "nmse"] < 0.02
    assert df.nmse_std.isna().all()  # one seed: no spread, never a measured-looking 0
    assert (tmp_path / "error.csv.meta.json").exists()


@pytest.mark.parametrize("argv, message", [(["--numel", "1000"], "--numel 1000: a positive multiple of 4096"),
                                           (["--seeds", "0"], "--seeds 0: at least 1")])
def test_bad_sizes_are_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        error.main(["--out", str(tmp_path / "e.csv"), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_tensor_kinds():
    x = tensors.make("outlier_channels", 4096 * 4, seed=0)
    assert x.shape == (4, 4096)
    col_rms = x.pow(2).mean(0).sqrt()
    assert int((col_rms > 20).sum()) == tensors.OUTLIER_CHANNELS
    with pytest.raises(ValueError, match="unknown tensor kind"):
        tensors.make("uniform", 4096, 0)
    with pytest.raises(ValueError, match="multiple of 4096"):
        tensors.make("gaussian", 100, 0)
