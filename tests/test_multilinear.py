"""The kernel model's grid interpolation (:func:`sim.cost.kernel_model.multilinear`) returns, bit
for bit, what scipy's ``RegularGridInterpolator(method="linear")`` returns, on every grid of every
built-in profile and on random grids, at random points, grid nodes and the clamped edges."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator

from sim.cost.kernel_model import GridCorrection, multilinear
from sim.cost.profile import list_profiles, load_profile


def _points(axes: list[np.ndarray], rng: np.random.Generator, n: int = 400) -> np.ndarray:
    """Random points inside the grid, every node, and both ends of every axis."""
    lo = np.array([a[0] for a in axes])
    hi = np.array([a[-1] for a in axes])
    random = lo + rng.random((n, len(axes))) * (hi - lo)
    nodes = np.column_stack([rng.choice(a, n) for a in axes])
    ends = np.array([lo, hi, np.where(np.arange(len(axes)) % 2, lo, hi)])
    return np.vstack([random, nodes, ends])


def _same(axes: list[np.ndarray], values: np.ndarray, pts: np.ndarray) -> None:
    ref = RegularGridInterpolator(axes, values, method="linear")(pts)
    got = multilinear(axes, values, pts)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert got.tobytes() == ref.tobytes(), float(np.max(np.abs(got - ref)))


def _corrections() -> list[tuple[str, GridCorrection]]:
    out = []
    for name in list_profiles():
        for backend, fams in (load_profile(name).kernels or {}).items():
            for fam, fit in fams.items():
                for key, (_, grid) in fit.groups.items():
                    out.append((f"{name}/{backend}/{fam}/{key}", grid))
    return out


def test_every_profile_grid_interpolates_like_scipy():
    grids = _corrections()
    assert grids, "no built-in profile has kernel grids"
    rng = np.random.default_rng(0)
    tried = 0
    for label, g in grids:
        live = [d for d, a in enumerate(g.axes) if len(a) > 1]
        if len(live) == 2:
            continue  # GridCorrection leaves two-dimensional grids to scipy itself
        axes = [g.axes[d] for d in live]
        values = g.values.reshape(tuple(len(a) for a in axes))
        _same(axes, values, _points(axes, rng))
        # Through GridCorrection, with coordinates outside the grid clamped to it.
        full = np.column_stack([rng.uniform(a[0] - 1, a[-1] + 1, 300) for a in g.axes])
        pts = np.column_stack([np.clip(full[:, d], g.axes[d][0], g.axes[d][-1]) for d in live])
        ref = RegularGridInterpolator(axes, values, method="linear")(pts)
        assert g(full).tobytes() == ref.tobytes(), label
        tried += 1
    assert tried


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (7, 2, 5, 3), (3, 3, 3, 3, 2)])
def test_random_grids_interpolate_like_scipy(shape):
    rng = np.random.default_rng(len(shape))
    axes = [np.sort(rng.uniform(-3, 9, n)) for n in shape]
    values = rng.normal(size=shape) * 10.0 ** rng.integers(-3, 3, size=shape)
    _same(axes, values, _points(axes, rng, 2000))
