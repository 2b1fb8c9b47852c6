"""The deterministic benchmark counter (``python -m bench opcount``) counts the same every run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # holds the repository's bench/ package

_CHILD = """
import json
from bench.opcount import count
print(json.dumps([count("bench-1m", 60), count("bench-1m", 60)]))
"""


def test_opcount_is_deterministic_and_names_the_engine():
    # The interpreted engine (bytecodes are what it counts), whether or not a compiled build exists.
    p = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=ROOT,
        env=dict(os.environ, KVSIM_NATIVE="0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = json.loads(p.stdout.strip().splitlines()[-1])
    assert a["bytecodes_per_request"] == b["bytecodes_per_request"] > 100
    assert a["top"] == b["top"]
    assert any(t["function"].startswith("replica.py:") for t in a["top"])
    assert 1 <= a["sim_events_per_request"] < 10


def test_costmodel_bench_records_the_engines_calls(tmp_path):
    # It records through a CostModel subclass (the compiled engine takes nothing else), every kind
    # of call the engine makes, each once: a window priced internally through decode_times_s is
    # not recorded a second time.
    sys.path.insert(0, str(ROOT))
    from bench.costmodel import run

    data = run(True, tmp_path)
    assert data["mixed_step_calls"] > 0 and data["decode_window_calls"] > 0
    assert data["calls"] == data["engine_batch_changes"]  # one pricing call per batch change, none twice
    assert data["seconds"]["profile_warm"] > 0 and (tmp_path / "costmodel.json").exists()


def test_host_modes_bench_tabulates_every_kind(tmp_path):
    """``bench host-modes``: every iteration kind timed in each round, split by the probe's speed;
    the probe over itself is 1 by construction. No time budget: the three rounds the split needs are
    run however slow the host is."""
    pytest.importorskip("torch")
    from bench.host_modes import KINDS, run

    res = run(True, tmp_path, seconds=0.0)
    assert res["rounds"] == 3 and set(res["kinds"]) == set(KINDS)
    probe = res["kinds"]["probe"]
    assert probe["over_probe_fast"] == 1.0 and probe["over_probe_slow"] == 1.0
    assert all(k["fast_ms"] > 0 and k["slow_ms"] > 0 for k in res["kinds"].values())
    # a 256-token prefill costs more than a one-sequence decode on any host
    assert res["kinds"]["prefill 256"]["fast_ms"] > res["kinds"]["decode 1"]["fast_ms"]


def test_decode_spread_bench_times_the_same_work(tmp_path):
    """``bench decode-spread``: the three layouts of the paged decode kernel compute the same attention
    (so their times compare like for like), every batch and layout is timed, and the spread ÷ uniform
    ratios are reported for both batch sizes."""
    pytest.importorskip("torch")
    from bench.decode_spread import LAYOUTS, run

    res = run(True, tmp_path, rounds=1)
    assert res["max_rel_diff"] < 1e-5
    assert all(res["batches"][b][lay]["us"] > 0 for b in res["batches"] for lay in LAYOUTS)
    assert set(res["spread_over_uniform"]) == {16, 8}
    assert all(set(r) == set(LAYOUTS) for r in res["spread_over_uniform"].values())


def test_engine_profile_bench_times_every_shape_on_both_layouts():
    """``bench.engine_profile``: every batch shape is timed through the engine on both layouts and as a
    plain forward, the decode batch whose length changes every call is timed call by call, and the
    profiler names the operators (the GEMMs lead a prefill on any host)."""
    pytest.importorskip("torch")
    from bench.engine_profile import BLOCK, SHAPES, _priced_ms, measure
    from calibration.kernels.engine_overhead import kernel_cost
    from sim.catalog import get_model
    from sim.cost.profile import load_profile

    res = measure("cpu", "tiny-llama", "sdpa", "fp32", reps=1, progress=lambda *_: None, profile="cpu-reference")
    cost = kernel_cost(load_profile("cpu-reference"), get_model("tiny-llama"), "paged", BLOCK)
    assert [r["shape"] for r in res["rows"]] == [s[0] for s in SHAPES["cpu"]]
    for r, (_, chunks, decodes, kv) in zip(res["rows"], SHAPES["cpu"]):
        assert r["new_tokens"] == sum(n for _, n in chunks) + decodes
        assert r["plain_forward_ms"] > 0 and r["paged_ms"] > 0 and r["static_ms"] > 0
        # the kernel price is the profile's step time for this very batch
        assert r["paged_priced_ms"] == pytest.approx(_priced_ms(cost, chunks, decodes, kv))
    prices = [r["paged_priced_ms"] for r in res["rows"]]
    assert prices[0] > prices[2] > 0  # a 256-token prefill costs more than 8 decodes on any profile
    assert len(res["churn_paged_ms"]) == len(res["churn_static_ms"]) == 12
    for which in ("paged", "static", "plain"):
        ops = [o["op"] for o in res[f"top_ops_{which}"]["ops"]]
        assert any(op in ("aten::mm", "aten::addmm", "aten::linear") for op in ops[:3]), ops


def test_calibration_torch_leaves_cudnn_attention_off():
    """The reference engine and the kernels it is priced by never run cuDNN's SDPA (a new execution
    plan per shape: docs/validation.md, "On a GPU"), whichever module imported torch first."""
    pytest.importorskip("torch")
    from calibration.kernels import import_torch

    torch = import_torch()
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert import_torch().backends.cuda.cudnn_sdp_enabled() is False
