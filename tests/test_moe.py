"""Mixture-of-experts models: reading their configs, pricing their experts, running them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibration.moe_fit import fit_moe_table
from helpers import write_config
from sim.catalog import GPUS, MoeSpec
from sim.cost.model import BatchShape, RooflineCostModel
from sim.cost.moe import MoeKernelFit, experts_woken, moe_layer_s
from sim.cost.profile import load_profile
from sim.cost.profile_model import ProfileCostModel
from sim.engine_presets import get_preset
from sim.errors import ConfigError
from sim.hf_config import read_hf_config, resolve_hf_config

H100 = GPUS["H100-SXM-80GB"]


def _spec(ident: str):
    return read_hf_config(resolve_hf_config(ident)).spec


BASE = {
    "model_type": "custom_moe",
    "num_hidden_layers": 6,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 2048,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


# --- reading configs --------------------------------------------------------------------------


def test_qwen3_moe_config():
    m = _spec("Qwen/Qwen3-30B-A3B")
    assert m.moe == MoeSpec(experts=128, experts_per_token=8, expert_intermediate=768, moe_layers=48)
    assert m.dense_layers == 0
    # By hand: per layer Q/K/V/O (32 query and 4 KV heads of 128), two norms and the Q/K norms,
    # 128 experts of 3 x 2048 x 768 and a 128 x 2048 router; untied embeddings and LM head; final norm.
    layer = 2048 * 40 * 128 + 32 * 128 * 2048 + 2 * 2048 + 2 * 128 + 128 * 3 * 2048 * 768 + 128 * 2048
    assert m.params == 2 * 151936 * 2048 + 48 * layer + 2048
    assert m.params - m.active_params == 48 * 120 * 3 * 2048 * 768
    assert m.mlp_width_per_token == 8 * 768


def test_mixtral_reads_its_expert_width_from_intermediate_size():
    m = _spec("mistralai/Mixtral-8x7B-v0.1")
    assert m.moe == MoeSpec(experts=8, experts_per_token=2, expert_intermediate=14336, moe_layers=32)


@pytest.mark.parametrize(
    "extra,moe_layers,shared",
    [
        # DeepSeek-style: the first layers dense, one shared expert of the expert width.
        ({"first_k_dense_replace": 2, "n_shared_experts": 1}, 4, 256),
        # Step-style: a shared expert of its own width.
        ({"first_k_dense_replace": 1, "n_shared_experts": 2, "share_expert_dim": 384}, 5, 768),
        # Qwen2-MoE: every second layer sparse, a shared expert of its own width.
        ({"decoder_sparse_step": 2, "shared_expert_intermediate_size": 1024}, 3, 1024),
        # Qwen3-MoE: listed layers dense.
        ({"mlp_only_layers": [0, 5]}, 4, 0),
    ],
)
def test_dense_layers_and_shared_experts(tmp_path, extra, moe_layers, shared):
    cfg = {**BASE, "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 256, **extra}
    m = read_hf_config(write_config(tmp_path, cfg)).spec
    assert m.moe is not None
    assert (m.moe.moe_layers, m.moe.shared_intermediate, m.moe.expert_intermediate) == (moe_layers, shared, 256)
    assert m.dense_layers == 6 - moe_layers
    # Every routed expert counts in params, two per token in active params.
    assert m.params - m.active_params == moe_layers * 14 * 3 * 512 * 256


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"num_experts": 16}, "the experts each token is routed to (num_experts_per_tok"),
        ({"num_experts": 16, "num_experts_per_tok": 32}, "'num_experts_per_tok' (32) at most num_experts (16)"),
        ({"num_local_experts": 8, "num_experts_per_tok": 0}, "'num_experts_per_tok' must be an integer >= 1"),
        ({"num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": "all"}, "'mlp_only_layers' must be a list"),
    ],
)
def test_bad_moe_fields_name_the_field(tmp_path, extra, needle):
    with pytest.raises(ConfigError) as e:
        read_hf_config(write_config(tmp_path, {**BASE, **extra}))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_gpt_oss_mxfp4_experts(tmp_path):
    """gpt-oss: MXFP4 routed experts, 16-bit everything else; sizes as OpenAI's model card gives them
    (active parameters counted without the input embedding: 3.6B and 5.1B)."""
    for ident, active, checkpoint_gib in (("openai/gpt-oss-20b", 3.6, 12.8), ("openai/gpt-oss-120b", 5.1, 60.8)):
        hf = read_hf_config(resolve_hf_config(ident))
        m = hf.spec
        assert m.moe is not None and m.moe.expert_dtype == "mxfp4" and hf.weight_dtype == "bf16"
        assert m.active_params - m.vocab * m.hidden == pytest.approx(active * 1e9, rel=0.03)
        assert m.weight_bytes("bf16") == pytest.approx(checkpoint_gib * 2**30, rel=0.03)
    with pytest.raises(ConfigError, match="mxfp4 weights outside mixture-of-experts layers"):
        read_hf_config(write_config(tmp_path, {**BASE, "quantization_config": {"quant_method": "mxfp4"}}))


def test_kimi_k2_5_int4_experts(tmp_path):
    """Kimi K2.5 (a vision-language model: its quantization_config sits in its text tower's config)
    quantises only its routed experts, to 4-bit integers in groups of 32 with bf16 scales; its
    checkpoint holds about 595 GB. Integer weights on attention are refused, not read as 16-bit."""
    hf = read_hf_config(resolve_hf_config("moonshotai/Kimi-K2.5"))
    m = hf.spec
    assert m.moe is not None and m.moe.expert_dtype == "w4a16" and hf.weight_dtype == "bf16"
    assert m.weight_bytes("bf16") == pytest.approx(595e9, rel=0.03)
    assert "text tower" in m.source and "w4a16 experts" in m.source
    int4 = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 32}}},
    }
    moe = {**BASE, "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 256}
    moe["n_shared_experts"] = 1
    cases = [
        (BASE, ["lm_head", "re:.*self_attn.*"]),  # a dense model
        (moe, ["lm_head"]),  # attention quantised too
        (moe, ["lm_head", "re:.*self_attn.*"]),  # the shared expert too
        (moe, ["lm_head", "re:.*mlp.*"]),  # no routed expert quantised
    ]
    for cfg, ignore in cases:
        with pytest.raises(ConfigError, match="4-bit integer weights outside the routed experts"):
            read_hf_config(write_config(tmp_path, {**cfg, "quantization_config": {**int4, "ignore": ignore}}))
    experts_only = {**int4, "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]}
    ok = read_hf_config(write_config(tmp_path, {**moe, "quantization_config": experts_only}))
    assert ok.spec.moe is not None and ok.spec.moe.expert_dtype == "w4a16"


# --- pricing ----------------------------------------------------------------------------------


def test_experts_woken():
    assert experts_woken(0, 128, 8) == 0
    assert experts_woken(1, 128, 8) == pytest.approx(8)
    woken = [experts_woken(t, 128, 8) for t in (1, 2, 4, 8, 16, 64, 1024)]
    assert all(a < b for a, b in zip(woken, woken[1:]))
    assert all(w <= min(128, t * 8) + 1e-9 for w, t in zip(woken, (1, 2, 4, 8, 16, 64, 1024)))
    assert woken[-1] == pytest.approx(128)


def test_fit_recovers_known_constants(tmp_path):
    """Rows made by the pricing form with known constants, in the published table's layout, fit back."""
    true = MoeKernelFit(latency_s=25e-6, per_expert_s=3e-7, bandwidth=3.0e12, flops=5.0e14)
    rows = []
    for t in (1, 4, 16, 64, 256, 1024, 4096, 16384):
        for h, w, k, e in ((2048, 768, 8, 128), (4096, 1536, 8, 128), (4096, 14336, 2, 8), (7168, 2048, 8, 256)):
            for tp in (1, 2, 4, 8):
                lat = moe_layer_s(true, t, e, k, h, w / tp, 2.0)
                rows.append(("k", "bfloat16", t, h, w, k, e, tp, lat * 1e3))
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts"]
    cols += ["moe_tp_size", "latency"]
    table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})
    path = tmp_path / "h100_sxm" / "moe" / "vllm" / "0.1" / "moe_perf.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table, path)
    got = fit_moe_table(path, 3.35e12, {"bf16": 989e12})["bf16"]
    assert got["latency_s"] == pytest.approx(true.latency_s, rel=0.02)
    assert got["per_expert_s"] == pytest.approx(true.per_expert_s, rel=0.02)
    assert got["bandwidth_bytes_per_s"] == pytest.approx(true.bandwidth, rel=0.02)
    assert got["flops"] == pytest.approx(true.flops, rel=0.02)
    assert got["heldout_median"] < 0.01


def test_each_engine_fits_the_mxfp4_rows_it_runs(tmp_path):
    """A table that times MXFP4 experts both weight-only and with MXFP8 activations (Blackwell's):
    TensorRT-LLM's fit takes the MXFP8-activation rows (its default there), the other engines the
    weight-only ones; a table with the weight-only rows alone gives every engine those."""
    fast = MoeKernelFit(latency_s=20e-6, per_expert_s=2e-7, bandwidth=6.0e12, flops=2.0e15)
    slow = MoeKernelFit(latency_s=50e-6, per_expert_s=8e-7, bandwidth=1.5e12, flops=3.0e14)
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts"]
    cols += ["moe_tp_size", "latency"]

    def table(path, kinds):
        rows = []
        for raw, fit in kinds:
            for t in (1, 4, 16, 64, 256, 1024, 4096):
                for h, w, k, e in ((2880, 2880, 4, 128), (2880, 2880, 4, 32), (4096, 1536, 8, 128)):
                    for tp in (1, 2, 4):
                        rows.append(("k", raw, t, h, w, k, e, tp, moe_layer_s(fit, t, e, k, h, w / tp, 0.53125) * 1e3))
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}), path)
        return path

    both = table(tmp_path / "b" / "moe_perf.parquet", [("w4a16_mxfp4", slow), ("w4a8_mxfp4_mxfp8", fast)])
    peaks = {"bf16": 2250e12, "fp8": 4500e12}
    trt = fit_moe_table(both, 7.7e12, peaks, engine="trtllm")["mxfp4"]
    assert trt["latency_s"] == pytest.approx(fast.latency_s, rel=0.02)
    assert trt["kernel"] == "k (w4a8_mxfp4_mxfp8)"
    for engine in ("vllm", "sglang", None):
        got = fit_moe_table(both, 7.7e12, peaks, engine=engine)["mxfp4"]
        assert got["latency_s"] == pytest.approx(slow.latency_s, rel=0.02) and got["kernel"] == "k"
    only = table(tmp_path / "h" / "moe_perf.parquet", [("w4a16_mxfp4", slow)])
    assert fit_moe_table(only, 4.8e12, peaks, engine="trtllm")["mxfp4"]["latency_s"] == pytest.approx(
        slow.latency_s, rel=0.02
    )


def test_gpt_oss_on_b200_trtllm_is_priced_with_mxfp8_activations():
    """The built-in B200 profile prices TensorRT-LLM's gpt-oss experts from the rows it runs there: a
    layer of 64 tokens (4 of 128 experts each) within 2x of reading the woken experts' weights once at
    the GPU's HBM bandwidth, where the weight-only rows took 4.7x."""
    prof = load_profile("b200-sxm")
    fit = prof.moe["trtllm"]["mxfp4"]
    assert "w4a8_mxfp4_mxfp8" in fit["kernel"]
    shape = fit["shapes"]["2880/2880/4of128/tp1"]
    t64 = dict(zip(shape["x"], shape["t_s"]))[64]
    floor = experts_woken(64, 128, 4) * 3 * 2880 * 2880 * 0.53125 / 7.7e12
    assert 0.7 * floor < t64 < 2 * floor


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "b200-sxm", "l40s"])
def test_builtin_profiles_carry_moe_fits(name):
    prof = load_profile(name)
    assert prof.kernel_defaults["moe"] == "trtllm"
    for engine in ("vllm", "sglang", "trtllm"):
        fits = prof.moe[engine]
        assert "bf16" in fits
        for fit in fits.values():
            # Held-out 20 % of the table's rows: a loose guard on the fitted form's quality.
            assert fit["heldout_median"] < 0.25 and fit["rows"] > (20 if fit is fits.get("mxfp4") else 1000), (
                engine,
                fit,
            )


def test_engine_prices_its_own_moe_kernel():
    m = _spec("Qwen/Qwen3-30B-A3B")
    prof = load_profile("h100-sxm")
    for kind in ("vllm", "sglang", "trtllm"):
        cm = ProfileCostModel(prof, m, H100, engine=get_preset(kind))
        assert cm.describe()["moe_kernel"]["backend"] == kind
    # An fp8 checkpoint on SGLang, which timed block fp8 only: its block-fp8 kernel.
    cm = ProfileCostModel(prof, m, H100, weight_dtype="fp8", engine=get_preset("sglang"))
    assert cm.describe()["moe_kernel"]["weight_dtype"] == "fp8_block"
    # gpt-oss's MXFP4 experts on their own kernel, its bf16 attention on the bf16 GEMMs.
    oss = _spec("openai/gpt-oss-20b")
    cm = ProfileCostModel(prof, oss, H100, weight_dtype="bf16", engine=get_preset("vllm"))
    assert cm.describe()["moe_kernel"]["weight_dtype"] == "mxfp4"


def test_moe_decode_wakes_experts_with_the_batch():
    """A MoE decode step grows with the batch faster than a dense model with the same active weights:
    more tokens wake more experts, whose weights must be read."""
    m = _spec("Qwen/Qwen3-30B-A3B")
    prof = load_profile("h100-sxm")
    cm = ProfileCostModel(prof, m, H100, engine=get_preset("vllm"))
    t = [cm.step_time_s(BatchShape([], b, b * 512)) for b in (1, 4, 16, 64)]
    assert all(a < b for a, b in zip(t, t[1:]))
    # Every expert at batch 1 would read all 128 experts' weights; only 8 are read.
    moe = m.moe
    assert moe is not None
    all_experts = replace(m, moe=replace(moe, experts_per_token=moe.experts))
    dense_cm = ProfileCostModel(prof, all_experts, H100, engine=get_preset("vllm"))
    assert dense_cm.step_time_s(BatchShape([], 1, 512)) > 2 * t[0]


def test_roofline_reads_only_the_woken_experts():
    m = _spec("Qwen/Qwen3-30B-A3B")
    rf = RooflineCostModel(m, H100)
    p = rf.p
    bw = H100.hbm_bandwidth * p.memory_efficiency
    # Batch 1 reads the non-expert weights and 8 experts: far below all 61 GB of weights.
    t1 = rf.step_time_s(BatchShape([], 1, 1)) - p.step_overhead_s - p.per_seq_overhead_s
    assert t1 < 0.25 * m.weight_bytes("bf16") / bw
    # A large batch wakes them all.
    t_all = rf._linear_s(4096, 1)
    assert t_all >= m.weight_bytes("bf16") / bw * 0.999


def test_profile_without_moe_fits_is_a_clear_error():
    m = _spec("Qwen/Qwen3-30B-A3B")
    with pytest.raises(ConfigError, match="fused mixture-of-experts kernel fit for bf16"):
        ProfileCostModel(load_profile("a100-sxm"), m, GPUS["A100-SXM-80GB"], engine=get_preset("vllm"))


def test_moe_error_names_the_profile_as_given(tmp_path):
    """The MoE error quotes the profile as the user named it (a file path, a built-in name), not the
    name recorded inside the file."""
    import shutil

    from sim.cost.profile import PROFILE_DIR
    from sim.cost.profile_model import build_profile_cost_model

    m, a100, vllm = _spec("Qwen/Qwen3-30B-A3B"), GPUS["A100-SXM-80GB"], get_preset("vllm")
    path = tmp_path / "my-a100.json"
    shutil.copy(PROFILE_DIR / "a100-sxm.json", path)
    with pytest.raises(ConfigError) as exc:
        build_profile_cost_model(str(path), m, a100, engine=vllm)
    assert exc.value.key == "cost_model.profile" and exc.value.value == str(path)
    assert str(exc.value).endswith(f"; {path} has none (no MoE kernel tables for this GPU)")
    assert "a100-sxm" not in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        build_profile_cost_model("a100-sxm", m, a100, engine=vllm)
    assert exc.value.value == "a100-sxm"


def test_tensor_parallel_must_divide_the_expert_width():
    m = _spec("Qwen/Qwen3-30B-A3B")
    odd = replace(m, moe=replace(m.moe, expert_intermediate=100))
    with pytest.raises(ConfigError, match="one of 1, 2, 4: a divisor of .*expert width 100") as exc:
        ProfileCostModel(load_profile("h100-sxm"), odd, H100, tensor_parallel=8, engine=get_preset("vllm"))
    assert exc.value.key == "gpu.tensor_parallel"  # the scenario key (was parallelism.tensor_parallel)


def test_dense_models_price_as_before():
    """A dense model takes the dense path: the same step times as with the MoE terms zeroed."""
    from sim.catalog import get_model

    prof = load_profile("h100-sxm")
    cm = ProfileCostModel(prof, get_model("llama-3.1-8b"), H100, engine=get_preset("vllm"))
    assert cm._moe_layers == 0 and "moe_kernel" not in cm.describe()
    t = cm.decode_times_s(32, np.array([32 * 1000.0, 32 * 2000.0]))
    assert t[0] < t[1]


# --- end to end -------------------------------------------------------------------------------


def test_moe_scenario_runs_calibrated():
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.cluster import simulate

    data, base = read_scenario_dict("chat-api")
    data["model"] = {"hf_config": "Qwen/Qwen3-30B-A3B"}
    over = {"workload.num_requests": 60, "workload.arrival.rate": 4.0}
    sc = scenario_from_dict(apply_overrides(data, over), base_dir=base)
    res = simulate(sc)
    s = res.summary
    assert s["completed"] == 60 and s["cost_model_calibrated"] is True
    assert s["cost_model_moe_kernel"]["backend"] == "vllm"
    # The KV pool is what is left beside every expert's weights: 61 GB of bf16 on an 80 GiB card.
    m = _spec("Qwen/Qwen3-30B-A3B")
    cap = s["kv_capacity_bytes_per_replica"]
    assert cap < 0.9 * H100.memory_bytes - m.weight_bytes("bf16")
    assert cap > 0.9 * H100.memory_bytes - m.weight_bytes("bf16") - 4 * 2**30


def test_a_measured_shape_prices_on_its_own_curve():
    """Qwen3-30B-A3B's expert shape is in vLLM's H100 table: its MoE layer is the measured latency at a
    measured token count; a shape the table lacks takes the fitted form."""
    import pyarrow.compute as pc

    m = _spec("Qwen/Qwen3-30B-A3B")
    prof = load_profile("h100-sxm")
    cm = ProfileCostModel(prof, m, H100, engine=get_preset("vllm"))
    info = cm.describe()["moe_kernel"]
    assert info["measured_shape"] is True
    root = Path(__file__).resolve().parent.parent
    t = pq.read_table(root / "calibration/data/gpu-kernels/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    sel = t.filter(
        pc.and_(
            pc.and_(pc.equal(t["moe_dtype"], "bfloat16"), pc.equal(t["kernel_source"], info["kernel"])),
            pc.and_(
                pc.and_(pc.equal(t["hidden_size"], 2048), pc.equal(t["inter_size"], 768)),
                pc.and_(pc.equal(t["num_experts"], 128), pc.equal(t["moe_tp_size"], 1)),
            ),
        )
    )
    row = sel.filter(pc.equal(sel["num_tokens"], 256))
    measured = row["latency"][0].as_py() * 1e-3
    router = cm._moe_extra[0][1].at(256)[0]
    assert cm._moe_layer_s(256, []) == pytest.approx(measured + router, rel=1e-4)
    moe = m.moe
    assert moe is not None
    other = ProfileCostModel(prof, replace(m, moe=replace(moe, experts=96)), H100, engine=get_preset("vllm"))
    assert other.describe()["moe_kernel"]["measured_shape"] is False


@pytest.mark.parametrize(
    "weight_dtype,experts,gib",
    [(None, "fp8_block", 625), ("fp8", "fp8", 625), ("nvfp4", "nvfp4", 352), ("fp8_block", "fp8_block", 625)],
)
def test_a_scenario_weight_dtype_other_than_the_checkpoints_moves_the_experts(weight_dtype, experts, gib):
    """DeepSeek-R1 declares block-scaled fp8 weights; a scenario (or benchmark row) that serves it in
    another format (NVIDIA's NVFP4 build, a per-tensor fp8 quantization) prices and holds the experts
    in that format, one that keeps the checkpoint's format (or names none) keeps the config's experts."""
    from sim.config import scenario_from_dict
    from sim.engine.deployment import Deployment

    model = {"hf_config": "deepseek-ai/DeepSeek-R1", **({"weight_dtype": weight_dtype} if weight_dtype else {})}
    sc = scenario_from_dict(
        {
            "name": "r1",
            "model": model,
            "gpu": {"name": "B200-SXM-180GB", "tensor_parallel": 8},
            "engine": {"kind": "trtllm"},
            "workload": {"num_requests": 10},
        }
    )
    dep = Deployment.from_scenario(sc)
    assert dep.make_cost_model(sc).describe()["moe_kernel"]["weight_dtype"] == experts
    assert dep.model.weight_bytes(sc.model.weight_dtype) / 2**30 == pytest.approx(gib, rel=0.01)
