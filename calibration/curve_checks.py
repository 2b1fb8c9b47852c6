"""Data-quality checks on a profile's GEMM curves, for ``kvsim profile show``.

kvsim prices a kernel table as it was published: a point that looks wrong is neither smoothed
nor dropped, because without the GPU it cannot be told whether it is noise or a real kernel
dispatch at that size. These checks make such points visible instead.

* :func:`gemm_steps` — a point at ``m`` tokens costing more than ``threshold`` times the cheapest
  point at any larger ``m'`` of the same curve (same engine, dtype and shape). A GEMM with fewer
  rows does no more work and moves no more bytes, so beyond noise it should not cost more.
* :func:`gemm_dtype_inversions` — a heuristic: an fp8 (block fp8, NVFP4) GEMM costing more than
  ``threshold`` times the bf16 GEMM of the same engine, shape and ``m``, after taking off the
  engine table's fixed input-quantization cost (:meth:`Profile.fp8_gemm_excess_s`). It reads
  half the weight bytes or fewer, so it should not be slower, but an engine may legitimately
  pick a slower fp8 kernel at some sizes: a hint where to look, not proof of a bad point.

The curves scanned are those kvsim prices: each engine's own tables (``Profile.kernels``) at the
GEMM shapes of the models the profile lists, every dtype the engine timed, on the measured token
counts; and the baked ``gemm`` curves of device profiles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.cost.kernel_model import gemm_curve
from sim.cost.profile import Profile

#: A point costing at most this many times its comparison is taken as noise.
THRESHOLD = 1.5
#: Token counts up to this are decode sizes (one token per decoding sequence): where a dearer
#: point changes small-batch TPOT.
DECODE_M = 64
#: Low-precision weight dtypes compared with bf16 (int8 weight-only computes in bf16 after
#: dequantizing, so it may be slower and is left out).
LOW_PRECISION = ("fp8", "fp8_block", "nvfp4")
#: Label of a profile's baked curves (device profiles), which no engine's tables hold.
BAKED = "baked"


@dataclass(frozen=True)
class CurveFinding:
    """One point of a GEMM curve dearer than a comparison point by more than the threshold."""

    engine: str
    dtype: str
    #: ``<n>x<k>``.
    shape: str
    m: int
    t_s: float
    #: The comparison: the cheapest larger token count of the same curve (:func:`gemm_steps`),
    #: or the same ``m`` in ``ref_dtype`` (:func:`gemm_dtype_inversions`).
    ref_m: int
    ref_t_s: float
    ref_dtype: str
    #: Seconds of ``t_s`` not counted against it: the engine table's fixed fp8 input-quantization cost
    #: (:func:`gemm_dtype_inversions`), 0 otherwise.
    excess_s: float = 0.0

    @property
    def ratio(self) -> float:
        return (self.t_s - self.excess_s) / self.ref_t_s


def curve_steps(m, t_s, threshold: float = THRESHOLD) -> list[tuple[int, int]]:
    """``(i, j)`` pairs of one curve (token counts ``m`` ascending, seconds ``t_s``): point ``i`` costs
    more than ``threshold`` times point ``j``, the cheapest of those after it."""
    t = np.asarray(t_s, dtype=np.float64)
    if len(m) != len(t):
        raise ValueError("m and t_s differ in length")
    out = []
    for i in range(len(t) - 1):
        j = i + 1 + int(np.argmin(t[i + 1 :]))
        if t[i] > threshold * t[j]:
            out.append((i, j))
    return out


def _int(x) -> int:
    # Token counts come back from the fitted grid as exp(log m): 2.9999999 is 3.
    return int(round(float(x)))


def _model_shapes(profile: Profile) -> list[tuple[int, int]]:
    shapes = {s for m in profile.models.values() for s in m.get("gemm_shapes", {}).values()}
    return sorted(tuple(int(x) for x in s.split("x")) for s in shapes)  # type: ignore[misc]


def _curves(profile: Profile) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
    """``{(engine, dtype, shape): (m, t_s)}`` of every GEMM curve the profile prices."""
    out: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
    for key, curve in profile.gemm.items():
        shape, dtype = key.split(":")
        out[(BAKED, dtype, shape)] = (curve.x, curve.t_s)
    shapes = _model_shapes(profile)
    peaks = profile.peaks() if profile.kernels else None
    for engine, fams in sorted(profile.kernels.items()):
        fit = fams.get("gemm")
        if fit is None or peaks is None:
            continue
        for (dtype,) in fit.group_keys():
            for n, k in shapes:
                m, t, _ = gemm_curve(fit, dtype, n, k, peaks)
                out[(engine, dtype, f"{n}x{k}")] = (m, t)
    return out


def gemm_steps(profile: Profile, threshold: float = THRESHOLD) -> list[CurveFinding]:
    """Points of the profile's GEMM curves dearer than ``threshold`` times the cheapest larger token
    count of the same curve, worst first."""
    found = []
    for (engine, dtype, shape), (m, t) in _curves(profile).items():
        for i, j in curve_steps(m, t, threshold):
            found.append(CurveFinding(engine, dtype, shape, _int(m[i]), float(t[i]), _int(m[j]), float(t[j]), dtype))
    return sorted(found, key=lambda f: -f.ratio)


def gemm_dtype_inversions(profile: Profile, threshold: float = THRESHOLD) -> list[CurveFinding]:
    """Heuristic: low-precision GEMM points (:data:`LOW_PRECISION`) dearer than ``threshold`` times the
    bf16 GEMM of the same engine, shape and token count, beyond the engine table's fixed
    input-quantization cost; worst first. ``t_s`` is the table's time, the ratio net of that cost
    (``excess_s``)."""
    curves = _curves(profile)
    found = []
    for (engine, dtype, shape), (m, t) in curves.items():
        ref = curves.get((engine, "bf16", shape))
        if dtype not in LOW_PRECISION or ref is None or len(ref[0]) != len(m) or not np.allclose(ref[0], m):
            continue
        excess = profile.fp8_gemm_excess_s(None if engine == BAKED else engine, dtype) if profile.kernels else 0.0
        for i in np.nonzero(t - excess > threshold * ref[1])[0]:
            found.append(
                CurveFinding(
                    engine, dtype, shape, _int(m[i]), float(t[i]), _int(m[i]), float(ref[1][i]), "bf16", excess
                )
            )
    return sorted(found, key=lambda f: -f.ratio)


def _by_group(found: list[CurveFinding]) -> list[tuple[tuple[str, str], list[CurveFinding]]]:
    groups: dict[tuple[str, str], list[CurveFinding]] = defaultdict(list)
    for f in found:
        groups[(f.engine, f.dtype)].append(f)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _common_m(fs: list[CurveFinding]) -> str:
    counts: dict[int, int] = defaultdict(int)
    for f in fs:
        counts[f.m] += 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return ", ".join(f"m={m} ×{n}" for m, n in top)


def _us(t: float) -> str:
    return f"{t * 1e6:.1f} µs"


def report_lines(profile: Profile, threshold: float = THRESHOLD) -> list[str]:
    """``kvsim profile show``'s section on the checks: counts per engine and dtype, each group's worst
    point, and what a flagged point does to pricing."""
    steps = gemm_steps(profile, threshold)
    inversions = gemm_dtype_inversions(profile, threshold)
    lines = [
        f"GEMM curve checks (measured tables as published, priced as measured; {len(_model_shapes(profile))} "
        "model shapes and any baked curves):"
    ]
    if not steps and not inversions:
        lines.append(f"  none: no smaller GEMM costs over {threshold:g}× a larger one, no fp8 over {threshold:g}× bf16")
        return lines
    lines.append(
        f"  smaller GEMM dearer than a larger one of the same shape (t(m) > {threshold:g}× the cheapest t at a "
        f"larger m): {len(steps)} points"
    )
    lines += _group_lines(steps, lambda w: f"vs m={w.ref_m} {_us(w.ref_t_s)} ({w.ratio:.2f}×)")
    if inversions:
        lines.append(
            f"  heuristic, fp8/fp8_block/nvfp4 over {threshold:g}× bf16 at the same m and shape (net of the "
            f"table's fixed input-quantization cost): {len(inversions)} points"
        )
        lines += _group_lines(
            inversions, lambda w: f"vs bf16 {_us(w.ref_t_s)} ({w.ratio:.2f}× net of {_us(w.excess_s)})"
        )
    lines.append(
        f"  Not smoothed (noise or a real kernel choice cannot be told without the GPU): a decode step of m "
        f"sequences pays such a point, so at those small batches (m ≤ {DECODE_M}) that engine and dtype price "
        "TPOT above a larger batch's or bf16's."
    )
    return lines


def _group_lines(findings: list, against: Callable[[Any], str]) -> list[str]:
    """One line per engine and dtype: the count, how many at decode batches, the commonest m and the
    worst point (``against``: what it is compared with)."""
    out = []
    for (engine, dtype), fs in _by_group(findings):
        w = fs[0]
        small = sum(f.m <= DECODE_M for f in fs)
        out.append(
            f"    {engine} {dtype}: {len(fs)} ({small} at m ≤ {DECODE_M}; most {_common_m(fs)}); worst {w.shape} "
            f"m={w.m} {_us(w.t_s)} {against(w)}"
        )
    return out
