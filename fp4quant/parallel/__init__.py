"""Tensor parallelism (Megatron-style) whose communication goes through fp4quant.comm.

mesh          the world as DP x TP process groups
communicator  TPCommunicator: owns both directions of TP traffic (forward activations,
              backward input gradients), each resolved once to a Route (the wire it
              sends, its stats key), and the random streams of its compressed calls
mappings      the conjugate autograd functions (copy/reduce, gather/scatter)
capture       TrafficCapture: the tensors that cross the wire at chosen steps, saved to a folder
compute       ComputeConfig, LinearCompute: the linear layers' GEMMs, exact or Quartet's FP4
layers        ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
              vocab_parallel_cross_entropy
"""

from .capture import TrafficCapture, load_captures
from .communicator import CommConfig, Route, TPCommunicator
from .compute import ComputeConfig, LinearCompute
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, vocab_parallel_cross_entropy
from .mesh import ParallelMesh, init_mesh

__all__ = [
    "ColumnParallelLinear",
    "CommConfig",
    "ComputeConfig",
    "LinearCompute",
    "ParallelMesh",
    "Route",
    "RowParallelLinear",
    "TPCommunicator",
    "TrafficCapture",
    "VocabParallelEmbedding",
    "init_mesh",
    "load_captures",
    "vocab_parallel_cross_entropy",
]
