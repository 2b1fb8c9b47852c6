"""Regressions for defects a fuzz of the configuration space found: crashes, fast-forward ≠ step, broken invariants."""

import numpy as np
import pytest

from sim.allocators import Grow
from sim.allocators.prefix_cache import PrefixCachingPagedAllocator
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.cluster import simulate


def _chat_api(**over):
    data, base = read_scenario_dict("chat-api")
    return scenario_from_dict(apply_overrides(data, over), base)


def _both_modes(**over):
    return {m: simulate(_chat_api(**over, **{"engine.mode": m})) for m in ("fast_forward", "step")}


def _same_runs(a, b):
    """Equal counts, times to float summation order (the modes' documented contract)."""
    ra, rb = a.requests.to_pydict(), b.requests.to_pydict()
    oa, ob = np.argsort(ra["id"]), np.argsort(rb["id"])
    for col in ra:
        x, y = np.asarray(ra[col])[oa], np.asarray(rb[col])[ob]
        if col.endswith("_s"):
            assert np.allclose(x.astype(float), y.astype(float), rtol=1e-9, atol=1e-12), col
        else:
            assert (x == y).all(), col
    for key in ("completed", "rejected", "preemptions", "iterations", "rejected_by_reason", "truncated"):
        assert a.summary.get(key) == b.summary.get(key), key
    for key in ("makespan_s", "e2e_s", "ttft_s", "client_wait_s"):
        va, vb = a.summary.get(key), b.summary.get(key)
        if isinstance(va, dict):
            for q in va:
                assert va[q] == pytest.approx(vb[q], rel=1e-9, abs=1e-12), (key, q)
        else:
            assert va == pytest.approx(vb, rel=1e-9, abs=1e-12), key


def test_resumed_request_cached_hit_matches_what_admission_takes():
    """A recomputed request whose prompt is a whole number of blocks, all cached: the lookup and the
    admission agree that it may reuse every prompt block (its last generated token is computed)."""
    a = PrefixCachingPagedAllocator(64 * 16, 2, block_size=16)
    h = tuple(range(4))  # a 64-token prompt in 16-token hash blocks
    assert a.admit_prefix(0, 64, h, 16, 0.0)[0] is Grow.OK
    a.grow(0, 64)
    a.release(0)
    prompt, generated = 64, 5
    cached = a.cached_prefix_tokens(h, 16, prompt, tokens=prompt + generated)
    assert cached == 64
    assert a.admit_prefix(1, prompt + generated, h, 16, 1.0, prompt_tokens=prompt) == (Grow.OK, cached)
    # A fresh request must still compute its prompt's last token.
    assert a.cached_prefix_tokens(h, 16, prompt) == 48


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_prefix_caching_with_preemption_of_block_aligned_prompts(mode):
    over = {
        "workload.num_requests": 20,
        "workload.lengths": {"kind": "uniform", "prompt_max": 200, "output_max": 500},
        "workload.prefix.fraction": 1.0,
        "workload.prefix.prefix_tokens": 1000,
        "allocator.prefix_caching.enabled": True,
        "gpu.kv_cache_tokens": 2048,
        "workload.max_model_len": 2048,
        "engine.mode": mode,
    }
    res = simulate(_chat_api(**over))
    assert res.summary["completed"] == 20
    assert res.summary["preemptions"] > 0


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
@pytest.mark.parametrize("model", [{"name": "mistral-7b"}, {"hf_config": "openai/gpt-oss-20b"}])
def test_static_compaction_with_sliding_window_layers(model, mode):
    """Sliding-window layer groups give the static allocator no decode cohort: compaction still runs."""
    data, base = read_scenario_dict("chat-api")
    data = {**data, "model": model}
    over = {
        "workload.num_requests": 3,
        "allocator.kind": "static",
        "allocator.placement": "buddy",
        "allocator.compaction.enabled": True,
        "allocator.compaction.above_fragmentation": 0,
        "engine.mode": mode,
    }
    res = simulate(scenario_from_dict(apply_overrides(data, over), base))
    assert res.summary["completed"] == 3


@pytest.mark.parametrize(
    "engine",
    [
        {"engine.kind": "reference"},
        {"engine.kind": "vllm", "engine.frontend_s": 0.0, "engine.frontend_per_token_s": 0.0},
    ],
)
def test_client_cap_release_inside_settle_fast_forward_equals_stepping(engine):
    """A request rejected at admission frees a client slot after the iteration was formed: the held
    request it sends joins the next schedule in both modes (a window stops there, as for an arrival)."""
    runs = _both_modes(
        **{
            "workload.num_requests": 20,
            "workload.arrival": {"kind": "poisson", "rate": 200, "max_concurrency": 8},
            "allocator.kind": "static",
            "allocator.reserve": "p50",
            **engine,
        }
    )
    _same_runs(runs["fast_forward"], runs["step"])


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_truncated_request_finishes_after_its_first_token(engine, mode):
    over = {
        "workload.num_requests": 1,
        "workload.lengths": {"kind": "fixed", "prompt_tokens": 16, "output_tokens": 10},
        "allocator.kind": "static",
        "allocator.reserve": 16,
        "allocator.overflow": "truncate",
        "engine.kind": engine,
        "engine.mode": mode,
    }
    t = simulate(_chat_api(**over)).requests.to_pydict()
    assert t["truncated"] == [True]
    assert t["generated_tokens"] == [1]
    assert t["finish_s"][0] >= t["first_token_s"][0]
