"""KV allocation strategies behind one interface (:class:`base.Allocator`)."""

from sim.allocators.base import Allocator, AllocatorStats, AllocWork, DecodePlan, Grow
from sim.allocators.dynamic import DynamicAllocator
from sim.allocators.hybrid_reserve import HybridReserveAllocator
from sim.allocators.hybrid_tail import HybridTailAllocator
from sim.allocators.paged import PagedAllocator
from sim.allocators.static import StaticAllocator

#: kind -> (knobs with defaults, one line on what it models); printed by ``kvsim list allocators``.
KINDS: dict[str, tuple[dict, str]] = {
    "static": ({"reserve": "max_model_len", "overflow": "reject", "placement": "first_fit"},
               "contiguous per-request reservation (max_model_len | tokens | pNN of total length) in an arena"),
    "dynamic": ({"growth": "chunk", "chunk_tokens": 512, "placement": "first_fit",
                 "compaction.enabled": False, "compaction.below_utilization": 0.70,
                 "compaction.above_fragmentation": 0.50, "compaction.mode": "stall", "compaction.period_s": 0.5},
                "one contiguous extent per sequence grown in place or by realloc-and-copy, token by token or in chunks"),
    "paged": ({"block_size": 16, "page_reuse": "generation", "prefix_caching.enabled": False,
               "prefix_caching.eviction": "lru"},
              "PagedAttention block pool: blocks of block_size tokens from one free pool"),
    "hybrid_tail": ({"long_threshold": "p90", "static_fraction": 0.3, "block_size": 16, "placement": "first_fit"},
                    "static max_model_len reservations for predicted-long requests in a partition; paged pool for the rest"),
    "hybrid_reserve": ({"reserve_fraction": 0.15, "preempt_at_usage": 0.95, "admit_when_free_above": 0.10,
                        "stale_after_s": None, "block_size": 16},
                       "paged pool with an emergency reserve for running sequences, a preemption threshold and an admission breaker"),
}
#: Knobs every kind takes.
COMMON_KNOBS = {"preemption.mode": "recompute", "preemption.swap_capacity_bytes": 64 * 2**30,
                "preemption.victim": "lifo"}

__all__ = ["Allocator", "AllocatorStats", "AllocWork", "DecodePlan", "Grow", "DynamicAllocator", "HybridReserveAllocator",
           "HybridTailAllocator", "PagedAllocator", "StaticAllocator", "KINDS", "COMMON_KNOBS"]
