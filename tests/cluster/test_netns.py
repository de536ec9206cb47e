"""The emulated cluster: isolation, shaping, and cleanup whatever happens."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from _netns_helpers import leftovers, needs_cluster

from fp4quant.cluster import EmulatedCluster, LinkSpec, cleanup_stale
from fp4quant.cluster.__main__ import main as cluster_main

# the receiver times the transfer (a sender's sendall returns once the kernel has buffered it)
SERVER = "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 29700)); s.listen(); c,_=s.accept(); n=0\n" \
         "b=c.recv(1<<20); t=time.time(); n=len(b)\n" \
         "while True:\n    b=c.recv(1<<20)\n    if not b: break\n    n+=len(b)\nprint(n, time.time()-t)"
# the client retries until the server listens (a fixed head start loses the race on a loaded machine)
CLIENT = "import socket,sys,time\ndeadline=time.monotonic()+30\nwhile True:\n    try:\n" \
         "        c=socket.create_connection((sys.argv[1], 29700)); break\n    except ConnectionRefusedError:\n" \
         "        if time.monotonic()>deadline: raise\n        time.sleep(0.05)\n" \
         "c.sendall(b'x'*int(sys.argv[2])); c.close()"


@needs_cluster
def test_nodes_talk_across_a_shaped_link_and_everything_is_removed():
    with EmulatedCluster(2, LinkSpec(rate_bps=16e6)) as c:
        tag = c.tag
        assert len(leftovers(tag)) >= 4  # 2 namespaces, 2 host ends, the bridge
        server = c.popen(1, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        client = c.popen(0, [sys.executable, "-c", CLIENT, c.members[1].address, str(2 << 20)])
        assert client.wait(timeout=60) == 0
        received, seconds = server.communicate(timeout=60)[0].split()
        assert int(received) == 2 << 20
        seconds = float(seconds)
        # 16 Mbit/s is 2 MB/s: 2 MiB takes about a second (unshaped loopback: milliseconds)
        assert seconds > 0.5
        sleeper = c.popen(0, ["sleep", "1000"])
    assert sleeper.poll() is not None  # processes started inside are gone
    assert leftovers(tag) == []


@needs_cluster
def test_a_failing_node_stops_the_others_and_cleans_up():
    with EmulatedCluster(2, LinkSpec(rate_bps=100e6)) as c:
        tag = c.tag
        codes = c.run_all([["sleep", "1000"], [sys.executable, "-c", "import sys; sys.exit(3)"]], timeout=60)
    assert codes[1] == 3 and codes[0] != 0
    assert leftovers(tag) == []


@needs_cluster
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_removes_namespaces_links_and_processes(sig, tmp_path):
    marker = tmp_path / "ready.json"
    script = textwrap.dedent(f"""
        import json, time
        from fp4quant.cluster import EmulatedCluster, LinkSpec
        with EmulatedCluster(2, LinkSpec(50e6)) as c:
            p = c.popen(1, ["sleep", "1000"])
            open({str(marker)!r}, "w").write(json.dumps({{"tag": c.tag, "pid": p.pid}}))
            time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    info = json.loads(marker.read_text())
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert leftovers(info["tag"]) == []
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)


@needs_cluster
def test_sigkill_leftovers_are_removed_by_cleanup_stale(tmp_path):
    marker = tmp_path / "tag"
    script = f"""
import time
from fp4quant.cluster import EmulatedCluster, LinkSpec
c = EmulatedCluster(2, LinkSpec(50e6)).__enter__()
open({str(marker)!r}, "w").write(c.tag)
time.sleep(1000)
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    tag = marker.read_text()
    proc.kill()  # no handler runs
    proc.wait()
    assert leftovers(tag)
    removed = cleanup_stale()
    assert any(tag in r for r in removed)
    assert leftovers(tag) == []


def test_unavailable_cluster_falls_back_to_loopback_in_one_line(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("FP4QUANT_NO_CLUSTER", "1")
    record = tmp_path / "rec.json"
    job = tmp_path / "job.py"
    job.write_text("import os, torch.distributed as d\nd.init_process_group('gloo')\nd.barrier()\nos._exit(0)\n")
    code = cluster_main(["run", "--rate-mbit", "50", "--nodes", "2", "--record", str(record), "--", str(job)])
    assert code == 0
    err = capfd.readouterr().err
    assert "emulated cluster unavailable (disabled by FP4QUANT_NO_CLUSTER=1); running on loopback" in err
    rec = json.loads(record.read_text())
    assert rec["emulated"] is False and "FP4QUANT_NO_CLUSTER" in rec["reason"] and rec["hardware"]
    assert rec["dilation"] is None  # on loopback nothing is dilated, the link included


def test_link_spec_burst_scales_with_the_rate():
    """The bucket holds the same 4 ms (1/HZ) of traffic at every rate, and at least one frame."""
    for rate in (60e6, 10e9):
        args = LinkSpec(rate_bps=rate).tbf_args()
        burst = int(args[args.index("burst") + 1].rstrip("b"))
        assert burst == LinkSpec(rate).burst_bytes == math.ceil(rate / 8 / 250)
    assert LinkSpec(1e5).burst_bytes == 1514  # 50 bytes of 4 ms: one frame must fit
    assert LinkSpec(60e6, burst_s=0.1).burst_bytes == 750_000
    with pytest.raises(ValueError, match="burst"):
        LinkSpec(60e6, burst_s=1e-3)
