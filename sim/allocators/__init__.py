"""KV allocation strategies behind one interface (:class:`base.Allocator`), chosen by
``allocator.kind`` from a registry (:mod:`.registry`, built-ins in :mod:`.kinds`), with optional
features declared as protocols (:mod:`.capabilities`)."""

from sim.allocators import kinds as _kinds  # noqa: F401  (registers the built-in kinds)
from sim.allocators.base import Allocator, AllocatorStats, AllocWork, DecodePlan, Grow
from sim.allocators.dynamic import DynamicAllocator
from sim.allocators.hybrid_reserve import HybridReserveAllocator
from sim.allocators.hybrid_tail import HybridTailAllocator
from sim.allocators.paged import PagedAllocator
from sim.allocators.registry import KindsView, common_knob_defaults, make_allocator
from sim.allocators.static import StaticAllocator

#: kind -> (knobs with their config defaults, one line on what it models), from the registry;
#: printed by ``kvsim list allocators``.
KINDS = KindsView()
#: Knobs every kind takes, with their config defaults.
COMMON_KNOBS = common_knob_defaults()

__all__ = [
    "Allocator",
    "AllocatorStats",
    "AllocWork",
    "DecodePlan",
    "Grow",
    "DynamicAllocator",
    "HybridReserveAllocator",
    "HybridTailAllocator",
    "PagedAllocator",
    "StaticAllocator",
    "KINDS",
    "COMMON_KNOBS",
    "make_allocator",
]
