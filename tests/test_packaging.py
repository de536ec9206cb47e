"""The library installs alone: its declared dependencies are what the core imports, and
`import fp4quant` (the codec, the collectives, the TP styles) loads nothing of the artifact's
tools (pandas, seaborn, snakemake, matplotlib, yaml) or of Hugging Face."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

from distributed import REPO

ARTIFACT_ONLY = ("pandas", "seaborn", "snakemake", "matplotlib", "yaml", "transformers", "safetensors", "scipy",
                 "torchao", "megatron")


def test_the_library_imports_nothing_of_the_artifact():
    code = ("import json, sys\n"
            "import fp4quant, fp4quant.comm, fp4quant.parallel, fp4quant.models, fp4quant.train.loop\n"
            "import fp4quant.integrations.megatron\n"  # Megatron on enable() only
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert not loaded & set(ARTIFACT_ONLY), sorted(loaded & set(ARTIFACT_ONLY))


def test_the_core_dependencies_leave_the_artifact_to_extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert "torch" in core and not core & set(ARTIFACT_ONLY), core
    extras = project["optional-dependencies"]
    assert {"artifact", "hf", "test", "dev", "megatron", "torchtitan"} <= set(extras)
    assert any(d.startswith("snakemake") for d in extras["artifact"])
    assert any(d.startswith("transformers") for d in extras["hf"])
