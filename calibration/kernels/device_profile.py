"""Measurements fitted into an ordinary :class:`sim.cost.profile.Profile`.

The timings become :class:`calibration.tables.GemmTable` / ``AttentionTable`` rows and go through
:mod:`calibration.fit` (parametric form + grid correction, 80/20 held-out score); memory,
elementwise and CPU-step terms are line fits. :func:`with_static_decode` swaps in the reference
engine's static-cache kernels for its static layout.
"""

from __future__ import annotations

import datetime as _dt
import platform
from typing import Any

import numpy as np

from sim.catalog import ModelSpec
from sim.cost.profile import Curve1D, Grid2D, Profile
from sim.cost.profile_model import per_gpu_heads, shape_keys

from .. import attention_backends as AB, fit as F
from ..tables import AttentionTable, GemmTable
from .measure import Measurements
from .plan import REFERENCE_BLOCK_SIZE, STATIC_PREFILL, Plan

#: Memory-bound per-layer kernels charged as elementwise (same count as the tables route).
ELEMENTWISE_KERNELS = 5
METHOD = "torch kernel timing"


def _gemm_table(meas: Measurements, dtype: str, version: str) -> GemmTable:
    rows = meas.select("gemm")
    m, n, k = (np.array([r[c] for r in rows], dtype=np.int64) for c in "mnk")
    return GemmTable(
        np.array([dtype] * len(rows)), m, n, k, np.array([r["median_s"] for r in rows]), "device", "torch", version
    )


def _attention_table(meas: Measurements, kind: str, dtype: str, version: str, **eq) -> AttentionTable:
    fam = "context_attention" if kind == "context" else "generation_attention"
    rows = meas.select(fam, **eq)
    if kind == "context" and "kernel" not in eq:  # the backend's prefill; the static layout's has its own curve
        rows = [r for r in rows if r["kernel"] != STATIC_PREFILL]
    col = lambda c: np.array([r[c] for r in rows], dtype=np.int64)  # noqa: E731
    return AttentionTable(
        kind,
        col("batch"),
        col("length"),
        col("heads"),
        col("kv_heads"),
        col("head_dim"),
        np.array([dtype] * len(rows)),
        np.array([dtype] * len(rows)),
        np.array([r["median_s"] for r in rows]),
        "device",
        "torch",
        version,
    )


def _linear_fit(x: np.ndarray, t: np.ndarray) -> tuple[float, float, dict]:
    """``t ≈ a + b·x`` minimising relative error; a, b ≥ 0."""
    A = np.column_stack([np.ones_like(x), x]) / t[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    a, b = float(coef[0]), float(coef[1])
    if a < 0 or b < 0:  # fall back to the non-negative one-term fit
        a = max(a, 0.0)
        b = max(float(np.median((t - a) / x)), 0.0)
    return a, b, F.error_summary(a + b * x, t)


def elementwise_fit(rows: list[dict]) -> dict:
    """The elementwise kernel's latency (s) and bandwidth (bytes/s) from its timed sizes."""
    x = np.array([r["nbytes"] for r in rows], dtype=float)
    t = np.array([r["median_s"] for r in rows])
    lat, inv_bw, q = _linear_fit(x, t)
    # Times flat in the bytes (launch-bound sizes on a loaded host) leave no slope: the fastest
    # bytes per second observed is then the bandwidth, a lower bound on it.
    bandwidth = 1.0 / inv_bw if inv_bw > 0 else float(np.max(x / t))
    return {
        "kernels_per_layer": ELEMENTWISE_KERNELS,
        "latency_s": lat,
        "bandwidth_bytes_per_s": bandwidth,
        "fit_median_rel_err": round(q["median_rel_err"], 4),
        "source": "measured: x.add_(y) over tokens x hidden activations, t = latency + bytes/bandwidth",
    }


def memory_fit(meas: Measurements, kinds: tuple[str, ...]) -> dict:
    """Latency (s) and bandwidth (bytes/s) fitted over the memory operations ``kinds``' timed sizes."""
    rows = [r for k in kinds for r in meas.select("memory", kernel=k)]
    x = np.array([r["nbytes"] for r in rows], dtype=float)
    t = np.array([r["median_s"] for r in rows])
    lat, inv_bw, q = _linear_fit(x, t)
    return {
        "latency_s": lat,
        "bandwidth_bytes_per_s": 1.0 / inv_bw if inv_bw > 0 else float("inf"),
        "fit_median_rel_err": round(q["median_rel_err"], 4),
        "fit_p95_rel_err": round(q["p95_rel_err"], 4),
        "n": q["n"],
    }


def hbm_bandwidth(meas: Measurements, copy: dict, cache_bytes: int) -> tuple[float, str]:
    """The device memory's bandwidth (bytes read + written per second) and how it was read. Copies that
    fit in the last-level cache time the cache: on an H200 (60 MB L2) copies of up to 16 MB fitted a
    line of 9.1 TB/s, about twice HBM's. So the copies of at least twice ``cache_bytes`` give it,
    their fitted launch latency taken off, where such a copy was timed; else the fit over every size,
    said to be an upper bound."""
    big = [r for r in meas.select("memory", kernel="copy") if cache_bytes and r["nbytes"] >= 2 * cache_bytes]
    if big:
        lat = min(copy["latency_s"], min(r["median_s"] for r in big) / 2)
        bw = max(2.0 * r["nbytes"] / (r["median_s"] - lat) for r in big)
        return bw, f"copies of >= 2x the {cache_bytes / 2**20:.0f} MiB L2 cache ({len(big)} sizes), read + write"
    why = f"no copy reached 2x the {cache_bytes / 2**20:.0f} MiB L2 cache" if cache_bytes else "cache size unknown"
    return 2.0 * copy["bandwidth_bytes_per_s"], f"copy fit over every size, read + write ({why}: may be the cache's)"


def _peaks(meas: Measurements, elem: float) -> tuple[float, float]:
    """Generous upper bounds for the fit's rates: 4× the best observed FLOP/s and bytes/s."""
    flops, bw = [1.0], [1.0]
    for r in meas.select("gemm"):
        flops.append(2.0 * r["m"] * r["n"] * r["k"] / r["median_s"])
        bw.append((r["m"] * r["k"] + r["n"] * r["k"] + r["m"] * r["n"]) * elem / r["median_s"])
    for r in meas.select("memory", kernel="copy"):
        bw.append(2.0 * r["nbytes"] / r["median_s"])
    for fam in ("context_attention", "generation_attention"):
        for r in meas.select(fam):
            bw.append(2.0 * r["batch"] * r["length"] * r["kv_heads"] * r["head_dim"] * elem / r["median_s"])
    return 4.0 * max(flops), 4.0 * max(bw)


def _heldout(kind: str, table, peak_fn, peak_bw: float, seed: int = 0) -> dict:
    test = F.holdout_mask(len(table), 0.2, seed)
    if test.sum() == 0 or (~test).sum() < 4:
        return {"median_rel_err": float("nan"), "p95_rel_err": float("nan"), "n": 0}
    return {
        k: (round(v, 5) if isinstance(v, float) else v)
        for k, v in F.heldout_evaluation(kind, table, peak_fn, peak_bw, test).items()
    }


def build_device_profile(
    meas: Measurements,
    model: ModelSpec,
    device_info: dict,
    plan: Plan,
    *,
    name: str | None,
    dtype: str,
    elapsed_s: float,
    seed: int = 0,
    key_dtype: str | None = None,
) -> tuple[Profile, dict]:
    """Fit the measurements into a Profile; also return the fits (for the report).

    ``key_dtype``: the dtype name the profile's curves are filed under (default ``dtype``).
    The simulator's dtype vocabulary has no fp32, so an fp32-timed profile for the fp32
    reference engine is filed under ``bf16`` and says so in ``provenance.compute_dtype``.
    """
    version = device_info["torch"]
    attn = device_info.get("attention") or {"name": "sdpa", "version": version, **AB.SdpaBackend.routes}
    device_info = {k: v for k, v in device_info.items() if k != "attention"}
    attn_version = f"{attn['name']} {attn['version']}"
    elem = F.elem_bytes(dtype)
    peak_flops, peak_bw = _peaks(meas, elem)
    peak_fn = lambda _dt: peak_flops  # noqa: E731
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    gt = _gemm_table(meas, dtype, version)
    ct = _attention_table(meas, "context", dtype, attn_version)
    pt = _attention_table(
        meas, "generation", dtype, attn_version, kernel="decode_paged", block_size=REFERENCE_BLOCK_SIZE
    )
    cont = _attention_table(meas, "generation", dtype, attn_version, kernel="decode_contiguous")
    fits = {
        "gemm": F.fit_gemm(gt, peak_fn, peak_bw),
        "context_attention": F.fit_context(ct, peak_fn, peak_bw),
        "generation_attention": F.fit_generation(pt, peak_fn, peak_bw),
        "generation_contiguous": F.fit_generation(cont, peak_fn, peak_bw),
    }
    quality: dict[str, Any] = {}
    for kind, table in (("gemm", gt), ("context_attention", ct), ("generation_attention", pt)):
        quality[kind] = {"overall": _heldout(kind, table, peak_fn, peak_bw, seed), "groups": {}}
    quality["method"] = (
        f"random 20% of measured points held out (numpy seed {seed}), fit on the other 80%, "
        "relative error |pred-meas|/meas; measured value = median of repeats"
    )

    kd = key_dtype or dtype
    keys = shape_keys(model, 1, kd, kd)
    gemm = {}
    for proj, key in keys.gemms().items():
        n, k = (int(x) for x in key.split(":")[0].split("x"))
        m = np.array(sorted({r["m"] for r in meas.select("gemm", kernel=proj)}), dtype=float)
        t = F.predict_gemm(fits["gemm"], dtype, m, np.full_like(m, n), np.full_like(m, k))
        gemm[key] = Curve1D(m, t, {"table_dtype": dtype, "measured_shape": True, "projection": proj})

    def grid(fam_fit, table, predict, meta):
        return _fitted_grid(fam_fit, table, predict, meta, dtype, d, h, kvh)

    akey = keys.attention
    ctx = {
        akey: grid(
            fits["context_attention"],
            ct,
            F.predict_context,
            {
                "group": f"{dtype}/{dtype}/{d}",
                "measured_shape": True,
                "backend": attn_version,
                "kernel": attn.get("prefill", ""),
            },
        )
    }
    gen = {
        akey: grid(
            fits["generation_attention"],
            pt,
            F.predict_generation,
            {
                "group": f"{dtype}/{d}",
                "measured_shape": True,
                "length_is": "KV tokens per sequence",
                "backend": attn_version,
                "kernel": f"paged, block {REFERENCE_BLOCK_SIZE}: {attn.get('decode_paged', '')}",
            },
        )
    }
    # Paged overhead: measured paged / contiguous at the same (batch, length).
    contig = {
        (r["batch"], r["length"]): r["median_s"]
        for r in meas.select("generation_attention", kernel="decode_contiguous")
    }
    # Block-size dependence, every block size on the same sub-grid cells.
    sub = {
        (r["batch"], r["length"])
        for r in meas.select("generation_attention", kernel="decode_paged")
        if r["block_size"] != REFERENCE_BLOCK_SIZE
    }
    by_bs = {}
    for bs in sorted({REFERENCE_BLOCK_SIZE, *plan.block_sizes}):
        ratios = [
            r["median_s"] / contig[(r["batch"], r["length"])]
            for r in meas.select("generation_attention", kernel="decode_paged", block_size=bs)
            if (r["batch"], r["length"]) in contig and (r["batch"], r["length"]) in sub
        ]
        if ratios:
            by_bs[str(bs)] = round(float(np.median(ratios)) - 1.0, 4)
    ref_ratios = [
        r["median_s"] / contig[(r["batch"], r["length"])]
        for r in meas.select("generation_attention", kernel="decode_paged", block_size=REFERENCE_BLOCK_SIZE)
        if (r["batch"], r["length"]) in contig
    ]
    paged_overhead = float(np.median(ref_ratios)) - 1.0
    layout = {
        "measured_paged": True,
        "measured_block_size": REFERENCE_BLOCK_SIZE,
        "paged_overhead": round(max(paged_overhead, -0.5), 4),
        "paged_overhead_source": "measured: median over the decode grid of paged / contiguous time - 1",
        "paged_overhead_spread": [round(float(np.percentile(ref_ratios, q)) - 1.0, 4) for q in (10, 90)],
        "paged_overhead_by_block_size": by_bs,
        "contiguous_model": "decode attention time / (1 + paged_overhead)",
        "block_size_dependence": "decode attention time x (1 + overhead(block size)) / (1 + paged_overhead), "
        "overhead interpolated in log block size, clamped at the measured ends",
        "measured_kernel": f"{attn_version}: {attn.get('decode_paged', '')}",
        "contiguous_kernel": f"{attn_version}: {attn.get('decode_contiguous', '')}",
    }
    if attn.get("skipped_block_sizes"):
        layout["skipped_block_sizes"] = attn["skipped_block_sizes"]

    zero, copy = memory_fit(meas, ("zero_fill",)), memory_fit(meas, ("copy",))
    pinned = bool(meas.select("memory", kernel="host_h2d"))  # host transfers timed with pinned memory (CUDA)
    host = memory_fit(meas, ("host_h2d", "host_d2h")) if pinned else dict(copy)
    alloc = meas.select("alloc")[0]["median_s"]

    def size_curve(kinds):
        by = {}
        for k in kinds:
            for r in meas.select("memory", kernel=k):
                by.setdefault(r["nbytes"], []).append(r["median_s"])
        x = np.array(sorted(by), dtype=float)
        t = np.maximum.accumulate(np.array([float(np.mean(by[v])) for v in sorted(by)]))  # more bytes never faster
        return Curve1D(x, t, {"x_is": "bytes", "kernels": list(kinds)}).to_json()

    curves = {
        "zero_fill": size_curve(("zero_fill",)),
        "copy": size_curve(("copy",)),
        "host_transfer": size_curve(("host_h2d", "host_d2h") if pinned else ("copy",)),
    }
    memory = {
        "latency_s": zero["latency_s"],
        "bandwidth_bytes_per_s": zero["bandwidth_bytes_per_s"],
        "zero_latency_s": zero["latency_s"],
        "zero_bandwidth_bytes_per_s": zero["bandwidth_bytes_per_s"],
        "copy_latency_s": copy["latency_s"],
        "copy_bandwidth_bytes_per_s": copy["bandwidth_bytes_per_s"],
        "host_latency_s": host["latency_s"],
        "host_bandwidth_bytes_per_s": host["bandwidth_bytes_per_s"],
        "alloc_event_s": alloc,
        "curves": curves,
        "fits": {"zero_fill": zero, "copy": copy, "host_transfer": host},
        "source": "measured: tensor.zero_() and dst.copy_(src) over a size grid; the cost model reads the "
        "curves (seconds vs bytes, log-log, non-decreasing; caches make one latency + bandwidth line "
        "inaccurate), the latency/bandwidth fits are summaries (copy bandwidth = bytes copied per second); "
        + (
            "host transfer: pinned host <-> device copy_, both directions"
            if pinned
            else "host transfer on CPU = memcpy between two host buffers (the copy measurement)"
        )
        + "; alloc_event_s: pop from a free list + extend a block-table row + write it into the "
        "block-table tensor, per block",
    }
    elementwise = elementwise_fit(meas.select("elementwise"))
    ov_rows = meas.select("cpu_overhead")
    xb = np.array([r["batch"] for r in ov_rows], dtype=float)
    a, b, q = _linear_fit(xb, np.array([r["median_s"] for r in ov_rows]))
    cpu_overhead = {
        "by_tp": {
            "1": {
                "intercept_s": a,
                "per_seq_s": b,
                "batch_range": [int(xb.min()), int(xb.max())],
                "fit_median_rel_err": round(q["median_rel_err"], 4),
                "fit_p95_rel_err": round(q["p95_rel_err"], 4),
            }
        },
        "parts": [
            "schedule (block growth)",
            "prepare inputs (ids, positions, slot mapping, block tables to device)",
            "argmax sampler over vocab-sized logits",
            "output processing",
        ],
        "source": "measured: a Python loop of a vLLM-like decode step (Bench.step_cpu), not a real engine",
        "note": "host-side work per step, not overlapped with device work",
    }

    dev_name = device_info.get("name", device_info["kind"])
    params = {
        fam: {
            "/".join(map(str, k)): {a_: float(f"{v:.5g}") for a_, v in rf.as_dict().items()}
            for k, (rf, _) in fits[fam].groups.items()
        }
        for fam in ("gemm", "context_attention", "generation_attention")
    }
    counts: dict[str, int] = {}
    for r in meas.rows:
        counts[r["family"]] = counts.get(r["family"], 0) + 1
    provenance = {
        "device": dev_name,
        "system": device_info["kind"],
        "backend": f"torch {version} (eager GEMMs and memory ops); attention: {attn_version}",
        "backend_versions": {
            "gemm": version,
            "context_attention": attn_version,
            "generation_attention": attn_version,
            "nccl": None,
        },
        "attention_backend": attn,
        "source": "kernels timed on this machine by kvsim calibrate --device",
        "source_tables": [],
        "date": _dt.date.today().isoformat(),
        "method": METHOD,
        "method_detail": "warm-up calls, then median over repeats of the mean per-call time of a timed loop "
        + (
            "bracketed by CUDA events and synchronised"
            if device_info["kind"] == "cuda"
            else f"(time.perf_counter, torch.set_num_threads({device_info.get('threads')}))"
        )
        + "; inputs cycled over distinct buffers to defeat cache reuse; fits as in the tables route "
        "(calibration.fit: parametric smooth roofline x grid correction)",
        "device_info": device_info,
        "plan": plan.to_json(),
        "measured_points": counts,
        "elapsed_s": round(elapsed_s, 1),
        "parametric_fits": params,
        "clamped_points": {},
        "library_versions": {**_lib_versions(), "torch": version},
        "notes": [
            "TP 1 only (no all-reduce measured)",
            f"the profile's decode curve is the paged kernel ({attn['name']}) at block 16; contiguous = / (1 + "
            "paged_overhead)",
        ],
    }
    hbm_bw, hbm_src = hbm_bandwidth(meas, copy, int(device_info.get("l2_cache_bytes") or 0))
    device = {
        "name": dev_name,
        "system": device_info["kind"],
        "hbm_bandwidth": hbm_bw,
        "hbm_bandwidth_source": hbm_src,
        "peak_bf16_flops": peak_flops / 4.0,
        "peak_fp8_flops": 0.0,
        "memory_bytes": device_info.get("memory_bytes", 0),
        "pcie_bandwidth": host["bandwidth_bytes_per_s"],
        "nvlink_bandwidth": 0.0,
        "note": "bandwidth and FLOP/s are the best observed, not datasheet peaks",
    }
    entry = {
        "tensor_parallel": 1,
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "kv_heads": model.kv_heads,
        "head_dim": model.head_dim,
        "intermediate": model.intermediate,
        "vocab": model.vocab,
        "gemm_shapes": {p: k.split(":")[0] for p, k in keys.gemms().items()},
        "attention_shape": akey.split(":")[0],
    }
    profile = Profile(
        name=name or f"{device_info['kind']}-{model.name}",
        device=device,
        provenance=provenance,
        memory=memory,
        elementwise=elementwise,
        layout=layout,
        cpu_overhead=cpu_overhead,
        allreduce={},
        gemm=gemm,
        context_attention=ctx,
        generation_attention=gen,
        models={f"{model.name}@tp1": entry},
        fit_quality=quality,
        dtypes={
            "weight": [kd],
            "kv": [kd],
            "weight_tables": {kd: dtype},
            "kv_tables": {kd: [[dtype, dtype, d], [dtype, d]]},
        },
    )
    profile.provenance["compute_dtype"] = dtype
    if kd != dtype:
        profile.provenance["notes"].append(
            f"kernels timed in {dtype}; curves filed under {kd} (the simulator's dtype "
            f"names have no {dtype}); KV bytes in the simulator stay {kd}-sized"
        )
    return profile, fits


def _lib_versions() -> dict:
    import pyarrow
    import scipy

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pyarrow": pyarrow.__version__,
    }


def _fitted_grid(fam_fit, table, predict, meta: dict, dtype: str, d: int, h: int, kvh: int) -> Grid2D:
    """A fitted attention family on the (batch, length) grid of the table's measured coordinates."""
    b = np.unique(table.batch).astype(float)
    s = np.unique(table.length).astype(float)
    bb, ss = np.meshgrid(b, s, indexing="ij")
    t = (
        predict(fam_fit, dtype, dtype, d, bb.ravel(), ss.ravel(), h, kvh)
        if predict is F.predict_context
        else predict(fam_fit, dtype, d, bb.ravel(), ss.ravel(), h, kvh)
    )
    measured = {(int(x), int(y)) for x, y in zip(table.batch, table.length)}
    return Grid2D(b, s, t.reshape(bb.shape), {**meta, "measured_cells": len(measured), "cells": int(bb.size)})


def with_static_decode(profile: Profile, meas: Measurements, model: ModelSpec) -> Profile:
    """``profile`` for the reference engine's *static* cache: its decode-attention grid is the
    measured ``decode_static`` kernel (one masked SDPA per sequence over its contiguous
    reservation, as ``Engine.execute`` runs it), and ``layout.paged_overhead`` 0, so the cost model's
    contiguous layout reads that grid as is (instead of the paged grid ÷ (1 + a median overhead),
    whose ratio to the static kernel varies with batch and length). Where the attention backend is not
    SDPA, the static layout's prefill (SDPA, :data:`STATIC_PREFILL` rows) replaces the context grid too:
    the static engine runs SDPA for both. Unchanged without those rows."""
    import copy

    rows = meas.select("generation_attention", kernel="decode_static")
    if not rows:
        return profile
    b = np.array(sorted({r["batch"] for r in rows}), dtype=float)
    L = np.array(sorted({r["length"] for r in rows}), dtype=float)
    by = {(r["batch"], r["length"]): r["median_s"] for r in rows}
    if len(by) != b.size * L.size:
        return profile
    t = np.array([[by[(int(x), int(y))] for y in L] for x in b])
    # more KV per sequence, or more sequences, is never faster (timing noise otherwise bends the grid)
    t = np.maximum.accumulate(np.maximum.accumulate(t, axis=0), axis=1)
    p = copy.deepcopy(profile)
    key = shape_keys(model, 1, p.dtypes["weight"][0], p.dtypes["weight"][0]).attention
    old = p.generation_attention[key]
    p.generation_attention = {
        **p.generation_attention,
        key: Grid2D(
            b,
            L,
            t,
            {
                **old.meta,
                "kernel": "static: one masked SDPA per sequence over "
                "its contiguous reservation (calibration.engine), measured medians",
                "measured_cells": int(b.size * L.size),
                "cells": int(b.size * L.size),
                "replaces": "paged grid / (1 + paged_overhead)",
            },
        ),
    }
    p.layout = {
        **p.layout,
        "paged_overhead": 0.0,
        "paged_overhead_by_block_size": {},
        "kernel_route_paged_overhead": p.layout.get("paged_overhead"),
        "contiguous_model": "the generation grid is the static-cache kernel itself (decode_static)",
    }
    if meas.select("context_attention", kernel=STATIC_PREFILL):
        dtype = p.provenance.get("compute_dtype", p.dtypes["weight"][0])
        h, kvh = per_gpu_heads(model, 1)
        ct = _attention_table(
            meas, "context", dtype, f"sdpa {p.provenance['device_info']['torch']}", kernel=STATIC_PREFILL
        )
        peak_flops, peak_bw = _peaks(meas, F.elem_bytes(dtype))
        fit = F.fit_context(ct, lambda _dt: peak_flops, peak_bw)
        old_ctx = p.context_attention[key]
        p.context_attention = {
            **p.context_attention,
            key: _fitted_grid(
                fit,
                ct,
                F.predict_context,
                {
                    **old_ctx.meta,
                    "backend": "sdpa",
                    "kernel": AB.SdpaBackend.routes["prefill"],
                    "replaces": f"the {old_ctx.meta.get('backend', '')} prefill grid",
                },
                dtype,
                model.head_dim,
                h,
                kvh,
            ),
        }
    return p
