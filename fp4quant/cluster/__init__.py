"""A scale model of a multi-node cluster on one machine (network namespaces + tc), and its calibration.

    python -m fp4quant.cluster check
    python -m fp4quant.cluster calibrate --out data/cpu/cluster/calibration.json
    python -m fp4quant.cluster run --calibration calibration.json --nodes 2 -- -m fp4quant.train ...

Every component is slowed by the calibration's time dilation: the link's rate (tc), its
token bucket (rate x 4 ms), its per-hop latency (netem where the kernel has it, else slept
by the ranks before each wire step) and the codec (each op stretched to the dilated target
codec's time); the ranks get the last two from the runner (fp4quant.comm.dilation).  With
``--record`` the run records them and a 4 KiB all-reduce's latency measured inside the
cluster, with and without the injected latency.
"""

from .calibrate import Calibration, TargetCluster, calibrate
from .netns import EmulatedCluster, LinkSpec, cleanup_stale, unavailable_reason

__all__ = ["Calibration", "EmulatedCluster", "LinkSpec", "TargetCluster", "calibrate", "cleanup_stale",
           "unavailable_reason"]
