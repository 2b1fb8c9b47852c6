"""Fit the multi-head latent attention kernel constants (:class:`sim.cost.mla.MlaKernelFit`) on the
published ``generation_mla_perf`` / ``context_mla_perf`` tables, one fit per KV dtype.

The tables time DeepSeek-V3's MLA (latent 512, RoPE 64, heads 128 / TP wide 128 + 64 for QK and
128 for V) at 1–128 query heads per GPU; ``num_heads`` is the heads one GPU computes. Fitted by
:func:`calibration.fit.robust_log_fit` (log space, held-out scores).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from sim.catalog import MlaSpec
from sim.cost.mla import MlaKernelFit, mla_decode_s, mla_prefill_s
from sim.errors import ConfigError

from .fit import robust_log_fit

#: The shape the tables were measured at (DeepSeek-V3; Kimi-K2 has the same widths).
TABLE_MLA = MlaSpec(kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128, q_lora_rank=1536)
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
_KV_BYTES = {"bf16": 2.0, "fp8": 1.0}
_COLUMNS = ["kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency"]


def _predict(p: np.ndarray, rows: np.ndarray, kind: str, b, length, h, kv_bytes: float) -> np.ndarray:
    fit = MlaKernelFit(*np.exp(p))
    b, length, h = b[rows], length[rows], h[rows]
    if kind == "generation":
        return np.array([mla_decode_s(fit, x, x * n, int(k), TABLE_MLA, kv_bytes) for x, n, k in zip(b, length, h)])
    return np.array([mla_prefill_s(fit, x, n, int(k), TABLE_MLA) for x, n, k in zip(b, length, h)])


def fit_mla_table(path: Path | str, kind: str, bandwidth: float, flops: float, *, seed: int = 0) -> dict:
    """``{kv dtype: {"latency_s", "per_item_s", "bandwidth_bytes_per_s", "flops", "rows", "heldout_median",
    "heldout_p90", "source"}}``; ``kind`` is ``generation`` or ``context``; ``bandwidth`` (bytes/s) and
    ``flops`` (bf16 FLOP/s) are the GPU's peaks, the fit's starting point."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        t = pq.read_table(path, columns=_COLUMNS).to_pydict()
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError("calibrate.from_tables", str(path), f"an MLA table with {_COLUMNS} ({exc})") from None
    dtypes = np.array(t["kv_cache_dtype"])
    out: dict[str, dict] = {}
    for raw, kd in KV_DTYPES.items():
        idx = np.flatnonzero(dtypes == raw)
        if not len(idx):
            continue
        b = np.array(t["batch_size"], dtype=np.float64)[idx]
        h = np.array(t["num_heads"], dtype=np.float64)[idx]
        isl = np.array(t["isl"], dtype=np.float64)[idx]
        length = isl + np.array(t["step"], dtype=np.float64)[idx] if kind == "generation" else isl
        y = np.array(t["latency"], dtype=np.float64)[idx] * 1e-3

        predict = partial(_predict, kind=kind, b=b, length=length, h=h, kv_bytes=_KV_BYTES[kd])
        x0 = np.log([1.5e-5, 1e-9, 0.7 * bandwidth, 0.5 * flops])
        consts, scores = robust_log_fit(predict, y, x0, seed)
        out[kd] = {
            **{k: float(f"{v:.5g}") for k, v in MlaKernelFit(*consts).to_json().items()},
            **scores,
            "source": "/".join(path.parts[-5:]),
        }
    return out
