"""Profiles price any dense shape from their fitted kernel families.

* Curves derived at load for catalog shapes equal (≤ 2 %) the curves the profiles used to bake
  per shape (``tests/data/baked_curves_v1.json``).
* Shapes not used to fit: every row of one GEMM (n, k) pair, or of one attention (heads, KV heads)
  pair, is left out of the fit and predicted from the rest; median error ≤ 5 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _calib_helpers import tables
from calibration import fit as F
from sim.catalog import get_gpu, get_model, with_overrides
from sim.cost.kernel_model import Peaks, attention_grid, gemm_curve
from sim.cost.model import BatchShape
from sim.cost.profile import Curve1D, Grid2D, load_profile
from sim.cost.profile_model import ProfileCostModel

BAKED = json.loads((Path(__file__).parent / "data" / "baked_curves_v1.json").read_text())


@pytest.mark.parametrize("name", sorted(BAKED))
def test_derived_curves_equal_the_baked_ones(name):
    p, old = load_profile(name), BAKED[name]
    worst = 0.0
    for family in ("gemm", "context_attention", "generation_attention"):
        assert old[family]
        for key, doc in old[family].items():
            ref = Curve1D.from_json(doc) if family == "gemm" else Grid2D.from_json(doc)
            new = p.curve(family, key)
            if family == "gemm":
                np.testing.assert_allclose(new.x, ref.x, rtol=1e-4)  # stored to 5 significant digits
            else:
                np.testing.assert_allclose(new.batch, ref.batch, rtol=1e-4)
                np.testing.assert_allclose(new.length, ref.length, rtol=1e-4)
            worst = max(worst, float(np.max(np.abs(new.t_s / ref.t_s - 1))))
    assert worst <= 0.02, worst


def _peaks(kt) -> Peaks:
    return Peaks(kt.system.bf16_flops, kt.system.fp8_flops, kt.system.mem_bw)


@pytest.mark.parametrize(
    "system,n,k",
    [("h100_sxm", 4096, 4096), ("h100_sxm", 5120, 8192), ("h200_sxm", 12288, 3072), ("a100_sxm", 2048, 7168)],
)
def test_heldout_gemm_shape(system, n, k):
    kt = tables(system)
    g = kt.gemm
    pair = (g.n == n) & (g.k == k) & (g.dtype == "bf16")
    assert pair.sum() >= 10
    fam = F.fit_gemm(g.subset(~pair), kt.system.peak_flops, kt.system.mem_bw)
    m, t, _ = gemm_curve(fam, "bf16", n, k, _peaks(kt))
    held = g.subset(pair)
    pred = Curve1D(m, t)(held.m.astype(float))[0]
    err = np.abs(pred / held.latency_s - 1)
    assert np.median(err) <= 0.05, (np.median(err), np.percentile(err, 95))


@pytest.mark.parametrize(
    "system,kind,heads,kv_heads",
    [
        ("h100_sxm", "generation", 40, 8),
        ("h200_sxm", "generation", 24, 4),
        ("h100_sxm", "context", 32, 8),
        ("h200_sxm", "context", 64, 8),
    ],
)
def test_heldout_attention_shape(system, kind, heads, kv_heads):
    kt = tables(system)
    table = kt.generation if kind == "generation" else kt.context
    pair = (table.heads == heads) & (table.kv_heads == kv_heads) & (table.kv_dtype == "bf16") & (table.head_dim == 128)
    if kind == "context":
        pair &= table.attn_dtype == "bf16"
    assert pair.sum() >= 10, pair.sum()
    fitter = F.fit_generation if kind == "generation" else F.fit_context
    fam = fitter(table.subset(~pair), kt.system.peak_flops, kt.system.mem_bw)
    group = ("bf16", 128) if kind == "generation" else ("bf16", "bf16", 128)
    b, s, t, _ = attention_grid(fam, kind, group, heads, kv_heads, 128, _peaks(kt))
    grid = Grid2D(b, s, t)
    held = table.subset(pair)
    pred = np.array([grid(bt, np.array([float(L)]))[0][0] for bt, L in zip(held.batch, held.length)])
    err = np.abs(pred / held.latency_s - 1)
    assert np.median(err) <= 0.05, (np.median(err), np.percentile(err, 95))


def test_off_catalog_model_prices_and_counts_outside_shapes():
    # Qwen3-32B's per-GPU shapes at TP2 are not catalog shapes of the profile; its LM head
    # (151936 / 2 = 75968 columns) is wider than any measured GEMM (65536): counted out of range.
    qwen = with_overrides(
        get_model("llama-3.1-8b"),
        name="q32",
        layers=64,
        hidden=5120,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=25600,
        vocab=151936,
        params=32.8e9,
    )
    cm = ProfileCostModel(load_profile("h100-sxm"), qwen, get_gpu("H100-SXM-80GB"), tensor_parallel=2)
    t = cm.step_time_s(BatchShape(decode_seqs=16, decode_kv_tokens=16 * 1500))
    assert 0.005 < t < 0.1
    assert cm.out_of_range.get("gemm_lm_head") == 1
    assert "n=75968 outside" in cm._gemm["lm_head"].meta["outside_measured"]
    assert "gemm_qkv" not in cm.out_of_range
