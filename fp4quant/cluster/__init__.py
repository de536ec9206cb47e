"""A scale model of a multi-node cluster on one machine (network namespaces + tc), and its calibration.

    python -m fp4quant.cluster check
    python -m fp4quant.cluster calibrate --out data/cpu/cluster/calibration.json
    python -m fp4quant.cluster run --calibration calibration.json --nodes 2 -- -m fp4quant.train ...
"""

from .calibrate import Calibration, TargetCluster, calibrate
from .netns import EmulatedCluster, LinkSpec, cleanup_stale, unavailable_reason

__all__ = ["Calibration", "EmulatedCluster", "LinkSpec", "TargetCluster", "calibrate", "cleanup_stale",
           "unavailable_reason"]
