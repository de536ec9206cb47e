"""The origin check knows every hardware description it is given: a machine's (compared by kind),
the step model's (not a machine: not compared), or none of these (refused, naming it)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.origin import MixedOrigin, check_same_origin, hardware_kind
from fp4quant.perfmodel import machines
from fp4quant.provenance import hardware

AMD = "AMD EPYC, 2 cores (CPU)"


def bench_csv(path: Path, hardware: str, commit: str = "a" * 40) -> Path:
    pd.DataFrame([{"op": "quantize", "gbps": 1.0, "hardware": hardware, "commit": commit,
                   "torch": "2.13.0+cpu"}]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("unknown", ["Intel Xeon Gold 6338", "AMD EPYC, 2 cores", "", "unknown"])
def test_an_unrecognised_hardware_description_is_refused_naming_it(tmp_path, unknown):
    # beside a machine of the same kind it would hide: before, it was skipped and the set accepted
    inputs = [bench_csv(tmp_path / "kernels.csv", AMD), bench_csv(tmp_path / "error.csv", unknown)]
    with pytest.raises(MixedOrigin) as info:
        check_same_origin(inputs)
    message = str(info.value)
    assert "\n" not in message and f"error.csv (row 2) records hardware {unknown!r}" in message
    assert "its origin cannot be checked" in message


def test_the_cli_refuses_it_in_one_line(tmp_path, capfd):
    results = tmp_path / "results"
    results.mkdir()
    bench_csv(results / "error.csv", "my laptop")
    out = tmp_path / "e.pdf"
    assert main(["figure", "error", "--results", str(results), "--profile", "cpu", "--out", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "records hardware 'my laptop'" in err and not out.exists()


def test_what_the_project_writes_is_recognised(tmp_path):
    assert hardware_kind(hardware()) == "cpu" and hardware_kind(hardware(None)) == "cpu"
    assert hardware_kind("NVIDIA H100 80GB HBM3 (8 visible)") == "gpu"
    kernels = tmp_path / "gpu_kernels.csv"  # a CUDA kernel benchmark: the step model's H100 takes its codec rate
    rows = [{"impl": "native", "device": "cuda", "preset": "fp4quant", "op": op, "size_bytes": 1 << 20, "gbps": 100.0}
            for op in ("quantize", "dequantize", "dequantize_reduce")]
    pd.DataFrame(rows).to_csv(kernels, index=False)
    for machine in (machines.h100(8), machines.h100(8, gpu_kernels=kernels)):
        assert hardware_kind(machine.name) == "projected"
    # a projection beside the machine that measured: accepted, and not the hardware of the set
    projected = bench_csv(tmp_path / "p.csv", machines.h100(8).name)
    origin = check_same_origin([bench_csv(tmp_path / "k.csv", AMD), projected])
    assert origin["hardware"] == [AMD]


def test_a_stamped_figure_listing_an_unknown_machine_is_refused(tmp_path):
    tex = tmp_path / "t.tex"
    stamp = {"hardware": [AMD, "somewhere"], "commit": "a" * 40, "torch": "2.13.0+cpu", "profile": "cpu"}
    tex.write_text(f"\\begin{{table}}\n% provenance: {json.dumps(stamp)}\n")
    with pytest.raises(MixedOrigin, match=r"t.tex records hardware 'somewhere'"):
        check_same_origin([tex])
