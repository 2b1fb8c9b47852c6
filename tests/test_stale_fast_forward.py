"""hybrid_reserve's ``stale_after_s`` under fast-forward: a decode window ends at the iteration
after which the earliest waiting request is stale (one queued when it began, or one that arrives
while it runs), so it is dropped at the boundary where stepping drops it: both engine modes give
the same results, thresholds shorter than a window included."""

import pytest
from hypothesis import given, settings, strategies as st

from helpers import TINY_MIXED, tiny_scenario
from sim.engine.cluster import simulate
from test_engine import _check_accounting, _compare


def _both(kv: int, **over):
    ff = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "fast_forward"}))
    step = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "step"}))
    return ff, step


# A tight pool and a fast stream: requests queue while decode windows of tens of iterations run
# (an iteration is a few milliseconds), so thresholds of a few milliseconds to a tenth of a second
# fall inside windows. ``lowest_priority`` runs sequences one by one (the per-sequence loop's
# windows), ``lifo`` as a cohort (the cohort loop's).
@pytest.mark.parametrize("victim", ["lifo", "lowest_priority"])
@pytest.mark.parametrize("stale", [0.002, 0.01, 0.05, 0.2])
@pytest.mark.parametrize(("kv", "rate", "seed"), [(1400, 80.0, 1), (1400, 20.0, 2), (2500, 80.0, 1)])
def test_stale_requests_are_dropped_at_the_same_iteration_in_both_modes(victim, stale, kv, rate, seed):
    over = {
        "allocator.kind": "hybrid_reserve",
        "allocator.stale_after_s": stale,
        "allocator.preemption.victim": victim,
        "workload.priority.high_fraction": 0.5,
        "workload.arrival.rate": rate,
        "workload.num_requests": 40,
        "seed": seed,
    }
    ff, step = _both(kv, **over)
    for res in (ff, step):
        _check_accounting(res, 40)
        s = res.summary
        assert s["completed"] + s["rejected"] == 40
        assert s["rejected_by_reason"].get("stale", 0) > 0  # the threshold is exercised
    _compare(ff, step)
    assert ff.summary["windows"] > 0  # fast-forward did advance windows


# Every sequence slot taken (``max_num_seqs`` 4) and memory to spare: arrivals cannot join the
# batch, so windows run on while they queue; one that arrives during a window turns stale inside
# it. (The admission breaker is off: its paused time is not what this checks.)
@pytest.mark.parametrize("victim", ["lifo", "lowest_priority"])
@pytest.mark.parametrize("stale", [0.01, 0.03, 0.1])
@pytest.mark.parametrize("rate", [40.0, 80.0])
def test_a_request_arriving_during_a_window_is_dropped_where_stepping_drops_it(victim, stale, rate):
    over = {
        "allocator.kind": "hybrid_reserve",
        "allocator.stale_after_s": stale,
        "allocator.admit_when_free_above": 0.0,
        "allocator.preemption.victim": victim,
        "scheduler.max_num_seqs": 4,
        "workload.priority.high_fraction": 0.5,
        "workload.arrival.rate": rate,
        "workload.num_requests": 40,
    }
    ff, step = _both(6000, **over)
    assert ff.summary["preemptions"] == 0  # no memory pressure: only the queue
    assert ff.summary["rejected_by_reason"].get("stale", 0) > 0
    _compare(ff, step)


@settings(max_examples=60)
@given(
    stale=st.sampled_from([0.001, 0.003, 0.01, 0.03, 0.1, 0.5]),
    kv=st.integers(1400, 6000),
    rate=st.floats(2.0, 80.0),
    seed=st.integers(0, 10_000),
    chunked=st.booleans(),
    block=st.sampled_from([1, 8, 16, 32]),
    replicas=st.integers(1, 2),
    closed=st.booleans(),
    budget=st.sampled_from([8, 256, 512]),
    swap=st.booleans(),
    victim=st.sampled_from(["lifo", "lowest_priority"]),
    mixed=st.booleans(),
    apart=st.booleans(),
    ahead=st.booleans(),
    lag=st.sampled_from([0, 0, 1, 2]),
    seqs=st.sampled_from([4, 16]),
    breaker=st.sampled_from([0.1, 0.3]),
)
def test_fast_forward_equals_stepping_with_stale_after_s(
    stale,
    kv,
    rate,
    seed,
    chunked,
    block,
    replicas,
    closed,
    budget,
    swap,
    victim,
    mixed,
    apart,
    ahead,
    lag,
    seqs,
    breaker,
):
    over = {
        "allocator.kind": "hybrid_reserve",
        "allocator.stale_after_s": stale,
        "allocator.block_size": block,
        "allocator.preemption.mode": "swap" if swap else "recompute",
        "allocator.preemption.swap_capacity_bytes": 3000 * 2048,
        "allocator.preemption.victim": victim,
        "workload.priority.high_fraction": 0.5,
        "workload.arrival.rate": rate,
        "workload.num_requests": 40,
        "seed": seed,
        "scheduler.chunked_prefill": chunked,
        "scheduler.max_num_batched_tokens": 512 if not chunked else budget,
        "scheduler.mixed_batches": not apart,
        "gpu.replicas": replicas,
        "scheduler.max_num_seqs": seqs,
        # With every slot taken (4) an arrival cannot join, so a window runs on while it queues: the
        # breaker's paused time still counts from the iteration after it, as stepping counts it.
        "allocator.admit_when_free_above": breaker,
    }
    if closed:
        over["workload.arrival"] = {"kind": "closed_loop", "concurrency": 6, "think_time_s": rate / 100}
    if ahead or lag:
        # vLLM's preset adds a front end of milliseconds: thresholds long enough to admit some.
        over["engine.kind"] = "vllm"
        over["allocator.stale_after_s"] = stale * 30
        if ahead:
            over["engine.schedule_ahead"] = True
        if lag:
            over["engine.first_token_lag"] = lag
    if mixed:
        over["model"] = {"hf_config": str(TINY_MIXED)}
    ff, step = _both(kv, **over)
    _check_accounting(ff, 40)
    if ff.summary["completed"] == 0:
        # Everything went stale before its first token: no utilization to compare.
        assert ff.requests.to_pydict() == step.requests.to_pydict()
        return
    _compare(ff, step)
