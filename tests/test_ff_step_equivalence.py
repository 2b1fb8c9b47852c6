"""``engine.mode: fast_forward`` against ``step``: the same counts and the same times (to rounding).

Each case is one where a window could run past the iteration at which stepping sees a change:

* prefill iterations apart from decodes (``scheduler.mixed_batches: false``) schedule admissions
  before the decodes grow, so memory a decode's growth frees (a move to the fallback region, a
  relocation of a dynamic extent) reaches the queue at the next iteration: a window must end there;
* with prefix caching, decode growth that evicts cached blocks of the queue head's prefix makes
  stepping ask again to admit it (a refusal each time): a window ends where that happens;
* the cost model's out-of-range counts are those of the iterations that ran, not of a window
  priced further than an arrival let it run.
"""

import os

import pytest
from hypothesis import given, settings, strategies as st

from helpers import tiny_scenario
from sim.config import apply_overrides, parse_override, read_scenario_dict, scenario_from_dict
from sim.engine.cluster import simulate
from test_engine import _compare


def _chat_api(sets: list[str], mode: str):
    data, base = read_scenario_dict("chat-api")
    over = dict(parse_override(s) for s in [*sets, f"engine.mode={mode}"])
    return simulate(scenario_from_dict(apply_overrides(data, over), base_dir=base))


def _both(sets: list[str]):
    return _chat_api(sets, "fast_forward"), _chat_api(sets, "step")


def _same(ff, step) -> None:
    """Every count equal, every time equal to rounding (``_compare``), and the cost model's
    out-of-range counts equal."""
    _compare(ff, step)
    assert ff.summary["cost_model_out_of_range"] == step.summary["cost_model_out_of_range"]
    for key in ("e2e_s", "ttft_s", "tpot_s"):
        for stat, v in ff.summary[key].items():
            if isinstance(v, float):
                assert v == pytest.approx(step.summary[key][stat], rel=1e-9, abs=1e-12), (key, stat)
    assert ff.summary["makespan_s"] == pytest.approx(step.summary["makespan_s"], rel=1e-9)


def test_fallback_move_frees_the_reservation_for_the_queue_at_the_next_iteration():
    """Request 0 outgrows its reservation and moves to the fallback region; with
    prefill iterations apart, stepping admits request 1 at the next iteration (not when request 0
    finishes)."""
    ff, step = _both(
        [
            "workload.num_requests=2",
            "workload.max_model_len=2048",
            "gpu.kv_cache_tokens=4096",
            "allocator.kind=static",
            # The p90 of these two requests' lengths: request 0 (1105 + 422 tokens) outgrows it.
            "allocator.reserve=1517",
            "allocator.overflow=fallback",
            "allocator.fallback_fraction=0.5",
            "scheduler.mixed_batches=false",
        ]
    )
    assert step.summary["iterations"] == 809
    assert step.summary["fallback_moves"] >= 1
    _same(ff, step)


@pytest.mark.parametrize("engine", ["reference", "sglang"])
def test_dynamic_relocation_frees_memory_for_the_queue_at_the_next_iteration(engine):
    """A dynamic extent relocated by a decode's growth frees its old extent."""
    ff, step = _both(
        [
            "workload.num_requests=12",
            "workload.max_model_len=4096",
            "gpu.kv_cache_tokens=6000",
            "workload.lengths={kind: uniform, output_max: 1000}",
            "allocator.kind=dynamic",
            "allocator.chunk_tokens=64",
            "allocator.placement=best_fit",
            "scheduler.mixed_batches=false",
            f"engine.kind={engine}",
        ]
    )
    assert step.summary["copy_bytes"] > 0
    _same(ff, step)


def test_hybrid_tail_move_with_prefill_apart():
    """A sequence moving between hybrid_tail's regions frees its old place (stepping: 3765
    iterations; fast-forward admitted later and ran 4088)."""
    ff, step = _both(
        [
            "workload.num_requests=30",
            "workload.max_model_len=2048",
            "gpu.kv_cache_tokens=6000",
            "workload.lengths={kind: uniform, output_max: 1000}",
            "allocator.kind=hybrid_tail",
            "allocator.static_fraction=0.5",
            "allocator.long_threshold=1301",  # the p90 of these 30 requests' lengths
            "scheduler.mixed_batches=false",
        ]
    )
    assert step.summary["iterations"] == 3765
    _same(ff, step)


def test_cost_model_out_of_range_counts_the_iterations_that_ran():
    """Out-of-range counts are those of the iterations that ran, not of a window priced further."""
    ff, step = _both(
        [
            "workload.num_requests=8",
            "model.name=tiny-llama",
            "workload.max_model_len=2048",
            "workload.lengths={kind: fixed, prompt_tokens: 100, output_tokens: 1500}",
        ]
    )
    assert step.summary["cost_model_out_of_range"].get("generation_attention", 0) > 0
    _same(ff, step)


@pytest.mark.parametrize("kind", ["paged", "dynamic"])
def test_cost_model_out_of_range_per_sequence_windows(kind):
    """The same through the per-sequence decode window (no cohort: lowest-priority victims)."""
    ff, step = _both(
        [
            "workload.num_requests=8",
            "model.name=tiny-llama",
            "workload.max_model_len=2048",
            "workload.lengths={kind: fixed, prompt_tokens: 100, output_tokens: 1500}",
            f"allocator.kind={kind}",
            "allocator.preemption.victim=lowest_priority",
        ]
    )
    assert step.summary["cost_model_out_of_range"].get("generation_attention", 0) > 0
    _same(ff, step)


@pytest.mark.parametrize("mixed", ["true", "false"])
def test_prefix_cache_evictions_make_stepping_retry_the_head(mixed):
    """Decode growth evicts cached blocks of the waiting head's prefix, its chunk grows
    and stepping asks to admit it again (refused: nothing was freed); the window ends there."""
    ff, step = _both(
        [
            "workload.num_requests=20",
            "workload.prefix.fraction=0.3",
            "allocator.prefix_caching.enabled=true",
            "gpu.kv_cache_tokens=4096",
            "workload.max_model_len=2048",
            f"scheduler.mixed_batches={mixed}",
        ]
    )
    assert step.summary["allocator_refusals"].get("insufficient_free", 0) > 0
    _same(ff, step)


@settings(max_examples=int(os.environ.get("FF_EQ_EXAMPLES", "60")))
@given(
    kind=st.sampled_from(["paged", "static", "static_fallback", "dynamic", "hybrid_tail", "hybrid_reserve", "prefix"]),
    mixed=st.booleans(),
    kv=st.integers(1100, 5000),
    seed=st.integers(0, 10_000),
    rate=st.floats(5.0, 80.0),
    chunked=st.booleans(),
    placement=st.sampled_from(["first_fit", "best_fit"]),
    growth=st.sampled_from(["token", "chunk"]),
    victim=st.sampled_from(["lifo", "lowest_priority"]),
    eviction=st.sampled_from(["lru", "lfu"]),
)
def test_modes_agree_with_prefill_apart_or_mixed(
    kind, mixed, kv, seed, rate, chunked, placement, growth, victim, eviction
):
    """Fast-forward equals stepping over allocator kinds × mixed batches on or off × small KV."""
    kv = max(kv, {"hybrid_tail": 2200, "hybrid_reserve": 1400}.get(kind, 0))  # room for one max-length request
    over = {
        "seed": seed,
        "allocator.kind": {"static_fallback": "static", "prefix": "paged"}.get(kind, kind),
        "allocator.reserve": "p80",
        "allocator.overflow": "fallback" if kind == "static_fallback" else "truncate",
        "allocator.fallback_fraction": 0.4,
        "allocator.growth": growth,
        "allocator.chunk_tokens": 64,
        "allocator.placement": placement,
        "allocator.static_fraction": 0.5,
        "allocator.long_threshold": "p80",
        "scheduler.mixed_batches": mixed,
        "scheduler.chunked_prefill": chunked,
        "workload.arrival.rate": rate,
        "workload.num_requests": 40,
        "workload.priority.high_fraction": 0.5,
        "allocator.preemption.victim": victim,
    }
    if kind == "prefix":
        over["allocator.prefix_caching.enabled"] = True
        over["allocator.prefix_caching.eviction"] = eviction
        over["workload.prefix"] = {"fraction": 0.5, "prefix_tokens": 256, "groups": 2}
    ff = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "fast_forward"}))
    step = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "step"}))
    _same(ff, step)


@settings(max_examples=int(os.environ.get("FF_EQ_EXAMPLES", "40")))
@given(
    kind=st.sampled_from(["paged", "static", "static_fallback", "dynamic", "hybrid_tail", "hybrid_reserve", "prefix"]),
    kv=st.integers(1100, 5000),
    seed=st.integers(0, 10_000),
    rate=st.floats(5.0, 80.0),
    closed=st.booleans(),
    swap=st.booleans(),
    ahead=st.booleans(),
    compaction=st.booleans(),
    reserve_output=st.booleans(),
    stale=st.sampled_from([None, 0.5, 2.0]),
    budget=st.sampled_from([64, 256, 512]),
)
def test_modes_agree_with_prefill_apart_and_more(
    kind, kv, seed, rate, closed, swap, ahead, compaction, reserve_output, stale, budget
):
    """Prefill iterations apart, with swaps, closed-loop clients, batches formed ahead, background
    compaction, whole-output admission and stale requests."""
    kv = max(kv, {"hybrid_tail": 2200, "hybrid_reserve": 1400}.get(kind, 0))
    over = {
        "seed": seed,
        "allocator.kind": {"static_fallback": "static", "prefix": "paged"}.get(kind, kind),
        "allocator.reserve": "p80",
        "allocator.overflow": "fallback" if kind == "static_fallback" else "truncate",
        "allocator.fallback_fraction": 0.4,
        "allocator.growth": "chunk",
        "allocator.chunk_tokens": 64,
        "allocator.static_fraction": 0.5,
        "allocator.long_threshold": "p80",
        "allocator.preemption.mode": "swap" if swap else "recompute",
        "allocator.preemption.swap_capacity_bytes": 3000 * 2048,
        "scheduler.mixed_batches": False,
        "scheduler.reserve_output": reserve_output,
        "scheduler.max_num_batched_tokens": budget,
        "workload.arrival.rate": rate,
        "workload.num_requests": 40,
    }
    if kind == "prefix":
        over["allocator.prefix_caching.enabled"] = True
        over["workload.prefix"] = {"fraction": 0.5, "prefix_tokens": 256, "groups": 2}
    if closed:
        over["workload.arrival"] = {"kind": "closed_loop", "concurrency": 6, "think_time_s": rate / 100}
    if ahead:
        over["engine.kind"] = "vllm"
        over["engine.schedule_ahead"] = True
    if compaction and kind in ("static", "dynamic"):
        over["allocator.compaction"] = {"enabled": True, "mode": "background"}
    if stale is not None:
        over["allocator.stale_after_s"] = stale
    ff = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "fast_forward"}))
    step = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "step"}))
    _same(ff, step)
