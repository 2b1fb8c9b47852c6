"""The guided goodput search, the early-stopping test, the saturation estimate and common random numbers."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.analysis.saturation import saturation_rate
from sim.analysis.search import Evaluation, find_goodput, find_goodput_guided, interpolated_goodput
from sim.analysis.sequential import AttainmentTest, mser_truncation, request_outcome, trend_t
from sim.analysis.slo import SLO, attainment, meets
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.cluster import simulate
from sim.workload.generator import build_workload
from tests.helpers import tiny_scenario


def _curve(edge: float):
    """Attainment falling through 0.9 at ``edge``: 0.1 per 5 % of rate near it (as chat-api's does),
    curving towards 1 below and 0 above."""

    def a(r: float) -> float:
        x = 2.0 * math.log(r / edge)
        return 1.0 - 0.1 * math.exp(x * 5) if x < 0 else max(0.0, 0.9 - x - 2 * x * x)

    return a


def _evaluator(curve, calls):
    def ev(r: float, complete: bool) -> Evaluation:
        calls.append((r, complete))
        a = curve(r)
        return Evaluation(a >= 0.9, a, True, True)

    return ev


@pytest.mark.parametrize("start_factor", [0.97, 1.0, 1.03, 0.5, 2.0, 0.01, 50.0])
def test_guided_search_contract_and_economy(start_factor):
    edge = 17.3
    curve = _curve(edge)
    calls = []
    s = find_goodput_guided(_evaluator(curve, calls), edge * start_factor, 0.9, tol=0.05)
    assert s.status == "ok"
    # The contract both searches share: a pass at the goodput, a miss at goodput·(1 + tol).
    assert curve(s.goodput) >= 0.9 > curve(s.goodput * 1.05)
    assert s.next_rate == pytest.approx(s.goodput * 1.05)
    assert edge / 1.05 <= s.goodput <= edge
    # The interpolated edge lies inside the final bracket, near the true edge.
    est = s.estimate(0.9)
    assert s.goodput <= est < s.next_rate and abs(est / edge - 1) < 0.02
    # A start within the tolerance of the edge settles in two runs; far starts take a few more.
    if 1 / 1.05 <= start_factor <= 1.05:
        assert len(calls) == 2
    assert len(calls) <= 15
    ex = find_goodput(lambda r: curve(r), edge * start_factor, 0.9, tol=0.05)
    assert 1 / 1.05 < s.goodput / ex.goodput < 1.05


def test_guided_search_statuses_and_noisy_curves():
    def ev_of(f):
        return lambda r, complete: Evaluation(f(r) >= 0.9, f(r), True, True)

    assert find_goodput_guided(ev_of(lambda r: 0.0), 10.0, 0.9).status == "infeasible"
    assert find_goodput_guided(ev_of(lambda r: 1.0), 10.0, 0.9).status == "unbounded"
    assert find_goodput_guided(ev_of(lambda r: 1.0 if r < 7 else 0.0), 10.0, 0.9, max_evals=3).status == "budget"
    # A curve that passes again above a miss: the verification keeps searching above it.
    noisy = lambda r: 1.0 if r <= 10 or 10.3 <= r <= 10.6 else 0.0  # noqa: E731
    s = find_goodput_guided(ev_of(noisy), 10.0, 0.9, tol=0.05)
    assert s.status == "ok" and noisy(s.goodput) >= 0.9 and noisy(s.goodput * 1.05) < 0.9


def test_guided_search_reruns_quick_decisions_to_verify():
    """Quick runs that are wrong (a tested pass above the edge) only steer: the reported pair is complete."""
    edge = 10.0
    curve = _curve(edge)
    seen = []

    def ev(r: float, complete: bool) -> Evaluation:
        seen.append((r, complete))
        a = curve(r)
        if not complete and r < edge * 1.1:
            return Evaluation(True, 0.97, False, False)  # an over-optimistic early stop
        return Evaluation(a >= 0.9, a, complete or a < 0.9, complete)

    s = find_goodput_guided(ev, 9.5, 0.9, tol=0.05)
    assert s.status == "ok" and curve(s.goodput) >= 0.9 > curve(s.next_rate)
    assert (s.goodput, True) in seen and (s.next_rate, True) in seen


def test_guided_search_out_of_budget_confirms_a_quick_pass():
    """Near a steep edge every quick run stops undecided-but-passing and none is exact: when the
    budget runs out, the highest quick pass is completed rather than reporting a goodput of 0."""
    edge = 6.0
    curve = _curve(edge)
    calls = []

    def ev(r: float, complete: bool) -> Evaluation:
        calls.append((r, complete))
        a = curve(r)
        if complete:
            return Evaluation(a >= 0.9, a, True, True)
        return Evaluation(a >= 0.9, a, False, False)  # the sequential test never decides

    s = find_goodput_guided(ev, 5.9, 0.9, tol=0.01, max_evals=3)
    assert s.status == "budget"
    assert s.goodput > 0 and curve(s.goodput) >= 0.9
    assert (s.goodput, True) in calls and len(calls) <= 3 + 3
    # Without any pass at all it stays 0.
    s0 = find_goodput_guided(lambda r, c: Evaluation(False, 0.5, False, c), 5.9, 0.9, tol=0.01, max_evals=3)
    assert s0.goodput == 0.0 and s0.status == "budget"


def test_interpolated_goodput():
    assert interpolated_goodput(10, 0.95, 10.5, 0.85, 0.9) == pytest.approx(math.sqrt(10 * 10.5))
    assert interpolated_goodput(10, 0.9, 10.5, 0.8, 0.9) == pytest.approx(10)
    assert interpolated_goodput(10, 0.8, 10.5, 0.95, 0.9) == 10  # not a bracket: the lower end


def test_mser_finds_the_warmup_and_trend_has_the_right_sign():
    rng = np.random.default_rng(0)
    y = np.r_[np.linspace(0.0, 1.0, 20), 1.0 + 0.05 * rng.standard_normal(200)]
    assert 10 <= mser_truncation(y) <= 30
    assert mser_truncation(1.0 + 0.05 * rng.standard_normal(200)) < 100
    t = np.arange(50.0)
    assert trend_t(t + rng.standard_normal(50)) > 5
    assert trend_t(-t + rng.standard_normal(50)) < -5
    assert abs(trend_t(rng.standard_normal(400))) < 4


def test_request_outcome_is_the_slo_rule():
    sc = tiny_scenario(**{"workload.arrival.rate": 40.0, "workload.num_requests": 120})
    res = simulate(sc)
    slo = SLO(ttft_s=0.2, tpot_s=0.02)
    seen = []
    test = AttainmentTest(slo, sc.workload.num_requests, statistical=False)
    simulate(sc, stop=lambda req: (seen.append(request_outcome(req, slo)[0]), test(req))[1])
    test.finish()
    assert sum(seen) == int(meets(res.requests, slo).sum())
    assert test.decision == ("pass" if attainment(res.requests, slo) >= 0.9 else "fail")


@settings(max_examples=25, deadline=None)
@given(
    rate=st.floats(5.0, 200.0),
    ttft=st.floats(0.01, 2.0),
    tpot=st.floats(0.002, 0.1),
    target=st.sampled_from([0.5, 0.8, 0.9, 0.99]),
    seed=st.integers(0, 50),
)
def test_certain_decisions_are_exact(rate, ttft, tpot, target, seed):
    """Without the statistical test a run stops only when the rest cannot change the answer:
    the decision always equals the complete run's."""
    sc = tiny_scenario(**{"workload.arrival.rate": rate, "workload.num_requests": 80, "seed": seed})
    slo = SLO(ttft_s=ttft, tpot_s=tpot, attainment=target)
    full = attainment(simulate(sc).requests, slo)
    test = AttainmentTest(slo, 80, statistical=False)
    res = simulate(sc, stop=test)
    test.finish()
    assert test.decision == ("pass" if full >= target else "fail")
    if not res.run_info["halted"]:
        assert test.ended == 80 and test.estimate == pytest.approx(full)


def test_sequential_test_stops_early_far_from_the_edge():
    data, base_dir = read_scenario_dict("chat-api")
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    for rate, want in ((8.0, "pass"), (30.0, "fail")):
        sc = scenario_from_dict(apply_overrides(data, {"workload.arrival.rate": rate}), base_dir)
        test = AttainmentTest(slo, 2000)
        res = simulate(sc, stop=test)
        assert res.run_info["halted"] and test.decision == want and test.ended < 1000, (rate, test.result())
        assert (attainment(simulate(sc).requests, slo) >= 0.9) == (want == "pass")


def test_saturation_estimate_is_near_the_simulated_saturation():
    data, base_dir = read_scenario_dict("chat-api")
    for kind in ({"allocator.kind": "paged"}, {"allocator.kind": "static", "allocator.reserve": "max_model_len"}):
        sc = scenario_from_dict(apply_overrides(data, kind), base_dir)
        est = saturation_rate(sc)
        over = scenario_from_dict(apply_overrides(data, {**kind, "workload.arrival.rate": 3 * est}), base_dir)
        measured = simulate(over).summary["throughput_requests_per_s"]
        assert 0.8 < est / measured < 1.25, (kind, est, measured)


def test_candidates_and_rates_share_their_random_draws():
    """Common random numbers: every candidate of a seed gets the same lengths and the same
    arrival sequence, scaled by the rate."""
    from sim.analysis.planner import CANDIDATES

    data, base_dir = read_scenario_dict("chat-api")
    base = build_workload(scenario_from_dict(data, base_dir))
    for c in CANDIDATES.values():
        for rate in (7.0, 21.0):
            wl = build_workload(
                scenario_from_dict(apply_overrides(data, {**c["overrides"], "workload.arrival.rate": rate}), base_dir)
            )
            assert np.array_equal(wl.prompt_tokens, base.prompt_tokens)
            assert np.array_equal(wl.output_tokens, base.output_tokens)
            np.testing.assert_allclose(wl.arrival_s * rate, base.arrival_s * 14.0, rtol=1e-12)


def test_tail_room_counts_the_longest_requests_where_they_are_held():
    from sim.analysis.saturation import tail_room
    from sim.engine.deployment import derived_kv_cache_tokens

    # Requests of 2,048 + 128 tokens, 5 % of them ten times as long (21,760 tokens).
    data, base_dir = read_scenario_dict("variable-length-batch")
    data = apply_overrides(
        data,
        {
            "workload.max_model_len": 32768,
            "workload.lengths.outlier_fraction": 0.05,
            "workload.lengths.outlier_multiplier": 10.0,
            "workload.lengths.base.outlier_fraction": 0.0,
        },
    )

    def room(**over):
        return tail_room(scenario_from_dict(apply_overrides(data, over), base_dir))

    cap = derived_kv_cache_tokens(scenario_from_dict(data, base_dir))
    assert room(**{"allocator.kind": "paged"}) == pytest.approx(cap / 21760)
    # A p90 reservation holds the short ones; the long ones share the fallback region (10 % of KV).
    fb = {"allocator.kind": "static", "allocator.reserve": "p90", "allocator.overflow": "fallback"}
    assert room(**fb) == pytest.approx(int(cap * 0.1) / 21760)
    assert room(**{**fb, "allocator.overflow": "truncate"}) == cap // 2176
    assert room(**{"allocator.kind": "hybrid_tail"}) == int(cap * 0.3) // 32768
    # Nothing outgrows a reservation of max_model_len: the region holds no one.
    assert room(**{**fb, "allocator.reserve": "max_model_len"}) == math.inf


def test_a_quick_run_passes_early_only_where_the_longest_requests_fit():
    """Where fewer than MIN_TAIL_ROOM of the longest requests fit at once, their rare coincidences
    decide a run, so only a miss may stop it early; the same run otherwise passes on the test."""
    from sim.analysis.planner import MIN_TAIL_ROOM, _Runner

    data, base_dir = read_scenario_dict("chat-api")
    task = {
        "slo": SLO(ttft_s=0.5, tpot_s=0.05).as_dict(),
        "base": data,
        "base_dir": str(base_dir),
        "base_replicas": 1,
        "base_requests": 2000,
        "base_seed": 0,
        "overrides": {},
        "confidence": 0.95,
        "start_rate": 14.0,
        "saturation": 22.0,
    }
    roomy = _Runner({**task, "tail_room": math.inf}).quick(8.0, 1)
    assert (roomy["decision"], roomy["how"]) == ("pass", "tested") and roomy["ended"] < 1000
    tight = _Runner({**task, "tail_room": MIN_TAIL_ROOM / 2}).quick(8.0, 1)
    assert tight["decision"] == "pass" and tight["how"] == "complete" and tight["ended"] == 2000
