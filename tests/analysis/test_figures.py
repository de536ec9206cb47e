"""The traffic figure: one box per method and micro-scale choice, forward and backward apart."""

from __future__ import annotations

import itertools

import pandas as pd

from fp4quant.analysis import figures
from fp4quant.analysis.origin import read_stamp
from fp4quant.bench.traffic import methods

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def traffic_frame() -> pd.DataFrame:
    rows = []
    for (labels, _), direction, step, site in itertools.product(methods(), ("fwd", "bwd"), (1, 30), ("L0", "L1")):
        rows.append({**ORIGIN, **labels, "direction": direction, "step": step, "site": site, "rank": 0,
                     "model": "tiny", "sqnr_db": 20.0 + step / 10 + (labels["scale_select"] == "4_over_6")})
    return pd.DataFrame(rows)


def test_traffic_figure_is_written_with_its_origin(tmp_path):
    out = tmp_path / "traffic.pdf"
    figures.traffic(traffic_frame(), out, "cpu")
    assert out.read_bytes().startswith(b"%PDF") and out.stat().st_size > 5000
    assert read_stamp(out)["profile"] == "cpu" and read_stamp(out)["commit"] == ORIGIN["commit"]


def test_traffic_labels_name_presets_and_rotation_sizes():
    df = traffic_frame()
    labels = {figures.traffic_label(r) for r in df.itertuples()}
    assert {"fp4quant", "nvfp4", "fp8", "no_fwht R=none", "no_fwht R=16", "no_fwht R=128", "no_fwht R=group"} <= labels


def test_cli_refuses_a_stale_emulated_allreduce_and_a_csv_it_cannot_read_in_one_line(tmp_path, capsys):
    """The all-reduce figure draws collectives_emulated.csv beside collectives.csv: one run's, or
    refused; a results CSV without the columns a figure or table reads is one line, not a traceback."""
    import shutil

    from distributed import REPO

    from fp4quant.analysis.__main__ import main

    src = REPO / "reference/figures-zen4/data/cpu/results"
    res = tmp_path / "results"
    res.mkdir()
    for name in ("collectives.csv", "collectives_emulated.csv"):
        shutil.copy(src / name, res / name)
    emu = pd.read_csv(res / "collectives_emulated.csv")
    emu.assign(commit="e" * 40, hardware="Intel(R) Xeon(R) Processor, 2 cores (CPU)").to_csv(
        res / "collectives_emulated.csv", index=False)
    assert main(["figure", "allreduce", "--results", str(res), "--profile", "cpu", "--out", str(tmp_path / "a.pdf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "collectives_emulated.csv" in err[0], err
    pd.read_csv(src / "throughput.csv").drop(columns=["network"]).to_csv(res / "throughput.csv", index=False)
    assert main(["figure", "throughput", "--results", str(res), "--profile", "cpu", "--out", str(tmp_path / "t.pdf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "figure throughput: the results in" in err[0] and "network" in err[0], err
    assert not (tmp_path / "t.pdf").exists()
