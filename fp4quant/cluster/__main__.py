"""`python -m fp4quant.cluster check|calibrate|run|cleanup` (see the package doc)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ..provenance import atomic_write_json, provenance
from .calibrate import calibrate
from .netns import EmulatedCluster, LinkSpec, cleanup_stale, kernel_has_netem, unavailable_reason


def torchrun(nnodes: int, nproc: int, rank: int | None, master: str | None, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if master is None:
        return [*cmd, "--standalone"]
    return [*cmd, "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master, "--master-port", str(port)]


def cmd_run(a, job: list[str]) -> int:
    if a.calibration:
        cal = json.loads(open(a.calibration).read())
        rate, latency = cal["link_rate_bps"], cal["link_latency_s"]
    else:
        cal, rate, latency = None, a.rate_mbit * 1e6, a.latency_ms / 1e3
    threads = str(a.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    reason = unavailable_reason()
    link = LinkSpec(rate, latency)
    record = {"nodes": a.nodes, "nproc_per_node": a.nproc_per_node, "link_rate_mbit": rate / 1e6,
              "link_latency_ms": latency * 1e3, "link_burst_bytes": link.burst_bytes, "calibration": cal}
    if reason:
        print(f"fp4quant.cluster: emulated cluster unavailable ({reason}); running on loopback instead",
              file=sys.stderr)
        if a.record:
            atomic_write_json(a.record, {**record, "emulated": False, "reason": reason, **_prov()})
        return subprocess.run(torchrun(1, a.nodes * a.nproc_per_node, None, None, a.port) + job,
                              env={**os.environ, **env}).returncode
    with EmulatedCluster(a.nodes, link) as cluster:
        master = cluster.members[0].address
        codes = cluster.run_all([torchrun(a.nodes, a.nproc_per_node, i, master, a.port) + job for i in range(a.nodes)],
                                timeout=a.timeout, env=env)
        if a.record:
            atomic_write_json(a.record, {**record, "emulated": True, "latency_shaped": cluster.latency_shaped,
                                         **_prov()})
    return next((c for c in codes if c), 0)


def _prov() -> dict:
    p = provenance()
    return {"hardware": p["hardware"], "commit": p["commit"], "torch": p["torch"]}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = []
    if "--" in argv:
        i = argv.index("--")
        argv, job = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(prog="python -m fp4quant.cluster", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="can an emulated cluster be built here?")
    sub.add_parser("cleanup", help="remove namespaces and links a killed run left behind")
    c = sub.add_parser("calibrate", help="measure this machine and choose the emulated link")
    c.add_argument("--model", default="tiny")
    c.add_argument("--seq-len", type=int, default=128)
    c.add_argument("--batch-size", type=int, default=2)
    c.add_argument("--tp", type=int, default=2)
    c.add_argument("--presets", nargs="+", default=["fp4quant", "no_fwht", "single_scale", "naive_pack"])
    c.add_argument("--out", required=True)
    r = sub.add_parser("run", help="run a torchrun job with one emulated node per --nodes (after --)")
    r.add_argument("--calibration", help="calibration JSON (its link); else --rate-mbit / --latency-ms")
    r.add_argument("--rate-mbit", type=float, default=100.0)
    r.add_argument("--latency-ms", type=float, default=0.0)
    r.add_argument("--nodes", type=int, default=2)
    r.add_argument("--nproc-per-node", type=int, default=1)
    r.add_argument("--threads", type=int, default=1, help="OMP threads per rank")
    r.add_argument("--port", type=int, default=29600)
    r.add_argument("--timeout", type=float, default=None)
    r.add_argument("--record", help="write what the job ran on (emulated or loopback, link) to this JSON")
    a = ap.parse_args(argv)
    if a.command == "check":
        reason = unavailable_reason()
        print("emulated cluster: " + ("available" if reason is None else f"unavailable: {reason}")
              + ("" if reason else f"; latency shaping (netem): {'yes' if kernel_has_netem() else 'no'}"))
        return 0 if reason is None else 1
    if a.command == "cleanup":
        print("\n".join(cleanup_stale()) or "nothing to remove")
        return 0
    if a.command == "calibrate":
        cal = calibrate(a.model, a.seq_len, a.batch_size, a.tp, a.presets)
        d = cal.to_dict()
        atomic_write_json(a.out, {**d, "provenance": provenance()})
        print(f"rank FLOP/s {cal.rank_flops / 1e9:.1f} G -> emulated link {cal.link_rate_bps / 1e6:.1f} Mbit/s "
              f"(time dilation {cal.time_dilation:.0f}x)", file=sys.stderr)
        return 0
    if not job:
        ap.error("run needs the job after --, e.g. -- -m fp4quant.train ...")
    return cmd_run(a, job)


if __name__ == "__main__":
    sys.exit(main())
