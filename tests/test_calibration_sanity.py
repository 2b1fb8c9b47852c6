"""Physical sanity of the built-in profiles: decode attention never implies more than the
catalog HBM bandwidth, GEMMs never more than peak FLOP/s (fp8: the catalog's fp8 peak)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.catalog import get_gpu, get_model
from sim.cost.profile import list_profiles, load_profile
from sim.cost.profile_model import build_profile_cost_model


def _curves(p, family):
    """(key, curve) of every shape the profile lists for ``family`` (derived from fitted kernels)."""
    return [(k, p.curve(family, k)) for k in p.curve_keys(family)]


GPU_OF = {
    "h100-sxm": "H100-SXM-80GB",
    "h200-sxm": "H200-SXM-141GB",
    "a100-sxm": "A100-SXM-80GB",
    "b200-sxm": "B200-SXM-180GB",
    "l40s": "L40S",
}


@pytest.mark.parametrize("name", sorted(GPU_OF))
def test_generation_attention_within_hbm_bandwidth(name):
    p, gpu = load_profile(name), get_gpu(GPU_OF[name])
    curves = _curves(p, "generation_attention")
    assert curves
    for key, grid in curves:
        heads, kv_heads, rest = key.split("/")
        head_dim, kv_dtype = rest.split(":")
        kvb = 1.0 if kv_dtype == "fp8" else 2.0
        bb, ll = np.meshgrid(grid.batch, grid.length, indexing="ij")
        nbytes = bb * ll * 2 * int(kv_heads) * int(head_dim) * kvb
        assert np.all(nbytes / grid.t_s <= gpu.hbm_bandwidth * (1 + 1e-4)), key


@pytest.mark.parametrize("name", sorted(GPU_OF))
def test_gemm_within_peak_flops(name):
    p, gpu = load_profile(name), get_gpu(GPU_OF[name])
    curves = _curves(p, "gemm")
    assert curves
    for key, curve in curves:
        shape, dtype = key.split(":")
        n, k = (int(x) for x in shape.split("x"))
        peak = gpu.peak_gemm_flops(curve.meta["table_dtype"])  # nvfp4: FP4 units; weight-only int8: bf16
        assert np.all(2.0 * curve.x * n * k / curve.t_s <= peak * (1 + 1e-4)), key


@pytest.mark.parametrize("name", sorted(GPU_OF))
def test_cost_model_decode_between_queries_respects_bandwidth(name):
    """Interpolated (off-grid) queries keep the bound: log-log interpolation preserves it."""
    gpu, model = get_gpu(GPU_OF[name]), get_model("llama-3.1-8b")
    cm = build_profile_cost_model(name, model, gpu)
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 2048, size=20):
        kv = n * rng.uniform(2, 131072, size=50)
        t_attn = cm._gen(int(n), kv / n)[0] * model.layers
        assert np.all(kv * model.kv_bytes_per_token("bf16") / t_attn <= gpu.hbm_bandwidth * (1 + 1e-4))


def test_builtins_listed():
    assert set(GPU_OF) <= set(list_profiles())
