"""The server's token-streaming process (``engine.stream_per_token_s``, sim/engine/stream.py)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import tiny_scenario
from sim.engine.cluster import simulate
from sim.engine.stream import OutputStream
from sim.errors import ConfigError


def test_tokens_wait_for_the_ones_handed_over_before_them():
    s = OutputStream(1e-3)
    # 4 tokens at t = 0: sent over [0, 4 ms], seen on average at 2.5 ms.
    assert s.deliver(0.0, 4) == pytest.approx(2.5e-3)
    # 2 more at 1 ms wait for those: sent over [4, 6] ms.
    assert s.deliver(1e-3, 2) == pytest.approx(5.5e-3)
    assert s.free_at == pytest.approx(6e-3)
    # An idle process sends at once.
    assert s.deliver(10e-3, 1) == pytest.approx(11e-3)


@settings(max_examples=60, deadline=None)
@given(
    free=st.floats(0, 0.05),
    gaps=st.lists(st.floats(1e-4, 0.02), min_size=1, max_size=30),
    cut=st.integers(1, 30),
    k=st.integers(1, 64),
    per_token=st.floats(1e-6, 1e-3),
)
def test_a_window_streams_as_its_iterations_one_by_one(free, gaps, cut, k, per_token):
    ends = list(np.cumsum(gaps))
    m = min(cut, len(ends))
    t0 = 0.01
    one, window = OutputStream(per_token), OutputStream(per_token)
    one.free_at = window.free_at = free
    last = 0.0
    for i in range(m):
        last = one.deliver(t0 + ends[i], k)
    assert window.deliver_window(t0, ends, m, k) == pytest.approx(last, rel=1e-12, abs=1e-15)
    assert window.free_at == pytest.approx(one.free_at, rel=1e-12, abs=1e-15)


def _run(stream_s, concurrency=16, n=160, engine="vllm"):
    over = {
        "engine.kind": engine,
        "workload.arrival": {"kind": "closed_loop", "concurrency": concurrency},
        "workload.num_requests": n,
        "workload.lengths": {"kind": "uniform", "prompt_min": 64, "prompt_max": 64, "output_min": 40, "output_max": 40},
    }
    if stream_s is not None:
        over["engine.stream_per_token_s"] = stream_s
    return simulate(tiny_scenario(**over))


def _cols(res):
    t = res.requests.to_pydict()
    return {k: np.asarray(v) for k, v in t.items()}


def test_no_stream_time_is_the_engine_alone():
    a, b = _cols(_run(None)), _cols(_run(0.0))
    for k in ("arrival_s", "first_token_s", "finish_s"):
        assert (a[k] == b[k]).all()


def test_a_busy_stream_caps_the_output_rate_whatever_the_engine_could_do():
    free = _cols(_run(0.0))
    per_token = 2e-3  # a ceiling of 500 output tokens/s, below what the engine makes unhindered
    capped_res = _run(per_token)
    capped = _cols(capped_res)
    assert capped_res.summary["completed"] == 160
    rate_free = free["generated_tokens"].sum() / free["finish_s"].max()
    rate = capped["generated_tokens"].sum() / capped["finish_s"].max()
    assert rate_free > 2 / per_token
    assert 0.9 / per_token < rate <= 1 / per_token
    # Clients see their first token later: the stream's queue, not the engine, holds it.
    ttft_free = (free["first_token_s"] - free["arrival_s"]).mean()
    ttft = (capped["first_token_s"] - capped["arrival_s"]).mean()
    assert ttft > 5 * ttft_free
    assert (capped["first_token_s"] >= capped["arrival_s"]).all()
    assert (capped["finish_s"] >= capped["first_token_s"]).all()


def test_each_client_sends_again_only_once_it_has_seen_its_last_token():
    t = _cols(_run(2e-3, concurrency=4, n=24))
    order = np.argsort(t["arrival_s"], kind="stable")
    finishes = np.sort(t["finish_s"])
    # The k-th request after the first wave is sent no earlier than the k-th completion clients saw.
    later = t["arrival_s"][order][4:]
    assert (later >= finishes[: len(later)] - 1e-12).all()


def test_an_idle_stream_adds_only_its_own_sending_time():
    per_token = 1e-6
    free, slow = _cols(_run(0.0, concurrency=4, n=24)), _cols(_run(per_token, concurrency=4, n=24))
    extra = (slow["first_token_s"] - slow["arrival_s"]) - (free["first_token_s"] - free["arrival_s"])
    # At most its batch of 4 tokens, plus the drift that much later sends give the schedule.
    assert np.abs(extra).max() < 50 * 4 * per_token


def test_the_stream_time_is_checked():
    with pytest.raises(ConfigError) as err:
        tiny_scenario(**{"engine.kind": "vllm", "engine.stream_per_token_s": 0.5})
    assert "stream_per_token_s" in str(err.value)
