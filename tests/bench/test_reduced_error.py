"""bench.reduced_error on synthetic captures: the TP degree is the captures', a missing rank is
named, and an all-reduce that overflows reports NaN, never a perfect (infinite) SQNR."""

from __future__ import annotations

import math

import pytest
import torch

from fp4quant.bench import reduced_error
from fp4quant.parallel.capture import TrafficCapture


def captures(folder, tp, ranks=None, scale=1.0, steps=(1,)):
    for rank in range(tp) if ranks is None else ranks:
        cap = TrafficCapture(folder, steps, rank=rank, meta={"tp": tp})
        for step in steps:
            cap.start_step(step)
            g = torch.Generator().manual_seed(100 * step + rank)
            for direction in ("fwd", "bwd"):
                for _ in range(3):
                    cap.record(direction, scale * torch.randn(4, 64, generator=g))
            cap.save()
    return folder


def test_rows_name_the_captures_tp_and_the_error_grows_past_one_message(tmp_path):
    rows = reduced_error.measure([str(captures(tmp_path / "tp4", 4))], ["bf16", "fp4quant"], max_calls=2)
    assert {r["tp"] for r in rows} == {4} and len(rows) == 2 * 2 * 2  # directions x calls x presets
    fp4 = [r for r in rows if r["preset"] == "fp4quant"]
    assert all(math.isfinite(r["sqnr_db"]) and 5 < r["sqnr_db"] < r["single_sqnr_db"] + 3 for r in fp4), fp4
    summary = reduced_error.summarize(rows)
    assert [(s["tp"], s["preset"], s["tensors"]) for s in summary if s["direction"] == "fwd"] == \
        [(4, "bf16", 2), (4, "fp4quant", 2)]


def test_a_missing_rank_is_named_not_read_as_a_smaller_tp(tmp_path):
    folder = captures(tmp_path / "tp4", 4, ranks=[0, 1, 2])  # rank 3's file lost
    with pytest.raises(ValueError, match=r"step 1 has captures of ranks \[0, 1, 2\], not 0\.\.3"):
        reduced_error.measure([str(folder)], ["fp4quant"])


def test_captures_of_two_tp_degrees_in_one_folder_are_refused(tmp_path):
    folder = captures(tmp_path / "mixed", 2)
    captures(folder, 4, ranks=[2, 3])
    with pytest.raises(ValueError, match="not one TP degree"):
        reduced_error.measure([str(folder)], ["fp4quant"])


def test_an_overflowing_reduction_is_nan_not_infinitely_good():
    exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert math.isnan(reduced_error.sqnr_db(torch.tensor([math.inf, 2.0]), exact))
    assert math.isnan(reduced_error.sqnr_db(torch.tensor([math.nan, 2.0]), exact))
    assert reduced_error.sqnr_db(exact.float(), exact) == math.inf
    rows = [{"tp": 2, "direction": "fwd", "preset": "p", "sqnr_db": v, "single_sqnr_db": 20.0, "energy": 1.0,
             "error_energy": e} for v, e in ((30.0, 1e-3), (math.nan, math.inf))]
    (s,) = reduced_error.summarize(rows)
    assert math.isnan(s["sqnr_db_median"]) and math.isnan(s["sqnr_db_min"]) and math.isnan(s["sqnr_db_pooled"])


def test_max_calls_below_two_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        reduced_error.main(["--captures", str(tmp_path), "--max-calls", "1", "--out", str(tmp_path / "o.csv")])
    assert exc.value.code == 2 and "--max-calls 1: at least 2" in capsys.readouterr().err
