"""The planner's answers: the guided search against the exhaustive one, intervals over seeds, break-evens.

Scenario sizes are cut down so the file runs in about a minute on two shared cores; the full-size
comparison on every plannable built-in scenario is ``python -m bench planner`` (docs/sweeps.md).
"""

import json

import pytest

from bench.planner import compare
from sim.analysis.planner import plan
from sim.analysis.recommend import mean_interval
from sim.analysis.slo import parse_slos

CHAT_SLO = ["ttft_p90_s=0.5", "tpot_p90_s=0.05"]


@pytest.mark.parametrize(
    "scenario,slo,requests",
    [
        ("chat-api", CHAT_SLO, 400),
        ("peak-vs-average", ["ttft_s=0.5", "tpot_s=0.03"], 400),
        ("small-batch", ["ttft_s=1", "tpot_s=0.02"], 300),
        ("streaming-chatbot", ["ttft_s=0.2", "tpot_s=0.015"], 400),
    ],
)
def test_guided_search_gives_the_exhaustive_answer(scenario, slo, requests):
    r = compare(scenario, slo, {"workload.num_requests": requests}, workers=2)
    assert r["same_recommendation"], r["recommendation"]
    for c in r["candidates"]:
        assert c["status"][0] == c["status"][1], c
        assert c["within_tolerance"], c
    # Fewer simulated requests for the same answer.
    assert r["runs"]["guided"][0]["simulated_requests"] < r["runs"]["exhaustive"][0]["simulated_requests"]


def test_guided_search_gives_the_exhaustive_answer_with_a_target_rate():
    r = compare(
        "chat-api",
        CHAT_SLO,
        {"workload.num_requests": 400},
        target_rate=40,
        workers=2,
        allocators=["static", "paged", "dynamic"],
    )
    assert r["same_recommendation"] and r["same_gpus"], r
    assert all(c["within_tolerance"] for c in r["candidates"]), r["candidates"]


def test_seed_interval_covers_the_many_seed_answer():
    """--seeds 5: the goodput intervals cover the mean goodput of an exhaustive search on 20 seeds
    (the same seeds first: common random numbers). A 95 % interval misses one time in twenty, so one
    5-seed interval is not a test: the 20 seeds make four disjoint 5-seed intervals (the planner's
    own ``mean_interval``), and at least three must cover the 20-seed mean (two or more misses of
    four has probability 1.4 % at 95 % coverage). The same holds for the widths."""
    slo = parse_slos(CHAT_SLO)
    over = {"workload.num_requests": 300}
    five = plan("chat-api", slo, overrides=over, allocators=["paged", "static"], seeds=5, workers=2)
    many = plan(
        "chat-api", slo, overrides=over, allocators=["paged", "static"], seeds=20, workers=2, search="exhaustive"
    )
    for c5 in five["candidates"]:
        c20 = next(c for c in many["candidates"] if c["name"] == c5["name"])
        lo, hi = c5["goodput_ci_rps"]
        assert lo < c5["goodput_mean_rps"] < hi
        # The guided search's five seeds are the exhaustive search's first five (within its tolerance).
        g5 = [s["goodput_est_rps"] for s in c5["seed_goodputs"]]
        g20 = [s["goodput_est_rps"] for s in sorted(c20["seed_goodputs"], key=lambda s: s["seed"])]
        assert g5 == pytest.approx(g20[:5], rel=0.05), (c5["name"], g5, g20[:5])
        m20 = c20["goodput_mean_rps"]
        blocks = [mean_interval(g20[i : i + 5], 0.95) for i in range(0, 20, 5)]
        covered = [b_lo <= m20 <= b_hi for _, b_lo, b_hi in blocks]
        assert sum(covered) >= 3, (c5["name"], m20, blocks)
        # 20 seeds pin the mean down better than 5 (than the typical 5-seed interval: expected width
        # ratio t(19)/√20 ÷ t(4)/√5 ≈ 0.38; one block of close seeds can be narrower by chance).
        widths = sorted(b_hi - b_lo for _, b_lo, b_hi in blocks)
        assert c20["goodput_ci_rps"][1] - c20["goodput_ci_rps"][0] < (widths[1] + widths[2]) / 2, (c5["name"], blocks)
        # Informative, not covering by width: narrower than ±15 % of the mean, so a goodput 15 %
        # off the many-seed answer falls outside it.
        assert (hi - lo) / 2 < 0.15 * m20, (c5["name"], lo, hi)
        assert not lo <= 1.15 * m20 <= hi and not lo <= m20 / 1.15 <= hi
    noise = five["recommendation"]["noise"]
    assert noise and all({"other", "diff_rps", "ci_rps", "within_noise"} <= set(n) for n in noise)


def test_mean_interval_covers_at_its_confidence():
    """The interval over seeds is a Student-t interval: over many samples of five it covers the
    true mean about 95 % of the time (a normal-quantile or n-instead-of-√n interval would not)."""
    import numpy as np

    from sim.analysis.recommend import mean_interval

    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(2000):
        _m, lo, hi = mean_interval(list(10.0 + rng.standard_normal(5)), 0.95)
        hits += lo <= 10.0 <= hi
    assert 0.93 < hits / 2000 < 0.97, hits


def test_break_even_flips_the_recommendation_on_either_side(tmp_path):
    """The paged-overhead break-even printed for the default scenario, checked by re-planning with
    the constant moved to either side of it."""
    slo = parse_slos(CHAT_SLO)
    kw = dict(allocators=["paged", "dynamic"], target_rate=40, workers=2)
    p = plan("chat-api", slo, break_even=["paged_overhead"], **kw)
    a = next(a for a in p["assumptions"] if a["kind"] == "paged_overhead")
    assert a["key"] == "layout.paged_overhead" and "FlashInfer" in a["source"]
    flips = [d for d in a["directions"] if d["flip"] is not None]
    assert len(flips) == 1, a["directions"]
    d = flips[0]
    best, other = p["recommendation"]["candidate"], d["winner"]
    assert {best, other} == {"paged", "dynamic"} and f"{d['flip'] * 100:.2g} %" in a["text"]
    lo, hi = d["bracket"]
    step = max(hi - lo, 0.005)
    doc = json.loads(open(a["profile"]).read())
    got = {}
    for v in (lo - step, hi + step):
        path = tmp_path / f"profile-{v:.4f}.json"
        path.write_text(json.dumps({**doc, "layout": {**doc["layout"], "paged_overhead": v}}))
        got[v] = plan("chat-api", slo, overrides={"cost_model.profile": str(path)}, **kw)["recommendation"]["candidate"]
    below, above = (best, other) if d["direction"] == "up" else (other, best)
    assert got[lo - step] == below and got[hi + step] == above, (d, got)


def test_kv_capacity_break_even_is_searched_and_checked_by_replanning():
    """The derived KV capacity is listed as an assumption (unless the scenario sets what the server
    logged), searched from half to 1.1 times its value; what the search says at the range's end is
    what a plan with the capacity set there recommends."""
    from sim.analysis.assumptions import KV_SHARES
    from sim.config import read_scenario_dict, scenario_from_dict
    from sim.engine.deployment import Deployment

    slo = parse_slos(CHAT_SLO)
    kw = dict(allocators=["static-p95", "paged"], target_rate=40, workers=2)
    p = plan("chat-api", slo, break_even=["kv_capacity"], **kw)
    (a,) = [a for a in p["assumptions"] if a["kind"] == "kv_capacity"]
    derived = Deployment.from_scenario(scenario_from_dict(*read_scenario_dict("chat-api"))).kv_capacity_tokens
    assert a["key"] == "gpu.kv_cache_tokens" and a["value"] == derived and "derived from memory" in a["source"]
    assert "gpu.kv_cache_tokens" in a["measure"] and sorted(a["affects"]) == ["paged", "static-p95"]
    ends = {d["direction"]: d["end"] for d in a["directions"]}
    assert ends == {"down": round(KV_SHARES[0] * derived), "up": round(KV_SHARES[1] * derived)}
    best = p["recommendation"]["candidate"]
    for d in a["directions"]:
        at_end = plan("chat-api", slo, overrides={"gpu.kv_cache_tokens": d["end"]}, **kw)["recommendation"]
        if d["flip"] is None:
            assert at_end["candidate"] == best, (d, at_end)
            assert f"{d['end']:,} tokens" in a["text"]
        else:
            assert at_end["candidate"] != best, (d, at_end)
    # Set as the server logged it, the capacity is not an assumption.
    pinned = plan("chat-api", slo, overrides={"gpu.kv_cache_tokens": derived}, **kw)
    assert not [a for a in pinned["assumptions"] if a["kind"] == "kv_capacity"]
