"""The Streamlit explorer's page logic, driven headless with ``streamlit.testing.v1.AppTest``.

Runs are small (``workload.num_requests`` = 200) to keep the tests fast.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")


@pytest.fixture()
def at(monkeypatch):
    monkeypatch.setenv("KVSIM_APP_PREWARM", "0")  # no background run of the 2000-request default
    app = AppTest.from_file(APP, default_timeout=180)
    app.run()
    assert not app.exception, app.exception
    return app


def metrics(app) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


def charts(app) -> int:
    return len(app.get("plotly_chart"))


def small_run(app):
    app.number_input(key="knob.workload.num_requests").set_value(200)
    app.button(key="run").click().run()
    assert not app.exception, app.exception
    assert not app.error, [e.value for e in app.error]
    return metrics(app)


def test_explore_allocator_changes_kpis(at):
    assert charts(at) == 5  # empty chart frames before any run
    assert set(metrics(at).values()) == {"–"}
    paged = small_run(at)
    assert paged["TTFT p99 (s)"] != "–" and charts(at) == 5
    assert "run #1" in " ".join(c.value for c in at.caption) or any("run #1" in m.value for m in at.markdown)

    at.selectbox(key="knob.allocator.kind").set_value("static").run()
    assert at.text_input(key="knob.allocator.reserve").value == "max_model_len"
    static = small_run(at)
    assert static != paged
    # Reserving max_model_len per request wastes far more KV than paging.
    assert float(static["KV waste"].rstrip("%")) > float(paged["KV waste"].rstrip("%")) + 20
    deltas = {m.label: m.delta for m in at.metric}
    assert deltas["KV waste"].startswith("+")

    # Same knobs again: served from the cache, identical KPIs.
    at.button(key="run").click().run()
    assert metrics(at) == static


def test_explore_splits_a_runs_iteration_time(at):
    small_run(at)
    assert charts(at) == 5
    at.button(key="breakdown_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert charts(at) == 6
    key, breakdown = at.session_state["breakdown"]
    assert sum(breakdown["seconds"].values()) == pytest.approx(breakdown["busy_s"])
    assert breakdown["seconds"]["linear"] > 0 and breakdown["seconds"]["attention"] > 0
    # Another scenario: the split of the old run is not shown for it.
    at.selectbox(key="knob.allocator.kind").set_value("static").run()
    small_run(at)
    assert charts(at) == 5


def test_explore_runs_a_pool_for_long_prompts(at):
    at.number_input(key="knob.gpu.replicas").set_value(3).run()
    at.selectbox(key="knob.router").set_value("length_split").run()
    at.number_input(key="knob.length_split.prompt_tokens").set_value(2048).run()
    small_run(at)
    assert at.session_state["explore_result"].summary["length_split_replicas"] == 1
    replicas = at.session_state["explore_result"].requests.column("replica").to_pylist()
    prompts = at.session_state["explore_result"].requests.column("prompt_tokens").to_pylist()
    assert {r for r, p in zip(replicas, prompts) if p >= 2048} == {2}  # the last replica
    assert {r for r, p in zip(replicas, prompts) if p < 2048} == {0, 1}


def test_knobs_changed_marks_results_stale(at):
    small_run(at)
    at.number_input(key="knob.workload.arrival.rate").set_value(3.0).run()
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "knobs changed since this run" in text


BAD_SCENARIOS = [
    (b"workload:\n  arival: {kind: poisson, rate: 1}\n", "unknown key"),
    (b"workload:\n  lengths: {kind: empirical, path: /etc/passwd}\n", "built-in trace"),
    (b"workload:\n  lengths: {kind: empirical, path: ../../README.md}\n", "built-in trace"),
    (b"a: &x [1, 2]\nb: *x\n", "anchors"),
    (b"model: [unclosed\n", "valid YAML"),
    (b"allocator:\n  block_size: 0\n", "allocator.block_size"),
]


@pytest.mark.parametrize("content,needle", BAD_SCENARIOS)
def test_bad_scenario_upload_shows_error_and_keeps_state(at, content, needle):
    before = small_run(at)
    knobs_before = dict(at.session_state["knobs"])
    at.radio(key="src").set_value("Upload").run()
    at.file_uploader(key="scenario_upload").upload("bad.yaml", content, "text/yaml")
    at.run()
    assert not at.exception, at.exception
    errors = " ".join(e.value for e in at.error)
    assert "Upload rejected, previous scenario kept" in errors and needle in errors, errors
    assert at.session_state["base_label"] == "chat-api"
    assert at.session_state["knobs"] == knobs_before
    assert metrics(at) == before and charts(at) == 5


def test_good_scenario_upload_replaces_knobs(at):
    small_run(at)
    at.radio(key="src").set_value("Upload").run()
    yaml_text = (
        b"name: up\nworkload:\n  num_requests: 120\n  arrival: {kind: gamma, rate: 4, cv: 3}\n"
        b"  lengths: {kind: uniform, prompt_min: 10, prompt_max: 300, output_min: 5, output_max: 60}\n"
        b"allocator: {kind: static, reserve: p99, overflow: truncate}\n"
    )
    at.file_uploader(key="scenario_upload").upload("mine.yaml", yaml_text, "text/yaml")
    at.run()
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["base_label"] == "mine.yaml"
    assert at.number_input(key="knob.workload.num_requests").value == 120
    assert at.number_input(key="knob.workload.arrival.cv").value == 3.0
    assert at.selectbox(key="knob.allocator.overflow").value == "truncate"
    at.button(key="run").click().run()
    assert not at.error and not at.exception
    assert metrics(at)["rejections"] == "0"


def test_bad_trace_upload_shows_error_and_keeps_lengths(at):
    before = at.session_state["knobs"]["workload.lengths.path"]
    at.file_uploader(key="trace_upload").upload("t.csv", b"arrival_s,prompt_tokens\n0,10\n", "text/csv")
    at.run()
    errors = " ".join(e.value for e in at.error)
    assert "Trace rejected" in errors and "output_tokens" in errors, errors
    assert at.session_state["knobs"]["workload.lengths.path"] == before


def test_trace_upload_drives_lengths(at):
    rows = "arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{i * 0.1},{100 + i},{20 + i % 7}\n" for i in range(300)
    )
    at.file_uploader(key="trace_upload").upload("my trace.csv", rows.encode(), "text/csv")
    at.run()
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["knobs"]["workload.lengths.kind"] == "empirical"
    assert at.session_state["knobs"]["workload.lengths.path"] == "my_trace.csv"
    small_run(at)


def test_compare_page(at):
    at.number_input(key="knob.workload.num_requests").set_value(200).run()
    at.radio(key="page").set_value("Compare").run()
    at.radio(key="cmp_n").set_value(2).run()
    assert at.selectbox(key="cmp_kind_0").value == "paged" and at.selectbox(key="cmp_kind_1").value == "static"
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    table = at.dataframe[0].value
    assert list(table.columns) == ["paged b=16", "static max_model_len (reject)"]
    assert table.loc["KV waste", "paged b=16"] != table.loc["KV waste", "static max_model_len (reject)"]
    assert charts(at) == 3  # CDFs + one KV memory chart per configuration
    at.button(key="cmp_breakdown_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert charts(at) == 4
    split = at.dataframe[1].value
    assert list(split.columns) == ["part", "what", "paged b=16", "static max_model_len (reject)"]
    layout = split[split["part"] == "attention_layout"].iloc[0]
    # The paged indirection is the paged column's only: a contiguous reservation pays none.
    assert layout["paged b=16"] != "–" and layout["static max_model_len (reject)"] == "–"


def test_compare_names_the_configuration_a_bad_value_belongs_to(at):
    at.radio(key="page").set_value("Compare").run()
    at.radio(key="cmp_n").set_value(2).run()
    at.number_input(key="cmp_block_size_1").set_value(0).run()
    at.button(key="compare_run").click().run()
    assert not at.exception, at.exception
    (err,) = [e.value for e in at.error]
    assert "configuration 2 (static" in err and "allocator.block_size: got 0" in err, err


def test_sweeps_page_upload(at):
    import pyarrow as pa
    import pyarrow.parquet as pq

    at.radio(key="page").set_value("Sweeps & plan").run()
    assert not at.exception, at.exception
    at.file_uploader(key="sweep_upload").upload("x.parquet", b"not parquet", "application/octet-stream")
    at.run()
    assert "readable Parquet" in " ".join(e.value for e in at.error)
    t = pa.table(
        {
            "point": [0, 1, 2, 3],
            "status": ["ok"] * 4,
            "allocator.kind": ["paged", "paged", "static", "static"],
            "workload.arrival.rate": [5.0, 10.0, 5.0, 10.0],
            "ttft_s.p99": [0.1, 0.3, 2.0, 9.0],
            "throughput_tokens_per_s": [1e3, 2e3, 9e2, 1.1e3],
        }
    )
    buf = io.BytesIO()
    pq.write_table(t, buf)
    at.file_uploader(key="sweep_upload").upload("sweep.parquet", buf.getvalue(), "application/octet-stream")
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert charts(at) == 2  # curves + heatmap


def test_calibration_page(at):
    from sim.cost.profile import PROFILE_DIR, list_profiles

    at.radio(key="page").set_value("Calibration").run()
    assert not at.exception, at.exception
    if not list_profiles():
        pytest.skip("no built-in profiles")
    assert charts(at) == 1
    table = at.dataframe[0].value
    assert set(list_profiles()) <= set(table["profile"])
    at.file_uploader(key="profile_upload").upload("bad.json", b'{"format": "nope"}', "application/json")
    at.run()
    assert "Profile rejected" in " ".join(e.value for e in at.error)
    name = list_profiles()[0]
    data = (PROFILE_DIR / f"{name}.json").read_bytes()
    at.file_uploader(key="profile_upload").upload("mine.json", data, "application/json")
    at.run()
    assert not at.exception, at.exception
    assert "mine" in at.selectbox(key="prof_name").options
    at.selectbox(key="prof_name").set_value("mine").run()
    at.button(key="prof_use").click().run()
    assert at.session_state["knobs"]["cost_model.profile"] == "mine"


def test_sweeps_page_runs_a_small_sweep_and_plan(at):
    pytest.importorskip("sim.analysis.sweep")
    at.number_input(key="knob.workload.num_requests").set_value(60).run()
    at.radio(key="page").set_value("Sweeps & plan").run()
    at.radio(key="sw_src").set_value("Run a small sweep").run()
    at.selectbox(key="sw_a1").set_value("allocator.kind").run()
    at.text_input(key="sw_v1_allocator.kind").set_value("static, paged")
    at.selectbox(key="sw_a2").set_value("(none)")
    at.number_input(key="sw_n").set_value(60)
    at.button(key="sweep_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    table = at.session_state["sweep_table"]
    assert sorted(table.column("allocator.kind").to_pylist()) == ["paged", "static"]
    assert charts(at) == 1  # one axis: curves, no heatmap
    # A bad axis value is one readable line, the dataset stays.
    at.text_input(key="sw_v1_allocator.kind").set_value("{a: 1}")
    at.button(key="sweep_run").click().run()
    assert "plain numbers or words" in " ".join(e.value for e in at.error)
    assert at.session_state["sweep_table"] is table

    pytest.importorskip("sim.analysis.planner")
    at.multiselect(key="plan_cands").set_value(["paged"])
    at.number_input(key="plan_n").set_value(60)
    at.button(key="plan_run").click().run()
    assert not at.exception, at.exception
    plan = at.session_state["plan"]
    assert [c["name"] for c in plan["candidates"]] == ["paged"]
    assert at.success and charts(at) == 3


def test_explore_a_shipped_mixture_of_experts_config(at):
    """The model picker offers the shipped Hugging Face configs; a MoE one runs calibrated."""
    box = at.selectbox(key="knob.model.name")
    assert "Qwen/Qwen3-30B-A3B" in box.options and "llama-3.1-8b" in box.options
    box.set_value("Qwen/Qwen3-30B-A3B").run()
    assert not at.exception, at.exception
    m = small_run(at)
    assert m["TTFT p99 (s)"] != "–"
    status = " ".join(c.value for c in at.caption)
    assert "cost model `h100-sxm`" in status and "uncalibrated" not in status, status


def test_model_picker_simulates_the_checkpoint_dtypes(at):
    assert "changed in the sidebar" not in " ".join(c.value for c in at.caption)
    at.selectbox(key="knob.model.name").set_value("Qwen/Qwen3-32B-FP8").run()
    assert not at.exception, at.exception
    shown = " ".join(c.value for c in at.caption)
    assert "Simulated dtypes: weights `fp8_block`" in shown, shown
    # The scenario's own description (llama-3.1-8b) is marked as the file's, not what runs.
    assert "changed in the sidebar (model) — as loaded: llama-3.1-8b" in shown, shown


def test_malformed_fit_quality_upload_keeps_calibration_page(at):
    import json

    from sim.cost.profile import PROFILE_DIR, list_profiles

    if "h100-sxm" not in list_profiles():
        pytest.skip("no h100-sxm profile")
    doc = json.loads((PROFILE_DIR / "h100-sxm.json").read_text())
    doc["fit_quality"]["gemm"]["overall"]["median_rel_err"] = "n/a"
    at.radio(key="page").set_value("Calibration").run()
    at.file_uploader(key="profile_upload").upload("mine.json", json.dumps(doc).encode(), "application/json")
    at.run()
    assert not at.exception, at.exception
    assert "fit_quality.gemm.overall.median_rel_err" in " ".join(e.value for e in at.error)
    at.run()
    assert not at.exception and "mine" not in at.selectbox(key="prof_name").options


CAP = "knob.workload.arrival.max_concurrency"


def test_client_cap_is_offered_for_open_loop_arrivals_only(at):
    assert at.session_state["knobs"]["workload.arrival.kind"] == "poisson"
    assert at.checkbox(key=CAP + ".on").value is False
    assert CAP not in [n.key for n in at.number_input]  # off: no cap value to edit
    at.selectbox(key="knob.workload.arrival.kind").set_value("closed_loop").run()
    assert not at.exception, at.exception
    assert CAP + ".on" not in [c.key for c in at.checkbox]
    assert CAP not in [n.key for n in at.number_input]


def test_client_cap_reaches_the_run_and_shows_the_client_wait(at):
    import json

    from sim import explorer as X

    at.checkbox(key=CAP + ".on").check().run()
    at.number_input(key=CAP).set_value(2).run()
    before = metrics(at)
    assert before["client wait p90 (s)"] == "–" and before["client wait mean (s)"] == "–"
    m = small_run(at)
    key = json.loads(at.session_state["explore_result"].key)
    assert key["workload"]["arrival"]["max_concurrency"] == 2
    # Two in flight at 14 requests/s: requests queue in the client.
    assert float(m["client wait p90 (s)"]) > 0 and float(m["client wait mean (s)"]) > 0
    text = X.edited_scenario_yaml(at.session_state["base"], at.session_state["knobs"])
    assert "max_concurrency: 2" in text

    # A closed loop refuses a cap: the page drops it instead of building that scenario.
    at.selectbox(key="knob.workload.arrival.kind").set_value("closed_loop").run()
    at.button(key="run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "max_concurrency" not in json.loads(at.session_state["explore_result"].key)["workload"]["arrival"]
    assert "client wait p90 (s)" not in metrics(at)


def test_client_cap_off_leaves_the_default_scenario_as_loaded(at):
    import json

    from sim import explorer as X

    def canonical() -> str:
        return X.canonical_json(
            X.resolve_scenario(X.edited_scenario(at.session_state["base"], at.session_state["knobs"]))
        )

    default = X.canonical_json(X.resolve_scenario(X.builtin_scenario("chat-api")))
    assert canonical() == default
    assert "max_concurrency" not in json.loads(default)["workload"]["arrival"]
    at.checkbox(key=CAP + ".on").check().run()
    assert canonical() != default
    at.checkbox(key=CAP + ".on").uncheck().run()
    assert not at.exception, at.exception
    assert canonical() == default
    assert "client wait p90 (s)" not in metrics(at)
