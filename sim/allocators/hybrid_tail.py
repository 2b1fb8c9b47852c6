"""Hybrid A: a static floor for the long tail, a block pool for the rest.

Requests whose predicted total length is above ``long_threshold`` get a static reservation of
``reserve_tokens`` (max_model_len) in a dedicated contiguous partition of ``static_fraction`` of
KV memory; every other request uses the paged pool. The article's ordering: static for the fat
tail, dynamic for the rest.

The prediction comes from the scheduler at admission (:meth:`hint`, from the scenario's
``allocator.length_predictor``: ``sim/workload/predictor.py``). A request predicted short may
hold at most ``long_threshold`` tokens in the pool: when it grows past them it has turned out
long and moves to a static slot, one copy of its KV (:class:`.tiered.TieredAllocator`); with no
slot free it is preempted and comes back into a slot. Under the ``oracle`` predictor (the true
length) nothing ever moves: that is the strategy's upper bound.

A request predicted short that the pool could not hold even empty (its known length, or the
tokens it asks for, above the pool's capacity: a large ``static_fraction`` leaves a small pool,
and a short request that filled it alone preempted itself) is placed like a long one, in a static
slot: it waits while no slot is free, and is refused only where it fits neither region (never,
as a reservation holds ``max_model_len``), instead of being rejected ``cannot_fit_empty_replica``.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from sim.allocators.base import Grow
from sim.allocators.paged import PagedAllocator
from sim.allocators.static import StaticAllocator
from sim.allocators.tiered import TieredAllocator


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class HybridTailAllocator(TieredAllocator):
    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        *,
        static_tokens: int,
        reserve_tokens: int,
        long_threshold_tokens: int,
        block_size: int = 16,
        page_reuse: str = "generation",
        placement: str = "first_fit",
    ):
        if not reserve_tokens <= static_tokens < capacity_tokens:
            raise ValueError("the static partition must hold one reservation and leave room for the pool")
        if long_threshold_tokens >= reserve_tokens:
            # Nobody is ever long: the pool takes everyone, up to the reservation.
            long_threshold_tokens = reserve_tokens
        static = StaticAllocator(static_tokens, kv_bytes_per_token, reserve_tokens, placement=placement)
        pool = PagedAllocator(capacity_tokens - static_tokens, kv_bytes_per_token, block_size, page_reuse)
        super().__init__(static, pool, kv_bytes_per_token, pool_limit_tokens=long_threshold_tokens)
        #: Tokens: a request predicted longer in total is long (LengthHints).
        self.long_threshold = long_threshold_tokens
        self._long_hint: set[int] = set()

    def hint(self, seq: int, total_tokens: int) -> None:
        # Predicted long, or too long for the pool even when it is empty: a static slot.
        if total_tokens > self.long_threshold or total_tokens > self.pool.capacity_tokens:
            self._long_hint.add(seq)
        else:
            self._long_hint.discard(seq)

    def _prefer(self, seq: int):
        return self.static if seq in self._long_hint else self.pool

    def admit(self, seq: int, tokens: int) -> Grow:
        if tokens > self.pool.capacity_tokens:
            # The pool could never hold it (without a hint, or one below what it asks for now).
            self._long_hint.add(seq)
        r = super().admit(seq, tokens)
        if r is not Grow.NO_SPACE:
            self._long_hint.discard(seq)  # used (or the request is gone): the next admission hints again
        return r

    def release(self, seq: int) -> None:
        super().release(seq)
        self._long_hint.discard(seq)

    def move_report(self) -> dict[str, int]:
        return {
            "migrations": self.moves_in["static"],
            "migration_copy_bytes": self.moved_bytes["static"],
            "evictions": self.evictions,
        }
