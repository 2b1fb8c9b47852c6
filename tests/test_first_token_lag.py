"""First tokens that reach their clients iterations after the engine made them (``engine.first_token_lag``)."""

import numpy as np
import pytest

from helpers import trace_run
from sim.config import scenario_from_dict
from sim.engine.deployment import engine_preset
from sim.engine_presets import PRESETS
from sim.errors import ConfigError


def _trace_run(tmp_path, rows: list[tuple[float, int, int]], lag: int, mode: str = "fast_forward", **over):
    return trace_run(tmp_path, rows, **{"engine.first_token_lag": lag, "engine.mode": mode, **over})


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
@pytest.mark.parametrize("lag", [1, 2])
def test_the_first_token_is_seen_lag_iterations_late_and_nothing_else_moves(tmp_path, mode, lag):
    rows = [(0.0, 32, 200)]
    plain, _ = _trace_run(tmp_path, rows, 0, mode)
    held, res = _trace_run(tmp_path, rows, lag, mode)
    # The engine's work is the same: the request ends when it did (windows split apart sum their
    # iterations in another order).
    assert held["finish_s"][0] == pytest.approx(plain["finish_s"][0], rel=1e-12)
    assert held["generated_tokens"][0] == plain["generated_tokens"][0] == 200
    # Its first token is seen at the end of the lag-th iteration after the one that made it.
    if mode == "step":  # one timeseries row per iteration
        ends = np.asarray(res.timeseries.column("t_s").to_pylist())
        k = int(np.searchsorted(ends, plain["first_token_s"][0]))
        assert ends[k] == pytest.approx(plain["first_token_s"][0])
        assert held["first_token_s"][0] == pytest.approx(ends[k + lag])
    step = float((plain["finish_s"][0] - plain["first_token_s"][0]) / 199)
    assert held["first_token_s"][0] - plain["first_token_s"][0] == pytest.approx(lag * step, rel=0.1)


def test_a_request_that_ends_while_its_first_token_is_held_shows_it_when_it_ends(tmp_path):
    # Two output tokens: the second is made in the very iteration that releases the first.
    held, _ = _trace_run(tmp_path, [(0.0, 32, 2)], 3)
    assert held["first_token_s"][0] <= held["finish_s"][0]
    one, _ = _trace_run(tmp_path, [(0.0, 32, 1)], 1)
    assert one["first_token_s"][0] == one["finish_s"][0]


@pytest.mark.parametrize("stream", [0.0, 2e-4])
@pytest.mark.parametrize("lag", [0, 1, 2, 4])
def test_fast_forward_equals_stepping_while_tokens_are_held(tmp_path, lag, stream):
    # Staggered arrivals and lengths: first tokens are held while other requests decode, finish and
    # arrive, and are released inside fast-forward windows; with a token stream that binds, some
    # are sent later than their release.
    rows = [(0.002 * i, 16 + 23 * i % 200, 5 + 37 * i % 90) for i in range(24)]
    over = {"engine.schedule_ahead": True, "engine.stream_per_token_s": stream}
    ff, _ = _trace_run(tmp_path, rows, lag, "fast_forward", **over)
    st, _ = _trace_run(tmp_path, rows, lag, "step", **over)
    for key in ("first_token_s", "finish_s", "generated_tokens"):
        np.testing.assert_allclose(ff[key], st[key], rtol=1e-9, atol=1e-12, err_msg=key)
    if lag:
        base, _ = _trace_run(tmp_path, rows, 0, "step", **over)
        assert (st["first_token_s"] > base["first_token_s"]).all()
        np.testing.assert_allclose(st["finish_s"], base["finish_s"], rtol=1e-12)


def test_tensorrt_llm_preset_holds_one_and_a_scenario_sets_its_own():
    assert {k: p.first_token_lag for k, p in PRESETS.items()} == {"vllm": 0, "sglang": 0, "trtllm": 1}
    assert engine_preset(scenario_from_dict({"engine": {"kind": "trtllm"}})).first_token_lag == 1
    assert engine_preset(scenario_from_dict({"engine": {"kind": "trtllm", "first_token_lag": 0}})).first_token_lag == 0
    with pytest.raises(ConfigError, match=r"engine.first_token_lag: got 7; an integer in \[0, 4\]"):
        scenario_from_dict({"engine": {"kind": "vllm", "first_token_lag": 7}})
