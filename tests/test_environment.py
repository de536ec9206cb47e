"""The environment variables fp4quant reads: one table, shown in docs/environment.md and by
`python -m fp4quant.info`; none of them a behaviour switch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fp4quant import environment

REPO = Path(__file__).resolve().parents[1]
# set by the launcher (torchrun), the shell or Python itself, not fp4quant's to document
LAUNCHER = {"OMP_NUM_THREADS", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_ERROR_FILE",
            "TORCHELASTIC_RUN_ID", "PATH"}
READ = re.compile(r"""(?:environ\.get\(|environ\[|env\.get\(|getenv\()\s*["']([A-Z][A-Z0-9_]+)["']""")


def read_variables() -> dict[str, set[str]]:
    """Each variable the sources read -> the files that read it."""
    found: dict[str, set[str]] = {}
    files = [*REPO.glob("fp4quant/**/*.py"), *REPO.glob("scripts/*.py"), REPO / "setup.py",
             *REPO.glob("csrc/**/*.cpp"), *REPO.glob("csrc/**/*.h"), *REPO.glob("csrc/**/*.cu")]
    for path in files:
        for name in READ.findall(path.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_the_table_lists_every_variable_the_sources_read():
    table = {v.name for v in environment.VARIABLES}
    read = read_variables()
    missing = {name: files for name, files in read.items() if name not in table | LAUNCHER}
    assert not missing, f"read but not in fp4quant.environment.VARIABLES: {missing}"
    assert "FP4QUANT_CPU_ISA" in read and "FP4QUANT_BACKEND" in read  # the pattern sees C++ and Python
    unread = table - set(read) - {"MAX_JOBS", "FP4QUANT_TEST_BACKEND"}  # read by torch / by the tests
    assert not unread, f"in the table but read nowhere: {unread}"
    assert all(v.kind in environment.KINDS for v in environment.VARIABLES)


def test_no_behaviour_switch_is_an_environment_variable():
    """Validation and synchronized timing are config fields now, not variables read at import."""
    read = read_variables()
    for gone in ("FP4QUANT_VALIDATE", "FP4QUANT_COMM_TIMING"):
        assert gone not in read
    # "cluster": set by the emulated cluster's runner for its ranks, they stretch time, never a value
    assert {v.kind for v in environment.VARIABLES} <= {"install", "build", "provenance", "debug", "tests", "cluster"}
    assert all(v.meaning.startswith("set by `python -m fp4quant.cluster run`") for v in environment.VARIABLES
               if v.kind == "cluster")


def test_the_docs_show_the_table():
    assert environment.markdown_table() in (REPO / "docs" / "environment.md").read_text()


def test_info_prints_each_variable_with_its_value():
    out = subprocess.run([sys.executable, "-m", "fp4quant.info"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "FP4QUANT_NO_CLUSTER": "1", "PYTHONPATH": str(REPO)}).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()}
    for v in environment.VARIABLES:
        assert v.name in lines, v.name
    assert "'1'" in lines["FP4QUANT_NO_CLUSTER"] and "(unset)" in lines["FP4QUANT_CPU_ISA"]
