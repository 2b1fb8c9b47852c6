"""Turn published kernel tables into a :class:`sim.cost.profile.Profile` for chosen model shapes.

Steps: fit every kernel family (:mod:`calibration.fit`), score each fit on a held-out
20 % of its rows (fixed seed) for ``fit_quality``, then evaluate the fitted curves on
the measured grid of each family at exactly the kernel shapes the requested models
need (per-GPU shapes under tensor parallelism), clamp them to the physical floor
(time ≥ FLOPs / peak FLOP/s and ≥ bytes / peak bandwidth), and add all-reduce, CPU
overhead and memory-operation figures.
"""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.catalog import MODELS, ModelSpec
from sim.cost.profile import Curve1D, Grid2D, Profile
from sim.cost.profile_model import shape_keys
from sim.errors import ConfigError

from . import fit as F
from .mla_fit import fit_mla_table
from .moe_fit import fit_moe_table
from .tables import (
    CPU_OVERHEAD_PARTS,
    KernelTables,
    allreduce_envelope,
    find_table,
    read_attention,
    read_cpu_overheads,
    read_custom_allreduce,
    read_gemm,
)

#: aiconfigurator system name → kvsim catalog GPU and built-in profile name.
SYSTEM_GPU = {
    "h100_sxm": "H100-SXM-80GB",
    "h200_sxm": "H200-SXM-141GB",
    "a100_sxm": "A100-SXM-80GB",
    "b200_sxm": "B200-SXM-180GB",
    "l40s": "L40S",
}
SYSTEM_PROFILE = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200-sxm",
    "a100_sxm": "a100-sxm",
    "b200_sxm": "b200-sxm",
    "l40s": "l40s",
}

#: Catalog models with a 128-wide head (what the vendored attention tables measure).
DEFAULT_MODELS = (
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen3-8b",
    "qwen3-32b",
)
DEFAULT_TPS = (1, 2, 4, 8)
#: The head_dim of the attention table groups each KV-cache dtype maps to (:func:`dtype_maps`).
TABLE_HEAD_DIM = 128

#: Per-block allocator bookkeeping (vLLM's Python block pool pops a free block and updates
#: hash/ref tables). No published table measures it: an assumption, labelled as such.
ASSUMED_ALLOC_EVENT_S = 2e-6
#: Decode attention over a paged cache vs a contiguous one, for the kernels the built-in tables
#: measured (FlashAttention-3 / FlashInfer / TensorRT-LLM generation): a few percent
#: (PAGED_OVERHEAD_SOURCE). The vLLM paper's 20–26 % (SOSP 2023, section 7.1) was its 2023 kernel.
PAGED_OVERHEAD = 0.03
PAGED_OVERHEAD_SOURCE = (
    "not measured by these tables; published kernel-level comparisons for current kernels: FlashInfer batch decode "
    "at every page size about as fast as its single-request non-paged decode (FlashInfer blog 2024-01-03, fig. 12, "
    "A100); FlashAttention (CuTe) decode with 128-token pages 0.1-0.9 % below non-paged, "
    "17-24 % below with 16/64-token pages gathered by cp.async (Dao-AILab/flash-attention PR #2468, B200, MLA); "
    "vLLM's FlashAttention-3 build: page size 1 and 16 equally fast (vllm-project/flash-attention PR #63). Taken: "
    "3 %. The vLLM paper's 20-26 % (SOSP 2023, section 7.1) measured its 2023 PagedAttention kernel. The "
    "planner's break-even (kvsim plan --break-even) shows whether a recommendation depends on it; measure it with "
    "kvsim calibrate --device cuda"
)
#: Block size of the paged KV cache the decode tables were measured on, by backend
#: (TensorRT-LLM: 64-token blocks; SGLang's table does not record its page size).
MEASURED_BLOCK_SIZE = {"trtllm": 64, "sglang": None, "vllm": None}
MEASURED_KERNEL = {
    "trtllm": "TensorRT-LLM XQA/MMHA decode kernels, paged KV (64-token blocks)",
    "sglang": "SGLang decode attention (FlashAttention-3 on Hopper, flash_attention on A100; the tables "
    "do not name the B200 and L40S kernels) on SGLang's paged KV pool",
    "vllm": "vLLM decode attention backend",
}
#: Memory-bound kernels per layer charged as "elementwise": 2 RMSNorms, RoPE, SiLU·mul, residual add.
ELEMENTWISE_KERNELS = 5


@dataclass
class Fits:
    """Fitted families of one system plus their held-out scores."""

    gemm: F.FamilyFit
    context: F.FamilyFit
    generation: F.FamilyFit
    quality: dict = field(default_factory=dict)


def _group_name(key: tuple) -> str:
    return "/".join(str(x) for x in key)


def fit_tables(kt: KernelTables, *, seed: int = 0, heldout: bool = True) -> Fits:
    """Fit GEMM, context and generation attention; with ``heldout`` also score an 80/20 split."""
    spec = kt.system
    fams: dict[str, Any] = {"gemm": kt.gemm, "context_attention": kt.context, "generation_attention": kt.generation}
    fitted = {k: F.FITTERS[k](t, spec.peak_flops, spec.mem_bw) for k, t in fams.items()}
    quality: dict = {}
    if heldout:
        for kind, table in fams.items():
            test = F.holdout_mask(len(table), 0.2, seed)
            fit = F.FITTERS[kind](table.subset(~test), spec.peak_flops, spec.mem_bw)
            held = table.subset(test)
            pred = F.predict_table(fit, held)
            groups = {}
            for key in fit.group_keys():
                sel = _group_mask(kind, held, key)
                if sel.any():
                    groups[_group_name(key)] = _rounded(F.error_summary(pred[sel], held.latency_s[sel]))
            quality[kind] = {"overall": _rounded(F.error_summary(pred, held.latency_s)), "groups": groups}
        quality["method"] = (
            f"random 20% of rows held out (numpy seed {seed}), fit on the other 80%, relative error |pred-meas|/meas"
        )
    return Fits(fitted["gemm"], fitted["context_attention"], fitted["generation_attention"], quality)


def _rounded(d: dict) -> dict:
    return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in d.items()}


def _group_mask(kind: str, table, key: tuple) -> np.ndarray:
    if kind == "gemm":
        return table.dtype == key[0]
    if kind == "context_attention":
        return (table.attn_dtype == key[0]) & (table.kv_dtype == key[1]) & (table.head_dim == key[2])
    return (table.kv_dtype == key[0]) & (table.head_dim == key[1])


def dtype_maps(kt: KernelTables) -> tuple[dict[str, str], dict[str, tuple[tuple, tuple]], list[str]]:
    """User dtype → measured table group, for weights (GEMM) and the KV cache (attention), plus notes."""
    notes = []
    gemm_have = set(kt.gemm.dtype)
    weights = {}
    if "bf16" in gemm_have:
        weights["bf16"] = "bf16"
    if "fp8" in gemm_have:
        weights["fp8"] = "fp8"
    elif "int8_wo" in gemm_have:
        weights["fp8"] = "int8_wo"
        notes.append(
            f"{kt.system.name} has no FP8 tensor cores: fp8 weights use the int8 weight-only GEMM table "
            "(8-bit weights, bf16 compute), as vLLM runs FP8 checkpoints on Ampere with weight-only kernels"
        )
    if "nvfp4" in gemm_have:
        weights["nvfp4"] = "nvfp4"
    ctx_have = set(zip(kt.context.attn_dtype, kt.context.kv_dtype, kt.context.head_dim.tolist()))
    gen_have = set(zip(kt.generation.kv_dtype, kt.generation.head_dim.tolist()))
    kv = {}
    hd = TABLE_HEAD_DIM
    for d in ("bf16", "fp8"):
        if ("bf16", d, hd) in ctx_have and (d, hd) in gen_have:
            kv[d] = (("bf16", d, hd), (d, hd))
    if "fp8" not in kv:
        notes.append(f"{kt.system.name}: no fp8 KV-cache attention measured; kv_dtype fp8 is not offered")
    return weights, kv, notes


def _tables_problem(kt: KernelTables) -> ConfigError:
    """Why :func:`dtype_maps` found no weight or no KV-cache dtype in ``kt``: the table, its column,
    the values it has and the ones a profile needs, checked in that order: GEMM dtypes, the
    attention tables' head_dim, then their attention and KV-cache dtypes at that head_dim."""
    have = sorted(set(kt.gemm.dtype.tolist()))
    if not have or not {"bf16", "fp8", "int8_wo", "nvfp4"} & set(have):
        return ConfigError(f"{kt.gemm.source}: gemm_dtype", have, "rows of gemm_dtype bf16, fp8, int8_wo or nvfp4")
    d = TABLE_HEAD_DIM
    for table in (kt.context, kt.generation):
        dims = sorted(set(table.head_dim.tolist()))
        if d not in dims:
            return ConfigError(
                f"{table.source}: head_dim",
                dims,
                f"{table.kind}-attention rows with head_dim {d}: a profile maps each KV-cache dtype to the "
                f"head_dim-{d} attention tables (and prices other head sizes from the nearest measured one)",
            )
    at = kt.context.head_dim == d
    pairs = sorted(set(zip(kt.context.attn_dtype[at].tolist(), kt.context.kv_dtype[at].tolist())))
    ctx_kv = [kv for a, kv in pairs if a == "bf16" and kv in ("bf16", "fp8")]
    if not ctx_kv:
        return ConfigError(
            f"{kt.context.source}: attn_dtype/kv_cache_dtype",
            [f"{a}/{kv}" for a, kv in pairs],
            f"head_dim-{d} rows with attn_dtype bf16 and kv_cache_dtype bf16 or fp8",
        )
    gen_kv = sorted(set(kt.generation.kv_dtype[kt.generation.head_dim == d].tolist()))
    return ConfigError(
        f"{kt.generation.source}: kv_cache_dtype",
        gen_kv,
        f"head_dim-{d} rows with kv_cache_dtype {' or '.join(ctx_kv)} (the KV-cache dtypes the context "
        f"attention table measures with bf16 attention at head_dim {d})",
    )


#: Serving engines whose own kernel tables a profile can carry (``Profile.kernels[engine]``).
ENGINES = ("vllm", "sglang", "trtllm")


@dataclass
class EngineKernels:
    """Each engine's fitted families, their held-out quality, source tables and custom all-reduce."""

    kernels: dict[str, dict[str, F.FamilyFit]]
    quality: dict[str, dict]
    sources: dict[str, dict[str, str]]
    custom_allreduce: dict[str, dict[str, Curve1D]]
    #: Fused MoE kernel fits, ``{engine: {weight dtype: constants and held-out scores}}`` (calibration/moe_fit.py).
    moe: dict[str, dict[str, dict]] = field(default_factory=dict)
    #: MLA attention kernel fits, ``{engine: {"generation"|"context": {KV dtype: ...}}}`` (calibration/mla_fit.py).
    mla: dict[str, dict[str, dict[str, dict]]] = field(default_factory=dict)


#: An engine's own table whose fit misses more than this on its held-out 20 % (p95 relative error)
#: is not used: the profile's default table of that family prices the engine (B200 SGLang's
#: attention and the L40S's decode attention: two latency regimes the fitted form does not follow).
ENGINE_FAMILY_P95_MAX = 0.30


def engine_kernels(
    root: Path | str, system: str, spec, *, engines: tuple[str, ...] = ENGINES, seed: int = 0, heldout: bool = True
) -> EngineKernels:
    """Fit the GEMM, context and decode attention tables of every engine that has them for ``system``
    (the kernels each serving engine runs), score each on a held-out 20 %, and read each engine's
    custom all-reduce table. Engines or families without tables are skipped."""
    root = Path(root)
    kernels: dict[str, dict[str, F.FamilyFit]] = {}
    quality: dict[str, dict] = {}
    sources: dict[str, dict[str, str]] = {}
    custom: dict[str, dict[str, Curve1D]] = {}
    moe: dict[str, dict[str, dict]] = {}
    mla: dict[str, dict[str, dict[str, dict]]] = {}
    for engine in engines:
        for kind in ("generation", "context"):
            try:
                path, _ = find_table(root, system, "mla", engine, f"{kind}_mla_perf")
            except ConfigError:
                continue
            mla.setdefault(engine, {})[kind] = fit_mla_table(
                path, kind, spec.mem_bw, spec.peak_flops("bf16"), seed=seed
            )
        try:
            path, _ = find_table(root, system, "moe", engine, "moe_perf")
        except ConfigError:
            pass
        else:
            peaks = {d: spec.peak_flops(d) for d in ("bf16", "fp8", "fp8_block", "nvfp4")}
            moe[engine] = fit_moe_table(path, spec.mem_bw, peaks, seed=seed, engine=engine)
        tabs = {}
        for family, folder, name in (
            ("gemm", "gemm", "gemm_perf"),
            ("context_attention", "attention", "context_attention_perf"),
            ("generation_attention", "attention", "generation_attention_perf"),
        ):
            if not (root / system / folder / engine).is_dir():
                continue
            try:
                path, ver = find_table(root, system, folder, engine, name)
            except ConfigError:
                continue
            tabs[family] = (
                read_gemm(path, engine, ver)
                if family == "gemm"
                else read_attention(path, family.split("_")[0], engine, ver)
            )
            sources.setdefault(engine, {})[family] = f"{system}/{folder}/{engine}/{ver}/{name}.parquet"
        for family, table in tabs.items():
            fit = F.FITTERS[family](table, spec.peak_flops, spec.mem_bw)
            if heldout:
                test = F.holdout_mask(len(table), 0.2, seed)
                q = quality.setdefault(engine, {})[family] = _rounded(
                    F.heldout_evaluation(family, table, spec.peak_flops, spec.mem_bw, test)
                )
                if q["p95_rel_err"] > ENGINE_FAMILY_P95_MAX:
                    # A table the fitted form cannot follow prices worse than the default tables of
                    # the same family (another engine's kernels, well fitted): the engine uses those.
                    sources[engine][family] += f" (not used: held-out p95 {q['p95_rel_err']:.1%})"
                    continue
            kernels.setdefault(engine, {})[family] = fit
        if (root / system / "comm" / engine).is_dir():
            try:
                path, ver = find_table(root, system, "comm", engine, "custom_allreduce_perf")
            except ConfigError:
                continue
            t = allreduce_envelope(read_custom_allreduce(path, ver))
            sources.setdefault(engine, {})["custom_allreduce"] = (
                f"{system}/comm/{engine}/{ver}/custom_allreduce_perf.parquet"
            )
            for g in sorted(set(t.num_gpus.tolist())):
                sel = t.num_gpus == g
                o = np.argsort(t.nbytes[sel])
                custom.setdefault(engine, {})[str(g)] = Curve1D(
                    t.nbytes[sel][o], t.latency_s[sel][o], {"x_is": "message bytes (bf16)", "version": ver}
                )
    return EngineKernels(kernels, quality, sources, custom, moe, mla)


def cpu_overhead_section() -> dict:
    """Linear fit ``intercept + per_seq · batch`` of vLLM's per-step CPU overhead, per TP degree."""
    tab = read_cpu_overheads()
    by_tp = {}
    for tp in sorted(set(tab.tp.tolist())):
        s = tab.tp == tp
        A = np.column_stack([np.ones(s.sum()), tab.batch[s]])
        coef, *_ = np.linalg.lstsq(A, tab.overhead_s[s], rcond=None)
        err = F.error_summary(A @ coef, tab.overhead_s[s])
        by_tp[str(tp)] = {
            "intercept_s": float(coef[0]),
            "per_seq_s": float(coef[1]),
            "batch_range": [int(tab.batch[s].min()), int(tab.batch[s].max())],
            "models": sorted(set(tab.model[s].tolist())),
            "fit_median_rel_err": round(err["median_rel_err"], 4),
        }
    return {
        "by_tp": by_tp,
        "parts": list(CPU_OVERHEAD_PARTS),
        "source": "Vidur profiles historical/a100/cpu_overheads.csv (vLLM on an A100 DGX host, MIT)",
        "note": "host-side work per step, not overlapped with GPU work; TP degrees without data use the nearest lower one",
    }


def _versions() -> dict:
    import pyarrow
    import scipy

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pyarrow": pyarrow.__version__,
    }


def build_profile(
    kt: KernelTables,
    *,
    models: list[tuple[ModelSpec, int]],
    name: str | None = None,
    fits: Fits | None = None,
    seed: int = 0,
    dtype: str | None = None,
    engines: EngineKernels | None = None,
) -> Profile:
    """A profile with fitted kernel families (any shape), checked to price every (model, TP) in
    ``models`` at every dtype the tables measure.

    ``dtype`` (``bf16`` or ``fp8``) keeps only that weight and KV-cache dtype. ``engines``
    (:func:`engine_kernels`) adds each serving engine's own kernel families and all-reduce.
    """
    spec = kt.system
    weights, kvs, notes = dtype_maps(kt)
    if not weights or not kvs:
        raise _tables_problem(kt)  # before fitting: the tables cannot make a profile
    fits = fits or fit_tables(kt, seed=seed)
    if dtype is not None:
        if dtype not in weights and dtype not in kvs:
            raise ConfigError(
                "calibrate.dtype",
                dtype,
                f"dtypes measured for {spec.name}: {', '.join(sorted(set(weights) | set(kvs)))}",
            )
        weights = {k: v for k, v in weights.items() if k == dtype} or weights
        kvs = {k: v for k, v in kvs.items() if k == dtype} or kvs
    gen_backend = kt.backend_of("generation_attention")
    kernels: dict[str, dict[str, F.FamilyFit]] = {kt.backend: {"gemm": fits.gemm, "context_attention": fits.context}}
    kernels.setdefault(gen_backend, {})["generation_attention"] = fits.generation
    kernel_defaults = {"gemm": kt.backend, "context_attention": kt.backend, "generation_attention": gen_backend}
    if engines is not None and engines.moe:
        kernel_defaults["moe"] = kt.backend if kt.backend in engines.moe else sorted(engines.moe)[0]
    if engines is not None and engines.mla:
        kernel_defaults["mla"] = kt.backend if kt.backend in engines.mla else sorted(engines.mla)[0]
    if engines is not None:
        for engine, fams in engines.kernels.items():
            for family, fit in fams.items():
                kernels.setdefault(engine, {})[family] = fit
    # Curves are derived from the fitted families when a cost model needs a shape; here the catalog
    # models' shapes are derived once to check they price and to count floor-clamped cells.
    probe = Profile(
        name="probe",
        device=_device(spec),
        provenance={},
        memory={},
        elementwise={},
        layout={},
        cpu_overhead={},
        allreduce={},
        gemm={},
        context_attention={},
        generation_attention={},
        models={},
        fit_quality={},
        dtypes=_dtypes(weights, kvs),
        kernels=kernels,
        kernel_defaults=kernel_defaults,
    )
    gemm: dict[str, Curve1D] = {}
    ctx: dict[str, Grid2D] = {}
    gen_curves: dict[str, Grid2D] = {}
    entries: dict[str, dict] = {}
    for model, tp in models:
        for wd in weights:
            for kd in kvs:
                keys = shape_keys(model, tp, wd, kd)
                for key in keys.gemms().values():
                    if key not in gemm:
                        curve = probe.gemm_curve(key)
                        if curve is None:
                            raise ConfigError("calibration.tables", kt.system.name, f"a GEMM table of dtype {wd}")
                        gemm[key] = curve
                if keys.attention not in gen_curves:
                    c, g = probe.attention_grids(keys.attention)
                    if c is None or g is None:
                        raise ConfigError(
                            "calibration.tables",
                            kt.system.name,
                            f"attention tables for KV dtype {kd} at head_dim {model.head_dim}",
                        )
                    ctx[keys.attention], gen_curves[keys.attention] = c, g
        bf = shape_keys(model, tp, next(iter(weights)), next(iter(kvs)))
        entries[f"{model.name}@tp{tp}"] = {
            "tensor_parallel": tp,
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "kv_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "intermediate": model.intermediate,
            "vocab": model.vocab,
            "gemm_shapes": {p: k.split(":")[0] for p, k in bf.gemms().items()},
            "attention_shape": bf.attention.split(":")[0],
        }
    allreduce = {}
    if kt.nccl is not None:
        for g in sorted(set(kt.nccl.num_gpus.tolist())):
            s = kt.nccl.num_gpus == g
            o = np.argsort(kt.nccl.nbytes[s])
            allreduce[str(g)] = Curve1D(
                kt.nccl.nbytes[s][o],
                kt.nccl.latency_s[s][o],
                {"x_is": "message bytes (fp16)", "nccl_version": kt.nccl.version},
            )
    params = {
        fam.kind: {
            _group_name(k): {**{a: _sig(b) for a, b in rf.as_dict().items()}} for k, (rf, _) in fam.groups.items()
        }
        for fam in (fits.gemm, fits.context, fits.generation)
    }
    gpu_name = SYSTEM_GPU.get(spec.name, spec.name)
    clamped = {
        fam: sum(int(c.meta.get("clamped_to_physical_floor", 0)) for c in curves.values())
        for fam, curves in (("gemm", gemm), ("context_attention", ctx), ("generation_attention", gen_curves))
    }
    gen = kt.generation
    implied = (
        gen.batch
        * gen.length
        * 2.0
        * gen.kv_heads
        * gen.head_dim
        * np.where(gen.kv_dtype == "fp8", 1.0, 2.0)
        / gen.latency_s
    )
    over = int(np.sum(implied > spec.mem_bw))
    if over:
        notes.append(
            f"{over} of {len(gen)} measured generation-attention rows imply more than the {spec.mem_bw / 1e12:.3g} TB/s "
            f"HBM peak (up to {implied.max() / spec.mem_bw:.2f}x); profile curves are raised to the "
            f"KV-bytes/peak floor there"
        )
    if any(clamped.values()):
        notes.append(
            "clamped_points counts grid cells raised to max(FLOPs/peak, bytes/peak_bw); most are cells the "
            "tables did not measure (large batch x length), where the correction is extrapolated"
        )
    provenance = {
        "device": gpu_name,
        "system": spec.name,
        "curves": "derived at load from the fitted kernel families (kernels) for any model shape; the catalog "
        "models listed under models were checked to price",
        "backend": kt.backend
        if not kt.backends
        else f"{kt.backend} (generation attention: {kt.backend_of('generation_attention')})",
        "backends": {
            "gemm": kt.backend,
            "context_attention": kt.backend,
            "generation_attention": kt.backend_of("generation_attention"),
            "nccl": "nccl",
        },
        "backend_versions": {
            "gemm": kt.gemm.version,
            "context_attention": kt.context.version,
            "generation_attention": kt.generation.version,
            "nccl": kt.nccl.version if kt.nccl is not None else None,
        },
        "source": "aiconfigurator-core 0.12.0 measured kernel tables (Apache-2.0); Vidur CPU overheads (MIT)",
        "engine_tables": engines.sources if engines is not None else {},
        "source_tables": [
            _rel(kt, p)
            for p in (
                kt.gemm.source,
                kt.context.source,
                kt.generation.source,
                kt.nccl.source if kt.nccl is not None else None,
            )
            if p
        ],
        "date": _dt.date.today().isoformat(),
        "method": "per dtype group: least-squares fit of t = launch + smooth-max(FLOPs/F, bytes/B[, KV tokens/S]) in log "
        "space, times a log-ratio correction interpolated on the measured grid; curves stored on the "
        "measured grid of each family at a model's per-GPU kernel shapes when a cost model needs them, raised "
        "to max(FLOPs/peak, bytes/peak_bw)",
        "parametric_fits": params,
        "clamped_points": clamped,
        "library_versions": _versions(),
        "notes": notes,
    }
    return Profile(
        name=name or SYSTEM_PROFILE.get(spec.name, spec.name),
        device={**_device(spec), "name": gpu_name},
        provenance=provenance,
        memory={
            "latency_s": spec.mem_latency_s,
            "bandwidth_bytes_per_s": spec.mem_bw * spec.mem_bw_efficiency,
            "host_latency_s": spec.p2p_latency_s,
            "host_bandwidth_bytes_per_s": spec.pcie_bw * spec.mem_bw_efficiency,
            "alloc_event_s": ASSUMED_ALLOC_EVENT_S,
            "source": "system.yaml: mem_bw x mem_bw_empirical_scaling_factor, mem_empirical_constant_latency; "
            "pcie_bw x the same factor, p2p_latency; alloc_event_s is an assumption (no measurement)",
        },
        elementwise={
            "kernels_per_layer": ELEMENTWISE_KERNELS,
            "latency_s": spec.mem_latency_s,
            "bandwidth_bytes_per_s": spec.mem_bw * spec.mem_bw_efficiency,
            "source": "memory-bound kernels priced like memory ops (not in the kernel tables)",
        },
        layout={
            "measured_paged": True,
            "measured_block_size": MEASURED_BLOCK_SIZE.get(kt.backend_of("generation_attention")),
            "measured_kernel": MEASURED_KERNEL.get(kt.backend_of("generation_attention"), ""),
            "paged_overhead": PAGED_OVERHEAD,
            "paged_overhead_source": PAGED_OVERHEAD_SOURCE,
            "contiguous_model": "decode attention time / (1 + paged_overhead)",
            "block_size_dependence": "none modelled: the tables measure one block size",
        },
        cpu_overhead=cpu_overhead_section(),
        allreduce=allreduce,
        gemm={},
        context_attention={},
        generation_attention={},
        models=entries,
        fit_quality={
            **fits.quality,
            **({"backends": engines.quality} if engines is not None and engines.quality else {}),
        },
        dtypes=_dtypes(weights, kvs),
        kernels=kernels,
        kernel_defaults=kernel_defaults,
        custom_allreduce=engines.custom_allreduce if engines is not None else {},
        moe=engines.moe if engines is not None else {},
        mla=engines.mla if engines is not None else {},
    )


def _device(spec) -> dict:
    return {
        "name": SYSTEM_GPU.get(spec.name, spec.name),
        "system": spec.name,
        "hbm_bandwidth": spec.mem_bw,
        "peak_bf16_flops": spec.bf16_flops,
        "peak_fp8_flops": spec.fp8_flops,
        **({"peak_fp4_flops": spec.fp4_flops} if spec.fp4_flops else {}),
        "memory_bytes": spec.mem_capacity_bytes,
        "pcie_bandwidth": spec.pcie_bw,
        "nvlink_bandwidth": spec.nvlink_bw,
    }


def _dtypes(weights: dict, kvs: dict) -> dict:
    return {
        "weight": sorted(weights),
        "kv": sorted(kvs),
        "weight_tables": dict(weights),
        "kv_tables": {k: [list(a), list(b)] for k, (a, b) in kvs.items()},
    }


def _sig(x):
    return float(f"{x:.5g}") if isinstance(x, float) else x


def _rel(kt: KernelTables, path: str) -> str:
    """Source path relative to the tables root's system folder (``h100_sxm/gemm/...``), else as given."""
    try:
        return str(Path(path).resolve().relative_to(kt.root.resolve()))
    except ValueError:
        return str(path)


def default_models(
    models: tuple[str, ...] = DEFAULT_MODELS, tps: tuple[int, ...] = DEFAULT_TPS
) -> list[tuple[ModelSpec, int]]:
    """(model, TP) pairs whose heads and KV heads split evenly across TP GPUs."""
    out = []
    for name in models:
        m = MODELS[name]
        for tp in tps:
            if (
                m.heads % tp == 0
                and (m.kv_heads % tp == 0 or m.kv_heads < tp)
                and m.intermediate % tp == 0
                and m.vocab % tp == 0
            ):
                out.append((m, tp))
    return out


__all__ = [
    "Fits",
    "fit_tables",
    "build_profile",
    "default_models",
    "dtype_maps",
    "cpu_overhead_section",
    "engine_kernels",
    "EngineKernels",
    "ENGINES",
    "SYSTEM_GPU",
    "SYSTEM_PROFILE",
]
