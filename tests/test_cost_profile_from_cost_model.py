"""The ``cost_model_profile`` block comes from the cost model that priced the run: the profile file is
read once per load, its hash is that of the bytes the cost model parsed (a later change to the file
does not change the block), and every writer (``kvsim run``, sweep points, the explorer's runs)
carries the same full block."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

from sim.config import load_scenario
from sim.cost.profile import PROFILE_DIR, load_profile
from sim.cost.profile_model import build_profile_cost_model
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.output.results import write_run

BUILTIN = PROFILE_DIR / "h100-sxm.json"
FEW = {"workload.num_requests": 30}
FIELDS = ("kind", "requested", "path", "name", "device", "date", "method", "source", "sha256")
HASH_DIGITS = 16


def _calibration(path: Path, alloc_event_s: float = 3e-6) -> Path:
    """A copy of the built-in H100 profile with one kernel time changed (so its bytes differ)."""
    doc = json.loads(BUILTIN.read_text())
    doc["memory"]["alloc_event_s"] = alloc_event_s
    path.write_text(json.dumps(doc))
    return path


def _full_block(path: Path, requested: str, kind: str = "file") -> dict:
    """The block a run priced with the profile at ``path`` must carry, from the file's bytes."""
    data = path.read_bytes()
    doc = json.loads(data)
    prov = doc["provenance"]
    return {
        "kind": kind,
        "requested": requested,
        "path": str(path) if kind == "file" else None,
        "name": doc["name"],
        "device": doc["device"]["name"],
        "date": prov["date"],
        "method": prov["method"],
        "source": prov["source"],
        "sha256": hashlib.sha256(data).hexdigest()[:HASH_DIGITS],
    }


def test_cost_model_keeps_the_hash_of_the_bytes_it_parsed(tmp_path):
    from sim.cost.profile import ProfileProvenance

    cal = _calibration(tmp_path / "cal.json")
    sc = load_scenario("chat-api", {**FEW, "cost_model.profile": str(cal)})
    cost = Deployment.from_scenario(sc).make_cost_model(sc)
    pv = cost.provenance
    assert isinstance(pv, ProfileProvenance)
    assert pv.sha256 == hashlib.sha256(cal.read_bytes()).hexdigest()
    assert (pv.kind, pv.path, pv.name, pv.device) == ("file", str(cal), "h100-sxm", "H100-SXM-80GB")
    prov = json.loads(BUILTIN.read_text())["provenance"]
    assert (pv.date, pv.method, pv.source) == (prov["date"], prov["method"], prov["source"])
    # A built-in profile: the hash of the packaged bytes, no path.
    builtin = build_profile_cost_model("h100-sxm", cost.model, cost.gpu).provenance
    assert builtin is not None and builtin.kind == "builtin" and builtin.path is None
    assert builtin.sha256 == hashlib.sha256(BUILTIN.read_bytes()).hexdigest()
    assert load_profile(BUILTIN).sha256 == builtin.sha256


def test_simulate_summary_carries_the_full_block(tmp_path):
    cal = _calibration(tmp_path / "cal.json")
    s = simulate(load_scenario("chat-api", {**FEW, "cost_model.profile": str(cal)})).summary
    assert s["cost_model_profile"] == _full_block(cal, str(cal))
    auto = simulate(load_scenario("chat-api", FEW)).summary
    assert auto["cost_model_profile"] == _full_block(BUILTIN, "auto", "builtin")
    none = simulate(load_scenario("chat-api", {**FEW, "cost_model.profile": "none"})).summary
    assert none["cost_model_profile"] == {**dict.fromkeys(FIELDS), "kind": "roofline", "requested": "none"}


def test_block_hashes_what_priced_the_run_not_the_file_now(tmp_path):
    """The file changes after the run loaded it: summary.json still names the bytes that priced it."""
    cal = _calibration(tmp_path / "cal.json")
    before = _full_block(cal, str(cal))
    res = simulate(load_scenario("chat-api", {**FEW, "cost_model.profile": str(cal)}))
    _calibration(cal, alloc_event_s=9e-6)  # another calibration under the same path
    assert _full_block(cal, str(cal))["sha256"] != before["sha256"]
    write_run(res, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["cost_model_profile"] == before


def test_profile_file_is_read_once_per_load(tmp_path, monkeypatch):
    """Building the cost model, running and writing the run directory open the profile file once."""
    cal = _calibration(tmp_path / "once.json")
    target = cal.resolve()
    opened: list[str] = []
    real_open = Path.open

    def counting_open(self, *args, **kw):
        if Path(self).resolve() == target:
            opened.append(str(args[0] if args else kw.get("mode", "r")))
        return real_open(self, *args, **kw)

    import builtins

    real_builtin_open = builtins.open

    def counting_builtin_open(file, *args, **kw):
        if isinstance(file, (str, Path)) and Path(file).resolve() == target:
            opened.append("builtin open")
        return real_builtin_open(file, *args, **kw)

    monkeypatch.setattr(Path, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_builtin_open)
    res = simulate(load_scenario("chat-api", {**FEW, "cost_model.profile": str(cal)}))
    write_run(res, tmp_path / "run")
    assert opened == ["rb"]
    block = json.loads((tmp_path / "run" / "summary.json").read_text())["cost_model_profile"]
    assert block["sha256"] == hashlib.sha256(cal.read_bytes()).hexdigest()[:HASH_DIGITS]


def test_sweep_point_carries_the_full_block(tmp_path):
    from sim.analysis.sweep import read_dataset, run_sweep

    cal = _calibration(tmp_path / "cal.json")
    f = tmp_path / "sweep.yaml"
    f.write_text(
        textwrap.dedent(
            f"""
            base: chat-api
            set: {{workload.num_requests: 30, cost_model.profile: "{cal}"}}
            grid:
              allocator.kind: [paged]
            """
        )
    )
    res = run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert res.ok
    rows = read_dataset(tmp_path / "ds").to_pylist()
    assert len(rows) == 1
    assert json.loads(rows[0]["cost_model_profile"]) == _full_block(cal, str(cal))


def test_explorer_run_carries_the_full_block(tmp_path):
    from sim.explorer.runs import canonical_json, run_canonical

    cal = _calibration(tmp_path / "cal.json")
    rd = run_canonical(canonical_json(load_scenario("chat-api", {**FEW, "cost_model.profile": str(cal)})))
    assert rd.summary["cost_model_profile"] == _full_block(cal, str(cal))
