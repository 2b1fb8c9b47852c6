"""Fit the fused mixture-of-experts kernel constants (:class:`sim.cost.moe.MoeKernelFit`) on a
published ``moe_perf.parquet`` table, one fit per weight dtype.

Rows: what ``calibration/vendor_data.py`` keeps (power-law routing, no expert parallelism, expert
tensor parallelism up to 8, gated experts). Where a table timed several kernels for one dtype, the
one with the most rows is fitted (the engine's general path; the others cover a few shapes).
The constants are fitted by :func:`calibration.fit.robust_log_fit` (log space, held-out scores).

Each fit also keeps the table's own latency curve of every shape it measured (``shapes``: hidden
size, expert width, experts per token, experts and expert TP → seconds vs tokens), which prices a
model of exactly that shape in place of the form.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from sim.catalog import DTYPE_BYTES
from sim.cost.moe import MoeKernelFit, moe_layer_s, moe_shape_key
from sim.errors import ConfigError

from .fit import robust_log_fit

#: Table dtype names -> kvsim weight dtypes.
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "w4a16_mxfp4": "mxfp4"}
#: Engine -> kvsim dtype -> the table dtype that engine runs instead, where its table times it.
#: TensorRT-LLM runs MXFP4 experts with MXFP8 activations on Blackwell (its default TRTLLM MoE
#: backend; its gpt-oss deployment guide), bf16 activations on Hopper (Triton), whose tables time
#: no w4a8 rows. Its weight-only rows on B200 are another, slower path (4-6x at 64 tokens).
ENGINE_MOE_DTYPES = {"trtllm": {"mxfp4": "w4a8_mxfp4_mxfp8"}}
#: The tensor-core format a table dtype computes in, where it is not the weight dtype's.
_COMPUTE = {"w4a8_mxfp4_mxfp8": "fp8"}
_COLUMNS = [
    "kernel_source",
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
]


def _predict(p: np.ndarray, rows: np.ndarray, cols: dict, wbytes: float) -> np.ndarray:
    fit = MoeKernelFit(*np.exp(p))
    return np.array(
        [
            moe_layer_s(fit, t, int(e), int(k), int(h), w / tp, wbytes)
            for t, h, w, k, e, tp in zip(
                cols["num_tokens"][rows],
                cols["hidden_size"][rows],
                cols["inter_size"][rows],
                cols["topk"][rows],
                cols["num_experts"][rows],
                cols["moe_tp_size"][rows],
            )
        ]
    )


def fit_moe_table(
    path: Path | str, bandwidth: float, flops_of: dict[str, float], *, seed: int = 0, engine: str | None = None
) -> dict:
    """``{dtype: {"kernel", "latency_s", "per_expert_s", "bandwidth_bytes_per_s", "flops", "rows",
    "heldout_median", "heldout_p90", "source"}}`` for each dtype of the table; ``bandwidth`` (bytes/s)
    and ``flops_of[dtype]`` (FLOP/s) are the GPU's peaks, the starting point of the fit; ``engine``
    (the table's) picks the rows it runs where it runs another format (:data:`ENGINE_MOE_DTYPES`)."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path, columns=[*_COLUMNS, "latency"]).to_pydict()
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError("calibrate.from_tables", str(path), f"a moe_perf table with {_COLUMNS} ({exc})") from None
    out: dict[str, dict] = {}
    kernels = np.array(table["kernel_source"])
    dtypes = np.array(table["moe_dtype"])
    for listed, dtype in MOE_DTYPES.items():
        runs = ENGINE_MOE_DTYPES.get(engine or "", {}).get(dtype)
        raw = runs if runs is not None and (dtypes == runs).any() else listed
        at = dtypes == raw
        if not at.any():
            continue
        names, counts = np.unique(kernels[at], return_counts=True)
        kernel = str(names[int(np.argmax(counts))])
        idx = np.flatnonzero(at & (kernels == kernel))
        cols = {c: np.array(table[c], dtype=np.float64)[idx] for c in _COLUMNS[2:]}
        y = np.array(table["latency"], dtype=np.float64)[idx] * 1e-3
        wbytes = DTYPE_BYTES[dtype]
        # weight-only formats compute in bf16
        peak = flops_of.get(_COMPUTE.get(raw, dtype)) or flops_of["bf16"]
        x0 = np.log([3e-5, 3e-7, 0.7 * bandwidth, 0.4 * peak])
        consts, scores = robust_log_fit(partial(_predict, cols=cols, wbytes=wbytes), y, x0, seed)
        fit = MoeKernelFit(*consts)
        shapes: dict[str, dict] = {}
        keys = list(
            zip(*(cols[c].astype(int) for c in ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")))
        )
        for key in sorted(set(keys)):
            at = [i for i, k in enumerate(keys) if k == key]
            tokens = cols["num_tokens"][at]
            order = np.argsort(tokens)
            x, t = tokens[order], y[at][order]
            if len(x) >= 4 and np.all(np.diff(x) > 0):
                shapes[moe_shape_key(*key)] = {"x": [int(v) for v in x], "t_s": [float(f"{v:.5g}") for v in t]}
        out[dtype] = {
            "kernel": kernel if raw == listed else f"{kernel} ({raw})",
            **{k: float(f"{v:.5g}") for k, v in fit.to_json().items()},
            **scores,
            "source": "/".join(path.parts[-5:]),
            "shapes": shapes,
        }
    return out
