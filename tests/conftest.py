"""Shared fixtures of the test suite (plain helpers live in helpers.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from fp4quant import toolchain
from helpers import cuda_verdict, obey

# What fp4quant.toolchain reads from nvidia-smi, for a machine with one GPU: `-L`, the
# driver/compute-capability query and the banner with the driver's CUDA version.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  -L) echo "GPU 0: {name} (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  --query-gpu=*) echo "{driver}, {cap}" ;;
  "") echo "| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}     |" ;;
esac
"""


# The longest test files, longest first (`--durations=0` of a whole run on two workers): they start
# first, so that on `make test`'s workers (one file to a worker at a time, in this order) no long
# file is left running alone at the end.
LONGEST_FIRST = ["workflow/test_whole_pipeline.py", "toolchain/test_cuda_build.py", "ops/test_cuda.py",
                 "ops/test_native.py", "train/test_simulate.py", "train/test_train.py", "analysis/test_paper.py"]


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    rank = {str(tests / name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def scratch_tempdir(tmp_path_factory):
    """The temp folder of the tests and of every process they start (torchrun's torchelastic_* log
    folders, wandb's media and artifact folders made at import and left by ranks that exit hard)
    is one under pytest's own, which pytest prunes: a run leaves nothing in /tmp."""
    folder = tmp_path_factory.mktemp("tempdir")
    patch = pytest.MonkeyPatch()
    patch.setenv("TMPDIR", str(folder))
    patch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    patch.undo()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """fake_gpu(driver=, cuda=, name=, cap=) puts an nvidia-smi that lists such a GPU first on
    PATH (here and in subprocesses) and returns that PATH."""

    def install(driver: str = "580.65.06", cuda: str = "13.0", name: str = "NVIDIA H100 80GB HBM3",
                cap: str = "9.0") -> str:
        folder = tmp_path / "fake-gpu-bin"
        folder.mkdir(exist_ok=True)
        smi = folder / "nvidia-smi"
        smi.write_text(FAKE_NVIDIA_SMI.format(driver=driver, cuda=cuda, name=name, cap=cap))
        smi.chmod(0o755)
        path = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
        monkeypatch.setenv("PATH", path)
        return path

    return install


@pytest.fixture(scope="session")
def cuda_machine():
    """Tests that need torch on a GPU: skipped without a GPU, failed where a GPU is unusable."""
    obey(cuda_verdict(toolchain.nvidia_gpus(), torch.cuda.is_available()))
