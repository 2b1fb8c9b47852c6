"""Calibrated profiles: the file format, loading and sharing (the cost model built from one is
:class:`sim.cost.profile_model.ProfileCostModel`).

A profile is one JSON file per device (``"format": "kvsim-profile", "version": 1``)
holding measured-and-fitted curves keyed by kernel shape, so several model shapes
share them (Llama-2-7B and Llama-3.1-8B share the 4096×4096 output projection):

* ``gemm["<n>x<k>:<dtype>"]``: seconds vs token count ``m`` for an (m×k)·(k×n) GEMM;
* ``context_attention["<heads>/<kv_heads>/<head_dim>:<kv_dtype>"]``: seconds vs
  (batch, prompt length) for one layer's causal prefill;
* ``generation_attention[...]``: seconds vs (batch, KV length per sequence) for one
  layer's decode attention, measured on a paged cache (``layout``);
* ``allreduce["<gpus>"]``: seconds vs message bytes; ``cpu_overhead``: seconds per step
  vs batch size (``intercept_s + per_seq_s·S``, plus, where measured per count, its departure
  from that line ``per_seq_delta_s``); ``memory``: alloc/zero-fill/copy/host-transfer figures;
  ``elementwise``: the memory-bound per-layer ops (norms, RoPE, activation, residual adds);
* ``provenance`` and ``fit_quality`` (held-out median/p95 relative error per curve family).

A profile loaded from a file keeps the SHA-256 of the exact bytes it was parsed from
(``Profile.sha256``), and a cost model built on it says which file priced it
(:class:`ProfileProvenance`, ``sim.cost.profile_model.ProfileCostModel.provenance``): ``summary.json``'s
``cost_model_profile`` block is built from that, never from a second read of the file.

Curves are stored on their measured grid and interpolated in log-log space (piecewise
power laws, exact at grid points). A query beyond the grid is never silently
extrapolated: it is counted in ``CostModel.out_of_range[curve]`` and answered by
clamping (below the grid) or proportional scaling from the last grid point (above:
time ∝ tokens, the compute/bandwidth-bound limit). This module must not import torch.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.resources
import json
import math
import os
import re
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.cost.kernel_model import (
    FamilyFit,
    MissingGroup,
    Peaks,
    attention_grid,
    family_from_json,
    family_to_json,
    gemm_curve,
)
from sim.cost.mla import MlaKernelFit
from sim.cost.moe import MoeKernelFit
from sim.cost.profile_format import validate_profile
from sim.errors import ConfigError
from sim.inputs import decode, is_file, load_json, read_bytes, read_text

FORMAT = "kvsim-profile"
#: 2 adds fitted kernel families (``kernels``), from which curves of any shape are derived.
VERSION = 2
READABLE_VERSIONS = (1, 2)
# From the package, not ``__file__``: a compiled module (sim/native.py) reports its own path differently.
PROFILE_DIR = Path(str(importlib.resources.files("sim"))) / "profiles"
KEY = "cost_model.profile"


def _sig(x: float, digits: int = 5) -> float:
    """Round to ``digits`` significant figures (keeps the JSON small, far below measurement noise)."""
    return float(f"{x:.{digits}g}")


def _round_list(a) -> list | float:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 0:
        return _sig(float(arr))
    return [_round_list(x) for x in arr] if arr.ndim > 1 else [_sig(float(x)) for x in arr]


# --- curves ---------------------------------------------------------------------------------

# Scalar queries (one batch shape per engine iteration) go through plain Python floats: numpy's
# per-call overhead on 1-element arrays dominated the cost model. ``_interp1`` repeats
# ``np.interp``'s branches and arithmetic for one point; log/exp are ``math``'s, which differ from
# numpy's vectorised loops by at most an ulp or two (numpy's ufuncs on a scalar cost ~1 µs each,
# a large share of a decode window). tests/test_profile_speed_equivalence.py holds both paths
# to 1e-12 relative.
_log = math.log
_exp = math.exp


def _interp1(x: float, xp: list[float], fp: list[float], slopes: list[float]) -> float:
    """``np.interp(x, xp, fp)`` for one float: same bracket, same ``slope·(x − xp[j]) + fp[j]``."""
    if x >= xp[-1]:
        return fp[-1]
    if x < xp[0]:
        return fp[0]
    j = bisect_right(xp, x) - 1
    xj = xp[j]
    if xj == x:
        return fp[j]
    return slopes[j] * (x - xj) + fp[j]


def _is_number(x) -> bool:
    """An int or float from a profile's JSON (not a bool, which Python counts as an int)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _slopes(xp: list[float], fp: list[float]) -> list[float]:
    return [(fp[i + 1] - fp[i]) / (xp[i + 1] - xp[i]) for i in range(len(xp) - 1)]


#: A grid row at one batch size for scalar lookups: log-times, their slopes, the batch scale
#: factor, its out-of-range flag and the time at the last length.
_ScalarRow = tuple[list[float], list[float], float, int, float]


@dataclass
class Curve1D:
    """Seconds vs one positive coordinate, log-log piecewise linear between grid points."""

    x: np.ndarray
    t_s: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.float64)
        self.t_s = np.asarray(self.t_s, dtype=np.float64)
        if self.x.ndim != 1 or self.x.shape != self.t_s.shape or len(self.x) < 2:
            raise ValueError("curve needs matching 1-d x and t_s with at least two points")
        if np.any(np.diff(self.x) <= 0) or np.any(self.x <= 0) or np.any(self.t_s <= 0):
            raise ValueError("curve x must be positive and increasing, t_s positive")
        self._lx, self._lt = np.log(self.x), np.log(self.t_s)
        # Scalar tables (see ``at``).
        self._lxl: list[float] = self._lx.tolist()
        self._ltl: list[float] = self._lt.tolist()
        self._sl = _slopes(self._lxl, self._ltl)
        self._x_last: float = float(self.x[-1])
        self._t_last: float = float(self.t_s[-1])
        self._hi: float = self._x_last * (1 + 1e-9)
        self._lo: float = float(self.x[0]) * (1 - 1e-9)
        #: A curve of a shape outside the measured ones (``meta["outside_measured"]``): every query counts
        #: as out of range.
        self._outside: bool = "outside_measured" in self.meta

    def at(self, x: float) -> tuple[float, int]:
        """``__call__`` for one value, without numpy arrays: seconds and 0/1 out of the grid."""
        x = max(float(x), 1e-12)
        if x > self._hi:
            return self._t_last * x / self._x_last, 1
        t = _exp(_interp1(_log(x), self._lxl, self._ltl, self._sl))
        return t, int(x < self._lo or self._outside)

    def __call__(self, x) -> tuple[np.ndarray, int]:
        """Seconds at ``x`` (array) and how many points lay outside the grid."""
        x = np.maximum(np.asarray(x, dtype=np.float64), 1e-12)
        t = np.exp(np.interp(np.log(x), self._lx, self._lt))
        above = x > self.x[-1] * (1 + 1e-9)
        below = x < self.x[0] * (1 - 1e-9)
        if above.any():
            t = np.where(above, self.t_s[-1] * x / self.x[-1], t)
        if self._outside:
            return t, int(x.size)
        return t, int(above.sum() + below.sum())

    def to_json(self) -> dict:
        return {"x": _round_list(self.x), "t_s": _round_list(self.t_s), **self.meta}

    @classmethod
    def from_json(cls, d: dict) -> Curve1D:
        return cls(np.array(d["x"]), np.array(d["t_s"]), {k: v for k, v in d.items() if k not in ("x", "t_s")})


@dataclass
class Grid2D:
    """Seconds vs (batch, length) on a measured grid, bilinear in log space.

    Above the grid on either axis the time scales in proportion (batch and length both
    multiply work in the bandwidth/compute-bound limit); below, it is clamped.
    """

    batch: np.ndarray
    length: np.ndarray
    t_s: np.ndarray  # (len(batch), len(length))
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.batch = np.asarray(self.batch, dtype=np.float64)
        self.length = np.asarray(self.length, dtype=np.float64)
        self.t_s = np.asarray(self.t_s, dtype=np.float64)
        if self.t_s.shape != (len(self.batch), len(self.length)) or len(self.batch) < 2 or len(self.length) < 2:
            raise ValueError("grid t_s must be (len(batch), len(length)) with at least 2×2 points")
        if np.any(np.diff(self.batch) <= 0) or np.any(np.diff(self.length) <= 0) or np.any(self.t_s <= 0):
            raise ValueError("grid axes must increase and times be positive")
        self._lb, self._ll, self._lt = np.log(self.batch), np.log(self.length), np.log(self.t_s)
        self._rows: dict[float, tuple[np.ndarray, float, int]] = {}
        # Scalar tables (see ``at``): log lengths, and per batch the row as floats with its slopes.
        self._lll: list[float] = self._ll.tolist()
        self._knots: list[float] = self.length.tolist()
        self._len_last: float = float(self.length[-1])
        self._len_hi: float = self._len_last * (1 + 1e-9)
        self._len_lo: float = float(self.length[0]) * (1 - 1e-9)
        self._srows: dict[float, _ScalarRow] = {}
        #: A grid of a shape outside the measured ones: every query counts as out of range (through
        #: the row's batch flag, which every lookup path honours).
        self._outside: bool = "outside_measured" in self.meta

    def _srow(self, batch: float) -> _ScalarRow:
        hit = self._srows.get(batch)
        if hit is not None:
            return hit
        row, scale, oor = self.row(batch)
        lrow: list[float] = row.tolist()
        out = (lrow, _slopes(self._lll, lrow), scale, oor, math.exp(row[-1]))
        if len(self._srows) < 4096:
            self._srows[batch] = out
        return out

    def at(self, batch: float, length: float) -> tuple[float, int]:
        """``__call__`` for one length, without numpy arrays: seconds and 0/1 out of the grid."""
        lrow, slopes, scale, oor_b, e_last = self._srow(batch)
        length = max(float(length), 1e-12)
        if length > self._len_hi:
            t, oor = e_last * length / self._len_last, 1
        else:
            t = _exp(_interp1(_log(length), self._lll, lrow, slopes))
            oor = int(length < self._len_lo)
        return t * scale, (1 if oor_b else oor)

    def at_many(
        self, batch: float, lengths: list[float], base: float = 0.0, coef: float = 1.0
    ) -> tuple[list[float], int]:
        """``base + coef·at`` for several lengths at one batch size (a decode window's: one token
        more per iteration), and their out-of-grid count. Inside grid segment ``j`` the log-log line
        is ``t = A_j·L^s_j``: one ``pow`` per length, and a bracket search only when a length leaves
        the segment of the previous one. Within a few ulps of ``at`` (exp of a sum vs a product)."""
        lrow, slopes, scale, oor_b, e_last = self._srow(batch)
        knots = self._knots
        lo, top = knots[0], knots[-1]
        at = self.at
        out: list[float] = []
        oor = 0
        left = right = 0.0  # current segment [left, right) in length; empty until the first search
        a = s = 0.0
        for length in lengths:
            if not lo < length < top:
                t, o = at(batch, length)  # edges, clamps and scaling beyond the grid
                out.append(base + coef * t)
                oor += o
                continue
            if not left <= length < right:
                j = bisect_right(knots, length) - 1
                left, right, s = knots[j], knots[j + 1], slopes[j]
                a = _exp(lrow[j] - s * self._lll[j])
            out.append(base + coef * (a * length**s * scale))
            oor += oor_b
        return out, (len(lengths) if oor_b else oor)

    def row(self, batch: float) -> tuple[np.ndarray, float, int]:
        """log-time along the length axis at ``batch`` (cached), batch scale factor, out-of-range count."""
        hit = self._rows.get(batch)
        if hit is not None:
            return hit
        b = max(float(batch), 1e-12)
        scale, oor = 1.0, int(self._outside)
        if b > self.batch[-1]:
            scale, oor, b = b / self.batch[-1], 1, self.batch[-1]
        elif b < self.batch[0]:
            oor, b = 1, self.batch[0]
        lb = math.log(b)
        i = int(np.clip(np.searchsorted(self._lb, lb) - 1, 0, len(self._lb) - 2))
        w = (lb - self._lb[i]) / (self._lb[i + 1] - self._lb[i])
        row = (1 - w) * self._lt[i] + w * self._lt[i + 1]
        out = (row, scale, oor)
        if len(self._rows) < 4096:
            self._rows[batch] = out
        return out

    def __call__(self, batch: float, length) -> tuple[np.ndarray, int]:
        """Seconds at one batch size and an array of lengths; second value counts out-of-grid points."""
        row, scale, oor_b = self.row(batch)
        length = np.maximum(np.asarray(length, dtype=np.float64), 1e-12)
        t = np.exp(np.interp(np.log(length), self._ll, row))
        above = length > self.length[-1] * (1 + 1e-9)
        below = length < self.length[0] * (1 - 1e-9)
        if above.any():
            t = np.where(above, math.exp(row[-1]) * length / self.length[-1], t)
        oor = int(above.sum() + below.sum())
        if oor_b:
            oor = int(length.size)
        return t * scale, oor

    def to_json(self) -> dict:
        return {
            "batch": _round_list(self.batch),
            "length": _round_list(self.length),
            "t_s": _round_list(self.t_s),
            **self.meta,
        }

    @classmethod
    def from_json(cls, d: dict) -> Grid2D:
        return cls(
            np.array(d["batch"]),
            np.array(d["length"]),
            np.array(d["t_s"]),
            {k: v for k, v in d.items() if k not in ("batch", "length", "t_s")},
        )


# --- the profile ----------------------------------------------------------------------------


#: Shapes at which fp8 and bf16 GEMMs both sit at their latency floor (Profile.fp8_gemm_excess_s).
_EXCESS_N = (1024, 2048, 4096, 8192)
_EXCESS_K = (1024, 2048)
_EXCESS_M = (1, 8, 32)


def gemm_key(n: int, k: int, dtype: str) -> str:
    return f"{int(n)}x{int(k)}:{dtype}"


def attention_key(heads: int, kv_heads: int, head_dim: int, kv_dtype: str) -> str:
    return f"{int(heads)}/{int(kv_heads)}/{int(head_dim)}:{kv_dtype}"


@dataclass
class Profile:
    """One device's calibrated curves and their provenance (see the module docstring).

    ``gemm``, ``context_attention`` and ``generation_attention`` hold curves baked at fixed
    shapes (device profiles timed by ``kvsim calibrate --device``). ``kernels`` holds fitted
    kernel families per backend (``{backend: {family: FamilyFit}}``, tables-built profiles):
    from them :meth:`gemm_curve` and :meth:`attention_grids` derive a curve for any shape on
    first use; ``kernel_defaults`` names the backend each family is taken from.
    """

    name: str
    device: dict
    provenance: dict
    memory: dict
    elementwise: dict
    layout: dict
    cpu_overhead: dict
    allreduce: dict[str, Curve1D]
    gemm: dict[str, Curve1D]
    context_attention: dict[str, Grid2D]
    generation_attention: dict[str, Grid2D]
    models: dict[str, dict]
    fit_quality: dict
    dtypes: dict
    kernels: dict[str, dict[str, FamilyFit]] = field(default_factory=dict)
    kernel_defaults: dict[str, str] = field(default_factory=dict)
    #: Serving engines' own all-reduce kernels (``{engine: {gpus: seconds vs message bytes}}``), used
    #: below an engine's custom all-reduce size limit instead of NCCL.
    custom_allreduce: dict[str, dict[str, Curve1D]] = field(default_factory=dict)
    #: Fitted fused mixture-of-experts kernels, ``{backend: {weight dtype: constants and scores}}``
    #: (:class:`sim.cost.moe.MoeKernelFit` plus ``kernel``, ``rows``, ``heldout_median``, ...).
    moe: dict[str, dict[str, dict]] = field(default_factory=dict)
    #: Fitted multi-head latent attention kernels, ``{backend: {"generation"|"context": {KV dtype: ...}}}``
    #: (:class:`sim.cost.mla.MlaKernelFit` plus ``rows``, ``heldout_median``, ...).
    mla: dict[str, dict[str, dict[str, dict]]] = field(default_factory=dict)
    #: Hex SHA-256 of the bytes this profile was parsed from (:func:`load_profile`); None for a profile
    #: built in memory (calibration) or from a JSON document.
    sha256: str | None = None
    #: The file it was parsed from, as read (:func:`load_profile`); None where ``sha256`` is.
    loaded_from: str | None = None

    def __post_init__(self) -> None:
        # Curves derived from ``kernels``, by (backend, key): shared by every cost model on this profile.
        self._derived: dict[tuple, object] = {}

    def to_json(self) -> dict:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "device": self.device,
            "provenance": _json_safe(self.provenance),
            "fit_quality": _json_safe(self.fit_quality),
            "dtypes": self.dtypes,
            "models": self.models,
            "memory": self.memory,
            "elementwise": self.elementwise,
            "layout": self.layout,
            "cpu_overhead": self.cpu_overhead,
            "allreduce": {k: v.to_json() for k, v in sorted(self.allreduce.items())},
            "gemm": {k: v.to_json() for k, v in sorted(self.gemm.items())},
            "context_attention": {k: v.to_json() for k, v in sorted(self.context_attention.items())},
            "generation_attention": {k: v.to_json() for k, v in sorted(self.generation_attention.items())},
        }
        if self.kernels:
            out["kernels"] = {
                b: {f: family_to_json(fit) for f, fit in sorted(fams.items())}
                for b, fams in sorted(self.kernels.items())
            }
            out["kernel_defaults"] = dict(sorted(self.kernel_defaults.items()))
        if self.moe:
            out["moe"] = {b: dict(sorted(d.items())) for b, d in sorted(self.moe.items())}
        if self.mla:
            out["mla"] = {
                b: {k: dict(sorted(d.items())) for k, d in sorted(ks.items())} for b, ks in sorted(self.mla.items())
            }
        if self.custom_allreduce:
            out["custom_allreduce"] = {
                e: {g: c.to_json() for g, c in sorted(cs.items(), key=lambda kv: int(kv[0]))}
                for e, cs in sorted(self.custom_allreduce.items())
            }
        return out

    def write(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        return path

    @classmethod
    def from_json(cls, doc: dict, source: str = "<dict>", checked: bool = False) -> Profile:
        """A profile from its JSON document, validated as a format first unless ``checked``."""
        if not checked:
            validate_profile(doc, source)  # the whole format, naming the JSON path of a bad value
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError(KEY, source, f'a JSON object with "format": "{FORMAT}"')
        if doc.get("version") not in READABLE_VERSIONS:
            raise ConfigError(
                KEY,
                source,
                f"profile format version {' or '.join(map(str, READABLE_VERSIONS))} "
                f"(file has version {doc.get('version')!r})",
            )
        try:
            return cls(
                name=str(doc["name"]),
                device=dict(doc["device"]),
                provenance=dict(doc["provenance"]),
                memory=dict(doc["memory"]),
                elementwise=dict(doc["elementwise"]),
                layout=dict(doc["layout"]),
                cpu_overhead=dict(doc["cpu_overhead"]),
                allreduce={str(k): Curve1D.from_json(v) for k, v in doc["allreduce"].items()},
                gemm={k: Curve1D.from_json(v) for k, v in doc["gemm"].items()},
                context_attention={k: Grid2D.from_json(v) for k, v in doc["context_attention"].items()},
                generation_attention={k: Grid2D.from_json(v) for k, v in doc["generation_attention"].items()},
                models=dict(doc.get("models", {})),
                fit_quality=dict(doc.get("fit_quality", {})),
                dtypes=dict(doc.get("dtypes", {})),
                kernels={
                    str(b): {str(f): family_from_json(fit) for f, fit in fams.items()}
                    for b, fams in doc.get("kernels", {}).items()
                },
                kernel_defaults={str(k): str(v) for k, v in doc.get("kernel_defaults", {}).items()},
                custom_allreduce={
                    str(e): {str(g): Curve1D.from_json(c) for g, c in cs.items()}
                    for e, cs in doc.get("custom_allreduce", {}).items()
                },
                moe={str(b): {str(d): dict(v) for d, v in ds.items()} for b, ds in doc.get("moe", {}).items()},
                mla={
                    str(b): {str(k): {str(d): dict(v) for d, v in ds.items()} for k, ds in ks.items()}
                    for b, ks in doc.get("mla", {}).items()
                },
            )
        except (KeyError, TypeError, ValueError, zlib.error, binascii.Error) as exc:
            raise ConfigError(
                KEY, source, f"a complete kvsim-profile v{VERSION} ({type(exc).__name__}: {exc})"
            ) from None

    # -- curves for any shape --
    def peaks(self) -> Peaks:
        d = self.device
        return Peaks(
            float(d["peak_bf16_flops"]),
            float(d.get("peak_fp8_flops") or 0.0),
            float(d["hbm_bandwidth"]),
            float(d.get("peak_fp4_flops") or 0.0),
        )

    def _family(self, family: str, backend: str | None) -> tuple[str, FamilyFit] | None:
        """The fitted ``family`` of ``backend`` (or of the profile's default backend for it)."""
        for b in ([backend] if backend else []) + [self.kernel_defaults.get(family, "")]:
            fams = self.kernels.get(b)
            if fams is not None and family in fams:
                return b, fams[family]
        return None

    def gemm_curve(self, key: str, backend: str | None = None) -> Curve1D | None:
        """The GEMM curve of ``key`` (``<n>x<k>:<table dtype>``): baked, else derived from the fitted
        family; ``None`` when neither exists."""
        if key in self.gemm and backend is None:
            return self.gemm[key]
        found = self._family("gemm", backend)
        if found is None:
            return self.gemm.get(key)
        b, fit = found
        hit = self._derived.get((b, "gemm", key))
        if hit is None:
            nk, dtype = key.split(":")
            n, k = (int(x) for x in nk.split("x"))
            table_dtype = self.dtypes.get("weight_tables", {}).get(dtype, dtype)
            if dtype == "fp8_block" and ("fp8_block",) not in fit.groups:
                # No block-scaled table for this backend (vLLM): its per-tensor fp8 kernels stand in. A
                # rough proxy at prefill sizes: TensorRT-LLM's block GEMMs cost 1.10-1.24x its per-tensor
                # ones at 1-4 k tokens (Qwen3-32B, one H100), SGLang's within ~7 %; decode sizes agree.
                table_dtype = self.dtypes.get("weight_tables", {}).get("fp8", "fp8")
            try:
                m, t, meta = gemm_curve(fit, table_dtype, n, k, self.peaks())
            except MissingGroup:
                # An engine's own tables without this dtype (the A100's vLLM and SGLang tables time bf16
                # only): the profile's default tables price it, as they price the families it lacks.
                default = self.kernel_defaults.get("gemm")
                return self.gemm_curve(key) if backend is not None and b != default else None
            hit = self._derived[(b, "gemm", key)] = Curve1D(m, t, {**meta, "backend": b})
        return hit  # type: ignore[return-value]

    def moe_fit(self, backend: str | None, dtype: str) -> tuple[str, str, MoeKernelFit] | None:
        """(backend, dtype, constants) of the fused MoE kernel pricing ``dtype`` weights: ``backend``'s own
        fit, else the profile default backend's; per-tensor and block fp8 stand in for each other where
        a backend timed one of them only, and 4-bit integer experts (``w4a16``, which no table times)
        are priced on the MXFP4 kernel, the 4-bit-weight one each engine timed, weight-only as int4
        runs (except TensorRT-LLM's on the B200: MXFP8 activations, faster at prefill sizes).
        ``None``: no fit (the profile has no MoE tables)."""
        twins = {
            "fp8": ("fp8", "fp8_block"),
            "fp8_block": ("fp8_block", "fp8"),
            "fp16": ("bf16",),
            "w4a16": ("w4a16", "mxfp4"),
        }
        for b in ([backend] if backend else []) + [self.kernel_defaults.get("moe", "")]:
            fits = self.moe.get(b) or {}
            for d in twins.get(dtype, (dtype,)):
                if d in fits:
                    return b, d, MoeKernelFit.from_json(fits[d])
        return None

    def mla_fit(self, backend: str | None, kind: str, kv_dtype: str) -> tuple[str, str, MlaKernelFit] | None:
        """(backend, KV dtype, constants) of the MLA ``kind`` (``generation``/``context``) kernel over a
        ``kv_dtype`` cache: ``backend``'s own fit, else the profile default backend's; ``None``: none."""
        kd = "bf16" if kv_dtype == "fp16" else kv_dtype
        for b in ([backend] if backend else []) + [self.kernel_defaults.get("mla", "")]:
            fits = (self.mla.get(b) or {}).get(kind) or {}
            if kd in fits:
                return b, kd, MlaKernelFit.from_json(fits[kd])
        return None

    def fp8_gemm_excess_s(self, backend: str | None, dtype: str = "fp8") -> float:
        """Seconds an fp8 (``dtype``; or nvfp4) GEMM of ``backend``'s tables takes beyond the bf16 GEMM
        of the same shape where both sit at their latency floor (at most 8192 × 2048 weights, m ≤ 32):
        the median over those shapes, at least 0.

        There a GEMM reading half the weight bytes can be no slower, so the excess is work the
        timed fp8 layer does besides its GEMM: quantizing its bf16 input in a kernel of its own
        (TensorRT-LLM's tables: 7–10 µs; vLLM's and SGLang's: under 1 µs)."""
        hit = self._derived.get((backend, "fp8_excess", dtype))
        if hit is None:
            diffs = []
            for n in _EXCESS_N:
                for k in _EXCESS_K:
                    lo = self.gemm_curve(gemm_key(n, k, dtype), backend)
                    hi = self.gemm_curve(gemm_key(n, k, "bf16"), backend)
                    if lo is None or hi is None:
                        continue
                    diffs += [lo.at(m)[0] - hi.at(m)[0] for m in _EXCESS_M]
            hit = self._derived[(backend, "fp8_excess", dtype)] = max(float(np.median(diffs)), 0.0) if diffs else 0.0
        return float(hit)  # type: ignore[arg-type]

    def attention_grids(
        self, key: str, backends: tuple[str | None, str | None] = (None, None)
    ) -> tuple[Grid2D | None, Grid2D | None]:
        """(context, generation) grids of attention ``key`` (``<heads>/<kv_heads>/<head_dim>:<kv dtype>``
        per GPU): baked, else derived from the fitted families (the table groups of the KV dtype in
        ``dtypes.kv_tables``) at the measured head_dim nearest the model's (flagged
        ``outside_measured`` when it is not the model's)."""
        shape, kd = key.split(":")
        h, kvh, d = (int(x) for x in shape.split("/"))
        groups = self.dtypes.get("kv_tables", {}).get(kd)
        ctx_group, gen_group = (tuple(groups[0]), tuple(groups[1])) if groups else ((), ())
        out: list[Grid2D | None] = []
        for family, kind, baked, group, backend in (
            ("context_attention", "context", self.context_attention, tuple(ctx_group), backends[0]),
            ("generation_attention", "generation", self.generation_attention, tuple(gen_group), backends[1]),
        ):
            if key in baked and backend is None:
                out.append(baked[key])
                continue
            found = self._family(family, backend)
            if found is None:
                out.append(baked.get(key))
                continue
            b, fit = found
            hit = self._derived.get((b, family, key, group))
            if hit is None:
                grp = _nearest_head_dim_group(fit, group[:-1], d) if group else None
                if grp is None:
                    # An engine's own table without this KV dtype (SGLang's Hopper prefill kernels time
                    # an fp8 cache with fp8 compute only, where the profile prices bf16 compute over
                    # it): the profile's default table prices it, as it prices families the engine lacks.
                    default = self.kernel_defaults.get(family)
                    fallback = backend is not None and b != default
                    out.append(self.attention_grids(key)[0 if kind == "context" else 1] if fallback else None)
                    continue
                bs, ls, t, meta = attention_grid(fit, kind, grp, h, kvh, d, self.peaks())
                if grp[-1] != d:
                    meta["outside_measured"] = "; ".join(
                        filter(
                            None, [meta.get("outside_measured"), f"head_dim {d} priced on the head_dim {grp[-1]} fit"]
                        )
                    )
                hit = self._derived[(b, family, key, group)] = Grid2D(bs, ls, t, {**meta, "backend": b})
            out.append(hit)  # type: ignore[arg-type]
        return out[0], out[1]

    def curve_keys(self, family: str) -> list[str]:
        """Keys of ``family`` this profile can show: its baked curves, and for fitted families the shapes
        of the catalog models it lists (every dtype it offers)."""
        if family == "allreduce":
            return sorted(self.allreduce, key=int)
        keys = set(getattr(self, family))
        if self._family(family, None) is not None:
            for m in self.models.values():
                if family == "gemm":
                    keys.update(
                        f"{shape}:{d}"
                        for shape in m.get("gemm_shapes", {}).values()
                        for d in self.dtypes.get("weight", [])
                    )
                elif m.get("attention_shape"):
                    keys.update(f"{m['attention_shape']}:{d}" for d in self.dtypes.get("kv", []))
        return sorted(keys)

    def curve(self, family: str, key: str):
        """The curve (or grid) of ``family`` at ``key``: baked or derived; ``None`` when unavailable."""
        if family == "gemm":
            return self.gemm_curve(key)
        if family == "allreduce":
            return self.allreduce.get(key)
        ctx, gen = self.attention_grids(key)
        return ctx if family == "context_attention" else gen


def _json_safe(node):
    """``node`` with non-finite floats as ``null`` (a statistic of nothing; profiles hold no NaN)."""
    if isinstance(node, float):
        return node if math.isfinite(node) else None
    if isinstance(node, dict):
        return {k: _json_safe(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_json_safe(v) for v in node]
    return node


def _nearest_head_dim_group(fit: FamilyFit, prefix: tuple, head_dim: int) -> tuple | None:
    """The group ``prefix + (head_dim,)``, else the one with the nearest head_dim (log distance)."""
    cands = [g for g in fit.groups if tuple(g[:-1]) == tuple(prefix)]
    if not cands:
        return None
    return min(cands, key=lambda g: (abs(math.log(g[-1] / head_dim)), g[-1]))


#: SHA-256 of the profile files' bytes already validated in this process.
_VALIDATED: set[str] = set()


def list_profiles() -> list[str]:
    """Names of the built-in profiles shipped in ``sim/profiles/``."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A built-in profile by name (``h100-sxm``) or a profile JSON file by path."""
    ref = str(name_or_path)
    path = Path(ref)
    if not is_file(path):
        builtin = PROFILE_DIR / f"{ref}.json"
        if re.fullmatch(r"[A-Za-z0-9_.+-]+", ref) and is_file(builtin):
            path = builtin
        else:
            if ref and os.path.lexists(ref):
                read_text(path, KEY, "profile JSON file")  # names what the path is (a directory, a FIFO)
            raise ConfigError(
                KEY, ref, f"a built-in profile ({', '.join(list_profiles()) or 'none'}) or a profile JSON file"
            )
    # Read once: the bytes parsed are the bytes hashed (``summary.json``'s ``cost_model_profile``).
    data = read_bytes(path, KEY, "profile JSON file")
    doc = load_json(decode(data, str(path), KEY, "profile JSON file"), KEY, str(path))
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _VALIDATED:  # once per file content per process (a plan loads it per simulation)
        validate_profile(doc, str(path))  # before from_json, whose compiled signature wants a dict
        _VALIDATED.add(digest)
    profile = Profile.from_json(doc, str(path), checked=True)
    profile.sha256 = digest
    profile.loaded_from = str(path)
    return profile


@dataclass(frozen=True)
class ProfileProvenance:
    """Which profile file priced a cost model, from the bytes the model's profile was parsed from
    (the fields of ``summary.json``'s ``cost_model_profile`` block that the file says)."""

    #: ``builtin`` (a profile shipped in ``sim/profiles/``, named by name) or ``file`` (named by path).
    kind: str
    #: The file's path as given (``cost_model.profile``); None for a built-in profile.
    path: str | None
    #: The profile's ``name``, ``device.name`` (else ``provenance.device``) and its provenance
    #: ``date``, ``method`` and ``source``, as the file holds them (a hand-written file may hold anything).
    name: str
    device: Any
    date: Any
    method: Any
    source: Any
    #: Hex SHA-256 of the exact bytes parsed.
    sha256: str


def profile_provenance_of(
    profile: Profile, kind: str | None = None, given: str | None = None
) -> ProfileProvenance | None:
    """The :class:`ProfileProvenance` of a profile loaded from a file (None for one built in memory).
    ``kind`` and ``given``: how the run named it (``builtin``, or ``file`` and the path as given);
    by default a file in ``sim/profiles/`` is ``builtin`` and any other ``file`` at the path it was read from."""
    if profile.sha256 is None:
        return None
    loaded = profile.loaded_from
    if kind is None:
        inside = loaded is not None and Path(loaded).resolve().parent == PROFILE_DIR.resolve()
        kind = "builtin" if inside else "file"
    prov = profile.provenance
    device = profile.device.get("name")
    return ProfileProvenance(
        kind=kind,
        path=None if kind == "builtin" else (given if given is not None else loaded),
        name=profile.name,
        device=device if device is not None else prov.get("device"),
        date=prov.get("date"),
        method=prov.get("method"),
        source=prov.get("source"),
        sha256=profile.sha256,
    )


# --- the cost model -------------------------------------------------------------------------


def _profile_path(ref: str) -> tuple[Path, str]:
    """The profile file ``ref`` names and how (``file``: a path; ``builtin``: a built-in's name)."""
    path = Path(str(ref))
    if path.is_file():
        return path, "file"
    builtin = PROFILE_DIR / f"{ref}.json"
    if builtin.is_file():
        return builtin, "builtin"
    raise ConfigError(
        KEY, str(ref), f"a built-in profile ({', '.join(list_profiles()) or 'none'}) or a profile JSON file"
    )


_SHARED: dict[tuple, Profile] = {}


def _shared_profile(path: Path) -> Profile:
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    hit = _SHARED.get(key)
    if hit is None:
        if len(_SHARED) >= 8:
            _SHARED.clear()
        hit = _SHARED[key] = load_profile(path)
    return hit
