"""sim.explorer: the explorer's glue (knobs, untrusted uploads, cache keys, KPIs, downloads)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import SMALL_EXPLORER as SMALL
from sim import explorer as X
from sim.config import SCENARIO_DIR, apply_overrides, load_scenario, scenario_from_dict
from sim.errors import ConfigError
from sim.explorer import launcher

# --- knobs -------------------------------------------------------------------------------


def test_unchanged_knobs_make_no_overrides():
    assert "chat-api" in X.builtin_scenarios()
    for name in X.builtin_scenarios():
        data = X.builtin_scenario(name)
        assert X.overrides_from_knobs(X.knobs_from_scenario(data), scenario_from_dict(data)) == {}


def test_router_knobs_reach_the_scenario_only_with_their_router():
    base = X.builtin_scenario("chat-api")
    k = X.knobs_from_scenario(base)
    assert k["router"] == "least_outstanding" and "length_split" in X.ROUTERS
    # The pool's knobs, hidden under another router, do not leak into the run.
    assert X.overrides_from_knobs({**k, "length_split.replicas": 3}, base) == {}
    split = {**k, "router": "length_split", "gpu.replicas": 4, "length_split.replicas": 2}
    over = X.overrides_from_knobs(split, base)
    assert over == {"gpu.replicas": 4, "router": "length_split", "length_split.replicas": 2}
    assert X.resolve_scenario(apply_overrides(base, over)).length_split.long_replicas(4) == 2
    # A scenario giving the pool as a share shows its count; a new count replaces the share.
    shared = apply_overrides(base, {"gpu.replicas": 8, "router": "length_split", "length_split.share": 0.25})
    ks = X.knobs_from_scenario(shared)
    assert ks["length_split.replicas"] == 2 and X.overrides_from_knobs(ks, shared) == {}
    over = X.overrides_from_knobs({**ks, "length_split.replicas": 3}, shared)
    assert over == {"length_split.replicas": 3, "length_split.share": None}
    assert X.resolve_scenario(apply_overrides(shared, over)).length_split.long_replicas(8) == 3


def test_overrides_only_for_changed_and_relevant_knobs():
    base = X.builtin_scenario("chat-api")
    k = X.knobs_from_scenario(base)
    k.update(
        {
            "allocator.kind": "static",
            "allocator.reserve": "p95",
            "workload.arrival.cv": 4.0,
            "gpu.replicas": 2,
            "slo.ttft_s": 0.1,
        }
    )
    over = X.overrides_from_knobs(k, base)
    # A new allocator kind takes all its knobs (KINDS); cv belongs to gamma arrivals: hidden
    # under poisson, it must not leak into the run; the SLO is not a scenario key.
    static_knobs = {f"allocator.{n}" for n in X.allocator_knobs("static")}
    assert set(over) == {"allocator.kind", "gpu.replicas"} | static_knobs
    assert (over["allocator.kind"], over["allocator.reserve"], over["gpu.replicas"]) == ("static", "p95", 2)
    assert "allocator.growth" not in over and "allocator.long_threshold" not in over  # other kinds' knobs
    k["allocator.kind"] = "paged"
    assert X.overrides_from_knobs(k, base) == {"gpu.replicas": 2}  # static knobs do not apply to paged
    k["allocator.kind"] = "static"
    k["workload.arrival.kind"] = "gamma"
    assert X.overrides_from_knobs(k, base)["workload.arrival.cv"] == 4.0
    k["allocator.reserve"] = "2048"
    assert X.overrides_from_knobs(k, base)["allocator.reserve"] == 2048
    # Switching kind takes every knob of the new kind, defaults included.
    k["workload.arrival.kind"] = "closed_loop"
    over = X.overrides_from_knobs(k, base)
    assert over["workload.arrival.concurrency"] == 16 and over["workload.arrival.think_time_s"] == 0.0
    X.resolve_scenario(apply_overrides(base, over))


def test_client_cap_is_an_override_of_open_loop_arrivals_only():
    base = X.builtin_scenario("chat-api")
    k = X.knobs_from_scenario(base)
    assert k["workload.arrival.max_concurrency"] is None  # off unless the scenario sets one
    k["workload.arrival.max_concurrency"] = 4
    assert X.overrides_from_knobs(k, base) == {"workload.arrival.max_concurrency": 4}
    text = X.edited_scenario_yaml(base, k)
    assert yaml_arrival(text)["max_concurrency"] == 4
    k["workload.arrival.kind"] = "gamma"
    assert X.overrides_from_knobs(k, base)["workload.arrival.max_concurrency"] == 4
    # The config refuses a cap with a closed loop: the knob left set must not reach that scenario.
    k["workload.arrival.kind"] = "closed_loop"
    assert "workload.arrival.max_concurrency" not in X.overrides_from_knobs(k, base)
    capped = apply_overrides(base, {"workload.arrival.max_concurrency": 4})
    kc = X.knobs_from_scenario(capped)
    assert kc["workload.arrival.max_concurrency"] == 4
    kc["workload.arrival.kind"] = "closed_loop"
    assert "max_concurrency" not in yaml_arrival(X.edited_scenario_yaml(capped, kc))
    # Switching the cap off in the page removes the scenario's own.
    kc = X.knobs_from_scenario(capped)
    kc["workload.arrival.max_concurrency"] = None
    assert X.resolve_scenario(X.edited_scenario(capped, kc)).workload.arrival.max_concurrency is None


def yaml_arrival(text: str) -> dict:
    import yaml

    sc = scenario_from_dict(yaml.safe_load(text))  # what kvsim run would accept
    return sc.workload.arrival.model_dump(exclude_unset=True)


def test_client_wait_kpis_only_with_a_client_cap():
    capped = apply_overrides(SMALL, {"workload.arrival.max_concurrency": 2})
    rd = X.run_canonical(X.canonical_json(X.resolve_scenario(capped)))
    k = X.kpis(rd.summary, rd.requests)
    assert k["client_wait_p90_s"] == rd.summary["client_wait_s"]["p90"] > 0
    assert k["client_wait_mean_s"] == rd.summary["client_wait_s"]["mean"]
    assert X.format_kpi("client_wait_mean_s", 0.25) == "0.250"
    assert X.kpi_delta("client_wait_p90_s", 2.0, 1.0) == ("+1.000", "inverse")
    assert X.KPI_LABELS["client_wait_p90_s"] == "client wait p90 (s)"


def test_edited_yaml_is_runnable_by_kvsim_run(tmp_path):
    from typer.testing import CliRunner

    from sim.cli.main import app

    base = X.builtin_scenario("chat-api")
    k = X.knobs_from_scenario(base)
    k.update(
        {
            "allocator.kind": "static",
            "workload.num_requests": 120,
            "workload.arrival.kind": "gamma",
            "workload.arrival.cv": 2.0,
        }
    )
    text = X.edited_scenario_yaml(base, k)
    path = tmp_path / "edited.yaml"
    path.write_text(text)
    sc = load_scenario(path)
    assert (sc.allocator.kind, sc.workload.num_requests, sc.workload.arrival.kind, sc.workload.arrival.cv) == (
        "static",
        120,
        "gamma",
        2.0,
    )
    res = CliRunner().invoke(app, ["run", str(path), "--quiet", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["allocator"] == "static" and summary["requests"] == 120


def test_canonical_json_round_trips_semantics():
    sc = X.resolve_scenario(
        {"workload": {"duration_s": 5.0, "arrival": {"kind": "poisson", "rate": 2.0}, "lengths": {"kind": "fixed"}}}
    )
    back = X.scenario_from_canonical(X.canonical_json(sc))
    # duration_s without num_requests: num_requests must stay "not given" (it is not a cap then).
    assert "num_requests" not in back.workload.model_fields_set
    assert X.canonical_json(back) == X.canonical_json(sc)
    other = X.resolve_scenario({**SMALL, "allocator": {"kind": "static"}})
    assert X.canonical_json(other) != X.canonical_json(X.resolve_scenario(SMALL))


# --- untrusted input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../../README.md",
        "traces/../../README.md",
        "scenarios/chat-api.yaml",
        str(SCENARIO_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv"),
        42,
    ],
)
def test_trace_paths_must_be_builtin_or_uploaded(path):
    for data in (
        {"workload": {"lengths": {"kind": "empirical", "path": path}}},
        {"workload": {"arrival": {"kind": "trace", "path": path}}},
        {"workload": {"lengths": {"kind": "mixture", "base": {"kind": "empirical", "path": path}}}},
    ):
        with pytest.raises(ConfigError) as e:
            X.resolve_paths(data)
        assert "path" in e.value.key


def test_builtin_and_uploaded_traces_resolve(store):
    rel = "traces/AzureLLMInferenceTrace_conv.csv"
    out = X.resolve_paths({"workload": {"lengths": {"kind": "empirical", "path": rel}}})
    assert out["workload"]["lengths"]["path"] == str(SCENARIO_DIR / rel)
    info = store.add_trace("t.csv", b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\n")
    out = X.resolve_paths({"workload": {"arrival": {"kind": "trace", "path": "t.csv"}}}, store.trace_paths())
    assert Path(out["workload"]["arrival"]["path"]) == info.path and store.dir in info.path.parents


def test_profile_and_base_dir_keys_are_vetted(store):
    for ref in ("/etc/passwd", "../sim/profiles/h100-sxm.json", "x"):
        with pytest.raises(ConfigError, match="cost_model.profile"):
            X.resolve_paths({"cost_model": {"profile": ref}})
    with pytest.raises(ConfigError, match="base_dir"):
        X.resolve_paths({"base_dir": "/etc"})
    for ok in ("auto", "none", *X.builtin_profiles()):
        assert X.resolve_paths({"cost_model": {"profile": ok}})["cost_model"]["profile"] == ok


def test_safe_yaml_refuses_aliases_binary_and_bad_yaml():
    bomb = b'a: &a ["x","x"]\nb: &b [*a,*a]\nc: &c [*b,*b]\nd: [*c,*c]\n'
    with pytest.raises(ConfigError, match="anchors"):
        X.safe_yaml(bomb)
    with pytest.raises(ConfigError, match="UTF-8"):
        X.safe_yaml(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match=r"valid YAML \(.* at line \d+\)"):
        X.safe_yaml(b"a: 1\nb: [unclosed\n")
    with pytest.raises(ConfigError):  # python tags are not constructed by safe_load
        X.safe_yaml(b"!!python/object/apply:os.system ['echo hi']\n")
    assert X.safe_yaml(b"a: {b: 1}\n") == {"a": {"b": 1}}


def test_upload_limits(store):
    with pytest.raises(ConfigError, match="at most"):
        store.parse_scenario("big.yaml", b"#" * (X.MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ConfigError, match="at most"):
        store.add_trace("big.csv", b"0" * (X.MAX_UPLOAD_BYTES + 1))
    with pytest.raises(ConfigError, match="non-empty"):
        store.add_trace("e.csv", b"")
    with pytest.raises(ConfigError, match="ending in"):
        store.add_trace("evil.sh", b"arrival_s,prompt_tokens,output_tokens\n0,1,1\n")


def test_trace_upload_name_of_only_dots_and_extension(store):
    """A name that does end in .csv but has nothing before it is refused for that, not its ending."""
    rows = b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n"
    for name in ("....csv", ".csv", "../.csv"):
        with pytest.raises(ConfigError) as e:
            store.add_trace(name, rows)
        msg = str(e.value)
        assert msg.startswith("trace upload: got") and repr(name) in msg, msg
        assert "a name before its extension" in msg and "ending in" not in msg, msg
    # Cutting a long name to 100 characters keeps its extension instead of refusing it.
    info = store.add_trace("x" * 200 + ".csv", rows)
    assert info.name == "x" * 96 + ".csv"
    assert X.safe_filename(".hidden.CSV", X.TRACE_EXTENSIONS, "trace upload") == "hidden.CSV"


def test_scenario_upload_validates_schema_and_references(store):
    with pytest.raises(ConfigError, match="unknown key"):
        store.parse_scenario("s.yaml", b"allocator: {kind: paged, blocksize: 8}\n")
    with pytest.raises(ConfigError, match="mapping"):
        store.parse_scenario("s.yaml", b"- 1\n- 2\n")
    with pytest.raises(ConfigError, match="built-in trace"):
        store.parse_scenario("s.yaml", b"workload: {lengths: {kind: empirical, path: /etc/hostname}}\n")
    store.add_trace("mine.csv", b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,30,6\n")
    data = store.parse_scenario("s.yaml", b"workload: {num_requests: 10, lengths: {kind: empirical, path: mine.csv}}\n")
    assert data["workload"]["lengths"]["path"] == "mine.csv"  # the raw mapping keeps the user's name


def test_trace_upload_validates_and_cleans_up(store):
    with pytest.raises(ConfigError) as e:
        store.add_trace("../../x.csv", b"arrival_s,prompt_tokens,output_tokens\n0,10,0\n")
    msg = str(e.value)
    assert "x.csv" in msg and "output_tokens" in msg and "row 0" in msg and str(store.dir) not in msg
    assert not list((store.dir / "traces").rglob("*.csv"))
    info = store.add_trace("../../x.csv", b"prompt_tokens,output_tokens,arrival_s\n10,5,0\n12,6,1\n")
    assert info.name == "x.csv" and info.rows == 2 and info.has_arrivals
    stats = store.add_trace("len.csv", b"num_prefill_tokens,num_decode_tokens\n10,5\n")
    assert not stats.has_arrivals


def test_store_close_removes_its_folder():
    s = X.UploadStore()
    assert s._dir is None  # no folder until something is written
    s.close()  # nothing to remove
    s.add_trace("t.csv", b"arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    folder = s.dir
    assert folder.is_dir()
    s.close()
    assert not folder.exists()


def test_profile_upload(store):
    with pytest.raises(ConfigError, match="JSON"):
        store.add_profile("p.json", b"{not json")
    with pytest.raises(ConfigError, match="kvsim-profile"):
        store.add_profile("p.json", b'{"format": "other"}')
    names = X.builtin_profiles()
    if not names:
        pytest.skip("no built-in profiles")
    from sim.cost.profile import PROFILE_DIR

    data = (PROFILE_DIR / f"{names[0]}.json").read_bytes()
    key = store.add_profile(f"{names[0]}.json", data)
    assert key == f"uploaded-{names[0]}"  # never shadows a built-in name
    out = X.resolve_paths({"cost_model": {"profile": key}}, profiles=store.profiles)
    assert Path(out["cost_model"]["profile"]).is_file()


def test_default_sweep_axes():
    t = pa.table(
        {
            "allocator.kind": ["paged", "static"],
            "workload.arrival.rate": [5.0, 5.0],
            "seed": [1, 1],
            "ttft_s.p99": [0.1, 0.2],
        }
    )
    assert X.default_sweep_axes(t) == ("workload.arrival.rate", "allocator.kind")


def test_sweep_upload():
    with pytest.raises(ConfigError, match="Parquet"):
        X.read_sweep_upload("s.parquet", b"garbage")
    buf = io.BytesIO()
    pq.write_table(pa.table({"allocator.kind": ["paged"], "ttft_s.p99": [0.1], "status": ["ok"]}), buf)
    t = X.read_sweep_upload("s.parquet", buf.getvalue())
    assert X.sweep_param_columns(t) == ["allocator.kind"] and X.numeric_columns(t) == ["ttft_s.p99"]


# --- runs, KPIs, downloads -------------------------------------------------------------------


def test_run_kpis_and_downloads():
    key = X.canonical_json(X.resolve_scenario(SMALL))
    rd = X.run_canonical(key)
    assert rd.requests.num_rows == 150 and rd.timeseries.num_rows > 0
    slo = X.slo_from_knobs({"slo.ttft_s": 0.5, "slo.tpot_s": 0.05})
    k = X.kpis(rd.summary, rd.requests, slo)
    assert set(k) == {key for key, *_ in X.KPI_SPEC}
    assert k["kv_waste"] == pytest.approx(1 - rd.summary["kv_token_utilization"])
    assert 0 <= k["slo_attainment"] <= 1
    assert (
        X.kpis(rd.summary, rd.requests, X.slo_from_knobs({"slo.ttft_s": 0, "slo.tpot_s": 0}))["slo_attainment"] is None
    )
    assert pq.read_table(io.BytesIO(X.table_bytes(rd.requests, "parquet"))).equals(rd.requests)
    assert X.table_bytes(rd.timeseries, "csv").decode().startswith('"t_s"')
    from sim.analysis import plots

    html = X.figures_html({"cdf": plots.latency_cdf(rd.requests), "kv": plots.kv_memory(rd.timeseries)})
    assert html.count("<h2>") == 2 and html.count("plotly.js v") == 1  # plotly.js inlined once: works offline


def test_allocator_configs_and_compare_rows():
    cfgs = [
        {"kind": "paged", "block_size": 16},
        {"kind": "static", "reserve": "max_model_len", "overflow": "reject"},
        {"kind": "paged", "block_size": 16},
    ]
    labels = X.unique_labels(cfgs)
    assert labels == ["paged b=16", "static max_model_len (reject)", "paged b=16 #2"]
    over = X.allocator_overrides(cfgs[1])
    assert {
        "allocator.kind": "static",
        "allocator.reserve": "max_model_len",
        "allocator.overflow": "reject",
    }.items() <= over.items() and "allocator.growth" not in over
    assert X.allocator_overrides({"kind": "static", "reserve": "2048"})["allocator.reserve"] == 2048
    base = X.resolve_scenario(SMALL).model_dump(mode="json", exclude_unset=True)
    kp = {}
    for lb, cfg in zip(labels[:2], cfgs[:2]):
        sc = X.resolve_scenario(apply_overrides(base, X.allocator_overrides(cfg)))
        rd = X.run_canonical(X.canonical_json(sc))
        kp[lb] = X.kpis(rd.summary, rd.requests, X.slo_from_knobs({}))
    rows = {r["KPI"]: r for r in X.compare_rows(kp)}
    waste = rows["KV waste"]
    assert waste["_differs"] and waste["_best"] == ["paged b=16"] and waste["_worst"] == [labels[1]]
    same = {"a": {"preemptions": 0}, "b": {"preemptions": 0}}
    assert not {r["KPI"]: r for r in X.compare_rows(same)}["preemptions"]["_differs"]


def test_breakdown_rows_put_runs_side_by_side():
    a = {
        "busy_s": 10.0,
        "iterations": 1200,
        "seconds": {"linear": 6.0, "attention": 3.0, "attention_layout": 0.5, "kv_memory_ops": 0.5, "other": 0.0},
        "share": {"linear": 0.6, "attention": 0.3, "attention_layout": 0.05, "kv_memory_ops": 0.05, "other": 0.0},
    }
    b = {
        "busy_s": 8.0,
        "iterations": 900,
        "seconds": {"linear": 6.0, "attention": 2.0, "kv_memory_ops": 0.0},
        "share": {"linear": 0.75, "attention": 0.25, "kv_memory_ops": 0.0},
    }
    rows = X.breakdown_rows({"paged": a, "static": b})
    assert [r["part"] for r in rows] == ["busy time", "linear", "attention", "attention_layout", "kv_memory_ops"]
    assert rows[0]["paged"] == "10 s (1,200 iterations)"
    by = {r["part"]: r for r in rows}
    assert by["linear"]["static"] == "6 s (75.0%)" and by["attention_layout"]["static"] == "–"
    assert by["kv_memory_ops"]["paged"] == "0.5 s (5.0%)"


def test_kpi_delta_direction():
    assert X.kpi_delta("ttft_p99_s", 2.0, 1.0) == ("+1.000", "inverse")
    assert X.kpi_delta("throughput_tokens_per_s", 900.0, 1000.0) == ("-100", "normal")
    assert X.kpi_delta("kv_waste", 0.5, 0.1)[0] == "+40.0 pp"
    assert X.kpi_delta("rejected", 3, 3) == (None, "off")


def test_parse_axis_values():
    assert X.parse_axis_values("5, 10,20.5", "workload.arrival.rate") == [5, 10, 20.5]
    assert X.parse_axis_values("static, paged, static", "allocator.kind") == ["static", "paged"]
    with pytest.raises(ConfigError, match="one of"):
        X.parse_axis_values("1", "workload.lengths.path")
    with pytest.raises(ConfigError):
        X.parse_axis_values("{a: 1}", "allocator.kind")
    with pytest.raises(ConfigError, match="at most"):
        X.parse_axis_values(",".join(str(i) for i in range(20)), "gpu.replicas")


def test_small_sweep_from_the_page(store):
    pytest.importorskip("sim.analysis.sweep")
    table, failures = X.run_small_sweep(SMALL, {"allocator.kind": ["paged", "static"]}, 40, store)
    assert not failures and table.num_rows == 2
    assert sorted(table.column("allocator.kind").to_pylist()) == ["paged", "static"]
    assert list((store.dir / "sweeps").rglob("part-*.parquet"))  # written in the session folder only
    with pytest.raises(ConfigError, match="points"):
        X.run_small_sweep(
            SMALL, {"workload.arrival.rate": list(range(1, 13)), "gpu.replicas": [1, 2, 3, 4, 5]}, 10, store
        )


def test_the_page_sweep_judges_each_point_against_the_sidebar_slo(store):
    from sim.analysis.slo import SLO

    slo = SLO(ttft_s=0.05, tpot_s=0.02, attainment=0.8)
    table, failures = X.run_small_sweep(SMALL, {"workload.arrival.rate": [2, 50]}, 40, store, slo=slo)
    assert not failures
    rows = sorted(table.to_pylist(), key=lambda r: r["workload.arrival.rate"])
    assert all(0 <= r["slo.attainment"] <= 1 and r["slo.met"] == (r["slo.attainment"] >= 0.8) for r in rows)
    assert rows[0]["slo.attainment"] >= rows[1]["slo.attainment"]
    assert "slo.attainment" in X.numeric_columns(table)
    # No bound in the sidebar: no SLO columns.
    plain, _ = X.run_small_sweep(SMALL, {"workload.arrival.rate": [2, 50]}, 40, store, slo=SLO())
    assert "slo.attainment" not in plain.column_names
    split, failures = X.run_small_sweep(SMALL, {"allocator.kind": ["paged", "static"]}, 40, store, step_breakdown=True)
    assert not failures and "step_share.linear" in X.numeric_columns(split)
    shares = {r["allocator.kind"]: r["step_share.attention_layout"] for r in split.to_pylist()}
    assert shares["paged"] > 0 and shares["static"] == 0


def test_sweep_axis_the_allocator_ignores_is_refused(store):
    """Sweeping a key the scenario's allocator kind does not read would give identical points."""
    static = apply_overrides(SMALL, {"allocator.kind": "static"})
    with pytest.raises(ConfigError) as e:
        X.run_small_sweep(static, {"allocator.block_size": [16, 64, 256]}, 40, store)
    msg = str(e.value)
    assert msg.startswith("sweep axis allocator.block_size: got [16, 64, 256]"), msg
    assert "allocator.kind static with allocator.overflow: reject ignores it" in msg, msg
    assert (
        "static reads allocator.{reserve, overflow, placement, fallback_fraction, block_size, page_reuse, "
        "compaction.*} (block_size only with overflow: fallback)" in msg
    ), msg
    assert not (store.dir / "sweeps").exists()  # refused before anything is written or run
    with pytest.raises(ConfigError, match=r"allocator.kind paged ignores it; paged reads allocator.\{block_size"):
        X.run_small_sweep(SMALL, {"allocator.reserve": ["max_model_len", "p95"]}, 40, store)
    with pytest.raises(ConfigError, match="each of allocator.kind static, dynamic"):
        X.run_small_sweep(SMALL, {"allocator.kind": ["static", "dynamic"], "allocator.block_size": [16, 64]}, 40, store)

    # Read at some point of the sweep (another kind, the fallback region, every kind's preemption): allowed.
    for alloc, grid in (
        ("static", {"allocator.kind": ["static", "paged"], "allocator.block_size": [16, 64]}),
        ("static", {"allocator.overflow": ["reject", "fallback"], "allocator.block_size": [16, 64]}),
        ("dynamic", {"allocator.preemption.mode": ["recompute", "swap"], "workload.arrival.rate": [5, 10]}),
        ("dynamic", {"allocator.compaction": [{"enabled": True}]}),
        ("static", {"allocator.compaction.enabled": [False, True]}),  # static's arena compacts
    ):
        X.check_axes_read(scenario_from_dict({"allocator": {"kind": alloc}}), grid)
    # Compacting needs the arena alone: static's fallback region is not compacted.
    with pytest.raises(ConfigError, match="allocator.kind static with allocator.overflow: fallback ignores it"):
        X.check_axes_read(
            scenario_from_dict({"allocator": {"kind": "static", "overflow": "fallback"}}),
            {"allocator.compaction.enabled": [True]},
        )


# --- calibration --------------------------------------------------------------------------------


def test_profile_rows_and_calibration_figure():
    names = X.builtin_profiles()
    if not names:
        pytest.skip("no built-in profiles")
    rows = X.profile_rows()
    assert [r["profile"] for r in rows] == names
    assert all("%" in r["gemm median / p95 err"] for r in rows)
    from sim.cost.profile import load_profile

    prof = load_profile("h100-sxm" if "h100-sxm" in names else names[0])
    for fam in X.CURVE_FAMILIES:
        keys = X.curve_keys(prof, fam)
        if not keys:
            continue
        key = X.default_curve(prof, fam)
        fig, measured = X.calibration_figure(prof, fam, key)
        assert len(fig.data) >= 1
        pts = X.measured_points(prof, fam, key)
        assert measured == (pts is not None)
        if prof.provenance.get("source_tables") and fam != "allreduce":
            # Built-in profiles ship their tables: the default curve of each family has its measured points.
            assert measured, (fam, key)
            assert len(pts["t_s"]) > 3 and len(fig.data) > 1


# --- launcher -----------------------------------------------------------------------------------


def test_app_command(monkeypatch):
    pytest.importorskip("streamlit")
    seen = {}
    monkeypatch.setattr(launcher.subprocess, "call", lambda cmd, cwd=None: seen.update(cmd=cmd, cwd=cwd) or 0)
    assert X.app_command(["--server.port", "9999"]) == 0
    cmd = seen["cmd"]
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and cmd[4] == str(X.APP_PATH)
    assert X.APP_PATH.is_file() and cmd[-2:] == ["--server.port", "9999"]


# --- defects found with AppTest -------------------------------------------------------------


def test_picking_a_model_takes_its_checkpoint_dtypes():
    base = X.builtin_scenario("chat-api")
    assert base["model"]["weight_dtype"] == "bf16"  # the pin that must not follow a new model
    knobs = X.knobs_from_scenario(base)
    knobs["model.name"] = "Qwen/Qwen3-32B-FP8"
    data = X.edited_scenario(base, knobs)
    assert "weight_dtype" not in data["model"] and "kv_dtype" not in data["model"]
    assert X.resolve_scenario(data).model.weight_dtype != "bf16"  # as `kvsim run --model` gives
    knobs["model.kv_dtype"] = "fp8"  # set in the page: kept
    assert X.edited_scenario(base, knobs)["model"]["kv_dtype"] == "fp8"
    # The base's own model keeps its pinned dtypes.
    assert X.edited_scenario(base, X.knobs_from_scenario(base))["model"]["weight_dtype"] == "bf16"


def _profile_doc() -> dict:
    from sim.cost.profile import PROFILE_DIR, list_profiles

    if "h100-sxm" not in list_profiles():
        pytest.skip("no h100-sxm profile")
    return json.loads((PROFILE_DIR / "h100-sxm.json").read_text())


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["fit_quality"]["gemm"]["overall"].__setitem__("median_rel_err", "n/a"), "gemm.overall"),
        (lambda d: d["fit_quality"].__setitem__("gemm", "bad"), "fit_quality.gemm"),
    ],
)
def test_profile_with_malformed_fit_quality_is_refused(store, mutate, where):
    doc = _profile_doc()
    mutate(doc)
    with pytest.raises(ConfigError, match=where):
        store.add_profile("mine.json", json.dumps(doc).encode())
    assert not store.profiles


def test_profile_rows_tolerate_malformed_fit_quality():
    class P:
        provenance: dict = {}
        device: dict = {}
        fit_quality = {"gemm": "bad", "context_attention": {"overall": {"median_rel_err": "x", "p95_rel_err": 1}}}

    row = X.profile_rows(["p"], loader=lambda n: P())[0]
    assert row["gemm median / p95 err"] == "–" and row["context_attention median / p95 err"] == "–"


def test_overlong_integers_are_one_readable_error(store):
    big = "1" * 5000
    with pytest.raises(ConfigError, match="4,300 digits"):
        store.parse_scenario("s.yaml", f"seed: {big}\n".encode())
    with pytest.raises(ConfigError, match="4,300 digits"):
        store.add_profile("p.json", b'{"a": ' + b"1" * 100_000 + b"}")
    with pytest.raises(ConfigError, match="gpu.replicas.*digits"):
        X.parse_axis_values(big, "gpu.replicas")


def test_sweep_upload_without_numeric_columns_is_refused():
    buf = io.BytesIO()
    pq.write_table(pa.table({"allocator.kind": ["a", "b"]}), buf)
    with pytest.raises(ConfigError, match="numeric column"):
        X.read_sweep_upload("s.parquet", buf.getvalue())


def test_arrival_trace_choices_have_arrival_times():
    from sim.workload.traces import read_trace

    names = X.builtin_arrival_traces()
    assert names and set(names) < set(X.builtin_traces())
    for name, path in X.builtin_traces().items():
        assert (name in names) == (read_trace(path).arrival_s is not None), name


def test_plan_needs_an_slo_bound(store):
    slo = X.slo_from_knobs({**X.DEFAULT_SLO, "slo.ttft_s": 0.0, "slo.tpot_s": 0.0})
    with pytest.raises(ConfigError, match="at least one bound"):
        X.run_small_plan(SMALL, slo, ["paged"], 50, store)


def test_messages_and_plan_download_hide_server_paths():
    base = X.builtin_scenario("chat-api")  # empirical lengths from a built-in trace
    knobs = X.knobs_from_scenario(base)
    knobs.update({"workload.lengths.kind": "uniform", "workload.lengths.prompt_min": 500})
    knobs["workload.lengths.prompt_max"] = 100
    with pytest.raises(ConfigError) as exc:
        X.resolve_scenario(X.edited_scenario(base, knobs))
    assert "prompt_min" in str(exc.value) and "traces/" not in str(exc.value)
    plan = {"scenario": "x", "scenario_file": "/tmp/kvsim-app-abc/plans/1/scenario.yaml", "note": "/srv/d/a.csv"}
    text = X.plan_download(plan, ("/srv/d",))
    assert "kvsim-app" not in text and "/srv/d" not in text and "a.csv" in text


@pytest.mark.parametrize(
    "content, key",
    [
        (b"model: {name: /etc/passwd}\n", "model.name"),
        (b"gpu: {name: /etc/passwd}\n", "gpu.name"),
        (b"allocator: {kind: static, reserve: p101}\n", "allocator.reserve"),
    ],
)
def test_scenario_upload_that_cannot_run_is_refused(store, content, key):
    with pytest.raises(ConfigError, match=key):
        store.parse_scenario("s.yaml", content)


@pytest.mark.parametrize("ref", ["/etc/passwd", "traces/AzureLLMInferenceTrace_conv.csv", "terms.json"])
def test_an_engine_terms_file_is_refused_as_what_it_is(ref):
    """Not vetted as a trace (a built-in trace passed, then failed at Run as unreadable JSON): no
    upload takes a terms file, so the page says to run it with the CLI."""
    with pytest.raises(ConfigError) as e:
        X.resolve_paths({"engine": {"kind": "vllm", "terms_file": ref}})
    msg = str(e.value)
    assert msg.startswith(f"engine.terms_file: got '{ref}'; left out in the explorer") and "kvsim run" in msg
    assert X.resolve_paths({"engine": {"kind": "vllm", "terms_file": None}})["engine"]["terms_file"] is None


def test_upload_limits_are_said_in_the_units_they_are_set_in(store):
    """5 MiB, not '5.2 MB': the docs and the widget say 5 MiB."""
    with pytest.raises(ConfigError) as e:
        store.add_trace("big.csv", b"x" * (5 * 1024 * 1024 + 1))
    assert str(e.value).endswith("got '5,242,881 bytes'; a file of at most 5 MiB (5,242,880 bytes)")


def test_canonical_json_is_the_set_keys_a_sweep_sends():
    """The cache key holds the keys the scenario sets at every depth, as a sweep's point does
    (``set_keys``): pydantic's ``exclude_unset`` dropped a section its parent never marked set, so
    keys kvsim assigned (a ``max_model_len`` cut to the model's context) or set inside it were lost."""
    from sim.analysis.sweep import canonical_scenario

    # No workload section: fit_max_model_len cuts max_model_len to llama-2-7b's 4096 in place.
    short = X.resolve_scenario({"model": {"name": "llama-2-7b"}})
    assert json.loads(X.canonical_json(short)) == canonical_scenario(short)
    assert json.loads(X.canonical_json(short))["workload"]["max_model_len"] == 4096
    # A key set inside a section whose parent does not say so: another scenario, another key.
    sc = X.resolve_scenario(SMALL)
    edited = sc.model_copy(deep=True)
    edited.engine.host_s = 0.01
    assert "engine" not in edited.model_fields_set
    assert X.canonical_json(edited) != X.canonical_json(sc)
    assert X.scenario_from_canonical(X.canonical_json(edited)).engine.host_s == 0.01
    for s in (short, sc, edited):
        assert json.loads(X.canonical_json(s)) == canonical_scenario(s)


# --- the scenario caption ------------------------------------------------------------------


def test_scenario_caption_says_which_parts_the_knobs_changed():
    base = X.builtin_scenario("chat-api")
    knobs = X.knobs_from_scenario(base)
    desc = base["description"]
    assert "llama-3.1-8b on one H100" in desc
    plain = X.scenario_caption("chat-api", base, knobs)
    assert "**chat-api**" in plain and "llama-3.1-8b on one H100" in plain and "changed" not in plain
    assert X.changed_sections(base, knobs) == []

    edited = {**knobs, "model.name": "Qwen/Qwen3-30B-A3B", "gpu.name": "A100-SXM-80GB"}
    assert X.changed_sections(base, edited) == ["model", "gpu"]
    text = X.scenario_caption("chat-api", base, edited)
    # The file's description no longer says what runs: the line names the changed parts and
    # marks the description as the file's.
    assert "changed in the sidebar (model, gpu)" in text and "as loaded: llama-3.1-8b on one H100" in text

    more = {**edited, "workload.arrival.rate": 3.0, "allocator.kind": "static", "seed": 9}
    assert X.changed_sections(base, more) == ["model", "gpu", "workload.arrival", "allocator", "seed"]
    # Knobs set back to the file's values: the caption is the file's again.
    assert X.scenario_caption("chat-api", base, {**more, **knobs}) == plain
    # No description: the changed parts still show.
    bare = {k: v for k, v in base.items() if k != "description"}
    assert X.scenario_caption("up.yaml", bare, edited).startswith("Scenario **up.yaml**, changed in the sidebar")
