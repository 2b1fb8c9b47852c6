"""Batches formed one iteration ahead (``engine.schedule_ahead``: overlap schedulers, async scheduling)."""

import pytest

from helpers import trace_run
from sim.config import scenario_from_dict
from sim.engine_presets import PRESETS


def _trace_run(tmp_path, rows: list[tuple[float, int, int]], ahead: bool, mode: str = "fast_forward"):
    return trace_run(tmp_path, rows, **{"engine.schedule_ahead": ahead, "engine.mode": mode})[0]


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_a_request_arriving_mid_iteration_waits_one_more_iteration(tmp_path, mode):
    alone = _trace_run(tmp_path, [(0.0, 32, 400)], ahead=False, mode=mode)
    step = float((alone["finish_s"][0] - alone["first_token_s"][0]) / (alone["generated_tokens"][0] - 1))
    # The second request reaches the engine 40.5 decode steps into the first one's decode.
    at = float(alone["first_token_s"][0]) + 40.5 * step
    rows = [(0.0, 32, 400), (at, 32, 20)]
    plain = _trace_run(tmp_path, rows, ahead=False, mode=mode)
    ahead = _trace_run(tmp_path, rows, ahead=True, mode=mode)
    # Nothing ran when the first one arrived: no batch was formed ahead of it.
    assert ahead["first_token_s"][0] == plain["first_token_s"][0]
    ttft_plain = plain["first_token_s"][1] - plain["arrival_s"][1]
    ttft_ahead = ahead["first_token_s"][1] - ahead["arrival_s"][1]
    # Plain: the rest of the iteration in progress, then its prefill. Ahead: one decode step more
    # (the first request's mean step; its steps grow a little with its KV length).
    assert ttft_ahead - ttft_plain == pytest.approx(step, rel=0.1)


def test_an_idle_engine_forms_no_batch_ahead(tmp_path):
    rows = [(0.0, 64, 10), (5.0, 64, 10)]  # the second arrives long after the first finished
    plain = _trace_run(tmp_path, rows, ahead=False)
    ahead = _trace_run(tmp_path, rows, ahead=True)
    assert (plain["first_token_s"] == ahead["first_token_s"]).all()
    assert (plain["finish_s"] == ahead["finish_s"]).all()


def test_a_scenario_turns_it_on():
    from sim.engine.deployment import engine_preset

    # TensorRT-LLM's overlap scheduler is on by default; the others' presets leave it off.
    assert {k: p.schedule_ahead for k, p in PRESETS.items()} == {"vllm": False, "sglang": False, "trtllm": True}
    sc = scenario_from_dict({"engine": {"kind": "vllm", "schedule_ahead": True}})
    assert engine_preset(sc).schedule_ahead is True
    assert engine_preset(scenario_from_dict({"engine": {"kind": "vllm"}})).schedule_ahead is False
    assert (
        engine_preset(scenario_from_dict({"engine": {"kind": "trtllm", "schedule_ahead": False}})).schedule_ahead
        is False
    )
