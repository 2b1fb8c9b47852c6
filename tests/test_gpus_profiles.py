"""GPUs: B200 and L40S catalog entries and built-in profiles, custom cards, and the warning when
``cost_model.profile: auto`` falls back to the roofline prior (CLI only, silent in library calls)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from calibration.tables import DEFAULT_TABLES_DIR, read_system
from sim.catalog import GPUS, MODELS, find_gpu, tensor_core_peak
from sim.config import scenario_from_dict
from sim.cost.kernel_model import Peaks
from sim.cost.model import BatchShape
from sim.cost.profile import load_profile
from sim.cost.profile_model import build_profile_cost_model
from sim.engine.cluster import simulate
from sim.engine.deployment import BUILTIN_PROFILE_FOR_GPU, Deployment
from sim.errors import ConfigError


@pytest.mark.parametrize(
    "system,gpu", [("b200_sxm", "B200-SXM-180GB"), ("l40s", "L40S"), ("h100_sxm", "H100-SXM-80GB")]
)
def test_catalog_entries_match_system_yaml(system, gpu):
    spec, g = read_system(DEFAULT_TABLES_DIR, system), GPUS[gpu]
    # Memory is what the card reports (test_catalog_memory_is_what_the_cards_report), at most the
    # system.yaml's installed figure (the L40S's system.yaml lists its reported 46068 MiB).
    assert g.memory_bytes <= spec.mem_capacity_bytes and g.hbm_bandwidth == spec.mem_bw
    assert (g.peak_bf16_flops, g.peak_fp8_flops) == (spec.bf16_flops, spec.fp8_flops)
    assert g.pcie_bandwidth == spec.pcie_bw
    # The L40S's "intra-node" figure is PCIe: it has no NVLink.
    assert g.nvlink_bandwidth == (0.0 if system == "l40s" else spec.nvlink_bw)


#: Total memory each card reports (nvidia-smi memory.total, MiB; sources in sim/catalog.py), and the
#: H100, H200 and B200's aiconfigurator figures (80, 141 and 180 GiB), which the built-in profiles and
#: the serving-benchmark accuracy were measured with (sim/catalog.py).
REPORTED_MIB = {
    "H100-SXM-80GB": 80 * 1024,
    "H200-SXM-141GB": 141 * 1024,
    "A100-SXM-80GB": 81920,
    "A100-40GB": 40960,
    "B200-SXM-180GB": 180 * 1024,
    "L40S": 46068,
    "A10G": 23028,
    "L4": 23034,
}


@pytest.mark.parametrize("gpu,mib", sorted(REPORTED_MIB.items()))
def test_catalog_memory_is_what_the_cards_report(gpu, mib):
    """vLLM's gpu_memory_utilization multiplies the memory the card reports, not the datasheet's
    (the L4 and A10G were 24 GiB: 1.5 GiB more than they have)."""
    assert GPUS[gpu].memory_bytes == mib * 2**20


@pytest.mark.parametrize("profile,gpu", [("b200-sxm", "B200-SXM-180GB"), ("l40s", "L40S")])
def test_new_profiles_are_the_auto_choice_and_report_fit_quality(profile, gpu):
    assert BUILTIN_PROFILE_FOR_GPU[gpu] == profile
    p = load_profile(profile)
    # Blackwell's tables also time NVFP4 GEMMs (FP4 tensor cores); the L40S has none.
    weights = ["bf16", "fp8", "nvfp4"] if profile == "b200-sxm" else ["bf16", "fp8"]
    assert p.device["name"] == gpu and p.dtypes["weight"] == weights and p.dtypes["kv"] == ["bf16", "fp8"]
    for fam in ("gemm", "context_attention", "generation_attention"):
        assert p.fit_quality[fam]["overall"]["n"] > 1000 and p.fit_quality[fam]["overall"]["median_rel_err"] < 0.03
    assert sorted(p.allreduce, key=int) == ["2", "4", "8"]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "profile,gpu,model,dtype",
    [
        ("b200-sxm", "B200-SXM-180GB", "llama-3.1-70b", "fp8"),
        ("l40s", "L40S", "qwen3-8b", "bf16"),
        ("h100-sxm", "H100-SXM-80GB", "qwen3-32b", "bf16"),
        ("h200-sxm", "H200-SXM-141GB", "qwen3-8b", "fp8"),
    ],
)
def test_new_models_priced_by_profiles(profile, gpu, model, dtype, tp):
    cm = build_profile_cost_model(
        profile, MODELS[model], GPUS[gpu], tensor_parallel=tp, weight_dtype=dtype, kv_dtype=dtype
    )
    assert cm.calibrated and cm.name == profile
    decode = cm.decode_times_s(64, np.array([64 * 2048.0, 64 * 4096.0]))
    assert np.all(np.isfinite(decode)) and decode[1] > decode[0] > 0
    assert cm.mixed_step_time_s(BatchShape([(2048, 0)], 8, 8 * 1024)) > decode[0]
    # Only an LM head wider than the widest measured GEMM (65536 columns per GPU) is outside the tables.
    wide = MODELS[model].vocab // tp > 65536
    assert set(cm.out_of_range) == ({"gemm_lm_head"} if wide else set()), cm.out_of_range


def test_b200_prices_below_h100():
    kw = dict(tensor_parallel=4, weight_dtype="fp8", kv_dtype="fp8")
    b200 = build_profile_cost_model("b200-sxm", MODELS["llama-3.1-70b"], GPUS["B200-SXM-180GB"], **kw)
    h100 = build_profile_cost_model("h100-sxm", MODELS["llama-3.1-70b"], GPUS["H100-SXM-80GB"], **kw)
    kv = np.array([128 * 4096.0])
    assert b200.decode_times_s(128, kv)[0] < h100.decode_times_s(128, kv)[0]


def _sc(**over):
    base = {
        "model": {"name": "llama-3.1-8b"},
        "workload": {
            "num_requests": 30,
            "max_model_len": 4096,
            "arrival": {"kind": "poisson", "rate": 5.0},
            "lengths": {"kind": "fixed", "prompt_tokens": 1024, "output_tokens": 64},
        },
    }
    for section, values in over.items():
        base[section] = values if "hf_config" in values else {**base.get(section, {}), **values}
    return scenario_from_dict(base)


@pytest.mark.parametrize(
    "gpu,model",
    [
        ({"name": "B200-SXM-180GB", "tensor_parallel": 2}, {"hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8"}),
        ({"name": "L40S"}, {"hf_config": "Qwen/Qwen3-8B"}),
        ({"name": "GB200-186GB", "tensor_parallel": 2}, {"hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8"}),
        ({"name": "B300-SXM-288GB"}, {"hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8"}),
        ({"name": "GB300-288GB"}, {"hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8"}),
    ],
)
def test_runs_on_the_new_gpus_are_calibrated(gpu, model):
    s = simulate(_sc(gpu=gpu, model=model)).summary
    assert s["cost_model_calibrated"] is True and s["cost_model"] == BUILTIN_PROFILE_FOR_GPU[gpu["name"]]
    assert s["completed"] == 30


def test_gb200_is_priced_as_the_b200_with_its_own_memory():
    """GB200: the B200's kernel tables (the same GPU), its own 186 GB: the same run steps alike and
    holds more KV."""
    runs = {
        name: simulate(_sc(gpu={"name": name}, model={"hf_config": "Qwen/Qwen3-8B"})).summary
        for name in ("B200-SXM-180GB", "GB200-186GB")
    }
    b, gb = runs["B200-SXM-180GB"], runs["GB200-186GB"]
    assert gb["cost_model"] == b["cost_model"] == "b200-sxm"
    assert gb["kv_capacity_bytes_per_replica"] > b["kv_capacity_bytes_per_replica"]


def test_blackwell_ultra_is_priced_on_the_b200_tables_with_its_288_gb():
    """B300 and GB300 have the B200's bf16 and fp8 tensor rates: the same run steps alike on the
    B200's tables, and holds the KV of 288 GB less the same weights (about 108 GiB more at 0.9)."""
    runs = {
        name: simulate(_sc(gpu={"name": name}, model={"hf_config": "Qwen/Qwen3-8B"})).summary
        for name in ("B200-SXM-180GB", "B300-SXM-288GB", "GB300-288GB")
    }
    b = runs["B200-SXM-180GB"]
    for name in ("B300-SXM-288GB", "GB300-288GB"):
        u = runs[name]
        assert u["cost_model"] == "b200-sxm" and u["cost_model_calibrated"] is True
        extra = (u["kv_capacity_bytes_per_replica"] - b["kv_capacity_bytes_per_replica"]) / 2**30
        assert extra == pytest.approx(0.9 * (288 - 180), abs=1.0), extra
        assert u["tpot_s"]["mean"] == pytest.approx(b["tpot_s"]["mean"], rel=1e-9)


CUSTOM = {
    "name": "custom",
    "memory_gib": 96,
    "hbm_tbps": 4.0,
    "bf16_tflops": 800,
    "fp8_tflops": 1600,
    "nvlink_gbps": 400,
    "pcie_gbps": 64,
}


def test_custom_gpu_is_priced_by_the_labelled_roofline():
    sc = _sc(gpu=CUSTOM)
    dep = Deployment.from_scenario(sc)
    g = dep.gpu
    assert (
        g.name,
        g.memory_bytes,
        g.hbm_bandwidth,
        g.peak_bf16_flops,
        g.peak_fp8_flops,
        g.nvlink_bandwidth,
        g.pcie_bandwidth,
    ) == ("custom", 96 * 2**30, 4e12, 800e12, 1600e12, 400e9, 64e9)
    cm = dep.make_cost_model(sc)
    assert cm.name == "roofline-uncalibrated" and not cm.calibrated
    # fp8 weights use the card's fp8 peak for GEMMs: a compute-bound prefill gets faster.
    prefill = BatchShape([(8192, 0)], 0, 0)
    fp8 = Deployment.from_scenario(_sc(gpu=CUSTOM, model={"weight_dtype": "fp8"}))
    fp8_step = fp8.make_cost_model(_sc(gpu=CUSTOM, model={"weight_dtype": "fp8"})).mixed_step_time_s(prefill)
    assert fp8_step < cm.mixed_step_time_s(prefill)
    # block-scaled fp8 (128×128 scales) runs on the same FP8 tensor cores: priced as fp8, not at bf16's rate
    block = _sc(gpu=CUSTOM, model={"weight_dtype": "fp8_block"})
    assert Deployment.from_scenario(block).make_cost_model(block).mixed_step_time_s(prefill) == pytest.approx(fp8_step)


def _as_custom(name: str, **extra) -> dict:
    """A ``custom`` GPU section with the catalog card ``name``'s figures."""
    g = GPUS[name]
    return {
        "name": "custom",
        "memory_gib": g.memory_bytes / 2**30,
        "hbm_tbps": g.hbm_bandwidth / 1e12,
        "bf16_tflops": g.peak_bf16_flops / 1e12,
        "fp8_tflops": g.peak_fp8_flops / 1e12,
        "nvlink_gbps": g.nvlink_bandwidth / 1e9,
        "pcie_gbps": g.pcie_bandwidth / 1e9,
        **extra,
    }


def test_custom_gpu_states_an_fp4_peak():
    """nvfp4 weights on a custom card with a B200's figures, its FP4 peak included, run as on the
    catalog B200; without an FP4 peak (the default, 0) they run at the fp8 peak, as on an H100."""
    b200 = GPUS["B200-SXM-180GB"]
    cost = {"profile": "none"}
    catalog = _sc(gpu={"name": "B200-SXM-180GB"}, model={"weight_dtype": "nvfp4"}, cost_model=cost)
    custom = _sc(
        gpu=_as_custom("B200-SXM-180GB", fp4_tflops=b200.peak_fp4_flops / 1e12),
        model={"weight_dtype": "nvfp4"},
        cost_model=cost,
    )
    assert Deployment.from_scenario(custom).gpu.peak_fp4_flops == b200.peak_fp4_flops
    want, got = simulate(catalog).summary, simulate(custom).summary
    assert {k: v for k, v in got.items() if k not in ("gpu", "scenario")} == {
        k: v for k, v in want.items() if k not in ("gpu", "scenario")
    }
    no_fp4 = _sc(gpu=_as_custom("B200-SXM-180GB"), model={"weight_dtype": "nvfp4"}, cost_model=cost)
    assert Deployment.from_scenario(no_fp4).gpu.peak_fp4_flops == 0.0
    prefill = BatchShape([(8192, 0)], 0, 0)
    slower = Deployment.from_scenario(no_fp4).make_cost_model(no_fp4).mixed_step_time_s(prefill)
    assert slower > Deployment.from_scenario(custom).make_cost_model(custom).mixed_step_time_s(prefill)


@pytest.mark.parametrize(
    "dtype,peaks,want",
    [
        ("bf16", (1, 2, 4, 3), 1),
        ("fp16", (1, 2, 4, 3), 1),
        ("int8_wo", (1, 2, 4, 3), 1),  # weight-only: computes in bf16
        ("fp8", (1, 2, 4, 3), 2),
        ("fp8_block", (1, 2, 4, 3), 2),
        ("fp8", (1, 0, 0, 0), 1),  # no FP8 units (A100)
        ("nvfp4", (1, 2, 4, 3), 4),
        ("nvfp4", (1, 2, 0, 0), 2),  # no FP4 units (Hopper)
        ("nvfp4", (1, 0, 0, 0), 1),
        ("int8_sq", (1, 2, 4, 3), 3),
        ("int8_sq", (1, 2, 4, 0), 1),
    ],
)
def test_one_tensor_core_peak_per_dtype(dtype, peaks, want):
    """The GPU catalog, the kernel-curve floors and the kernel tables' systems read a dtype's tensor-core
    peak from one function, so a format cannot run on FP8 units in one and at bf16's rate in another."""
    bf16, fp8, fp4, int8 = peaks
    assert tensor_core_peak(dtype, bf16, fp8, fp4, int8) == want
    gpu = replace(GPUS["H100-SXM-80GB"], peak_bf16_flops=bf16, peak_fp8_flops=fp8, peak_fp4_flops=fp4)
    if dtype != "int8_sq":  # the catalog has no int8 figure
        assert gpu.peak_gemm_flops(dtype) == want
        assert Peaks(bf16, fp8, 1.0, fp4).flops(dtype) == want


@pytest.mark.parametrize(
    "gpu,key,needle",
    [
        ({"name": "custom", "memory_gib": 96}, "gpu.hbm_tbps", "needs memory_gib, hbm_tbps, bf16_tflops, pcie_gbps"),
        ({**CUSTOM, "pcie_gbps": None}, "gpu.pcie_gbps", "needs memory_gib"),
        ({**CUSTOM, "memory_gib": -1}, "gpu.memory_gib", "a finite number in (0, 4096]"),
        ({**CUSTOM, "fp8_tflops": -5}, "gpu.fp8_tflops", "a finite number in [0, 1e+06]"),
        ({**CUSTOM, "fp4_tflops": -5}, "gpu.fp4_tflops", "a finite number in [0, 1e+06]"),
        ({"name": "H100-SXM-80GB", "fp4_tflops": 9000}, "gpu.fp4_tflops", "only with gpu.name 'custom'"),
        ({"name": "H100-SXM-80GB", "hbm_tbps": 4}, "gpu.hbm_tbps", "only with gpu.name 'custom'"),
        ({"name": "custom-gpu"}, "gpu.name", "or custom with memory_gib"),
    ],
)
def test_custom_gpu_validation(gpu, key, needle):
    with pytest.raises(ConfigError) as e:
        Deployment.from_scenario(_sc(gpu=gpu))
    msg = str(e.value)
    assert msg.startswith(f"{key}: got ") and needle in msg and "\n" not in msg, msg


def test_fallback_is_logged_not_printed(caplog, capfd):
    """Library calls (tests, sweeps) print nothing; the record is there for the CLI to show."""
    sc = _sc(gpu={"name": "A10G"})
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        cm = Deployment.from_scenario(sc).make_cost_model(sc)
    assert cm.name == "roofline-uncalibrated"
    assert any("no calibrated profile for GPU A10G" in r.getMessage() for r in caplog.records)
    sc2 = _sc(gpu={"name": "A100-SXM-80GB"}, model={"kv_dtype": "fp8"})
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        Deployment.from_scenario(sc2).make_cost_model(sc2)
    assert any(
        "profile a100-sxm does not cover llama-3.1-8b" in r.getMessage() and "kv dtypes bf16" in r.getMessage()
        for r in caplog.records
    )
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # An explicit choice is no fallback.
    caplog.clear()
    sc3 = _sc(cost_model={"profile": "none"})
    Deployment.from_scenario(sc3).make_cost_model(sc3)
    assert not caplog.records


def kvsim(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_model_option_with_a_config_path(tmp_path):
    r = kvsim(
        "run",
        "chat-api",
        "-q",
        "--model",
        "scenarios/models/Qwen--Qwen3-32B_config.json",
        "--set",
        "workload.num_requests=60",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert not [x for x in r.stderr.splitlines() if x.startswith("warning:")], r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["cost_model"] == "h100-sxm" and s["cost_model_calibrated"] is True
    assert s["kv_bytes_per_token"] == 2 * 64 * 8 * 128 * 2


def test_cli_warns_once_on_stderr_when_auto_falls_back(tmp_path):
    r = kvsim(
        "run",
        "chat-api",
        "-q",
        "--set",
        "gpu.name=A10G",
        "--set",
        "workload.max_model_len=4096",
        "--set",
        "workload.num_requests=30",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    # (A stale compiled hot path adds Python's own RuntimeWarning lines: not ours to count.)
    lines = [x for x in r.stderr.splitlines() if x.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("warning: cost model: no calibrated profile for GPU A10G"), r.stderr


def test_cli_lists_show_the_new_entries():
    models, gpus = kvsim("list", "models"), kvsim("list", "gpus")
    assert models.returncode == 0 and gpus.returncode == 0
    for needle in ("qwen3-8b", "qwen3-32b", "Qwen/Qwen3-32B", "nvidia/Llama-3.1-70B-Instruct-FP8"):
        assert needle in models.stdout
    for needle in ("B200-SXM-180GB", "b200-sxm", "L40S", "l40s", "4500"):
        assert needle in gpus.stdout


@pytest.mark.parametrize(
    "name,gpu",
    [
        ("H100-SXM-80GB", "H100-SXM-80GB"),
        ("h100", "H100-SXM-80GB"),
        ("h100_sxm", "H100-SXM-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("H200", "H200-SXM-141GB"),
        ("nvidia b200", "B200-SXM-180GB"),
        ("GB300", "GB300-288GB"),
        ("A100-SXM4-80GB", "A100-SXM-80GB"),
        ("a100-40gb", "A100-40GB"),
        ("l40s", "L40S"),
        ("NVIDIA L4", "L4"),
        ("a10g", "A10G"),
        ("CPU", "cpu"),
        # Other parts of a generation, with other memory, bandwidth or power: not these cards.
        ("H100 PCIe", None),
        ("H200 NVL", None),
        ("GH200", None),
        ("L40", None),
        ("A10", None),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("custom", None),
        ("mi300x", None),
    ],
)
def test_gpu_spellings_find_the_catalog_card(name, gpu):
    assert find_gpu(name) == gpu


def test_a_scenario_stores_the_catalog_name_of_the_gpu_it_spells():
    sc = _sc(gpu={"name": "h200"})
    assert sc.gpu.name == "H200-SXM-141GB"
    # So the profile is the card's calibrated one, not the roofline fallback.
    assert Deployment.from_scenario(sc).make_cost_model(sc).name != "roofline-uncalibrated"
    with pytest.raises(ConfigError) as e:
        Deployment.from_scenario(_sc(gpu={"name": "H100 PCIe"}))
    assert str(e.value).startswith("gpu.name: got 'H100 PCIe'; allowed: H100-SXM-80GB") and "nvidia-smi" in str(e.value)
