"""Our Qwen2 against Hugging Face's, presets, sizing, and configuration errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from distributed import run_ranks
from fp4quant.models import MODEL_PRESETS, ModelConfig, Qwen2ForCausalLM, load_safetensors, load_state_dict, memory_per_rank
from fp4quant.models.hf import from_pretrained
from fp4quant.parallel import TPCommunicator

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
             rope_theta=10000.0, rms_norm_eps=1e-6, max_position=128)


def hf_model(tied: bool):
    hf_cfg = transformers.Qwen2Config(
        vocab_size=SMALL["vocab_size"], hidden_size=SMALL["hidden_size"], intermediate_size=SMALL["intermediate_size"],
        num_hidden_layers=SMALL["num_layers"], num_attention_heads=SMALL["num_heads"],
        num_key_value_heads=SMALL["num_kv_heads"], max_position_embeddings=SMALL["max_position"],
        rope_theta=SMALL["rope_theta"], rms_norm_eps=SMALL["rms_norm_eps"], tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Qwen2ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # HF zero-initializes biases; give them values so the test sees them
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def hf(request):
    model = hf_model(request.param)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    cfg = dict(SMALL, tie_word_embeddings=request.param)
    return model, cfg, ids, logits


def test_logits_match_hugging_face_tp1(hf):
    model, cfg, ids, logits = hf
    ours = Qwen2ForCausalLM(ModelConfig(**cfg), TPCommunicator(None))
    load_state_dict(ours, dict(model.state_dict()))
    with torch.no_grad():
        assert torch.allclose(ours(ids), logits, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_logits_match_hugging_face_tp2(hf, sp):
    model, cfg, ids, logits = hf
    shards = run_ranks("models.rank_jobs:hf_logits", 2,
                       dict(cfg=cfg, state=dict(model.state_dict()), ids=ids, sp=sp))
    assert torch.allclose(torch.cat(shards, dim=-1), logits, atol=2e-5, rtol=1e-4)


def test_safetensors_folder(tmp_path, hf):
    model, cfg, ids, logits = hf
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = from_pretrained(tmp_path, TPCommunicator(None))
    assert ours.cfg == ModelConfig(**cfg)
    with torch.no_grad():
        assert torch.allclose(ours(ids), logits, atol=2e-5, rtol=1e-4)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_safetensors(ours, tmp_path / "nowhere")


def test_missing_tensor_is_named(hf):
    model, cfg, _, _ = hf
    state = dict(model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="up_proj"):
        load_state_dict(Qwen2ForCausalLM(ModelConfig(**cfg), TPCommunicator(None)), state)


@pytest.mark.parametrize("name, billions", [("qwen2-0.5b", 0.494), ("qwen-7b", 7.72), ("qwen2.5-7b", 7.62)])
def test_preset_sizes(name, billions):
    assert abs(ModelConfig.preset(name).num_parameters() / 1e9 - billions) < 0.01 * billions


def test_tiny_preset_is_a_few_million_and_tp4_capable():
    cfg = ModelConfig.preset("tiny")
    assert 1e6 < cfg.num_parameters() < 1e7 and cfg.num_kv_heads >= 4
    for tp in (1, 2, 4):
        cfg.check_tp(tp)


def test_qwen_7b_at_tp8_fits_an_80gb_h100():
    est = memory_per_rank(ModelConfig.preset("qwen-7b"), tp=8)  # fp32 weights, grads, AdamW moments
    assert est.parameters < ModelConfig.preset("qwen-7b").num_parameters() / 7
    assert est.total_bytes < 0.5 * 80e9  # half the card left for activations
    # bf16 weights and gradients with an fp32 master copy: the same 16 bytes per parameter
    bf16 = memory_per_rank(ModelConfig.preset("qwen-7b"), tp=8, param_dtype=torch.bfloat16, master_weights=True)
    assert bf16.total_bytes == est.total_bytes == 16 * est.parameters
    assert memory_per_rank(ModelConfig.preset("qwen-7b"), tp=1).total_bytes > 80e9  # and it needs TP


def test_configuration_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"size 7 does not divide num_kv_heads \(2\)"):
        ModelConfig.preset("qwen2-0.5b").check_tp(7)
    with pytest.raises(ValueError, match=r"size 8 does not divide num_heads \(28\)"):
        ModelConfig.preset("qwen2.5-7b").check_tp(8)
    with pytest.raises(ValueError, match="num_heads 6 is not divisible by num_kv_heads 4"):
        ModelConfig(**dict(SMALL, num_heads=6, num_kv_heads=4, hidden_size=60))
    with pytest.raises(ValueError, match="unknown model"):
        ModelConfig.preset("gpt-5")
    assert set(MODEL_PRESETS) == {"tiny", "small", "small-mha", "qwen2-0.5b", "qwen-7b", "qwen2.5-7b"}
    ModelConfig.preset("small-mha").check_tp(16)  # the TP study's model: every head sharded at TP = 16
    with pytest.raises(ValueError, match=r"size 16 does not divide num_heads \(8\)"):
        ModelConfig.preset("small").check_tp(16)
    assert 9.5e6 < ModelConfig.preset("small").num_parameters() < 11e6  # the convergence study's ~10M
    ModelConfig.preset("small").check_tp(2)
