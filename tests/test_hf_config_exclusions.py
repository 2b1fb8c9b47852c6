"""Published configs read by what their fields say, not by their presence: MiniMax's ``attn_type_list``
of full-attention layers, the modules a ModelOpt checkpoint leaves unquantised (counted in 16 bits
in weight memory), and the out-of-memory refusal suggesting only what the scenario may change to."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sim.config import scenario_from_dict
from sim.engine.deployment import Deployment
from sim.errors import ConfigError
from sim.hf_config import read_hf_config, resolve_hf_config

DATA = Path(__file__).parents[1] / "scenarios" / "models"  # shipped configs
M27 = DATA / "MiniMaxAI--MiniMax-M2.7_config.json"
DSV31 = DATA / "nvidia--DeepSeek-V3.1-NVFP4_config.json"
KIMI26 = DATA / "nvidia--Kimi-K2.6-NVFP4_config.json"

#: A small dense shape for the configs written here.
DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def _write(folder: Path, cfg: dict, name: str = "config.json") -> Path:
    p = folder / name
    p.write_text(json.dumps(cfg))
    return p


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        read_hf_config(path)
    msg = str(e.value)
    assert msg.startswith("model.hf_config: ") and "\n" not in msg, msg
    return msg


# --- F3: attn_type_list ----------------------------------------------------------------------


def test_minimax_m27_full_attention_list_loads_as_m25():
    """MiniMax-M2.7's ``attn_type_list`` lists 1 (softmax attention) on all 62 layers: the model loads,
    with MiniMax-M2.5's shapes (same architecture, no such key; M2.7 serves 196,608 positions to
    M2.5's 204,800)."""
    m27 = read_hf_config(M27).spec
    m25 = read_hf_config(resolve_hf_config("MiniMaxAI/MiniMax-M2.5")).spec
    assert json.loads(M27.read_text())["attn_type_list"] == [1] * 62
    keep = ("name", "source", "max_position")
    assert replace(m27, **{k: getattr(m25, k) for k in keep}) == m25
    assert m27.params == pytest.approx(228.69e9, rel=1e-4)


def test_attn_type_list_with_linear_layers_is_refused_with_their_count(tmp_path):
    cfg = json.loads(M27.read_text())
    cfg["attn_type_list"] = [0 if i % 20 == 0 else 1 for i in range(62)]  # layers 0, 20, 40, 60
    msg = _error(_write(tmp_path, cfg))
    assert "attn_type_list=" in msg and "4 of 62 linear-attention layers are not supported yet" in msg, msg
    cfg["attn_type_list"] = [1, 2] * 31
    msg = _error(_write(tmp_path, cfg))
    assert "'attn_type_list' must list 0 (linear attention) or 1 (full attention) per layer" in msg, msg


def test_linear_attn_config_is_refused_by_its_linear_layers(tmp_path):
    """Kimi Linear's ``linear_attn_config.kda_layers`` lists the linear (KDA) layers."""
    cfg = {**DENSE, "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]}}
    msg = _error(_write(tmp_path, cfg))
    assert "3 (linear_attn_config.kda_layers) linear-attention layers are not supported yet" in msg, msg
    cfg = {**DENSE, "linear_attn_config": {"kda_layers": [], "full_attn_layers": [1, 2, 3, 4]}}
    assert read_hf_config(_write(tmp_path, cfg)).spec.layers == 4


# --- F5: modules a ModelOpt checkpoint leaves unquantised -------------------------------------


def _scenario(model: dict, gpu: str = "B200-SXM-180GB", tp: int = 8, **gpu_extra):
    return scenario_from_dict(
        {
            "name": "t",
            "model": model,
            "gpu": {"name": gpu, "tensor_parallel": tp, **gpu_extra},
            "workload": {"num_requests": 4, "max_model_len": 4096},
        }
    )


def test_deepseek_v31_nvfp4_counts_its_excluded_attention_in_16_bits():
    """nvidia/DeepSeek-V3.1-NVFP4's hf_quant_config.json excludes, on each of its 61 layers,
    q_a_proj, q_b_proj, kv_a_proj_with_mqa and kv_b_proj (not o_proj); its ``model.layers.61*`` is
    the multi-token-prediction layer kvsim does not count, ``lm_head`` is 16-bit already.

    Per layer (hidden 7168, q_lora_rank 1536, 128 heads of 128 + 64, kv_lora_rank 512, v 128):
    7168·1536 + 1536·128·192 + 7168·576 + 512·128·256
    = 11,010,048 + 37,748,736 + 4,128,768 + 16,777,216 = 69,664,768; × 61 = A = 4,249,550,848.
    P = 671,026,404,352 weights, E = 2 · 129,280 · 7168 = 1,853,358,080 (embedding and LM head).
    Bytes = (P − E − A) · 0.5625 + (E + A) · 2 = 386,225,284,032 (359.70 GiB), against
    (P − E) · 0.5625 + E · 2 = 380,116,554,688 (354.01 GiB) with every linear weight in NVFP4:
    + A · 1.4375 = 6,108,729,344 B."""
    hf = read_hf_config(DSV31)
    assert hf.weight_dtype == "nvfp4" and hf.warnings == ()
    spec = hf.spec
    assert int(spec.params) == 671_026_404_352 and spec.embedding_params == 1_853_358_080
    assert spec.weight_bytes("nvfp4") == 386_225_284_032
    assert spec.unquantized_params == 4_249_550_848
    assert "4.25B weights left unquantised (attention) counted in 16 bits" in spec.source
    # A 16-bit serving of the same shape is every weight at 2 bytes, whatever the exclusions.
    assert spec.weight_bytes("bf16") == int(spec.params) * 2
    sc = _scenario({"hf_config": str(DSV31)})
    assert Deployment.from_scenario(sc).weight_bytes == 386_225_284_032
    # Another build (a per-tensor fp8 one) is not known to keep the same modules in 16 bits.
    sc = _scenario({"hf_config": str(DSV31), "weight_dtype": "fp8"})
    P, E = 671_026_404_352, 1_853_358_080
    assert Deployment.from_scenario(sc).weight_bytes == (P - E) * 1 + E * 2


def test_kimi_k26_nvfp4_counts_attention_shared_experts_and_layer_0_in_16_bits(tmp_path):
    """nvidia/Kimi-K2.6-NVFP4 excludes ``…layers.0*`` (layer 0: attention and its dense MLP) and, on
    layers 1-60, ``…self_attn*`` and ``…mlp.shared_experts*``; ``vision_tower*`` and ``mm_projector*``
    name the vision encoder kvsim does not count (a warning says so already).

    Attention per layer (hidden 7168, q_lora_rank 1536, 64 heads of 128 + 64, kv_lora_rank 512,
    v 128): 7168·1536 + 1536·64·192 + 7168·576 + 512·64·256 + 64·128·7168
    = 11,010,048 + 18,874,368 + 4,128,768 + 8,388,608 + 58,720,256 = 101,122,048; × 61 = 6,168,444,928.
    Shared expert (width 2048): 3·7168·2048 = 44,040,192; × 60 MoE layers = 2,642,411,520.
    Layer 0's dense MLP: 3·7168·18432 = 396,361,728.
    A = 6,168,444,928 + 2,642,411,520 + 396,361,728 = 9,207,218,176.
    P = 1,026,408,209,408, E = 2 · 163,840 · 7168 = 2,348,810,240.
    Bytes = (P − E − A) · 0.5625 + (E + A) · 2 = 593,966,408,640 (553.17 GiB), against
    580,731,032,512 (540.85 GiB) with every linear weight in NVFP4: + A · 1.4375 = 13,235,376,128 B."""
    spec = read_hf_config(KIMI26).spec
    assert int(spec.params) == 1_026_408_209_408 and spec.embedding_params == 2_348_810_240
    assert spec.weight_bytes("nvfp4") == 593_966_408_640
    assert spec.unquantized_params == 9_207_218_176
    assert "(attention, dense MLP, shared experts)" in spec.source
    # The same list read from the hf_quant_config.json alone (the config without its quantization_config).
    cfg = json.loads(KIMI26.read_text())
    del cfg["quantization_config"]
    own = _write(tmp_path, cfg, "nvidia--Kimi-K2.6-NVFP4_config.json")
    shutil.copy(DATA / "nvidia--Kimi-K2.6-NVFP4_hf_quant_config.json", tmp_path)
    assert read_hf_config(own).spec.weight_bytes("nvfp4") == 593_966_408_640


def test_exclusions_that_change_nothing_or_map_to_nothing(tmp_path, caplog):
    """No exclusion list, or one naming only the LM head, leaves the NVFP4 bytes unchanged:
    DENSE has P = 2·1000·256 + 4·(256·(8+8)·32 + 8·32·256 + 3·256·512 + 2·256) + 256
    = 512,000 + 4·590,336 + 256 = 2,873,600 weights, E = 512,000 of them embedding and LM head:
    (P − E)·0.5625 + E·2 = 1,328,400 + 1,024,000 = 2,352,400 B.
    A pattern kvsim cannot map to a weight group is counted at the checkpoint's dtype, and one
    warning line names it."""
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    plain = read_hf_config(_write(tmp_path, {**DENSE, "quantization_config": quant}, "a.json")).spec
    assert int(plain.params) == 2_873_600 and plain.weight_bytes("nvfp4") == 2_352_400
    head = {**quant, "ignore": ["lm_head"]}
    hf = read_hf_config(_write(tmp_path, {**DENSE, "quantization_config": head}, "b.json"))
    assert hf.spec.weight_bytes("nvfp4") == 2_352_400 and hf.warnings == ()
    odd = {**quant, "ignore": ["lm_head", "model.layers.*.mlp.router_bias", "model.layers.2.self_attn.o_proj"]}
    hf = read_hf_config(_write(tmp_path, {**DENSE, "quantization_config": odd}, "c.json"))
    # layer 2's o_proj (8·32·256 = 65,536 weights) is mapped, the router bias is not.
    assert hf.spec.weight_bytes("nvfp4") == 2_352_400 + int(65_536 * 1.4375)
    assert hf.spec.unquantized_params == 65_536
    (line,) = hf.warnings
    assert "1 quantisation exclusion pattern(s)" in line and "model.layers.*.mlp.router_bias" in line, line
    assert "counted at the checkpoint's nvfp4" in line and "\n" not in line
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        _scenario({"hf_config": str(tmp_path / "c.json")}, gpu="H100-SXM-80GB", tp=1)
    assert [r.getMessage() for r in caplog.records if "exclusion" in r.getMessage()] == [line]
    bad = {**quant, "exclude_modules": "lm_head"}
    msg = _error(_write(tmp_path, {**DENSE, "quantization_config": bad}, "d.json"))
    assert "'quantization_config.exclude_modules' must be a list of module names or glob patterns" in msg


# --- F6: the out-of-memory refusal ------------------------------------------------------------


def _oom(model: dict, gpu: str, tp: int, **gpu_extra) -> str:
    sc = _scenario(model, gpu, tp, **gpu_extra)
    with pytest.raises(ConfigError) as e:
        Deployment.from_scenario(sc)
    msg = str(e.value)
    assert msg.startswith("gpu: ") and "leaves nothing" in msg and "\n" not in msg, msg
    return msg


def test_oom_at_tp8_does_not_suggest_a_larger_tensor_parallel():
    msg = _oom({"hf_config": "meta-llama/Meta-Llama-3.1-405B"}, "H100-SXM-80GB", 8)
    assert "raise tensor_parallel" not in msg and "gpu.tensor_parallel" not in msg, msg
    assert "tensor_parallel 8 is the largest allowed" in msg, msg
    # 16-bit weights: fp8 halves them (NVFP4 needs Blackwell's FP4 units, which the H100 lacks).
    assert "model.weight_dtype fp8" in msg and "nvfp4" not in msg, msg
    assert "a GPU with more memory (H200-SXM-141GB, B200-SXM-180GB" in msg, msg


def test_oom_at_tp1_suggests_the_degrees_that_split_the_model():
    msg = _oom({"hf_config": "meta-llama/Meta-Llama-3.1-405B"}, "H100-SXM-80GB", 1)
    assert "gpu.tensor_parallel 2, 4 or 8" in msg and "model.weight_dtype fp8" in msg, msg
    # fp8 weights on a Blackwell GPU: NVFP4 is the narrower dtype left.
    msg = _oom({"hf_config": "meta-llama/Meta-Llama-3.1-405B", "weight_dtype": "fp8"}, "B200-SXM-180GB", 1)
    assert "model.weight_dtype nvfp4" in msg and "fp8 or" not in msg, msg
    # Qwen2.5-7B's 28 heads split over 4 GPUs at most: at TP4 no larger degree is offered.
    msg = _oom({"name": "qwen2.5-7b"}, "L4", 4, gpu_memory_utilization=0.1)
    assert "tensor_parallel 4 is the largest that splits qwen2.5-7b" in msg, msg
    assert "gpu.tensor_parallel" not in msg, msg
