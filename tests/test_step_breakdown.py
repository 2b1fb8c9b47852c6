"""Where a run's iteration time goes: ``CostModel.step_parts`` and ``kvsim run --step-breakdown``."""

from __future__ import annotations

import json
import math
from functools import cache

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from sim.catalog import get_gpu, get_model
from sim.cli.main import app
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.cost.breakdown import PARTS
from sim.cost.model import BatchShape, Layout, RooflineCostModel
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment, with_engine_defaults
from sim.errors import ConfigError

#: Deployments whose cost models the property test prices: every term the profile model has
#: (tensor parallelism and its all-reduce, fp8 GEMMs, experts, latent attention, sliding-window
#: layers, each engine, a contiguous layout).
DEPLOYMENTS = {
    "chat-api paged": {},
    "static, sglang": {"allocator.kind": "static", "engine.kind": "sglang"},
    "70B fp8 TP4": {
        "model.name": "llama-3.1-70b",
        "model.weight_dtype": "fp8",
        "gpu.tensor_parallel": 4,
        "engine.kind": "trtllm",
    },
    "MoE": {"model": {"hf_config": "Qwen/Qwen3-30B-A3B"}, "gpu.tensor_parallel": 2},
    "MLA": {"model": {"hf_config": "deepseek-ai/DeepSeek-V3"}, "gpu.name": "H200", "gpu.tensor_parallel": 8},
    "sliding window layers": {"model": {"hf_config": "openai/gpt-oss-20b"}},
}


def _scenario(overrides: dict, name: str = "chat-api"):
    data, base = read_scenario_dict(name)
    return scenario_from_dict(apply_overrides(data, overrides), base_dir=base)


@cache
def _cost(label: str):
    sc = with_engine_defaults(_scenario(DEPLOYMENTS[label]))
    return Deployment.from_scenario(sc).make_cost_model(sc)


def _roofline(paged: bool):
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("H100"), tensor_parallel=2, layout=Layout(paged))


batches = st.builds(
    lambda d, per_seq, chunks, window: BatchShape(
        [(c, x) for c, x in chunks], d, d * per_seq, min(d * per_seq, d * window) if window else 0
    ),
    st.integers(0, 600),
    st.integers(1, 30000),
    st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 30000)), max_size=5),
    st.sampled_from([0, 128, 4096]),
).filter(lambda b: b.decode_seqs > 0 or b.prefill_chunks)


@pytest.mark.parametrize("label", [*DEPLOYMENTS, "roofline paged", "roofline contiguous"])
@settings(max_examples=60, deadline=None)
@given(batch=batches)
def test_the_parts_of_an_iteration_add_up_to_its_price(label, batch):
    cost = _roofline(label.endswith("paged")) if label.startswith("roofline") else _cost(label)
    whole = cost.step_time_s(batch)
    counted = dict(cost.out_of_range)
    parts = cost.step_parts(batch)
    assert cost.out_of_range == counted  # a diagnostic: it counts no query of its own
    assert set(parts) <= set(PARTS)
    assert all(math.isfinite(v) and v >= -1e-12 * whole for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(whole, rel=1e-9, abs=1e-15)


def test_a_contiguous_layout_has_no_layout_part_and_a_paged_one_does():
    batch = BatchShape([(512, 1024)], 64, 64 * 3000)
    paged, contiguous = _cost("chat-api paged").step_parts(batch), _cost("static, sglang").step_parts(batch)
    assert paged["attention_layout"] > 0 and contiguous["attention_layout"] == 0
    assert _roofline(True).step_parts(batch)["attention_layout"] > 0
    assert _roofline(False).step_parts(batch)["attention_layout"] == 0
    assert _cost("70B fp8 TP4").step_parts(batch)["allreduce"] > 0
    assert _cost("chat-api paged").step_parts(batch)["allreduce"] == 0


SMALL = {"engine.mode": "step", "workload.num_requests": 150}


@pytest.mark.parametrize("allocator", ["paged", "dynamic", "static"])
def test_a_runs_breakdown_accounts_for_its_busy_time_and_changes_nothing(allocator):
    over = {**SMALL, "allocator.kind": allocator}
    plain = simulate(_scenario(over)).summary
    metered = simulate(_scenario(over), step_breakdown=True).summary
    b = metered.pop("step_time_breakdown")
    assert metered == plain
    assert b["iterations"] == plain["iterations"]
    assert sum(b["seconds"].values()) == pytest.approx(b["busy_s"], rel=1e-12)
    assert sum(b["share"].values()) == pytest.approx(1.0)
    assert b["seconds"]["kv_memory_ops"] == pytest.approx(plain["allocation_time_s"])
    assert b["seconds"]["linear"] > b["seconds"]["lm_head"] > 0
    if allocator == "dynamic":
        assert b["seconds"]["kv_memory_ops"] > 0  # growth by realloc-and-copy costs time per step
    assert (b["seconds"]["attention_layout"] > 0) == (allocator == "paged")


def test_a_breakdown_needs_one_priced_iteration_per_iteration():
    with pytest.raises(ConfigError, match=r"^engine.mode: got 'fast_forward'; step for a step-time breakdown"):
        simulate(_scenario({"workload.num_requests": 20}), step_breakdown=True)


def test_kvsim_run_says_when_it_replaces_the_engine_mode_asked_for(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "run",
            "chat-api",
            "-s",
            "workload.num_requests=20",
            "-s",
            "engine.mode=fast_forward",
            "--step-breakdown",
            "-q",
            "--out",
            str(tmp_path / "r"),
        ],
        catch_exceptions=False,
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0
    assert "--step-breakdown runs engine.mode=step, not fast_forward (the same results)" in res.stderr


def test_kvsim_run_prints_and_writes_the_breakdown(tmp_path):
    res = CliRunner().invoke(
        app, ["run", "chat-api", "--set", "workload.num_requests=60", "--step-breakdown", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    assert "where the busy time went" in res.output and "attention_layout" in res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["engine_mode"] == "step"
    shares = summary["step_time_breakdown"]["share"]
    top = max(shares, key=shares.get)
    assert top in res.output.split("where the busy time went")[1].splitlines()[4]
    from sim.analysis.report import report

    assert "Where the busy time went" in report(tmp_path / "r").read_text()


SWEEP = """\
name: split
base: chat-api
set:
  workload.num_requests: 80
grid:
  allocator.kind: [paged, dynamic]
"""


def test_a_sweep_splits_each_points_time_into_columns(tmp_path):
    from sim.analysis.sweep import load_sweep, read_dataset, run_sweep

    f = tmp_path / "s.yaml"
    f.write_text(SWEEP + "step_breakdown: true\n")
    res = run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert res.ok
    rows = read_dataset(tmp_path / "ds").to_pylist()
    for point, row in zip(load_sweep(f).points(), rows):
        assert row["engine_mode"] == "step"
        sc = scenario_from_dict(point.scenario, base_dir=point.base_dir)
        b = simulate(sc, step_breakdown=True).summary["step_time_breakdown"]
        assert row["step_s.busy"] == b["busy_s"]
        for part, sec in b["seconds"].items():
            assert row[f"step_s.{part}"] == sec and row[f"step_share.{part}"] == b["share"][part]
    from sim.analysis.report import report

    assert "Where each point's busy time went" in report(tmp_path / "ds").read_text()
    plain = tmp_path / "plain.yaml"
    plain.write_text(SWEEP)
    assert not {p.point_id for p in load_sweep(plain).points()} & {p.point_id for p in load_sweep(f).points()}


@pytest.mark.parametrize(
    "extra, starts",
    [
        ("step_breakdown: yes please\n", "step_breakdown: got 'yes please'; true or false"),
        (
            "step_breakdown: true\nzip: {engine.mode: [fast_forward, step], seed: [1, 2]}\n",
            "step_breakdown: got True; points in engine.mode step",
        ),
        (
            "step_breakdown: true\nset: {engine.mode: fast_forward}\n",
            "step_breakdown: got True; points in engine.mode step",
        ),
    ],
)
def test_a_sweep_breakdown_that_cannot_hold_is_refused(tmp_path, extra, starts):
    from sim.analysis.sweep import load_sweep

    f = tmp_path / "s.yaml"
    body = SWEEP if "set:" not in extra else SWEEP.replace("set:\n  workload.num_requests: 80\n", "")
    f.write_text(body + extra)
    with pytest.raises(ConfigError) as e:
        load_sweep(f)
    assert str(e.value).startswith(starts), str(e.value)


def test_a_plan_reason_names_the_largest_parts_and_the_layouts():
    from sim.analysis.recommend import split_text

    b = {
        "share": {
            "linear": 0.5,
            "attention": 0.25,
            "host": 0.12,
            "elementwise": 0.06,
            "lm_head": 0.04,
            "attention_layout": 0.006,
            "kv_memory_ops": 0.003,
            "allreduce": 0.0,
        }
    }
    assert (
        split_text(b) == "GEMMs 50%, attention 25%, host 12%, elementwise 6% (paged layout 0.6%, allocator work 0.3%)"
    )
    # A part among the largest is not repeated; parts of nothing are not named.
    assert (
        split_text({"share": {"kv_memory_ops": 0.4, "linear": 0.6, "allreduce": 0.0}})
        == "GEMMs 60%, allocator work 40%"
    )
