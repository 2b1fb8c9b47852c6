"""Routing across replicas (``router``): round robin cycles, and ``length_split`` keeps a pool of
replicas for long prompts, which takes their prefills away from the short requests' first tokens."""

from __future__ import annotations

import numpy as np
import pytest

from sim.analysis.columns import column
from sim.config import load_scenario
from sim.engine.cluster import simulate
from sim.errors import ConfigError

# worst-case-outliers with 5 % of prompts 16 times as long (about 16k tokens), outputs as they were.
LONG_TAIL = {
    "gpu.replicas": 4,
    "workload.num_requests": 800,
    "workload.arrival.rate": 40.0,
    "workload.max_model_len": 65536,
    "workload.lengths.outlier_fraction": 0.05,
    "workload.lengths.outlier_multiplier": 16.0,
    "workload.lengths.outlier_scales": "prompt",
}


def _run(**over):
    t = simulate(load_scenario("worst-case-outliers", {**LONG_TAIL, **over})).requests
    ttft = column(t, "first_token_s") - column(t, "arrival_s")
    return column(t, "replica"), column(t, "prompt_tokens"), ttft


def test_length_split_keeps_long_prompts_in_their_pool():
    rep, prompt, _ = _run(router="length_split", **{"length_split.replicas": 1, "length_split.prompt_tokens": 8192})
    long = prompt >= 8192
    assert 10 < long.sum() < 100
    assert set(rep[long].tolist()) == {3}  # the last replica
    assert set(rep[~long].tolist()) == {0, 1, 2}
    rep, prompt, _ = _run(router="length_split", **{"length_split.replicas": 2, "length_split.prompt_tokens": 8192})
    assert set(rep[prompt >= 8192].tolist()) == {2, 3} and set(rep[prompt < 8192].tolist()) == {0, 1}


def test_length_split_shortens_the_short_requests_first_tokens():
    _, prompt, mixed = _run(router="least_outstanding")
    _, _, split = _run(router="length_split", **{"length_split.replicas": 1, "length_split.prompt_tokens": 8192})
    short = prompt < 8192
    # Behind no 16k-token prefill, the short requests' TTFT p90 drops (0.37 → 0.10 s at 2,000 requests).
    assert np.percentile(split[short], 90) < 0.5 * np.percentile(mixed[short], 90)
    # The price: one replica serves every long prompt, and they wait longer.
    assert np.percentile(split[~short], 90) > np.percentile(mixed[~short], 90)


def test_round_robin_cycles():
    rep, _, _ = _run(router="round_robin", **{"workload.num_requests": 40})
    assert rep.tolist() == [i % 4 for i in range(40)]


def test_a_share_of_the_replicas_is_the_count_it_rounds_to():
    from sim.config import LengthSplitConfig

    split = LengthSplitConfig(share=0.25)
    assert [split.long_replicas(n) for n in (2, 3, 4, 6, 8, 10, 40)] == [1, 1, 1, 2, 2, 3, 10]
    assert LengthSplitConfig(share=0.9).long_replicas(4) == 3  # one left for the others
    shared = simulate(
        load_scenario("worst-case-outliers", {**LONG_TAIL, "router": "length_split", "length_split.share": 0.5})
    )
    counted = simulate(
        load_scenario("worst-case-outliers", {**LONG_TAIL, "router": "length_split", "length_split.replicas": 2})
    )
    assert shared.summary["length_split_replicas"] == 2
    assert column(shared.requests, "replica").tolist() == column(counted.requests, "replica").tolist()
    assert shared.summary["ttft_s"] == counted.summary["ttft_s"]


@pytest.mark.parametrize(
    "over, starts",
    [
        (
            {"length_split.share": 0.5, "length_split.replicas": 1},
            "length_split.replicas: got 1; left out with length_split.share",
        ),
        ({"length_split.share": 0.5, "gpu.replicas": 1}, "gpu.replicas: got 1; at least 2 with router length_split"),
        ({"length_split.share": 1.0}, "length_split.share: got 1.0;"),
        ({"length_split.share": 0}, "length_split.share: got 0;"),
    ],
)
def test_a_bad_share_is_one_line(over, starts):
    with pytest.raises(ConfigError) as e:
        load_scenario("worst-case-outliers", {"gpu.replicas": 4, "router": "length_split", **over})
    assert str(e.value).startswith(starts), str(e.value)


@pytest.mark.parametrize("long_replicas", [2, 3])
def test_length_split_needs_a_pool_for_the_others(long_replicas):
    with pytest.raises(ConfigError) as e:
        over = {"gpu.replicas": 2, "router": "length_split", "length_split.replicas": long_replicas}
        load_scenario("worst-case-outliers", over)
    assert str(e.value).startswith(f"length_split.replicas: got {long_replicas}; fewer than gpu.replicas (2)")
