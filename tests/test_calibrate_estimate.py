"""``kvsim calibrate --device`` says how long its timing will take before it starts: the estimate's
arithmetic over a planned set (no kernel timed), the line the CLI prints, the warning of a long run;
and the shared pieces its writer and the result readers use (staged outputs, JSON documents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.kernels import estimate as E
from calibration.kernels.plan import Plan
from sim.cli.interrupts import run_app

PLAN = Plan(
    gemm_m=(1,),
    ctx_batch=(1,),
    ctx_len=(16,),
    ctx_max_tokens=16,
    gen_batch=(1,),
    gen_len=(16,),
    gen_max_kv_bytes=1 << 20,
    block_sizes=(),
    overhead_batch=(1,),
    mem_bytes=(1 << 12,),
    ew_tokens=(1,),
    repeats=7,
    warmup=2,
    target_repeat_s=1e-3,
    passes=3,
)
RATES = E.Rates(
    gemm_flops_per_s=1e11,
    bytes_per_s=1e10,
    op_s=1e-5,
    fill_bytes_per_s=1e8,
    prefill_flops_per_s=1e10,
    prefill_call_s=2e-5,
    decode_flops_per_s=1e9,
    decode_call_s=1e-5,
)
ROTATE = 8 << 20


def test_estimate_follows_the_timing_loop():
    # A short call: loops of ``inner`` calls fill the repeat target, 7 repeats, warm-up over 8 sets.
    short = E.Work.stream(1e4)  # 1e-5 s host + 1e-6 s memory
    call = 1e-5 + 1e-6
    inner = round(1e-3 / call)
    build = 8 * 1e4 / (1e10 / 2)
    assert E.point_s(short, RATES, PLAN, ROTATE) == pytest.approx(
        E.POINT_OVERHEAD_S + build + (8 + 1 + 7 * inner) * call
    )
    # A long call (1 s of GEMM): one call a repeat, repeats cut to 3, one set of fresh operands.
    m, n, k = 4096, 4096, 2980
    long = E.Work.gemm(m, n, k, 2)
    call = 1e-5 + 2.0 * m * n * k / 1e11
    assert long.fresh and call > 0.9
    build = long.set_bytes / 1e8
    assert E.point_s(long, RATES, PLAN, ROTATE) == pytest.approx(E.POINT_OVERHEAD_S + build + (2 + 1 + 3) * call)
    est = E.estimate_run([short, long], PLAN, RATES, ROTATE)
    assert (est.points, est.passes) == (2, 3)
    assert est.seconds == pytest.approx(3 * sum(E.point_s(w, RATES, PLAN, ROTATE) for w in (short, long)))


def test_estimate_prices_attention_by_its_own_rates():
    paged = E.Work.decode(4, 1024, 8, 4, 64, 2, kernels=4, ops=8, gathered=True)
    kv = 2.0 * 4 * 1024 * 4 * 64 * 2
    expect = 8 * 1e-5 + 4 * 1e-5 + 2 * kv / 1e10 + max(4.0 * 4 * 8 * 1024 * 64 / 1e9, kv / 1e10)
    assert RATES.call_s(paged) == pytest.approx(expect)
    pre = E.Work.prefill(2, 512, 8, 4, 64, 2)
    assert RATES.call_s(pre) == pytest.approx(2e-5 + 2.0 * 2 * 8 * 512 * 512 * 64 / 1e10)


def test_a_long_run_is_announced_with_ways_to_shorten_it():
    (line,) = E.Estimate(219, 3, 44.0).lines(device="cpu", quick=True)
    assert line.startswith("calibrate: 219 points × 3 passes; estimated timing 44 s")
    first, warn = E.Estimate(207, 3, 2.5 * 3600).lines(device="cpu", quick=False)
    assert "estimated timing 2.5 h" in first
    assert "over 30 min; proceeding" in warn and "--quick" in warn and "--threads" in warn
    (_, warn) = E.Estimate(207, 2, 3600).lines(device="cuda", quick=True)
    assert "--quick" not in warn and "--threads" not in warn
    assert [E.format_duration(s) for s in (12, 450, 7200)] == ["12 s", "7.5 min", "2.0 h"]


def test_cli_prints_the_estimate_before_timing(tmp_path, monkeypatch, capsys):
    """The line comes before the first point is built (here the first point fails at once)."""
    pytest.importorskip("torch")
    from calibration.kernels import timing
    from sim.cli.main import app

    def no_memory(self, *args, **kw):
        raise RuntimeError("not enough memory")

    monkeypatch.setattr(timing.Bench, "gemm_calls", no_memory)
    args = ["calibrate", "--device", "cpu", "--model", "tiny-llama", "--quick", "--no-report"]
    rc = run_app(app, [*args, "--out", str(tmp_path / "cpu.json")])
    out = capsys.readouterr().out
    assert rc == 2
    assert "calibrate: 219 points × 3 passes; estimated timing " in out, out


# --- the staged writer the calibration outputs share --------------------------------------------


def test_staged_moves_named_dot_files_and_removes_at_commit(tmp_path):
    from sim.output.staging import staged

    stale = tmp_path / "old.html"
    stale.write_text("old")
    gone: list[Path] = []
    with staged(tmp_path, only=[".x.json", "y.json"], remove=gone) as stage:
        (stage / ".x.json").write_text("x")
        (stage / "z.json").write_text("not named: stays behind")
        assert stale.exists()
        gone.append(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.json"]
    # default: dot-named files are a writer's temporaries and stay behind
    with staged(tmp_path) as stage:
        (stage / ".tmp").write_text("t")
        (stage / "a.json").write_text("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.json", "a.json"]
    # a failed block removes nothing
    keep = tmp_path / "a.json"
    with pytest.raises(KeyboardInterrupt), staged(tmp_path, remove=[keep]):
        raise KeyboardInterrupt
    assert keep.exists() and not any(p.name.startswith(".staging") for p in tmp_path.iterdir())


def test_calibrate_writes_a_dot_named_profile_and_its_sidecars(tmp_path):
    pytest.importorskip("pyarrow")
    from calibration.kernels import DeviceResult, Measurements, write_outputs
    from sim.cost.profile import load_profile

    meas = Measurements()
    meas.rows.append({"family": "gemm", "kernel": "qkv", "m": 1, "median_s": 1e-5, "min_s": 1e-5, "max_s": 1e-5})
    files = write_outputs(DeviceResult(load_profile("cpu-reference"), meas, {}, 0.0), tmp_path / ".x.json", None, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.json", ".x.measurements.parquet"]
    assert files["removed"] is None and load_profile(tmp_path / ".x.json").name == "cpu-reference"


# --- the one splitter of several JSON documents in a file ---------------------------------------


def test_json_documents_anywhere_or_one_per_line():
    from sim.analysis.bench_results import json_documents

    text = '{"a": 1}\n\n{"b":\n 2} [3]\n'
    assert json_documents(text) == [(1, {"a": 1}), (3, {"b": 2}), (4, [3])]
    with pytest.raises(json.JSONDecodeError) as e:
        json_documents('{"a": 1}\n{broken\n')
    assert e.value.lineno == 2
    seen = []
    got = json_documents('{"a": 1}\n\n[2]\n', one_per_line=True, parse=lambda ln, n: seen.append(n) or ln)
    assert got == [(1, '{"a": 1}'), (3, "[2]")] and seen == [1, 3]


def test_serving_runs_name_a_line_that_is_no_object_before_a_later_broken_one(tmp_path):
    from calibration.serving_bench import result_documents
    from sim.errors import ConfigError

    p = tmp_path / "runs.json"
    p.write_text('{"a": 1}\n[1, 2]\n{broken\n')
    with pytest.raises(ConfigError, match=r"runs\.json: line 2: got 'list'"):
        result_documents(p)
    p.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert result_documents(p) == [("line 1", {"a": 1}), ("line 3", {"b": 2})]
