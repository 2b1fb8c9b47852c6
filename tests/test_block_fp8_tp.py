"""vLLM refuses a block-scaled fp8 checkpoint (``weight_block_size [128, 128]``) at a tensor-parallel
degree that leaves a GPU a weight shard of partial blocks: Qwen3-235B-A22B-FP8 at TP8 fails with
"The output_size of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128"
(vllm-project/vllm#17569), as its 1536-wide experts split into 192-wide shards."""

from __future__ import annotations

import json

import pytest

from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.deployment import Deployment, model_spec
from sim.errors import ConfigError
from sim.model_ids import model_argument
from tests.helpers import write_config

MODELS = "scenarios/models"


def _scenario(model: dict | str, tp: int, gpu: str = "H200-SXM", **over):
    data, base = read_scenario_dict("chat-api")
    section = model_argument(model) if isinstance(model, str) else model
    sets = {"gpu.name": gpu, "gpu.tensor_parallel": tp, **over}
    return scenario_from_dict(apply_overrides({**data, "model": section}, sets), base_dir=base)


def _refusal(model: dict | str, tp: int, **over) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        Deployment.from_scenario(_scenario(model, tp, **over))
    return exc.value


def test_qwen3_235b_fp8_at_tp8_is_refused_under_vllm_naming_the_expert_shard():
    err = _refusal("Qwen/Qwen3-235B-A22B-FP8", 8)
    assert (err.key, err.value) == ("gpu.tensor_parallel", 8)
    assert "1536/8 = 192" in err.allowed and "block_n = 128" in err.allowed
    assert "routed experts' gate/up_proj" in err.allowed
    assert err.allowed.startswith("one of 1, 2, 4 for Qwen/Qwen3-235B-A22B-FP8")
    assert "vLLM" in err.allowed and "vllm-project/vllm#17569" in err.allowed
    # engine.kind auto runs vLLM on a GPU, so the same refusal: the scenario above left it at auto.
    assert _refusal("Qwen/Qwen3-235B-A22B-FP8", 8, **{"engine.kind": "vllm"}).allowed == err.allowed


def test_qwen3_235b_fp8_at_tp4_loads_and_vllm_and_sglang_are_held_to_the_rule():
    assert Deployment.from_scenario(_scenario("Qwen/Qwen3-235B-A22B-FP8", 4)).kv_capacity_tokens > 0
    # vLLM's and SGLang's refusal (sgl-project/sglang#26107); TensorRT-LLM's runs are not changed.
    Deployment.from_scenario(_scenario("Qwen/Qwen3-235B-A22B-FP8", 8, **{"engine.kind": "trtllm"}))
    with pytest.raises(ConfigError, match="1536/8 = 192"):
        Deployment.from_scenario(_scenario("Qwen/Qwen3-235B-A22B-FP8", 8, **{"engine.kind": "vllm"}))
    with pytest.raises(ConfigError, match="under SGLang: .*1536/8 = 192.*sgl-project/sglang#26107"):
        Deployment.from_scenario(_scenario("Qwen/Qwen3-235B-A22B-FP8", 8, **{"engine.kind": "sglang"}))


def test_qwen3_30b_fp8_is_refused_at_tp4_and_loads_at_tp2():
    err = _refusal("Qwen/Qwen3-30B-A3B-FP8", 4, gpu="H100-SXM")
    assert (err.key, err.value) == ("gpu.tensor_parallel", 4)
    assert "768/4 = 192" in err.allowed and err.allowed.startswith("one of 1, 2 for ")
    assert Deployment.from_scenario(_scenario("Qwen/Qwen3-30B-A3B-FP8", 2, gpu="H100-SXM")).kv_capacity_tokens > 0


def test_the_bf16_release_loads_at_tp8_where_its_fp8_build_does_not():
    assert Deployment.from_scenario(_scenario("Qwen/Qwen3-235B-A22B", 8)).kv_capacity_tokens > 0
    # fp8_block named over a 16-bit checkpoint: no block size declared, 128 x 128 assumed.
    err = _refusal("Qwen/Qwen3-235B-A22B", 8, **{"model.weight_dtype": "fp8_block"})
    assert "1536/8 = 192" in err.allowed and "assumed" in err.allowed


def test_deepseek_v3_splits_into_whole_blocks_at_every_degree():
    from sim.catalog import block_fp8_shard_problem

    sc = _scenario("deepseek-ai/DeepSeek-V3", 8)
    assert sc.model.weight_dtype == "fp8_block"
    spec = model_spec(sc)
    assert spec.weight_block == (128, 128)
    # Experts 2048/8 = 256, shared expert 2048/8, dense MLP 18432/8 = 2304, q_b_proj 128 x 192 / 8 =
    # 3072, kv_b_proj 128 x 256 / 8 = 4096, o_proj 128 x 128 / 8 = 2048: all whole blocks.
    assert [block_fp8_shard_problem(spec, tp) for tp in (1, 2, 4, 8)] == [None] * 4
    assert Deployment.from_scenario(sc).kv_capacity_tokens > 0


def test_the_checkpoints_block_size_decides(tmp_path):
    cfg = json.load(open(f"{MODELS}/Qwen--Qwen3-30B-A3B-FP8_config.json"))
    cfg["quantization_config"] = {**cfg["quantization_config"], "weight_block_size": [64, 64]}
    path = write_config(tmp_path, cfg)
    sc = _scenario({"hf_config": str(path)}, 4, gpu="H100-SXM")
    assert model_spec(sc).weight_block == (64, 64)
    # 768/4 = 192 is three 64-wide blocks.
    assert Deployment.from_scenario(sc).kv_capacity_tokens > 0
    err = _refusal({"hf_config": str(path)}, 8, gpu="H100-SXM")
    assert "768/8 = 96" in err.allowed and "block_n = 64" in err.allowed


def test_a_malformed_weight_block_size_is_refused(tmp_path):
    cfg = json.load(open(f"{MODELS}/Qwen--Qwen3-30B-A3B-FP8_config.json"))
    cfg["quantization_config"] = {**cfg["quantization_config"], "weight_block_size": [128, 0]}
    path = write_config(tmp_path, cfg)
    with pytest.raises(ConfigError, match="weight_block_size as two positive integers"):
        model_spec(_scenario({"hf_config": str(path)}, 1, gpu="H100-SXM"))


def test_a_capacity_refusal_suggests_only_degrees_vllm_loads():
    err = _refusal("Qwen/Qwen3-235B-A22B-FP8", 2, gpu="H100-SXM")
    assert err.key == "gpu"
    assert "try gpu.tensor_parallel 4," in err.allowed and "4 or 8" not in err.allowed
