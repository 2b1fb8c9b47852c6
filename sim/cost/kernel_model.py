"""Fitted kernel-latency models, and the per-shape curves a cost model derives from them.

A measured kernel table (GEMMs, prefill attention, decode attention) is fitted once
(``calibration.fit``) into a :class:`FamilyFit`: per dtype group, a physical form plus a
correction on the measured grid::

    t = (L + (Σ_i (w_i / r_i)^p)^(1/p)) · exp(r(grid coordinates))

with ``w_i`` the work terms (FLOPs, bytes, serial KV tokens), ``r_i`` their fitted rates,
``L`` the launch latency, ``p`` a smooth maximum, and ``r`` the log-ratio of measured to
parametric time, multilinear on the tensor grid of measured log coordinates and held at its
edge value beyond it. This module holds the fitted numbers, evaluates them for any shape,
and stores them compactly in a profile; the fitting itself (least squares, grid filling)
lives in ``calibration/fit.py``.

From a family a cost model derives, at load time, the curves of exactly the shapes a model
needs (:func:`gemm_curve`, :func:`attention_grids`): seconds on the measured grid of token
counts (GEMM) or (batch, length) cells (attention), raised to the physical floor
max(FLOPs / peak, bytes / peak bandwidth). A shape whose n, k or head counts lie outside the
measured ones is priced by the same formula (the correction held at its edge) and flagged
``outside_measured`` so the cost model counts its queries in ``out_of_range``.

Plain functions for the math; the dataclasses hold fitted numbers. No torch.
"""

from __future__ import annotations

import base64
import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.catalog import tensor_core_peak

#: Bytes per element by canonical dtype name. ``int8_wo`` stores int8 weights, computes in bf16.
ELEM_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    # NVFP4: 4-bit values with one fp8 scale per 16 (and a per-tensor fp32 scale): 4.5 bits.
    "nvfp4": 0.5625,
    "mxfp4": 0.53125,
    "int8_wo": 1.0,
    "int8_sq": 1.0,
    "int4_wo": 0.5,
    "fp32": 4.0,
}


def elem_bytes(dtype: str) -> float:
    return ELEM_BYTES.get(dtype, 2.0)


# --- parametric form ------------------------------------------------------------------------


@dataclass(frozen=True)
class RooflineFit:
    """``t = L + (Σ_i (w_i / r_i)^p)^(1/p)``: launch latency plus a smooth max of work terms.

    ``terms`` names the work measures (``flops``, ``bytes``, ``serial_tokens``) and
    ``rates`` their fitted throughputs (FLOP/s, bytes/s, tokens/s); seconds out.
    """

    launch_s: float
    terms: tuple[str, ...]
    rates: tuple[float, ...]
    p: float

    def theta(self) -> np.ndarray:
        return np.array([np.log(self.launch_s), *np.log(self.rates), np.log(self.p - 1.0)])

    def __call__(self, work: np.ndarray) -> np.ndarray:
        return roofline_time(self.theta(), work)

    def as_dict(self) -> dict:
        return {"launch_s": self.launch_s, "p": self.p, **{f"{n}_per_s": r for n, r in zip(self.terms, self.rates)}}

    @classmethod
    def from_dict(cls, d: dict) -> RooflineFit:
        names = tuple(k[: -len("_per_s")] for k in d if k.endswith("_per_s"))
        return cls(float(d["launch_s"]), names, tuple(float(d[f"{n}_per_s"]) for n in names), float(d["p"]))


def roofline_time(theta: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Seconds of the parametric form. ``theta`` = log(L), log(r_1..r_n), log(p − 1); ``work`` is (n, rows)."""
    launch, p = np.exp(theta[0]), 1.0 + np.exp(theta[-1])
    rates = np.exp(theta[1:-1])[:, None]
    terms = np.asarray(work, dtype=np.float64) / rates
    hi = np.maximum(terms.max(axis=0), 1e-30)
    # (Σ x_i^p)^(1/p) computed relative to the largest term so it cannot overflow.
    return launch + hi * ((terms / hi) ** p).sum(axis=0) ** (1.0 / p)


# --- grid correction ------------------------------------------------------------------------


def multilinear(axes: list[np.ndarray], values: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Multilinear interpolation of ``values`` (one axis per entry of ``axes``, each strictly
    ascending, at least 2 points) at ``pts`` (``n × len(axes)``, inside the grid).

    The same floating-point operations, in the same order, as scipy's
    ``RegularGridInterpolator(method="linear")`` for grids of other than 2 dimensions (its
    interval search and its sum over the hypercube's corners), so the results are bit-identical;
    written out because importing ``scipy.interpolate`` costs a quarter of a second at every
    start.
    """
    idx = []
    dist = []
    for d, a in enumerate(axes):
        x = pts[:, d]
        # The interval [a[i], a[i+1]) holding x, the last one closed on the right.
        i = np.clip(np.searchsorted(a, x, side="right") - 1, 0, len(a) - 2)
        idx.append(i)
        dist.append((x - a[i]) / (a[i + 1] - a[i]))
    shift = [1 - y for y in dist]
    value = np.array([0.0])
    for corner in itertools.product((0, 1), repeat=len(axes)):
        weight = np.array([1.0])
        for d, c in enumerate(corner):
            weight = weight * (dist[d] if c else shift[d])
        value = value + values[tuple(idx[d] + c for d, c in enumerate(corner))] * weight
    return value


@dataclass
class GridCorrection:
    """Log-ratio correction on a tensor grid of log coordinates, multilinear, clamped at the edges."""

    axes: list[np.ndarray]
    values: np.ndarray
    #: scipy's interpolator, only for a grid this module's :func:`multilinear` does not replicate.
    _interp: Any = field(default=None, repr=False)

    def __call__(self, coords_log: np.ndarray) -> np.ndarray:
        live = [d for d, a in enumerate(self.axes) if len(a) > 1]
        vals = self.values
        # Singleton axes carry no variation: squeeze them out (interpolation needs ≥ 2 points).
        vals = vals.reshape(tuple(len(self.axes[d]) for d in live)) if live else vals.reshape(())
        if not live:
            return np.full(coords_log.shape[0], float(vals))
        axes = [self.axes[d] for d in live]
        pts = np.column_stack([np.clip(coords_log[:, d], self.axes[d][0], self.axes[d][-1]) for d in live])
        pts = np.asarray(pts, dtype=float)
        if (
            len(live) != 2  # scipy takes a compiled path for two dimensions: left to it
            and vals.dtype == np.float64
            and all(a.dtype == np.float64 and bool(np.all(np.diff(a) > 0)) for a in axes)
            and bool(np.isfinite(pts).all())
        ):
            return multilinear(axes, vals, pts)
        if self._interp is None:
            from scipy.interpolate import RegularGridInterpolator

            self._interp = RegularGridInterpolator(axes, vals, method="linear")
        return self._interp(pts)


# --- kernel families ------------------------------------------------------------------------


@dataclass
class FamilyFit:
    """One kernel family split into groups (dtype combinations), each parametric + grid."""

    kind: str
    groups: dict[tuple, tuple[RooflineFit, GridCorrection]]

    def group_keys(self) -> list[tuple]:
        return sorted(self.groups)


def gemm_work(m, n, k, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Work terms (FLOPs, bytes moved) and grid coordinates of an (m×k)·(k×n) GEMM of ``dtype``.

    Activations are read at the compute width (bf16 for weight-only formats), weights
    at the storage width, the output written in bf16.
    """
    m, n, k = np.broadcast_arrays(*(np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (m, n, k)))
    wb = elem_bytes(dtype)
    ab = elem_bytes(dtype) if dtype in ("fp8", "fp8_block", "int8_sq", "nvfp4") else 2.0
    flops = 2.0 * m * n * k
    nbytes = m * k * ab + n * k * wb + m * n * 2.0
    return np.stack([flops, nbytes]), np.log(np.column_stack([m, n, k]))


def context_work(batch, length, heads, kv_heads, head_dim, attn_dtype: str, kv_dtype: str):
    """Causal prefill of ``batch`` prompts of ``length`` tokens, one layer: work (FLOPs, bytes), grid coordinates."""
    b, s, h, kvh, d = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (batch, length, heads, kv_heads, head_dim))
    )
    flops = 2.0 * b * h * d * s * s  # QK^T and PV, 2 FLOPs each per (q, k) pair, half the pairs (causal)
    nbytes = b * s * d * (2.0 * h * elem_bytes(attn_dtype) + 2.0 * kvh * elem_bytes(kv_dtype))
    return np.stack([flops, nbytes]), np.log(np.column_stack([b, s, h / kvh, kvh]))


def generation_work(batch, kv_len, heads, kv_heads, head_dim, kv_dtype: str):
    """One decode token per sequence over ``kv_len`` cached tokens, one layer: work (FLOPs, bytes, serial tokens), coordinates."""
    b, s, h, kvh, d = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (batch, kv_len, heads, kv_heads, head_dim))
    )
    flops = 4.0 * b * h * d * s
    nbytes = b * s * 2.0 * kvh * d * elem_bytes(kv_dtype) + b * 4.0 * h * d
    # One thread block walks a sequence's KV serially when the batch is too small to fill
    # the GPU: a per-token latency term, independent of batch, explains the knee that
    # stays at the same KV length for batch 1 and batch 8.
    return np.stack([flops, nbytes, s]), np.log(np.column_stack([b, s, h / kvh, kvh]))


def attention_dims(cells_log: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(batch, length, heads, kv_heads) from attention grid coordinates (log b, log s, log group, log kv_heads)."""
    b, sl, g, kvh = np.exp(cells_log).T
    return b, sl, g * kvh, kvh


class MissingGroup(KeyError):
    """A family has no fitted group for the requested dtype combination."""


def lookup(fit: FamilyFit, key: tuple) -> tuple[RooflineFit, GridCorrection]:
    try:
        return fit.groups[key]
    except KeyError:
        raise MissingGroup(
            f"{fit.kind}: no group {key}; measured groups: {', '.join(map(str, fit.group_keys()))}"
        ) from None


def predict_gemm(fit: FamilyFit, dtype: str, m, n, k) -> np.ndarray:
    """Seconds for GEMMs of one dtype (vectorised over m, n, k)."""
    rf, gc = lookup(fit, (dtype,))
    w, co = gemm_work(m, n, k, dtype)
    return rf(w) * np.exp(gc(co))


def predict_context(
    fit: FamilyFit, attn_dtype: str, kv_dtype: str, head_dim: int, batch, length, heads, kv_heads
) -> np.ndarray:
    rf, gc = lookup(fit, (attn_dtype, kv_dtype, int(head_dim)))
    w, co = context_work(batch, length, heads, kv_heads, head_dim, attn_dtype, kv_dtype)
    return rf(w) * np.exp(gc(co))


def predict_generation(fit: FamilyFit, kv_dtype: str, head_dim: int, batch, kv_len, heads, kv_heads) -> np.ndarray:
    rf, gc = lookup(fit, (kv_dtype, int(head_dim)))
    w, co = generation_work(batch, kv_len, heads, kv_heads, head_dim, kv_dtype)
    return rf(w) * np.exp(gc(co))


# --- per-shape curves -----------------------------------------------------------------------


@dataclass(frozen=True)
class Peaks:
    """Hardware peaks the derived curves are floored at: FLOP/s by dtype, HBM bytes/s."""

    bf16_flops: float
    fp8_flops: float
    mem_bw: float
    fp4_flops: float = 0.0

    def flops(self, dtype: str) -> float:
        """Tensor-core peak for GEMMs computed in ``dtype`` (:func:`sim.catalog.tensor_core_peak`)."""
        return tensor_core_peak(dtype, self.bf16_flops, self.fp8_flops, self.fp4_flops)


def _on_grid(value: float, axis_log: np.ndarray) -> bool:
    return bool(np.any(np.abs(axis_log - np.log(value)) < 1e-9))


def _outside(value: float, axis_log: np.ndarray) -> bool:
    lv = np.log(value)
    return bool(lv < axis_log[0] - 1e-9 or lv > axis_log[-1] + 1e-9)


def gemm_curve(fit: FamilyFit, dtype: str, n: int, k: int, peaks: Peaks) -> tuple[np.ndarray, np.ndarray, dict]:
    """Seconds of an (m×k)·(k×n) GEMM at the measured token counts ``m`` of ``dtype``, floored at
    FLOPs / peak: ``(m, t_s, meta)``. ``meta`` notes floor-clamped points and whether n or k lies
    outside the measured ones (``outside_measured``)."""
    _, gc = lookup(fit, (dtype,))
    m = np.exp(gc.axes[0])
    t = predict_gemm(fit, dtype, m, np.full_like(m, n), np.full_like(m, k))
    floor = 2.0 * m * n * k / peaks.flops(dtype)
    meta: dict = {"table_dtype": dtype, "measured_shape": _on_grid(n, gc.axes[1]) and _on_grid(k, gc.axes[2])}
    outside = [
        f"{name}={v} outside measured {np.exp(ax[0]):.0f}..{np.exp(ax[-1]):.0f}"
        for name, v, ax in (("n", n, gc.axes[1]), ("k", k, gc.axes[2]))
        if _outside(v, ax)
    ]
    if outside:
        meta["outside_measured"] = "; ".join(outside) + " (parametric form, correction held at the grid edge)"
    clamped = int(np.sum(t < floor))
    if clamped:
        meta["clamped_to_physical_floor"] = clamped
    return m, np.maximum(t, floor), meta


def attention_grid(
    fit: FamilyFit, kind: str, group: tuple, heads: int, kv_heads: int, head_dim: int, peaks: Peaks
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """One layer's attention seconds on the measured (batch, length) cells of ``group`` for a shape of
    ``heads``/``kv_heads`` per GPU: ``(batch, length, t_s[batch, length], meta)``, floored at the
    physical limit. ``kind`` is ``context`` (group = attn dtype, KV dtype, head_dim) or ``generation``
    (group = KV dtype, head_dim; length = KV tokens per sequence)."""
    rf, gc = lookup(fit, group)
    b, s = np.exp(gc.axes[0]), np.exp(gc.axes[1])
    bb, ss = np.meshgrid(b, s, indexing="ij")
    # The group's fit evaluated with this shape's work terms (its own head_dim, which may differ from
    # the group's when no table measured it).
    if kind == "context":
        ad, kd, _ = group
        work, co = context_work(bb.ravel(), ss.ravel(), heads, kv_heads, head_dim, ad, kd)
        floor = np.maximum(work[0] / peaks.flops(ad), work[1] / peaks.mem_bw)
        meta: dict = {"group": "/".join(str(x) for x in group)}
    else:
        kd, _ = group
        work, co = generation_work(bb.ravel(), ss.ravel(), heads, kv_heads, head_dim, kd)
        floor = np.maximum(work[0] / peaks.bf16_flops, work[1] / peaks.mem_bw)
        meta = {"group": "/".join(str(x) for x in group), "length_is": "KV tokens per sequence"}
    t = rf(work) * np.exp(gc(co))
    meta["measured_shape"] = _on_grid(heads / kv_heads, gc.axes[2]) and _on_grid(kv_heads, gc.axes[3])
    outside = [
        f"{name}={v:g} outside measured {np.exp(ax[0]):g}..{np.exp(ax[-1]):g}"
        for name, v, ax in (("heads per KV head", heads / kv_heads, gc.axes[2]), ("KV heads", kv_heads, gc.axes[3]))
        if _outside(v, ax)
    ]
    if outside:
        meta["outside_measured"] = "; ".join(outside) + " (parametric form, correction held at the grid edge)"
    clamped = int(np.sum(t < floor))
    if clamped:
        meta["clamped_to_physical_floor"] = clamped
    return b, s, np.maximum(t, floor).reshape(bb.shape), meta


# --- storage --------------------------------------------------------------------------------

#: Corrections are stored as int16 multiples of a log-ratio step (at least this, 0.01 %; larger when a
#: group's corrections exceed ±3.2, so none is clipped), differenced along the last axis (neighbouring
#: cells are close), the two bytes of each value split into two planes, zlib-compressed and
#: base64-encoded inside the profile JSON: a 74×22×22 GEMM grid takes ~70 kB instead of ~400 kB of
#: decimal text, and a profile stays one self-contained file.
CORRECTION_STEP = 1e-4
_CODEC = "int16_delta_shuffle_zlib_b64"


def _pack(values: np.ndarray) -> dict:
    v = np.asarray(values, dtype=np.float64)
    peak = float(np.abs(v).max()) if v.size else 0.0
    step = max(CORRECTION_STEP, float(f"{peak / 32000:.2g}") if peak else 0.0)
    while peak / step > 32767:  # the 2-digit rounding may have gone down
        step *= 1.01
    q = np.rint(v / step).astype(np.int32)
    # int16 wrap-around of the differences is undone by the cumulative sum in int16 arithmetic.
    d = np.diff(q, axis=-1, prepend=0).astype("<i2") if q.ndim else q.astype("<i2")
    planes = np.frombuffer(d.tobytes(), dtype=np.uint8).reshape(-1, 2).T.tobytes()
    return {"shape": list(q.shape), "step": step, _CODEC: base64.b64encode(zlib.compress(planes, 9)).decode()}


def _unpack(d: dict) -> np.ndarray:
    shape = tuple(int(x) for x in d["shape"])
    raw = zlib.decompress(base64.b64decode(d[_CODEC]))
    n = int(np.prod(shape))
    if len(raw) != 2 * n:
        raise ValueError(f"correction holds {len(raw) // 2} values, shape {shape} needs {n}")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(2, n).T.copy()
    diffs = planes.view("<i2").reshape(shape)
    q = np.cumsum(diffs, axis=-1, dtype=np.int16) if len(shape) else diffs
    return q.astype(np.float64) * float(d["step"])


def family_to_json(fit: FamilyFit) -> dict:
    """A family as JSON: per group key (``bf16`` or ``bf16/fp8/128``) its parametric form, grid axes
    (log coordinates, rounded to 1e-9) and packed correction."""
    out = {}
    for key, (rf, gc) in sorted(fit.groups.items()):
        out["/".join(str(x) for x in key)] = {
            "roofline": {k: (float(f"{v:.9g}") if isinstance(v, float) else v) for k, v in rf.as_dict().items()},
            "axes_log": [[round(float(x), 9) for x in a] for a in gc.axes],
            "correction": _pack(gc.values),
        }
    return {"kind": fit.kind, "groups": out}


def _group_key(kind: str, name: str) -> tuple:
    parts = name.split("/")
    if kind == "gemm":
        return (parts[0],)
    if kind == "context_attention":
        return (parts[0], parts[1], int(parts[2]))
    return (parts[0], int(parts[1]))


def family_from_json(d: dict) -> FamilyFit:
    kind = str(d["kind"])
    groups = {}
    for name, g in d["groups"].items():
        axes = [np.asarray(a, dtype=np.float64) for a in g["axes_log"]]
        values = _unpack(g["correction"])
        if values.shape != tuple(len(a) for a in axes):
            raise ValueError(f"{kind} group {name}: correction shape {values.shape} does not match its axes")
        groups[_group_key(kind, name)] = (RooflineFit.from_dict(g["roofline"]), GridCorrection(axes, values))
    return FamilyFit(kind, groups)
