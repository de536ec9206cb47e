"""Running the trainer as users do: in-process through its CLI, or under torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from distributed import REPO, free_port
from fp4quant.train.__main__ import main


def short(data, out, **kw):
    """TrainConfig keywords of a short tiny-model run."""
    base = dict(out=str(out), data=data, model="tiny", steps=6, seq_len=64, batch_size=2, checkpoint_every=100,
                eval_batches=1)
    return {**base, **kw}


def flags(**kw) -> list[str]:
    """Command-line flags of TrainConfig keywords."""
    out = []
    for k, v in kw.items():
        name = k.replace("_", "-")
        out += [f"--{name}" if v else f"--no-{name}"] if isinstance(v, bool) else [f"--{name}", str(v)]
    return out


def cli(capsys, **kw) -> tuple[int, str]:
    """``python -m fp4quant.train`` in this process: (exit status, stderr without progress bars)."""
    capsys.readouterr()
    status = main(flags(**kw))
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and not line.startswith("train ")]
    return status, "\n".join(lines)


def torchrun(args: list[str], nproc: int = 2, cwd=REPO, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(free_port()), "-m", "fp4quant.train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True, **popen)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once (torchrun's workers live in their own sessions)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
