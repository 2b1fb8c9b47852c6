"""Length predictors (``allocator.length_predictor``) and the allocators that route or move by length.

* A predictor other than ``oracle`` never reads a request's output length: requests with equal
  prompts and different outputs get equal predictions and are placed alike.
* ``quantile`` is fitted on the lengths the workload is drawn from, not on the run's requests, and
  its stated coverage holds on that reference.
* With any predictor, and with static's ``overflow: fallback``, the allocator invariants hold after
  every operation of a whole simulation, and every request ends completed or rejected with a reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import tiny_scenario
from sim.allocators import HybridTailAllocator, kinds as builtin_kinds, registry
from sim.allocators.tiered import StaticFallbackAllocator
from sim.config import SchedulerConfig, load_scenario
from sim.engine.cluster import length_predictor, simulate
from sim.request import Request
from sim.sched.continuous import ContinuousScheduler
from sim.workload.generator import build_workload
from sim.workload.predictor import PromptPredictor, fit_quantile, make_predictor


class _Blind:
    """A request whose output length cannot be read: prompt and tokens generated only."""

    def __init__(self, prompt: int, generated: int = 0):
        self.prompt, self.generated = prompt, generated

    @property
    def output(self) -> int:
        raise AssertionError("a predictor read the output length")


def _quantile(seed: int = 0, q: float = 0.9):
    rng = np.random.default_rng(seed)
    p = np.maximum(1, rng.lognormal(6, 1, 5000)).astype(np.int64)
    o = np.maximum(1, p * rng.lognormal(-1, 0.8, 5000)).astype(np.int64)  # output grows with the prompt
    return fit_quantile(p, o, q)


@settings(max_examples=300)
@given(
    prompt=st.integers(1, 20_000),
    generated=st.integers(0, 5000),
    out_a=st.integers(1, 20_000),
    out_b=st.integers(1, 20_000),
    kind=st.sampled_from(["prompt", "quantile"]),
)
def test_a_predictor_never_reads_the_output_length(prompt, generated, out_a, out_b, kind):
    pred = PromptPredictor() if kind == "prompt" else _quantile()
    a = Request(1, prompt, max(out_a, generated + 1), 0.0)
    b = Request(2, prompt, max(out_b, generated + 1), 0.0)
    a.generated = b.generated = generated
    got = pred.predict_total(a)
    assert got == pred.predict_total(b) == pred.predict_total(_Blind(prompt, generated))
    assert got >= prompt + generated  # never below what is known
    assert not pred.upper_bound


def test_the_oracle_reads_the_output_and_says_it_is_an_upper_bound():
    o = make_predictor("oracle")
    assert o.predict_total(Request(1, 100, 50, 0.0)) == 150 and o.upper_bound
    with pytest.raises(AssertionError, match="output length"):
        o.predict_total(_Blind(100))


def _first_placements(kind: str, outputs: list[int]) -> list[bool]:
    """Whether each request (prompts fixed, ``outputs`` varied) got a static slot at admission."""
    alloc = HybridTailAllocator(40_000, 10, static_tokens=20_000, reserve_tokens=4000, long_threshold_tokens=1000)
    pred = _quantile() if kind == "quantile" else make_predictor(kind)
    sched = ContinuousScheduler(
        SchedulerConfig(max_num_batched_tokens=100_000),
        alloc,
        kv_cap=None,
        swap_capacity_bytes=0,
        hash_block_tokens=16,
        victim_policy="lifo",
        length_predictor=pred,
    )
    prompts = [200, 900, 1200, 300, 800]
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        sched.waiting.append(Request(i, p, o, 0.0))
    plan = sched.schedule()
    assert len(plan.admitted) == len(prompts)
    return [alloc._where[i] is alloc.static for i in range(len(prompts))]


@pytest.mark.parametrize("kind", ["prompt", "quantile"])
def test_placement_depends_on_the_prompt_not_the_output(kind):
    short, long = [10, 10, 10, 10, 10], [3000, 3000, 3000, 3000, 3000]
    assert _first_placements(kind, short) == _first_placements(kind, long)
    # The test can fail: the oracle places by the true length.
    assert _first_placements("oracle", short) != _first_placements("oracle", long)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 1000), q=st.floats(0.5, 0.99))
def test_quantile_coverage_holds_on_its_reference(seed, q):
    pred = _quantile(seed, q)
    rng = np.random.default_rng(seed)
    p = np.maximum(1, rng.lognormal(6, 1, 5000)).astype(np.int64)
    o = np.maximum(1, p * rng.lognormal(-1, 0.8, 5000)).astype(np.int64)
    predicted = np.array([pred.predict_total(_Blind(int(x))) for x in p])
    assert np.mean(p + o <= predicted) >= q
    assert pred.reference_coverage == pytest.approx(np.mean(p + o <= predicted))
    # A prompt-conditional fit: longer prompts, longer predicted answers.
    assert pred.output_quantile[-1] > pred.output_quantile[0]


def test_quantile_is_fitted_on_the_distribution_not_on_the_run():
    base = {"allocator.kind": "hybrid_tail", "allocator.length_predictor": "quantile"}
    fits = []
    for n in (50, 400):
        sc = load_scenario("worst-case-outliers", {**base, "workload.num_requests": n})
        wl = build_workload(sc)
        ref_p, ref_o = wl.reference_lengths()
        assert len(ref_p) == 20_000 and not np.array_equal(ref_p[:n], wl.prompt_tokens)
        fits.append(length_predictor(sc, wl))
    # The run's own draws do not move the fit: the same quantiles for 50 or 400 requests.
    assert fits[0].edges == fits[1].edges and fits[0].output_quantile == fits[1].output_quantile
    # Trace lengths: every row of the trace file, however many the run replays.
    sc = load_scenario("azure-conv-replay", {**base, "workload.num_requests": 100})
    wl = build_workload(sc)
    assert len(wl.reference_lengths()[0]) > 100 and len(wl) == 100


def test_percentile_reservation_is_one_size_whatever_the_request_count():
    """``allocator.reserve: p95`` near a cliff of the length distribution (5 % outliers ten times
    as long sit right at the 95th percentile) is the reference's p95 for every run size, not the
    p95 of however many requests a run draws."""
    from sim.engine.deployment import Deployment
    from sim.workload.generator import total_length_percentile

    # Requests of 2,048 + 128 tokens, 5 % of them ten times as long.
    over = {
        "allocator.kind": "static",
        "allocator.reserve": "p95",
        "workload.max_model_len": 32768,
        "workload.lengths.outlier_fraction": 0.05,
        "workload.lengths.outlier_multiplier": 10.0,
        "workload.lengths.base.outlier_fraction": 0.0,
    }
    reserves, own = [], []
    for n in (40, 400, 800, 1600):
        sc = load_scenario("variable-length-batch", {**over, "workload.num_requests": n})
        wl = build_workload(sc)
        reserves.append(Deployment.from_scenario(sc, lambda q, wl=wl: total_length_percentile(wl, q)).reserve_tokens)
        own.append(int(np.ceil(np.percentile(wl.prompt_tokens + wl.output_tokens, 95))))
        ref_p, ref_o = wl.reference_lengths()
        assert reserves[-1] == min(sc.workload.max_model_len, int(np.ceil(np.percentile(ref_p + ref_o, 95))))
    assert len(set(reserves)) == 1
    # The runs' own 95th percentiles straddle the cliff: sizing on them would flip the reservation.
    assert max(own) > 2 * min(own)


# --- whole simulations: invariants after every operation, every request accounted for -------------


def _checked(cls):
    class Checked(cls):
        """Asserts the allocator's invariants after every operation the engine makes."""

        def admit(self, seq, tokens):
            r = super().admit(seq, tokens)
            self.check_invariants()
            return r

        def grow(self, seq, tokens):
            before = self.used.get(seq)
            r = super().grow(seq, tokens)
            if r is not r.OK:
                assert self.used.get(seq) == before, "a refused grow changed state"
            self.check_invariants()
            return r

        def release(self, seq):
            super().release(seq)
            self.check_invariants()

        def advance_decode(self, seqs, tokens_after):
            super().advance_decode(seqs, tokens_after)
            self.check_invariants()

    return Checked


CHECKED_FALLBACK = _checked(StaticFallbackAllocator)
CHECKED_HYBRID = _checked(HybridTailAllocator)
BUILT: list = []


def _build_checked_hybrid(a, b):
    alloc = builtin_kinds.build_hybrid_tail(a, b)
    alloc.__class__ = CHECKED_HYBRID
    BUILT.append(alloc)
    return alloc


def _build_checked_static(a, b):
    alloc = builtin_kinds.build_static(a, b)
    assert isinstance(alloc, StaticFallbackAllocator)
    alloc.__class__ = CHECKED_FALLBACK
    BUILT.append(alloc)
    return alloc


@pytest.fixture(scope="module")
def checked_kinds():
    registry.register(
        "checked_hybrid_tail",
        _build_checked_hybrid,
        size=builtin_kinds.size_hybrid_tail,
        knobs=("long_threshold", "static_fraction", "length_predictor"),
        description="test",
        paged_layout=True,
    )
    registry.register(
        "checked_static_fallback",
        _build_checked_static,
        size=builtin_kinds.size_static,
        knobs=("reserve", "overflow", "fallback_fraction"),
        description="test",
    )
    yield
    registry.unregister("checked_hybrid_tail")
    registry.unregister("checked_static_fallback")


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["checked_hybrid_tail", "checked_static_fallback"]),
    predictor=st.sampled_from(["oracle", "prompt", "quantile"]),
    kv=st.integers(1600, 5000),
    rate=st.floats(5.0, 100.0),
    seed=st.integers(0, 10_000),
    swap=st.booleans(),
    chunked=st.booleans(),
    fraction=st.floats(0.15, 0.5),
    mode=st.sampled_from(["fast_forward", "step"]),
)
def test_every_request_ends_with_a_reason_and_invariants_hold(
    checked_kinds, kind, predictor, kv, rate, seed, swap, chunked, fraction, mode
):
    BUILT.clear()
    over = {
        "allocator.kind": kind,
        "allocator.length_predictor": predictor,
        "allocator.long_threshold": "p70",
        "allocator.static_fraction": 0.7,
        "allocator.reserve": "p75",
        "allocator.overflow": "fallback",
        "allocator.fallback_fraction": fraction,
        "seed": seed,
        "workload.num_requests": 50,
        "workload.arrival.rate": rate,
        "engine.mode": mode,
        "scheduler.chunked_prefill": chunked,
        "scheduler.max_num_batched_tokens": 256 if chunked else 1024,
        "allocator.preemption.mode": "swap" if swap else "recompute",
        "allocator.preemption.swap_capacity_bytes": 2000 * 2048,
        "workload.lengths": {
            "kind": "lognormal",
            "prompt_median": 120,
            "prompt_sigma": 0.9,
            "output_median": 60,
            "output_sigma": 1.0,
        },
    }
    res = simulate(tiny_scenario(kv_tokens=kv, **over))
    r = res.requests.to_pydict()
    assert len(r["id"]) == 50 and sorted(r["id"]) == list(range(50))
    for status, reason, truncated in zip(r["status"], r["reason"], r["truncated"]):
        assert status in ("completed", "rejected")
        assert (status == "rejected") == bool(reason), (status, reason)
        assert not truncated  # fallback and hybrid_tail never truncate
    assert BUILT and all(a.reserved_tokens() == 0 and a.used_total == 0 for a in BUILT)
    s = res.summary
    assert s["completed"] + s["rejected"] == 50
    if kind == "checked_hybrid_tail":
        lp = s["length_predictor"]
        assert lp["kind"] == predictor and lp["upper_bound"] == (predictor == "oracle")
        assert (
            sum(
                lp[k]
                for k in (
                    "long_predicted_long",
                    "long_predicted_short",
                    "short_predicted_long",
                    "short_predicted_short",
                )
            )
            <= s["requests"]
        )
        if predictor == "oracle":  # the true length: no request outgrows its placement
            assert lp["long_predicted_short"] == lp["short_predicted_long"] == lp["migrations"] == lp["evictions"] == 0
    else:
        assert s["fallback_entries"] >= s["fallback_moves"]


def test_preemption_stays_in_the_growing_requests_region():
    """A pool request that cannot grow preempts the most recent request in the pool, here itself;
    the requests after it in the batch (in the static region) still run this iteration."""
    alloc = HybridTailAllocator(800, 10, static_tokens=600, reserve_tokens=300, long_threshold_tokens=250, block_size=1)
    sched = ContinuousScheduler(
        SchedulerConfig(max_num_batched_tokens=100_000),
        alloc,
        kv_cap=None,
        swap_capacity_bytes=0,
        hash_block_tokens=16,
        victim_policy="lifo",
        length_predictor=PromptPredictor(),
    )
    a, b = Request(0, 200, 50, 0.0), Request(1, 280, 50, 0.0)
    sched.waiting.extend([a, b])
    assert len(sched.schedule().admitted) == 2
    assert alloc._where[0] is alloc.pool and alloc._where[1] is alloc.static
    for r in (a, b):  # their prefill ran: each decodes next
        r.computed, r.generated = r.prompt, 1
    plan = sched.schedule()
    assert plan.preempted == 1 and list(sched.waiting) == [a]  # the pool (200 tokens) was a's alone
    assert [r for r, _ in plan.items] == [b]
    alloc.check_invariants()


@pytest.mark.parametrize("scales", ["both", "prompt", "output"])
def test_mixture_outliers_scale_what_they_say(scales):
    """``outlier_scales``: the multiplier lengthens the prompt, the output or both of an outlier; the
    other length stays the base's."""
    over = {
        "workload.num_requests": 400,
        "workload.max_model_len": 32768,
        "workload.lengths.outlier_fraction": 0.1,
        "workload.lengths.outlier_multiplier": 8.0,
        "workload.lengths.outlier_scales": scales,
        "workload.lengths.base.outlier_fraction": 0.0,
    }
    wl = build_workload(load_scenario("variable-length-batch", over))
    p, o = wl.prompt_tokens, wl.output_tokens
    long_p, long_o = p == 8 * 2048, o == 8 * 128
    assert set(p.tolist()) <= {2048, 8 * 2048} and set(o.tolist()) <= {128, 8 * 128}
    n_out = int((long_p | long_o).sum())
    assert 20 < n_out < 60  # about 10 % of 400
    assert long_p.sum() == (n_out if scales != "output" else 0)
    assert long_o.sum() == (n_out if scales != "prompt" else 0)
