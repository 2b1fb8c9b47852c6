"""Every HTML file kvsim writes works offline: headless Chromium opens each kind of report with every
request that is not a ``file:`` URL aborted, and finds each page's plotly charts drawn (``.main-svg``)
with no error and no request refused. GPU calibration hosts are often offline: a page that loads
plotly.js from a CDN renders blank there.

Kinds: the calibration fit report (``<out>.report.html``), ``validation.html``,
``serving_validation.html``, a run's and a sweep's ``report.html``, ``plan.html`` and the explorer's
charts download (``figures_html``).
Needs plotly, playwright (pip) and Chromium (Debian package ``chromium``); skipped without them.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("plotly")
sync_api = pytest.importorskip("playwright.sync_api")

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


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_offline(browser, path: Path) -> dict:
    """Open ``path`` with the network cut off: charts, charts drawn, refused requests, errors."""
    refused: list[str] = []
    errors: list[str] = []
    page = browser.new_page()
    try:

        def route(r):
            if r.request.url.startswith("file:"):
                r.continue_()
            else:
                refused.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.resolve().as_uri())
        try:
            page.wait_for_selector(".plotly .main-svg", timeout=30_000)
        except sync_api.TimeoutError:
            pass  # counted below: a page without drawn charts fails its test
        charts = page.locator(".js-plotly-plot").count()
        drawn = page.locator(".js-plotly-plot:has(.plotly .main-svg)").count()
    finally:
        page.close()
    return {"charts": charts, "drawn": drawn, "refused": refused, "errors": errors}


def assert_offline(browser, path: Path, at_least: int = 1) -> None:
    text = path.read_text(encoding="utf-8")
    assert '<script src="http' not in text and "<script src='http" not in text, (
        f"{path.name} loads a script from the network"
    )
    r = open_offline(browser, path)
    assert r["refused"] == [], f"{path.name} asked for {r['refused'][:3]}"
    assert r["errors"] == [], r["errors"][:3]
    assert r["charts"] >= at_least and r["drawn"] == r["charts"], r


def test_calibration_fit_report_offline(browser, tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841
    from calibration import kernels as K
    from sim.catalog import get_model

    plan = K.Plan(
        gemm_m=(1, 16, 64),
        ctx_batch=(1, 2),
        ctx_len=(16, 64),
        ctx_max_tokens=128,
        gen_batch=(1, 2),
        gen_len=(16, 64),
        gen_max_kv_bytes=1 << 20,
        block_sizes=(8,),
        overhead_batch=(1, 4),
        mem_bytes=(1 << 12, 1 << 16),
        ew_tokens=(1, 16),
        repeats=3,
        warmup=1,
        target_repeat_s=0.0002,
        passes=1,
    )
    model = get_model("tiny-llama")
    res = K.calibrate_device("cpu", model, plan=plan, progress=False)
    files = K.write_outputs(res, tmp_path / "cpu.json", model)
    assert_offline(browser, files["report"])


def test_validation_html_offline(browser, tmp_path):
    pytest.importorskip("torch")
    from calibration.validate import load_spec, validate

    spec = load_spec("scenarios/validate-cpu.yaml", quick=True)
    spec.engine.clocks, spec.engine.replays = ["wall"], 1
    spec.workload.num_requests = 5
    spec.allocators = ["paged"]
    validate(spec, device="cpu", profile="cpu-reference", out=tmp_path, engine_overhead=False)
    assert_offline(browser, tmp_path / "validation.html")


def test_serving_validation_html_offline(browser, tmp_path):
    from calibration.serving_report import validate_serving_bench

    f = tmp_path / "bench.csv"
    f.write_text(
        "model,gpu,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms\n"
        "meta-llama/Llama-3.1-8B-Instruct,h100_sxm,vllm,1,128,16,2,16,7.5\n"
        "meta-llama/Llama-3.1-8B-Instruct,h100_sxm,sglang,1,128,16,2,18,7\n"
    )
    validate_serving_bench(str(f), requests_per_client=2, out=tmp_path / "out")
    assert_offline(browser, tmp_path / "out" / "serving_validation.html")


def test_run_sweep_plan_and_explorer_pages_offline(browser, tmp_path):
    from sim import explorer as X
    from sim.analysis import plots
    from sim.analysis.plan_output import write_plan
    from sim.analysis.planner import plan
    from sim.analysis.report import report
    from sim.analysis.slo import parse_slos
    from sim.analysis.sweep import run_sweep
    from sim.config import load_scenario
    from sim.engine.cluster import simulate
    from sim.output.results import write_run

    run = tmp_path / "run"
    write_run(simulate(load_scenario("chat-api", {"workload.num_requests": 60})), run)
    assert_offline(browser, report(run), at_least=5)
    f = tmp_path / "s.yaml"
    f.write_text(
        textwrap.dedent("""
        base: chat-api
        set: {workload.num_requests: 30}
        grid:
          allocator.kind: [static, paged]
          workload.arrival.rate: [5, 20]
    """)
    )
    assert run_sweep(f, workers=1, out=tmp_path / "sweep", progress=False).ok
    assert_offline(browser, report(tmp_path / "sweep"))
    p = plan(
        "chat-api",
        parse_slos(["ttft_p90_s=0.5", "tpot_p90_s=0.05"]),
        overrides={"workload.num_requests": 40},
        allocators=["paged"],
        workers=1,
        max_evals=4,
        target_rate=10.0,
    )
    assert_offline(browser, write_plan(p, tmp_path / "plan") / "plan.html")
    import pyarrow.parquet as pq

    page = tmp_path / "charts.html"
    page.write_text(
        X.figures_html(
            {
                "cdf": plots.latency_cdf(pq.read_table(run / "requests.parquet")),
                "kv": plots.kv_memory(pq.read_table(run / "timeseries.parquet")),
            }
        ),
        encoding="utf-8",
    )
    assert_offline(browser, page, at_least=2)
