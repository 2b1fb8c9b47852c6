"""Readers of published measurement tables, validated into plain numpy columns.

Two sources, both laid out as their publishers ship them:

* aiconfigurator-format GPU kernel tables (``<root>/<system>/<family>/<backend>/<version>/<table>.parquet``
  plus ``<root>/<system>/system.yaml``), latencies in milliseconds;
* Vidur profiles (``mlp.csv`` per-operator times, ``cpu_overheads.csv``), milliseconds.

Every reader returns seconds, normalises dtype names (``bfloat16`` → ``bf16``) and
raises :class:`sim.errors.ConfigError` naming the file and the missing or bad column,
so a user pointing ``kvsim calibrate --from-tables`` at the wrong folder gets one
actionable line instead of a pandas traceback.
"""

from __future__ import annotations

import csv
import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from sim.catalog import tensor_core_peak
from sim.errors import ConfigError

#: Data shipped with the repository (filtered copies; see ``data/*/SOURCE.md``), installed as
#: package data (pyproject.toml) so the defaults exist in a wheel install too.
DEFAULT_DATA_DIR = Path(str(importlib.resources.files("calibration"))) / "data"
DEFAULT_TABLES_DIR = DEFAULT_DATA_DIR / "gpu-kernels"
VIDUR_DIR = DEFAULT_DATA_DIR / "vidur-profiles"

_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "int8_wo": "int8_wo",
    "int4_wo": "int4_wo",
    "sq": "int8_sq",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
}

KEY = "calibration.tables"


def norm_dtype(name: str) -> str:
    """Canonical short dtype name (``bfloat16`` → ``bf16``); unknown names pass through lowercased."""
    return _DTYPE_NAMES.get(str(name).lower(), str(name).lower())


@dataclass(frozen=True)
class SystemSpec:
    """Peak figures of one system from aiconfigurator's ``system.yaml`` (bytes/s, FLOP/s, seconds)."""

    name: str
    mem_bw: float
    mem_bw_efficiency: float
    mem_latency_s: float
    mem_capacity_bytes: int
    bf16_flops: float
    fp8_flops: float
    int8_flops: float
    pcie_bw: float
    nvlink_bw: float
    p2p_latency_s: float
    nccl_version: str
    fp4_flops: float = 0.0

    def peak_flops(self, dtype: str) -> float:
        """Tensor-core peak for GEMMs computed in ``dtype`` (:func:`sim.catalog.tensor_core_peak`)."""
        return tensor_core_peak(dtype, self.bf16_flops, self.fp8_flops, self.fp4_flops, self.int8_flops)


@dataclass
class GemmTable:
    """GEMM rows: an (m×k)·(k×n) product of ``dtype`` took ``latency_s``."""

    dtype: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    latency_s: np.ndarray
    source: str
    backend: str
    version: str

    def subset(self, mask: np.ndarray) -> GemmTable:
        return GemmTable(
            self.dtype[mask],
            self.m[mask],
            self.n[mask],
            self.k[mask],
            self.latency_s[mask],
            self.source,
            self.backend,
            self.version,
        )

    def __len__(self) -> int:
        return len(self.latency_s)


@dataclass
class AttentionTable:
    """Attention rows for one layer.

    Context (prefill): ``batch`` prompts of ``length`` tokens each, no prior KV.
    Generation (decode): ``batch`` sequences of one new token over ``length`` KV
    tokens each (the table's ``isl + step``).
    """

    kind: str  # "context" or "generation"
    batch: np.ndarray
    length: np.ndarray
    heads: np.ndarray
    kv_heads: np.ndarray
    head_dim: np.ndarray
    attn_dtype: np.ndarray
    kv_dtype: np.ndarray
    latency_s: np.ndarray
    source: str
    backend: str
    version: str

    def subset(self, mask: np.ndarray) -> AttentionTable:
        return AttentionTable(
            self.kind,
            self.batch[mask],
            self.length[mask],
            self.heads[mask],
            self.kv_heads[mask],
            self.head_dim[mask],
            self.attn_dtype[mask],
            self.kv_dtype[mask],
            self.latency_s[mask],
            self.source,
            self.backend,
            self.version,
        )

    def __len__(self) -> int:
        return len(self.latency_s)


@dataclass
class NcclTable:
    """All-reduce latency by GPU count and message size in bytes (fp16 payload)."""

    num_gpus: np.ndarray
    nbytes: np.ndarray
    latency_s: np.ndarray
    source: str
    version: str


def _read_parquet(path: Path, required: list[str]) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ConfigError(KEY, str(path), "file not found")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ConfigError(KEY, str(path), f"a readable Parquet file ({type(exc).__name__}: {exc})") from None
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ConfigError(KEY, str(path), f"needs columns {', '.join(missing)} (has {', '.join(table.column_names)})")
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in required}
    if len(cols["latency"]) == 0:
        raise ConfigError(KEY, str(path), "at least one row")
    lat = cols["latency"].astype(np.float64)
    if not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise ConfigError(KEY, str(path), "column 'latency' must be finite and > 0 (milliseconds)")
    return cols


def _ints(cols: dict[str, np.ndarray], name: str, path: Path) -> np.ndarray:
    try:
        v = cols[name].astype(np.int64)
    except (TypeError, ValueError):
        raise ConfigError(KEY, str(path), f"column {name!r} must be integer") from None
    if np.any(v <= 0):
        raise ConfigError(KEY, str(path), f"column {name!r} must be > 0")
    return v


def find_table(
    root: Path | str, system: str, family: str, backend: str, table: str, version: str | None = None
) -> tuple[Path, str]:
    """Path of ``<root>/<system>/<family>/<backend>/<version>/<table>.parquet`` and its version.

    With ``version=None`` the only (or the newest, by :func:`version_key`) measured version is used.
    """
    base = Path(root) / system / family / backend
    if not base.is_dir():
        have = (
            sorted(p.name for p in (Path(root) / system / family).glob("*"))
            if (Path(root) / system / family).is_dir()
            else []
        )
        raise ConfigError(
            "calibrate.backend",
            backend,
            f"no {family} tables for {system} under {Path(root)}; available backends: {', '.join(have) or 'none'}",
        )
    versions = sorted((p.parent.name for p in base.glob(f"*/{table}.parquet")), key=version_key)
    if version is not None:
        if version not in versions:
            raise ConfigError("calibrate.version", version, f"measured versions: {', '.join(versions) or 'none'}")
        return base / version / f"{table}.parquet", version
    if not versions:
        raise ConfigError(KEY, str(base), f"a folder <version>/{table}.parquet")
    return base / versions[-1] / f"{table}.parquet", versions[-1]


def version_key(version: str) -> tuple:
    """Sort key of an engine version string: numeric parts as numbers (``0.5.14`` after
    ``0.5.6.post2``, ``1.3.0rc20`` after ``1.3.0rc5``), a pre-release (``rc``) before its release."""
    import re

    out: list[tuple[int, int | str]] = []
    for part in re.findall(r"\d+|[A-Za-z]+", version):
        out.append((0, int(part)) if part.isdigit() else (-1 if part in ("rc", "a", "b", "dev") else 1, part))
    return (*out, (0, -1))  # the end sorts after a pre-release tag and before a further number


def list_systems(root: Path | str = DEFAULT_TABLES_DIR) -> list[str]:
    return sorted(p.parent.name for p in Path(root).glob("*/system.yaml"))


def read_system(root: Path | str, system: str) -> SystemSpec:
    path = Path(root) / system / "system.yaml"
    if not path.is_file():
        raise ConfigError(
            "calibrate.system", system, f"systems under {root}: {', '.join(list_systems(root)) or 'none'}"
        )
    try:
        doc = yaml.safe_load(path.read_text())
        gpu, node, misc = doc["gpu"], doc["node"], doc.get("misc", {})
        return SystemSpec(
            name=system,
            mem_bw=float(gpu["mem_bw"]),
            mem_bw_efficiency=float(gpu.get("mem_bw_empirical_scaling_factor", 1.0)),
            mem_latency_s=float(gpu.get("mem_empirical_constant_latency", 0.0)),
            mem_capacity_bytes=int(gpu["mem_capacity"]),
            bf16_flops=float(gpu["bfloat16_tc_flops"]),
            fp8_flops=float(gpu.get("fp8_tc_flops", 0.0)),
            int8_flops=float(gpu.get("int8_tc_flops", 0.0)),
            pcie_bw=float(node["pcie_bw"]),
            nvlink_bw=float(node.get("intra_node_bw", 0.0)),
            p2p_latency_s=float(node.get("p2p_latency", 0.0)),
            nccl_version=str(misc.get("nccl_version", "")),
            fp4_flops=float(gpu.get("fp4_tc_flops", 0.0)),
        )
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            KEY,
            str(path),
            f"aiconfigurator system.yaml with gpu.mem_bw, gpu.bfloat16_tc_flops, "
            f"gpu.mem_capacity, node.pcie_bw ({type(exc).__name__}: {exc})",
        ) from None


def read_gemm(path: Path | str, backend: str = "", version: str = "") -> GemmTable:
    path = Path(path)
    cols = _read_parquet(path, ["gemm_dtype", "m", "n", "k", "latency"])
    return GemmTable(
        dtype=np.array([norm_dtype(x) for x in cols["gemm_dtype"]]),
        m=_ints(cols, "m", path),
        n=_ints(cols, "n", path),
        k=_ints(cols, "k", path),
        latency_s=cols["latency"].astype(np.float64) * 1e-3,
        source=str(path),
        backend=backend,
        version=version,
    )


def read_attention(path: Path | str, kind: str, backend: str = "", version: str = "") -> AttentionTable:
    """Read a context or generation attention table; drops sliding-window rows."""
    path = Path(path)
    if kind not in ("context", "generation"):
        raise ValueError(kind)
    cols = _read_parquet(
        path,
        [
            "batch_size",
            "isl",
            "num_heads",
            "num_key_value_heads",
            "head_dim",
            "attn_dtype",
            "kv_cache_dtype",
            "step",
            "latency",
        ],
    )
    keep = np.ones(len(cols["latency"]), dtype=bool)
    if "window_size" in pq.read_schema(path).names:
        keep = pq.read_table(path, columns=["window_size"]).column(0).to_numpy(zero_copy_only=False) == 0
    isl, step = _ints(cols, "isl", path), cols["step"].astype(np.int64)
    length = isl + step if kind == "generation" else isl
    out = AttentionTable(
        kind=kind,
        batch=_ints(cols, "batch_size", path),
        length=length,
        heads=_ints(cols, "num_heads", path),
        kv_heads=_ints(cols, "num_key_value_heads", path),
        head_dim=_ints(cols, "head_dim", path),
        attn_dtype=np.array([norm_dtype(x) for x in cols["attn_dtype"]]),
        kv_dtype=np.array([norm_dtype(x) for x in cols["kv_cache_dtype"]]),
        latency_s=cols["latency"].astype(np.float64) * 1e-3,
        source=str(path),
        backend=backend,
        version=version,
    )
    return out.subset(keep)


def read_nccl(path: Path | str, version: str = "") -> NcclTable:
    """All-reduce rows in half precision; duplicate measurements of one size are averaged."""
    path = Path(path)
    cols = _read_parquet(path, ["op_name", "nccl_dtype", "num_gpus", "message_size", "latency"])
    keep = (cols["op_name"] == "all_reduce") & (cols["nccl_dtype"] == "half")
    if not keep.any():
        raise ConfigError(KEY, str(path), "rows with op_name 'all_reduce' and nccl_dtype 'half'")
    return _mean_latency_table(cols, keep, path, version)


def _mean_latency_table(cols: dict, keep: np.ndarray, path: Path, version: str) -> NcclTable:
    """The kept rows' mean latency per (GPU count, message bytes): ``message_size`` counts 2-byte
    elements (half or bf16), ``latency`` is in milliseconds."""
    gpus = cols["num_gpus"][keep].astype(np.int64)
    nbytes = cols["message_size"][keep].astype(np.float64) * 2.0
    lat = cols["latency"][keep].astype(np.float64) * 1e-3
    keys = np.stack([gpus, nbytes.astype(np.int64)], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    mean = np.bincount(inv, weights=lat) / np.bincount(inv)
    return NcclTable(
        num_gpus=uniq[:, 0], nbytes=uniq[:, 1].astype(np.float64), latency_s=mean, source=str(path), version=version
    )


def read_custom_allreduce(path: Path | str, version: str = "") -> NcclTable:
    """An engine's own all-reduce kernel (``comm/<engine>/<version>/custom_allreduce_perf.parquet``):
    bf16 rows replayed in CUDA graphs; ``message_size`` counts bf16 elements (2 bytes each), as the
    NCCL tables do."""
    path = Path(path)
    cols = _read_parquet(path, ["allreduce_dtype", "num_gpus", "message_size", "latency"])
    keep = cols["allreduce_dtype"] == "bfloat16"
    if "kernel_source" in pq.read_schema(path).names:
        src = pq.read_table(path, columns=["kernel_source"]).column(0).to_numpy(zero_copy_only=False)
        keep &= np.array(["eager" not in str(x) for x in src])
    if not keep.any():
        raise ConfigError(KEY, str(path), "rows with allreduce_dtype 'bfloat16' replayed in graphs")
    return _mean_latency_table(cols, keep, path, version)


#: All-reduce messages up to this size (bytes) are latency-bound: one-shot kernels in which each GPU
#: reads every peer's buffer, so more peers never make them faster. Larger ones are
#: bandwidth-bound, where 8 GPUs can beat 4 (NVLink SHARP, more links): the tables show it.
LATENCY_BOUND_BYTES = 1 << 20


def allreduce_envelope(t: NcclTable) -> NcclTable:
    """The table with each latency lowered to the fastest measured for a message at least as large
    and, for latency-bound messages (:data:`LATENCY_BOUND_BYTES`), on the next larger GPU count.

    Padding a message to a larger size never costs more, nor does reducing a small message over
    fewer peers, so a latency above that bound is an outlier or a strategy change of the
    collector's own heuristic (TensorRT-LLM's table at 4 GPUs switches to NCCL-like 11 µs between
    64 and 256 KiB where its 8-GPU rows stay at 5-10 µs; its 2-GPU rows have isolated 8-10 µs points
    between 3-4 µs neighbours). Only sizes measured at both GPU counts are compared.
    """
    lat = t.latency_s.copy()
    counts = sorted(set(t.num_gpus.tolist()), reverse=True)

    def suffix_min(sel: np.ndarray) -> None:
        lat[sel] = np.minimum.accumulate(lat[sel][::-1])[::-1]

    for i, g in enumerate(counts):
        sel = np.flatnonzero(t.num_gpus == g)
        sel = sel[np.argsort(t.nbytes[sel])]
        suffix_min(sel)
        if i == 0:
            continue
        h = counts[i - 1]
        other = {float(b): float(v) for b, v in zip(t.nbytes[t.num_gpus == h], lat[t.num_gpus == h])}
        for j in sel:
            bound = other.get(float(t.nbytes[j]))
            if t.nbytes[j] <= LATENCY_BOUND_BYTES and bound is not None and bound < lat[j]:
                lat[j] = bound
        suffix_min(sel)
    return NcclTable(t.num_gpus, t.nbytes, lat, t.source, t.version)


@dataclass
class KernelTables:
    """Every table the profile builder needs for one system and backend."""

    system: SystemSpec
    gemm: GemmTable
    context: AttentionTable
    generation: AttentionTable
    nccl: NcclTable | None
    backend: str
    root: Path
    #: Backend of each family's table when they differ (``generation_attention`` → ``sglang``).
    backends: dict[str, str] | None = None

    def backend_of(self, family: str) -> str:
        return (self.backends or {}).get(family, self.backend)


def load_kernel_tables(
    root: Path | str, system: str, backend: str, generation_backend: str | None = None
) -> KernelTables:
    """Read system.yaml, GEMM, context/generation attention and (if present) NCCL tables.

    ``generation_backend`` takes the decode-attention table from another backend (the
    built-in profiles use SGLang's: see docs/calibration.md); everything else comes from
    ``backend``.
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(
            "calibrate.from_tables", str(root), "an existing folder laid out as <system>/<family>/<backend>/<version>/"
        )
    spec = read_system(root, system)
    gpath, gver = find_table(root, system, "gemm", backend, "gemm_perf")
    cpath, cver = find_table(root, system, "attention", backend, "context_attention_perf")
    gen_backend = generation_backend or backend
    apath, aver = find_table(root, system, "attention", gen_backend, "generation_attention_perf")
    nccl = None
    nccl_dir = root / system / "comm" / "nccl"
    if nccl_dir.is_dir():
        want = spec.nccl_version if (nccl_dir / spec.nccl_version / "nccl_perf.parquet").is_file() else None
        npath, nver = find_table(root, system, "comm", "nccl", "nccl_perf", want)
        nccl = read_nccl(npath, nver)
    return KernelTables(
        spec,
        read_gemm(gpath, backend, gver),
        read_attention(cpath, "context", backend, cver),
        read_attention(apath, "generation", gen_backend, aver),
        nccl,
        backend,
        root,
        {"generation_attention": gen_backend} if gen_backend != backend else None,
    )


# --- Vidur CSVs -------------------------------------------------------------------------------


def _read_csv(path: Path, required: list[str]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ConfigError(KEY, str(path), "file not found")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(KEY, str(path), f"needs columns {', '.join(missing)}")
        return list(reader)


#: vLLM CPU work per step that is not hidden behind GPU work (Vidur's CPU-overhead model).
CPU_OVERHEAD_PARTS = (
    "schedule_median",
    "sampler_e2e_median",
    "prepare_inputs_e2e_median",
    "process_model_outputs_median",
    "ray_comm_time_mean",
)


@dataclass
class CpuOverheadTable:
    """Per-step CPU overhead (seconds, sum of :data:`CPU_OVERHEAD_PARTS`) by batch size and TP."""

    model: np.ndarray
    batch: np.ndarray
    tp: np.ndarray
    overhead_s: np.ndarray
    source: str


def read_cpu_overheads(path: Path | str = VIDUR_DIR / "historical/a100/cpu_overheads.csv") -> CpuOverheadTable:
    path = Path(path)
    rows = _read_csv(path, ["model_name", "batch_size", "tensor_parallel_degree", *CPU_OVERHEAD_PARTS])
    try:
        return CpuOverheadTable(
            model=np.array([r["model_name"] for r in rows]),
            batch=np.array([int(r["batch_size"]) for r in rows]),
            tp=np.array([int(r["tensor_parallel_degree"]) for r in rows]),
            overhead_s=np.array([sum(float(r[c]) for c in CPU_OVERHEAD_PARTS) for r in rows]) * 1e-3,
            source=str(path),
        )
    except ValueError as exc:
        raise ConfigError(KEY, str(path), f"numeric overhead columns ({exc})") from None


#: Vidur operator → the GEMM it times, as (n, k) of a Llama-style layer at TP ``tp``.
VIDUR_PROJECTIONS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


@dataclass
class VidurMlpTable:
    """Median per-layer operator times (seconds) by token count and TP, with the model's dims."""

    num_tokens: np.ndarray
    tp: np.ndarray
    times_s: dict[str, np.ndarray]
    dims: dict[str, int]
    source: str


def read_vidur_mlp(path: Path | str) -> VidurMlpTable:
    path = Path(path)
    need = [
        "num_tokens",
        "num_tensor_parallel_workers",
        "n_head",
        "n_kv_head",
        "n_embd",
        "n_expanded_embd",
        "use_gated_mlp",
    ] + [f"time_stats.{op}.median" for op in VIDUR_PROJECTIONS]
    rows = _read_csv(path, need)
    r0 = rows[0]
    dims = {
        "heads": int(r0["n_head"]),
        "kv_heads": int(r0["n_kv_head"]),
        "hidden": int(r0["n_embd"]),
        "intermediate": int(r0["n_expanded_embd"]),
        "gated": r0["use_gated_mlp"] == "True",
    }
    return VidurMlpTable(
        num_tokens=np.array([int(r["num_tokens"]) for r in rows]),
        tp=np.array([int(r["num_tensor_parallel_workers"]) for r in rows]),
        times_s={op: np.array([float(r[f"time_stats.{op}.median"]) for r in rows]) * 1e-3 for op in VIDUR_PROJECTIONS},
        dims=dims,
        source=str(path),
    )
