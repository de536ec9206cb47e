"""`python -m fp4quant.cluster check|calibrate|run|cleanup` (see the package doc)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

from ..provenance import atomic_write_json, provenance
from .calibrate import calibrate
from .dilation import TARGET_VALUE_BYTES, Dilation
from .guard import Lifeline, wait_all
from .netns import EmulatedCluster, LinkSpec, cleanup_stale, kernel_has_netem, unavailable_reason
from .rank import variables


class UsageError(ValueError):
    """A bad argument of `run`: reported in one line."""


def torchrun(nnodes: int, nproc: int, rank: int | None, master: str | None, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if master is None:
        return [*cmd, "--standalone"]
    return [*cmd, "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master, "--master-port", str(port)]


def check_run_args(a) -> None:
    """Reject what tc or torchrun would misread (a negative rate becomes "18446744Tbit")."""
    if a.calibration is None:
        if not (math.isfinite(a.rate_mbit) and a.rate_mbit > 0):
            raise UsageError(f"--rate-mbit must be a positive number, got {a.rate_mbit:g}")
        if not (math.isfinite(a.latency_ms) and a.latency_ms >= 0):
            raise UsageError(f"--latency-ms must be >= 0, got {a.latency_ms:g}")
    if not 1 <= a.nodes <= 250:
        raise UsageError(f"--nodes must be in 1..250, got {a.nodes}")
    for flag, value in (("--nproc-per-node", a.nproc_per_node), ("--threads", a.threads)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not 1 <= a.port <= 65534:
        raise UsageError(f"--port must be in 1..65534 (the latency probe uses the next), got {a.port}")
    if a.codec_bps is not None and not (math.isfinite(a.codec_bps) and a.codec_bps >= 0):
        raise UsageError(f"--codec-bps must be a finite number >= 0 (0: off), got {a.codec_bps:g}")
    if a.timeout is not None and not a.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {a.timeout:g}")


def read_link(a) -> tuple[dict | None, LinkSpec]:
    """The link to emulate: the calibration's, or --rate-mbit / --latency-ms."""
    if not a.calibration:
        return None, LinkSpec(a.rate_mbit * 1e6, a.latency_ms / 1e3)
    try:
        cal = json.loads(open(a.calibration).read())
        return cal, LinkSpec(float(cal["link_rate_bps"]), float(cal["link_latency_s"]))
    except OSError as exc:
        raise UsageError(f"--calibration {a.calibration}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--calibration {a.calibration}: not a calibration ({type(exc).__name__}: {exc})") from None


def run_dilation(a, cal: dict | None, link: LinkSpec, latency_shaped: bool) -> Dilation:
    """What the ranks stretch besides the link: the link's latency where netem did not shape
    it, and the codec to the calibration's dilated target (or --codec-bps); none with --link-only."""
    if a.link_only:
        return Dilation()
    codec = a.codec_bps if a.codec_bps is not None else float((cal or {}).get("codec_bytes_per_s", 0.0))
    try:
        return Dilation(0.0 if latency_shaped else link.latency_s, codec)
    except ValueError as exc:
        raise UsageError(f"--calibration {a.calibration}: {exc}") from None


def rank_job(job: list[str]) -> list[str]:
    """The job as each rank runs it: through fp4quant.cluster.rank, which installs the dilation."""
    return ["-m", "fp4quant.cluster.rank", *job]


def dilation_record(d: Dilation, cal: dict | None, link: LinkSpec, latency_shaped: bool) -> dict:
    return {"time_dilation": (cal or {}).get("time_dilation"), "latency_shaped": latency_shaped,
            "latency_injected_s": d.latency_s, "codec_bytes_per_s": d.codec_bytes_per_s,
            "codec_target_value_bytes": TARGET_VALUE_BYTES, "link_burst_bytes": link.burst_bytes,
            "link_burst_s": link.burst_bytes * 8 / link.rate_bps}


def probe_latency(cluster: EmulatedCluster, a, env: dict[str, str]) -> dict:
    """A 4 KiB all-reduce timed inside the cluster, with and without the injected latency."""
    master = cluster.members[0].address
    with tempfile.TemporaryDirectory(prefix="fq-probe-") as tmp:
        out = os.path.join(tmp, "probe.json")
        probe = ["-m", "fp4quant.cluster.latency_probe", "--out", out]
        cmds = [torchrun(a.nodes, a.nproc_per_node, i, master, a.port + 1) + probe for i in range(a.nodes)]
        with open(os.path.join(tmp, "log"), "w+") as log:
            try:
                codes = cluster.run_all(cmds, timeout=300, env=env, stdout=log, stderr=subprocess.STDOUT)
            except TimeoutError:
                codes = ["timed out"]
            if any(codes) or not os.path.exists(out):
                log.seek(0)
                tail = log.read()[-300:].strip().replace("\n", " | ")
                return {"failed": f"exit codes {codes}: {tail}"}
        return json.loads(open(out).read())


def cmd_run(a, job: list[str]) -> int:
    check_run_args(a)
    cal, link = read_link(a)
    threads = str(a.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    reason = unavailable_reason()
    record = {"nodes": a.nodes, "nproc_per_node": a.nproc_per_node, "link_rate_mbit": link.rate_bps / 1e6,
              "link_latency_ms": link.latency_s * 1e3, "link_burst_bytes": link.burst_bytes, "calibration": cal}
    if reason:
        print(f"fp4quant.cluster: emulated cluster unavailable ({reason}); running on loopback instead",
              file=sys.stderr)
        if a.record:
            # on loopback nothing is dilated: not the link, so neither latency nor codec
            atomic_write_json(a.record, {**record, "emulated": False, "reason": reason, "dilation": None, **_prov()})
        lifeline = Lifeline()  # the job dies with this process, however it ends
        try:
            proc = lifeline.popen(torchrun(1, a.nodes * a.nproc_per_node, None, None, a.port) + job,
                                  env={**os.environ, **env})
            return wait_all([proc], a.timeout)[0] or 0
        finally:
            lifeline.cut()
    for name in cleanup_stale():
        print(f"fp4quant.cluster: removed {name}, left behind by a run that was killed", file=sys.stderr)
    with EmulatedCluster(a.nodes, link) as cluster:
        dilation = run_dilation(a, cal, link, cluster.latency_shaped)
        env.update(variables(dilation))
        record["dilation"] = dilation_record(dilation, cal, link, cluster.latency_shaped)
        added = dilation.latency_s + (link.latency_s if cluster.latency_shaped else 0.0)
        if a.record and added == 0:
            # the probe measures the latency the runner adds; without any it would cost a second
            # launch (~7 s on the 2-core VM) to time the link's own round trip
            record["measured_latency_s"] = {"skipped": "no latency added (neither injected nor shaped)"}
        elif a.record:
            record["measured_latency_s"] = probe = probe_latency(cluster, a, env)
            if "failed" in probe:
                print(f"fp4quant.cluster: the latency probe failed ({probe['failed']}); running the job",
                      file=sys.stderr)
        if a.record:  # before the job, as on loopback: a job that fails or times out keeps its record
            atomic_write_json(a.record, {**record, "emulated": True, "latency_shaped": cluster.latency_shaped,
                                         **_prov()})
        master = cluster.members[0].address
        codes = cluster.run_all([torchrun(a.nodes, a.nproc_per_node, i, master, a.port) + rank_job(job)
                                 for i in range(a.nodes)],
                                timeout=a.timeout, env=env)
    failed = next((i for i, c in enumerate(codes) if c), None)
    if failed is None:
        return 0
    if None in codes:
        stopped = ", ".join(str(i) for i, c in enumerate(codes) if c is None)
        print(f"fp4quant.cluster: node {failed} failed (exit {codes[failed]}); stopped node(s) {stopped}",
              file=sys.stderr)
    return codes[failed]


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
    sub.add_parser("cleanup", help="remove the namespaces and links of runs whose owner process is dead "
                                 "(killed by SIGKILL, say); a live run's are never touched")
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
    r.add_argument("--timeout", type=float, default=None, help="seconds; past it every node is stopped (exit 124)")
    r.add_argument("--record", help="write what the job ran on (emulated or loopback, link, dilation, and the "
                                  "latency of a 4 KiB all-reduce measured in the cluster first, where the runner "
                                  "adds latency) to this JSON")
    r.add_argument("--codec-bps", type=float, default=None,
                   help="the dilated target codec's bytes/s the ranks stretch each codec op to (0: off; "
                        "default: the calibration's codec_bytes_per_s, else off)")
    r.add_argument("--link-only", action="store_true",
                   help="dilate the link alone: no latency slept per wire step, no codec stretch (for comparison)")
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
        from ..format.config import QuantConfig
        from ..models.model_config import ModelConfig

        try:  # before the measurement (a minute), not after it
            if min(a.tp, a.seq_len, a.batch_size) < 1:
                raise ValueError(f"--tp {a.tp}, --seq-len {a.seq_len}, --batch-size {a.batch_size}: each at least 1")
            ModelConfig.preset(a.model).check_tp(a.tp)
            for preset in a.presets:
                QuantConfig.preset(preset)
        except ValueError as exc:
            ap.error(f"calibrate: {exc}")
        cal = calibrate(a.model, a.seq_len, a.batch_size, a.tp, a.presets)
        d = cal.to_dict()
        atomic_write_json(a.out, {**d, "provenance": provenance()})
        print(f"rank FLOP/s {cal.rank_flops / 1e9:.1f} G -> emulated link {cal.link_rate_bps / 1e6:.1f} Mbit/s "
              f"(time dilation {cal.time_dilation:.0f}x)", file=sys.stderr)
        return 0
    if not job:
        ap.error("run needs the job after --, e.g. -- -m fp4quant.train ...")
    try:
        return cmd_run(a, job)
    except UsageError as exc:
        print(f"fp4quant.cluster: error: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"fp4quant.cluster: error: --timeout: {exc}", file=sys.stderr)
        return 124


if __name__ == "__main__":
    sys.exit(main())
