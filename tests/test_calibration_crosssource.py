"""Cross-source check: fits of the TensorRT-LLM GEMM tables predict Vidur's independently
measured per-layer projection times (Llama-2-7B, TP1, fp16 ≈ bf16 kernels), median ≤ 15 %."""

from __future__ import annotations

import numpy as np
import pytest

from _calib_helpers import tables
from calibration import fit as F
from calibration.tables import VIDUR_DIR, read_vidur_mlp

BOUND = 0.15


def projection_shapes(dims: dict) -> dict[str, tuple[int, int]]:
    """(n, k) of each Vidur operator for a Llama layer at TP1."""
    d = dims["hidden"] // dims["heads"]
    up = dims["intermediate"] * (2 if dims["gated"] else 1)
    return {
        "attn_pre_proj": ((dims["heads"] + 2 * dims["kv_heads"]) * d, dims["hidden"]),
        "attn_post_proj": (dims["hidden"], dims["hidden"]),
        "mlp_up_proj": (up, dims["hidden"]),
        "mlp_down_proj": (dims["hidden"], dims["intermediate"]),
    }


@pytest.mark.parametrize("gpu,system", [("a100", "a100_sxm"), ("h100", "h100_sxm")])
def test_vidur_projection_times(gpu, system):
    kt = tables(system)
    fit = F.fit_gemm(kt.gemm, kt.system.peak_flops, kt.system.mem_bw)
    vt = read_vidur_mlp(VIDUR_DIR / f"compute/{gpu}/meta-llama/Llama-2-7b-hf/mlp.csv")
    tp1 = vt.tp == 1
    errs = {}
    for op, (n, k) in projection_shapes(vt.dims).items():
        m = vt.num_tokens[tp1]
        pred = F.predict_gemm(fit, "bf16", m, n, k)
        errs[op] = F.relative_errors(pred, vt.times_s[op][tp1])
    allerr = np.concatenate(list(errs.values()))
    summary = {op: round(float(np.median(e)), 3) for op, e in errs.items()}
    assert np.median(allerr) <= BOUND, summary
