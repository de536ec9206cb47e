"""An emulated multi-node cluster on one Linux machine: one network namespace per node.

Each node is a namespace with a veth link to a shared bridge in the root namespace, and
``tc`` shapes each link's bandwidth in both directions (a token bucket, ``tbf``, on the
node's end and on the bridge's end) and, where the kernel has ``netem``, its latency.
Processes started in a node's namespace reach the others only across these links, so
gloo traffic between nodes crosses a constrained link while traffic inside a node stays
on its loopback.

Everything created carries the prefix ``fq<pid>``, the process id of its owner, and is
removed on exit -- normal, exception, SIGINT/SIGTERM, or atexit -- together with every
process started inside.  Every job runs under a guard (:mod:`.guard`) that kills it when the
owner dies, even by SIGKILL; ``cleanup_stale()`` then removes the namespaces and links such
an owner left behind, and only those: never a live emulation's.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from .guard import Lifeline, stop, wait_all

PREFIX = "fq"
SUBNET = "10.213"
# fq<owner pid> + n<i> (namespace), h<i> (host end of a link), br (bridge); probes: fqprobe<pid>, fqnem<pid>
OWNED_NAME = re.compile(rf"^{PREFIX}(?:(\d+)(?:n\d+|h\d+|br)|(?:probe|nem)(\d+))$")


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def unavailable_reason() -> str | None:
    """Why an emulated cluster cannot be built here (None: it can).  FP4QUANT_NO_CLUSTER=1
    says no, to run on loopback on purpose."""
    if os.environ.get("FP4QUANT_NO_CLUSTER") == "1":
        return "disabled by FP4QUANT_NO_CLUSTER=1"
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2 ({tool} not found)"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode:
        return f"cannot create network namespaces: {r.stderr.strip()}"
    _run("ip", "netns", "delete", probe, check=False)
    return None


def kernel_has_netem() -> bool:
    """Whether tc can add netem (latency) qdiscs: probed on a throwaway dummy link."""
    name = f"{PREFIX}nem{os.getpid()}"
    if _run("ip", "link", "add", name, "type", "dummy", check=False).returncode:
        return False
    try:
        return _run("tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms", check=False).returncode == 0
    finally:
        _run("ip", "link", "delete", name, check=False)


TBF_HZ = 250  # tbf needs a bucket of >= rate / HZ (the kernel's timer tick) to sustain its rate
FRAME_BYTES = 1514  # one full Ethernet frame (MTU 1500): a smaller bucket never lets one through


@dataclass(frozen=True)
class LinkSpec:
    """One node's link to the switch: a rate (bits/s) and a one-way latency (seconds).

    The token bucket's depth is the credit an idle link accrues and then sends at once,
    for free: it scales with the rate (``rate x burst_s``, the least tbf sustains the rate
    with), so it lasts the same time at every rate -- 4 ms of the emulated link, which a
    time dilation of ~6650 makes 0.6 us of the target's -- instead of a fixed 1 Mbit that
    let ~40% of a compressed training message through free."""

    rate_bps: float
    latency_s: float = 0.0
    burst_s: float = 1 / TBF_HZ  # seconds of traffic at the rate the bucket holds

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_bps) and self.rate_bps > 0):
            raise ValueError(f"link rate must be a positive number of bits/s, got {self.rate_bps}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"link latency must be >= 0 seconds, got {self.latency_s}")
        if not (math.isfinite(self.burst_s) and self.burst_s >= 1 / TBF_HZ):
            raise ValueError(f"link burst must be >= 1/{TBF_HZ} s of traffic (tbf sustains its rate no lower), "
                             f"got {self.burst_s}")

    @property
    def burst_bytes(self) -> int:
        return max(FRAME_BYTES, math.ceil(self.rate_bps / 8 * self.burst_s))

    def tbf_args(self) -> list[str]:
        return ["tbf", "rate", f"{int(self.rate_bps)}bit", "burst", f"{self.burst_bytes}b", "latency", "50ms"]


@dataclass
class Node:
    index: int
    netns: str
    address: str
    ifname: str


@dataclass
class EmulatedCluster:
    """``with EmulatedCluster(2, LinkSpec(20e6)) as c: c.popen(0, [...])``  (one at a time per process:
    its names carry the owner's process id)."""

    nodes: int
    link: LinkSpec
    tag: str = field(default_factory=lambda: str(os.getpid()))
    members: list[Node] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    latency_shaped: bool = False
    lifeline: Lifeline | None = None

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    def __enter__(self) -> EmulatedCluster:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"emulated cluster unavailable: {reason}")
        if not 1 <= self.nodes <= 250:
            raise ValueError(f"nodes must be in 1..250, got {self.nodes}")
        self._install_handlers()
        self.lifeline = Lifeline()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- building and tearing down ---------------------------------------------------

    def _create(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        self.latency_shaped = self.link.latency_s > 0 and kernel_has_netem()
        for i in range(self.nodes):
            node = Node(i, f"{PREFIX}{self.tag}n{i}", f"{SUBNET}.{int(self.tag) % 250}.{i + 1}", f"{PREFIX}{i}")
            self.members.append(node)
            host_end = f"{PREFIX}{self.tag}h{i}"
            _run("ip", "netns", "add", node.netns)
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", node.ifname, "netns", node.netns)
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            ns = ["ip", "-n", node.netns]
            _run(*ns, "addr", "add", f"{node.address}/24", "dev", node.ifname)
            _run(*ns, "link", "set", node.ifname, "up")
            _run(*ns, "link", "set", "lo", "up")
            # shape both directions of the link: the node's egress and the bridge's egress to it
            self._shape(["ip", "netns", "exec", node.netns], node.ifname)
            self._shape([], host_end)

    def _shape(self, prefix: list[str], dev: str) -> None:
        if self.latency_shaped:
            half = f"{self.link.latency_s * 1e3 / 2:.3f}ms"  # one-way latency, half on each end
            _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", half)
            _run(*prefix, "tc", "qdisc", "add", "dev", dev, "parent", "1:", "handle", "2:", *self.link.tbf_args())
        else:
            _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", *self.link.tbf_args())

    def close(self) -> None:
        """Stop every process started in the cluster, then remove namespaces, links and bridge."""
        if self.lifeline is not None:
            self.lifeline.cut()  # every guard now kills its job
            self.lifeline = None
        stop(self.processes)
        for node in self.members:
            _kill_namespace_processes(node.netns)
            _run("ip", "netns", "delete", node.netns, check=False)
            _run("ip", "link", "delete", f"{PREFIX}{self.tag}h{node.index}", check=False)
        _run("ip", "link", "delete", self.bridge, check=False)
        self.members.clear()
        self.processes.clear()

    def _install_handlers(self) -> None:
        atexit.register(self.close)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                self.close()
                if callable(previous):
                    previous(signum, frame)
                raise SystemExit(128 + signum)

            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread: atexit and __exit__ still clean up
                pass

    # ---- running ------------------------------------------------------------------------

    def popen(self, node: int, cmd: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside node ``node``'s namespace, under a guard that kills it (and
        everything it starts) when the cluster is closed or its owner dies."""
        n = self.members[node]
        full_env = {**os.environ, **(env or {}), "GLOO_SOCKET_IFNAME": n.ifname}
        p = self.lifeline.popen(["ip", "netns", "exec", n.netns, *cmd], env=full_env, **kwargs)
        self.processes.append(p)
        return p

    def run_all(self, cmds: list[list[str]], timeout: float | None = None, env: dict[str, str] | None = None,
                **kwargs) -> list[int | None]:
        """Run one command per node concurrently; return their exit codes (None: stopped because
        another node failed first).  Past ``timeout`` seconds every node is stopped and
        TimeoutError raised."""
        return wait_all([self.popen(i, cmd, env, **kwargs) for i, cmd in enumerate(cmds)], timeout)


def _kill_namespace_processes(netns: str) -> None:
    r = _run("ip", "netns", "pids", netns, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def owner_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_owner(name: str) -> bool:
    """Whether ``name`` is one of ours whose owner (the process id in it) is gone."""
    m = OWNED_NAME.match(name)
    return m is not None and not owner_alive(int(m.group(1) or m.group(2)))


def cleanup_stale() -> list[str]:
    """Remove the namespaces and links of emulations whose owner is dead (killed by SIGKILL,
    say); a live emulation's are never touched.  Returns the names removed."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if stale_owner(name):
            _kill_namespace_processes(name)
            _run("ip", "netns", "delete", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if stale_owner(name):
            _run("ip", "link", "delete", name, check=False)
            removed.append(name)
    return removed
