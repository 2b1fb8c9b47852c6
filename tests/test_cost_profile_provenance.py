"""summary.json says which cost profile priced a run: built-in or file, the path given, the profile's
name, device, provenance date and method, and a hash of its bytes, so two calibrations that share a
name are told apart; the roofline prior says so; the same scenario and seed still write the same file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.config import load_scenario
from sim.cost.profile import PROFILE_DIR
from sim.engine.cluster import simulate
from sim.output.results import write_run

BUILTIN = PROFILE_DIR / "h100-sxm.json"
FEW = {"workload.num_requests": 40}
#: The block's keys (sim.output.provenance.FIELDS) and the hash's length, as documented.
FIELDS = ("kind", "requested", "path", "name", "device", "date", "method", "source", "sha256")
HASH_DIGITS = 16


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:HASH_DIGITS]


def _calibration(path: Path, alloc_event_s: float | None = None) -> Path:
    """A copy of the built-in H100 profile (same name and date), one kernel time changed if asked."""
    doc = json.loads(BUILTIN.read_text())
    if alloc_event_s is not None:
        doc["memory"]["alloc_event_s"] = alloc_event_s
    path.write_text(json.dumps(doc))
    return path


def _run(out: Path, **overrides) -> dict:
    write_run(simulate(load_scenario("chat-api", {**FEW, **overrides})), out)
    return json.loads((out / "summary.json").read_text())


def _kvsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=180)


def test_builtin_and_file_profiles_differ_in_summary(tmp_path):
    cal = _calibration(tmp_path / "cal.json", alloc_event_s=3e-6)
    a = _run(tmp_path / "a")["cost_model_profile"]
    b = _run(tmp_path / "b", **{"cost_model.profile": str(cal)})["cost_model_profile"]
    prov = json.loads(BUILTIN.read_text())["provenance"]
    assert set(a) == set(b) == set(FIELDS)
    assert a == {
        "kind": "builtin",
        "requested": "auto",
        "path": None,
        "name": "h100-sxm",
        "device": "H100-SXM-80GB",
        "date": prov["date"],
        "method": prov["method"],
        "source": prov["source"],
        "sha256": _sha(BUILTIN),
    }
    assert b == {**a, "kind": "file", "requested": str(cal), "path": str(cal), "sha256": _sha(cal)}
    assert a["sha256"] != b["sha256"]


def test_two_calibrations_with_one_name_differ_by_hash(tmp_path):
    one = _calibration(tmp_path / "one.json", alloc_event_s=3e-6)
    two = _calibration(tmp_path / "two.json", alloc_event_s=4e-6)
    a = _run(tmp_path / "a", **{"cost_model.profile": str(one)})["cost_model_profile"]
    b = _run(tmp_path / "b", **{"cost_model.profile": str(two)})["cost_model_profile"]
    assert a["name"] == b["name"] and a["date"] == b["date"] and a["device"] == b["device"]
    assert a["sha256"] == _sha(one) and b["sha256"] == _sha(two) and a["sha256"] != b["sha256"]
    # The same bytes under another path: the same hash, so a copy is recognised as the same calibration.
    same = _calibration(tmp_path / "copy.json", alloc_event_s=3e-6)
    c = _run(tmp_path / "c", **{"cost_model.profile": str(same)})["cost_model_profile"]
    assert c["sha256"] == a["sha256"] and c["path"] == str(same)


def test_builtin_by_name_is_builtin(tmp_path):
    s = _run(tmp_path / "a", **{"cost_model.profile": "h200-sxm", "gpu.name": "H200-SXM-141GB"})
    block = s["cost_model_profile"]
    assert block["kind"] == "builtin" and block["requested"] == "h200-sxm" and block["path"] is None
    assert block["name"] == "h200-sxm" and block["sha256"] == _sha(PROFILE_DIR / "h200-sxm.json")


def test_roofline_prior_says_so(tmp_path):
    none = _run(tmp_path / "none", **{"cost_model.profile": "none"})
    assert none["cost_model_calibrated"] is False
    assert none["cost_model_profile"] == {**dict.fromkeys(FIELDS), "kind": "roofline", "requested": "none"}
    # auto falls back to the prior where the GPU's profile does not cover the model (fp8 KV on A100):
    # the file was there, but it did not price the run.
    auto = _run(tmp_path / "auto", **{"gpu.name": "A100-SXM-80GB", "model.kv_dtype": "fp8"})
    assert auto["cost_model_calibrated"] is False
    assert auto["cost_model_profile"] == {**dict.fromkeys(FIELDS), "kind": "roofline", "requested": "auto"}
    from sim.output.provenance import describe_block

    assert "roofline" in (describe_block(auto["cost_model_profile"]) or "")


def test_summary_is_deterministic_with_a_profile_file(tmp_path):
    cal = _calibration(tmp_path / "cal.json", alloc_event_s=3e-6)
    over = {"cost_model.profile": str(cal)}
    _run(tmp_path / "a", **over)
    _run(tmp_path / "b", **over)
    a, b = ((tmp_path / d / "summary.json").read_bytes() for d in "ab")
    assert json.loads(a)["cost_model_profile"]["sha256"] == _sha(cal)
    assert a == b


def test_cli_run_records_the_profile_and_shows_it(tmp_path):
    cal = _calibration(tmp_path / "cal.json", alloc_event_s=3e-6)
    outs = []
    for name, extra in (("a", []), ("b", ["--set", f"cost_model.profile={cal}"]), ("c", [])):
        r = _kvsim("run", "chat-api", "--set", "workload.num_requests=40", *extra, "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    a, b, c = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "abc")
    assert a == c, "same scenario and seed, same summary.json"
    assert a["cost_model_profile"]["kind"] == "builtin" and b["cost_model_profile"]["kind"] == "file"
    assert b["cost_model_profile"]["path"] == str(cal) and b["cost_model_profile"]["sha256"] == _sha(cal)
    assert a != b
    # The run's table names the profile too (printed from the summary the file holds).
    assert f"sha256 {_sha(BUILTIN)}" in outs[0] and "cost profile" in outs[1]
    # The scenario written beside the results runs again to the same summary.
    r = _kvsim("run", str(tmp_path / "b" / "scenario.yaml"), "-q", "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text()) == b


def test_report_reads_a_summary_with_the_block(tmp_path):
    pytest.importorskip("plotly")
    from sim.analysis.report import report

    _run(tmp_path / "a")
    assert Path(report(tmp_path / "a")).is_file()


def test_plan_json_records_the_profile(tmp_path):
    cal = _calibration(tmp_path / "cal.json", alloc_event_s=3e-6)
    r = _kvsim(
        "plan",
        "chat-api",
        "--slo",
        "ttft_p90_s=0.5",
        "--allocators",
        "paged",
        "--set",
        "workload.num_requests=100",
        "--set",
        f"cost_model.profile={cal}",
        "-w",
        "1",
        "-q",
        "--out",
        str(tmp_path / "plan"),
    )
    assert r.returncode == 0, r.stderr
    block = json.loads((tmp_path / "plan" / "plan.json").read_text())["cost_model_profile"]
    assert block["kind"] == "file" and block["path"] == str(cal) and block["sha256"] == _sha(cal)
