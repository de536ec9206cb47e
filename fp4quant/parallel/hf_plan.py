"""Compressed TP plans for Hugging Face models (Qwen2, Llama), and transformers' style registry.

    model = Qwen2ForCausalLM(config)                       # or from_pretrained(...)
    parallelize_module(model, tp_mesh, tp_plan(model, comm="fp4quant"))

``tp_plan`` reads the names of the config's ``base_model_tp_plan`` (the decoder layers'
q/k/v/o and MLP projections: every TP reduction of the model) and gives each its
compressed style; embeddings, norms and the head stay replicated.  The attention
projections refuse a TP size that does not divide their heads.

Block-level inputs (Qwen2, Llama: BLOCK_INPUTS): the attention module's input
(input_layernorm's output, which q, k and v consume) and the MLP's (post_attention_layernorm's,
which gate and up consume) each get a CompressedPrepareModuleInput, so the column-parallel
projections take them prepared: one decoder layer sends 2 compressed all-reduces forward
(o_proj, down_proj) and 2 backward (the attention input's and the MLP input's gradients),
as Megatron and the project's own trainer do, not 5 backward (one per q, k, v, gate, up, as
per-projection plans, the stock DTensor ones included, send).  Another architecture, or
``block_inputs=False``, gets the per-projection plan: the same gradients, 2.5x the backward
traffic.

``register_transformers_styles()`` adds "fp4quant_colwise", "fp4quant_rowwise" and the block
inputs "fp4quant_attention_input" / "fp4quant_mlp_input" (for "layers.*.self_attn" /
"layers.*.mlp") to transformers' parallel-style registry (``transformers.distributed.parallel_utils.
ALL_PARALLEL_STYLES``, transformers >= 5.2x's DTensor TP path; checked with 5.24.0 and 5.25), so a
``tp_plan`` of names can use them; they shard parameters as transformers' own colwise /
rowwise do and install the same compressed forward as the styles above.  Older
transformers (4.x: no such registry) get a clear error; ``tp_plan`` + ``parallelize_module``
works with any version whose models build with ``base_model_tp_plan``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ParallelStyle

from .communicator import CommConfig
from .styles import CompressedColwiseParallel, CompressedPrepareModuleInput, CompressedRowwiseParallel, comm_config

ATTENTION_UNITS = {"q_proj": "attention heads", "o_proj": "attention heads",
                   "k_proj": "key-value heads", "v_proj": "key-value heads"}
# model_type: {a decoder layer's block (the parent of column-parallel projections): how the
# layer passes the block its input: a keyword's name, or 0 for the first positional argument}
# (transformers 5.2x: self.self_attn(hidden_states=..., ...), self.mlp(hidden_states))
BLOCK_INPUTS: dict[str, dict[str, str | int]] = {
    "qwen2": {"self_attn": "hidden_states", "mlp": 0},
    "llama": {"self_attn": "hidden_states", "mlp": 0},
}
# the registered names: what each stands for in a base_model_tp_plan (a style, or the block it prepares)
REGISTERED = {"fp4quant_colwise": "colwise", "fp4quant_rowwise": "rowwise",
              "fp4quant_attention_input": "self_attn", "fp4quant_mlp_input": "mlp"}


def block_input(passed: str | int, comm: CommConfig | str | None = None) -> CompressedPrepareModuleInput:
    """The block-level input style of a block whose input is passed as ``passed`` (a keyword's
    name, or 0: the first positional argument, the block's only one)."""
    if passed == 0:
        return CompressedPrepareModuleInput(input_layouts=(Replicate(),), comm=comm)
    return CompressedPrepareModuleInput(input_kwarg_layouts={passed: Replicate()}, comm=comm)


def _base_prefix(model: nn.Module) -> str:
    """'model.' for a *ForCausalLM (its decoder under base_model_prefix), '' for the decoder itself."""
    prefix = getattr(model, "base_model_prefix", "")
    return f"{prefix}." if prefix and isinstance(getattr(model, prefix, None), nn.Module) else ""


def tp_plan(model: nn.Module, comm: CommConfig | str | None = None, block_inputs: bool = True
            ) -> dict[str, ParallelStyle]:
    """The compressed TP plan of a Hugging Face Qwen2 / Llama model (or any whose config has a
    ``base_model_tp_plan`` of "colwise" / "rowwise" entries), for ``parallelize_module``.
    ``block_inputs``: prepare the input of each block of column-parallel projections once
    (BLOCK_INPUTS; where the architecture is listed there), else per projection."""
    config = getattr(model, "config", None)
    names = getattr(config, "base_model_tp_plan", None)
    if not names:
        raise ValueError(f"{type(model).__name__} has no config.base_model_tp_plan: not a Hugging Face model with a TP "
                         f"plan (write the plan with the styles of fp4quant.parallel.styles)")
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    comm = comm_config(comm)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    blocks = BLOCK_INPUTS.get(getattr(config, "model_type", None), {}) if block_inputs else {}
    plan: dict[str, ParallelStyle] = {}
    for name, style in names.items():
        if style == "colwise":
            s = CompressedColwiseParallel(comm=comm)
        elif style == "rowwise":
            s = CompressedRowwiseParallel(comm=comm)
        else:
            raise ValueError(f"{name}: style {style!r} of {type(model).__name__}'s plan has no compressed counterpart "
                             f"(colwise, rowwise)")
        parent = name.rpartition(".")[0]
        passed = blocks.get(parent.rpartition(".")[2])
        if style == "colwise" and passed is not None:  # the block first, then its projections
            plan.setdefault(_base_prefix(model) + parent, block_input(passed, comm))
        unit = ATTENTION_UNITS.get(name.rsplit(".", 1)[-1])
        plan[_base_prefix(model) + name] = s.in_units_of(head_dim, unit) if unit else s
    return plan


def register_transformers_styles(comm: CommConfig | str | None = None) -> list[str]:
    """Register the compressed styles with transformers' parallel-style registry under the names
    of REGISTERED (all with ``comm``); returns the names."""
    try:
        from transformers.distributed import tensor_parallel as hf_tp
        from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
    except ImportError as exc:
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} has no DTensor parallel-style registry "
                           f"(transformers.distributed.parallel_utils.ALL_PARALLEL_STYLES, 5.2x); use "
                           f"parallelize_module(model, mesh, fp4quant.parallel.tp_plan(model))") from exc
    comm = comm_config(comm)

    def adapter(hf_base, ours):
        class Compressed(hf_base):
            """transformers' parameter sharding, fp4quant's compressed forward."""

            def install_forward(self, module, mesh, **context):
                # context: what later transformers pass along (5.25: config, mesh_manager);
                # the compressed forward needs only the module and the mesh
                return ours._apply_forward(module, mesh)

        Compressed.__name__ = f"HF{type(ours).__name__}"
        return Compressed()

    def block_adapter(ours):
        class CompressedBlockInput(hf_tp.TensorParallelLayer):
            """fp4quant's block-level input on a module with no parameters of its own to shard."""

            def install_forward(self, module, mesh, **context):
                return ours._apply(module, mesh)

        return CompressedBlockInput()

    styles = {"fp4quant_colwise": adapter(hf_tp.ColwiseParallel, CompressedColwiseParallel(comm=comm)),
              "fp4quant_rowwise": adapter(hf_tp.RowwiseParallel, CompressedRowwiseParallel(comm=comm)),
              "fp4quant_attention_input": block_adapter(block_input("hidden_states", comm)),
              "fp4quant_mlp_input": block_adapter(block_input(0, comm))}
    for name, style in styles.items():
        ALL_PARALLEL_STYLES.register(name, style)
    return list(styles)
