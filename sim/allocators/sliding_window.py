"""A block pool for sliding-window attention, alone or beside full-attention layers.

With a window of ``W`` tokens, a sequence of ``t`` tokens attends to tokens
``[t − W, t)`` on a sliding-window layer; blocks wholly before that range are
returned to the pool (as vLLM's sliding-window manager does), so a sliding
layer holds at most ``ceil(W / B) + 1`` blocks of a sequence however long it grows.

A model that mixes full-attention and sliding-window layers (gpt-oss, Gemma-2/3)
keeps its KV in layer groups (:class:`sim.catalog.KVGroups`), as vLLM v1's hybrid
KV cache manager does: every group has its own block table and all draw
same-sized blocks from this one pool. A slot here is one token in one group, so
a sequence holds ``full · ceil(t / B)`` blocks for its full-attention groups plus
``sliding`` times the window's blocks; ``used`` counts its slots
(``full · t + sliding · min(t, W)``). A model whose every layer slides (Mistral) is
one sliding group: ``full_groups=0, window_groups=1``, the defaults.
"""

from __future__ import annotations

import numpy as np

from sim.allocators.base import DecodePlan, Grow
from sim.allocators.paged import PagedAllocator


class SlidingWindowPagedAllocator(PagedAllocator):
    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        block_size: int = 16,
        page_reuse: str = "generation",
        *,
        window: int,
        full_groups: int = 0,
        window_groups: int = 1,
    ):
        """``capacity_tokens`` and ``kv_bytes_per_token`` are in slots (tokens of one layer group)."""
        if window_groups < 1 or full_groups < 0:
            raise ValueError("a sliding-window pool needs window_groups >= 1 and full_groups >= 0")
        super().__init__(capacity_tokens, kv_bytes_per_token, block_size, page_reuse)
        self.window = window
        self.full_groups = full_groups
        self.window_groups = window_groups
        # A token takes a slot in every group while it is inside the window (whole-output promises
        # and swaps count it so: an upper bound on the sliding groups).
        self.token_slots = full_groups + window_groups
        self.cohort = None  # block counts stop growing at the window: the residue aggregate does not apply
        #: Logical length of each sequence (``used`` holds the slots actually kept).
        self.length: dict[int, int] = {}

    def _blocks(self, tokens: int) -> int:
        if tokens <= 0:
            return 0
        B = self.block_size
        last = (tokens - 1) // B
        window = last - max(0, tokens - self.window) // B + 1
        if not self.full_groups:
            return window if self.window_groups == 1 else self.window_groups * window
        return self.full_groups * (last + 1) + self.window_groups * window

    def _slots(self, tokens: int) -> int:
        """Slots a sequence of ``tokens`` tokens keeps (before block rounding)."""
        kept = min(tokens, self.window)
        if not self.full_groups:
            return kept if self.window_groups == 1 else self.window_groups * kept
        return self.full_groups * tokens + self.window_groups * kept

    def _need(self, tokens: int) -> int:
        return self._blocks(tokens)

    def admit(self, seq: int, tokens: int) -> Grow:
        r = super().admit(seq, tokens)
        if r is Grow.OK:
            self.length[seq] = tokens
            self._set_used(seq, self._slots(tokens))
        return r

    def grow(self, seq: int, tokens: int) -> Grow:
        if tokens <= self.length[seq]:
            return Grow.OK
        need = self._blocks(tokens)
        extra = need - self.blocks[seq]
        if extra > 0:
            if extra > self.grow_limit():
                self.refusals[self.grow_refusal_reason(extra)] += 1
                return Grow.NO_SPACE
            self._took(extra)
        self.free_blocks -= extra  # negative when blocks slid out of the window
        self.blocks[seq] = need
        self.length[seq] = tokens
        self._set_used(seq, self._slots(tokens))
        return Grow.OK

    def release(self, seq: int) -> None:
        super().release(seq)
        del self.length[seq]

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        B, W = self.block_size, self.window
        j = np.arange(max_steps, dtype=np.int64)[:, None]
        t = tokens_now[None, :] + j
        blocks = self.window_groups * ((t - 1) // B - np.maximum(0, t - W) // B + 1)  # [step, seq]
        kept = self.window_groups * np.minimum(t, W)
        if self.full_groups:
            blocks = blocks + self.full_groups * ((t - 1) // B + 1)
            kept = kept + self.full_groups * t
        held0 = np.fromiter((self.blocks[s] for s in seqs), dtype=np.int64, count=len(seqs))
        prev = np.vstack([held0[None, :], blocks[:-1]])
        taken = np.maximum(0, blocks - prev).sum(axis=1)  # new blocks per step
        # Steps after the first are included only while the blocks taken so far fit the free pool
        # without counting the blocks that slid out: then every grow succeeds in any order within
        # a step, as stepping one iteration at a time would find. (Ending early is always exact.)
        cum = np.cumsum(taken) - taken[0]
        k = int(np.searchsorted(cum, self.grow_limit(), side="right"))
        k = max(1, min(k, max_steps))
        others = self.reserved_tokens() - int(held0.sum()) * B
        reserved = (others + blocks[:k].sum(axis=1) * B).astype(np.float64)
        used_now = self.used_total - sum(self._slots(int(x)) for x in tokens_now)
        used = (used_now + kept[:k].sum(axis=1)).astype(np.float64)
        return DecodePlan(k, reserved, used, taken[:k].astype(np.float64))

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        for s, t in zip(seqs, tokens_after.tolist()):
            need = self._blocks(t)
            extra = need - self.blocks[s]
            # Events as stepping counts them: the blocks each iteration's growth took, net of those
            # that slid out in the same iteration.
            prev = self.blocks[s]
            taken = 0
            for u in range(self.length[s] + 1, t + 1):
                b = self._blocks(u)
                if b > prev:
                    taken += b - prev
                prev = b
            if taken:
                self._took(taken)
            self.free_blocks -= extra
            self.blocks[s] = need
            self.length[s] = t
            self._set_used(s, self._slots(t))
        assert self.free_blocks >= 0, "decode window overdrew the block pool"
