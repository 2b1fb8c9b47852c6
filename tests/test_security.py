"""Untrusted input must not reach server files: the explorer's path rule at any depth, run and
sweep names that cannot leave their folders, outputs that replace symlinks instead of writing
through them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from sim import explorer as X
from sim.analysis.sweep import load_sweep
from sim.config import file_fields, scenario_from_dict
from sim.engine.cluster import simulate
from sim.errors import ConfigError
from sim.output.results import write_run

_OPENED: list[str] = []
_WATCH: set[str] = set()


def _audit(event: str, args: tuple) -> None:
    # Records every open of a watched path (audit hooks cannot be removed: it only watches canaries).
    if event == "open" and args and str(args[0]) in _WATCH:
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)


@pytest.fixture()
def canary(tmp_path):
    path = tmp_path / "canary.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    _WATCH.add(str(path))
    _OPENED.clear()
    yield str(path)
    _WATCH.discard(str(path))


def _nested_lengths(depth: int, path: str) -> dict:
    """A lengths block whose ``path`` sits ``depth`` levels of mixture ``base`` deep."""
    node: dict = {"kind": "empirical", "path": path}
    for _ in range(depth - 1):
        node = {"kind": "mixture", "base": node}
    return node


def _upload(store, doc: dict) -> None:
    store.parse_scenario("s.yaml", yaml.safe_dump(doc).encode())


def test_every_file_field_is_known():
    # The vetting walks these names at any depth; a new field that names a file must be marked.
    assert {"path", "profile"} <= file_fields()


@pytest.mark.parametrize("depth", [1, 2, 16, 17, 18, 33, 63, 64])
def test_uploaded_lengths_path_at_any_depth_is_refused_unopened(store, canary, depth):
    doc = {"workload": {"arrival": {"kind": "poisson", "rate": 1.0}, "lengths": _nested_lengths(depth, canary)}}
    with pytest.raises(ConfigError) as e:
        _upload(store, doc)
    assert canary in str(e.value) or "nesting" in str(e.value)
    assert _OPENED == []


def test_every_path_field_and_stray_keys_are_refused_unopened(store, canary):
    docs = [
        {"workload": {"arrival": {"kind": "trace", "path": canary}}},
        {"cost_model": {"profile": canary}},
        # A file key where the schema has none: refused before validation could open anything.
        {"workload": {"lengths": {"kind": "fixed", "extra": {"path": canary}}}},
        {"allocator": [{"path": canary}]},
    ]
    for doc in docs:
        with pytest.raises(ConfigError):
            _upload(store, doc)
        with pytest.raises(ConfigError):
            X.resolve_scenario(doc)
    assert _OPENED == []


def test_deep_nesting_is_refused(store):
    node: dict = {"kind": "fixed"}
    for _ in range(200):
        node = {"kind": "mixture", "base": node}
    with pytest.raises(ConfigError, match="nesting"):
        X.resolve_paths({"workload": {"lengths": node}})


def test_builtin_trace_at_depth_still_resolves():
    rel = "traces/AzureLLMInferenceTrace_conv.csv"
    out = X.resolve_paths({"workload": {"lengths": _nested_lengths(20, rel)}})
    node = out["workload"]["lengths"]
    while node.get("base"):
        node = node["base"]
    assert Path(node["path"]).is_absolute() and node["path"].endswith(rel)


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "x" * 129, "a\\b", ""])
def test_run_names_cannot_leave_their_folder(name):
    with pytest.raises(ConfigError, match="^name"):
        scenario_from_dict({"name": name})


def test_sweep_name_cannot_leave_sweeps(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "../../evil", "base": "chat-api", "grid": {"seed": [1, 2]}}))
    with pytest.raises(ConfigError, match="^name"):
        load_sweep(f)
    g = tmp_path / "..weird name.yaml"
    g.write_text(yaml.safe_dump({"base": "chat-api", "grid": {"seed": [1, 2]}}))
    assert "/" not in load_sweep(g).name and not load_sweep(g).name.startswith(".")


def test_outputs_replace_symlinks_instead_of_writing_through(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    for f in ("summary.json", "scenario.yaml", "requests.parquet", "timeseries.parquet"):
        (out / f).symlink_to(target)
    sc = scenario_from_dict(
        {
            "name": "t",
            "workload": {
                "num_requests": 20,
                "arrival": {"kind": "poisson", "rate": 5.0},
                "lengths": {"kind": "fixed", "prompt_tokens": 64, "output_tokens": 8},
            },
        }
    )
    write_run(simulate(sc, out_dir=out), out)
    assert target.read_text() == "keep me"
    assert not (out / "summary.json").is_symlink() and json.loads((out / "summary.json").read_text())["completed"] == 20
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())
