"""What a scenario or sweep file may hold: each key once, a request count or a duration, `{}` for the
documented defaults, no validation spec in place of a scenario; errors name the key and value."""

from __future__ import annotations

import typing

import pytest

from sim.analysis.sweep import load_sweep
from sim.config import LengthsConfig, load_scenario, parse_override, read_scenario_dict
from sim.engine.cluster import simulate
from sim.errors import ConfigError
from sim.inputs import load_json, load_yaml
from sim.workload.generator import build_workload

NO_COUNT = "workload.num_requests: got None; an integer in [1, 10000000] (or set workload.duration_s)"


# --- a key given twice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, where, lines",
    [
        ("workload:\n  num_requests: 20\n  num_requests: 30\n", "workload.num_requests", ", on lines 2 and 3"),
        ("grid:\n  workload.arrival.rate: [5]\n  workload.arrival.rate: [20]\n", "grid.workload.arrival.rate", ", on"),
        ("zip:\n  - {a: [1]}\n  - {b: [1], b: [2]}\n", "zip[1].b", " on line 3"),
        ("1: a\n1.0: b\n", "1.0", ", on lines 1 and 2"),  # one key to a dict
        ("a: 1\n'a': 2\n", "a", ", on lines 1 and 2"),
    ],
)
def test_a_key_given_twice_is_named_with_its_lines(text, where, lines):
    with pytest.raises(ConfigError) as e:
        load_yaml(text, "scenario", "f.yaml")
    msg = str(e.value)
    assert msg.startswith("scenario: got 'f.yaml'; YAML with each key at most once per mapping"), msg
    assert f"({where} is given twice{lines}" in msg, msg


def test_merge_keys_and_aliases_are_not_keys_given_twice():
    text = "a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\nd: *x\ne: [*x, *x]\n"
    assert load_yaml(text, "k", "s") == {"a": {"b": 1}, "c": {"b": 2}, "d": {"b": 1}, "e": [{"b": 1}, {"b": 1}]}


def test_a_scenario_file_with_a_key_twice_is_refused(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("name: dup\nworkload:\n  num_requests: 20\n  num_requests: 30\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    assert str(e.value) == (
        f"scenario: got '{f}'; YAML with each key at most once per mapping "
        "(workload.num_requests is given twice, on lines 3 and 4)"
    )


def test_a_sweep_file_with_an_axis_twice_is_refused(tmp_path):
    f = tmp_path / "sw.yaml"
    f.write_text(
        "base: chat-api\nset: {workload.num_requests: 20}\n"
        "grid:\n  workload.arrival.rate: [5, 10]\n  workload.arrival.rate: [20]\n"
    )
    with pytest.raises(ConfigError) as e:
        load_sweep(f)
    assert "(grid.workload.arrival.rate is given twice, on lines 4 and 5)" in str(e.value)


def test_an_override_with_a_key_twice_is_refused():
    with pytest.raises(ConfigError) as e:
        parse_override("workload.lengths={kind: fixed, kind: uniform}")
    assert str(e.value).startswith("--set workload.lengths: got '{kind: fixed, kind: uniform}'; ")
    assert "(kind is given twice on line 1)" in str(e.value)


# --- how many requests --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over",
    [
        {"workload.num_requests": None},
        {"workload.num_requests": None, "workload.arrival": {"kind": "closed_loop", "concurrency": 4}},
    ],
)
def test_no_request_count_and_no_duration_is_named(over):
    with pytest.raises(ConfigError) as e:
        load_scenario("chat-api", over)
    assert str(e.value) == NO_COUNT


def test_no_request_count_is_fine_with_a_duration_or_a_trace():
    assert load_scenario("chat-api", {"workload.num_requests": None, "workload.duration_s": 5}).workload.duration_s == 5
    # Trace arrivals end with the trace.
    assert load_scenario("azure-conv-replay", {"workload.num_requests": None}).workload.num_requests is None


def test_a_count_removed_after_validation_is_an_error_not_an_assertion():
    sc = load_scenario("chat-api")
    sc.workload.num_requests = None  # no validation on assignment
    with pytest.raises(ConfigError) as e:
        build_workload(sc)
    assert str(e.value) == NO_COUNT


def test_a_sweep_point_without_a_request_count_is_invalid_before_it_runs(tmp_path):
    f = tmp_path / "sw.yaml"
    f.write_text("base: chat-api\ngrid:\n  workload.num_requests: [null, 40]\n")
    points = load_sweep(f).points()
    assert [p.error for p in points] == [f"ConfigError: {NO_COUNT}", None]


# --- defaults and lengths ---------------------------------------------------------------------


def test_an_empty_mapping_runs_the_documented_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("{}\n")
    sc = load_scenario(f, {"workload.num_requests": 20})
    assert sc.workload.lengths == LengthsConfig() and sc.workload.lengths.kind == "fixed"
    s = simulate(sc).summary
    assert s["completed"] + s["rejected"] == 20
    # The resolved scenario says which lengths ran.
    assert "lengths:" in sc.to_yaml()


def test_trace_arrivals_without_lengths_keep_the_trace_rows():
    assert load_scenario("azure-conv-replay").workload.lengths is None


def test_the_lengths_error_lists_every_kind_the_config_takes():
    sc = load_scenario("chat-api")
    sc.workload.lengths = None  # only a scenario changed after validation has none
    with pytest.raises(ConfigError) as e:
        build_workload(sc)
    kinds = typing.get_args(LengthsConfig.model_fields["kind"].annotation)
    assert "trace" in kinds
    assert str(e.value) == f"workload.lengths: got None; a lengths block ({', '.join(kinds)})"


# --- what the error names ---------------------------------------------------------------------


def test_a_validation_spec_is_not_a_scenario():
    with pytest.raises(ConfigError) as e:
        read_scenario_dict("validate-cpu")
    msg = str(e.value)
    assert msg.startswith("scenario: got 'validate-cpu'; a simulator scenario; this file is a validation spec"), msg
    assert "kvsim validate --scenario validate-cpu" in msg


def test_an_empty_hf_config_is_refused_as_empty():
    with pytest.raises(ConfigError) as e:
        load_scenario("chat-api", {"model.hf_config": ""})
    assert str(e.value) == "model.hf_config: got ''; a non-empty string"


def test_an_integer_longer_than_python_reads_is_one_error(tmp_path):
    """Python refuses integers of more than 4,300 digits (a guard against quadratic parsing): the
    input's limit, said as such, in YAML and JSON alike."""
    big = "1" * 5000
    for text, load in ((f"seed: {big}\n", load_yaml), (f'{{"seed": {big}}}', load_json)):
        with pytest.raises(ConfigError, match="numbers of at most 4,300 digits"):
            load(text, "scenario", "big")


@pytest.mark.parametrize(
    "over,message",
    [
        (
            {
                "workload.lengths.kind": "uniform",
                "workload.lengths.prompt_min": 5000,
                "workload.lengths.prompt_max": 10,
            },
            "workload.lengths.prompt_min: got 5000; at most prompt_max (10)",
        ),
        ({"workload.arrival.kind": "closed_loop"}, "workload.arrival.concurrency: got None; clients, >= 1"),
        ({"workload.lengths.kind": "mixture"}, "workload.lengths.base: got None; another lengths block"),
    ],
)
def test_a_missing_or_inconsistent_field_is_named_alone(over, message):
    """Not the whole section: chat-api's lengths carry a trace path the message has no use for."""
    with pytest.raises(ConfigError) as e:
        load_scenario("chat-api", over)
    assert str(e.value).startswith(message) and "traces/" not in str(e.value)
