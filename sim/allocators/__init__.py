"""KV allocation strategies behind one interface (:class:`base.Allocator`)."""

from .base import Allocator, AllocatorStats, DecodePlan, Grow
from .paged import PagedAllocator
from .static import StaticAllocator

#: kind -> (knobs with defaults, one line on what it models); printed by ``kvsim list allocators``.
KINDS: dict[str, tuple[dict, str]] = {
    "paged": ({"block_size": 16}, "PagedAttention block pool: blocks of block_size tokens from one free pool"),
    "static": ({"reserve": "max_model_len", "overflow": "reject"},
               "contiguous per-request reservation (max_model_len | tokens | pNN of total length), first-fit arena"),
}

__all__ = ["Allocator", "AllocatorStats", "DecodePlan", "Grow", "PagedAllocator", "StaticAllocator", "KINDS"]
