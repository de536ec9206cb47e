"""Start a distributed job the way the configuration's launcher says, and wait for it.

    python workflow/scripts/launch.py --kind torchrun --nproc-per-node 2 -- -m fp4quant.train ...

torchrun   one node: torchrun --standalone --nproc-per-node P
srun       inside a SLURM allocation (the workflow's SLURM profile): one srun task per node,
           each running torchrun --nnodes N with a c10d rendezvous on the first node
nodelist   plain torchrun over ssh on each of --nodes (the first is the rendezvous host)

Each rank gets the job's cores divided among the node's ranks as its thread count
(OMP/MKL/OpenBLAS): Snakemake exports a rule's ``threads`` as OMP_NUM_THREADS and torchrun
keeps an inherited value, so otherwise every rank would start as many threads as the whole
job has cores, oversubscribing them (2 ranks x 2 threads on 2 cores halved the CPU run's
tokens/s).  The exit status is the job's; on failure or interruption every started
process is stopped, and each command runs under the emulated cluster's guard
(fp4quant/cluster/guard.py), so that even a ``kill -9`` of this launcher stops torchrun and
its workers instead of leaving them training into the run folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

# the guard by path: standard library only, nothing of the package (nor torch) to import
_spec = importlib.util.spec_from_file_location(
    "fp4quant_guard", Path(__file__).resolve().parents[2] / "fp4quant" / "cluster" / "guard.py")
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)


def torchrun(nnodes: int, nproc: int, endpoint: str | None, job_id: str, node_rank: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nnodes == 1 and endpoint is None:
        return [*cmd, "--standalone"]
    cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job_id]
    if node_rank is not None:
        cmd += ["--node-rank", str(node_rank)]
    return cmd


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def rank_threads(nproc_per_node: int, env: dict[str, str]) -> dict[str, str]:
    """Thread variables for each rank: the job's cores (OMP_NUM_THREADS as Snakemake sets it,
    else the cores this process may run on) over the node's ranks, at least one."""
    inherited = env.get("OMP_NUM_THREADS", "")
    cores = int(inherited) if inherited.isdigit() and int(inherited) > 0 else len(os.sched_getaffinity(0))
    return dict.fromkeys(THREAD_VARIABLES, str(max(1, cores // nproc_per_node)))


def commands(a, job: list[str]) -> list[list[str]]:
    if a.kind == "torchrun":
        return [torchrun(1, a.nproc_per_node, None, "local") + job]
    if a.kind == "srun":
        if "SLURM_JOB_ID" not in os.environ:
            raise SystemExit("launch.py: --kind srun needs a SLURM allocation (run the workflow with its SLURM profile)")
        head = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                              capture_output=True, text=True, check=True).stdout.split()[0]
        inner = torchrun(a.nnodes, a.nproc_per_node, f"{head}:{a.port}", os.environ["SLURM_JOB_ID"]) + job
        return [["srun", "--nodes", str(a.nnodes), "--ntasks-per-node", "1", "--kill-on-bad-exit=1", *inner]]
    if not a.nodes:
        raise SystemExit("launch.py: --kind nodelist needs --nodes")
    endpoint = f"{a.nodes[0]}:{a.port}"
    cwd = os.getcwd()
    out = []
    for rank, node in enumerate(a.nodes):
        remote = torchrun(len(a.nodes), a.nproc_per_node, endpoint, "fp4quant", rank) + job
        # "--": a node is a host, never an option of ssh; the remote shell gets quoted words
        out.append(["ssh", "--", node, f"cd {shlex.quote(cwd)} && " + shlex.join(remote)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["torchrun", "srun", "nodelist"], required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--nodes", nargs="*", default=[])
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("job", nargs=argparse.REMAINDER, help="after --: the module and its arguments")
    a = ap.parse_args()
    job = a.job[1:] if a.job[:1] == ["--"] else a.job
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # Snakemake stops jobs with SIGTERM
    if a.nproc_per_node < 1:
        raise SystemExit(f"launch.py: --nproc-per-node must be at least 1, got {a.nproc_per_node}")
    env = {**os.environ, **rank_threads(a.nproc_per_node, dict(os.environ))}
    lifeline = guard.Lifeline()  # its end closes when this process dies, however: the guards then stop the jobs
    procs = [lifeline.popen(cmd, env=env) for cmd in commands(a, job)]
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        guard.stop(procs)
        raise
    finally:
        lifeline.cut()
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
