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
    from bench.engine_profile import BLOCK, SHAPES, measure, priced_ms
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
        assert r["paged_priced_ms"] == pytest.approx(priced_ms(cost, chunks, decodes, kv))
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


# --- entry points: python -m bench NAME and python -m bench.hostile ---------------------------------


def _fake_hostile(monkeypatch):
    """``bench.hostile.run`` replaced by a recorder: the entry points, not the corpus, are tested."""
    sys.path.insert(0, str(ROOT))
    import bench.hostile as hostile

    calls = []

    def run(quick, out, classes=None, timeout_s=hostile.TIMEOUT_S):
        calls.append((quick, classes))
        return {"quick": quick, "wall_s": 0.0, "table": [], "cases": []}

    monkeypatch.setattr(hostile, "run", run)
    return hostile, calls


@pytest.mark.parametrize(
    "args,classes,name",
    [
        ([], None, "hostile.json"),
        (["--quick"], None, "hostile-quick.json"),
        (["--classes", "2,5"], {2, 5}, "hostile-classes-2-5.json"),
        (["--quick", "--classes", "5, 2"], {2, 5}, "hostile-quick-classes-2-5.json"),
    ],
)
def test_both_hostile_entry_points_take_the_same_options_and_write_the_same_file(
    monkeypatch, tmp_path, args, classes, name
):
    """The docstring's ``python -m bench hostile [--quick] [--classes 2,5]`` runs, and only the full
    corpus writes hostile.json (the result docs/scenario.md points to): a quick or partial run of
    either entry point writes a name of its own."""
    from bench.__main__ import main as bench_main

    hostile, calls = _fake_hostile(monkeypatch)
    assert hostile.__doc__.splitlines()[0].count("python -m bench hostile [--quick] [--classes 2,5]") == 1
    assert bench_main(["hostile", *args, "--out", str(tmp_path / "a")]) == 0
    assert hostile.main([*args, "--out", str(tmp_path / "b")]) == 0
    assert calls == [(("--quick" in args), classes)] * 2
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [name]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [name]


@pytest.mark.parametrize(
    "args", [["hostile", "--classes", "2,x"], ["hostile", "--classes", "10"], ["scale", "--classes", "2"]]
)
def test_bench_classes_option_is_checked(monkeypatch, capsys, args):
    from bench.__main__ import main as bench_main

    _, calls = _fake_hostile(monkeypatch)
    with pytest.raises(SystemExit) as e:
        bench_main(args)
    assert e.value.code == 2 and calls == []
    assert "--classes" in capsys.readouterr().err


def test_planner_bench_prints_a_line_per_scenario_and_candidate(monkeypatch, tmp_path, capsys):
    """``python -m bench planner`` runs for minutes: a line on stderr per scenario, per finished
    candidate and per plan tells a slow run from a hung one (plans replaced by a stub here)."""
    sys.path.insert(0, str(ROOT))
    import sim.analysis.planner as planner_mod
    from bench import planner

    def plan(scenario, slo, *, progress=None, search="guided", **kw):
        for i, name in enumerate(("paged", "static")):
            if progress:
                progress(i + 1, 2, name)
        cands = [{"name": n, "goodput_rps": 1.0, "status": "ok", "gpus_needed": 1} for n in ("paged", "static")]
        return {
            "cpu_s": 0.0,
            "simulations": 2,
            "simulated_requests": 20,
            "tolerance": 0.05,
            "candidates": cands,
            "recommendation": {"candidate": "paged"},
        }

    monkeypatch.setattr(planner_mod, "plan", plan)
    data = planner.run(True, tmp_path)
    assert data["all_same"] and (tmp_path / "planner.json").exists()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "planner: scenario 1/4: chat-api @ 40 req/s"
    assert sum(x.startswith("planner: scenario ") for x in err) == len(planner.QUICK)
    per_plan = 2 * planner.QUICK_REPEATS * len(planner.QUICK)
    assert sum(" candidate " in x for x in err) == 2 * per_plan
    assert sum(": planned in " in x for x in err) == per_plan
    assert err[1].startswith("planner: chat-api exhaustive 1/3: candidate 1/2 (paged) done, ")


def test_bench_help_does_not_promise_a_minute_for_the_planner(capsys):
    """``--quick`` of ``planner`` plans four scenarios six times each: minutes, which the help says."""
    sys.path.insert(0, str(ROOT))
    from bench.__main__ import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "small variants (each under a minute)" not in text and "planner --quick about 1.5 min" in text
