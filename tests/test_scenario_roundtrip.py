"""Same scenario + same seed ⇒ the same run, whatever path runs it: a sweep point, ``kvsim run`` of the
same overrides, and a rerun of a run's ``scenario.yaml`` give the same summary.

Which keys a scenario *sets* matters, not only their values: the serving engine fills the scheduler
and client keys a scenario leaves unset (``with_engine_defaults``), and ``num_requests`` caps a
``duration_s`` workload only where it is given. So the scenario a sweep sends its worker
(:func:`canonical_scenario`) and the one a run writes (:meth:`Scenario.to_yaml`) carry the keys set,
and nothing else, as keys."""

import itertools
import json
import textwrap

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from sim.analysis.sweep import canonical_scenario, flatten_summary, load_sweep, point_id, read_dataset, run_sweep
from sim.cli.main import app
from sim.config import SCENARIO_DIR, Scenario, load_scenario, scenario_from_dict, set_keys
from sim.engine.deployment import with_engine_defaults
from sim.workload.generator import request_bound

#: A duration-only workload (no num_requests) whose rate × duration is past the default count (1000):
#: lengths from a file beside the scenario (resolved against the scenario's folder in a sweep worker).
DURATION = """
name: dur
seed: 3
model: {name: llama-3.1-8b}
gpu: {name: H100-SXM-80GB}
workload:
  duration_s: 4
  arrival: {kind: poisson, rate: 300}
  lengths: {kind: empirical, path: lens.csv}
"""
LENGTHS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{i:02d}.0,{40 + 7 * i},{2 + i % 5}\n" for i in range(20)
)

#: case → (base scenario, overrides of the sweep's ``set`` and of ``kvsim run --set``).
CASES = {
    "sglang": ("chat-api", {"workload.num_requests": 40, "engine.kind": "sglang"}),
    "trtllm": ("chat-api", {"workload.num_requests": 40, "engine.kind": "trtllm"}),
    "closed_loop": ("hard-memory-budget", {"workload.num_requests": 60}),
    "duration": ("DURATION", {}),
    # A length mixture: a lengths block inside the lengths block.
    "mixture": ("worst-case-outliers", {"workload.num_requests": 60}),
}


def _base(case: str, tmp_path) -> str:
    base, _ = CASES[case]
    if base != "DURATION":
        return base
    folder = tmp_path / "scn"
    folder.mkdir(exist_ok=True)
    (folder / "lens.csv").write_text(LENGTHS)
    (folder / "dur.yaml").write_text(DURATION.lstrip())
    return str(folder / "dur.yaml")


def _kvsim_run(scenario: str, overrides: dict, out) -> dict:
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    r = CliRunner().invoke(app, ["run", scenario, *sets, "-q", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "summary.json").read_text())


def _sweep_row(base: str, overrides: dict, tmp_path) -> dict:
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({"name": "rt", "base": base, "seeds": 1, **({"set": overrides} if overrides else {})}))
    res = run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert res.ok, res.failures
    (row,) = read_dataset(tmp_path / "ds").to_pylist()
    return row


@pytest.mark.parametrize("case", list(CASES))
def test_a_sweep_point_runs_as_kvsim_run_of_the_same_overrides(case, tmp_path):
    base = _base(case, tmp_path)
    overrides = CASES[case][1]
    # seeds: 1 sets the seed the base already has: the sweep's point is the run's scenario.
    row = _sweep_row(base, overrides, tmp_path)
    summary = _kvsim_run(base, overrides, tmp_path / "run")
    if case == "duration":
        assert summary["requests"] > 1000  # not capped at the default num_requests
    metrics = flatten_summary(summary)
    differ = {k: (row.get(k), v) for k, v in metrics.items() if row.get(k) != v}
    assert not differ, differ


@pytest.mark.parametrize("case", list(CASES))
def test_rerunning_a_runs_scenario_yaml_gives_a_byte_identical_summary(case, tmp_path, monkeypatch):
    base = _base(case, tmp_path)
    _kvsim_run(base, CASES[case][1], tmp_path / "run")
    # lens.csv is relative to the scenario's folder: the run's file names it so that it reads it
    # from the run's folder, whatever the working directory.
    monkeypatch.chdir(tmp_path)
    _kvsim_run(str(tmp_path / "run" / "scenario.yaml"), {}, tmp_path / "again")
    assert (tmp_path / "again" / "summary.json").read_bytes() == (tmp_path / "run" / "summary.json").read_bytes()
    # What ran is what the file says: rerunning the rerun's file writes the same file.
    assert (tmp_path / "again" / "scenario.yaml").read_text() == (tmp_path / "run" / "scenario.yaml").read_text()


# --- the round trip, property-style --------------------------------------------------------------

ENGINES = ["auto", "vllm", "sglang", "trtllm"]
ARRIVALS = {
    "poisson": {"kind": "poisson", "rate": 5.0},
    "gamma": {"kind": "gamma", "rate": 5.0, "cv": 2.0},
    "closed_loop": {"kind": "closed_loop", "concurrency": 8},
    "closed_loop_set": {"kind": "closed_loop", "concurrency": 8, "start_spread_cycles": 0.0, "client_cv": 0.0},
    "trace": {"kind": "trace", "path": "traces/AzureLLMInferenceTrace_conv.csv"},
}
COUNTS = {
    "num_requests": {"num_requests": 50},
    "duration": {"duration_s": 30.0},
    "both": {"num_requests": 50, "duration_s": 30.0},
}
SCHEDULERS = {
    "unset": None,
    "some": {"max_num_seqs": 64, "mixed_batches": None},
    "explicit_defaults": {"max_num_seqs": 256},
}


def _scenarios():
    for engine, arrival, count, sched in itertools.product(ENGINES, ARRIVALS, COUNTS, SCHEDULERS):
        data: dict = {"engine": {"kind": engine}, "workload": {"arrival": ARRIVALS[arrival], **COUNTS[count]}}
        if SCHEDULERS[sched] is not None:
            data["scheduler"] = SCHEDULERS[sched]
        yield f"{engine}-{arrival}-{count}-{sched}", data
    # A Hugging Face config (its name and dtypes are filled in), and a model whose context cuts
    # max_model_len (set by fit_max_model_len).
    yield "hf_config", {"model": {"hf_config": "Qwen/Qwen3-8B"}, "workload": {"num_requests": 10}}
    yield "short_context", {"model": {"name": "llama-2-7b"}, "workload": {"duration_s": 10.0}}
    yield (
        "mixture",
        {
            "workload": {
                "num_requests": 20,
                "lengths": {
                    "kind": "mixture",
                    "outlier_fraction": 0.2,
                    "base": {"kind": "lognormal", "prompt_sigma": 0.4},
                },
            }
        },
    )


def _behaviour(sc: Scenario) -> tuple:
    """What a run takes from a scenario, ``model_fields_set`` included."""
    e = with_engine_defaults(sc)
    return e.model_dump(mode="json"), canonical_scenario(e), request_bound(sc), point_id(sc)


@pytest.mark.parametrize("label,data", list(_scenarios()), ids=[lab for lab, _ in _scenarios()])
def test_a_scenario_round_trips_through_its_dumps(label, data):
    sc = scenario_from_dict(data, base_dir=SCENARIO_DIR)
    want = _behaviour(sc)
    # What a sweep sends its worker.
    assert _behaviour(scenario_from_dict(canonical_scenario(sc), base_dir=SCENARIO_DIR)) == want
    # What a run writes, read back (the run writes the scenario with the engine's defaults filled in).
    assert _behaviour(scenario_from_dict(yaml.safe_load(sc.to_yaml()), base_dir=SCENARIO_DIR)) == want
    ran = with_engine_defaults(sc)
    again = scenario_from_dict(yaml.safe_load(ran.to_yaml()), base_dir=SCENARIO_DIR)
    assert with_engine_defaults(again).model_dump(mode="json") == want[0]
    assert request_bound(again) == want[2]


def test_the_yaml_holds_the_resolved_scenario_for_reading_only():
    sc = load_scenario("chat-api", {"engine.kind": "sglang"})
    text = with_engine_defaults(sc).to_yaml()
    body = yaml.safe_load(text)
    assert "num_requests" in body["workload"] and "duration_s" not in body["workload"]
    # Every key, defaults included, is in the file as comments.
    assert "#   timeseries:" in text and "#     every_s: null" in text


# --- point ids ------------------------------------------------------------------------------------


def _ids(tmp_path, body: str) -> list[str]:
    f = tmp_path / "s.yaml"
    f.write_text(textwrap.dedent(body))
    return [p.point_id for p in load_sweep(f).points()]


def test_point_ids_are_stable_and_tell_values_and_set_keys_apart(tmp_path):
    body = """
    base: chat-api
    set: {workload.num_requests: 40}
    grid: {engine.kind: [vllm, sglang], scheduler.max_num_batched_tokens: [4096, 8192]}
    """
    ids = _ids(tmp_path, body)
    assert ids == _ids(tmp_path, body) and len(set(ids)) == 4
    # The same point however it is reached: spelled in set or in grid, in any key order.
    same = load_scenario(
        "chat-api",
        {"scheduler.max_num_batched_tokens": 4096, "engine.kind": "sglang", "workload.num_requests": 40},
    )
    assert point_id(same) in ids
    # A key set to the value it would take unset is another point: the engine fills only keys left unset.
    a = scenario_from_dict({"engine": {"kind": "sglang"}})
    b = scenario_from_dict({"engine": {"kind": "sglang"}, "scheduler": {"max_num_seqs": 256}})
    assert a.scheduler.max_num_seqs == b.scheduler.max_num_seqs
    assert with_engine_defaults(a).scheduler.max_num_seqs != with_engine_defaults(b).scheduler.max_num_seqs
    assert point_id(a) != point_id(b)


def test_a_sweep_resumed_over_a_dataset_of_old_point_ids_reruns_its_points(tmp_path, monkeypatch):
    """Point ids before this version hashed the full dump: a rerun into such a folder finds no point
    of its own there, moves the old rows to ``_dropped/`` and runs every point; the dataset then holds
    exactly the new points, never a mix."""
    import sim.analysis.sweep.spec as sweep_spec

    f = tmp_path / "s.yaml"
    f.write_text("base: chat-api\nset: {workload.num_requests: 15}\ngrid: {engine.kind: [vllm, sglang]}\n")
    out = tmp_path / "ds"
    with monkeypatch.context() as m:
        # The functions as they were: a full dump sent to the worker, and its hash as the id.
        m.setattr(sweep_spec, "canonical_scenario", lambda sc: sc.model_dump(mode="json"))
        m.setattr(sweep_spec, "point_id", lambda sc, *_: sweep_spec.json_digest(sc.model_dump(mode="json")))
        old = run_sweep(f, workers=1, out=out, progress=False)
        old_ids = set(read_dataset(out).column("point_id").to_pylist())
    assert old.ok and old.ran == 2
    new = run_sweep(f, workers=1, out=out, progress=False)
    assert new.ok and (new.ran, new.skipped, new.dropped, new.kept_apart) == (2, 0, 2, 2)
    table = read_dataset(out)
    assert table.num_rows == 2 and set(table.column("status").to_pylist()) == {"ok"}
    assert set(table.column("point_id").to_pylist()) == {p.point_id for p in load_sweep(f).points()}
    assert not old_ids & set(table.column("point_id").to_pylist())
    assert {p.name for p in (out / "_dropped").iterdir()} == {f"part-{i}.parquet" for i in old_ids}
    # Run again: every point is reused.
    again = run_sweep(f, workers=1, out=out, progress=False)
    assert (again.ran, again.skipped) == (0, 2)


# --- lists of sections ------------------------------------------------------------------------


class _Part(BaseModel):
    a: int = 1
    b: int = 2


class _Holder(BaseModel):
    name: str = "h"
    parts: list[_Part] = []
    by_name: dict[str, _Part] = {}


def test_set_keys_keeps_each_listed_sections_own_set_keys():
    """A list of sections (or a mapping of them) keeps only each element's set keys: a full dump of
    the list would mark every key of every element set once loaded again."""
    h = _Holder.model_validate({"parts": [{"a": 5}, {}, {"b": 7}], "by_name": {"x": {"b": 3}}})
    dump = set_keys(h)
    assert dump == {"parts": [{"a": 5}, {}, {"b": 7}], "by_name": {"x": {"b": 3}}}
    back = _Holder.model_validate(dump)
    assert [p.model_fields_set for p in back.parts] == [{"a"}, set(), {"b"}]
    assert set_keys(back) == dump and back == h
    # An empty list given is kept; a list never set is left out.
    assert set_keys(_Holder.model_validate({"parts": []})) == {"parts": []}
    assert set_keys(_Holder()) == {}


def test_a_mixture_round_trips_with_its_set_keys_and_runs_the_same():
    from sim.engine.cluster import simulate

    sc = load_scenario("worst-case-outliers", {"workload.num_requests": 60})
    dump = canonical_scenario(sc)
    assert dump["workload"]["lengths"]["base"] == {
        "kind": "lognormal",
        "prompt_median": 1024,
        "prompt_sigma": 0.5,
        "output_median": 256,
        "output_sigma": 0.5,
    }
    back = scenario_from_dict(json.loads(json.dumps(dump)), base_dir=SCENARIO_DIR)
    assert canonical_scenario(back) == dump
    assert back.workload.lengths.base.model_fields_set == sc.workload.lengths.base.model_fields_set
    assert simulate(back).summary == simulate(sc).summary


# --- file paths in a run's scenario.yaml ----------------------------------------------------------


def test_a_runs_scenario_yaml_reads_its_files_from_any_working_directory(tmp_path, monkeypatch):
    """Relative paths in a scenario (a trace and a model config.json beside the scenario file, a
    profile JSON and an engine terms file in the working directory) are written into the run's
    scenario.yaml so that they name the same files from the run folder: rerunning it from another
    working directory runs the same."""
    import shutil

    from sim.cost.profile import PROFILE_DIR
    from sim.engine_presets import TERMS_FORMAT
    from sim.hf_config import shipped_config

    scn, work, other = tmp_path / "scn", tmp_path / "work", tmp_path / "other"
    for d in (scn / "cfg", work, other):
        d.mkdir(parents=True)
    (scn / "lens.csv").write_text(LENGTHS)
    shutil.copy(shipped_config("Qwen/Qwen2.5-0.5B"), scn / "cfg" / "config.json")
    shutil.copy(PROFILE_DIR / "h100-sxm.json", work / "prof.json")
    (work / "terms.json").write_text(json.dumps({"format": TERMS_FORMAT, "engines": {"vllm": {"host_s": 0.004}}}))
    (scn / "s.yaml").write_text(
        textwrap.dedent("""
        name: paths
        seed: 4
        model: {hf_config: cfg}
        workload:
          num_requests: 40
          arrival: {kind: poisson, rate: 20}
          lengths: {kind: empirical, path: lens.csv}
        cost_model: {profile: prof.json}
        engine: {kind: vllm, terms_file: terms.json}
        """)
    )
    monkeypatch.chdir(work)
    first = _kvsim_run(str(scn / "s.yaml"), {}, tmp_path / "out" / "run")
    written = yaml.safe_load((tmp_path / "out" / "run" / "scenario.yaml").read_text())
    assert written["model"]["hf_config"] == "../../scn/cfg"
    assert written["workload"]["lengths"]["path"] == "../../scn/lens.csv"
    assert written["engine"]["terms_file"] == "../../work/terms.json"
    # Read from the working directory only (sim.cost.profile.load_profile): absolute.
    assert written["cost_model"]["profile"] == str((work / "prof.json").resolve())

    monkeypatch.chdir(other)
    again = _kvsim_run(str(tmp_path / "out" / "run" / "scenario.yaml"), {}, tmp_path / "again")
    for s in (first, again):
        s.pop("cost_model_profile")  # names the profile path as the scenario gave it
    assert again == first and first["cost_model_calibrated"]
    assert (tmp_path / "again" / "requests.parquet").read_bytes() == (
        tmp_path / "out" / "run" / "requests.parquet"
    ).read_bytes()
