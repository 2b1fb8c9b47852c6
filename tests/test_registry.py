"""Allocator and scheduler kinds come from registries; optional allocator features are declared
protocols. The recipe of docs/allocators.md ("Writing an allocator") is followed once here: a toy
allocator defined and registered in this file runs scenarios end to end, in both engine modes,
with its invariants checked after every operation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import tiny_scenario
from sim.allocators import COMMON_KNOBS, KINDS, Allocator, DecodePlan, Grow, registry
from sim.allocators.base import INSUFFICIENT_FREE
from sim.allocators.capabilities import capabilities_of
from sim.config import ALLOCATOR_KINDS, SCHEDULER_KINDS, AllocatorConfig, load_scenario
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.errors import ConfigError
from sim.sched import registry as sched_registry
from sim.sched.static_batch import StaticBatchScheduler
from test_allocators import _run, ops
from test_engine import _compare

# --- the recipe: one class, one registration --------------------------------------------------


class SlotPool(Allocator):
    """A pool of single token slots: a sequence holds exactly the tokens it has (a block pool with
    one-token blocks), so nothing is ever fragmented. One allocation event per slot taken."""

    def __init__(self, capacity_tokens: int, kv_bytes_per_token: int):
        super().__init__(capacity_tokens, kv_bytes_per_token, single_extent=True)
        self.free = capacity_tokens
        self.held: dict[int, int] = {}

    def _take(self, seq: int, slots: int) -> None:
        self.free -= slots
        self.held[seq] = self.held.get(seq, 0) + slots
        self.work.events += slots

    def admit(self, seq: int, tokens: int) -> Grow:
        assert seq not in self.held, f"seq {seq} admitted twice"
        if tokens > self.free:
            self.refusals[INSUFFICIENT_FREE] += 1
            return Grow.NO_SPACE
        self._take(seq, tokens)
        self._set_used(seq, tokens)
        return Grow.OK

    def grow(self, seq: int, tokens: int) -> Grow:
        extra = tokens - self.held[seq]
        if extra > 0:
            if extra > self.free:
                self.refusals[INSUFFICIENT_FREE] += 1
                return Grow.NO_SPACE
            self._take(seq, extra)
        if tokens > self.used[seq]:
            self._set_used(seq, tokens)
        return Grow.OK

    def release(self, seq: int) -> None:
        self.releases += 1
        self.free += self.held.pop(seq)
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return self.capacity_tokens - self.free

    def largest_free_extent_tokens(self) -> int:
        return self.free

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        # Iteration j takes one slot per sequence beyond the first (already granted) iteration.
        n = len(seqs)
        k = max(1, min(max_steps, 1 + self.free // n)) if n else max_steps
        j = np.arange(k, dtype=np.float64)
        events = np.full(k, float(n))
        return DecodePlan(k, self.reserved_tokens() + n * j, self.used_total + n * j, events)

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self.free + sum(self.held.values()) == self.capacity_tokens
        assert all(self.held[s] == self.used[s] for s in self.used), "a sequence holds other than its tokens"


class CheckedSlotPool(SlotPool):
    """The toy with its invariants asserted after every operation the engine makes."""

    def admit(self, seq, tokens):
        r = super().admit(seq, tokens)
        self.check_invariants()
        return r

    def grow(self, seq, tokens):
        r = super().grow(seq, tokens)
        self.check_invariants()
        return r

    def release(self, seq):
        super().release(seq)
        self.check_invariants()


def build_slot_pool(cfg: AllocatorConfig, budget: registry.Budget) -> Allocator:
    return CheckedSlotPool(budget.capacity_tokens, budget.kv_bytes_per_token)


@pytest.fixture
def slot_pool_kind():
    registry.register(
        "slot_pool",
        build_slot_pool,
        knobs=(),
        paged_layout=True,
        description="single token slots from one pool (a test's toy)",
    )
    try:
        yield "slot_pool"
    finally:
        registry.unregister("slot_pool")


def test_a_registered_toy_allocator_runs_scenarios_end_to_end(slot_pool_kind):
    assert "slot_pool" in ALLOCATOR_KINDS and KINDS["slot_pool"] == (
        {},
        "single token slots from one pool (a test's toy)",
    )
    # Memory pressure, preemption, chunked prefill, two replicas: the engine's per-sequence path
    # and its decode windows, against stepping one iteration at a time.
    # (block_size 1: the cost model prices the paged layout of a kind at allocator.block_size.)
    over = {
        "allocator.kind": slot_pool_kind,
        "allocator.block_size": 1,
        "workload.num_requests": 80,
        "workload.arrival.rate": 50.0,
        "workload.lengths.output_max": 500,
        "workload.lengths.prompt_max": 500,
        "gpu.replicas": 2,
    }
    ff = simulate(tiny_scenario(kv_tokens=1200, **over))
    step = simulate(tiny_scenario(kv_tokens=1200, **over, **{"engine.mode": "step"}))
    assert ff.summary["allocator"] == slot_pool_kind
    assert ff.summary["completed"] == 80 and ff.summary["preemptions"] > 0
    assert ff.summary["windows"] < ff.summary["iterations"]  # decode windows ran
    assert ff.summary["kv_internal_fragmentation"] == 0.0 and ff.summary["kv_external_fragmentation"] == 0.0
    _compare(ff, step)
    # The toy is a block pool with one-token blocks: the built-in paged kind (whose decode cohort
    # takes the other fast-forward path) must give the same requests, iterations and refusals.
    paged = simulate(tiny_scenario(kv_tokens=1200, **{**over, "allocator.kind": "paged"}))
    _compare(ff, paged)
    # A built-in scenario, loaded from its YAML with the toy kind set on the command line's path.
    res = simulate(load_scenario("chat-api", {"allocator.kind": slot_pool_kind, "workload.num_requests": 150}))
    assert res.summary["completed"] == 150


def test_an_unregistered_kind_is_refused_with_the_registered_ones(slot_pool_kind):
    registry.unregister(slot_pool_kind)
    try:
        with pytest.raises(ConfigError) as err:
            load_scenario("chat-api", {"allocator.kind": slot_pool_kind})
        assert err.value.key == "allocator.kind" and "paged" in str(err.value) and "slot_pool" not in err.value.allowed
    finally:
        registry.register(slot_pool_kind, build_slot_pool, knobs=(), description="again")


@settings(max_examples=300)
@given(ops, st.integers(50, 3000))
def test_toy_allocator_invariants(seq_ops, capacity):
    _run(SlotPool(capacity, 10), seq_ops, lambda a: None)


# --- the registries ------------------------------------------------------------------------------


def test_built_in_kinds_are_the_configs_in_its_order():
    assert list(registry.REGISTRY)[:5] == ["static", "dynamic", "paged", "hybrid_tail", "hybrid_reserve"]
    assert list(registry.REGISTRY) == ALLOCATOR_KINDS
    assert list(sched_registry.REGISTRY) == SCHEDULER_KINDS == ["continuous", "static_batch"]


def test_knob_defaults_are_the_configs():
    defaults = AllocatorConfig()
    assert KINDS["dynamic"][0]["chunk_tokens"] == defaults.chunk_tokens == 512
    assert KINDS["dynamic"][0]["compaction.period_s"] == defaults.compaction.period_s
    assert KINDS["static"][0] == {
        "reserve": "max_model_len",
        "overflow": "reject",
        "placement": "first_fit",
        "fallback_fraction": 0.1,
        "block_size": 16,
        "page_reuse": "generation",
        **{f"compaction.{k}": v for k, v in defaults.compaction.model_dump().items()},
    }
    assert KINDS["hybrid_tail"][0]["length_predictor"] == defaults.length_predictor == "prompt"
    assert COMMON_KNOBS == {
        "preemption.mode": "recompute",
        "preemption.swap_capacity_bytes": 64 * 2**30,
        "preemption.victim": "lifo",
    }


def test_register_refuses_a_second_registration_and_unknown_knobs():
    with pytest.raises(ValueError, match="already registered"):
        registry.register("paged", build_slot_pool, knobs=(), description="")
    with pytest.raises(KeyError, match="allocator.no_such_knob"):
        registry.register("bad_knobs", build_slot_pool, knobs=("no_such_knob",), description="")
    assert "bad_knobs" not in registry.REGISTRY and "bad_knobs" not in ALLOCATOR_KINDS


#: What each built-in kind can do beyond the interface (the table in sim/allocators/capabilities.py).
CAPABILITIES = {
    "static": ["Compactable"],
    "static+fallback": ["MoveReport", "Regions"],
    "dynamic": ["Compactable"],
    "paged": [],
    "paged+prefix_caching": ["PrefixLookup", "PrefixAdmission", "PrefixCacheReport"],
    "hybrid_tail": ["LengthHints", "MoveReport", "Regions"],
    "hybrid_reserve": ["AdmissionBreaker"],
}


@pytest.mark.parametrize("name", list(CAPABILITIES))
def test_built_in_allocators_have_the_capabilities_they_declare(name):
    kind = name.split("+")[0]
    over = {"allocator.kind": kind, "allocator.prefix_caching.enabled": name.endswith("prefix_caching")}
    if name.endswith("fallback"):
        over.update({"allocator.reserve": "p90", "allocator.overflow": "fallback"})
    sc = load_scenario("chat-api", over)
    alloc = Deployment.from_scenario(sc, lambda q: 2000).make_allocator(sc)
    assert capabilities_of(alloc) == CAPABILITIES[name]
    assert registry.get(kind).paged_layout == (kind in ("paged", "hybrid_tail", "hybrid_reserve"))


class LoggedStaticBatch(StaticBatchScheduler):
    """A toy scheduler kind: request-level static batching that logs each batch's size."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.batch_sizes: list[int] = []

    def schedule(self, start=0, batch=None):
        plan = super().schedule(start, batch)
        self.batch_sizes.append(len(plan.items))
        return plan


def test_a_registered_scheduler_kind_is_built_with_the_engines_arguments():
    built: list[LoggedStaticBatch] = []

    def factory(cfg, allocator, **kw):
        s = LoggedStaticBatch(cfg, allocator, **kw)
        built.append(s)
        return s

    sched_registry.register("logged_static_batch", factory)
    try:
        over = {
            "scheduler.kind": "logged_static_batch",
            "allocator.kind": "static",
            "allocator.preemption.victim": "lowest_priority",
            "workload.num_requests": 40,
        }
        res = simulate(tiny_scenario(**over))
        ref = simulate(tiny_scenario(**{**over, "scheduler.kind": "static_batch"}))
        assert res.summary["completed"] == 40 and len(built) == 1
        assert built[0].victim_policy == "lowest_priority" and max(built[0].batch_sizes) > 1
        _compare(res, ref)
    finally:
        sched_registry.unregister("logged_static_batch")
    assert "logged_static_batch" not in SCHEDULER_KINDS
