"""Two SLO classes: requests whose prompt has at least ``--long-prompt-tokens`` tokens meet the
``long:`` bounds where given, the others the plain ones; attainment is one share of all requests,
and the early-stopping test and the miss breakdown read the same per-request bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sim.analysis.columns import column
from sim.analysis.sequential import request_outcome
from sim.analysis.slo import SLO, attainment, meets, miss_shares, parse_slos
from sim.config import load_scenario
from sim.engine.cluster import simulate
from sim.errors import ConfigError

# worst-case-outliers, 5 % of prompts 16 times as long, on one replica: long prompts wait longer.
OVER = {
    "workload.num_requests": 300,
    "workload.arrival.rate": 8.0,
    "workload.max_model_len": 65536,
    "workload.lengths.outlier_fraction": 0.05,
    "workload.lengths.outlier_multiplier": 16.0,
    "workload.lengths.outlier_scales": "prompt",
}


def test_parse_long_bounds():
    s = parse_slos(["ttft_p90_s=0.5", "tpot_p90_s=0.05", "long:ttft_p90_s=5"], long_prompt_tokens=8192)
    assert (s.ttft_s, s.tpot_s, s.long_ttft_s, s.long_tpot_s, s.long_prompt_tokens) == (0.5, 0.05, 5.0, None, 8192)
    assert s.attainment == 0.9
    assert s.describe() == "90% of requests with TTFT ≤ 0.5 s and TPOT ≤ 0.05 s (prompts of 8192+ tokens: TTFT ≤ 5 s)"
    assert SLO(**s.as_dict()) == s
    for items, tokens, key in (
        (["ttft_s=1", "long:ttft_s=5"], None, "--slo: got 'long:ttft'"),
        (["ttft_s=1"], 8192, "--long-prompt-tokens: got 8192"),
        (["ttft_s=1", "long:ttft_s=5"], 0, "--long-prompt-tokens: got 0"),
        (["ttft_p90_s=1", "long:ttft_p99_s=5"], 8192, "--slo: got 'ttft_p90_s, long:ttft_p99_s'"),
        (["long:ttft_s=1", "long:ttft_s=2"], 8192, "--slo: got 'long:ttft_s=2'"),
        (["long:ttfx_s=1"], 8192, "--slo: got 'long:ttfx_s=1'"),
    ):
        with pytest.raises(ConfigError) as e:
            parse_slos(items, long_prompt_tokens=tokens)
        assert str(e.value).startswith(key), str(e.value)


def test_meets_reads_each_requests_class():
    req = simulate(load_scenario("worst-case-outliers", OVER)).requests
    prompt = column(req, "prompt_tokens")
    long = prompt >= 8192
    assert 5 < long.sum() < 40
    plain, loose = SLO(ttft_s=0.3), SLO(ttft_s=60.0)
    both = SLO(ttft_s=0.3, long_prompt_tokens=8192, long_ttft_s=60.0)
    want = np.where(long, meets(req, loose), meets(req, plain))
    assert np.array_equal(meets(req, both), want)
    # The long prompts' TTFT is what the plain bound misses: the classes change the answer.
    assert attainment(req, both) > attainment(req, plain)
    m = miss_shares(req, both)
    assert m["refused"] + m["truncated"] + m["ttft"] == pytest.approx(1 - attainment(req, both))
    # A long bound alone: short requests have no TTFT bound.
    only_long = SLO(long_prompt_tokens=8192, long_ttft_s=0.3)
    assert np.array_equal(meets(req, only_long), np.where(long, meets(req, plain), meets(req, SLO())))


def test_the_early_stopping_rule_is_the_same():
    sc = load_scenario("worst-case-outliers", OVER)
    res = simulate(sc)
    slo = SLO(ttft_s=0.3, tpot_s=0.05, long_prompt_tokens=8192, long_ttft_s=60.0, long_tpot_s=0.2)
    seen = []
    simulate(sc, stop=lambda r: seen.append((r.id, request_outcome(r, slo)[0])) or False)
    ok = meets(res.requests, slo)
    ids = column(res.requests, "id")
    assert dict(seen) == dict(zip(ids.tolist(), ok.tolist()))


def test_a_plan_with_two_classes(tmp_path):
    from sim.analysis.planner import plan

    slo = parse_slos(["ttft_p90_s=0.3", "long:ttft_p90_s=60"], long_prompt_tokens=8192)
    p = plan("worst-case-outliers", slo, OVER, ["paged"], workers=1)
    assert p["slo"]["long_ttft_s"] == 60.0 and "prompts of 8192+ tokens: TTFT ≤ 60 s" in p["slo_text"]
    plain = plan("worst-case-outliers", parse_slos(["ttft_p90_s=0.3"]), OVER, ["paged"], workers=1)
    # Long prompts no longer count as misses: the goodput rises.
    assert p["candidates"][0]["goodput_rps"] > plain["candidates"][0]["goodput_rps"]
