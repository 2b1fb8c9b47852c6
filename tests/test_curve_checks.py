"""GEMM curve checks: points of a measured table dearer than a larger GEMM of the same shape (or
than bf16) are listed by ``kvsim profile show``, not smoothed."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from calibration.curve_checks import curve_steps, gemm_dtype_inversions, gemm_steps, report_lines
from sim.cost.profile import Curve1D, load_profile


@pytest.fixture(scope="module")
def b200():
    return load_profile("b200-sxm")


def test_curve_steps_finds_the_injected_point_and_ignores_noise():
    m = np.array([1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512], dtype=float)
    rng = np.random.default_rng(0)
    # Flat at the launch floor to m = 64, then linear: noise of up to ±20 % stays under 1.5x.
    t = np.maximum(10e-6, m * 0.2e-6) * rng.uniform(0.8, 1.2, size=m.size)
    assert curve_steps(m, t) == []
    t[3] = 2.5 * t[4:].min()
    steps = curve_steps(m, t)
    assert [i for i, _ in steps] == [3]
    i, j = steps[0]
    assert t[j] == t[4:].min() and j > 3
    # A step of 1.4x is noise at the default threshold, found at a lower one.
    t[3] = 1.4 * t[4:].min()
    assert curve_steps(m, t) == [] and [i for i, _ in curve_steps(m, t, threshold=1.3)] == [3]


def test_baked_curves_are_checked():
    p = load_profile("cpu-reference")
    m = np.array([1, 2, 4, 8, 16, 32], dtype=float)
    t = np.array([10, 31, 10, 10, 11, 12], dtype=float) * 1e-6
    p.gemm = {"64x64:bf16": Curve1D(m, t)}
    (f,) = gemm_steps(p)
    assert (f.engine, f.dtype, f.shape, f.m, f.ref_m) == ("baked", "bf16", "64x64", 2, 4)
    assert f.ratio == pytest.approx(3.1)
    p.gemm["64x64:fp8"] = Curve1D(m, np.array([10, 10, 10, 30, 11, 12], dtype=float) * 1e-6)
    inv = gemm_dtype_inversions(p)
    assert [(f.dtype, f.m, f.ref_dtype) for f in inv] == [("fp8", 8, "bf16")]
    assert inv[0].ratio == pytest.approx(3.0)


def test_b200_vllm_fp8_small_m_points_are_found(b200):
    steps = [f for f in gemm_steps(b200) if (f.engine, f.dtype, f.shape) == ("vllm", "fp8", "2560x8192")]
    found = {f.m: f for f in steps}
    assert {1, 2, 4} <= set(found), sorted(found)
    assert 3 not in found
    assert found[1].t_s == pytest.approx(27.2e-6, rel=0.01)
    assert found[2].t_s == pytest.approx(32.5e-6, rel=0.01)
    assert found[4].t_s == pytest.approx(32.4e-6, rel=0.01)
    for f in (found[1], found[2], found[4]):
        assert f.ref_m > f.m and f.ref_t_s < 14e-6 and f.ratio > 2
    # bf16 of the same shape is smooth there, and fp8 at m = 1 is flagged against it by the heuristic.
    assert not [f for f in gemm_steps(b200) if (f.engine, f.dtype, f.shape, f.m) == ("vllm", "bf16", "2560x8192", 1)]
    inv = [f for f in gemm_dtype_inversions(b200) if (f.engine, f.dtype, f.shape) == ("vllm", "fp8", "2560x8192")]
    assert 1 in {f.m for f in inv}


def test_profile_show_lists_the_checks(b200):
    import typer

    from calibration.cli import profile_app

    app = typer.Typer()
    app.add_typer(profile_app, name="profile")
    r = CliRunner().invoke(app, ["profile", "show", "b200-sxm"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "GEMM curve checks (measured tables as published, priced as measured" in out
    n = len(gemm_steps(b200))
    assert f"larger m): {n} points" in out
    vllm_fp8 = sum(1 for f in gemm_steps(b200) if (f.engine, f.dtype) == ("vllm", "fp8"))
    assert f"    vllm fp8: {vllm_fp8} (" in out and "m=1 ×" in out
    assert "heuristic, fp8/fp8_block/nvfp4" in out
    assert "a decode step of m sequences pays such a point" in out
    assert "\n".join(report_lines(b200)) in out
