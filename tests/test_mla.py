"""Multi-head latent attention (DeepSeek-V3): the latent KV a token caches, and how it is priced."""

from __future__ import annotations

import pytest

from helpers import write_config
from sim.catalog import GPUS, MlaSpec
from sim.cost.model import BatchShape, RooflineCostModel
from sim.cost.profile import load_profile
from sim.cost.profile_model import ProfileCostModel
from sim.engine_presets import get_preset
from sim.errors import ConfigError
from sim.hf_config import read_hf_config, resolve_hf_config

H200 = GPUS["H200-SXM-141GB"]


def _deepseek():
    return read_hf_config(resolve_hf_config("deepseek-ai/DeepSeek-V3"))


def test_deepseek_v3_shape_and_kv():
    hf = _deepseek()
    m = hf.spec
    assert m.mla == MlaSpec(kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128, q_lora_rank=1536)
    assert (hf.weight_dtype, hf.kv_dtype) == ("fp8_block", "bf16")
    # 512 latent values and a 64-wide RoPE key per layer, 61 layers, bf16: 70,272 bytes a token,
    # where 128 heads of K and V at 192/128 wide would take 61 x 128 x 320 x 2 = 4,997,120.
    assert m.kv_bytes_per_token("bf16") == 61 * 576 * 2 == 70272
    assert m.kv_bytes_per_token("fp8") == 35136
    # The latent serves every head: each GPU of a tensor-parallel replica keeps all of it.
    assert [m.kv_replicas(tp) for tp in (1, 2, 8)] == [1, 2, 8]
    # By hand: per layer the MLA projections (q down 7168x1536 and its norm, q up 1536 x 128 x 192,
    # kv down 7168 x 576 and its norm over 512, kv up 512 x 128 x 256, o 128 x 128 x 7168) and two
    # norms; 3 dense MLPs of 18432; 58 MoE layers of 256 experts of 2048, one shared, a 256 x 7168
    # router; untied embeddings and LM head of 129280; the final norm.
    attn = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    moe = 256 * 3 * 7168 * 2048 + 3 * 7168 * 2048 + 256 * 7168
    total = 2 * 129280 * 7168 + 61 * (attn + 2 * 7168) + 3 * 3 * 7168 * 18432 + 58 * moe + 7168
    assert m.params == total == pytest.approx(671e9, rel=0.001)


def test_mla_without_a_query_bottleneck(tmp_path):
    cfg = {
        "model_type": "deepseek_v2",
        "num_hidden_layers": 2,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
    }
    m = read_hf_config(write_config(tmp_path, cfg)).spec
    assert m.mla == MlaSpec(64, 16, 32, 32, 0)
    attn = 512 * 8 * 48 + 512 * 80 + 64 + 64 * 8 * 64 + 8 * 32 * 512
    assert m.params == 2 * 1000 * 512 + 2 * (attn + 3 * 512 * 1024 + 2 * 512) + 512
    assert m.kv_bytes_per_token("bf16") == 2 * 80 * 2


def test_roofline_prices_mla():
    m = _deepseek().spec
    rf = RooflineCostModel(m, H200, tensor_parallel=8, weight_dtype="fp8")
    # Decode over the latent: QK over 576 values and PV over 512 per head and layer.
    assert rf._attn_flops_per_pair == 2 * 61 * 128 * (576 + 512)
    assert rf._prefill_flops_per_pair == 2 * 61 * 128 * (192 + 128)
    # Each GPU reads its own copy of the latent.
    assert rf._kv_bpt == 8 * 70272
    short, long = (rf.step_time_s(BatchShape([], 64, 64 * n)) for n in (128, 32768))
    assert long > short


def test_mla_fit_recovers_known_constants(tmp_path):
    """Rows made by the pricing forms with known constants, in the published tables' layout, fit back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibration.mla_fit import TABLE_MLA, fit_mla_table
    from sim.cost.mla import MlaKernelFit, mla_decode_s, mla_prefill_s

    true = MlaKernelFit(latency_s=1.4e-5, per_item_s=2e-9, bandwidth=4.0e12, flops=6.0e14)
    for kind in ("generation", "context"):
        rows = []
        for h in (8, 16, 64, 128):
            for b in (1, 4, 16, 64, 256):
                for n in (16, 256, 1024, 4096, 16384):
                    if kind == "generation":
                        t = mla_decode_s(true, b, b * (1 + n), h, TABLE_MLA, 2.0)
                        rows.append(("bfloat16", h, b, 1, n, t * 1e3))
                    else:
                        rows.append(("bfloat16", h, b, n, 0, mla_prefill_s(true, b, n, h, TABLE_MLA) * 1e3))
        cols = ["kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency"]
        path = tmp_path / f"{kind}_mla_perf.parquet"
        pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}), path)
        got = fit_mla_table(path, kind, 4.8e12, 989e12)["bf16"]
        for key, want in true.to_json().items():
            assert got[key] == pytest.approx(want, rel=0.02), (kind, key)


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "b200-sxm", "l40s"])
def test_builtin_profiles_carry_mla_fits(name):
    prof = load_profile(name)
    assert prof.kernel_defaults["mla"] in prof.mla
    for kinds in prof.mla.values():
        for kind in ("generation", "context"):
            for fit in kinds[kind].values():
                assert fit["heldout_median"] < 0.2 and fit["rows"] > 500, (name, kind, fit)


def test_profile_prices_mla_on_the_engines_own_kernels():
    m = _deepseek().spec
    prof = load_profile("h200-sxm")
    cm = ProfileCostModel(prof, m, H200, tensor_parallel=8, weight_dtype="fp8", engine=get_preset("sglang"))
    assert cm.describe()["mla_kernel"]["generation"] == {"backend": "sglang", "kv_dtype": "bf16"}
    # Decode attention grows with the context; on TensorRT-LLM's kernel an fp8 latent reads half the
    # bytes of a bf16 one (SGLang's table times its fp8-cache decode 7x slower than bf16 at long
    # contexts, and is priced as measured).
    t = [cm.step_time_s(BatchShape([], 64, 64 * n)) for n in (1024, 32768)]
    assert t[1] > t[0]
    trt = {
        kv: ProfileCostModel(
            prof, m, H200, tensor_parallel=8, weight_dtype="fp8", kv_dtype=kv, engine=get_preset("trtllm")
        ).step_time_s(BatchShape([], 64, 64 * 32768))
        for kv in ("bf16", "fp8")
    }
    assert trt["fp8"] < trt["bf16"]
    # The block-fp8 checkpoint's experts on the block-fp8 fused-MoE kernel.
    assert m.moe is not None and m.moe.expert_dtype == "fp8_block"
    assert cm.describe()["moe_kernel"]["weight_dtype"] == "fp8_block"
    # No MLA tables for the A100: a one-line error (the auto profile then falls back to the roofline).
    with pytest.raises(ConfigError, match="multi-head latent attention"):
        ProfileCostModel(
            load_profile("a100-sxm"), m, GPUS["A100-SXM-80GB"], tensor_parallel=8, engine=get_preset("vllm")
        )


def test_deepseek_runs_with_replicated_latent_kv():
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.cluster import simulate

    data, base = read_scenario_dict("chat-api")
    data["model"] = {"hf_config": "deepseek-ai/DeepSeek-V3"}
    over = {
        "gpu.name": "H200-SXM-141GB",
        "gpu.tensor_parallel": 8,
        "workload.num_requests": 40,
        "workload.arrival.rate": 4.0,
    }
    res = simulate(scenario_from_dict(apply_overrides(data, over), base_dir=base))
    s = res.summary
    assert s["completed"] == 40
    assert s["kv_bytes_per_token"] == 8 * 70272
    assert s["cost_model"] == "h200-sxm" and s["cost_model_calibrated"] is True
    assert s["cost_model_mla_kernel"]["context"]["backend"] == "vllm" or s["cost_model_mla_kernel"]["context"][
        "backend"
    ] == prof_default("h200-sxm")


def prof_default(name: str) -> str:
    return load_profile(name).kernel_defaults["mla"]
