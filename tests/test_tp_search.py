"""``kvsim plan --tp``: one plan per tensor-parallel size, refused sizes with their reason, and the
size that needs the fewest GPUs (then serves the most per GPU, then is the smallest) chosen."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim.analysis.tp_search import choose, parse_tp, plan_tensor_parallel
from sim.errors import ConfigError


def test_parse_tp():
    assert parse_tp("auto") is None
    assert parse_tp(" 1, 2,4,2") == [1, 2, 4]
    for bad in ("", "0", "x", "1,,2", "65", "-1", "2.0"):
        with pytest.raises(ConfigError) as e:
            parse_tp(bad)
        assert str(e.value).startswith("--tp: got") and "1,2,4,8" in str(e.value)


def _row(tp, gpus, per_gpu, status="ok"):
    return {"tensor_parallel": tp, "status": status, "gpus_needed": gpus, "goodput_per_gpu_rps": per_gpu}


def test_choose_fewest_gpus_then_most_per_gpu_then_smallest():
    # Fewest GPUs wins over more goodput per GPU.
    assert choose([_row(1, 6, 3.0), _row(2, 4, 2.0), _row(4, 8, 5.0)], 12.0, 0.05) == 2
    # Equal GPU counts: the most per GPU (headroom), unless within the tolerance: then the smaller.
    assert choose([_row(2, 8, 1.05), _row(4, 8, 1.95), _row(8, 8, 1.79)], 8.0, 0.05) == 4
    assert choose([_row(2, 8, 1.9), _row(4, 8, 1.95)], 8.0, 0.05) == 2
    # Without a target rate: the most per GPU.
    assert choose([_row(1, None, 2.0), _row(2, None, 3.0)], None, 0.05) == 2
    # Refused sizes and sizes with no recommendation are never chosen.
    rows = [{"tensor_parallel": 1, "status": "refused"}, {"tensor_parallel": 2, "status": "none"}]
    assert choose(rows, 8.0, 0.05) is None


def test_sizes_that_do_not_fit_are_refused_with_the_reason():
    asked = []

    def run_plan(over):
        asked.append(over["gpu.tensor_parallel"])
        return {
            "replicas": 1,
            "recommendation": {"candidate": "paged", "text": "Use paged"},
            "candidates": [{"name": "paged", "goodput_rps": 2.0 * over["gpu.tensor_parallel"], "gpus_needed": 8}],
        }

    s = plan_tensor_parallel("chat-api", None, {"model.name": "llama-3.1-70b"}, run_plan, 8.0, 0.05)
    # 70B in bf16 does not fit one 80 GB GPU: TP1 is refused, and not planned.
    assert asked == [2, 4, 8]
    tp1 = s["sizes"][0]
    assert tp1["status"] == "refused" and "tensor_parallel 2, 4 or 8" in tp1["reason"]
    assert [r["goodput_per_gpu_rps"] for r in s["sizes"][1:]] == [2.0, 2.0, 2.0]
    assert s["chosen"] == 2 and set(s["plans"]) == {2, 4, 8}
    with pytest.raises(ConfigError) as e:
        plan_tensor_parallel("chat-api", [1], {"model.name": "llama-3.1-70b"}, run_plan, 8.0, 0.05)
    assert str(e.value).startswith("--tp: got '1'; a size that fits (TP1: gpu: got")


def test_plan_tp_end_to_end(tmp_path):
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "sim.cli.plan", "chat-api", "--slo", "ttft_p90_s=0.5", "--slo", "tpot_p90_s=0.05"]
    cmd += ["--set", "workload.num_requests=200", "--target-rate", "24", "--allocators", "paged,static"]
    cmd += ["--model", "qwen3-8b", "--tp", "1,2", "-w", "2", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    p = json.loads((out / "plan.json").read_text())
    assert p["model"] == "qwen3-8b"  # --model replaced the scenario's llama-3.1-8b
    rows = p["tensor_parallel_search"]
    assert [r["tensor_parallel"] for r in rows] == [1, 2] and all(r["status"] == "ok" for r in rows)
    assert p["tensor_parallel_chosen"] == choose(rows, 24.0, p["tolerance"]) == p["tensor_parallel"]
    for size in (1, 2):
        sub = json.loads((out / f"tp{size}" / "plan.json").read_text())
        assert sub["tensor_parallel"] == size and (out / f"tp{size}" / "plan.html").is_file()
        row = rows[size - 1]
        assert row["candidate"] == sub["recommendation"]["candidate"]
        assert row["gpus_needed"] == next(c for c in sub["candidates"] if c["name"] == row["candidate"])["gpus_needed"]
    text = " ".join(r.stdout.split())
    assert "Tensor-parallel sizes" in text and f"The plan at TP{p['tensor_parallel']}" in text
