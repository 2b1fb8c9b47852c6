"""Every scenario in scenarios/ runs at a reduced size; the guide's situations point at real files.

Files that declare themselves non-runnable (top-level ``kind: validation``: a ``kvsim validate``
spec, not a simulator scenario) are skipped. A scenario for a model the catalog lacks is skipped
with a message until the model is added.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from sim.catalog import MODELS
from sim.config import SCENARIO_DIR, apply_overrides, load_scenario, read_scenario_dict, scenario_from_dict
from sim.engine.cluster import simulate

N = 24
FILES = sorted(SCENARIO_DIR.glob("*.yaml"))


def _data(path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _skip_reason(data: dict) -> str | None:
    if isinstance(data, dict) and data.get("kind") == "validation":
        return "declares kind: validation (a kvsim validate spec, not a simulator scenario)"
    model = (data.get("model") or {}) if isinstance(data, dict) else {}
    name = model.get("name") if isinstance(model, dict) else None
    if name and name != "custom" and name not in MODELS:
        return f"model {name!r} is not in the catalog yet (kvsim list models)"
    return None


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_runs_at_reduced_size(path):
    why = _skip_reason(_data(path))
    if why:
        pytest.skip(f"{path.name}: {why}")
    sc = load_scenario(path.stem, {"workload.num_requests": N})
    res = simulate(sc)
    s = res.summary
    assert 0 < s["requests"] <= N, f"{path.name}: {s['requests']} requests simulated with num_requests={N}"
    assert s["completed"] > 0, f"{path.name}: nothing completed ({s['rejected_by_reason']})"
    assert s["cost_model"], path.name


def _situation_files():
    from sim.analysis.guide import situations

    return sorted({SCENARIO_DIR / f"{s.scenario}.yaml" for s in situations()} | {SCENARIO_DIR / "chat-api.yaml"})


@pytest.mark.parametrize("path", _situation_files(), ids=lambda p: p.stem)
def test_scenario_has_a_header_comment(path):
    head = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        head.append(line)
    text = "\n".join(head)
    assert head, f"{path.name} starts without a header comment (situation, question, knobs)"
    for word in ("Question", "Knobs"):
        assert word in text, f"{path.name}: the header comment has no '{word}:' line"


def test_guide_situations_use_existing_scenarios_and_valid_variants():
    from sim.analysis.guide import situations

    seen = set()
    for sit in situations():
        data, base = read_scenario_dict(sit.scenario)
        seen.add(sit.scenario)
        if _skip_reason(data):
            continue
        for v in sit.variants:
            sc = scenario_from_dict(apply_overrides(data, v.overrides), base)  # raises ConfigError on a bad key
            assert sc.name == data["name"], (sit.key, v.name)
        ids = [c.id for c in sit.claims]
        assert len(ids) == len(set(ids)), f"{sit.key}: duplicate claim ids {ids}"
    mine = {p.stem for p in FILES if "Situation" in p.read_text().split("\n", 1)[0]}
    assert mine <= seen, f"situation scenarios not in the guide: {sorted(mine - seen)}"


def test_cli_accepts_num_requests_override(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.cli",
            "run",
            "small-batch",
            "--set",
            "workload.num_requests=12",
            "--quiet",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    import json

    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["requests"] == 12
