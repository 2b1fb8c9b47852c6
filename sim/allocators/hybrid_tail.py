"""Hybrid A: a static floor for the long tail, a block pool for the rest.

Requests whose predicted total length is above ``long_threshold`` get a static
reservation of ``reserve_tokens`` (max_model_len) in a dedicated contiguous
partition of ``static_fraction`` of KV memory; every other request uses the
paged pool. The article's ordering: static for the fat tail, dynamic for the
rest. The predictor is the request's true prompt + output length (an oracle:
the best case for this strategy; state so when quoting results).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from sim.allocators.base import Allocator, DecodePlan, Grow
from sim.allocators.paged import PagedAllocator
from sim.allocators.static import StaticAllocator


class HybridTailAllocator(Allocator):

    def __init__(self, capacity_tokens: int, kv_bytes_per_token: int, *, static_tokens: int, reserve_tokens: int,
                 long_threshold_tokens: int, block_size: int = 16, page_reuse: str = "generation",
                 placement: str = "first_fit"):
        if not reserve_tokens <= static_tokens < capacity_tokens:
            raise ValueError("the static partition must hold one reservation and leave room for the pool")
        self.static = StaticAllocator(static_tokens, kv_bytes_per_token, reserve_tokens, placement=placement) \
            if placement != "first_fit" else StaticAllocator(static_tokens, kv_bytes_per_token, reserve_tokens)
        self.pool = PagedAllocator(capacity_tokens - static_tokens, kv_bytes_per_token, block_size, page_reuse)
        super().__init__(self.static.capacity_tokens + self.pool.capacity_tokens, kv_bytes_per_token, composite=True)
        self.long_threshold = long_threshold_tokens
        self._long_hint: set[int] = set()
        self._where: dict[int, Allocator] = {}

    def hint(self, seq: int, total_tokens: int) -> None:
        if total_tokens > self.long_threshold:
            self._long_hint.add(seq)
        else:
            self._long_hint.discard(seq)

    def _sync(self, seq: int, part: Allocator) -> None:
        self._set_used(seq, part.used[seq])

    def admit(self, seq: int, tokens: int) -> Grow:
        part = self.static if seq in self._long_hint else self.pool
        r = part.admit(seq, tokens)
        if r is Grow.OK:
            self._where[seq] = part
            self._sync(seq, part)
        return r

    def grow(self, seq: int, tokens: int) -> Grow:
        part = self._where[seq]
        r = part.grow(seq, tokens)
        if r is Grow.OK:
            self._sync(seq, part)
        return r

    def release(self, seq: int) -> None:
        self.releases += 1
        self._where.pop(seq).release(seq)
        self._long_hint.discard(seq)
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return self.static.reserved_tokens() + self.pool.reserved_tokens()

    def largest_free_extent_tokens(self) -> int:
        # What one new sequence could take: a static slot or the pool's free blocks.
        return max(self.static.largest_free_extent_tokens(), self.pool.largest_free_extent_tokens())

    def refusal_counts(self) -> dict[str, int]:
        c = Counter(self.refusals)
        c.update({f"static.{k}": v for k, v in self.static.refusals.items()})
        c.update({f"paged.{k}": v for k, v in self.pool.refusals.items()})
        return dict(c)

    def take_work(self):
        for part in (self.static, self.pool):
            self.work.add(part.take_work())
        return super().take_work()

    def window_event_s(self, cost) -> float:
        return self.pool.window_event_s(cost)

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        in_static = np.fromiter((self._where[s] is self.static for s in seqs), dtype=bool, count=len(seqs))
        plans = []
        k = max_steps
        for part, mask in ((self.static, in_static), (self.pool, ~in_static)):
            ids = [s for s, m in zip(seqs, mask) if m]
            p = part.decode_plan(ids, tokens_now[mask], max_steps) if ids else None
            plans.append((part, p))
            if p is not None:
                k = min(k, p.steps)
        reserved = np.zeros(k)
        used = np.zeros(k)
        events = np.zeros(k)
        for part, p in plans:
            if p is None:
                reserved += part.reserved_tokens()
                used += part.used_total
            else:
                reserved += p.reserved_tokens[:k]
                used += p.used_tokens[:k]
                if p.events is not None:
                    events += p.events[:k]
        return DecodePlan(max(1, k), reserved, used, events)

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        for part in (self.static, self.pool):
            ids = [s for s in seqs if self._where[s] is part]
            if ids:
                idx = [i for i, s in enumerate(seqs) if self._where[s] is part]
                part.advance_decode(ids, tokens_after[idx])
        for s in seqs:
            self._sync(s, self._where[s])
