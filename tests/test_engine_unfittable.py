"""Nothing scheduled while nothing runs used to end the run (``RuntimeError: ... cannot be admitted
into an empty replica``). Now the replica tries again when that iteration's plan freed memory
(requests overflowed their reservation, were turned away or preempted after the queue's head was
refused), and rejects the head (``cannot_fit_empty_replica``) only when it cannot be admitted into
the empty replica: identically when stepping and fast-forwarding."""

import pytest

from sim.config import apply_overrides, scenario_from_dict
from sim.engine.cluster import simulate
from sim.errors import ConfigError
from test_engine import _check_accounting, _compare

TINY = {"model": {"name": "tiny-llama"}}

#: Valid scenarios found by a config hunt that crashed so, and the id of the request left waiting.
CASES = {
    # hybrid_tail: a 512 + 128 request predicted short runs in the paged pool, which 0.9 static
    # leaves at 592 tokens; it fills the pool, preempts itself at 593 tokens and, predicted short
    # again, can never be re-admitted into the pool: it goes to a static slot and completes
    # (it was rejected before: tests/test_hybrid_tail_fallback.py).
    "hybrid_tail_pool": {
        "gpu": {"name": "cpu", "kv_cache_tokens": 6000},
        "workload": {"num_requests": 1},
        "allocator": {"kind": "hybrid_tail", "static_fraction": 0.9},
    },
    # static p50 reservation on a 2049-token cache, prefill apart from decode: the head is refused
    # while the arena is full, then every running request overflows in the decode half: it fits now.
    "static_p50": {
        "gpu": {"name": "cpu", "kv_cache_tokens": 2049},
        "workload": {
            "num_requests": 9,
            "arrival": {"kind": "poisson", "rate": 500.0},
            "lengths": {"kind": "lognormal", "prompt_sigma": 0},
        },
        "scheduler": {"mixed_batches": False},
        "allocator": {"kind": "static", "reserve": 681},  # the median of these nine requests' lengths
    },
    # static p90 reservation, one sequence per replica, two replicas: as above.
    "static_p90_two_replicas": {
        "seed": 796247,
        "gpu": {"name": "cpu", "replicas": 2},
        "workload": {
            "num_requests": 6,
            "arrival": {"kind": "gamma", "rate": 5.0, "cv": 3.0},
            "lengths": {"kind": "lognormal", "prompt_sigma": 0.5},
        },
        "scheduler": {"max_num_seqs": 1, "mixed_batches": False},
        "allocator": {"kind": "static", "reserve": 905},  # the p90 of these six requests' lengths
    },
    # dynamic allocator on a cache barely above max_model_len: the only running request preempts
    # itself (it cannot grow in place); re-admitted from an empty cache it fits.
    "dynamic_small_cache": {
        "gpu": {"name": "cpu", "kv_cache_tokens": 1041},
        "workload": {"num_requests": 9, "max_model_len": 1024, "lengths": {"kind": "lognormal"}},
        "scheduler": {"max_num_batched_tokens": 64},
        "allocator": {"kind": "dynamic"},
    },
}


def _scenario(case: str, **over):
    return scenario_from_dict(apply_overrides({"name": case, **TINY, **CASES[case]}, over))


#: case -> (id of the request once left waiting, its status, its reason)
EXPECTED = {
    "hybrid_tail_pool": (0, "completed", ""),
    "static_p50": (3, "completed", ""),
    "static_p90_two_replicas": (3, "completed", ""),
    "dynamic_small_cache": (6, "completed", ""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_request_left_waiting_in_an_empty_replica_is_retried_or_rejected_with_reason(case):
    ff = simulate(_scenario(case, **{"engine.mode": "fast_forward"}))
    step = simulate(_scenario(case, **{"engine.mode": "step"}))
    n = CASES[case]["workload"]["num_requests"]
    rid, status, reason = EXPECTED[case]
    for res in (ff, step):
        _check_accounting(res, n)
        s = res.summary
        assert s["completed"] + s["rejected"] == n
        assert sum(s["rejected_by_reason"].values()) == s["rejected"]
        req = res.requests.to_pydict()
        j = req["id"].index(rid)
        assert (req["status"][j], req["reason"][j]) == (status, reason)
        if not reason:
            assert "cannot_fit_empty_replica" not in s["rejected_by_reason"]
    _compare(ff, step)


def test_hybrid_tail_pool_smaller_than_a_block_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        simulate(
            scenario_from_dict(
                {
                    "name": "small-pool",
                    **TINY,
                    "gpu": {"name": "cpu", "kv_cache_tokens": 512},
                    "workload": {"num_requests": 1, "max_model_len": 256},
                    "allocator": {"kind": "hybrid_tail", "block_size": 256, "static_fraction": 0.9},
                }
            )
        )
    msg = str(e.value)
    assert "\n" not in msg
    assert e.value.key == "allocator.static_fraction"
    assert "0.9" in msg and "block" in msg
