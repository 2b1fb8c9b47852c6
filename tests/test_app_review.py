"""Defects found driving the explorer in a headless browser (docs/app.md), each pinned without one:
the page logic through ``streamlit.testing.v1.AppTest``, the rest on :mod:`sim.explorer` directly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sim import explorer as X

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")


@pytest.fixture()
def at(monkeypatch):
    pytest.importorskip("streamlit")
    pytest.importorskip("plotly")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KVSIM_APP_PREWARM", "0")
    app = AppTest.from_file(APP, default_timeout=180)
    app.run()
    assert not app.exception, app.exception
    return app


# --- Compare: ties and stale results ---------------------------------------------------------


def test_compare_marks_every_column_tied_for_best_or_worst():
    # Seen: rejections 0 | 0 | 15 painted only the first 0 green.
    kp = {"a": {"rejected": 0}, "b": {"rejected": 0}, "c": {"rejected": 15}, "d": {"rejected": 15}}
    row = {r["KPI"]: r for r in X.compare_rows(kp)}["rejections"]
    assert row["_best"] == ["a", "b"] and row["_worst"] == ["c", "d"]
    same = {r["KPI"]: r for r in X.compare_rows({"a": {"rejected": 3}, "b": {"rejected": 3}})}["rejections"]
    assert not same["_best"] and not same["_worst"]


def test_compare_results_are_marked_stale_when_a_configuration_changes(at):
    at.number_input(key="knob.workload.num_requests").set_value(100).run()
    at.radio(key="page").set_value("Compare").run()
    at.radio(key="cmp_n").set_value(2).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])

    def stale() -> bool:
        return any("changed since this comparison" in c.value for c in at.caption)

    assert not stale()
    at.selectbox(key="cmp_kind_1").set_value("paged").run()  # the table still shows static
    assert stale()
    at.button(key="compare_run").click().run()
    assert not stale()
    at.number_input(key="knob.workload.num_requests").set_value(120).run()  # a sidebar knob
    assert stale()


# --- messages are shown as written, not as Markdown ------------------------------------------


def test_plain_markdown_escapes_markup_only():
    text = "allocator.{block_size, prefix_caching.*}; every kind reads allocator.preemption.*"
    assert X.plain_markdown(text) == text.replace("*", "\\*")
    assert X.plain_markdown("max_model_len _x_ $5 ~a [b] <c> `d` \\") == (
        "max_model_len \\_x\\_ \\$5 \\~a \\[b\\] \\<c\\> \\`d\\` \\\\"
    )


def test_ignored_sweep_axis_message_keeps_its_wildcards(at):
    # Seen: "paged reads allocator.{block_size, page_reuse, prefix_caching.}; every kind reads
    # allocator.preemption." in italics: st.error read the two "*" as emphasis.
    pytest.importorskip("sim.analysis.sweep")
    at.radio(key="page").set_value("Sweeps & plan").run()
    at.radio(key="sw_src").set_value("Run a small sweep").run()
    at.selectbox(key="sw_a1").set_value("allocator.reserve").run()
    at.selectbox(key="sw_a2").set_value("(none)").run()
    at.button(key="sweep_run").click().run()
    assert not at.exception, at.exception
    (err,) = [e.value for e in at.error]
    assert "allocator.kind paged ignores it" in err
    assert "prefix_caching.\\*" in err and "preemption.\\*" in err, err


# --- Calibration: the upload's confirmation --------------------------------------------------


def test_profile_upload_says_it_was_added(at):
    from sim.cost.profile import PROFILE_DIR, list_profiles

    if not list_profiles():
        pytest.skip("no built-in profiles")
    at.radio(key="page").set_value("Calibration").run()
    data = (PROFILE_DIR / f"{list_profiles()[0]}.json").read_bytes()
    at.file_uploader(key="profile_upload").upload("mine.json", data, "application/json")
    at.run()
    assert not at.exception, at.exception
    assert "mine" in at.selectbox(key="prof_name").options
    assert any("mine" in s.value and "added" in s.value for s in at.success), [s.value for s in at.success]
    at.run()  # said once
    assert not any("added" in s.value for s in at.success)


# --- Downloads: the scenario with an uploaded profile runs ----------------------------------


def test_scenario_download_names_an_uploaded_profile_by_its_file(tmp_path, monkeypatch):
    # Seen: "cost_model: {profile: mine}", which kvsim run refuses (neither built-in nor a file).
    from sim.cost.profile import PROFILE_DIR, list_profiles, load_profile

    if not list_profiles():
        pytest.skip("no built-in profiles")
    store = X.UploadStore()
    name = store.add_profile("mine.json", (PROFILE_DIR / f"{list_profiles()[0]}.json").read_bytes())
    base = X.builtin_scenario("chat-api")
    knobs = {**X.knobs_from_scenario(base), **X.DEFAULT_SLO, "cost_model.profile": name}
    text = X.edited_scenario_yaml(base, knobs, [], store.profiles)
    assert str(store.dir) not in text
    assert "run kvsim from the folder that holds mine.json" in text
    assert yaml.safe_load(text)["cost_model"]["profile"] == "mine.json"
    shutil.copy(store.profiles[name], tmp_path / "mine.json")
    monkeypatch.chdir(tmp_path)
    assert load_profile(yaml.safe_load(text)["cost_model"]["profile"]).device
    # Built-in profiles and the scenario without uploads are written as before.
    plain = X.edited_scenario_yaml(base, {**knobs, "cost_model.profile": "auto"}, [], store.profiles)
    assert "Uploaded profile" not in plain


def test_sweep_and_plan_results_are_marked_stale_when_a_knob_changes(at):
    # Seen: a plan's recommendation (and a sweep's charts) stayed on screen, unmarked, after the
    # GPU or the SLO in the sidebar changed.
    pytest.importorskip("sim.analysis.sweep")
    pytest.importorskip("sim.analysis.planner")

    def stale(what: str) -> bool:
        return any(f"changed since this {what}" in c.value for c in at.caption)

    at.number_input(key="knob.workload.num_requests").set_value(60).run()
    at.radio(key="page").set_value("Sweeps & plan").run()
    at.radio(key="sw_src").set_value("Run a small sweep").run()
    at.selectbox(key="sw_a1").set_value("allocator.kind").run()
    at.selectbox(key="sw_a2").set_value("(none)").run()
    at.number_input(key="sw_n").set_value(60).run()
    at.button(key="sweep_run").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert not stale("sweep")
    at.number_input(key="sw_n").set_value(100).run()
    assert stale("sweep")
    at.number_input(key="sw_n").set_value(60).run()
    assert not stale("sweep")

    at.multiselect(key="plan_cands").set_value(["paged"])
    at.number_input(key="plan_n").set_value(60)
    at.button(key="plan_run").click().run()
    assert not at.exception and at.session_state["plan"], at.exception
    assert not stale("plan")
    at.number_input(key="knob.slo.ttft_s").set_value(2.0).run()
    assert stale("plan") and stale("sweep")  # each sweep point's slo.attainment is judged on the sidebar's SLO
    at.selectbox(key="knob.gpu.name").set_value("H200-SXM-141GB").run()
    assert stale("plan") and stale("sweep")


def test_compare_labels_name_every_knob_off_its_default():
    # Seen: two paged columns differing only in page_reuse were "paged b=16" and "paged b=16 #2".
    cfgs = [
        {"kind": "paged", "block_size": 16, "page_reuse": "generation"},
        {"kind": "paged", "block_size": 16, "page_reuse": "zero"},
        {"kind": "static", "reserve": "p95", "overflow": "truncate", "placement": "buddy", "block_size": 16},
    ]
    assert X.unique_labels(cfgs) == [
        "paged b=16",
        "paged b=16 page_reuse=zero",
        "static p95 (truncate) placement=buddy",
    ]
