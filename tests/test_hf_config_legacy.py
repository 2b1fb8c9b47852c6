"""GPT-2, GPTBigCode (StarCoder) and Falcon configs, read by their own field names as transformers'
GPT2Config, GPTBigCodeConfig and FalconConfig read them: shapes, KV bytes per token and parameter
counts against the published ones, and ``kvsim run`` on such a config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.errors import ConfigError
from sim.hf_config import read_hf_config

#: openai-community/gpt2 config.json (the shape fields as published): 124,439,808 parameters.
GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}

#: bigcode/starcoder config.json (the shape fields as published): 15.5 B parameters.
STARCODER = {
    "activation_function": "gelu_pytorch_tanh",
    "architectures": ["GPTBigCodeForCausalLM"],
    "model_type": "gpt_bigcode",
    "multi_query": True,
    "n_embd": 6144,
    "n_head": 48,
    "n_inner": 24576,
    "n_layer": 40,
    "n_positions": 8192,
    "torch_dtype": "float32",
    "vocab_size": 49152,
}

#: tiiuae/falcon-7b config.json (as published: no ffn_hidden_size, max_position_embeddings or
#: tie_word_embeddings): 6.92 B parameters.
FALCON_7B = {
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "bias": False,
    "hidden_size": 4544,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 65024,
}


def _write(folder: Path, cfg: dict, name: str = "config.json") -> Path:
    p = folder / name
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize(
    "cfg, shape, kv_bytes, published",
    [
        # layers, hidden, heads, kv heads, head_dim, intermediate, vocab, max_position
        (GPT2, (12, 768, 12, 12, 64, 3072, 50257, 1024), 12 * 2 * 12 * 64 * 2, 124.4e6),
        (STARCODER, (40, 6144, 48, 1, 128, 24576, 49152, 8192), 40 * 2 * 1 * 128 * 2, 15.5e9),
        (FALCON_7B, (32, 4544, 71, 1, 64, 4 * 4544, 65024, 2048), 32 * 2 * 1 * 64 * 2, 6.92e9),
    ],
    ids=["gpt2", "starcoder", "falcon-7b"],
)
def test_published_configs(tmp_path, cfg, shape, kv_bytes, published):
    s = read_hf_config(_write(tmp_path, cfg)).spec
    got = (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab, s.max_position)
    assert got == shape
    assert s.tied_embeddings  # PretrainedConfig's / GPTBigCodeConfig's default
    assert s.kv_bytes_per_token("bf16") == kv_bytes
    assert s.params == pytest.approx(published, rel=0.02)


def test_kv_heads_follow_transformers_rules(tmp_path):
    santacoder_mha = {**STARCODER, "multi_query": False}
    assert read_hf_config(_write(tmp_path, santacoder_mha, "a.json")).spec.kv_heads == 48
    no_flag = {k: v for k, v in STARCODER.items() if k != "multi_query"}  # GPTBigCodeConfig: True
    assert read_hf_config(_write(tmp_path, no_flag, "b.json")).spec.kv_heads == 1
    falcon_mha = {**FALCON_7B, "multi_query": False}
    assert read_hf_config(_write(tmp_path, falcon_mha, "c.json")).spec.kv_heads == 71
    # tiiuae/falcon-40b: new_decoder_architecture, 8 KV heads (multi_query ignored).
    falcon_40b = {**FALCON_7B, "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                  "num_kv_heads": 8, "new_decoder_architecture": True}  # fmt: skip
    s = read_hf_config(_write(tmp_path, falcon_40b, "d.json")).spec
    assert (s.kv_heads, s.head_dim, s.intermediate) == (8, 64, 4 * 8192)
    assert s.params == pytest.approx(41.8e9, rel=0.02)
    bare = {"model_type": "gpt2"}  # every field GPT2Config's default
    s = read_hf_config(_write(tmp_path, bare, "g.json")).spec
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.max_position) == (12, 768, 12, 12, 1024)
    gpt2_inner = {**GPT2, "n_inner": None}
    assert read_hf_config(_write(tmp_path, gpt2_inner, "e.json")).spec.intermediate == 3072
    falcon_ffn = {**FALCON_7B, "ffn_hidden_size": 8000}
    assert read_hf_config(_write(tmp_path, falcon_ffn, "f.json")).spec.intermediate == 8000


def test_malformed_legacy_field_is_named(tmp_path):
    p = _write(tmp_path, {**GPT2, "n_embd": "768"})
    with pytest.raises(ConfigError) as e:
        read_hf_config(p)
    assert "'n_embd' must be an integer" in str(e.value) and "\n" not in str(e.value)


def test_kvsim_run_on_a_starcoder_config(tmp_path):
    # chat-api's max_model_len (16384) is over StarCoder's n_positions (8192): vLLM refuses it.
    cfg = _write(tmp_path, STARCODER, "starcoder.json")
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", "chat-api", "-q", "--model", str(cfg),
         "--set", "workload.num_requests=20", "--set", "workload.max_model_len=8192",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["kv_bytes_per_token"] == 20480


@pytest.mark.parametrize(
    "cfg,context",
    [(STARCODER, 8192), ({"model_type": "gpt2"}, 1024), ({k: v for k, v in GPT2.items() if k != "n_positions"}, 1024)],
)
def test_n_positions_is_the_context_vllm_enforces(tmp_path, cfg, context):
    """GPT-2 and GPTBigCode name the context n_positions (the file's, else GPT2Config's 1024)."""
    from sim.config import load_scenario, model_context

    path = _write(tmp_path, cfg, "m.json")
    sc = load_scenario("chat-api", {"model": {"hf_config": str(path)}, "workload.max_model_len": context})
    assert model_context(sc) == context
    with pytest.raises(ConfigError, match=rf"workload.max_model_len: got {context + 1}; at most {context}"):
        load_scenario("chat-api", {"model": {"hf_config": str(path)}, "workload.max_model_len": context + 1})
