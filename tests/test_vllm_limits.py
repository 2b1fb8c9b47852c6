"""What vLLM refuses to serve, kvsim refuses to simulate, naming the scenario key, the value and what
fits: a pinned KV capacity larger than the GPUs' memory less the weights (``gpu.kv_cache_tokens``),
a ``max_model_len`` beyond the model's context (and the default capped at it), a tensor-parallel
degree that does not split the heads; a vocabulary that TP does not divide is padded as vLLM pads
it, and priced; a card outside the catalog given figures is told to be ``custom``."""

from __future__ import annotations

import json

import pytest

from sim.catalog import GPUS, MODELS, GiB, tensor_parallel_problem
from sim.config import Scenario, apply_overrides, list_scenarios, load_scenario, read_scenario_dict, scenario_from_dict
from sim.cost.profile import gemm_key
from sim.cost.profile_model import padded_vocab, shape_keys
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.errors import ConfigError
from sim.model_ids import model_argument


def _chat(model: str | None = None, **over) -> Scenario:
    """chat-api with ``--model model`` and ``--set`` overrides, as ``kvsim run`` builds it."""
    data, base = read_scenario_dict("chat-api")
    if model is not None:
        data = {**data, "model": model_argument(model)}
    return scenario_from_dict(apply_overrides(data, over), base_dir=base)


# --- gpu.kv_cache_tokens ----------------------------------------------------------------------


def test_a_pinned_kv_capacity_does_not_skip_the_check_that_the_weights_fit():
    # 70B in bf16 (131.4 GiB of weights) on one 80 GB H100: refused with or without the pin.
    for over in ({}, {"gpu.kv_cache_tokens": 20_000}):
        with pytest.raises(ConfigError, match=r"weights 131\.4 GiB") as err:
            Deployment.from_scenario(_chat("meta-llama/Meta-Llama-3.1-70B", **over))
        assert err.value.key == "gpu"


def test_a_pinned_kv_capacity_larger_than_the_gpus_memory_is_refused_with_the_most_that_fits():
    sc = _chat(**{"gpu.name": "L4", "gpu.kv_cache_tokens": 10_000_000})
    weights = MODELS["llama-3.1-8b"].weight_bytes("bf16")
    most = (GPUS["L4"].memory_bytes - weights) // 131_072
    with pytest.raises(ConfigError) as err:
        Deployment.from_scenario(sc)
    assert err.value.key == "gpu.kv_cache_tokens" and err.value.value == 10_000_000
    assert f"at most {most} tokens" in err.value.allowed and "L4" in err.value.allowed
    # The most that fits is accepted (more than kvsim derives: a server's activation reserve may be smaller).
    dep = Deployment.from_scenario(_chat(**{"gpu.name": "L4", "gpu.kv_cache_tokens": most}))
    assert dep.kv_capacity_bytes == most * 131_072 and dep.kv_capacity_bytes + weights <= GPUS["L4"].memory_bytes
    with pytest.raises(ConfigError, match="gpu.kv_cache_tokens"):
        Deployment.from_scenario(_chat(**{"gpu.name": "L4", "gpu.kv_cache_tokens": most + 1}))


def test_the_pin_counts_every_gpu_of_the_replica():
    weights = MODELS["llama-3.1-8b"].weight_bytes("bf16")
    most = (2 * GPUS["L4"].memory_bytes - weights) // 131_072
    Deployment.from_scenario(_chat(**{"gpu.name": "L4", "gpu.tensor_parallel": 2, "gpu.kv_cache_tokens": most}))
    with pytest.raises(ConfigError, match=f"at most {most} tokens"):
        Deployment.from_scenario(_chat(**{"gpu.name": "L4", "gpu.tensor_parallel": 2, "gpu.kv_cache_tokens": most + 1}))


def test_a_pinned_capacity_too_small_for_max_model_len_names_the_pin_as_the_limit():
    with pytest.raises(ConfigError) as err:
        Deployment.from_scenario(_chat(**{"gpu.kv_cache_tokens": 100}))
    assert err.value.key == "workload.max_model_len"
    assert "pinned by gpu.kv_cache_tokens=100" in err.value.allowed
    assert "raise gpu.kv_cache_tokens" in err.value.allowed and "add memory" not in err.value.allowed


def test_a_block_larger_than_half_the_capacity_says_what_the_capacity_is():
    with pytest.raises(ConfigError) as err:
        simulate(
            _chat(
                **{
                    "gpu.kv_cache_tokens": 100,
                    "workload.max_model_len": 64,
                    "allocator.block_size": 128,
                    "workload.num_requests": 1,
                }
            )
        )
    assert err.value.key == "allocator.block_size"
    assert err.value.allowed == "at most 50 tokens (half the KV capacity of one replica, 100 tokens)"


def test_a_reservation_beyond_max_model_len_gives_the_max_model_len():
    with pytest.raises(ConfigError) as err:
        Deployment.from_scenario(_chat(**{"allocator.kind": "static", "allocator.reserve": 99_999}))
    assert err.value.key == "allocator.reserve" and "a token count in [1, 16384]" in err.value.allowed


def test_out_of_memory_names_only_larger_gpus_that_hold_the_weights_at_this_degree():
    # 70B bf16 on a 16 GB card: A10G, L4, the A100-40/80, L40S, H100 and H200 are larger yet cannot
    # hold its 131.4 GiB at one GPU; the message names the ones that can.
    with pytest.raises(ConfigError) as err:
        Deployment.from_scenario(_chat("meta-llama/Meta-Llama-3.1-70B", **{"gpu.name": "cpu"}))
    named = err.value.allowed.split("a GPU with more memory (")[1].split(")")[0].split(", ")
    weights = MODELS["llama-3.1-70b"].weight_bytes("bf16")
    assert named and all(0.9 * GPUS[n].memory_bytes > weights for n in named), named
    assert "H100-SXM-80GB" not in named and "A10G" not in named


# --- workload.max_model_len and the model's context -------------------------------------------

SIX_K = {
    "name": "long-prompts",
    "model": {"name": "llama-2-7b"},
    "workload": {
        "num_requests": 6,
        "arrival": {"kind": "poisson", "rate": 5.0},
        "lengths": {"kind": "fixed", "prompt_tokens": 6000, "output_tokens": 64},
    },
}


def test_an_unset_max_model_len_defaults_to_the_models_context():
    # llama-2-7b has 4,096 positions: vLLM's max_model_len is 4096, and 6,000-token prompts are refused.
    sc = scenario_from_dict(SIX_K)
    assert sc.workload.max_model_len == 4096
    res = simulate(sc)
    assert res.summary["completed"] == 0 and res.summary["rejected_by_reason"] == {"exceeds_max_model_len": 6}
    # A model with a longer context keeps the default.
    assert scenario_from_dict({**SIX_K, "model": {"name": "llama-3.1-8b"}}).workload.max_model_len == 8192


def test_an_explicit_max_model_len_beyond_the_context_is_refused():
    data = apply_overrides(SIX_K, {"workload.max_model_len": 8192})
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(data)
    assert err.value.key == "workload.max_model_len" and err.value.value == 8192
    assert "at most 4096" in err.value.allowed and "llama-2-7b" in err.value.allowed
    assert scenario_from_dict(apply_overrides(SIX_K, {"workload.max_model_len": 4096})).workload.max_model_len == 4096
    # A scenario built in code is checked where it is deployed.
    with pytest.raises(ConfigError, match="workload.max_model_len"):
        Deployment.from_scenario(Scenario(model={"name": "llama-2-7b"}))


def _config(tmp_path, **fields) -> str:
    """A copy of the shipped Llama-3.2-1B config with ``fields`` replaced (``None``: removed)."""
    from sim.hf_config import shipped_config

    cfg = json.loads(shipped_config("meta-llama/Llama-3.2-1B").read_text())
    for k, v in fields.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_configs_context_is_its_max_position_embeddings_unless_rope_scaling_stretches_it(tmp_path):
    short = _config(tmp_path, max_position_embeddings=2048, rope_scaling=None)
    assert scenario_from_dict({"model": {"hf_config": short}}).workload.max_model_len == 2048
    with pytest.raises(ConfigError, match="workload.max_model_len.*at most 2048"):
        scenario_from_dict({"model": {"hf_config": short}, "workload": {"max_model_len": 4096}})
    # A linear factor stretches it (vLLM: 2048 x 4 = 8192; tests/test_hf_config_context.py has the others).
    linear = _config(tmp_path, max_position_embeddings=2048, rope_scaling={"type": "linear", "factor": 4.0})
    assert scenario_from_dict({"model": {"hf_config": linear}, "workload": {"max_model_len": 8192}})
    with pytest.raises(ConfigError, match="workload.max_model_len.*at most 8192"):
        scenario_from_dict({"model": {"hf_config": linear}, "workload": {"max_model_len": 8193}})
    # Nor where the config gives no max_position_embeddings (kvsim reads 4,096 in its place: not the model's).
    unknown = _config(tmp_path, max_position_embeddings=None, rope_scaling=None)
    assert scenario_from_dict({"model": {"hf_config": unknown}}).workload.max_model_len == 8192


def test_a_context_the_file_leaves_out_is_its_architectures_default(tmp_path):
    # transformers fills phi's max_position_embeddings (2048) in, and vLLM reads that.
    phi = {
        "model_type": "phi",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1024,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(phi))
    assert scenario_from_dict({"model": {"hf_config": str(path)}}).workload.max_model_len == 2048
    with pytest.raises(ConfigError, match="workload.max_model_len.*at most 2048"):
        scenario_from_dict({"model": {"hf_config": str(path)}, "workload": {"max_model_len": 4096}})


def test_yarn_that_max_position_embeddings_already_counts_keeps_the_check():
    # DeepSeek-V3: YaRN factor 40 over 4,096 original positions = its 163,840.
    sc = scenario_from_dict({"model": {"hf_config": "deepseek-ai/DeepSeek-V3"}})
    assert sc.workload.max_model_len == 8192
    with pytest.raises(ConfigError, match="at most 163840"):
        scenario_from_dict({"model": {"hf_config": "deepseek-ai/DeepSeek-V3"}, "workload": {"max_model_len": 200_000}})


def test_every_shipped_scenario_keeps_its_max_model_len():
    import yaml

    from sim.package_data import SCENARIO_DIR

    for name in list_scenarios():
        given = (yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text()).get("workload") or {}).get("max_model_len")
        sc = load_scenario(name)
        assert given is None or sc.workload.max_model_len == given, name


# --- gpu.tensor_parallel ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,tp,allowed",
    [
        ("Qwen/Qwen2.5-0.5B", 8, "1, 2"),  # 14 attention heads
        ("Qwen/Qwen2.5-0.5B", 4, "1, 2"),
        ("microsoft/phi-4", 4, "1, 2"),  # 40 heads, 10 KV heads
        ("microsoft/phi-4", 8, "1, 2"),
        ("qwen2.5-7b", 8, "1, 2, 4"),  # 28 heads
    ],
)
@pytest.mark.parametrize("profile", ["auto", "none", "h100-sxm"])
def test_a_tp_degree_vllm_refuses_is_refused_naming_gpu_tensor_parallel(model, tp, allowed, profile):
    sc = _chat(model, **{"gpu.tensor_parallel": tp, "cost_model.profile": profile})
    with pytest.raises(ConfigError) as err:
        Deployment.from_scenario(sc).make_cost_model(sc)
    assert err.value.key == "gpu.tensor_parallel" and err.value.value == tp
    assert err.value.allowed.startswith(f"one of {allowed} for ")


def test_kv_heads_fewer_than_gpus_must_divide_them():
    from dataclasses import replace

    m = MODELS["llama-3.1-8b"]
    assert tensor_parallel_problem(replace(m, heads=16, kv_heads=2), 4) is None  # each KV head on 2 of 4 GPUs
    odd = replace(m, heads=24, kv_heads=3)
    assert tensor_parallel_problem(odd, 1) is None
    for tp in (2, 8):  # 24 query heads split over 2 and 8 GPUs; 3 KV heads neither split nor divide them
        why = tensor_parallel_problem(odd, tp)
        assert why is not None and "3 KV heads" in why


def test_an_intermediate_size_tp_does_not_split_is_refused_with_its_value():
    sc = _chat(**{"model.intermediate": 14337, "gpu.tensor_parallel": 2})
    with pytest.raises(ConfigError, match="intermediate size 14337") as err:
        Deployment.from_scenario(sc)
    assert err.value.key == "gpu.tensor_parallel" and err.value.allowed.startswith("one of 1 for ")


def test_a_vocabulary_tp_does_not_divide_is_padded_as_vllm_pads_it_and_priced():
    # OpenHermes-2.5-Mistral-7B: 32,002 tokens; vLLM pads to 32,064 (a multiple of 64) and splits that.
    assert padded_vocab(32002) == 32064 and padded_vocab(128256) == 128256
    sc = _chat(**{"model.name": "mistral-7b", "model.vocab": 32002, "gpu.tensor_parallel": 4})
    dep = Deployment.from_scenario(sc)
    assert shape_keys(dep.model, 4, "bf16", "bf16").lm_head == gemm_key(8016, 4096, "bf16")
    cost = dep.make_cost_model(sc)
    assert cost.calibrated and cost.name == "h100-sxm"


# --- gpu figures for a card outside the catalog ---------------------------------------------------


def test_figures_for_a_card_not_in_the_catalog_say_to_use_custom():
    with pytest.raises(ConfigError) as err:
        _chat(**{"gpu.name": "H20", "gpu.memory_gib": 96})
    assert err.value.key == "gpu.name" and err.value.value == "H20"
    assert "not in the catalog" in err.value.allowed and "gpu.name=custom" in err.value.allowed
    assert "its own figures" not in err.value.allowed
    # A catalog card keeps its own figures.
    with pytest.raises(ConfigError, match="H100-SXM-80GB has its own figures") as err:
        _chat(**{"gpu.name": "H100", "gpu.memory_gib": 96})
    assert err.value.key == "gpu.memory_gib"
    # As the message says: the card as custom, with its figures.
    h20 = {"gpu.name": "custom", "gpu.memory_gib": 96, "gpu.hbm_tbps": 4.0, "gpu.bf16_tflops": 148, "gpu.pcie_gbps": 64}
    assert Deployment.from_scenario(_chat(**h20)).gpu.memory_bytes == 96 * GiB
