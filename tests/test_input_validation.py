"""Validation at every boundary (issue 28): finite ranges named in the error, strict types, bounded
reading of YAML/JSON/traces, profiles validated as a format, budgets, output paths, conservation."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sim.config import Scenario, key_ranges, load_scenario, parse_override, read_scenario_dict
from sim.cost.profile import PROFILE_DIR, Profile, load_profile
from sim.engine.budget import EXPLORER_BUDGET, BudgetExceeded, RunBudget
from sim.engine.cluster import simulate
from sim.errors import ConfigError, quote
from sim.inputs import load_json, load_yaml
from sim.limits import MAX_NESTING, MAX_REQUESTS, MAX_TRACE_ROWS
from sim.output.staging import out_dir, staged
from sim.strict import scalar_kinds
from sim.workload.traces import read_trace

ROOT = Path(__file__).resolve().parent.parent
#: A 324-byte YAML value holding 9**9 strings once its aliases are expanded.
LOL = (
    '[&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"], '
    + ", ".join(f"&{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi"))
    + "]"
)


def _load(**over) -> Scenario:
    return load_scenario("chat-api", dict(over))


def _error(**over) -> str:
    with pytest.raises(ConfigError) as e:
        _load(**over)
    return str(e.value)


def _numeric_fields(model=Scenario, prefix=""):
    """(dotted key, kinds) of every numeric scalar field (lengths.base is not walked twice)."""
    from pydantic import BaseModel

    for name, info in model.model_fields.items():
        if name == "base_dir":
            continue
        ann = info.annotation
        sub = next(
            (c for c in [ann, *getattr(ann, "__args__", ())] if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if sub is not None:
            if name != "base":
                yield from _numeric_fields(sub, f"{prefix}{name}.")
            continue
        kinds = scalar_kinds(ann)
        if kinds & {int, float}:
            yield prefix + name, kinds


NUMERIC = list(_numeric_fields())
FLOATS = [k for k, kinds in NUMERIC if float in kinds]


# --- ranges ------------------------------------------------------------------------------------


def test_every_numeric_knob_has_a_finite_range():
    ranges = key_ranges()
    assert {k for k, _ in NUMERIC} == set(ranges)
    assert all(r != "(no range)" for r in ranges.values()), ranges


@pytest.mark.parametrize(
    "over,needle",
    [
        (
            {"workload.num_requests": 10_000_000_000},
            "workload.num_requests: got 10000000000; an integer in [1, 10000000]",
        ),
        ({"workload.arrival.rate": 1e-308}, "workload.arrival.rate: got 1e-308; a finite number in [1e-06, 1e+06]"),
        ({"allocator.compaction.period_s": 1e-9}, "a finite number in [0.001, 1e+09]"),
        ({"workload.prefix.prefix_tokens": 100_000_000}, "an integer in [1, 16777216]"),
        ({"seed": -1}, "seed: got -1; an integer in [0, 9223372036854775807]"),
        ({"workload.lengths.prompt_sigma": 50}, "a finite number in [0, 10]"),
        ({"workload.arrival.time_scale": math.inf}, "workload.arrival.time_scale: got inf; a finite number"),
        ({"cost_model.step_overhead_s": math.inf}, "cost_model.step_overhead_s: got inf"),
        (
            {"workload.prefix.fraction": 1, "workload.prefix.prefix_tokens": 65536, "workload.prefix.groups": 65536},
            "prefix_tokens × groups",
        ),
    ],
)
def test_out_of_range_values_name_the_range(over, needle):
    assert needle in _error(**over)


@pytest.mark.parametrize("key", FLOATS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused_everywhere(key, value):
    msg = _error(**{key: value})
    assert msg.startswith(key) and "finite" in msg


def test_numbers_in_range_still_load():
    sc = _load(
        **{
            "workload.arrival.rate": 1e-6,
            "workload.num_requests": MAX_REQUESTS,
            "seed": 2**63 - 1,
            "allocator.compaction.period_s": 1e-3,
        }
    )
    assert sc.workload.num_requests == MAX_REQUESTS


# --- strict types --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [k for k, _ in NUMERIC])
def test_true_is_not_a_number(key):
    assert "not true/false" in _error(**{key: True})


@pytest.mark.parametrize(
    "key", ["scheduler.chunked_prefill", "allocator.compaction.enabled", "allocator.prefix_caching.enabled"]
)
@pytest.mark.parametrize("value", [1, 0.0, "yes", "false"])
def test_numbers_and_words_are_not_booleans(key, value):
    assert "true or false" in _error(**{key: value})


def test_yaml_1_1_exponent_strings_are_numbers():
    # PyYAML reads 1e-3 and 1e3 as text; they mean numbers.
    key, value = parse_override("allocator.compaction.period_s=1e-3")
    assert value == "1e-3" and _load(**{key: value}).allocator.compaction.period_s == 1e-3
    assert _load(**{"workload.num_requests": "1e3"}).workload.num_requests == 1000


@pytest.mark.parametrize(
    "over",
    [
        {"cost_model.profile": ""},
        {"workload.lengths.path": ""},
        {"engine.terms_file": ""},
        {"allocator.kind": "static", "allocator.reserve": True},
    ],
)
def test_empty_paths_and_bool_reserve_are_refused(over):
    _error(**over)


def test_an_empty_terms_file_is_refused_as_other_paths_are():
    assert _error(**{"engine.terms_file": ""}) == "engine.terms_file: got ''; a non-empty string"


@pytest.mark.parametrize("key", ["engine.terms_file", "model.hf_config", "workload.lengths.path", "cost_model.profile"])
def test_a_path_that_is_not_a_string_is_one_standard_line(key):
    msg = _error(**{key: 5})
    assert msg == f"{key}: got 5; a file path (a non-empty string)", msg


def test_base_dir_is_not_settable(tmp_path):
    assert "base_dir: got '/etc'; not a scenario key" in _error(base_dir="/etc")
    f = tmp_path / "s.yaml"
    f.write_text("base_dir: /etc\n")
    with pytest.raises(ConfigError, match="base_dir"):
        load_scenario(f)


@pytest.mark.parametrize(
    "text,what", [("false\n", "bool"), ("0\n", "int"), ("- a\n", "list"), ("", "empty"), ("null\n", "empty")]
)
def test_a_scenario_file_must_hold_a_mapping(tmp_path, text, what):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match="a YAML mapping") as e:
        load_scenario(f, {"workload.arrival.rate": 3})
    assert what in str(e.value)


# --- bounded reading -------------------------------------------------------------------------


def test_billion_laughs_is_refused_quickly_and_never_expanded(tmp_path):
    for doc in (f"lol: {LOL}\n", f"description: {LOL}\n", f"workload: {{num_requests: {LOL}}}\n"):
        f = tmp_path / "s.yaml"
        f.write_text(doc)
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="aliases") as e:
            read_scenario_dict(f)
        assert time.perf_counter() - t0 < 2.0 and len(str(e.value)) < 500


def test_shared_aliases_are_fine():
    assert load_yaml("a: &x {k: 1}\nb: *x\n", "k", "s") == {"a": {"k": 1}, "b": {"k": 1}}


def test_quote_is_bounded():
    nested = yaml.safe_load(f"x: {LOL}")["x"]  # built by PyYAML: shared, 9**9 leaves
    assert len(quote(nested)) <= 400 and len(quote(10**100_000)) < 60


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 1000, 20_000])
def test_deep_yaml_and_json_are_refused_fast(depth):
    for text in ("[" * depth + "]" * depth, "{a: " * depth + "1" + "}" * depth):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="nesting of at most 64"):
            load_yaml("x: " + text, "k", "s")
        assert time.perf_counter() - t0 < 2.0
    with pytest.raises(ConfigError, match="nesting of at most 64"):
        load_json("[" * depth + "]" * depth, "k", "s")


def test_scenario_files_that_are_not_utf8_are_named(tmp_path):
    f = tmp_path / "s.yaml"
    for data, needle in (
        (("name: x\n").encode("utf-16"), "UTF-16"),
        (b"name: x\x00\x01", "binary"),
        (b"name: caf\xe9\n", "line 1 is not UTF-8"),
    ):
        f.write_bytes(data)
        with pytest.raises(ConfigError, match=needle):
            load_scenario(f)


def test_parquet_trace_rows_come_from_metadata(tmp_path, monkeypatch):
    from sim.workload import traces

    assert traces.MAX_TRACE_ROWS == MAX_TRACE_ROWS
    monkeypatch.setattr(traces, "MAX_TRACE_ROWS", 1000)  # the real limit, 10M rows, at a test's size
    n = 1001
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(
            {
                "arrival_s": pa.array(np.zeros(n)),
                "prompt_tokens": pa.array(np.full(n, 10)),
                "output_tokens": pa.array(np.full(n, 5)),
            }
        ),
        path,
    )
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("read before the row count"))
    with pytest.raises(ConfigError, match="at most 1000 rows"):
        read_trace(path)


def test_jsonl_errors_name_the_line(tmp_path):
    rows = [json.dumps({"timestamp": i, "input_length": 10, "output_length": 5}) for i in range(20)]
    for bad, needle in (
        ("5", "line 11 holds a int"),
        ("[1, 2]", "line 11 holds a list"),
        ('{"timestamp": 1,', "valid JSON on line 11"),
        ("[" * 5000 + "]" * 5000, "line 11"),
    ):
        lines = list(rows)
        lines[10] = bad
        p = tmp_path / "t.jsonl"
        p.write_text("\n".join(lines) + "\n")
        with pytest.raises(ConfigError, match=re.escape(needle)):
            read_trace(p)


def test_mooncake_hash_ids_follow_their_rows_when_sorted(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 2048, "output_length": 10, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 1000, "input_length": 2048, "output_length": 10, "hash_ids": [5, 6, 7, 8]},
        {"timestamp": 500, "input_length": 512, "output_length": 10, "hash_ids": [9]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tr = read_trace(p, cache=False)
    assert tr.arrival_s.tolist() == [0.0, 0.5, 1.0] and tr.prompt_tokens.tolist() == [2048, 512, 2048]
    assert tr.hash_ids == ((1, 2, 3, 4), (9,), (5, 6, 7, 8))
    # The same rows in time order read the same.
    s = tmp_path / "s.jsonl"
    s.write_text("\n".join(json.dumps(r) for r in sorted(rows, key=lambda r: r["timestamp"])) + "\n")
    assert read_trace(s, cache=False).hash_ids == tr.hash_ids


@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Paris"])
@pytest.mark.parametrize("unit,scale", [("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9)])
def test_parquet_timestamp_arrivals_are_read_in_their_unit(tmp_path, unit, scale, tz):
    p = tmp_path / "t.parquet"
    start = 1_700_000_000 * scale  # a date, as a logged timestamp column holds
    arrivals = pa.array([start, start + 10 * scale, start + 3 * scale], pa.timestamp(unit, tz=tz))
    pq.write_table(pa.table({"arrival_s": arrivals, "prompt_tokens": [100] * 3, "output_tokens": [10] * 3}), p)
    assert read_trace(p, cache=False).arrival_s.tolist() == pytest.approx([0.0, 3.0, 10.0], abs=1e-6)


@pytest.mark.parametrize(
    "value,needle",
    [
        ("1e30", "integers in [1, 16777216]"),
        ("inf", "integers in"),
        ("9223372036854775808", "token counts"),
        ("nan", "token counts must"),
    ],
)
def test_trace_token_counts_have_a_range(tmp_path, value, needle):
    p = tmp_path / "t.csv"
    p.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,{value},5\n")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        read_trace(p)


@pytest.mark.parametrize(
    "value,needle",
    [
        ("inf", "row 1 is inf; times must be finite and >= 0"),
        ("-1", "row 1 is -1; times must be finite and >= 0"),
        ("nan", "empty values"),
        ("1e300", "arrivals within 1e+09 s"),
    ],
)
def test_trace_times_are_finite(tmp_path, value, needle):
    p = tmp_path / "t.csv"
    p.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,10,5\n{value},10,5\n")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        read_trace(p)


# --- profiles ----------------------------------------------------------------------------------


def _profile(tmp_path, edit) -> str:
    doc = json.loads((PROFILE_DIR / "cpu-reference.json").read_text())
    edit(doc)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d["cpu_overhead"].pop("by_tp"), "cpu_overhead.by_tp: got nothing; a required key"),
        (lambda d: d["memory"].pop("latency_s"), "memory.latency_s: got nothing"),
        (lambda d: d["elementwise"].pop("kernels_per_layer"), "elementwise.kernels_per_layer: got nothing"),
        (lambda d: d["memory"].__setitem__("bandwidth_bytes_per_s", 0), "memory.bandwidth_bytes_per_s: got 0"),
        # The roofline divides by the device's peaks: 0 would leave every request unfinished.
        (lambda d: d["device"].__setitem__("peak_bf16_flops", 0), "device.peak_bf16_flops: got 0; a number > 0"),
        (lambda d: d["device"].pop("hbm_bandwidth"), "device.hbm_bandwidth: got nothing; a number > 0"),
        (lambda d: d["device"].__setitem__("peak_fp8_flops", -1), "device.peak_fp8_flops: got -1; a number >= 0"),
        (lambda d: d["memory"].__setitem__("latency_s", -1e-6), "memory.latency_s: got -1e-06"),
        (lambda d: d["memory"].__setitem__("latency_s", "fast"), "memory.latency_s: got 'fast'; a number"),
        (lambda d: d["gemm"]["256x256:bf16"]["t_s"].__setitem__(3, math.nan), 'gemm["256x256:bf16"].t_s[3]: got nan'),
        (lambda d: d["gemm"]["256x256:bf16"]["x"].reverse(), 'gemm["256x256:bf16"].x[1]'),
        (lambda d: d["generation_attention"]["8/4/32:bf16"]["t_s"][0].__setitem__(0, None), "t_s[0][0]: got None"),
        (lambda d: d["layout"].__setitem__("paged_overhead", True), "layout.paged_overhead: got True; a number"),
    ],
)
def test_profile_errors_name_the_file_and_json_path(tmp_path, edit, needle):
    path = _profile(tmp_path, edit)
    with pytest.raises(ConfigError) as e:
        load_profile(path)
    assert str(e.value).startswith(path) and needle in str(e.value), str(e.value)


def test_profile_that_is_a_list_or_truncated(tmp_path):
    p = tmp_path / "p.json"
    text = (PROFILE_DIR / "cpu-reference.json").read_text()
    p.write_text("[" + text + "]")
    with pytest.raises(ConfigError, match="a JSON object"):
        load_profile(p)
    p.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match="valid JSON"):
        load_profile(p)


def test_builtin_profiles_pass_the_format():
    from sim.cost.profile import list_profiles

    for name in list_profiles():
        assert isinstance(load_profile(name), Profile)


# --- budgets -----------------------------------------------------------------------------------


def test_budgets_stop_a_run_with_one_line():
    sc = _load(**{"workload.num_requests": 300})
    with pytest.raises(BudgetExceeded, match="at most 100 requests"):
        simulate(sc, budget=RunBudget(max_requests=100))
    with pytest.raises(BudgetExceeded, match="at most 500 events"):
        simulate(sc, budget=RunBudget(max_events=500))
    stepped = _load(**{"workload.num_requests": 2000, "engine.mode": "step"})  # > 4,096 events: the clock is read
    with pytest.raises(BudgetExceeded, match="wall time"):
        simulate(stepped, budget=RunBudget(max_wall_s=1e-9))


def test_a_budget_does_not_change_results():
    sc = _load(**{"workload.num_requests": 200})
    assert simulate(sc).summary == simulate(sc, budget=RunBudget(10**6, 10**9, 1e6)).summary


def test_the_explorer_runs_within_its_budget():
    from sim import explorer as X

    sc = _load(**{"workload.num_requests": EXPLORER_BUDGET.max_requests + 1, "workload.arrival.rate": 1000.0})
    with pytest.raises(BudgetExceeded, match="explorer budget: requests"):
        X.run_canonical(X.canonical_json(sc))


# --- output paths ------------------------------------------------------------------------------


def test_out_dir_refuses_what_cannot_be_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    for raw, needle in (
        ("", "empty given"),
        (str(tmp_path / "f"), "is a file"),
        (str(tmp_path / "f" / "x"), "which is a file"),
        ("/dev/null", "not a folder"),
        ("/proc/kvsim-x", "can write"),
        (str(tmp_path / ("x" * 300)), "at most 255 bytes"),
    ):
        with pytest.raises(ConfigError, match=needle):
            out_dir(raw)


def test_staged_outputs_replace_all_or_nothing(tmp_path):
    dest = out_dir(tmp_path / "run")
    (dest / "summary.json").write_text("old")
    with pytest.raises(RuntimeError):
        with staged(dest) as stage:
            (stage / "summary.json").write_text("new")
            raise RuntimeError("interrupted")
    assert (dest / "summary.json").read_text() == "old" and [p.name for p in dest.iterdir()] == ["summary.json"]
    with staged(dest) as stage:
        (stage / "summary.json").write_text("new")
    assert (dest / "summary.json").read_text() == "new" and [p.name for p in dest.iterdir()] == ["summary.json"]


# --- conservation (class 8) --------------------------------------------------------------------


def test_a_prompt_beyond_its_reservation_is_rejected_not_truncated():
    # bench/hostile.py's class-8 CI case: static p50 reservation, truncate, memory pressure (many prefills share
    # the token budget, so a long prompt is admitted one chunk at a time).
    sc = _load(
        **{
            "allocator.kind": "static",
            "allocator.reserve": "p50",
            "allocator.overflow": "truncate",
            "workload.num_requests": 1000,
            "workload.arrival.rate": 100.0,
        }
    )
    res = simulate(sc)
    t = res.requests.to_pydict()
    ok = np.array(t["status"]) == "completed"
    assert (np.array(t["generated_tokens"])[ok] >= 1).all()
    assert (np.array(t["first_token_s"])[ok] >= np.array(t["arrival_s"])[ok]).all()
    reasons = res.summary["rejected_by_reason"]
    assert reasons.get("prompt_exceeds_reservation", 0) > 0 and res.summary["ttft_s"]["mean"] >= 0
    # The same prompts are refused whatever the load: the reason no longer depends on chunking.
    calm = simulate(
        _load(
            **{
                "allocator.kind": "static",
                "allocator.reserve": "p50",
                "allocator.overflow": "truncate",
                "workload.num_requests": 1000,
                "workload.arrival.rate": 1.0,
            }
        )
    )
    assert calm.summary["rejected_by_reason"] == reasons


def test_docs_list_every_range():
    text = (ROOT / "docs" / "scenario.md").read_text()
    section = text.split("## Allowed ranges", 1)[1].split("\n## ", 1)[0]
    assert dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, re.M)) == key_ranges()


def test_docs_state_the_explorer_budget():
    text = (ROOT / "docs" / "app.md").read_text()
    b = EXPLORER_BUDGET
    assert f"| requests per run | {b.max_requests:,} |" in text
    assert f"| simulated events per run | {b.max_events:,} |" in text
    assert f"| wall time per run | {b.max_wall_s:g} s |" in text


def test_the_explorer_refuses_a_large_run_before_drawing_it():
    from sim import explorer as X

    for over in (
        {"workload.num_requests": MAX_REQUESTS},
        {"workload.num_requests": None, "workload.duration_s": 1e6, "workload.arrival.rate": 1000.0},
    ):
        sc = _load(**over)
        t0 = time.perf_counter()
        with pytest.raises(BudgetExceeded, match="explorer budget: requests"):
            X.run_canonical(X.canonical_json(sc))
        assert time.perf_counter() - t0 < 1.0  # 10M and 1e9 requests would take seconds to draw
