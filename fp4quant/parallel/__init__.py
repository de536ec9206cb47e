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
styles        CompressedColwiseParallel, CompressedRowwiseParallel, CompressedSequenceParallel,
              CompressedPrepareModuleInput (a block's input, prepared once for its column-parallel
              layers): the same traffic through PyTorch's parallelize_module (anyone's model)
hf_plan       tp_plan(model): the compressed plan of a Hugging Face Qwen2 / Llama model, block
              inputs prepared once (2 compressed reductions per decoder layer each way)
"""

from .capture import TrafficCapture, load_captures
from .communicator import CommConfig, Route, TPCommunicator
from .compute import ComputeConfig, LinearCompute
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, vocab_parallel_cross_entropy
from .hf_plan import register_transformers_styles, tp_plan
from .mesh import ParallelMesh, init_mesh
from .styles import (
    CompressedColwiseParallel,
    CompressedPrepareModuleInput,
    CompressedRowwiseParallel,
    CompressedSequenceParallel,
    start_step,
)

__all__ = [
    "ColumnParallelLinear",
    "CommConfig",
    "CompressedColwiseParallel",
    "CompressedPrepareModuleInput",
    "CompressedRowwiseParallel",
    "CompressedSequenceParallel",
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
    "register_transformers_styles",
    "start_step",
    "tp_plan",
    "vocab_parallel_cross_entropy",
]
