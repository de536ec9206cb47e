"""The package's layers: each imports only from the layers below it, and never another
layer's private names.  format + reference -> ops -> comm -> parallel -> models -> train,
cluster -> bench, perfmodel, analysis, info; a few base modules (provenance, threads,
environment, toolchain, data) sit under everything that uses them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fp4quant"
ROOT = "fp4quant"  # names of the package root (quantize, __version__, ...)

BASE = {"provenance", "threads", "environment", "toolchain"}
ALLOWED: dict[str, set[str]] = {
    "format": set(),
    "provenance": {ROOT},
    "threads": set(),
    "environment": set(),
    "toolchain": set(),
    "data": {"provenance"},
    "reference": {"format"},
    "ops": {"format", "reference", "_C"},
    "comm": {"format", "ops", "reference", "provenance"},
    # reference: Quartet's pseudo-quantized GEMMs (parallel.compute); provenance: traffic captures (parallel.capture)
    "parallel": {"comm", "format", "reference", "provenance"},
    "models": {"parallel", "comm", "format"},
    "train": {"models", "parallel", "comm", "format", "ops", "data"} | BASE,
    # adapters of the TP communicator to other frameworks' layers (Megatron-Core, torchtitan)
    "integrations": {"parallel", "comm", "format"},
    "cluster": {"models", "parallel", "comm", "format", "ops"} | BASE,
    # a comm benchmark measures the collectives alone: no trainer, models or data behind it;
    # parallel: bench.traffic reads the captured TP traffic (parallel.capture's files)
    "bench": {"comm", "ops", "reference", "format", "parallel", ROOT} | BASE,
    # comm, ops, parallel: perfmodel.probe times the codec, the link and a rank's shard on the ranks a validation run uses
    "perfmodel": {"cluster", "models", "format", "comm", "ops", "parallel"} | BASE,
    # the study's summary: run names (train.train_config), bits per value (format), parameter counts
    # (models) and the projected speedup (perfmodel) of each configuration it compares
    "analysis": {"train", "perfmodel", "models", "format"} | BASE,
    "info": {"ops", ROOT} | BASE,
    "__init__": {"ops", "format", "reference"},
    "__main__": {"info"},
}


def layer_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path):
    """(target layer, imported name) for each import of another fp4quant module in ``path``."""
    rel = path.relative_to(PACKAGE)
    here = list(rel.parent.parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            module = base + (node.module.split(".") if node.module else [])
            if module:
                yield module[0], ".".join(module[1:]), [a.name for a in node.names]
            else:  # from .. import x: x is a layer, or a name of the package root
                for a in node.names:
                    is_layer = a.name == "_C" or (PACKAGE / a.name).is_dir() or (PACKAGE / f"{a.name}.py").exists()
                    yield (a.name if is_layer else ROOT), "", [a.name]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fp4quant."):
            parts = node.module.split(".")[1:]
            yield parts[0], ".".join(parts[1:]), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fp4quant."):
                    parts = a.name.split(".")[1:]
                    yield parts[0], ".".join(parts[1:]), []


def private_attributes(path: Path, layer: str):
    """``alias._name`` where alias is another layer's module imported into ``path``."""
    tree = ast.parse(path.read_text())
    aliases = set()
    for target, _, names in imports(path):
        if target != layer and target != ROOT:
            aliases |= {n for n in names if (PACKAGE / target / f"{n}.py").exists()}
            aliases.add(target)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                yield f"{node.value.id}.{node.attr}"


def test_every_layer_imports_only_below_it():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        assert layer in ALLOWED, f"{path}: layer {layer!r} has no place in the layering (add it to ALLOWED)"
        for target, module, names in imports(path):
            if target == layer:
                continue
            if target not in ALLOWED[layer]:
                problems.append(f"{path.relative_to(PACKAGE)}: {layer} imports {target}")
            private = [p for p in module.split(".") + names if p.startswith("_") and not p.startswith("__")]
            if target not in (ROOT, "_C") and private:
                problems.append(f"{path.relative_to(PACKAGE)}: {layer} imports {target}'s private {private}")
        problems += [f"{path.relative_to(PACKAGE)}: uses {a} of another layer" for a in private_attributes(path, layer)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_what_the_layering_forbids(tmp_path):
    """A benchmark that loads the trainer, or reaches into comm's privates, fails the check."""
    pkg = tmp_path / "fp4quant"
    (pkg / "bench").mkdir(parents=True)
    (pkg / "train").mkdir()
    (pkg / "comm").mkdir()
    (pkg / "comm" / "plan.py").write_text("")
    bad = pkg / "bench" / "x.py"
    bad.write_text("from ..train.loop import pin_threads\nfrom ..comm import plan\nplan._CALLS.clear()\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        found = list(imports(bad))
        assert ("train", "loop", ["pin_threads"]) in found
        assert "train" not in ALLOWED["bench"]
        assert list(private_attributes(bad, "bench")) == ["plan._CALLS"]
    finally:
        PACKAGE = saved


CORE = ("format", "reference", "ops", "comm", "parallel")  # the library: nothing of the lab below or beside it
LAB = ("cluster", "perfmodel", "bench", "analysis")


def test_the_core_knows_nothing_of_emulation_and_never_sleeps():
    """The collectives' one seam is fp4quant.comm.hooks: the emulated cluster plugs in there,
    so no core module imports the lab's layers, and none sleeps (time is the hooks' business)."""
    problems = []
    for layer in CORE:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            rel = path.relative_to(PACKAGE)
            problems += [f"{rel}: imports {t}" for t, _, _ in imports(path) if t in LAB]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name == "sleep":
                        problems.append(f"{rel}:{node.lineno}: sleeps")
    assert not problems, "\n".join(problems)
