"""KV arithmetic equals hand computation for every catalog model."""

import pytest

from sim.catalog import GPUS, MODELS, GiB, kv_capacity_bytes

# 2 · layers · kv_heads · head_dim · bytes, worked out by hand from each model's config.json.
HAND_BF16 = {
    "llama-2-7b": 2 * 32 * 32 * 128 * 2,  # 524,288
    "llama-2-13b": 2 * 40 * 40 * 128 * 2,  # 819,200
    "llama-2-70b": 2 * 80 * 8 * 128 * 2,  # 327,680
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,  # 131,072
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,  # 327,680
    "mistral-7b": 2 * 32 * 8 * 128 * 2,  # 131,072
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,  # 57,344
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,  # 147,456
    "qwen3-32b": 2 * 64 * 8 * 128 * 2,  # 262,144 (heads x head_dim 8192 != hidden 5120: KV uses head_dim)
    "tiny-llama": 2 * 4 * 4 * 32 * 2,  # 2,048
    "flan-t5-xl": 2 * 24 * 32 * 64 * 2,  # 196,608 per input token (cross-attn) and per output token (self-attn)
}


def test_every_catalog_model_has_a_hand_figure():
    assert set(HAND_BF16) == set(MODELS)


@pytest.mark.parametrize("name", sorted(HAND_BF16))
def test_kv_bytes_per_token(name):
    m = MODELS[name]
    assert m.kv_bytes_per_token("bf16") == HAND_BF16[name]
    assert m.kv_bytes_per_token("fp8") == HAND_BF16[name] // 2
    assert m.kv_bytes_per_token("int4") == HAND_BF16[name] // 4


def test_llama31_8b_figure():
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token("bf16") == 131_072


def test_capacity_formula():
    m, g = MODELS["llama-3.1-8b"], GPUS["H100-SXM-80GB"]
    cap = kv_capacity_bytes(m, g, 1, 0.9, "bf16", 2 * GiB)
    # The H100 keeps aiconfigurator's 80 GiB (sim/catalog.py says why).
    mem = 80 * GiB
    assert cap == int(mem * 0.9) - int(8.03e9 * 2) - 2 * GiB
    assert kv_capacity_bytes(m, g, 2, 0.9, "bf16", 2 * GiB) == int(2 * mem * 0.9) - int(8.03e9 * 2) - 2 * GiB


def test_sliding_window_caps_held_tokens():
    m = MODELS["mistral-7b"]
    assert m.kv_tokens_held(10_000) == 4096
    assert m.kv_tokens_held(100) == 100


def test_kv_heads_replicated_when_fewer_than_gpus():
    """Engines replicate KV heads when a replica has more GPUs than KV heads: Qwen2.5-3B's 2 KV heads
    on 4 GPUs keep every token twice (on 8, four times), so the replica holds half (a quarter of) the
    tokens its bytes would suggest. (Qwen2.5-7B's 4 KV heads on 8 GPUs would too, but its 28 query
    heads do not split over 8: vLLM refuses that, and so does kvsim, test_tensor_parallel.)"""
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.deployment import Deployment

    assert [MODELS["qwen2.5-7b"].kv_replicas(tp) for tp in (1, 2, 4, 8)] == [1, 1, 1, 2]
    assert MODELS["llama-3.1-70b"].kv_replicas(8) == 1
    data, base = read_scenario_dict("chat-api")
    deps = {}
    for tp in (2, 4, 8):
        over = {"model": {"hf_config": "Qwen/Qwen2.5-3B"}, "gpu.tensor_parallel": tp}
        deps[tp] = Deployment.from_scenario(scenario_from_dict(apply_overrides(data, over), base_dir=base))
    m = deps[2].model
    assert (m.heads, m.kv_heads) == (16, 2)
    one = m.kv_bytes_per_token("bf16")
    assert [deps[tp].kv_bytes_per_token for tp in (2, 4, 8)] == [one, 2 * one, 4 * one]
    assert deps[8].kv_capacity_tokens == deps[8].kv_capacity_bytes // (4 * one)
