"""bench.reduced_error on synthetic captures: the TP degree is the captures', a missing rank is
named, and an all-reduce that overflows reports NaN, never a perfect (infinite) SQNR."""

from __future__ import annotations

import json
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


def test_degrees_measured_apart_join_into_what_one_measurement_gives(tmp_path, capsys):
    """--parts: each TP degree measured as its run ends, joined later, gives the rows and summary of
    measuring every degree at once; parts that disagree, or repeat a degree, are refused in one line."""
    import pandas as pd

    caps = {tp: str(captures(tmp_path / f"tp{tp}", tp)) for tp in (2, 4)}

    def run(*args):
        capsys.readouterr()
        extra = [] if args[0] == "--parts" else ["--presets", "bf16,fp4quant", "--max-calls", "2"]
        rc = reduced_error.main([*args, *extra])
        return rc, capsys.readouterr().err.strip().splitlines()

    assert run("--captures", *caps.values(), "--out", str(tmp_path / "once.csv"))[0] == 0
    for tp, folder in caps.items():
        assert run("--captures", folder, "--out", str(tmp_path / f"part{tp}.csv"))[0] == 0
    parts = [str(tmp_path / f"part{tp}.csv") for tp in caps]
    assert run("--parts", *parts, "--out", str(tmp_path / "joined.csv"))[0] == 0
    for name in ("{}.csv", "{}_summary.csv"):
        once = pd.read_csv(tmp_path / name.format("once"))
        joined = pd.read_csv(tmp_path / name.format("joined"))
        pd.testing.assert_frame_equal(once, joined)
    meta = json.loads((tmp_path / "joined.csv.meta.json").read_text())
    assert meta["captures"] == list(caps.values()) and meta["parts"] == parts and meta["max_calls"] == 2

    with pytest.raises(SystemExit):  # the parts' own presets and calls, not new ones
        reduced_error.main(["--parts", *parts, "--max-calls", "3", "--out", str(tmp_path / "recalled.csv")])
    assert "--max-calls are theirs" in capsys.readouterr().err
    rc, err = run("--parts", parts[0], parts[0], "--out", str(tmp_path / "twice.csv"))
    assert rc == 2 and len(err) == 1 and "TP 2 is in an earlier part" in err[0], err
    other = json.loads((tmp_path / "part4.csv.meta.json").read_text())
    (tmp_path / "part4.csv.meta.json").write_text(json.dumps({**other, "max_calls": 3}))
    rc, err = run("--parts", *parts, "--out", str(tmp_path / "mixed.csv"))
    assert rc == 2 and len(err) == 1 and "differ in max_calls" in err[0] and "part4.csv" in err[0], err
    (tmp_path / "part4.csv.meta.json").unlink()
    rc, err = run("--parts", *parts, "--out", str(tmp_path / "lost.csv"))
    assert rc == 2 and len(err) == 1 and "part4.csv.meta.json is missing" in err[0], err
