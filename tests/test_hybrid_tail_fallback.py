"""hybrid_tail: a request predicted short that the paged pool could not hold even empty goes to a
static slot, as a long one would, instead of being rejected ``cannot_fit_empty_replica``."""

import pytest

from sim.allocators import HybridTailAllocator
from sim.allocators.base import Grow
from sim.config import apply_overrides, scenario_from_dict
from sim.engine.cluster import simulate
from test_engine import _check_accounting, _compare

#: 0.9 static leaves the pool 592 tokens of 6000 (tiny-llama on ``cpu``); the long threshold is
#: the p90 of total length, above the pool. A 512 + 128 request is predicted short (from its
#: prompt), fills the pool alone, preempts itself at 593 tokens and comes back still predicted
#: short (593 is below the threshold) but too long for the pool: it must go to a static slot.
BASE = {
    "name": "hybrid-tail-fallback",
    "model": {"name": "tiny-llama"},
    "gpu": {"name": "cpu", "kv_cache_tokens": 6000},
    "workload": {"num_requests": 1},
    "allocator": {"kind": "hybrid_tail", "static_fraction": 0.9},
}


def _run(mode: str, **over):
    return simulate(scenario_from_dict(apply_overrides(BASE, {"engine.mode": mode, **over})))


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_preempted_short_request_too_long_for_the_pool_completes_in_a_static_slot(mode):
    res = _run(mode)
    _check_accounting(res, 1)
    s = res.summary
    assert s["completed"] == 1 and s["rejected"] == 0, s["rejected_by_reason"]
    assert s["preemptions"] == 1  # it did fill the pool and preempt itself
    req = res.requests.to_pydict()
    assert (req["status"][0], req["reason"][0]) == ("completed", "")
    assert req["generated_tokens"][0] == req["output_tokens"][0] == 128
    # Placed into the slot at re-admission: no move (copy) between the regions.
    assert s["length_predictor"]["migrations"] == 0


@pytest.mark.parametrize("predictor", ["prompt", "quantile", "oracle"])
@pytest.mark.parametrize("swap", [False, True])
def test_fallback_into_static_is_the_same_in_both_engine_modes(predictor, swap):
    """Many requests of that kind: they queue for the static slots and all complete, both engine
    modes alike, whatever the predictor and preemption mode."""
    over = {
        "workload.num_requests": 12,
        "workload.arrival": {"kind": "poisson", "rate": 20.0},
        "allocator.length_predictor": predictor,
        "allocator.preemption.mode": "swap" if swap else "recompute",
        "allocator.preemption.swap_capacity_bytes": 3000 * 2048,
    }
    ff, step = _run("fast_forward", **over), _run("step", **over)
    for res in (ff, step):
        _check_accounting(res, 12)
        s = res.summary
        assert "cannot_fit_empty_replica" not in s["rejected_by_reason"]
        assert s["completed"] + s["rejected"] == 12
    _compare(ff, step)


def test_allocator_places_a_short_hint_too_long_for_the_pool_in_a_static_slot():
    # A pool of 96 tokens beside two 300-token slots; long means above 200 tokens.
    a = HybridTailAllocator(696, 100, static_tokens=600, reserve_tokens=300, long_threshold_tokens=200, block_size=16)
    assert a.pool.capacity_tokens == 96
    a.hint(1, 90)  # short, and the pool holds it
    assert a.admit(1, 90) is Grow.OK and a._where[1] is a.pool
    a.hint(2, 150)  # short, but longer than the whole pool: a slot
    assert a.admit(2, 64) is Grow.OK and a._where[2] is a.static
    assert a.admit(3, 120) is Grow.OK and a._where[3] is a.static  # no hint, too long for the pool
    a.hint(4, 150)
    assert a.admit(4, 150) is Grow.NO_SPACE  # both slots taken: it waits for one
    a.check_invariants()
    a.release(2)
    a.hint(4, 150)
    assert a.admit(4, 150) is Grow.OK and a._where[4] is a.static
    a.check_invariants()
    for s in (1, 3, 4):
        a.release(s)
    a.check_invariants()
    assert a.used_total == 0 and a.reserved_tokens() == 0
