"""KV per layer group: models that mix full-attention and sliding-window layers.

A full-attention layer holds every token of a sequence, a sliding-window layer only the last
``window`` tokens. The numbers here are hand computations on the gpt-oss layout test config
(24 layers alternating sliding/full, window 128, 8 KV heads of 64, bf16): one layer holds
2 · 8 · 64 · 2 = 2048 bytes per token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from allocator_checks import check_after_op, release_all, step_decode
from sim.allocators import Grow, StaticAllocator
from sim.allocators.sliding_window import SlidingWindowPagedAllocator
from sim.catalog import FULL, GPUS, MODELS, SLIDING, KVGroups, ModelSpec, kv_groups_of
from sim.config import load_scenario
from sim.cost.model import BatchShape, RooflineCostModel
from sim.cost.profile_model import build_profile_cost_model
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment, derived_kv_cache_tokens, with_engine_defaults
from sim.errors import ConfigError
from sim.hf_config import read_hf_config
from test_allocators import _owned_slots_static, _run, ops

DATA = Path(__file__).parent / "data" / "hf"
GPT_OSS = DATA / "dense-gpt-oss-layout_config.json"
PER_LAYER = 2 * 8 * 64 * 2  # bytes of one token's K and V on one layer
W = 128


def _gpt_oss() -> ModelSpec:
    return read_hf_config(GPT_OSS).spec


def _scenario(**over):
    return load_scenario("chat-api", {"model": {"hf_config": str(GPT_OSS)}, **over})


def _hand_bytes(tokens: int) -> int:
    """Full layers × length + window layers × min(length, window), in bytes."""
    return PER_LAYER * (12 * tokens + 12 * min(tokens, W))


def _window_blocks(tokens: int, block: int, window: int = W) -> int:
    """Blocks covering tokens [tokens − window, tokens) of one sliding layer group."""
    return (tokens - 1) // block - max(0, tokens - window) // block + 1


# --- grouping and bytes ---------------------------------------------------------------------


def test_groups_follow_vllms_rule():
    assert _gpt_oss().kv_groups == KVGroups(12, 1, 1, W, 0)
    # Gemma-3 27B: 62 layers, every 6th global: 10 full and 52 sliding -> groups of 10, the last
    # sliding group padded with 8 layers.
    gemma = ModelSpec(
        "g",
        62,
        5376,
        32,
        16,
        128,
        21504,
        27e9,
        sliding_window=1024,
        layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(62)),
    )
    assert gemma.kv_groups == KVGroups(10, 1, 6, 1024, 8)
    # 13 full and 12 sliding: under 1.5x apart, so groups of 13 (one padding layer), not of 12.
    assert kv_groups_of(13, 12, 64) == KVGroups(13, 1, 1, 64, 1)
    assert MODELS["mistral-7b"].kv_groups == KVGroups(32, 0, 1, 4096)
    assert MODELS["llama-3.1-8b"].kv_groups == KVGroups(32, 1, 0, None)


@pytest.mark.parametrize("tokens", [1, 100, 128, 129, 1000, 32_001, 131_072])
def test_mixed_kv_bytes_equal_the_hand_computation(tokens):
    m = _gpt_oss()
    assert m.kv_bytes_per_token("bf16") == 24 * PER_LAYER  # a token inside the window, every layer
    assert m.kv_group_bytes_per_token("bf16") == 12 * PER_LAYER  # one token in one group of 12 layers
    assert m.kv_bytes_held(tokens, "bf16") == _hand_bytes(tokens)
    assert m.kv_bytes_held(tokens, "fp8") == _hand_bytes(tokens) // 2


def test_mixed_kv_capacity_equals_the_hand_computation():
    dep = Deployment.from_scenario(_scenario())
    cap = dep.kv_capacity_bytes
    # Slots are tokens of one 12-layer group; blocks of 16 such slots.
    assert dep.kv_slot_bytes == 12 * PER_LAYER
    assert dep.kv_capacity_tokens == cap // (12 * PER_LAYER)
    alloc = dep.make_allocator(_scenario())
    assert isinstance(alloc, SlidingWindowPagedAllocator)
    assert alloc.num_blocks == cap // (12 * PER_LAYER) // 16
    # A sequence of L tokens takes ceil(L / 16) blocks of the full group and the window's blocks of
    # the sliding group: the pool holds floor(blocks / that) of them, about twice as many as when
    # every layer held the whole length.
    for length in (1000, 8192, 32_001):
        per_seq = -(-length // 16) + _window_blocks(length, 16)
        assert alloc._need(length) == per_seq
        assert per_seq * 16 * 12 * PER_LAYER >= _hand_bytes(length)  # block rounding only adds
        assert per_seq * 16 * 12 * PER_LAYER - _hand_bytes(length) < 3 * 16 * 12 * PER_LAYER


def _gemma_like(tmp_path) -> Path:
    """Gemma-3-style config: 62 layers, every 6th global, window 1024 (7 groups of 10 layers, 8 padding)."""
    cfg = json.loads(GPT_OSS.read_text())
    del cfg["layer_types"]
    cfg.update(num_hidden_layers=62, sliding_window=1024, sliding_window_pattern=6)
    path = tmp_path / "gemma-like_config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_reported_kv_tokens_count_every_group_padding_included(tmp_path):
    # Gemma-3-style: 62 layers, every 6th global -> 7 groups of 10 layers (8 padding). A server's
    # "KV cache size: N tokens" counts a token in every group, so it stands for N · 70 layers' bytes.
    path = _gemma_like(tmp_path)
    dep = Deployment.from_scenario(
        load_scenario("chat-api", {"model": {"hf_config": str(path)}, "gpu.kv_cache_tokens": 100_000})
    )
    assert dep.kv_groups == KVGroups(10, 1, 6, 1024, 8)
    assert dep.kv_capacity_bytes == 100_000 * 70 * PER_LAYER
    assert dep.kv_capacity_tokens == 100_000 * 7 and dep.kv_slot_bytes == 10 * PER_LAYER
    # Read back in the server's unit (what the planner lists and serving-bench evidence compares).
    assert dep.kv_cache_tokens == 100_000


def test_derived_kv_capacity_pins_back_to_the_same_bytes(tmp_path):
    # The derived capacity in gpu.kv_cache_tokens' unit, set as that field, gives the memory back
    # (to within one reported token) for a mixed model with padded groups and for a uniform one.
    path = _gemma_like(tmp_path)
    for over in ({"model": {"hf_config": str(path)}}, {}):
        sc = load_scenario("chat-api", over)
        derived = derived_kv_cache_tokens(sc)
        free = Deployment.from_scenario(with_engine_defaults(sc))
        pinned = Deployment.from_scenario(
            with_engine_defaults(load_scenario("chat-api", {**over, "gpu.kv_cache_tokens": derived}))
        )
        assert derived == free.kv_cache_tokens
        assert 0 <= free.kv_capacity_bytes - pinned.kv_capacity_bytes < pinned.reported_token_bytes
    assert pinned.kv_cache_tokens == pinned.kv_capacity_tokens  # one group: slots are tokens


# --- runs -----------------------------------------------------------------------------------


def _long_context(kind: str, **extra):
    # 32,001-token prompts (ceil(32001 / 16) = 2001 full-group blocks, 9 window blocks) and 8 output
    # tokens: no decode step takes a new block, so admissions are all that fills the pool. Everything
    # arrives at once and one iteration may prefill every prompt.
    return _scenario(
        **{
            "allocator.kind": kind,
            "gpu.kv_cache_tokens": 160_840,
            "workload.max_model_len": 32_768,
            "workload.num_requests": 24,
            "workload.arrival.rate": 1e6,
            "workload.lengths": {"kind": "fixed", "prompt_tokens": 32_001, "output_tokens": 8},
            "scheduler.max_num_seqs": 64,
            "scheduler.max_num_batched_tokens": 24 * 32_768,
            "scheduler.chunked_prefill": False,
            **extra,
        }
    )


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_paged_long_context_admits_what_the_arithmetic_predicts(mode):
    sc = _long_context("paged", **{"engine.mode": mode})
    res = simulate(sc)
    # kv_cache_tokens = 160,840 tokens on all 24 layers = 321,680 slots of one group = 20,105 blocks.
    blocks = 160_840 * 2 // 16
    per_seq = -(-32_001 // 16) + _window_blocks(32_001, 16)
    assert (blocks, per_seq) == (20_105, 2010)
    assert max(res.timeseries["running"].to_pylist()) == blocks // per_seq == 10
    assert res.summary["completed"] == 24 and res.summary["preemptions"] == 0
    assert res.summary["kv_layer_groups"]["held_per_group"] is True
    # The same shape with full attention on every layer: 10,052 blocks of 16 tokens, 2001 a sequence.
    m = _gpt_oss()
    dims = {k: getattr(m, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "params")}
    full = simulate(_long_context("paged", **{"engine.mode": mode, "model": {"name": "custom", **dims}}))
    assert max(full.timeseries["running"].to_pylist()) == 160_840 // 16 // 2001 == 5
    assert "kv_layer_groups" not in full.summary
    # A kind that holds every layer at full length says so.
    dyn = simulate(_long_context("dynamic", **{"engine.mode": mode}))
    assert dyn.summary["kv_layer_groups"]["held_per_group"] is False
    assert max(dyn.timeseries["running"].to_pylist()) <= 5


def test_static_reserves_the_window_on_window_layers():
    sc = _scenario(
        **{"allocator.kind": "static", "allocator.reserve": "max_model_len", "workload.max_model_len": 16_384}
    )
    dep = Deployment.from_scenario(sc)
    a = dep.make_allocator(sc)
    assert isinstance(a, StaticAllocator)
    assert a.admit(0, 10) is Grow.OK
    # 16,384 tokens on the 12 full layers, 128 on the 12 window layers: not 16,384 on all 24.
    assert a.reserved_tokens() * a.bpt == PER_LAYER * (12 * 16_384 + 12 * W) == _hand_bytes(16_384)
    assert a.reserved_tokens() * a.bpt < 24 * 16_384 * PER_LAYER
    assert a.used_total * a.bpt == _hand_bytes(10)
    assert a.grow(0, 16_384) is Grow.OK and a.used_total * a.bpt == _hand_bytes(16_384)
    assert a.grow(0, 16_385) is Grow.OVERFLOW
    # A run holds the same per sequence: the peak reservation is a whole number of them.
    res = simulate(
        _scenario(
            **{
                "allocator.kind": "static",
                "allocator.reserve": "max_model_len",
                "workload.max_model_len": 16_384,
                "workload.num_requests": 100,
            }
        )
    )
    peak = max(res.timeseries["kv_reserved_bytes"].to_pylist())
    assert peak % _hand_bytes(16_384) == 0 and peak > 0


def test_static_with_a_uniform_window_reserves_only_the_window():
    sc = load_scenario(
        "chat-api",
        {
            "model.name": "mistral-7b",
            "allocator.kind": "static",
            "allocator.reserve": "max_model_len",
            "workload.max_model_len": 16_384,
        },
    )
    a = Deployment.from_scenario(sc).make_allocator(sc)
    assert a.admit(0, 5000) is Grow.OK
    assert a.reserved_tokens() == 4096 and a.used_total == 4096
    assert a.grow(0, 16_384) is Grow.OK and a.grow(0, 16_385) is Grow.OVERFLOW


def test_a_max_model_len_that_does_not_fit_names_the_length_that_does():
    # 15,000 tokens on all layers = 30,000 slots of one group: the window group keeps 128 of them,
    # so a sequence of 30,000 − 128 tokens is the longest that fits.
    with pytest.raises(ConfigError, match="workload.max_model_len.*at most 29872 tokens fit"):
        Deployment.from_scenario(_scenario(**{"workload.max_model_len": 32_768, "gpu.kv_cache_tokens": 15_000}))
    assert Deployment.from_scenario(_scenario(**{"workload.max_model_len": 29_872, "gpu.kv_cache_tokens": 15_000}))


def test_prefix_caching_is_refused_for_mixed_models():
    sc = _scenario(**{"allocator.prefix_caching.enabled": True})
    with pytest.raises(ConfigError, match="allocator.prefix_caching.enabled.*sliding-window layers"):
        simulate(sc)


def test_static_fallback_region_is_refused_for_mixed_models():
    sc = _scenario(**{"allocator.kind": "static", "allocator.reserve": "p95", "allocator.overflow": "fallback"})
    with pytest.raises(ConfigError, match="allocator.overflow.*fallback.*reject or truncate for models with sliding"):
        simulate(sc)
    # the same scenario without the fallback region runs
    assert simulate(sc.model_copy(update={"allocator": sc.allocator.model_copy(update={"overflow": "truncate"})}))


# --- allocator invariants -------------------------------------------------------------------

groups = st.tuples(st.integers(0, 2), st.integers(1, 3))


@settings(max_examples=2000)
@given(ops, st.integers(1, 32), st.integers(200, 6000), st.integers(16, 600), groups)
def test_grouped_block_pool_invariants(seq_ops, block, capacity, window, fg_wg):
    fg, wg = fg_wg
    a = SlidingWindowPagedAllocator(
        max(capacity, 4 * block), 100, block, window=window, full_groups=fg, window_groups=wg
    )
    g = KVGroups(1, fg, wg, window)

    def layout(x):
        assert sum(x.blocks.values()) + x.free_blocks == x.num_blocks
        for s, b in x.blocks.items():
            t = x.length[s]
            assert b == fg * -(-t // block) + wg * _window_blocks(t, block, window)
            assert x.used[s] == g.slots_held(t) <= b * block

    _run(a, seq_ops, layout)


@settings(max_examples=2000)
@given(ops, st.integers(1, 400), st.integers(1200, 6000), st.integers(16, 600), groups)
def test_grouped_static_invariants(seq_ops, reserve, capacity, window, fg_wg):
    fg, wg = fg_wg
    g = KVGroups(1, fg, wg, window)
    a = StaticAllocator(max(capacity, g.slots_held(reserve)), 100, reserve, groups=g)
    assert a.reserve_slots == fg * reserve + wg * min(reserve, window)
    lengths: dict[int, int] = {}

    def layout(x):
        _owned_slots_static(x)
        assert all(u <= x.reserve_slots for u in x.used.values())

    live: set[int] = set()
    for op, seq, tokens in seq_ops:
        if op == "admit" and seq not in live:
            if a.admit(seq, tokens) is Grow.OK:
                live.add(seq)
                lengths[seq] = tokens
                assert a.used[seq] == g.slots_held(tokens)
        elif op == "grow" and seq in live:
            t = lengths[seq] + tokens % 40
            if a.grow(seq, t) is Grow.OK:
                lengths[seq] = t
                assert a.used[seq] == g.slots_held(t)
            else:
                assert t > reserve
        elif op == "release" and seq in live:
            a.release(seq)
            live.discard(seq)
        check_after_op(a, live, layout)
    release_all(a, live)


@settings(max_examples=400)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=10),
    st.integers(1, 32),
    st.integers(300, 6000),
    st.integers(1, 80),
    st.integers(16, 200),
    groups,
)
def test_grouped_decode_window_equals_stepping(lengths, block, capacity, max_steps, window, fg_wg):
    fg, wg = fg_wg

    def pool():
        return SlidingWindowPagedAllocator(capacity, 10, block, window=window, full_groups=fg, window_groups=wg)

    a, b = pool(), pool()
    seqs = []
    for i, n in enumerate(lengths):
        if a.admit(i, n) is Grow.OK:
            assert b.admit(i, n) is Grow.OK
            seqs.append(i)
    if not seqs:
        return
    a.take_work()
    b.take_work()
    tokens_now = np.array([a.length[s] for s in seqs], dtype=np.int64)
    plan = a.decode_plan(seqs, tokens_now, max_steps)
    steps, reserved, used, events = step_decode(b, seqs, tokens_now, max_steps)
    assert plan.steps <= max(1, steps)  # a window may end early (never late): the engine steps on
    assert list(plan.reserved_tokens) == reserved[: plan.steps]
    assert list(plan.used_tokens) == used[: plan.steps]
    assert plan.events is not None and list(plan.events[1:]) == events[1 : plan.steps]
    a.advance_decode(seqs, tokens_now + plan.steps - 1)
    c = pool()
    for s in seqs:
        c.admit(s, int(tokens_now[seqs.index(s)]) + plan.steps - 1)
    assert a.free_blocks == c.free_blocks and a.used_total == c.used_total
    assert a.take_work().events == sum(events[1 : plan.steps])


# --- attention cost -------------------------------------------------------------------------


def _cost_models(profile: str | None):
    mixed = _gpt_oss()
    full = ModelSpec(**{**mixed.__dict__, "sliding_window": None, "layer_types": ()})
    gpu = GPUS["H100-SXM-80GB"]
    if profile is None:
        return RooflineCostModel(mixed, gpu), RooflineCostModel(full, gpu)
    return (build_profile_cost_model(profile, mixed, gpu), build_profile_cost_model(profile, full, gpu))


@pytest.mark.parametrize("profile", ["h100-sxm", None])
def test_window_layers_attend_their_window(profile):
    mixed, full = _cost_models(profile)
    n, kv = 32, 10_000
    # Every length at most the window: the mixed model is priced as the full one.
    short = BatchShape(decode_seqs=n, decode_kv_tokens=n * 100, decode_window_kv_tokens=n * 100)
    assert mixed.step_time_s(short) == pytest.approx(full.step_time_s(short), rel=1e-12)
    # Long sequences: the window layers read 128 tokens each, not 10,000.
    long = BatchShape(decode_seqs=n, decode_kv_tokens=n * kv, decode_window_kv_tokens=n * W)
    capped = full.step_time_s(BatchShape(decode_seqs=n, decode_kv_tokens=n * W))
    whole = full.step_time_s(long)
    # Half the layers at each length: the mean of the two full-model prices.
    assert mixed.step_time_s(long) == pytest.approx((whole + capped) / 2, rel=1e-9)
    assert mixed.step_time_s(long) < whole
    # Not given the window's lengths, the window layers are priced at the full ones (an upper bound).
    assert mixed.step_time_s(BatchShape(decode_seqs=n, decode_kv_tokens=n * kv)) == pytest.approx(whole, rel=1e-12)
    # The vectorised decode window agrees with single steps.
    times = mixed.decode_times_s(n, np.array([n * kv, n * (kv + 1.0)]), np.array([n * W, n * W], dtype=float))
    assert times[0] == pytest.approx(mixed.step_time_s(long), rel=1e-12)


@pytest.mark.parametrize("profile", ["h100-sxm", None])
def test_window_layers_prefill_with_the_window_as_context(profile):
    mixed, full = _cost_models(profile)
    chunk = BatchShape(prefill_chunks=[(512, 20_000)])
    capped = full.step_time_s(BatchShape(prefill_chunks=[(512, W)]))
    whole = full.step_time_s(chunk)
    assert mixed.step_time_s(chunk) == pytest.approx((whole + capped) / 2, rel=1e-9)
