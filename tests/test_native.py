"""The compiled hot path (``sim/native.py``) computes exactly what the sources compute.

The comparison is of whole runs, byte for byte: the summary (``json.dumps`` of every metric, float
for float) and a SHA-256 of every column of the per-request table and of the time series (their
raw float/int bytes): the sources run in a child interpreter with ``KVSIM_NATIVE=0``, the build in
this one. It covers every allocator kind, both engine modes, both schedulers, both preemption modes,
prefix caching, compaction, open-loop (Poisson, gamma, trace) and closed-loop arrivals, and the
calibrated and roofline cost models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim import native

ROOT = Path(__file__).resolve().parent.parent

# (scenario, overrides): small runs, each a different path through the compiled modules.
CASES = [
    ("chat-api", {"workload.num_requests": 400}),
    ("chat-api", {"workload.num_requests": 200, "engine.mode": "step"}),
    ("bench-saturated", {"workload.num_requests": 300}),
    ("bench-1m", {"workload.num_requests": 1500}),
    ("worst-case-outliers", {"workload.num_requests": 300}),
    ("shared-prefix", {"workload.num_requests": 300}),
    ("long-context", {"workload.num_requests": 60}),
    ("hard-memory-budget", {"workload.num_requests": 300}),
    ("hard-memory-budget", {"workload.num_requests": 300, "allocator.preemption.mode": "swap"}),
    ("chat-api", {"workload.num_requests": 300, "allocator.kind": "static"}),
    ("chat-api", {"workload.num_requests": 300, "allocator.kind": "dynamic", "allocator.compaction.enabled": True}),
    ("chat-api", {"workload.num_requests": 300, "allocator.kind": "hybrid_tail"}),
    ("chat-api", {"workload.num_requests": 300, "allocator.kind": "hybrid_reserve", "allocator.stale_after_s": 30.0}),
    ("chat-api", {"workload.num_requests": 200, "scheduler.kind": "static_batch"}),
    ("chat-api", {"workload.num_requests": 300, "cost_model.profile": "none"}),
    ("azure-conv-replay", {"workload.num_requests": 300}),
    ("high-throughput-burst", {"workload.num_requests": 300}),
]

# One definition of what is compared, run in both interpreters.
_FINGERPRINT = """
import hashlib, json
import numpy as np

def fingerprint(res):
    out = {"summary": res.summary}
    for name in ("requests", "timeseries"):
        table = getattr(res, name)
        cols = {}
        for col in table.column_names:
            a = table[col].to_numpy(zero_copy_only=False)
            raw = a.tobytes() if a.dtype != object else repr(a.tolist()).encode()
            cols[col] = hashlib.sha256(raw).hexdigest()[:16]
        out[name] = {"rows": table.num_rows, "columns": cols}
    return json.dumps(out, sort_keys=True)
"""

_CHILD = (
    _FINGERPRINT
    + """
import sys
import sim
from sim.engine.cluster import simulate
from sim.config import load_scenario
assert sim.NATIVE_STATE == "off" and sim.engine.replica.__file__.endswith(".py"), sim.NATIVE_STATE
out = [fingerprint(simulate(load_scenario(s, o))) for s, o in json.loads(sys.argv[1])]
print(json.dumps(out))
"""
)

_ns: dict = {}
exec(_FINGERPRINT, _ns)
fingerprint = _ns["fingerprint"]


def _run(scenario: str, overrides: dict) -> str:
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    return fingerprint(simulate(load_scenario(scenario, overrides)))


def _interpreted(cases) -> list[str]:
    env = dict(os.environ, KVSIM_NATIVE="0")
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not native.active(),
    reason=f"no compiled build in use (kvsim native status: {sim.NATIVE_STATE}); ./dev setup builds it",
)
def test_compiled_runs_equal_the_sources_byte_for_byte():
    compiled = [_run(s, o) for s, o in CASES]
    interpreted = _interpreted(CASES)
    for (s, o), c, i in zip(CASES, compiled, interpreted):
        if c != i:
            a, b = json.loads(c), json.loads(i)
            a = {
                **a["summary"],
                **{f"{t}.{k}": v for t in ("requests", "timeseries") for k, v in a[t]["columns"].items()},
            }
            b = {
                **b["summary"],
                **{f"{t}.{k}": v for t in ("requests", "timeseries") for k, v in b[t]["columns"].items()},
            }
            diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
            pytest.fail(
                f"{s} {o}: compiled and interpreted runs differ in {list(diff)[:8]}: {dict(list(diff.items())[:3])}"
            )


def test_ci_runs_the_compiled_build():
    """CI must exercise what users run: ./dev test builds the hot path before the tests."""
    if os.environ.get("CI") != "true":
        pytest.skip("outside CI the build is optional")
    assert sim.NATIVE_STATE == "compiled" and native.active(), sim.NATIVE_STATE


def test_state_follows_the_sources(tmp_path, monkeypatch):
    # A manifest recording other hashes is stale; the recorded ones are current.
    if not native.extensions():
        assert native.state() in ("absent", "off")
        return
    monkeypatch.delenv(native.ENV, raising=False)
    recorded = json.loads(native.MANIFEST.read_text())
    fake = tmp_path / "manifest.json"
    monkeypatch.setattr(native, "MANIFEST", fake)
    fake.write_text(json.dumps(recorded))
    assert native.state() == "compiled"
    recorded["sources"]["sim.engine.replica"] = "0" * 64
    fake.write_text(json.dumps(recorded))
    assert native.state() == "stale"
    fake.write_text("not json")
    assert native.state() == "stale"
    monkeypatch.setenv(native.ENV, "0")
    assert native.state() == "off"


def test_sources_forced_with_env_and_when_stale():
    env = dict(os.environ, KVSIM_NATIVE="0")
    code = "import sim, sim.engine.replica, sim.allocators.paged as p; print(sim.NATIVE_STATE, sim.engine.replica.__file__, p.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    state, *files = out.stdout.split()
    assert state == "off" and all(f.endswith(".py") for f in files), out.stdout
    # The finder guard() installs for a stale build imports every compiled module from its source.
    for mod in native.MODULES:
        spec = native.SourceFinder().find_spec(mod)
        assert spec is not None and spec.origin.endswith(mod.split(".")[-1] + ".py") and Path(spec.origin).exists()
    assert native.SourceFinder().find_spec("sim.config") is None


def test_build_refuses_clearly_without_a_compiler_and_keeps_the_build(monkeypatch):
    before = native.extensions()
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(native.NativeBuildError, match="no C compiler"):
        native.build()
    assert native.extensions() == before  # checked before anything is removed


def test_native_command():
    from typer.testing import CliRunner

    from sim.cli.main import app

    r = CliRunner().invoke(app, ["native", "status"])
    assert r.exit_code == 0 and r.output.strip() in ("compiled", "stale", "absent", "off"), r.output
    r = CliRunner().invoke(app, ["native", "rebuild"])
    assert r.exit_code == 2 and "native action 'rebuild'" in r.output + str(r.stderr_bytes or b""), r.output


def test_a_run_says_which_engine_ran(tmp_path):
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    res = simulate(load_scenario("chat-api", {"workload.num_requests": 20}))
    assert res.run_info["hot_path"] == sim.NATIVE_STATE
    assert (res.run_info["hot_path"] == "compiled") == native.active()
    env = dict(os.environ, KVSIM_NATIVE="0")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.cli",
            "run",
            "chat-api",
            "--set",
            "workload.num_requests=20",
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "simulator hot path" in out.stdout and "interpreted (KVSIM_NATIVE=0)" in out.stdout, out.stdout[-1500:]
