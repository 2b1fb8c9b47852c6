"""The explorer's server-side bounds (security review): capped charts, one bounded prewarm queue,
a wall-time budget per page action, the request cap for closed loops, downloads without server
paths. Fast: no Streamlit, small runs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from helpers import SMALL_EXPLORER as SMALL
from sim import explorer as X
from sim.analysis import plots
from sim.errors import ConfigError

# --- charts: distinct values ----------------------------------------------------------------


def _wide(n: int) -> pa.Table:
    return pa.table({"workload.a": range(n), "workload.b": range(n), "ttft_s.p99": [1.0] * n})


def test_heatmap_declines_many_distinct_values_without_building_the_grid():
    t = _wide(5000)  # 25M cells: minutes and GBs of JSON if the grid were built
    t0 = time.perf_counter()
    with pytest.raises(plots.TooManyValues, match=r"workload\.a.*5,000 distinct values.*at most 200.*bin"):
        plots.heatmap(t, "workload.a", "workload.b", "ttft_s.p99", max_distinct=plots.MAX_DISTINCT)
    assert time.perf_counter() - t0 < 1.0


def test_heatmap_within_the_cap_is_drawn():
    t = pa.table({"workload.a": [1, 1, 2, 2], "workload.b": ["x", "y", "x", "y"], "z": [1.0, 2.0, 3.0, 4.0]})
    fig = plots.heatmap(t, "workload.a", "workload.b", "z", max_distinct=2)
    assert len(fig.data[0].z) == 2


def test_sweep_curves_declines_one_line_per_many_colour_values():
    t = _wide(1000)
    t0 = time.perf_counter()
    with pytest.raises(plots.TooManyValues, match=r"color 'workload\.b' has 1,000 distinct values"):
        plots.sweep_curves(t, "workload.a", "ttft_s.p99", "workload.b", max_distinct=plots.MAX_DISTINCT)
    assert time.perf_counter() - t0 < 1.0
    # Many x values on one line are fine (one trace).
    fig = plots.sweep_curves(t, "workload.a", "ttft_s.p99", None, max_distinct=plots.MAX_DISTINCT)
    assert len(fig.data) == 1


# --- prewarm: one bounded queue -------------------------------------------------------------


def test_prewarm_queue_bounds_concurrency_and_drops_superseded_requests():
    from sim.explorer.prewarm import PrewarmQueue

    q = PrewarmQueue(max_running=2, max_waiting=100)
    gate = threading.Event()
    lock = threading.Lock()
    running = [0]
    peak = [0]
    started: list[str] = []

    def job(key):
        def fn():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                started.append(key)
            gate.wait(10)
            with lock:
                running[0] -= 1

        return fn

    # Two sessions start one run each; then each asks for 20 more keys while those run.
    assert q.submit("s1", "a0", job("a0"))
    assert q.submit("s2", "b0", job("b0"))
    deadline = time.time() + 5
    while len(started) < 2 and time.time() < deadline:
        time.sleep(0.01)
    for i in range(1, 21):
        q.submit("s1", f"a{i}", job(f"a{i}"))
        q.submit("s2", f"b{i}", job(f"b{i}"))
        q.submit(f"other{i}", f"c{i}", job(f"c{i}"))
    assert q.running == 2 and running[0] == 2
    assert q.waiting == 22  # one per session: s1, s2 and the 20 others
    assert sum(t.name == "kvsim-prewarm" for t in threading.enumerate()) <= 2
    gate.set()
    deadline = time.time() + 10
    while (q.running or q.waiting) and time.time() < deadline:
        time.sleep(0.01)
    assert q.running == 0 and q.waiting == 0
    assert peak[0] <= 2
    # Superseded requests never started: only each session's first and latest ran.
    assert sorted(k for k in started if k[0] in "ab") == ["a0", "a20", "b0", "b20"]
    assert not q.submit("s1", "a20", job("again"))  # already ran: not queued again


def test_prewarm_queue_bounds_waiting_sessions_and_survives_failures():
    from sim.explorer.prewarm import PrewarmQueue

    q = PrewarmQueue(max_running=1, max_waiting=3)
    gate = threading.Event()
    ran: list[str] = []

    def blocker():
        gate.wait(10)

    def boom():
        ran.append("boom")
        raise RuntimeError("x")

    q.submit("s0", "k0", blocker)
    for i in range(1, 10):
        q.submit(f"s{i}", f"k{i}", lambda i=i: ran.append(f"k{i}"))
    assert q.waiting == 3
    q.submit("s9", "k9", boom)  # replaces s9's waiting request
    gate.set()
    deadline = time.time() + 10
    while (q.running or q.waiting) and time.time() < deadline:
        time.sleep(0.01)
    assert ran == ["k7", "k8", "boom"]
    assert q.submit("s9", "k9", lambda: None)  # a failed key may run again


# --- a wall-time budget per page action -----------------------------------------------------


def test_sweep_starts_no_point_after_the_page_budget_and_keeps_finished_ones(store):
    from sim.explorer.page_budget import sweep_note

    grid = {"workload.arrival.rate": [5, 10, 15, 20]}
    # The budget runs out while the first point finishes (its progress call takes the time).
    t0 = time.perf_counter()
    table, failures = X.run_small_sweep(
        SMALL, grid, 40, store, total_wall_s=1.0, progress=lambda d, n, f: d == 1 and time.sleep(1.1)
    )
    assert time.perf_counter() - t0 < 60
    status = table.column("status").to_pylist()
    assert status.count("ok") == 1 and status.count("skipped") == 3 and not failures
    assert sorted(table.column("workload.arrival.rate").to_pylist()) == [5.0, 10.0, 15.0, 20.0]
    note = sweep_note(table, X.sweep_param_columns(table))
    # Two workers start the first two points together, so either may be the one that finished: the
    # note names the points not run, whichever they are.
    rates = table.column("workload.arrival.rate").to_pylist()
    not_run = [r for r, st in zip(rates, status) if st == "skipped"]
    assert note and "1 of 4 points finished" in note
    assert all(f"workload.arrival.rate={r}" in note for r in not_run), (note, not_run)
    # Charts use the finished point only.
    assert len(plots.sweep_curves(table, "workload.arrival.rate", "ttft_s.p99").data[0].x) == 1
    # Pressing Run again continues from the finished points.
    table2, _ = X.run_small_sweep(SMALL, grid, 40, store)
    assert table2.column("status").to_pylist() == ["ok"] * 4 and sweep_note(table2) is None


def test_plan_is_ended_at_the_page_budget(store):
    from sim.explorer.page_budget import ActionBudgetSpent

    # Nothing finishes in 0.2 s (the plan's process alone takes longer to start).
    slo = X.slo_from_knobs(X.DEFAULT_SLO)
    t0 = time.perf_counter()
    with pytest.raises(
        ActionBudgetSpent, match=r"budget of 0.2 s: 0 of 2 candidates finished.*not finished: static, paged"
    ):
        X.run_small_plan(SMALL, slo, ["static", "paged"], 50, store, total_wall_s=0.2)
    assert time.perf_counter() - t0 < 10
    # Within the budget: the plan as before, candidates streamed as they finish.
    seen: list[str] = []
    p = X.run_small_plan(SMALL, slo, ["paged"], 50, store, max_evals=3, on_candidate=lambda c: seen.append(c["name"]))
    assert seen == ["paged"] and p["recommendation"]["text"]


def test_page_plan_runs_a_length_split_router_with_the_knobs_count(store):
    # The page's router knob sets a count; its plan has no target rate, so the count stands.
    split = {**SMALL, "router": "length_split", "gpu": {**SMALL.get("gpu", {}), "replicas": 2}}
    split["length_split"] = {"prompt_tokens": 1024, "replicas": 1}
    p = X.run_small_plan(split, X.slo_from_knobs(X.DEFAULT_SLO), ["paged"], 50, store, max_evals=3)
    assert p["router"] == "length_split" and p["length_split"] == {"prompt_tokens": 1024, "replicas": 1}
    assert p["candidates"][0]["status"] == "ok"


def test_plan_budget_reports_a_bad_scenario_as_one_line(store):
    slo = X.slo_from_knobs(X.DEFAULT_SLO)
    closed = {**SMALL, "workload": {**SMALL["workload"], "arrival": {"kind": "closed_loop", "concurrency": 4}}}
    with pytest.raises(ConfigError, match="workload.arrival.kind"):
        X.run_small_plan(closed, slo, ["paged"], 50, store)


# --- the page's request cap holds for closed loops ------------------------------------------

CLOSED = {
    "name": "cl",
    "model": {"name": "llama-3.1-8b"},
    "workload": {
        "num_requests": None,
        "duration_s": 1e9,
        "arrival": {"kind": "closed_loop", "concurrency": 10_000_000},
        "lengths": {"kind": "fixed", "prompt_tokens": 16, "output_tokens": 1},
    },
}


def _closed(concurrency: int, duration_s: float) -> str:
    wl = {
        **CLOSED["workload"],
        "duration_s": duration_s,
        "arrival": {"kind": "closed_loop", "concurrency": concurrency},
    }
    return X.canonical_json(X.resolve_scenario({**CLOSED, "workload": wl}))


def test_closed_loop_with_more_clients_than_the_request_cap_is_refused_at_once():
    from sim.engine.budget import EXPLORER_BUDGET

    t0 = time.perf_counter()
    with pytest.raises(
        ConfigError, match=rf"workload\.arrival\.concurrency: got 10000000; at most {EXPLORER_BUDGET.max_requests} "
    ):
        X.run_canonical(_closed(10_000_000, 1e9))
    assert time.perf_counter() - t0 < 5


def test_closed_loop_cut_by_duration_is_held_to_the_request_cap():
    from sim.engine.budget import RunBudget

    budget = RunBudget(max_requests=300, max_events=2_000_000, max_wall_s=60.0, source="explorer budget")
    with pytest.raises(ConfigError, match=r"requests: got 'more than 300 \(a closed loop of 10 clients"):
        X.run_canonical(_closed(10, 1e9), budget=budget)
    rd = X.run_canonical(_closed(10, 0.1), budget=budget)  # a short loop is under the cap: runs
    assert 0 < rd.summary["requests"] <= 300


# --- downloads show no server path ----------------------------------------------------------


def _server_paths(text: str, store) -> list[str]:
    from sim.package_data import REPO_ROOT

    bad = {str(REPO_ROOT), str(REPO_ROOT.resolve()), str(store.dir), str(Path(store.dir).resolve())}
    return [b for b in bad if b in text]


def test_no_download_contains_a_server_path(store):
    from sim.explorer.downloads import plan_download, public_table, summary_download
    from sim.package_data import REPO_ROOT

    name = store.add_profile("mine.json", (REPO_ROOT / "sim" / "profiles" / "h100-sxm.json").read_bytes())
    base = X.builtin_scenario("chat-api")
    knobs = {**X.knobs_from_scenario(base), "workload.num_requests": 40, "cost_model.profile": name}
    data = X.edited_scenario(base, knobs)
    sc = X.resolve_scenario(data, store.trace_paths(), store.profiles)
    rd = X.run_canonical(X.canonical_json(sc))
    assert _server_paths(json.dumps(rd.summary), store)  # the run names the uploaded profile's file
    hidden = (str(store.dir),)
    text = summary_download(rd.summary, hidden)
    assert not _server_paths(text, store)
    assert json.loads(text)["cost_model_profile"]["path"].startswith("profiles/")
    for table in (rd.requests, rd.timeseries):
        for fmt in ("parquet", "csv"):
            assert not _server_paths(X.table_bytes(public_table(table, hidden), fmt).decode("latin-1"), store)
    # The sweep dataset names the profile file of its runs.
    table, _ = X.run_small_sweep(data, {"allocator.kind": ["paged", "static"]}, 40, store)
    assert _server_paths(X.table_bytes(table, "csv").decode(), store)
    public = public_table(table, hidden)
    for fmt in ("parquet", "csv"):
        assert not _server_paths(X.table_bytes(public, fmt).decode("latin-1"), store)
    # plan.json: a built-in profile named by its path in the package (assumptions[].profile).
    prof = str(REPO_ROOT / "sim" / "profiles" / "h100-sxm.json")
    plan = {
        "scenario_file": str(store.dir / "plans" / "x.yaml"),
        "assumptions": [{"profile": prof}],
        "d": str(REPO_ROOT),
    }
    text = plan_download(plan, hidden)
    assert not _server_paths(text, store)
    out = json.loads(text)
    assert out["assumptions"][0]["profile"] == "sim/profiles/h100-sxm.json" and out["d"] == "."


def test_real_plan_download_has_no_server_path(store):
    from sim.config import SCENARIO_DIR

    slo = X.slo_from_knobs(X.DEFAULT_SLO)
    p = X.run_small_plan(X.builtin_scenario("chat-api"), slo, ["paged"], 50, store, max_evals=3)
    assert _server_paths(json.dumps(p), store)
    assert not _server_paths(X.plan_download(p, (str(store.dir), str(SCENARIO_DIR))), store)


def test_hide_server_paths_leaves_other_paths():
    from sim.explorer.downloads import hide_server_paths

    assert hide_server_paths("/srv/d/a.csv /srv/data/b /srv/d", ("/srv/d",)) == "a.csv /srv/data/b ."
