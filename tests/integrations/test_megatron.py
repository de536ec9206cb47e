"""fp4quant.integrations.megatron: Megatron-Core's TP layers through one TPCommunicator.

On CPU / gloo at TP = 2, Megatron-Core's GPT (local spec, 2 layers, hidden 64, sequence 32):
enable("exact") is stock Megatron bit for bit (with and without sequence parallelism),
enable("fp4quant") compresses both directions, every large TP collective of a step goes through
fp4quant, Transformer Engine layers are refused, and disable() restores Megatron.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from distributed import REPO, run_ranks

from fp4quant.integrations import megatron as fp4_megatron


def have_megatron_core() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


needs_megatron = pytest.mark.skipif(not have_megatron_core(),
                                    reason="megatron-core is not installed (pip install 'fp4quant[megatron]')")

pytestmark = pytest.mark.timeout(300)

LARGE = 4096  # bytes: every TP layer tensor of the tiny GPT is larger, the cross entropy's reductions smaller


@functools.lru_cache(maxsize=None)
def compare(comm: str, sequence_parallel: bool) -> tuple[dict, ...]:
    return tuple(run_ranks("integrations.megatron_jobs:compare", 2,
                           dict(comm=comm, sequence_parallel=sequence_parallel), timeout=150))


def expected_calls(layers: int, sequence_parallel: bool) -> int:
    """TP collectives of a step in each direction.  Without sequence parallelism: forward, the
    outputs of each layer's two row-parallel linears (attention projection, fc2) and of the
    embedding are all-reduced; backward, the input gradients of each layer's two column-parallel
    linears (qkv, fc1) and of the output layer: 2 L + 1.  With it, those 2 L + 1 outputs are
    reduce-scattered (all-gathered backward) and the 2 L + 1 inputs all-gathered (reduce-scattered
    backward): 4 L + 2."""
    return (4 * layers + 2) if sequence_parallel else (2 * layers + 1)


def large_outside(records, phase=None):
    return [r for r in records if r[2] > LARGE and r[3] and not r[4] and (phase is None or r[0] == phase)]


def cosine(a: dict, b: dict) -> float:
    x = torch.cat([a[n].flatten().double() for n in sorted(a)])
    y = torch.cat([b[n].flatten().double() for n in sorted(b)])
    return float(x @ y / (x.norm() * y.norm()))


@needs_megatron
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_exact_is_stock_megatron_bit_for_bit(sequence_parallel):
    for r in compare("exact", sequence_parallel):
        stock, enabled = r["stock"], r["enabled"]
        assert torch.equal(enabled["loss"], stock["loss"])
        assert enabled["grads"].keys() == stock["grads"].keys() and stock["grads"]
        for name, g in stock["grads"].items():
            assert torch.equal(enabled["grads"][name], g), name
        assert sorted(r["rebound"]) == sorted(fp4_megatron.REBOUND)


@needs_megatron
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_fp4quant_compresses_both_directions_close_to_stock(sequence_parallel):
    for r in compare("fp4quant", sequence_parallel):
        stock, enabled = r["stock"], r["enabled"]
        for d in ("fwd", "bwd"):
            s = enabled["stats"][d]
            assert s["calls"] > 0 and s["bytes_sent"] <= 0.4 * s["bytes_uncompressed"], (d, s)
        assert abs(float(enabled["loss"]) - float(stock["loss"])) <= 0.01 * abs(float(stock["loss"]))
        assert cosine(enabled["grads"], stock["grads"]) > 0.9


@needs_megatron
@pytest.mark.parametrize("comm", ["exact", "fp4quant"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_every_tp_collective_goes_through_fp4quant(comm, sequence_parallel):
    for r in compare(comm, sequence_parallel):
        n = expected_calls(r["layers"], sequence_parallel)
        stock, enabled = r["stock"], r["enabled"]
        # the spy sees stock Megatron's own collectives, those inside its autograd functions included
        assert len(large_outside(stock["records"], "fwd")) == n
        regathers = (2 * r["layers"] + 1) if sequence_parallel else 0  # stock SP gathers column inputs again
        assert len(large_outside(stock["records"], "bwd")) == n + regathers
        # enabled: as many calls through the communicator as the model has TP collectives ...
        assert enabled["stats"]["fwd"]["calls"] == n and enabled["stats"]["bwd"]["calls"] == n
        # ... and no large collective on the TP ranks outside it (the cross entropy's stay stock and small)
        assert large_outside(enabled["records"]) == []
        assert any(rec[3] and not rec[4] for rec in enabled["records"])  # the cross entropy's, stock


@needs_megatron
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_disable_restores_stock_megatron(sequence_parallel):
    for r in compare("fp4quant", sequence_parallel):
        assert r["restored"] and not r["still_enabled"]
        stock, again = r["stock"], r["again"]
        assert torch.equal(again["loss"], stock["loss"])
        for name, g in stock["grads"].items():
            assert torch.equal(again["grads"][name], g), name
        assert again["stats"]["fwd"]["calls"] == again["stats"]["bwd"]["calls"] == 0


@needs_megatron
def test_other_layer_paths_and_views_are_stock_bit_for_bit():
    """Column-parallel gather_output, row-parallel input split, a frozen weight, reductions of views."""
    for r in run_ranks("integrations.megatron_jobs:layer_paths", 2, timeout=150):
        for name, s in r["stock"].items():
            e = r["enabled"][name]
            assert torch.equal(e["y"], s["y"]) and torch.equal(e["dx"], s["dx"]), name
            for a, b in zip(e["dw"], s["dw"]):
                assert (a is None and b is None) or torch.equal(a, b), name
        for name, (y, g, true) in r["stock_views"].items():
            ey, eg, _ = r["enabled_views"][name]
            assert torch.equal(ey, true) and torch.equal(eg, g), name
            # Megatron-Core 0.16.1 reduces a contiguous copy of a non-contiguous input and returns
            # the input itself, unreduced; fp4quant returns the reduction
            assert torch.equal(y, true) == (name != "transpose"), name
        assert r["calls"] == {"fwd": 1 + 1 + 4, "bwd": 1 + 1 + 1}


def te_stand_in(module: str, name: str) -> type:
    """A class that says where it comes from as Transformer Engine's classes do (TE is not needed)."""
    return type(name, (torch.nn.Linear,), {"__module__": module})


@pytest.mark.parametrize("module,name", [
    ("megatron.core.extensions.transformer_engine", "TELayerNormColumnParallelLinear"),  # Megatron's TE wrappers
    ("transformer_engine.pytorch.module.linear", "Linear"),  # TE's own
])
def test_transformer_engine_layers_are_refused_in_one_line(module, name):
    te = te_stand_in(module, name)
    subclass = type("MyTELinear", (te,), {})  # a subclass of a TE class is TE's too
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), te(4, 4), torch.nn.Sequential(subclass(4, 4), te(4, 4)))
    with pytest.raises(fp4_megatron.UnsupportedLayers) as e:
        fp4_megatron.check(model)
    message = str(e.value)
    assert "\n" not in message and name in message and "MyTELinear" in message and "Transformer Engine" in message
    assert "2.0" in message and "2.1" in message  # where: the modules' names in the model
    with pytest.raises(fp4_megatron.UnsupportedLayers):
        fp4_megatron.enable("fp4quant", model=[model])  # refused before anything is rebound
    assert not fp4_megatron.enabled()
    fp4_megatron.check(torch.nn.Sequential(torch.nn.Linear(4, 4)))  # no TE: nothing to say


@needs_megatron
@pytest.mark.slow
def test_example_trains_and_reports_bytes():
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "examples/megatron_tp_train.py", "--steps", "3", "--sequence-parallel"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    steps, stats = lines[:-1], lines[-1]
    assert [r["step"] for r in steps] == [0, 1, 2] and all(r["loss"] > 0 for r in steps)
    for d in ("fwd", "bwd"):
        assert stats[d]["calls"] == 3 * expected_calls(2, True)
        assert stats[d]["bytes_sent"] < 0.4 * stats[d]["bytes_uncompressed"], (d, stats[d])
