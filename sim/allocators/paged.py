"""A pool of fixed-size KV blocks (PagedAttention).

A sequence holding ``t`` tokens owns ``ceil(t / block_size)`` blocks from one
shared pool; only the last block of a sequence can be partly empty, so
internal fragmentation is below one block per sequence and there is no
external fragmentation.
"""

from __future__ import annotations

from itertools import accumulate
from operator import mul
from typing import TYPE_CHECKING

import numpy as np
from mypy_extensions import mypyc_attr

from sim.allocators.base import INSUFFICIENT_FREE, Allocator, DecodePlan, Grow
from sim.allocators.cohort import Cohort

if TYPE_CHECKING:
    from sim.cost.model import CostModel


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class PagedAllocator(Allocator):
    def __init__(
        self, capacity_tokens: int, kv_bytes_per_token: int, block_size: int = 16, page_reuse: str = "generation"
    ):
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        num_blocks = capacity_tokens // block_size
        super().__init__(num_blocks * block_size, kv_bytes_per_token, single_extent=True)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks
        self.blocks: dict[int, int] = {}
        #: ``zero``: a block is memset before reuse; ``generation``: a generation counter marks it stale for free.
        self.zero_on_reuse = page_reuse == "zero"
        self.block_bytes = block_size * kv_bytes_per_token
        self.cohort = PagedCohort(self)
        #: ``grow_limit`` is the free pool (subclasses with reserves override it).
        self._plain_limits = type(self).grow_limit is PagedAllocator.grow_limit

    def _took(self, blocks: int) -> None:
        w = self.work
        w.events += blocks
        if self.zero_on_reuse:
            w.zero_ops += blocks
            w.zero_bytes += blocks * self.block_bytes

    def window_event_s(self, cost: CostModel) -> float:
        per_block = cost.alloc_time_s(1)
        if self.zero_on_reuse:
            per_block += cost.zero_fill_time_s(self.block_bytes)
        return per_block

    def _need(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def admit_limit(self) -> int:
        """Blocks a new sequence may take now."""
        return self.free_blocks

    def grow_limit(self) -> int:
        """Blocks running sequences may still take now."""
        return self.free_blocks

    def admit(self, seq: int, tokens: int) -> Grow:
        assert seq not in self.blocks, f"seq {seq} admitted twice"
        need = self._need(tokens)
        if need > self.admit_limit():
            self.refusals[self.admit_refusal_reason(need)] += 1
            return Grow.NO_SPACE
        self.free_blocks -= need
        self.blocks[seq] = need
        self._took(need)
        self._set_used(seq, tokens)
        return Grow.OK

    def grow(self, seq: int, tokens: int) -> Grow:
        extra = self._need(tokens) - self.blocks[seq]
        if extra > 0:
            if extra > self.grow_limit():
                self.refusals[self.grow_refusal_reason(extra)] += 1
                return Grow.NO_SPACE
            self.free_blocks -= extra
            self.blocks[seq] += extra
            self._took(extra)
        used = self.used
        old = used[seq]
        if tokens > old:  # _set_used, written out: this runs for every sequence at most iterations
            self.used_total += tokens - old
            used[seq] = tokens
        return Grow.OK

    def admit_refusal_reason(self, need: int) -> str:
        return INSUFFICIENT_FREE

    def grow_refusal_reason(self, need: int) -> str:
        return INSUFFICIENT_FREE

    def release(self, seq: int) -> None:
        self.releases += 1
        self.free_blocks += self.blocks.pop(seq)
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return (self.num_blocks - self.free_blocks) * self.block_size

    def largest_free_extent_tokens(self) -> int:
        # Any free block serves any sequence: the whole free pool is one usable extent.
        return self.free_blocks * self.block_size

    def _held_blocks(self, seq: int) -> int:
        """Blocks ``seq`` holds (subclasses with block tables count them there)."""
        return self.blocks[seq]

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        B = self.block_size
        held = np.fromiter((self._held_blocks(s) for s in seqs), dtype=np.int64, count=len(seqs))
        # Iteration j (0-based) needs tokens_now + j slots. A sequence takes its next block
        # at j = held*B - tokens_now + 1, then every B iterations after that.
        first = held * B - tokens_now + 1
        if max_steps > 1 and len(seqs):
            counts = np.maximum(0, (max_steps - 1 - first) // B + 1)
            starts = np.repeat(first, counts)
            offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            new_per_step = np.bincount(starts + offsets * B, minlength=max_steps)[:max_steps]
        else:
            new_per_step = np.zeros(max_steps, dtype=np.int64)
        cum_new = np.cumsum(new_per_step)
        k = int(np.searchsorted(cum_new, self.grow_limit(), side="right"))
        k = max(1, min(k, max_steps))
        reserved = (self.num_blocks - self.free_blocks + cum_new[:k]) * B
        used = self.used_total + len(seqs) * np.arange(k, dtype=np.float64)
        return DecodePlan(k, reserved.astype(np.float64), used, new_per_step[:k].astype(np.float64))

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        B = self.block_size
        blocks = self.blocks
        used = self.used
        for s, t in zip(seqs, tokens_after.tolist()):
            need = -(-t // B)
            extra = need - blocks[s]
            if extra > 0:
                self.free_blocks -= extra
                self._took(extra)
                blocks[s] = need
            self.used_total += t - used[s]
            used[s] = t
        assert self.free_blocks >= 0, "decode window overdrew the block pool"


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class PagedCohort(Cohort):
    """Members of a block pool. A member with ``a ≡ r (mod B)`` takes a new block at the
    iteration that starts from step ``G`` iff ``(r + G) % B == 0`` (its blocks are full),
    so a histogram of ``a mod B`` is all the pool needs to know per iteration; over any
    ``B`` consecutive iterations every member takes exactly one block."""

    def __init__(self, pool: PagedAllocator):
        super().__init__()
        self.pool = pool
        self.B = pool.block_size
        self.cnt = [0] * self.B

    def _join(self, seq: int, held_tokens: int, a: int) -> None:
        pool = self.pool
        assert pool.blocks[seq] == -(-held_tokens // self.B) and pool.used[seq] == held_tokens
        del pool.blocks[seq]
        del pool.used[seq]  # used_total keeps counting it
        self.cnt[a % self.B] += 1

    def _leave(self, seq: int, a: int, tokens: int) -> None:
        self.cnt[a % self.B] -= 1
        self.pool.blocks[seq] = -(-tokens // self.B)
        self.pool.used[seq] = tokens

    def block_events(self, G: int, steps: int) -> list[int]:
        return self._new_blocks(G, steps)

    def _new_blocks(self, G: int, steps: int) -> list[int]:
        # Iteration i (0-based) starts from step G + i; members with (a + G + i) % B == 0 need a
        # block: cnt[(-(G + i)) % B], i.e. the histogram read backwards from (-G) % B, cyclically.
        cnt, B = self.cnt, self.B
        r0 = (-G) % B
        if steps == 1:
            return [cnt[r0]]
        cycle = cnt[r0::-1] + cnt[:r0:-1]
        return (cycle * (steps // B + 1))[:steps] if steps > B else cycle[:steps]

    def grantable_steps(self, G: int, max_steps: int) -> int:
        if max_steps <= 0:
            return 0
        n, B, free = len(self.a), self.B, self.pool.grow_limit()
        if max_steps == 1:
            return 1 if self.cnt[(-G) % B] <= free else 0
        cycles = free // n if n else max_steps
        if cycles * B >= max_steps:
            return max_steps
        left = free - cycles * n
        k = cycles * B
        cnt = self.cnt
        while k < max_steps:
            need = cnt[(-(G + k)) % B]
            if need > left:
                break
            left -= need
            k += 1
        return k

    def preview(self, G: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pool = self.pool
        new = np.asarray(self._new_blocks(G, steps), dtype=np.int64)
        cum = np.cumsum(new)
        reserved = (pool.num_blocks - pool.free_blocks + cum) * self.B
        used = pool.used_total + len(self.a) * np.arange(1, steps + 1)
        return reserved.astype(np.float64), used.astype(np.float64), new.astype(np.float64)

    def integrals(
        self, G: int, times: list[float], first: int, stop: int, used_s: float, reserved_s: float
    ) -> tuple[float, float]:
        # preview's sums without its arrays, in C loops (map/sum): the same products; the
        # sums are associated differently (within an ulp or two of adding them one by one).
        steps = stop - first
        if steps <= 0:
            return used_s, reserved_s
        pool, B, n = self.pool, self.B, len(self.a)
        ts = times[first:stop]
        blocks = accumulate(self._new_blocks(G, steps), initial=pool.num_blocks - pool.free_blocks)
        next(blocks)  # the count before the first iteration's growth
        u0 = pool.used_total
        used = range(u0 + n, u0 + n * steps + 1, n) if n else [u0] * steps
        return used_s + sum(map(mul, used, ts)), reserved_s + B * sum(map(mul, blocks, ts))

    def advance_one(self, G: int) -> bool:
        # grantable_steps(G, 1) and advance(G, 1) in one call, _took inlined: this runs at every
        # batch change.
        new = self.cnt[(-G) % self.B]
        pool = self.pool
        if new:
            if new > (pool.free_blocks if pool._plain_limits else pool.grow_limit()):
                return False
            pool.free_blocks -= new
            if pool.zero_on_reuse:
                pool._took(new)
            else:
                pool.work.events += new
        pool.used_total += len(self.a)
        return True

    def _blocks_for(self, G: int, steps: int) -> int:
        """New blocks the members take over ``steps`` iterations from ``G``."""
        # Whole cycles of B iterations take one block per member; the rest is a partial cycle.
        full, rest = divmod(steps, self.B)
        return full * len(self.a) + (sum(self._new_blocks(G + full * self.B, rest)) if rest else 0)

    def advance(self, G: int, steps: int) -> None:
        if steps <= 0:
            return
        if steps == 1:
            granted = self.advance_one(G)
            assert granted, "cohort advanced past the free pool"
            return
        new = self._blocks_for(G, steps)
        pool = self.pool
        assert new <= pool.grow_limit(), "cohort advanced past the free pool"
        if new:
            pool.free_blocks -= new
            pool._took(new)
        pool.used_total += len(self.a) * steps
