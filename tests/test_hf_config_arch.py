"""Hugging Face configs of architectures beyond Llama's shape, read as transformers reads them:
config-class defaults for the fields a published config leaves out (Gemma-3), MLPs without a gate
and tied-embedding defaults per architecture (StarCoder2, Phi-2, Pythia, Aya 23), vision encoders
(Qwen2.5-VL counted, others said on stderr), hybrid state-space models refused, malformed fields
refused in one line, and the label of a config file not named config.json."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sim.catalog import FULL
from sim.config import scenario_from_dict
from sim.errors import ConfigError
from sim.hf_config import read_hf_config
from sim.hf_defaults import DEFAULTS, UNGATED_MLP


def _write(folder: Path, cfg: dict, name: str = "config.json") -> Path:
    p = folder / name
    p.write_text(json.dumps(cfg))
    return p


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        read_hf_config(path)
    msg = str(e.value)
    assert msg.startswith("model.hf_config: ") and "\n" not in msg, msg
    assert str(path) in msg, msg
    return msg


# --- Gemma-3: Gemma3TextConfig's defaults for the fields Google's configs leave out ----------

#: google/gemma-3-27b-it config.json as published (transformers 4.50.0.dev0): no vocab_size,
#: sliding_window_pattern, max_position_embeddings or tie_word_embeddings in its text_config.
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def _gemma3(text: dict, drop: tuple[str, ...] = ()) -> dict:
    tc = {k: v for k, v in {**GEMMA3_27B["text_config"], **text}.items() if k not in drop}
    return {**GEMMA3_27B, "text_config": tc}


def test_gemma3_27b_every_sixth_layer_is_global(tmp_path):
    m = read_hf_config(_write(tmp_path, GEMMA3_27B)).spec
    full = [i for i, t in enumerate(m.layer_types) if t == FULL]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]  # (i + 1) % 6 == 0
    assert (len(full), m.sliding_layers, m.sliding_window) == (10, 52, 1024)
    assert (m.vocab, m.max_position, m.tied_embeddings) == (262_208, 131_072, True)
    # 16 KV heads x 128 x K and V x 2 bytes = 8192 B per token and layer. A 32,768-token sequence
    # keeps all of it on the 10 global layers and its last 1024 tokens on the 52 sliding ones:
    per_layer = 2 * 16 * 128 * 2
    assert per_layer == 8192
    held = sum(per_layer * (32_768 if t == FULL else 1024) for t in m.layer_types)
    assert held == (10 * 32_768 + 52 * 1024) * 8192 == 3_120_562_176
    # vLLM groups the layers 10 to a group (one full, six sliding: 8 padding layers), and so does kvsim.
    assert m.kv_bytes_held(32_768, "bf16") == (10 * 32_768 + 60 * 1024) * 8192


def test_gemma3_12b_head_dim_is_256_not_hidden_over_heads(tmp_path):
    # google/gemma-3-12b-it: no head_dim (3840 / 16 = 240 would be wrong) and no vocab_size.
    cfg = _gemma3(
        {"hidden_size": 3840, "intermediate_size": 15360, "num_attention_heads": 16, "num_hidden_layers": 48,
         "num_key_value_heads": 8},
        drop=("head_dim", "query_pre_attn_scalar"),
    )  # fmt: skip
    m = read_hf_config(_write(tmp_path, cfg)).spec
    assert (m.head_dim, m.heads, m.kv_heads) == (256, 16, 8)
    assert m.kv_bytes_per_token("bf16") == 48 * 2 * 8 * 256 * 2
    assert (m.layers - m.sliding_layers, m.sliding_layers) == (8, 40)


def test_gemma3_4b_takes_the_default_heads(tmp_path):
    # google/gemma-3-4b-it: no head counts, no head_dim.
    cfg = _gemma3(
        {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34},
        drop=("head_dim", "num_attention_heads", "num_key_value_heads", "query_pre_attn_scalar"),
    )
    m = read_hf_config(_write(tmp_path, cfg)).spec
    assert (m.heads, m.kv_heads, m.head_dim, m.vocab) == (8, 4, 256, 262_208)
    assert [i for i, t in enumerate(m.layer_types) if t == FULL] == [5, 11, 17, 23, 29]


def test_gemma3_defaults_follow_transformers_rules(tmp_path):
    # A text_config naming no model_type is still a Gemma3TextConfig under a gemma3 wrapper.
    cfg = _gemma3({}, drop=("model_type",))
    assert read_hf_config(_write(tmp_path, cfg)).spec.sliding_layers == 52
    # No sliding_window at all: the class's 4096; a key given as null stays null (no window).
    cfg = _gemma3({}, drop=("sliding_window",))
    assert read_hf_config(_write(tmp_path, cfg)).spec.sliding_window == 4096
    cfg = _gemma3({"sliding_window": None})
    m = read_hf_config(_write(tmp_path, cfg)).spec
    assert (m.sliding_window, m.sliding_layers) == (None, 0)
    # An explicit pattern or layer list wins over the default pattern.
    cfg = _gemma3({"sliding_window_pattern": 2})
    assert read_hf_config(_write(tmp_path, cfg)).spec.sliding_layers == 31
    # Another architecture gets none of Gemma's defaults.
    cfg = _gemma3({"model_type": "llama", "vocab_size": 262_208})
    m = read_hf_config(_write(tmp_path, cfg)).spec
    assert m.sliding_layers == 62 and m.layer_types == ()  # Mistral-style: a window on every layer


# --- MLPs without a gate, tied embeddings per architecture ----------------------------------

#: bigcode/starcoder2-15b, microsoft/phi-2, EleutherAI/pythia-6.9b, CohereForAI/aya-23-8B config.json
#: (the fields kvsim reads, as published).
STARCODER2_15B = {
    "architectures": ["Starcoder2ForCausalLM"],
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 6144,
    "intermediate_size": 24576,
    "max_position_embeddings": 16384,
    "mlp_type": "default",
    "model_type": "starcoder2",
    "norm_type": "layer_norm",
    "num_attention_heads": 48,
    "num_hidden_layers": 40,
    "num_key_value_heads": 4,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_bias": True,
    "vocab_size": 49152,
}
PHI2 = {
    "architectures": ["PhiForCausalLM"],
    "hidden_act": "gelu_new",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "max_position_embeddings": 2048,
    "model_type": "phi",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 51200,
}
PYTHIA_6_9B = {
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_act": "gelu",
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 50432,
}
AYA_23_8B = {  # no tie_word_embeddings: CohereConfig's default (True)
    "architectures": ["CohereForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "cohere",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "float16",
    "vocab_size": 256000,
}


@pytest.mark.parametrize(
    "cfg,expected,published",
    [
        # 40 x (Q, O 6144^2; K, V 6144 x 512; up, down 6144 x 24576; 2 norms) + embeddings and LM head
        (STARCODER2_15B, 40 * (2 * 6144**2 + 2 * 6144 * 512 + 2 * 6144 * 24576 + 2 * 6144) + 2 * 49152 * 6144 + 6144,
         15.96e9),
        # 32 x (Q, K, V, O 2560^2; fc1, fc2 2560 x 10240; norms) + embeddings and LM head
        (PHI2, 32 * (4 * 2560**2 + 2 * 2560 * 10240 + 2 * 2560) + 2 * 51200 * 2560 + 2560, 2.78e9),
        # GPT-NeoX: Q/K/V biases (attention_bias defaults to true), 2 x 4096 x 16384 MLP
        (PYTHIA_6_9B, 32 * (4 * 4096**2 + 3 * 4096 + 2 * 4096 * 16384 + 2 * 4096) + 2 * 50432 * 4096 + 4096,
         6.857e9),
        # Cohere: a gated MLP, one embedding matrix (tied by default)
        (AYA_23_8B, 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 256000 * 4096 + 4096,
         8.03e9),
    ],
    ids=["starcoder2-15b", "phi-2", "pythia-6.9b", "aya-23-8b"],
)  # fmt: skip
def test_parameter_count_by_architecture(tmp_path, cfg, expected, published):
    m = read_hf_config(_write(tmp_path, cfg)).spec
    assert m.params == expected
    assert m.params == pytest.approx(published, rel=0.005)


def test_tied_embeddings_default_per_architecture(tmp_path):
    # Starcoder2Config ties them unless the config says otherwise (the 3B and 7B do; the 15B sets false).
    sc2 = {k: v for k, v in STARCODER2_15B.items() if k != "tie_word_embeddings"}
    m = read_hf_config(_write(tmp_path, sc2)).spec
    assert m.tied_embeddings and m.params == 15_955_630_080 - 49152 * 6144  # 15.65B
    # An architecture with no listed default keeps the LM head apart (the larger count).
    llama = {**PHI2, "model_type": "llama"}
    assert not read_hf_config(_write(tmp_path, llama)).spec.tied_embeddings
    assert DEFAULTS["cohere"]["tie_word_embeddings"] is True and DEFAULTS["gpt_neox"]["tie_word_embeddings"] is False


def test_ungated_architectures_are_listed():
    assert {"starcoder2", "phi", "gpt_neox", "gpt2", "gpt_bigcode", "falcon"} <= set(UNGATED_MLP)
    assert not {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "cohere", "phi3"} & set(UNGATED_MLP)


# --- vision encoders ------------------------------------------------------------------------

#: Qwen/Qwen2.5-VL-7B-Instruct config.json: a top-level text config beside its vision_config.
QWEN25_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "vocab_size": 152064,
}


def test_qwen25_vl_counts_its_vision_encoder(tmp_path):
    hf = read_hf_config(_write(tmp_path, QWEN25_VL_7B))
    text = 7_615_616_512  # Qwen2-7B's text tower
    h, i = 1280, 3420
    block = (4 * h * h + 4 * h) + (3 * h * i + 2 * i + h) + 2 * h  # attention, gated MLP with biases, RMSNorms
    merger = 5120 * 5120 + 5120 + 5120 * 3584 + 3584 + h
    vision = 32 * block + 3 * 2 * 14 * 14 * h + merger
    assert vision == 676_550_144
    assert hf.spec.params == text + vision == 8_292_166_656  # the published 8.29B
    assert not hf.warnings


def test_an_uncounted_vision_encoder_is_said(tmp_path, caplog):
    hf = read_hf_config(_write(tmp_path, GEMMA3_27B))
    assert len(hf.warnings) == 1 and "vision encoder (siglip_vision_model) not counted" in hf.warnings[0]
    caplog.set_level(logging.WARNING, logger="kvsim")
    scenario_from_dict({"model": {"hf_config": str(tmp_path / "config.json")}})
    said = [r.getMessage() for r in caplog.records if r.name == "kvsim.model"]
    assert said == list(hf.warnings)
    caplog.clear()  # an explicit parameter count replaces the one the warning is about
    scenario_from_dict({"model": {"hf_config": str(tmp_path / "config.json"), "params": 27.4e9}})
    assert not [r for r in caplog.records if r.name == "kvsim.model"]


def test_kvsim_run_says_it_on_stderr(tmp_path):
    cfg = _write(tmp_path, _gemma3({"num_hidden_layers": 6}), "gemma-3-small.json")
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", "chat-api", "-q", "--model", str(cfg),
         "--set", "workload.num_requests=10", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("warning:")]
    assert len(lines) == 1 and "gemma-3-small.json: vision encoder (siglip_vision_model) not counted" in lines[0]


# --- hybrid state-space models ------------------------------------------------------------

#: ai21labs/Jamba-v0.1 and ibm-ai-platform/Bamba-9B config.json (the attention-layer fields and
#: shapes as published).
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "attn_layer_offset": 4,
    "attn_layer_period": 8,
    "expert_layer_offset": 1,
    "expert_layer_period": 2,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_d_state": 16,
    "mamba_dt_rank": 256,
    "mamba_expand": 2,
    "max_position_embeddings": 262144,
    "model_type": "jamba",
    "num_attention_heads": 32,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 65536,
}
BAMBA = {
    "architectures": ["BambaForCausalLM"],
    "attn_layer_indices": [9, 18, 27],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "mamba_chunk_size": 256,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 128,
    "max_position_embeddings": 262144,
    "model_type": "bamba",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 16,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}


@pytest.mark.parametrize(
    "cfg,needle",
    [
        (JAMBA, "attn_layer_period=8: state-space (mamba) layers are not supported yet"),
        (BAMBA, "attn_layer_indices=[9, 18, 27]: state-space (mamba) layers are not supported yet"),
        # Granite-4.0-H: layer_types lists "mamba" and "attention" layers.
        ({**DENSE, "model_type": "granitemoehybrid", "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 10},
         "layer_types='mamba': state-space (mamba) layers are not supported yet"),
        # Falcon-H1: mamba_* shape fields, attn_layer_indices null.
        ({**DENSE, "model_type": "falcon_h1", "mamba_d_ssm": 1024, "mamba_n_heads": 128, "attn_layer_indices": None},
         "mamba_d_ssm=1024: state-space (mamba) layers are not supported yet"),
    ],
    ids=["jamba", "bamba", "granite-4-h", "falcon-h1"],
)  # fmt: skip
def test_hybrid_state_space_models_are_refused(tmp_path, cfg, needle):
    assert needle in _error(_write(tmp_path, cfg, "m.json"))


def test_layer_types_must_be_a_list(tmp_path):
    msg = _error(_write(tmp_path, {**DENSE, "layer_types": "full_attention"}, "m.json"))
    assert "'layer_types' must be a list with one type per layer" in msg and "got 'full_attention'" in msg


# --- malformed fields: one line naming file, field, value and what is allowed ----------------


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]}},
         "'quantization_config.config_groups' must be a mapping of group names to schemes"),
        ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": "x"}}}},
         "'quantization_config.config_groups.g' must be a mapping with a 'weights' mapping (num_bits, type); got 'x'"),
        ({"sliding_window": 512, "sliding_window_pattern": "x"},
         "'sliding_window_pattern' must be an integer >= 1 (every n-th layer attends globally); got 'x'"),
        ({"sliding_window": 512, "sliding_window_pattern": 0}, "'sliding_window_pattern' must be an integer >= 1"),
        ({"sliding_window": 512, "use_sliding_window": True, "max_window_layers": "x"},
         "'max_window_layers' must be an integer >= 0"),
        ({"text_config": {**DENSE}, "vision_config": {"depth": 2, "hidden_size": 8, "intermediate_size": 16,
                                                      "patch_size": "x"}},
         "'vision_config.patch_size' must be an integer >= 1; got 'x'"),
        ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false; got 'false'"),
        ({"text_config": [1, 2]}, "'text_config' must be a mapping"),
        ({"quantization_config": "fp8"}, "'quantization_config' must be a mapping"),
    ],
    ids=["cg-list", "cg-weights-str", "swp-str", "swp-zero", "mwl-str", "vision-str", "tie-str", "tc-list", "qc-str"],
)  # fmt: skip
def test_malformed_fields_are_one_line(tmp_path, extra, needle):
    assert needle in _error(_write(tmp_path, {**DENSE, **extra}, "m.json"))


def test_deep_nesting_is_refused_by_the_json_limit(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    assert "JSON with a nesting of at most" in _error(p)


# --- labels ---------------------------------------------------------------------------------


def test_a_config_file_not_named_config_json_is_labelled_by_its_stem(tmp_path):
    (tmp_path / "cfg").mkdir()
    assert read_hf_config(_write(tmp_path / "cfg", PHI2, "phi-2.json")).spec.name == "phi-2"
    assert read_hf_config(_write(tmp_path / "cfg", PHI2)).spec.name == "cfg"  # config.json: its folder
    assert read_hf_config(_write(tmp_path / "cfg", PHI2, "microsoft--phi-2_config.json")).spec.name == "microsoft/phi-2"
