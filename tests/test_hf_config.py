"""Hugging Face config.json files: every shipped config read, parameter counts against the published
sizes, refusals of what kvsim does not model, text_config nesting, quantisation dtypes, scenarios."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_config
from sim.catalog import FULL, MODELS, SLIDING
from sim.config import scenario_from_dict
from sim.cost.profile_model import shape_keys
from sim.engine.deployment import Deployment, model_spec
from sim.errors import ConfigError
from sim.hf_config import MODELS_DIR, read_hf_config, resolve_hf_config, shipped_models

DATA = Path(__file__).parent / "data" / "hf"

#: Published parameter counts (model cards: Qwen3 "Number of Parameters" and "Non-Embedding";
#: Meta: Llama 3.1 8.03B / 70.6B / 405B), in billions: (total, non-embedding or None).
PUBLISHED = {
    "Qwen/Qwen3-0.6B": (0.6, 0.44),
    "Qwen/Qwen3-1.7B": (1.7, 1.4),
    "Qwen/Qwen3-8B": (8.2, 6.95),
    "Qwen/Qwen3-32B": (32.8, 31.2),
    "Qwen/Qwen3-32B-FP8": (32.8, 31.2),
    "Qwen/Qwen3-32B-FP8-Static-PerTensor": (32.8, 31.2),
    "meta-llama/Meta-Llama-3.1-8B": (8.03, None),
    "meta-llama/Meta-Llama-3.1-70B": (70.6, None),
    "meta-llama/Meta-Llama-3.1-405B": (405.0, None),
    "nvidia/Llama-3.1-70B-Instruct-FP8": (70.6, None),
    # Mixture of experts: Qwen3 model cards, Mistral's Mixtral announcement (46.7B).
    "Qwen/Qwen3-30B-A3B": (30.5, 29.9),
    "Qwen/Qwen3-30B-A3B-FP8": (30.5, 29.9),
    "Qwen/Qwen3-235B-A22B": (235.0, 234.0),
    "mistralai/Mixtral-8x7B-v0.1": (46.7, None),
    # OpenAI's gpt-oss model card: 20.91B and 116.83B in all.
    "openai/gpt-oss-20b": (20.9, None),
    "openai/gpt-oss-120b": (116.8, None),
    # DeepSeek-V3 technical report: 671B total (the multi-token-prediction module's 14B not loaded).
    "deepseek-ai/DeepSeek-V3": (671.0, None),
    "deepseek-ai/DeepSeek-R1": (671.0, None),
    # Written for kvsim from the published configs: the model cards' counts check them (Qwen: total
    # and non-embedding; Meta: 1.23B / 3.21B; Mistral: 7.25B / 12.2B / 23.6B; Microsoft: 14.7B).
    "Qwen/Qwen3-4B": (4.0, 3.6),
    "Qwen/Qwen3-14B": (14.8, 13.2),
    "Qwen/Qwen2.5-0.5B": (0.49, 0.36),
    "Qwen/Qwen2.5-1.5B": (1.54, 1.31),
    "Qwen/Qwen2.5-3B": (3.09, 2.77),
    "Qwen/Qwen2.5-14B": (14.7, 13.1),
    "Qwen/Qwen2.5-32B": (32.5, 31.0),
    "Qwen/Qwen2.5-72B": (72.7, 70.0),
    "meta-llama/Llama-3.2-1B": (1.23, None),
    "meta-llama/Llama-3.2-3B": (3.21, None),
    "mistralai/Mistral-7B-v0.3": (7.25, None),
    "mistralai/Mistral-Nemo-Base-2407": (12.2, None),
    "mistralai/Mistral-Small-24B-Base-2501": (23.6, None),
    "microsoft/phi-4": (14.7, None),
    # Mistral's Mixtral 8x22B announcement (141B), the Qwen3-Coder model card (480B).
    "mistralai/Mixtral-8x22B-v0.1": (141.0, None),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (480.0, None),
}

#: Published activated parameters (billions) of the mixture-of-experts configs (Qwen3 model cards:
#: "3.3B activated", "22B activated"; Mixtral: 12.9B per token).
ACTIVE = {
    "Qwen/Qwen3-30B-A3B": 3.3,
    "Qwen/Qwen3-30B-A3B-FP8": 3.3,
    "Qwen/Qwen3-235B-A22B": 22.0,
    "mistralai/Mixtral-8x7B-v0.1": 12.9,
    "deepseek-ai/DeepSeek-V3": 37.0,
    "deepseek-ai/DeepSeek-R1": 37.0,
    "mistralai/Mixtral-8x22B-v0.1": 39.0,
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": 35.0,
    "Qwen/Qwen3-235B-A22B-FP8": 22.0,
}

#: Declared dtypes (weights, KV) of the quantised checkpoints (``fp8_block``: fp8 with a ``weight_block_size``);
#: every other shipped config is bf16/bf16.
QUANTISED = {
    "Qwen/Qwen3-32B-FP8": ("fp8_block", "bf16"),  # block-scaled fp8 weights, no KV scheme
    "Qwen/Qwen3-32B-FP8-Static-PerTensor": ("fp8", "fp8"),
    "nvidia/Llama-3.1-70B-Instruct-FP8": ("fp8", "fp8"),  # from its sibling hf_quant_config.json
    "Qwen/Qwen3-30B-A3B-FP8": ("fp8_block", "bf16"),
    "deepseek-ai/DeepSeek-V3": ("fp8_block", "bf16"),  # block-scaled fp8 weights
    "deepseek-ai/DeepSeek-R1": ("fp8_block", "bf16"),
    "moonshotai/Kimi-K2-Instruct": ("fp8_block", "bf16"),
    "MiniMaxAI/MiniMax-M2.5": ("fp8_block", "bf16"),
    "MiniMaxAI/MiniMax-M2.7": ("fp8_block", "bf16"),
    "Qwen/Qwen3-235B-A22B-FP8": ("fp8_block", "bf16"),
    "stepfun-ai/Step-3.7-Flash-FP8": ("fp8_block", "bf16"),
    # NVIDIA ModelOpt NVFP4 checkpoints: 4-bit weights, fp8 KV cache.
    "nvidia/DeepSeek-V3.1-NVFP4": ("nvfp4", "fp8"),
    "nvidia/Kimi-K2.5-NVFP4": ("nvfp4", "fp8"),
    "nvidia/Kimi-K2.6-NVFP4": ("nvfp4", "fp8"),
    "nvidia/Kimi-K2.7-Code-NVFP4": ("nvfp4", "fp8"),
    "nvidia/Qwen3-235B-A22B-NVFP4": ("nvfp4", "fp8"),
    "nvidia/MiniMax-M2.5-NVFP4": ("nvfp4", "fp8"),
    "nvidia/MiniMax-M2.7-NVFP4": ("nvfp4", "fp8"),
}


def _config_file(ident: str) -> Path:
    return MODELS_DIR / (ident.replace("/", "--", 1) + "_config.json")


def test_the_shipped_set():
    assert len(shipped_models()) == 56
    assert {
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-32B",
        "Qwen/Qwen3-VL-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-405B",
        "nvidia/Llama-3.1-70B-Instruct-FP8",
    } <= set(shipped_models())
    assert (MODELS_DIR / "LICENSE").is_file() and (MODELS_DIR / "SOURCE.md").is_file()


@pytest.mark.parametrize("ident", shipped_models())
def test_every_shipped_config_is_read(ident):
    path = _config_file(ident)
    raw = json.loads(path.read_text())
    cfg = raw.get("text_config", raw)
    hf = read_hf_config(path)
    m = hf.spec
    assert m.name == ident
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.intermediate, m.vocab, m.max_position) == (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg["max_position_embeddings"],
    )
    if "kv_lora_rank" in cfg:  # MLA: the query/key head width
        assert m.head_dim == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] == 192
    else:
        assert m.head_dim == cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    if "kv_lora_rank" in cfg:
        assert m.mla is not None and m.sliding_window is None
    elif "layer_types" in cfg:  # gpt-oss: sliding and full layers alternate
        assert m.layer_types == tuple(cfg["layer_types"]) and m.sliding_window == cfg["sliding_window"]
    else:
        assert m.sliding_window is None and m.layer_types == ()
    assert (hf.weight_dtype, hf.kv_dtype) == QUANTISED.get(ident, ("bf16", "bf16"))
    # Resolvable by its Hugging Face id and by its model name alone.
    assert resolve_hf_config(ident) == path
    assert resolve_hf_config(ident.split("/")[1]) == path


@pytest.mark.parametrize("ident", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_size(ident):
    m = read_hf_config(_config_file(ident)).spec
    total, non_embedding = PUBLISHED[ident]
    assert m.params == pytest.approx(total * 1e9, rel=0.02)
    if non_embedding is not None:
        tied = json.loads(_config_file(ident).read_text())["tie_word_embeddings"]
        embed = m.vocab * m.hidden * (1 if tied else 2)
        assert m.params - embed == pytest.approx(non_embedding * 1e9, rel=0.02)
    if ident in ACTIVE:
        assert m.active_params == pytest.approx(ACTIVE[ident] * 1e9, rel=0.03)
    elif m.moe is None:
        assert m.active_params == m.params


def test_qwen3_32b_by_hand():
    """64 layers of Q (5120x8192), K and V (5120x1024 each), O (8192x5120), gate/up/down (5120x25600),
    two norms and the per-head Q/K norms; untied embeddings and LM head; the final norm."""
    m = read_hf_config(_config_file("Qwen/Qwen3-32B")).spec
    layer = 5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 3 * 5120 * 25600 + 2 * 5120 + 2 * 128
    assert m.params == 64 * layer + 2 * 151936 * 5120 + 5120 == 32_762_123_264


def test_vision_language_configs_use_the_text_tower():
    vl = read_hf_config(_config_file("Qwen/Qwen3-VL-8B-Instruct")).spec
    text = read_hf_config(_config_file("Qwen/Qwen3-8B")).spec
    assert (vl.layers, vl.hidden, vl.heads, vl.kv_heads, vl.head_dim, vl.intermediate, vl.vocab) == (
        text.layers,
        text.hidden,
        text.heads,
        text.kv_heads,
        text.head_dim,
        text.intermediate,
        text.vocab,
    )
    assert vl.kv_bytes_per_token("bf16") == text.kv_bytes_per_token("bf16")
    # The vision encoder's weights are in GPU memory too: counted on top of the text tower.
    assert 0.3e9 < vl.params - text.params < 0.8e9
    # Tied embeddings read from the text config (VL-2B) or the top level (VL-32B).
    assert (
        read_hf_config(_config_file("Qwen/Qwen3-VL-2B-Instruct")).spec.params
        < read_hf_config(_config_file("Qwen/Qwen3-1.7B")).spec.params + 0.8e9
    )


def test_text_config_nesting_and_top_level_fallback(tmp_path):
    cfg = {
        "model_type": "wrapper_vl",
        "tie_word_embeddings": True,
        "vision_config": {"model_type": "none"},
        "text_config": {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "hidden_size": 256,
            "num_attention_heads": 4,
            "intermediate_size": 512,
            "vocab_size": 1000,
            "torch_dtype": "float16",
        },
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    hf = read_hf_config(p)
    m = hf.spec
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (2, 256, 4, 4, 64)  # MHA, head_dim = 256/4
    assert m.params == 1000 * 256 + 2 * (256 * 12 * 64 + 4 * 64 * 256 + 3 * 256 * 512 + 2 * 256) + 256  # tied
    assert (hf.weight_dtype, hf.kv_dtype) == ("fp16", "fp16")
    assert m.name == tmp_path.name  # config.json: named after its folder
    assert resolve_hf_config(str(tmp_path)) == p  # a folder holding config.json


def test_catalog_qwen3_entries_equal_their_configs():
    for name, ident in (("qwen3-8b", "Qwen/Qwen3-8B"), ("qwen3-32b", "Qwen/Qwen3-32B")):
        cat, hf = MODELS[name], read_hf_config(_config_file(ident)).spec
        assert (
            cat.layers,
            cat.hidden,
            cat.heads,
            cat.kv_heads,
            cat.head_dim,
            cat.intermediate,
            cat.vocab,
            cat.max_position,
            cat.qk_norm,
        ) == (
            hf.layers,
            hf.hidden,
            hf.heads,
            hf.kv_heads,
            hf.head_dim,
            hf.intermediate,
            hf.vocab,
            hf.max_position,
            True,
        )
        assert cat.params == pytest.approx(hf.params, rel=1e-3)


def test_projection_shapes_use_heads_times_head_dim():
    """Qwen3-32B: 64 heads x 128 = 8192 != hidden 5120. QKV is (64 + 2*8)*128 wide, O maps 8192 -> 5120."""
    k = shape_keys(MODELS["qwen3-32b"], 1, "bf16", "bf16")
    assert (k.qkv, k.o) == ("10240x5120:bf16", "5120x8192:bf16")
    k8 = shape_keys(MODELS["qwen3-32b"], 8, "bf16", "bf16")
    assert (k8.qkv, k8.o, k8.attention) == ("1280x5120:bf16", "5120x1024:bf16", "8/1/128:bf16")


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,field",
    [
        ("Qwen--Qwen3.5-27B", "layer_types='linear_attention'"),
        ("nvidia--Nemotron-H-56B-Base-8K", "hybrid_override_pattern="),
    ],
)
def test_unsupported_published_configs_are_one_line(name, field):
    with pytest.raises(ConfigError) as e:
        read_hf_config(DATA / f"{name}_config.json")
    msg = str(e.value)
    assert msg.startswith("model.hf_config: ") and "\n" not in msg
    assert field in msg and "not supported yet" in msg


DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


@pytest.mark.parametrize(
    "extra,needle",
    [
        (
            {"kv_lora_rank": 512, "q_lora_rank": 1536},
            "'qk_rope_head_dim' must be an integer >= 1 for multi-head latent attention",
        ),
        ({"q_lora_rank": 1024}, "q_lora_rank=1024: compressed attention without a kv_lora_rank latent"),
        ({"index_topk": 2048}, "index_topk=2048: sparse attention over an indexer's top-k tokens"),
        ({"attention_chunk_size": 8192}, "attention_chunk_size=8192: chunked local attention"),
        (
            {
                "block_configs": [
                    {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
                    {"attention": {"no_op": False}, "ffn": {"ffn_mult": 5.25}},
                ]
            },
            "block_configs: per-layer block shapes (1 of 2 layers without attention",
        ),
        ({"layers_block_type": ["mamba", "attention"]}, "state-space (mamba) layers"),
        ({"global_head_dim": 512, "head_dim": 64}, "global_head_dim=512"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantisation 'awq' not supported yet"),
        ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A16_AWQ"}}, "quantisation 'w4a16_awq'"),
        ({"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}}, "4-bit int"),
        ({"quantization_config": {"quant_method": "fp8", "kv_cache_scheme": "int8"}}, "KV-cache quantisation 'int8'"),
    ],
)
def test_unsupported_features_name_their_field(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        read_hf_config(write_config(tmp_path, {**DENSE, **extra}))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("drop", ["num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size"])
def test_missing_required_field(tmp_path, drop):
    cfg = {k: v for k, v in DENSE.items() if k != drop}
    with pytest.raises(ConfigError, match=f"'{drop}'"):
        read_hf_config(write_config(tmp_path, cfg))


def test_bad_json_and_missing_file(tmp_path):
    p = tmp_path / "x_config.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        read_hf_config(p)
    with pytest.raises(ConfigError, match="shipped model: .*Qwen/Qwen3-0.6B"):
        resolve_hf_config("no/such-model")


# --- attention layout -----------------------------------------------------------------------


def test_per_layer_attention_types_are_kept():
    m = read_hf_config(DATA / "dense-gpt-oss-layout_config.json").spec
    assert m.sliding_window == 128 and len(m.layer_types) == 24
    assert m.layer_types[:2] == (SLIDING, FULL) and m.sliding_layers == 12
    # Not every layer slides: KV is held per layer group (tests/test_layer_groups.py); an allocator
    # that holds all layers alike keeps the whole length.
    assert m.uniform_sliding_window is None and m.mixed_window == 128 and m.kv_tokens_held(10_000) == 10_000


@pytest.mark.parametrize(
    "extra,window,sliding",
    [
        ({"sliding_window": 4096}, 4096, 4),  # Mistral: every layer
        ({"sliding_window": 4096, "use_sliding_window": False}, None, 0),  # Qwen: declared but off
        ({"sliding_window": 32768, "use_sliding_window": True, "max_window_layers": 3}, 32768, 1),  # Qwen2: last layer
        ({"sliding_window": 1024, "sliding_window_pattern": 2}, 1024, 2),  # Gemma-3 style: every 2nd is global
        ({"sliding_window": None}, None, 0),
    ],
)
def test_sliding_window_forms(tmp_path, extra, window, sliding):
    m = read_hf_config(write_config(tmp_path, {**DENSE, **extra})).spec
    assert m.sliding_window == window and m.sliding_layers == sliding
    assert m.uniform_sliding_window == (window if sliding == 4 else None)
    assert m.mixed_window == (window if 0 < sliding < 4 else None)


# --- quantisation ---------------------------------------------------------------------------


def test_quant_from_a_sibling_file(tmp_path):
    shutil.copy(_config_file("nvidia/Llama-3.1-70B-Instruct-FP8"), tmp_path / "config.json")
    assert read_hf_config(tmp_path / "config.json").weight_dtype == "bf16"  # no sibling yet
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    hf = read_hf_config(tmp_path / "config.json")
    assert (hf.weight_dtype, hf.kv_dtype, hf.quant_source.name) == ("fp8", "bf16", "hf_quant_config.json")


def test_nvfp4_checkpoints_read_as_nvfp4_weights(tmp_path):
    # NVIDIA Model Optimizer's NVFP4 checkpoints (Blackwell): 4-bit weights, fp8 KV cache.
    cfg = {**DENSE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    hf = read_hf_config(write_config(tmp_path, cfg))
    assert (hf.weight_dtype, hf.kv_dtype) == ("nvfp4", "bf16")
    write_config(tmp_path, DENSE, "m_config.json")
    (tmp_path / "m_hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}})
    )
    hf = read_hf_config(tmp_path / "m_config.json")
    assert (hf.weight_dtype, hf.kv_dtype) == ("nvfp4", "fp8")


def test_conflicting_quant_declarations(tmp_path):
    cfg = {**DENSE, "quantization_config": {"quant_method": "fp8"}}
    write_config(tmp_path, cfg, "m_config.json")
    (tmp_path / "m_hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
    )
    hf = read_hf_config(tmp_path / "m_config.json")  # complementary: weights from one, KV from the other
    assert (hf.weight_dtype, hf.kv_dtype) == ("fp8", "fp8")
    cfg["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float"}
    (tmp_path / "m_config.json").write_text(json.dumps(cfg))
    assert read_hf_config(tmp_path / "m_config.json").kv_dtype == "fp8"


# --- scenarios ------------------------------------------------------------------------------


def _scenario(model: dict, **sections):
    return scenario_from_dict({"model": model, **sections})


def test_scenario_takes_shape_name_and_dtypes_from_the_config():
    sc = _scenario({"hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8"}, gpu={"name": "H200-SXM-141GB"})
    assert sc.model.name == "nvidia/Llama-3.1-70B-Instruct-FP8"
    assert (sc.model.weight_dtype, sc.model.kv_dtype) == ("fp8", "fp8")
    m = model_spec(sc)
    assert (m.layers, m.hidden, m.kv_heads) == (80, 8192, 8)
    dep = Deployment.from_scenario(sc)
    # fp8 linear layers, the token embedding and LM head (untied) in bf16: one byte a parameter plus one
    # more for each of those 2 x 128,256 x 8,192
    assert m.embedding_params == 2 * 128256 * 8192 and not m.tied_embeddings
    assert dep.kv_bytes_per_token == 2 * 80 * 8 * 128 * 1 and dep.weight_bytes == int(m.params + m.embedding_params)
    assert dep.make_cost_model(sc).name == "h200-sxm"


def test_quantized_checkpoints_keep_embeddings_and_lm_head_in_16_bits():
    """fp8 and fp4 checkpoints quantize the linear layers only: the embedding table and the LM head stay
    in bf16 (tied: one matrix), so their bytes do not shrink and the LM-head GEMM is priced at bf16."""
    from dataclasses import replace

    from sim.catalog import get_gpu, get_model
    from sim.cost.profile import load_profile
    from sim.cost.profile_model import ProfileCostModel

    q = get_model("qwen3-32b")
    assert q.embedding_params == 2 * 151936 * 5120
    assert q.weight_bytes("fp8") == int(q.params + q.embedding_params)
    assert q.weight_bytes("bf16") == int(2 * q.params)
    tied = replace(q, tied_embeddings=True)
    assert tied.embedding_params == 151936 * 5120 and tied.weight_bytes("fp8") == int(q.params + 151936 * 5120)
    h100 = load_profile("h100-sxm")
    fp8 = ProfileCostModel(h100, q, get_gpu("H100-SXM-80GB"), weight_dtype="fp8")
    assert fp8.keys.lm_head.endswith(":bf16") and fp8.keys.qkv.endswith(":fp8")
    bf16 = ProfileCostModel(h100, q, get_gpu("H100-SXM-80GB"), weight_dtype="bf16")
    assert fp8.keys.lm_head == bf16.keys.lm_head


def test_qk_norm_follows_the_model_type_and_can_be_set():
    assert read_hf_config(_config_file("Qwen/Qwen3-8B")).spec.qk_norm
    assert not read_hf_config(_config_file("meta-llama/Meta-Llama-3.1-8B")).spec.qk_norm
    assert not MODELS["llama-3.1-8b"].qk_norm
    assert model_spec(_scenario({"hf_config": "Qwen/Qwen3-32B", "qk_norm": False})).qk_norm is False
    assert model_spec(scenario_from_dict({"model": {"name": "llama-3.1-8b", "qk_norm": True}})).qk_norm


def test_explicit_values_override_the_config():
    sc = _scenario(
        {"hf_config": "Qwen/Qwen3-32B-FP8-Static-PerTensor", "kv_dtype": "bf16", "layers": 32, "name": "my-qwen"}
    )
    assert (sc.model.weight_dtype, sc.model.kv_dtype) == ("fp8", "bf16")
    m = model_spec(sc)
    assert (m.layers, m.hidden, m.name) == (32, 5120, "my-qwen*")


def test_catalog_name_and_hf_config_conflict():
    with pytest.raises(ConfigError, match="^model.name: got 'llama-3.1-8b'; a label"):
        _scenario({"name": "llama-3.1-8b", "hf_config": "Qwen/Qwen3-8B"})


def test_resolved_scenario_reloads_identically():
    sc = _scenario({"hf_config": "Qwen/Qwen3-32B-FP8"})
    again = scenario_from_dict(sc.model_dump(mode="json", exclude_none=True))
    assert again.model == sc.model and model_spec(again) == model_spec(sc)


def test_paths_resolve_against_the_scenario_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    shutil.copy(_config_file("Qwen/Qwen3-8B"), tmp_path / "cfg" / "config.json")
    sc = scenario_from_dict({"model": {"hf_config": "cfg/config.json"}}, base_dir=tmp_path)
    assert sc.model.name == "cfg" and model_spec(sc).layers == 36
    with pytest.raises(ConfigError, match="^model.hf_config: got 'cfg/missing.json'"):
        scenario_from_dict({"model": {"hf_config": "cfg/missing.json"}}, base_dir=tmp_path)


# --- untrusted uploads (the explorer) -------------------------------------------------------


def test_explorer_accepts_only_shipped_model_configs(tmp_path):
    """``model.hf_config`` names a file: an upload may only name a shipped config, which is never a
    path of the user's choosing (the file given here is refused before anything reads it)."""
    from sim import explorer as X
    from sim.config import file_fields

    assert "hf_config" in file_fields()
    out = X.resolve_paths({"model": {"hf_config": "Qwen/Qwen3-8B"}})
    assert out["model"]["hf_config"] == str(_config_file("Qwen/Qwen3-8B"))
    assert X.resolve_scenario({"model": {"hf_config": "Qwen/Qwen3-8B"}}).model.name == "Qwen/Qwen3-8B"
    outside = tmp_path / "config.json"
    outside.write_text("{}")
    for ref in (str(outside), str(tmp_path), "models/Qwen--Qwen3-8B_config.json", "Qwen3-8B", ["x"]):
        with pytest.raises(ConfigError, match="^model.hf_config: got .*the id of a shipped model config"):
            X.resolve_paths({"model": {"hf_config": ref}})


def test_explorer_model_pick_replaces_the_config():
    from sim import explorer as X

    base = {"model": {"hf_config": "Qwen/Qwen3-8B"}}
    assert X.knobs_from_scenario(base)["model.name"] == "Qwen/Qwen3-8B"
    edited = X.edited_scenario(base, {"model.name": "llama-3.1-8b"})
    assert model_spec(scenario_from_dict(edited)) == MODELS["llama-3.1-8b"]
    assert X.edited_scenario(base, {"model.name": "Qwen/Qwen3-8B"}) == base  # unchanged pick: no edit


def test_explorer_model_pick_of_a_shipped_config():
    """The page's model picker offers the shipped configs; picking one makes the config the model."""
    from sim import explorer as X

    choices = X.model_choices()
    assert "llama-3.1-8b" in choices and "Qwen/Qwen3-30B-A3B" in choices and "deepseek-ai/DeepSeek-V3" in choices
    base = {"model": {"name": "llama-3.1-8b"}}
    edited = X.edited_scenario(base, {"model.name": "Qwen/Qwen3-30B-A3B"})
    assert edited["model"]["hf_config"] == "Qwen/Qwen3-30B-A3B" and edited["model"].get("name") is None
    m = model_spec(scenario_from_dict(edited))
    assert m.name == "Qwen/Qwen3-30B-A3B" and m.moe is not None and m.moe.experts == 128
    # And back to a catalog model.
    again = X.edited_scenario(edited, {"model.name": "llama-3.1-8b"})
    assert model_spec(scenario_from_dict(again)) == MODELS["llama-3.1-8b"]


def test_a_variant_id_says_which_shape_and_dtypes_it_runs_as(tmp_path):
    """A re-release found by its shape runs with that config's dtypes, and says so; known ids,
    catalog names and paths say nothing."""
    from sim.model_ids import model_argument, variant_note

    note = variant_note("moonshotai/Kimi-K2.6", model_argument("moonshotai/Kimi-K2.6"))
    assert note is not None and "nvidia/Kimi-K2.6-NVFP4 and its nvfp4 weights, fp8 KV cache" in note
    note = variant_note("Qwen/Qwen3-30B-A3B-Instruct-2507", model_argument("Qwen/Qwen3-30B-A3B-Instruct-2507"))
    assert note is not None and "shape of Qwen/Qwen3-30B-A3B and its bf16 weights" in note
    for ident in ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "deepseek-ai/DeepSeek-R1"):
        assert variant_note(ident, model_argument(ident)) is None
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", "chat-api", "--model", "Qwen/Qwen3-30B-A3B-Instruct-2507", "--quiet"]
        + ["--set", "workload.num_requests=5", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "simulated with the shape of Qwen/Qwen3-30B-A3B" in r.stderr, r.stderr


@pytest.mark.parametrize("given", ["folder", "folder/", "file"])
def test_a_local_config_says_no_variant_note(tmp_path, monkeypatch, given):
    """A folder holding config.json (with or without its slash, relative or not) is the config itself,
    not an id matched to a shipped shape."""
    from sim.model_ids import model_argument, variant_note

    (tmp_path / "myft").mkdir()
    write_config(tmp_path / "myft", DENSE, "config.json")
    monkeypatch.chdir(tmp_path)
    arg = {"folder": "myft", "folder/": "myft/", "file": "myft/config.json"}[given]
    for ident in (arg, str(tmp_path / arg)):
        section = model_argument(ident)
        assert Path(section["hf_config"]).resolve() == (tmp_path / arg).resolve()
        assert variant_note(ident, section) is None


def test_explicit_kv_heads_must_divide_the_heads(tmp_path):
    """Explicit dims meet the same rule as a config's (grouped-query attention: each KV head serves
    an equal share of the query heads), one check for both."""
    dims = {"layers": 4, "hidden": 512, "heads": 8, "head_dim": 64, "intermediate": 1024, "params": 1e8}
    for bad in (3, 16):
        for model in (
            {"name": "custom", **dims, "kv_heads": bad},
            {"name": "llama-3.1-8b", "kv_heads": bad * 4},  # 32 query heads
            {"hf_config": "Qwen/Qwen3-8B", "kv_heads": bad * 4},  # 32 query heads
        ):
            with pytest.raises(ConfigError) as e:
                model_spec(_scenario(model))
            msg = str(e.value)
            assert msg.startswith(f"model.kv_heads: got {model['kv_heads']}; a divisor of model.heads"), msg
            assert "\n" not in msg
    assert model_spec(_scenario({"name": "custom", **dims, "kv_heads": 2})).kv_heads == 2
    # Query heads changed under the catalog's KV heads: the KV heads are named, with what divides.
    with pytest.raises(ConfigError, match=r"^model\.kv_heads: got 8; a divisor of model\.heads \(12\)"):
        model_spec(_scenario({"name": "llama-3.1-8b", "heads": 12}))
    # The config reader says the same of a config.json.
    with pytest.raises(ConfigError, match=r"num_key_value_heads \(16\) must be a divisor of num_attention_heads \(8\)"):
        read_hf_config(write_config(tmp_path, {**DENSE, "num_key_value_heads": 16}))


def test_config_layers_have_the_cap_of_model_layers(tmp_path):
    from sim.limits import MAX_LAYERS

    assert MAX_LAYERS == 4096
    cfg = {**DENSE, "model_type": "gemma3_text", "sliding_window": 512, "num_hidden_layers": 10**8}
    with pytest.raises(ConfigError) as e:
        read_hf_config(write_config(tmp_path, cfg))
    msg = str(e.value)
    assert "'num_hidden_layers' must be an integer in [1, 4096]" in msg and "100000000" in msg, msg
    assert (
        read_hf_config(write_config(tmp_path, {**DENSE, "num_hidden_layers": 4096}, "ok_config.json")).spec.layers
        == 4096
    )


def test_command_line_model_takes_variant_ids():
    """``--model`` with an id that names a variant of a shipped or catalog shape runs that shape; an
    id of no known shape is left for the config reader to refuse with its list."""
    from sim.model_ids import model_argument

    assert model_argument("Qwen/Qwen3-30B-A3B-Instruct-2507") == {"name": None, "hf_config": "Qwen/Qwen3-30B-A3B"}
    assert model_argument("meta-llama/Llama-3.1-8B-Instruct") == {"name": "llama-3.1-8b"}
    assert model_argument("deepseek-ai/DeepSeek-R1") == {"hf_config": "deepseek-ai/DeepSeek-R1"}
    assert model_argument("llama-3.1-8b") == {"name": "llama-3.1-8b"}
    assert model_argument("google/gemma-2-9b-it") == {"hf_config": "google/gemma-2-9b-it"}
    with pytest.raises(ConfigError, match="shipped model: .*deepseek-ai/DeepSeek-R1"):
        resolve_hf_config("google/gemma-2-9b-it")
