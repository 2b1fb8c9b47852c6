"""Route 1: ``kvsim calibrate --device cpu --quick`` on tiny-llama times real torch kernels,
fits a profile the simulator loads, and the fitted curves predict re-measured off-grid points.

One calibration run (module fixture, < 60 s on a 2-core host) serves every test here.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")

# Wall-clock measurements: ./dev test runs these after the parallel phase, alone on the machine.
pytestmark = pytest.mark.timing

from calibration import kernels as K  # noqa: E402
from sim.catalog import get_gpu, get_model  # noqa: E402
from sim.config import scenario_from_dict  # noqa: E402
from sim.cost.model import BatchShape, Layout  # noqa: E402
from sim.cost.profile import list_profiles, load_profile  # noqa: E402
from sim.cost.profile_model import ProfileCostModel  # noqa: E402
from sim.engine.cluster import simulate  # noqa: E402
from sim.errors import ConfigError  # noqa: E402

TINY = get_model("tiny-llama")
CPU = get_gpu("cpu")
HELDOUT_BOUND = 0.15
QUICK_BUDGET_S = 60.0


def _app():
    import typer

    from calibration.cli import calibrate_command

    app = typer.Typer()
    app.command("calibrate")(calibrate_command)
    app.command("noop")(lambda: None)
    return app


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib") / "cpu.json"
    t0 = time.perf_counter()
    r = CliRunner().invoke(
        _app(), ["calibrate", "--device", "cpu", "--model", "tiny-llama", "--quick", "--out", str(out)]
    )
    wall = time.perf_counter() - t0
    assert r.exit_code == 0, (r.output, r.exception)
    return out, wall, r.output


def test_quick_run_writes_profile_sidecar_and_report(quick):
    out, wall, output = quick
    assert wall < QUICK_BUDGET_S, f"quick CPU calibration took {wall:.1f} s"
    p = load_profile(out)
    prov = p.provenance
    assert prov["method"] == "torch kernel timing"
    assert prov["device_info"]["torch"] == torch.__version__ and prov["device_info"]["host_cpu"]
    assert prov["device_info"]["threads"] == 1 and prov["date"]
    for fam in ("gemm", "context_attention", "generation_attention"):
        q = p.fit_quality[fam]["overall"]
        assert q["n"] > 0 and np.isfinite(q["median_rel_err"])
    assert set(p.memory["curves"]) == {"zero_fill", "copy", "host_transfer"}
    assert p.layout["paged_overhead_by_block_size"]
    # auto on a CPU: the sdpa backend, named with its version wherever the attention curves are described
    att = prov["attention_backend"]
    assert att["name"] == "sdpa" and att["version"] == torch.__version__
    assert prov["backend_versions"]["generation_attention"] == f"sdpa {torch.__version__}"
    assert p.layout["measured_kernel"].startswith(f"sdpa {torch.__version__}: gather")
    pq_path, html = K.sidecar_paths(out)
    import pyarrow.parquet as pq

    raw = pq.read_table(pq_path).to_pydict()
    fams = set(raw["family"])
    assert {
        "gemm",
        "context_attention",
        "generation_attention",
        "memory",
        "elementwise",
        "alloc",
        "cpu_overhead",
    } <= fams
    assert all(t > 0 for t in raw["median_s"])
    try:
        import plotly  # noqa: F401

        assert html.is_file() and "plotly" in html.read_text()[:200_000].lower()
    except ImportError:
        assert not html.exists()


def test_profile_drives_a_simulation(quick):
    out, _, _ = quick
    sc = scenario_from_dict(
        {
            "name": "cpu-profile",
            "seed": 1,
            "model": {"name": "tiny-llama"},
            "gpu": {"name": "cpu"},
            "workload": {
                "num_requests": 40,
                "max_model_len": 1024,
                "arrival": {"kind": "poisson", "rate": 20.0},
                "lengths": {"kind": "uniform", "prompt_min": 16, "prompt_max": 400, "output_min": 4, "output_max": 64},
            },
            "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 1024},
            "cost_model": {"profile": str(out)},
        }
    )
    res = simulate(sc)
    s = res.summary
    assert json.dumps(s)
    assert res.requests.num_rows == 40
    name = load_profile(out).name
    assert name in json.dumps(s)


def test_cost_model_uses_measured_memory_and_layout(quick):
    out, _, _ = quick
    p = load_profile(out)
    paged = ProfileCostModel(p, TINY, CPU, layout=Layout(paged=True, block_size=16))
    contig = ProfileCostModel(p, TINY, CPU, layout=Layout(paged=False))
    kv = np.array([8 * 512.0])
    ratio = paged.decode_times_s(8, kv)[0] / contig.decode_times_s(8, kv)[0]
    assert ratio > 1.0  # gathering blocks costs something on a CPU
    assert paged.copy_time_s(1 << 20) > 0 and paged.zero_fill_time_s(1 << 26) > paged.zero_fill_time_s(1 << 12)
    assert paged.alloc_time_s(10) == pytest.approx(10 * paged.alloc_time_s(1))
    step = paged.step_time_s(BatchShape(prefill_chunks=[(128, 0)], decode_seqs=4, decode_kv_tokens=800))
    assert 0 < step < 1.0


def test_heldout_points_remeasured(quick):
    """Points between the quick grid's points, re-measured (median of repeats over 5 interleaved passes).

    Bound: the median error over the four points ≤ 15 %, none over 50 % (a miss is measured once
    more). The same passes re-measure the grid points on either side of each held-out point: their
    ratio to the profile is the host's speed now versus during calibration (on a shared 2-core
    host it moves by tens of percent between the two, 2x was seen), and the held-out prediction
    is scaled by it, so what is tested is the curve between grid points, not the host's drift.
    """
    out, _, _ = quick
    p = load_profile(out)
    h, kvh, d = TINY.heads, TINY.kv_heads, TINY.head_dim
    keys = ProfileCostModel(p, TINY, CPU).keys
    gate_n, gate_k = (int(x) for x in keys.gate_up.split(":")[0].split("x"))
    plan = K.make_plan("cpu", TINY, quick=True)

    def gemm_gu(m):
        return (lambda b: b.gemm_calls(m, gate_n, gate_k), lambda: p.gemm[keys.gate_up](np.array([float(m)]))[0][0])

    def gemm_qkv(m):
        return (lambda b: b.gemm_calls(m, 512, 256), lambda: p.gemm[keys.qkv](np.array([float(m)]))[0][0])

    def dec(bt, L):
        return (
            lambda b: b.decode_calls(bt, L, h, kvh, d, K.REFERENCE_BLOCK_SIZE),
            lambda: p.generation_attention[keys.attention](bt, np.array([float(L)]))[0][0],
        )

    def pre(bt, L):
        return (
            lambda b: b.context_calls(bt, L, h, kvh, d),
            lambda: p.context_attention[keys.attention](bt, np.array([float(L)]))[0][0],
        )

    # held-out point -> (its measurement, neighbouring grid points that set the host-speed factor)
    cases = {
        "gemm gate_up m=96": (gemm_gu(96), [gemm_gu(64), gemm_gu(128)]),
        "gemm qkv m=384": (gemm_qkv(384), [gemm_qkv(256), gemm_qkv(512)]),
        "decode paged b=6 L=384": (dec(6, 384), [dec(4, 256), dec(8, 512)]),
        "prefill b=3 s=96": (pre(3, 96), [pre(2, 64), pre(4, 128)]),
    }
    for m in (96, 384):
        assert m not in plan.gemm_m
    for m in (64, 128, 256, 512):
        assert m in plan.gemm_m
    assert 6 not in plan.gen_batch and 384 not in plan.gen_len and 3 not in plan.ctx_batch and 96 not in plan.ctx_len
    assert {4, 8} <= set(plan.gen_batch) and {256, 512} <= set(plan.gen_len)
    assert {2, 4} <= set(plan.ctx_batch) and {64, 128} <= set(plan.ctx_len)
    flat = []
    for held, grid in cases.values():
        flat += [held, *grid]
    attempts = []
    for _ in range(2):  # a miss is measured once more: one noisy spell on a shared host is not a verdict
        bench = K.Bench.open("cpu", repeats=plan.repeats, warmup=plan.warmup, target_repeat_s=plan.target_repeat_s)
        try:
            timings = bench.measure([lambda f=f, bench=bench: f(bench) for f, _ in flat], passes=5)
        finally:
            bench.close()
        errs = {}
        for i, label in enumerate(cases):
            (_, pred), grid = flat[3 * i], flat[3 * i + 1 : 3 * i + 3]
            t_held = timings[3 * i].median_s
            speed = float(
                np.sqrt(np.prod([timings[3 * i + 1 + j].median_s / float(g[1]()) for j, g in enumerate(grid)]))
            )
            errs[label] = abs(float(pred()) * speed - t_held) / t_held
            print(
                f"{label}: predicted {float(pred()) * 1e6:.1f} us x host speed {speed:.2f} vs re-measured "
                f"{t_held * 1e6:.1f} us"
            )
        attempts.append({k: f"{v:.1%}" for k, v in errs.items()})
        median = float(np.median(list(errs.values())))
        if median <= HELDOUT_BOUND and max(errs.values()) <= 0.5:
            break
    # The median over the four held-out points is held to the 15 % bound; a single point may stray
    # further (the 384-token GEMM measured up to 44 % off its smooth neighbours within one pass on
    # this shared host) but never beyond 50 %.
    assert median <= HELDOUT_BOUND and max(errs.values()) <= 0.5, attempts


# --- errors --------------------------------------------------------------------------------


def test_unknown_device(tmp_path):
    r = CliRunner().invoke(
        _app(), ["calibrate", "--device", "tpu", "--model", "tiny-llama", "--out", str(tmp_path / "x.json")]
    )
    assert isinstance(r.exception, ConfigError)
    assert "calibrate.device" in str(r.exception) and "tpu" in str(r.exception) and "cpu, cuda" in str(r.exception)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda(tmp_path):
    r = CliRunner().invoke(
        _app(), ["calibrate", "--device", "cuda", "--model", "tiny-llama", "--out", str(tmp_path / "x.json")]
    )
    assert isinstance(r.exception, ConfigError)
    assert "calibrate.device" in str(r.exception) and "CUDA" in str(r.exception)
    assert not (tmp_path / "x.json").exists()


def test_model_not_in_catalog(tmp_path):
    r = CliRunner().invoke(
        _app(), ["calibrate", "--device", "cpu", "--model", "gpt-17", "--out", str(tmp_path / "x.json")]
    )
    assert isinstance(r.exception, ConfigError)
    # named as the option (what kvsim run --model takes: a catalog name, a config.json path or a shipped id)
    assert str(r.exception).startswith("--model: got 'gpt-17'; a catalog model") and "tiny-llama" in str(r.exception)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--device", "cpu", "--kernels", "triton"], "one of auto, flex, flashinfer, vllm, sdpa"),
        (["--device", "cpu", "--kernels", "flashinfer"], "CUDA only.*available: sdpa, flex"),
        (["--from-tables", "calibration/data/gpu-kernels", "--kernels", "flex"], "auto with --from-tables"),
    ],
)
def test_kernels_option_errors(tmp_path, args, match):
    r = CliRunner().invoke(_app(), ["calibrate", *args, "--model", "tiny-llama", "--out", str(tmp_path / "x.json")])
    assert isinstance(r.exception, ConfigError)
    assert "calibrate.kernels" in str(r.exception)
    import re

    assert re.search(match, str(r.exception)), str(r.exception)
    assert not (tmp_path / "x.json").exists()


def test_fp8_not_timed(tmp_path):
    r = CliRunner().invoke(
        _app(),
        ["calibrate", "--device", "cpu", "--model", "tiny-llama", "--dtype", "fp8", "--out", str(tmp_path / "x.json")],
    )
    assert isinstance(r.exception, ConfigError) and "calibrate.dtype" in str(r.exception)


# --- the shipped cpu-reference profile ------------------------------------------------------


def test_cpu_reference_builtin():
    assert "cpu-reference" in list_profiles()
    p = load_profile("cpu-reference")
    assert p.provenance["method"] == "torch kernel timing"
    cm = ProfileCostModel(p, TINY, CPU)
    t = cm.decode_times_s(8, np.array([8 * 256.0, 8 * 1024.0]))
    assert np.all(t > 0) and t[1] > t[0]


def test_host_speed_applies_per_sample_when_passes_differ_in_length():
    """``samples`` picks each pass's repeat count from that pass's own estimate, so one point's
    passes can hold different numbers of samples; every sample takes the host-speed factor of the
    moment its pass ended (this once raised IndexError, or paired samples with another pass's time)."""
    bench = K.Bench.open("cpu", repeats=3, warmup=0, target_repeat_s=1e-5)
    try:
        counts = iter([2, 5, 3])
        bench.samples = lambda calls, repeats=None: ([1.0] * next(counts), 1)
        ends: list[float] = []

        class Speed:
            def tick(self, force=False):
                pass

            def factor_at(self, t):  # pass p's samples carry the factor p + 1
                return 1.0 + sum(t > e for e in ends)

        bench.speed = Speed()
        timing = bench.measure(
            [lambda: ([lambda: None], 1.0)], passes=3, on_done=lambda i: ends.append(time.perf_counter())
        )[0]
    finally:
        bench.close()
    assert timing.repeats == 10
    assert (timing.min_s, timing.median_s, timing.max_s) == (1.0, 2.0, 3.0)


def test_elementwise_fit_survives_times_flat_in_the_bytes():
    """On a loaded host the quick grid's elementwise times can come out flat or falling (launch-bound):
    no slope to invert. The bandwidth is then the fastest observed, not a division by zero."""
    from calibration.kernels.device_profile import elementwise_fit

    # Noise makes the larger sizes a little faster: the fitted slope is negative, clipped to 0.
    rows = [{"nbytes": n, "median_s": s} for n, s in ((1 << 12, 6e-6), (1 << 14, 5.5e-6), (1 << 16, 5e-6))]
    got = elementwise_fit(rows)
    assert got["bandwidth_bytes_per_s"] == pytest.approx((1 << 16) / 5e-6)
    sloped = [{"nbytes": n, "median_s": 2e-6 + n / 1e10} for n in (1 << 12, 1 << 20, 1 << 24)]
    assert elementwise_fit(sloped)["bandwidth_bytes_per_s"] == pytest.approx(1e10, rel=1e-6)


def test_hbm_bandwidth_comes_from_copies_that_overflow_the_cache():
    """Copies that fit in L2 time the cache. The shape an H200 measured (60 MB L2): up to 16 MB the
    copy line ran at ~2x HBM's rate; a 256 MB copy runs at HBM's. The device's bandwidth is read off
    the copies of at least twice the cache (launch latency taken off), not the fit over every size;
    without such a copy, or without a cache size, the fit is kept and said to be an upper bound."""
    from calibration.kernels.device_profile import hbm_bandwidth, memory_fit
    from calibration.kernels.measure import Measurements
    from calibration.kernels.timing import Timing

    lat, l2, cache_bw, hbm_bw = 7e-6, 60 << 20, 9e12, 4.5e12  # bw: bytes read + written per second
    meas = Measurements()
    for nb in (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 28):
        bw = cache_bw if nb < l2 else hbm_bw
        t = lat + 2 * nb / bw
        meas.add("memory", "copy", Timing(t, t, t, 5, 1, 1), nbytes=nb)
    copy = memory_fit(meas, ("copy",))
    bw, src = hbm_bandwidth(meas, copy, l2)
    assert bw == pytest.approx(hbm_bw, rel=0.01) and "L2" in src and "1 sizes" in src
    fit_bw, fit_src = hbm_bandwidth(meas, copy, 0)
    assert fit_bw == 2 * copy["bandwidth_bytes_per_s"] and fit_bw > 1.1 * hbm_bw and "unknown" in fit_src
    # the validation grid's sizes before (4 KB - 16 MB): the cache's rate, said to be so
    small = Measurements(rows=[r for r in meas.rows if r["nbytes"] < l2])
    bw, src = hbm_bandwidth(small, memory_fit(small, ("copy",)), l2)
    assert bw == pytest.approx(cache_bw, rel=0.05) and "no copy reached" in src


def test_validation_grid_on_a_gpu_times_adds_past_launch_bound_sizes():
    """The GPU validation's elementwise grid reaches sizes whose time is bandwidth, not launch: its
    largest add moves more than twice an H200's 60 MB L2 and covers the spec's token budget. With a
    launch of 7 us that jitters by 10 % and HBM at 4 TB/s, the grid's points fit the bandwidth within
    5 %, where the 1-256-token points alone (the grid before) are a third off. The CPU grid is unchanged."""
    from pathlib import Path

    from calibration.kernels.device_profile import elementwise_fit
    from calibration.validate import load_spec
    from calibration.validate.rounds import validation_plan
    from sim.catalog import get_model

    spec = load_spec(Path(__file__).resolve().parent.parent / "scenarios" / "validate-cuda.yaml")
    hidden = get_model(spec.model).hidden
    gpu, cpu = validation_plan(spec, "cuda"), validation_plan(spec, "cpu")
    assert cpu.ew_tokens == (1, 16, 256)
    assert max(gpu.ew_tokens) >= spec.scheduler.max_num_batched_tokens
    assert 3 * max(gpu.ew_tokens) * hidden * 2 > 2 * (60 << 20)

    def rows(tokens):  # x.add_(y): two reads and a write of tokens x hidden bf16
        return [
            {"nbytes": 3 * t * hidden * 2, "median_s": 7e-6 * (1 + 0.1 * (-1) ** i) + 3 * t * hidden * 2 / 4e12}
            for i, t in enumerate(tokens)
        ]

    assert elementwise_fit(rows(gpu.ew_tokens))["bandwidth_bytes_per_s"] == pytest.approx(4e12, rel=0.05)
    assert abs(elementwise_fit(rows(cpu.ew_tokens))["bandwidth_bytes_per_s"] / 4e12 - 1) > 0.25
