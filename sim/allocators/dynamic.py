"""Dynamic contiguous growth: one extent per sequence, grown on demand (realloc-and-copy).

A sequence holding ``t`` tokens owns one contiguous extent of
``granted(round_up(t, g))`` slots, where ``g`` is the growth granularity (1
token for ``growth="token"``, ``chunk_tokens`` for ``growth="chunk"``, the
article's "pre-allocating in coarse chunks (every 512 tokens)") and
``granted`` is the arena's rounding (identity for first/best fit, the
power-of-two block for buddy). The rounded size is capped at the arena's
largest possible extent, so a sequence that fits at all is never refused for
its rounding alone.

Growth past the extent, in order:

1. in place, when the slots right after it are free: one allocation event;
2. elsewhere: a new extent is allocated *while the old one is held* (allocate,
   copy, free, as ``cudaMalloc`` + ``memcpy`` would), the sequence's used
   tokens are copied: one event and ``used × kv_bytes_per_token`` copy bytes;
3. otherwise ``Grow.NO_SPACE`` and nothing changes. The refusal counts as
   ``NO_CONTIGUOUS_EXTENT`` (stranded memory) when the new extent would fit in
   the total free slots plus the sequence's own extent (``free + own ≥ new``:
   what a pool without contiguity, or a compaction followed by in-place
   growth, could grant), else ``INSUFFICIENT_FREE``.

A sequence that needs more than the largest extent the arena can ever hold
(only possible with buddy, whose largest block is the largest power of two ≤
capacity, or beyond capacity) gets ``Grow.OVERFLOW`` (``EXCEEDS_RESERVATION``):
no amount of freeing would help it.

Moving an extent (relocation on growth, compaction) changes the layout, so it
increments ``releases`` like a release does: a refused admission may fit after it.
"""

from __future__ import annotations

import numpy as np
from mypy_extensions import mypyc_attr

from sim.allocators.base import (
    EXCEEDS_RESERVATION,
    INSUFFICIENT_FREE,
    NO_CONTIGUOUS_EXTENT,
    Allocator,
    DecodePlan,
    Grow,
)
from sim.allocators.compaction import CompactionMixin, compact_allocator
from sim.allocators.placement import make_arena

GROWTHS = ("token", "chunk")


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class DynamicAllocator(Allocator, CompactionMixin):
    # No decode cohort (the base's ``cohort = None``): the engine grows sequences one by one
    # (decode_plan / advance_decode).

    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        growth: str = "token",
        chunk_tokens: int = 512,
        placement: str = "first_fit",
    ):
        super().__init__(capacity_tokens, kv_bytes_per_token)
        if growth not in GROWTHS:
            raise ValueError(f"growth {growth!r}: expected one of {', '.join(GROWTHS)}")
        if growth == "chunk" and chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens {chunk_tokens} must be positive")
        self.growth = growth
        self.chunk_tokens = chunk_tokens
        self.granularity = chunk_tokens if growth == "chunk" else 1
        self.placement = placement
        self.arena = make_arena(placement, capacity_tokens)
        #: The largest extent any sequence can ever own.
        self.max_extent_tokens = self.arena.max_extent
        self.extent: dict[int, int] = {}  # seq -> start slot
        self.size: dict[int, int] = {}  # seq -> slots owned (granted extent size)
        self._reserved = 0
        #: How many growths were in place / relocated (for reports).
        self.grown_in_place = 0
        self.relocations = 0

    # --- sizing ----------------------------------------------------------------------
    def extent_tokens(self, tokens: int) -> int:
        """Slots owned by a sequence of ``tokens`` tokens (``tokens`` ≤ ``max_extent_tokens``)."""
        g = self.granularity
        return self.arena.granted(min(-(-tokens // g) * g, self.max_extent_tokens))

    def _refuse(self, need: int, own: int) -> Grow:
        stranded = self.arena.free_total + own >= need
        self.refusals[NO_CONTIGUOUS_EXTENT if stranded else INSUFFICIENT_FREE] += 1
        return Grow.NO_SPACE

    # --- the interface -----------------------------------------------------------------
    def admit(self, seq: int, tokens: int) -> Grow:
        assert seq not in self.extent, f"seq {seq} admitted twice"
        if tokens > self.max_extent_tokens:
            self.refusals[EXCEEDS_RESERVATION] += 1
            return Grow.OVERFLOW
        need = self.extent_tokens(tokens)
        start = self.arena.allocate(need)
        if start is None:
            return self._refuse(need, 0)
        self.work.events += 1
        self.extent[seq] = start
        self.size[seq] = need
        self._reserved += need
        self._set_used(seq, tokens)
        return Grow.OK

    def grow(self, seq: int, tokens: int) -> Grow:
        have = self.size[seq]
        if tokens > have:
            if tokens > self.max_extent_tokens:
                self.refusals[EXCEEDS_RESERVATION] += 1
                return Grow.OVERFLOW
            need = self.extent_tokens(tokens)
            arena = self.arena
            start = self.extent[seq]
            if arena.try_extend(start, have, need):
                self.grown_in_place += 1
            else:
                new = arena.allocate(need)
                if new is None:
                    return self._refuse(need, have)
                self.work.copy_ops += 1
                self.work.copy_bytes += self.used[seq] * self.bpt
                arena.free(start, have)
                self.extent[seq] = new
                self.relocations += 1
                self.releases += 1
            self.work.events += 1
            self.size[seq] = need
            self._reserved += need - have
        if tokens > self.used[seq]:
            self._set_used(seq, tokens)
        return Grow.OK

    def release(self, seq: int) -> None:
        self.releases += 1
        size = self.size.pop(seq)
        self.arena.free(self.extent.pop(seq), size)
        self._reserved -= size
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return self._reserved

    def largest_free_extent_tokens(self) -> int:
        return self.arena.largest_free()

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        # Iteration j needs tokens_now + j slots; it is free of allocator work while that is
        # within every extent, so the window ends before the first sequence outgrows its own:
        # k = min over seqs of (extent − tokens_now) + 1.
        if len(seqs):
            size = np.fromiter((self.size[s] for s in seqs), dtype=np.int64, count=len(seqs))
            headroom = int((size - tokens_now).min()) + 1
        else:
            headroom = max_steps
        k = max(1, min(max_steps, headroom))
        used = self.used_total + len(seqs) * np.arange(k, dtype=np.float64)
        return DecodePlan(k, np.full(k, float(self._reserved)), used)

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        size, used = self.size, self.used
        for s, t in zip(seqs, tokens_after.tolist()):
            assert t <= size[s], f"decode window grew seq {s} past its extent"
            if t > used[s]:
                self.used_total += t - used[s]
                used[s] = t

    # --- compaction --------------------------------------------------------------------
    def compact(self) -> int:
        """Move live extents together (see :mod:`.compaction`); returns the used tokens copied."""
        return compact_allocator(self, self.extent, self.size.__getitem__)

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self._reserved == sum(self.size.values())
        assert self.arena.free_total == self.capacity_tokens - self._reserved
        for s, n in self.size.items():
            assert self.used[s] <= n
