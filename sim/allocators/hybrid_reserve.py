"""Hybrid B: a block pool with an emergency reserve, a preemption threshold and an admission breaker.

The article's tight-budget recipe: keep ``reserve_fraction`` of the KV pool
that only *running* sequences may grow into (new requests cannot take it);
when usage would pass ``preempt_at_usage`` a growing sequence is refused,
which makes the scheduler preempt the most recently admitted one; and while
free memory is below ``admit_when_free_above`` admissions pause (requests
queue). Trades queueing for fewer preemptions.
"""

from __future__ import annotations

import math

import numpy as np
from mypy_extensions import mypyc_attr

from sim.allocators.paged import PagedAllocator

RESERVE_PROTECTED = "reserve_protected"
ABOVE_PREEMPT_THRESHOLD = "above_preempt_threshold"


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class HybridReserveAllocator(PagedAllocator):
    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        block_size: int = 16,
        page_reuse: str = "generation",
        *,
        reserve_fraction: float = 0.15,
        preempt_at_usage: float = 0.95,
        admit_when_free_above: float = 0.10,
    ):
        super().__init__(capacity_tokens, kv_bytes_per_token, block_size, page_reuse)
        self.reserve_blocks = math.ceil(reserve_fraction * self.num_blocks)
        self.preempt_blocks = math.floor(preempt_at_usage * self.num_blocks)
        self.pause_below_blocks = admit_when_free_above * self.num_blocks

    def admit_limit(self) -> int:
        held = self.num_blocks - self.free_blocks
        return max(0, min(self.free_blocks - self.reserve_blocks, self.preempt_blocks - held))

    def grow_limit(self) -> int:
        held = self.num_blocks - self.free_blocks
        return max(0, min(self.free_blocks, self.preempt_blocks - held))

    def admit_refusal_reason(self, need: int) -> str:
        return RESERVE_PROTECTED if need <= self.free_blocks else super().admit_refusal_reason(need)

    def grow_refusal_reason(self, need: int) -> str:
        return ABOVE_PREEMPT_THRESHOLD if need <= self.free_blocks else super().grow_refusal_reason(need)

    def admission_paused(self) -> bool:
        return self.free_blocks < self.pause_below_blocks

    def paused_at(self, reserved_tokens: np.ndarray) -> np.ndarray:
        free_blocks = self.num_blocks - reserved_tokens / self.block_size
        return free_blocks < self.pause_below_blocks
