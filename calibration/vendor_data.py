"""Copy the subset of the published tables that kvsim needs into ``calibration/data``.

Run once from a checkout that has the shared reference data next to it::

    python -m calibration.vendor_data /path/to/shared/data              # every system
    python -m calibration.vendor_data /path/to/shared/data b200_sxm l40s  # some (and the Vidur files)

A fresh clone does not need this: the filtered copies are committed. The
filters keep the files small and keep exactly what the fits and tests use:

* GPU kernel tables (aiconfigurator-core 0.12.0, Apache-2.0), TensorRT-LLM
  backend, because it is the only backend whose decode-attention tables cover
  both GQA (8 KV heads) and MHA (32/64 KV heads) shapes at bf16 and fp8 KV:
  GEMMs at bf16/fp8 (A100: bf16 and int8 weight-only), attention with
  head_dim 128 and full attention (window 0), NCCL all-reduce in half.
  The built-in profiles take decode attention from the SGLang backend instead
  (FlashAttention-3 on Hopper, flash_attention on A100): its tables cover every KV-head
  count 1–64 too and are far smoother (docs/calibration.md), head_dim 128, window 0.
* Vidur profiles (MIT): Llama-2-7B per-operator times on A100/H100 and the
  vLLM CPU-overhead table.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"

#: system -> SGLang version whose decode-attention table the built-in profiles use (b200_sxm takes
#: TensorRT-LLM's: calibration/build_builtin.py GENERATION_BACKEND_FOR).
SGLANG_GENERATION = {"h100_sxm": "0.5.14", "h200_sxm": "0.5.14", "a100_sxm": "0.5.10", "l40s": "0.5.14"}

#: system -> (trtllm version, nccl version, gemm dtypes kept). The NCCL version is the one the
#: system.yaml names; the L40S has no NVLink, so its all-reduce rows were measured over PCIe.
SYSTEMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "h100_sxm": ("1.3.0rc20", "2.27.3", ("bfloat16", "fp8", "fp8_block")),
    "h200_sxm": ("1.3.0rc20", "2.26.2", ("bfloat16", "fp8", "fp8_block")),
    "a100_sxm": ("1.0.0", "2.27.3", ("bfloat16", "int8_wo")),
    "b200_sxm": ("1.3.0rc20", "2.27.3", ("bfloat16", "fp8", "fp8_block", "nvfp4")),
    "l40s": ("1.3.0rc20", "2.27.3", ("bfloat16", "fp8", "fp8_block")),
}

#: Per-engine kernel tables (the kernels each serving engine runs), on the GPUs the serving
#: benchmarks were measured on: system -> engine -> (GEMM/attention version, GEMM dtypes kept,
#: custom all-reduce version). The all-reduce versions are the oldest genuine ones of each engine
#: (closest to the benchmarked engine versions; SGLang's 0.5.6.post2 table is a copy of TensorRT-LLM's).
ENGINE_TABLES: dict[str, dict[str, tuple[str, tuple[str, ...], str | None]]] = {
    system: {
        "vllm": ("0.24.0", ("bfloat16", "fp8", *fp4), "0.19.0"),
        "sglang": ("0.5.14", ("bfloat16", "fp8", "fp8_block", *fp4), "0.5.9"),
        "trtllm": ("1.3.0rc20", ("bfloat16", "fp8", "fp8_block", *fp4), "1.2.0rc5"),
    }
    # B200: the same engine versions, and the NVFP4 GEMMs its FP4 tensor cores run.
    for system, fp4 in (("h100_sxm", ()), ("h200_sxm", ()), ("b200_sxm", ("nvfp4",)))
}
# L40S: the same GEMM and attention versions; its engines' all-reduce tables were measured at other
# versions (PCIe: no NVLink).
ENGINE_TABLES["l40s"] = {
    "vllm": ("0.24.0", ("bfloat16", "fp8"), "0.22.0"),
    "sglang": ("0.5.14", ("bfloat16", "fp8"), "0.5.9"),
    "trtllm": ("1.3.0rc20", ("bfloat16", "fp8", "fp8_block"), "1.3.0rc20"),
}

# A100: the engine versions its tables were measured at (bf16 only: no FP8 tensor cores; TensorRT-LLM's
# weight-only int8 too). No engine timed its custom all-reduce there: NCCL's table prices them all.
ENGINE_TABLES["a100_sxm"] = {
    "vllm": ("0.14.0", ("bfloat16",), None),
    "sglang": ("0.5.10", ("bfloat16",), None),
    "trtllm": ("1.0.0", ("bfloat16", "int8_wo"), None),
}

#: Fused mixture-of-experts layer tables (``moe/<engine>/<version>/moe_perf.parquet``): system ->
#: engine -> version. The rows kvsim prices from: power-law routing (``power_law_1.01``, the skew
#: aiconfigurator estimates real traffic with), no expert parallelism, expert tensor parallelism up
#: to 8, gated (SwiGLU) experts at bf16, fp8, block fp8, nvfp4 and mxfp4 (gpt-oss; weight-only, and
#: with mxfp8 activations where Blackwell's tables time it).
MOE_TABLES: dict[str, dict[str, str]] = {
    system: {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
    for system in ("h100_sxm", "h200_sxm", "b200_sxm", "l40s")
}
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8")


def _moe_rows(t):
    """The MoE rows :data:`MOE_TABLES` keeps (see there)."""
    mask = pc.and_(pc.equal(t["distribution"], "power_law_1.01"), pc.equal(t["moe_ep_size"], 1))
    mask = pc.and_(mask, pc.less_equal(t["moe_tp_size"], 8))
    mask = pc.and_(mask, pc.is_in(t["moe_dtype"], value_set=pa.array(MOE_DTYPES)))
    return pc.and_(mask, pc.invert(pc.match_substring_regex(t["kernel_source"], "nongated|marlin")))


#: Multi-head latent attention kernel tables (``mla/<engine>/<version>/{generation,context}_mla_perf``):
#: system -> engine -> version, every row (DeepSeek-V3's MLA at 1-128 heads per GPU, bf16 and fp8 KV).
MLA_TABLES: dict[str, dict[str, str]] = {
    system: {"sglang": "0.5.14", "trtllm": "1.3.0rc20"} for system in ("h100_sxm", "h200_sxm", "b200_sxm")
}
MLA_TABLES["l40s"] = {"sglang": "0.5.14"}


#: The families beside GEMM and attention: (folder, system -> engine -> version, tables, row filter).
FAMILY_TABLES = (
    ("moe", MOE_TABLES, ("moe_perf",), _moe_rows),
    ("mla", MLA_TABLES, ("generation_mla_perf", "context_mla_perf"), lambda t: pc.is_valid(t["latency"])),
)


def vendor_families(shared: Path, systems: list[str] | None = None) -> None:
    """Copy the MoE and MLA tables (:data:`FAMILY_TABLES`)."""
    gk_src, gk_dst = shared / "gpu-kernels", DATA / "gpu-kernels"
    for family, tables, names, rows in FAMILY_TABLES:
        for system, engines in tables.items():
            if systems and system not in systems:
                continue
            for engine, ver in engines.items():
                for name in names:
                    rel = f"{family}/{engine}/{ver}/{name}.parquet"
                    _filter_copy(gk_src / system / rel, gk_dst / system / rel, rows)


VIDUR_FILES = [
    "LICENSE",
    "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
    "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
    "historical/a100/cpu_overheads.csv",
]


def _filter_copy(src: Path, dst: Path, mask_fn) -> None:
    table = pq.read_table(src)
    table = table.filter(mask_fn(table))
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst, compression="zstd")
    meta = src.parent / "collection_meta.yaml"
    if meta.exists():
        shutil.copy(meta, dst.parent / "collection_meta.yaml")


def _head128_full(t):
    """head_dim 128 and full attention (window 0; tables without the column are all full attention)."""
    mask = pc.equal(t["head_dim"], 128)
    return pc.and_(mask, pc.equal(t["window_size"], 0)) if "window_size" in t.column_names else mask


def vendor(shared: Path, systems: list[str] | None = None) -> None:
    gk_src, gk_dst = shared / "gpu-kernels", DATA / "gpu-kernels"
    gk_dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(gk_src / "LICENSE", gk_dst / "LICENSE")
    unknown = sorted(set(systems or []) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    for system, (trt, nccl, gemm_dtypes) in SYSTEMS.items():
        if systems and system not in systems:
            continue
        s, d = gk_src / system, gk_dst / system
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(s / "system.yaml", d / "system.yaml")
        rel = f"gemm/trtllm/{trt}/gemm_perf.parquet"
        _filter_copy(s / rel, d / rel, lambda t, dt=gemm_dtypes: pc.is_in(t["gemm_dtype"], value_set=pa.array(dt)))
        for name in ("context_attention_perf", "generation_attention_perf"):
            rel = f"attention/trtllm/{trt}/{name}.parquet"
            _filter_copy(
                s / rel, d / rel, lambda t: pc.and_(pc.equal(t["head_dim"], 128), pc.equal(t["window_size"], 0))
            )
        if system in SGLANG_GENERATION:
            rel = f"attention/sglang/{SGLANG_GENERATION[system]}/generation_attention_perf.parquet"
            _filter_copy(s / rel, d / rel, _head128_full)
        rel = f"comm/nccl/{nccl}/nccl_perf.parquet"
        _filter_copy(
            s / rel, d / rel, lambda t: pc.and_(pc.equal(t["op_name"], "all_reduce"), pc.equal(t["nccl_dtype"], "half"))
        )
    for system, engines in ENGINE_TABLES.items():
        if systems and system not in systems:
            continue
        s, d = gk_src / system, gk_dst / system
        for engine, (ver, gemm_dtypes, ar_ver) in engines.items():
            rel = f"gemm/{engine}/{ver}/gemm_perf.parquet"
            if not (d / rel).exists() or engine != "trtllm":
                _filter_copy(
                    s / rel, d / rel, lambda t, g=gemm_dtypes: pc.is_in(t["gemm_dtype"], value_set=pa.array(g))
                )
            for name in ("context_attention_perf", "generation_attention_perf"):
                rel = f"attention/{engine}/{ver}/{name}.parquet"
                if (s / rel).exists():
                    _filter_copy(s / rel, d / rel, _head128_full)
            if ar_ver is None:
                continue
            rel = f"comm/{engine}/{ar_ver}/custom_allreduce_perf.parquet"
            # Graph-replayed rows only (the engines replay their all-reduce inside CUDA graphs).
            _filter_copy(
                s / rel,
                d / rel,
                lambda t: pc.and_(
                    pc.equal(t["allreduce_dtype"], "bfloat16"),
                    pc.invert(pc.match_substring(t["kernel_source"], "eager")),
                ),
            )
    vendor_families(shared, systems)
    v_src, v_dst = shared / "vidur-profiles", DATA / "vidur-profiles"
    for rel in VIDUR_FILES:
        (v_dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(v_src / rel, v_dst / rel)


if __name__ == "__main__":
    vendor(Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parent.parent / "shared" / "data"), sys.argv[2:] or None)
