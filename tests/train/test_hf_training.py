"""Training a Hugging Face Qwen2 (transformers) through the compressed styles: --model hf:<path>."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from distributed import run_ranks
from fp4quant.data import TokenDataset
from fp4quant.train import ConfigError, TrainConfig
from train.launch import cli, short

QWEN2 = dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)


@pytest.fixture
def config_json(tmp_path):
    path = tmp_path / "tiny-qwen2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(QWEN2))
    return path


def run(data, out, config_json, **kw):
    cfg = short(data, out, **{**dict(model=f"hf:{config_json}", tp=2, steps=4, seq_len=32, batch_size=2,
                                     checkpoint_every=2, seed=3), **kw})
    return run_ranks("train.rank_jobs:train", 2, cfg, timeout=300)[0]


def single_process_loss(data, config_json, seed=3, model=None) -> float:
    """Step 0's loss of the same model (by default built as the trainer seeds it), whole in one
    process (transformers alone), on the same batch."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids, labels = TokenDataset(data).batch(0, 0, 1, 2, 32, seed)
    if model is None:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(Qwen2Config.from_json_file(str(config_json))).float()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))


def test_hf_model_trains_through_the_styles(data, tmp_path, config_json):
    """TP=2, exact traffic: step 0's loss is the single-process model's; fp4quant: compressed
    bytes both ways, and the same learning within a loose margin."""
    exact = run(data, tmp_path / "exact", config_json, comm="exact")
    assert exact["losses"][0] == pytest.approx(single_process_loss(data, config_json), rel=1e-5, abs=1e-5)
    fp4 = run(data, tmp_path / "fp4", config_json, comm="fp4quant")
    s = fp4["summary"]
    assert s["provenance"]["config"]["model"] == f"hf:{config_json}"
    assert s["model"]["num_heads"] == 4
    log = [json.loads(line) for line in (tmp_path / "fp4/log.jsonl").read_text().splitlines()]
    for direction in ("fwd", "bwd"):
        assert all(0 < r[f"{direction}_bytes_sent"] < r[f"{direction}_bytes_uncompressed"] / 3 for r in log)
    # tp_plan's block-level inputs: per decoder layer 2 compressed reductions each way (o_proj and
    # down_proj forward; the attention and MLP inputs' gradients backward), not 5 backward
    layers = QWEN2["num_hidden_layers"]
    assert all(r["fwd_calls"] == 2 * layers and r["bwd_calls"] == 2 * layers for r in log), log
    assert all(r["bwd_bytes_sent"] <= 1.25 * r["fwd_bytes_sent"] for r in log)
    assert exact["summary"]["fwd_bytes_sent"] == sum(r["fwd_bytes_uncompressed"] for r in log)  # exact: own dtype
    assert fp4["losses"] != exact["losses"]
    assert all(abs(a - b) < 0.05 * b for a, b in zip(fp4["losses"], exact["losses"]))
    assert exact["losses"][-1] < exact["losses"][0]


def test_a_llama_checkpoint_folder_is_loaded(data, tmp_path):
    """hf:<folder> with safetensors: the weights are the folder's (not the --seed's), Llama too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {k: v for k, v in QWEN2.items() if k != "model_type"}
    torch.manual_seed(7)
    saved = LlamaForCausalLM(LlamaConfig(**config)).float()
    saved.save_pretrained(tmp_path / "llama")
    result = run(data, tmp_path / "run", tmp_path / "llama", comm="exact", steps=2)
    assert result["losses"][0] == pytest.approx(single_process_loss(data, None, model=saved), rel=1e-5, abs=1e-5)
    assert result["summary"]["provenance"]["config"]["model"] == f"hf:{tmp_path / 'llama'}"


def test_biased_llama_at_tp2_trains_as_at_tp1(data, tmp_path):
    """A Llama with attention and MLP biases (the row-parallel biases are Replicate DTensors):
    exact traffic at TP = 2 gives TP = 1's loss and gradient norm at every step (the norm
    counts a replicated parameter once, so clipping acts alike)."""
    config = tmp_path / "llama-bias" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({**QWEN2, "model_type": "llama", "attention_bias": True, "mlp_bias": True}))
    logs = {}
    for tp in (1, 2):
        cfg = short(data, tmp_path / f"tp{tp}", model=f"hf:{config}", tp=tp, steps=5, seq_len=32, batch_size=2,
                    comm="exact", seed=3, clip=1.0)
        run_ranks("train.rank_jobs:train", tp, cfg, timeout=300)
        logs[tp] = [json.loads(line) for line in (tmp_path / f"tp{tp}/log.jsonl").read_text().splitlines()]
    assert logs[1][0]["grad_norm"] > 1.0  # clipping acts: a wrong norm would change the updates
    for one, two in zip(logs[1], logs[2], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5), one["step"]
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5), one["step"]


def test_hf_model_resumes_bit_exactly(data, tmp_path, config_json):
    """A run cut at its step-2 checkpoint and resumed replays the whole run: DTensor shards and
    their optimizer state round-trip, the backward's stochastic rounding is keyed by the step."""
    whole = run(data, tmp_path / "whole", config_json, comm="fp4quant")
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "whole", cut)
    shutil.rmtree(cut / "checkpoints/step_000004")
    (cut / "summary.json").unlink()
    resumed = run(data, cut, config_json, comm="fp4quant")
    assert resumed["summary"]["resumed_from"] == 2
    assert resumed["losses"] == whole["losses"]
    assert resumed["checksum"] == whole["checksum"]
    manifest = json.loads((cut / "checkpoints/step_000004/manifest.json").read_text())
    assert len(manifest["model_config_sha256"]) == 64


def test_bad_hf_model_is_one_line(data, tmp_path, config_json, capsys):
    bad = tmp_path / "gpt2.json"
    bad.write_text(json.dumps({**QWEN2, "model_type": "gpt2"}))
    cases = {f"hf:{tmp_path / 'nowhere'}": "no config.json at", f"hf:{bad}": "model_type 'gpt2' is not one of"}
    for model, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            TrainConfig(out=str(tmp_path / "out"), model=model)
    with pytest.raises(ConfigError, match=r"--tp 3 does not divide the model's num_attention_heads \(4\)"):
        TrainConfig(out=str(tmp_path / "out"), model=f"hf:{config_json.parent}", tp=3)
    with pytest.raises(ConfigError, match="--compute quartet is not supported"):
        TrainConfig(out=str(tmp_path / "out"), model=f"hf:{config_json}", compute="quartet")
    status, err = cli(capsys, **short(data, tmp_path / "out", model=f"hf:{tmp_path / 'nowhere'}"))
    assert status == 2
    assert err == f"fp4quant.train: error: --model hf:{tmp_path / 'nowhere'}: no config.json at {tmp_path / 'nowhere' / 'config.json'}"
