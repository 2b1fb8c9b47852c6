"""hybrid_reserve's admission breaker under fast-forward: with every sequence slot taken, a request
that arrives into an empty queue during a decode window cannot join the batch, so the window runs
on; stepping counts the breaker's paused time from the iteration after the arrival (the first one
scheduled with the request queued), and the window counts it from there too."""

import pytest

from helpers import tiny_scenario
from sim.engine.cluster import simulate
from test_engine import _compare, _same_summary

# The mode's own bookkeeping (events, windows, cost-model calls) differs by design.
_MODE_KEYS = {"engine_mode", "sim_events", "windows", "cost_model_out_of_range"}


# ``lifo`` runs the decoding sequences as a cohort (the cohort loop's windows), ``lowest_priority``
# one by one (the per-sequence loop's); ``ahead`` forms each batch one iteration ahead, so the
# arrival is first seen queued one iteration later.
@pytest.mark.parametrize("victim", ["lifo", "lowest_priority"])
@pytest.mark.parametrize("ahead", [False, True])
def test_paused_time_counts_an_arrival_that_cannot_join_the_window(victim, ahead):
    over = {
        "allocator.kind": "hybrid_reserve",
        "allocator.admit_when_free_above": 0.3,
        "allocator.preemption.victim": victim,
        "scheduler.max_num_seqs": 4,
        "workload.priority.high_fraction": 0.5,
        "workload.arrival.rate": 40.0,
        "workload.num_requests": 40,
        "seed": 16,
    }
    if ahead:
        over["engine.kind"] = "vllm"
        over["engine.schedule_ahead"] = True
    ff = simulate(tiny_scenario(kv_tokens=2000, **over, **{"engine.mode": "fast_forward"}))
    step = simulate(tiny_scenario(kv_tokens=2000, **over, **{"engine.mode": "step"}))
    assert step.summary["admissions_paused_s"] > 0  # the breaker is exercised
    assert ff.summary["windows"] > 0  # fast-forward did advance windows
    _same_summary(
        {k: v for k, v in ff.summary.items() if k not in _MODE_KEYS},
        {k: v for k, v in step.summary.items() if k not in _MODE_KEYS},
    )
    _compare(ff, step)
