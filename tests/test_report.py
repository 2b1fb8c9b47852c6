"""Figures and HTML reports: the fragmentation arithmetic, self-contained HTML, rendering in headless Chromium."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("plotly")

from sim.analysis import plots  # noqa: E402
from sim.analysis.report import report  # noqa: E402
from sim.analysis.sweep import run_sweep  # noqa: E402
from sim.config import load_scenario  # noqa: E402
from sim.engine.cluster import simulate  # noqa: E402
from sim.output.results import write_run  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _ts(rows):
    cols = [
        "t_s",
        "replica",
        "running",
        "waiting",
        "batch_tokens",
        "iterations",
        "window_s",
        "first_step_s",
        "kv_capacity_bytes",
        "kv_reserved_bytes",
        "kv_used_bytes",
        "kv_free_bytes",
        "kv_largest_free_extent_bytes",
    ]
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


def test_fragmentation_and_replica_sums():
    # Two replicas of capacity 100. Replica 0 at t=1: reserved 60, used 30, free 40, largest 10.
    # Replica 1 at t=2: reserved 20, used 20, free 80, largest 80.
    ts = _ts(
        [(1.0, 0, 2, 0, 2, 1, 0.01, 0.01, 100, 60, 30, 40, 10), (2.0, 1, 1, 0, 1, 1, 0.01, 0.01, 100, 20, 20, 80, 80)]
    )
    t, internal, external = plots.fragmentation_series(ts)
    assert t.tolist() == [1.0, 2.0]
    # t=1: only replica 0 has reserved memory; replica 1 is all free (its first capacity/free values).
    assert internal[0] == pytest.approx(30 / 60)
    assert external[0] == pytest.approx(1 - (10 + 80) / (40 + 80))
    # t=2: reserved 80, used 50; free 120, largest 90.
    assert internal[1] == pytest.approx(30 / 80)
    assert external[1] == pytest.approx(1 - 90 / 120)
    _, s = plots.summed_over_replicas(ts, ["kv_used_bytes", "kv_capacity_bytes"])
    assert s["kv_used_bytes"].tolist() == [30, 50] and s["kv_capacity_bytes"].tolist() == [200, 200]
    assert plots.decode_only_mask(ts).tolist() == [True, True]


def test_latency_cdf_reaches_completed_fraction():
    req = pa.table(
        {
            "status": ["completed", "completed", "rejected", "completed"],
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "first_token_s": [0.5, 1.2, -1.0, 3.1],
            "finish_s": [1.5, 2.2, -1.0, 3.1],
            "generated_tokens": [3, 6, 0, 1],
        }
    )
    fig = plots.latency_cdf({"a": req})
    ttft = fig.data[0]
    assert list(ttft.x) == pytest.approx([0.1, 0.2, 0.5])
    assert list(ttft.y) == pytest.approx([0.25, 0.5, 0.75])  # the rejected request keeps the CDF below 1
    assert list(fig.data[1].x) == pytest.approx([0.2, 0.5])  # TPOT of requests with ≥ 2 tokens


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    sc = load_scenario("chat-api", {"workload.num_requests": 150, "allocator.kind": "static"})
    write_run(simulate(sc), d)
    return d


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    f = d / "s.yaml"
    f.write_text(
        textwrap.dedent("""
        base: chat-api
        set: {workload.num_requests: 40}
        grid:
          allocator.kind: [static, paged]
          workload.arrival.rate: [5, 20]
          scheduler.max_num_seqs: [64, 256]
    """)
    )
    res = run_sweep(f, workers=2, out=d / "ds", progress=False)
    assert res.ok
    return d / "ds"


def _open_in_chromium(path: Path) -> tuple[int, int, list[str]]:
    """(plot divs, plot divs with an svg, console errors) of a page in headless Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            plots_ = page.locator(".js-plotly-plot").count()
            with_svg = page.locator(".js-plotly-plot:has(svg.main-svg)").count()
        finally:
            browser.close()
    return plots_, with_svg, errors


def test_run_report_renders_in_chromium(run_dir):
    path = report(run_dir)
    assert path == run_dir / "report.html"
    text = path.read_text()
    assert '<script src="http' not in text and "Plotly.newPlot" in text  # plotly.js is inlined
    n, with_svg, errors = _open_in_chromium(path)
    assert n == 5 and with_svg == 5
    assert errors == []


def test_sweep_report_renders_in_chromium(sweep_dir):
    path = report(sweep_dir, x="workload.arrival.rate", y="scheduler.max_num_seqs", z=["ttft_s.p90"])
    text = path.read_text()
    assert "ttft_s.p90 over workload.arrival.rate" in text and "scheduler.max_num_seqs" in text
    n, with_svg, errors = _open_in_chromium(path)
    # 2 throughput–latency + 3 metric-vs-rate curves + 1 heatmap.
    assert n == 6 and with_svg == 6
    assert errors == []


def test_png_export(run_dir, tmp_path):
    if CHROMIUM is None:
        pytest.skip("kaleido needs chromium (apt-get install chromium)")
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.report", str(run_dir), "--png", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    for name in ("latency_cdf", "kv_memory", "fragmentation", "queue_length", "step_latency"):
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_report_bad_inputs(tmp_path, sweep_dir):
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stderr.startswith("error: report: ")
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.report", str(sweep_dir), "--x", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: --x: got 'nope'")
    # A text column is named as the --z it is, with the columns a heatmap can show.
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.report", str(sweep_dir), "--z", "rejected_by_reason", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    prefix = "error: --z: got 'rejected_by_reason'; a numeric column of the sweep dataset ("
    assert r.stderr.startswith(prefix), r.stderr
    for col in ("ttft_s.{p50,p90,p99,mean}", "throughput_tokens_per_s", "preemptions"):
        assert col in r.stderr
    assert not (tmp_path / "report.html").exists()


def test_run_report_names_truncated_requests(tmp_path):
    over = {"workload.num_requests": 300, "allocator.kind": "static", "allocator.reserve": "p95"}
    sc = load_scenario("chat-api", {**over, "allocator.overflow": "truncate"})
    res = simulate(sc)
    assert res.summary["truncated"] > 0
    write_run(res, tmp_path)
    assert f"truncated: {res.summary['truncated']}" in report(tmp_path).read_text()
