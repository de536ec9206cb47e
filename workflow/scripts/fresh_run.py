"""Empty a training run's folder unless it holds a run of exactly this job.

    python workflow/scripts/fresh_run.py RUN_DIR KEY [INPUT...]

The trainer resumes from the last checkpoint in its --out folder, which is what a rerun after
an interruption wants.  But Snakemake also reruns a training job when its code, torch, machine,
arguments or inputs changed, and removes only the job's declared outputs: the trainer would then
resume the old run's checkpoints and report them under the new provenance.  So the folder keeps
the key of the job that started it (RUN_DIR/workflow_job.json: KEY and the SHA-256 of each
INPUT); a folder with another key, or none, is emptied first, and the run starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

KEY_FILE = "workflow_job.json"


def job_key(key: str, inputs: list[str]) -> dict:
    return {"key": key, "inputs": {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in inputs}}


def prepare(run_dir: Path, key: str, inputs: list[str]) -> bool:
    """Empty ``run_dir`` unless it holds a run of this job; return whether it was kept."""
    wanted = job_key(key, inputs)
    record = run_dir / KEY_FILE
    kept = record.exists() and json.loads(record.read_text()) == wanted
    if not kept and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, record)
    return kept


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: fresh_run.py RUN_DIR KEY [INPUT...]", file=sys.stderr)
        return 2
    kept = prepare(Path(argv[0]), argv[1], argv[2:])
    print(f"fresh_run: {argv[0]}: " + ("resuming the run it holds" if kept else "starting afresh"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
