"""A model whose head_dim the profile's attention tables did not time (the built-ins measured 128
only) is priced on the nearest head_dim's fit and the run stays calibrated: ``kvsim run`` says so
in one stderr note, and ``summary.json`` records it (``cost_model_profile.substitutions``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from sim.config import load_scenario
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.output.results import write_run

FEW = {"workload.num_requests": 8}
#: llama-3.1-8b's shape with 256-wide heads (Gemma's head_dim).
WIDE = {**FEW, "model.head_dim": 256}
NOTE = "context and decode attention at head_dim 256 priced on the head_dim 128 fit"


def test_the_cost_model_lists_the_substitution(caplog):
    sc = load_scenario("chat-api", WIDE)
    with caplog.at_level(logging.WARNING, logger="kvsim.cost_model"):
        cost = Deployment.from_scenario(sc).make_cost_model(sc)
    assert cost.calibrated and cost.name == "h100-sxm"
    assert len(cost.substitutions) == 1 and cost.substitutions[0].startswith(NOTE)
    notes = [r.getMessage() for r in caplog.records if r.name == "kvsim.cost_model"]
    assert len(notes) == 1 and NOTE in notes[0] and "still counts as calibrated" in notes[0]


def test_a_measured_head_dim_has_no_substitution(caplog):
    sc = load_scenario("chat-api", FEW)
    with caplog.at_level(logging.WARNING, logger="kvsim.cost_model"):
        cost = Deployment.from_scenario(sc).make_cost_model(sc)
    assert cost.substitutions == [] and not caplog.records


def test_summary_json_records_it_next_to_the_profile(tmp_path):
    write_run(simulate(load_scenario("chat-api", WIDE)), tmp_path / "wide")
    s = json.loads((tmp_path / "wide" / "summary.json").read_text())
    assert s["cost_model_calibrated"] is True
    assert [n.split(" (")[0] for n in s["cost_model_profile"]["substitutions"]] == [NOTE]
    write_run(simulate(load_scenario("chat-api", FEW)), tmp_path / "plain")
    assert "substitutions" not in json.loads((tmp_path / "plain" / "summary.json").read_text())["cost_model_profile"]


def test_kvsim_run_prints_one_note(tmp_path):
    args = ["run", "chat-api", "-q", "--out", str(tmp_path / "r"), "--set", "workload.num_requests=8"]
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli", *args, "--set", "model.head_dim=256"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and NOTE in lines[0], r.stderr
