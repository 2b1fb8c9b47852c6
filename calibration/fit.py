"""Fits of measured kernel latencies: a physical form plus a measured-grid correction.

Every kernel family is modelled in two layers:

1. **Parametric form** (least squares in log space, :func:`scipy.optimize.least_squares`)::

       t = L + (C^p + M^p)^(1/p),   C = FLOPs / F_eff,   M = bytes / B_eff

   ``L`` is the launch/fixed latency, ``F_eff`` and ``B_eff`` the effective compute and
   memory throughputs, and ``p`` a smooth maximum: ``p → ∞`` is the roofline's hard
   max, a finite ``p`` is the efficiency loss where the two regimes meet. This carries
   the trend everywhere, including outside the measured grid.

2. **Grid correction**: the log-ratio ``r = log(measured / parametric)`` is placed on the
   tensor grid of measured coordinates (in log space), missing cells are filled by
   interpolating along the grid axes (:func:`fill_grid`), and queries get a multilinear
   interpolation of ``r`` with coordinates clamped to the grid. Kernel tile and wave
   quantisation steps live here. Beyond the grid the correction is held at its edge
   value, so extrapolation follows the physical form, never a runaway polynomial.
   For GEMMs the fill first takes out additive effects shared across the grid (one per
   (m, n) output shape, one per k) and ignores isolated spikes as interpolation sources.

``predict`` returns ``exp(log parametric + r)``. The fitted numbers and their evaluation are
in :mod:`sim.cost.kernel_model` (a profile prices any shape from them at load time); this
module does the fitting.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from scipy.optimize import least_squares

# The fitted data and its evaluation live with the cost model (profiles price any shape from them);
# this module fits them. Re-exported so calibration code reads one namespace.
from sim.cost.kernel_model import (  # noqa: F401
    ELEM_BYTES,
    FamilyFit,
    GridCorrection,
    RooflineFit,
    attention_dims,
    context_work,
    elem_bytes,
    gemm_work,
    generation_work,
    predict_context,
    predict_gemm,
    predict_generation,
    roofline_time,
)

# --- parametric form ------------------------------------------------------------------------


def fit_roofline(work: np.ndarray, t: np.ndarray, terms: tuple[str, ...], peaks: tuple[float, ...]) -> RooflineFit:
    """Least-squares fit of :func:`roofline_time` to measured ``t`` in log space (relative error).

    ``peaks`` bound each rate from above (hardware peak + 5 % for measurement noise); a
    ``0`` peak leaves the rate free (serial per-token latency has no datasheet figure).
    """
    work, t = np.asarray(work, dtype=np.float64), np.asarray(t, dtype=np.float64)
    logt = np.log(t)
    # Start each rate where its term alone would explain the median row.
    start = [np.median(w / t) for w in work]
    theta0 = np.array([np.log(max(np.min(t), 1e-7)), *np.log(start), np.log(3.0)])
    lo = np.array(
        [np.log(1e-8), *[np.log(pk * 1e-4) if pk else np.log(s) - 20 for pk, s in zip(peaks, start)], np.log(0.05)]
    )
    hi = np.array(
        [np.log(1e-2), *[np.log(pk * 1.05) if pk else np.log(s) + 20 for pk, s in zip(peaks, start)], np.log(20.0)]
    )
    theta0 = np.clip(theta0, lo + 1e-6, hi - 1e-6)
    res = least_squares(
        lambda th: np.log(roofline_time(th, work)) - logt,
        theta0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        x_scale="jac",
    )
    th = res.x
    return RooflineFit(
        float(np.exp(th[0])), tuple(terms), tuple(float(x) for x in np.exp(th[1:-1])), float(1.0 + np.exp(th[-1]))
    )


# --- grid correction ------------------------------------------------------------------------


def _axis_estimates(v, k, x, ax, extrapolate):
    """Estimates of unknown cells by 1-d linear interpolation along axis ``ax`` at coordinates ``x``.

    Returns an array shaped like ``v`` holding NaN where no estimate exists.
    """
    vv = np.moveaxis(v, ax, -1).reshape(-1, v.shape[ax])
    kk = np.moveaxis(k, ax, -1).reshape(-1, v.shape[ax])
    ee = np.full(vv.shape, np.nan)
    for i in np.nonzero(kk.any(axis=1) & ~kk.all(axis=1))[0]:
        kn = kk[i]
        xs = x[kn]
        unk = ~kn if extrapolate else (~kn) & (x > xs[0]) & (x < xs[-1])
        if unk.any():
            ee[i, unk] = np.interp(x[unk], xs, vv[i, kn])
    return np.moveaxis(ee.reshape(np.moveaxis(v, ax, -1).shape), -1, ax)


def _neighbour_estimates(v, k, x, ax):
    """Leave-one-out estimates of known cells: linear interpolation between the nearest known cells on either side along ``ax``."""
    vv = np.moveaxis(v, ax, -1).reshape(-1, v.shape[ax])
    kk = np.moveaxis(k, ax, -1).reshape(-1, v.shape[ax])
    ee = np.full(vv.shape, np.nan)
    for i in np.nonzero(kk.sum(axis=1) >= 3)[0]:
        idx = np.nonzero(kk[i])[0]
        lo, mid, hi = idx[:-2], idx[1:-1], idx[2:]
        w = (x[mid] - x[lo]) / (x[hi] - x[lo])
        ee[i, mid] = (1.0 - w) * vv[i, lo] + w * vv[i, hi]
    return np.moveaxis(ee.reshape(np.moveaxis(v, ax, -1).shape), -1, ax)


def _spikes(v, k, axes, base, ratio):
    """Known cells more than ``ratio``× off the median of their neighbours' interpolations (log and linear, every axis)."""
    ests = []
    for ax in range(v.ndim):
        if v.shape[ax] < 3:
            continue
        ests.append(_neighbour_estimates(v, k, axes[ax], ax))
        if base is not None:
            t_est = _neighbour_estimates(np.exp(v) * base, k, np.exp(axes[ax]), ax)
            with np.errstate(invalid="ignore", divide="ignore"):
                ests.append(np.log(np.where(t_est > 0, t_est, np.nan) / base))
    if not ests:
        return np.zeros(v.shape, dtype=bool)
    stack = np.array(ests)
    # One axis alone cannot tell a spike from a step: ask for two estimates.
    judged = k & (np.sum(~np.isnan(stack), axis=0) >= 2)
    med = np.zeros(v.shape)
    med[judged] = np.nanmedian(stack[:, judged], axis=0)
    return judged & (np.abs(v - med) > np.log(ratio))


def additive_effects(
    values: np.ndarray, known: np.ndarray, effects: list[tuple[int, ...]], min_cells: int = 3, n_iter: int = 10
) -> np.ndarray:
    """``Σ_e f_e(x_e)`` fitted to the known cells by backfitting medians; one term per axis tuple in ``effects``.

    Medians, so a spike does not move the effect it sits in; an effect value needs
    ``min_cells`` known cells (a median of two is their mean, and one cell says nothing
    shared). Returns the full grid, NaN at cells where some effect lacks them.
    """
    others = [tuple(d for d in range(values.ndim) if d not in e) for e in effects]
    usable = known.copy()
    while True:
        seen = [usable.sum(axis=o, keepdims=True) >= min_cells for o in others]
        informed = np.logical_and.reduce(np.broadcast_arrays(*seen))
        if not (usable & ~informed).any():
            break
        usable &= informed
    v = np.where(usable, values, np.nan)
    terms = [np.zeros(tuple(v.shape[d] if d in e else 1 for d in range(v.ndim))) for e in effects]
    for _ in range(n_iter):
        for i, o in enumerate(others):
            rest = v - sum(t for j, t in enumerate(terms) if j != i)
            med = np.zeros(terms[i].shape)
            med[seen[i]] = np.nanmedian(
                np.moveaxis(rest, o, tuple(range(len(o)))).reshape(int(np.prod([v.shape[d] for d in o])), -1)[
                    :, seen[i].ravel()
                ],
                axis=0,
            )
            terms[i] = med
    return np.where(informed, sum(terms), np.nan)


def fill_grid(
    values: np.ndarray,
    known: np.ndarray,
    axes: list[np.ndarray],
    base: np.ndarray | None = None,
    priority: list[list[int]] | None = None,
    max_iter: int = 200,
    *,
    effects: list[tuple[int, ...]] | None = None,
    spike_ratio: float | None = None,
) -> np.ndarray:
    """Fill unknown cells of an n-d grid of log-ratios from known ones by 1-d interpolation along axes.

    ``axes`` are log coordinates. Along each axis a cell gets up to two estimates: the
    log-ratio interpolated in log coordinates, and, when ``base`` (the parametric time at
    every cell, seconds) is given, the time itself interpolated linearly in linear
    coordinates (exact on the piecewise-linear latency-vs-size curves of memory- and
    launch-bound kernels, where a log-log interpolation overshoots the knee). The
    median of all estimates is taken. ``priority`` groups the axes (default: one group):
    a pass uses the first group, in order, that brackets some unknown cell, and only when
    none does, nearest-value extrapolation in the same order. Known cells never change.

    ``effects`` (axis tuples) first takes out :func:`additive_effects` fitted on the
    known cells, and only the remainder is interpolated: a hole then borrows the shape of
    the curve from every cell that shares its effects, not just from its two neighbours.
    ``spike_ratio``: known cells more than that factor off the median of their neighbours'
    interpolations (of the remainder) are not used as sources; they keep their own value.
    """
    if not known.any():
        raise ValueError("grid has no known cell")
    v = np.where(known, values, 0.0).astype(np.float64)
    main = np.zeros(v.shape)
    if effects:
        main = additive_effects(v, known, effects)
    informed = ~np.isnan(main)
    main = np.where(informed, main, 0.0)
    rem = np.where(known, v - main, 0.0)
    rem_base = None if base is None else base * np.exp(main)
    src = known
    if spike_ratio is not None:
        src = known & ~_spikes(rem, known, axes, rem_base, spike_ratio)
        if not src.any():
            src = known
    out = np.where(known, values, main + _interpolate_fill(rem, src, axes, rem_base, priority, max_iter))
    if not informed.all():
        # Holes whose effects too few cells measured (sparse grids: the few shapes of one model
        # on the device route) take the plain axis fill, from the measured and effect-filled cells.
        out = _interpolate_fill(out, src | (informed & ~known), axes, base, priority, max_iter)
        out = np.where(known, values, out)
    return out


def _interpolate_fill(v, k, axes, base, priority, max_iter):
    """:func:`fill_grid`'s interpolation passes: cells of ``v`` outside ``k`` are estimated, not read."""
    v, k = np.where(k, v, 0.0), k.copy()
    groups = priority or [list(range(v.ndim))]
    steps = [(g, False) for g in groups] + [(g, True) for g in groups]
    lin_axes = [np.exp(a) for a in axes]
    for _ in range(max_iter):
        if k.all():
            break
        for group, extrapolate in steps:
            ests = []
            for ax in group:
                if v.shape[ax] < 2:
                    continue
                ests.append(_axis_estimates(v, k, axes[ax], ax, extrapolate))
                if base is not None:
                    t_est = _axis_estimates(np.exp(v) * base, k, lin_axes[ax], ax, extrapolate)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        ests.append(np.log(np.where(t_est > 0, t_est, np.nan) / base))
            if not ests:
                continue
            stack = np.array(ests)
            have = ~np.all(np.isnan(stack), axis=0) & ~k
            if have.any():
                v[have] = np.nanmedian(stack[:, have], axis=0)
                k |= have
                break
        else:
            break
    return v


def grid_correction(
    coords_log: np.ndarray, residual: np.ndarray, base_fn=None, priority: list[list[int]] | None = None, **fill
) -> GridCorrection:
    """The :class:`GridCorrection` of residuals at measured points. ``coords_log``: (rows, dims) log
    coordinates on a tensor grid; duplicate cells are averaged.

    ``base_fn(cells_log)`` gives the parametric time at grid cells; ``priority`` and
    ``fill`` (``effects``, ``spike_ratio``) go to :func:`fill_grid`.
    """
    axes, idx = [], []
    for d in range(coords_log.shape[1]):
        ax, inv = np.unique(np.round(coords_log[:, d], 9), return_inverse=True)
        axes.append(ax)
        idx.append(inv.reshape(-1))
    shape = tuple(len(a) for a in axes)
    flat = np.ravel_multi_index(tuple(idx), shape)
    total = np.bincount(flat, weights=residual, minlength=int(np.prod(shape)))
    count = np.bincount(flat, minlength=int(np.prod(shape)))
    known = (count > 0).reshape(shape)
    vals = np.where(count > 0, total / np.maximum(count, 1), 0.0).reshape(shape)
    base = None
    if base_fn is not None:
        mesh = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
        base = base_fn(mesh).reshape(shape)
    return GridCorrection(axes, fill_grid(vals, known, axes, base, priority, **fill))


# --- kernel families ------------------------------------------------------------------------

GEMM_TERMS = ("flops", "bytes")
CONTEXT_TERMS = ("flops", "bytes")
GENERATION_TERMS = ("flops", "bytes", "serial_tokens")


#: Axis groups for :func:`fill_grid` (one group: all axes vote; held-out tests showed
#: no gain from filling along size axes first). GEMM coordinates are (m, n, k);
#: attention coordinates are (batch, length, heads per KV head, KV heads): the query-group
#: size rather than the head count is an axis because it selects the kernel (MHA,
#: grouped-query, large-group fallback) and scales compute, while KV heads scale bytes.
GEMM_PRIORITY = None
ATTENTION_PRIORITY = None

#: :func:`fill_grid` options per family. A GEMM kernel runs ceil(m/tile_m)·ceil(n/tile_n) output
#: tiles in waves, each tile looping over k, so its time is close to a product of an (m, n) factor
#: (wave quantisation) and a k factor (main-loop length): in log space, additive effects of (m, n)
#: and of k, each the median over the whole other axis, which a hole in the grid shares with the
#: measured cells around it.
#: The GEMM tables also hold isolated spikes (e.g. A100 bf16 64×512×64 at 20 µs among 3-4 µs
#: neighbours) that would otherwise be copied into every hole next to them. Held-out GEMM p95 at
#: seeds 0-5, A100: 17.3-18.9 % → 13.8-15.0 %; H100/H200 8.0-8.8 % → 7.5-8.0 %. Neither option is
#: used for attention: additive (batch, length) + (group, KV heads) effects or per-axis effects moved
#: its held-out errors by under 1.5 points either way, and spike rejection raised A100 decode p95
#: (11.7 → 12.5 %): its large steps are kernel switches, not noise.
GEMM_FILL = {"effects": [(0, 1), (2,)], "spike_ratio": 1.5}
ATTENTION_FILL: dict = {}


def _fit_group(work, coords, t, terms, peaks, priority, work_at, fill=None) -> tuple[RooflineFit, GridCorrection]:
    """Parametric fit, then the grid of log-ratios; ``work_at(cells_log)`` gives work terms at grid cells."""
    rf = fit_roofline(work, t, terms, peaks)
    resid = np.log(t) - np.log(rf(work))
    return rf, grid_correction(coords, resid, lambda cells: rf(work_at(cells)), priority, **(fill or {}))


def fit_gemm(table, peak_flops_fn, peak_bw: float) -> FamilyFit:
    """Fit every dtype of a :class:`calibration.tables.GemmTable`; ``peak_flops_fn(dtype)`` gives hardware peaks."""
    groups = {}
    for dt in sorted(set(table.dtype)):
        s = table.dtype == dt
        w, co = gemm_work(table.m[s], table.n[s], table.k[s], dt)
        groups[(dt,)] = _fit_group(
            w,
            co,
            table.latency_s[s],
            GEMM_TERMS,
            (peak_flops_fn(dt), peak_bw),
            GEMM_PRIORITY,
            partial(_gemm_flops_bytes, dtype=dt),
            GEMM_FILL,
        )
    return FamilyFit("gemm", groups)


def _gemm_flops_bytes(cells_log: np.ndarray, dtype: str) -> np.ndarray:
    """Work terms of GEMMs at grid coordinates (log m, log n, log k)."""
    m, n, k = np.exp(cells_log).T
    return gemm_work(m, n, k, dtype)[0]


def fit_context(table, peak_flops_fn, peak_bw: float) -> FamilyFit:
    groups = {}
    for key in sorted(set(zip(table.attn_dtype, table.kv_dtype, table.head_dim))):
        ad, kd, hd = key
        s = (table.attn_dtype == ad) & (table.kv_dtype == kd) & (table.head_dim == hd)
        w, co = context_work(table.batch[s], table.length[s], table.heads[s], table.kv_heads[s], hd, ad, kd)
        groups[(ad, kd, int(hd))] = _fit_group(
            w,
            co,
            table.latency_s[s],
            CONTEXT_TERMS,
            (peak_flops_fn(ad), peak_bw),
            ATTENTION_PRIORITY,
            lambda c, ad=ad, kd=kd, hd=hd: context_work(*attention_dims(c), hd, ad, kd)[0],
            ATTENTION_FILL,
        )
    return FamilyFit("context_attention", groups)


def fit_generation(table, peak_flops_fn, peak_bw: float) -> FamilyFit:
    groups = {}
    for key in sorted(set(zip(table.kv_dtype, table.head_dim))):
        kd, hd = key
        s = (table.kv_dtype == kd) & (table.head_dim == hd)
        w, co = generation_work(table.batch[s], table.length[s], table.heads[s], table.kv_heads[s], hd, kd)
        groups[(kd, int(hd))] = _fit_group(
            w,
            co,
            table.latency_s[s],
            GENERATION_TERMS,
            (peak_flops_fn("bf16"), peak_bw, 0.0),
            ATTENTION_PRIORITY,
            lambda c, kd=kd, hd=hd: generation_work(*attention_dims(c), hd, kd)[0],
            ATTENTION_FILL,
        )
    return FamilyFit("generation_attention", groups)


def predict_table(fit: FamilyFit, table) -> np.ndarray:
    """Predicted seconds for every row of the table the family was fitted from (any subset of it)."""
    out = np.empty(len(table))
    if fit.kind == "gemm":
        for (dt,) in fit.groups:
            s = table.dtype == dt
            if s.any():
                out[s] = predict_gemm(fit, dt, table.m[s], table.n[s], table.k[s])
    elif fit.kind == "context_attention":
        for ad, kd, hd in fit.groups:
            s = (table.attn_dtype == ad) & (table.kv_dtype == kd) & (table.head_dim == hd)
            if s.any():
                out[s] = predict_context(
                    fit, ad, kd, hd, table.batch[s], table.length[s], table.heads[s], table.kv_heads[s]
                )
    else:
        for kd, hd in fit.groups:
            s = (table.kv_dtype == kd) & (table.head_dim == hd)
            if s.any():
                out[s] = predict_generation(
                    fit, kd, hd, table.batch[s], table.length[s], table.heads[s], table.kv_heads[s]
                )
    return out


# --- evaluation -----------------------------------------------------------------------------


def relative_errors(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``|pred − measured| / measured`` elementwise."""
    return np.abs(np.asarray(pred) - np.asarray(measured)) / np.asarray(measured)


def error_summary(pred: np.ndarray, measured: np.ndarray) -> dict:
    """Median and 95th-percentile relative error and the row count."""
    e = relative_errors(pred, measured)
    return {"median_rel_err": float(np.median(e)), "p95_rel_err": float(np.percentile(e, 95)), "n": int(len(e))}


def holdout_mask(n_rows: int, fraction: float = 0.2, seed: int = 0) -> np.ndarray:
    """Boolean mask selecting a random ``fraction`` of rows (exactly ``round(fraction·n)``), reproducibly."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(n_rows, dtype=bool)
    mask[rng.choice(n_rows, size=int(round(fraction * n_rows)), replace=False)] = True
    return mask


FITTERS = {"gemm": fit_gemm, "context_attention": fit_context, "generation_attention": fit_generation}


def heldout_evaluation(kind: str, table, peak_flops_fn, peak_bw: float, test: np.ndarray) -> dict:
    """Fit ``kind`` on the rows outside ``test`` and score the predictions on the rows in it."""
    fit = FITTERS[kind](table.subset(~test), peak_flops_fn, peak_bw)
    held = table.subset(test)
    return error_summary(predict_table(fit, held), held.latency_s)


def robust_log_fit(predict, y: np.ndarray, x0: np.ndarray, seed: int = 0) -> tuple[np.ndarray, dict]:
    """The constants ``exp(p)`` of a closed form ``predict(p, rows)`` (seconds at those row indices)
    fitted to ``y`` (seconds) in log space, and their scores: fitted on a random 80 % of the rows
    (``seed``), scored on the other 20 % (``rows``, ``heldout_median``, ``heldout_p90``: relative
    error), then refitted on all rows. The loss is robust: a few shapes a table times with a kernel of
    their own (TensorRT-LLM's top-1 Llama-4 experts, 4x the form) would otherwise bias every other one."""

    def solve(rows: np.ndarray) -> np.ndarray:
        return least_squares(lambda p: np.log(predict(p, rows)) - np.log(y[rows]), x0, loss="soft_l1", f_scale=0.1).x

    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    err = np.abs(predict(solve(train), test) / y[test] - 1.0)
    scores = {
        "rows": int(len(y)),
        "heldout_median": round(float(np.median(err)), 4),
        "heldout_p90": round(float(np.percentile(err, 90)), 4),
    }
    return np.exp(solve(np.arange(len(y)))), scores
