"""``kvsim profile diff``: the built-in H200 profile's GEMMs against a profile timed on an H200.

The built-in's GEMM curves come from TensorRT-LLM's and SGLang's kernel tables; the device profile
(tests/data/device) timed the same products through torch (cuBLAS) with ``kvsim calibrate``'s
device route on one H200. The two agree where both measured: median |ratio - 1| 4.4 % over 24
points, the o projection at 1-32 tokens the outlier (1.5-1.6x, the device's 4096x4096 GEMM at
launch-bound sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.profile_diff import PROJECTIONS, TOKENS, gemm_rows, summary
from sim.cli.main import app
from sim.errors import ConfigError

H200 = str(Path(__file__).parent / "data" / "device" / "h200-reference-sdpa.json")


def test_builtin_h200_gemms_match_a_real_h200_calibration():
    rows = gemm_rows(H200, "h200-sxm", "llama-3.1-8b")
    assert len(rows) == len(PROJECTIONS) * len(TOKENS)
    s = summary(rows)
    # the validation grid timed 1-2,048 tokens; the built-in's lm_head is a shape its tables lack
    assert s["n_measured"] == 4 * 6
    assert s["median_abs_diff_measured"] < 0.06
    big = [r for r in rows if not r.outside and r.tokens >= 512]
    assert all(abs(r.ratio - 1) < 0.10 for r in big), [(r.proj, r.tokens, r.ratio) for r in big]


def test_a_profile_against_itself_is_exact_and_tp_shards_the_gemms():
    rows = gemm_rows("h200-sxm", "h200-sxm", "llama-3.1-8b")
    assert all(r.ratio == 1 for r in rows) and summary(rows)["median_abs_diff"] == 0
    tp1 = {(r.proj, r.tokens): r.b_s for r in rows}
    tp2 = gemm_rows("h200-sxm", "h200-sxm", "llama-3.1-8b", tensor_parallel=2)
    assert all(r.b_s < tp1[(r.proj, r.tokens)] for r in tp2 if r.tokens >= 2048 and r.proj != "lm_head")


def test_cli_table_json_and_errors():
    runner = CliRunner()
    r = runner.invoke(app, ["profile", "diff", H200, "h200-sxm"])
    assert r.exit_code == 0, r.output
    assert "median |A/B - 1|" in r.output and "over the 24 points both profiles measured" in r.output
    r = runner.invoke(app, ["profile", "diff", H200, "h200-sxm", "--json"])
    doc = json.loads(r.output)
    assert doc["summary"]["n_measured"] == 24 and doc["rows"][0]["proj"] == "qkv"
    r = runner.invoke(app, ["profile", "diff", H200, "no-such-profile"])
    assert r.exit_code != 0
    assert "profile B: got 'no-such-profile'; a built-in profile" in r.output + str(r.exception)


def test_a_shape_the_device_profile_did_not_time_is_refused_by_name():
    # the device profile timed llama-3.1-8b's shapes only (no fitted families to derive others)
    with pytest.raises(
        ConfigError, match=r"profile A: .*GEMM qkv shape 10240x8192:bf16.*llama-3.1-70b.*llama-3.1-8b@tp1"
    ):
        gemm_rows(H200, "h200-sxm", "llama-3.1-70b")


@pytest.mark.parametrize("tp", [3, 16])
def test_a_tensor_parallelism_kvsim_does_not_run_is_the_options_error(tp):
    """Not 'profile A' (neither profile is at fault)."""
    with pytest.raises(ConfigError, match=rf"^--tp: got {tp}; 1, 2, 4 or 8"):
        gemm_rows("h100-sxm", "h200-sxm", "llama-3.1-8b", tensor_parallel=tp)
