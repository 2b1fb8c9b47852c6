"""Static per-request reservation in a contiguous arena.

Each admitted sequence reserves ``reserve_tokens`` contiguous slots up front
(the FasterTransformer/Orca scheme PagedAttention measured against). Growth
inside the reservation is free; growth past it is an ``OVERFLOW`` that the
engine turns into a rejection or a truncation (``overflow`` policy).

``placement`` (:mod:`.placement`) chooses where a reservation goes:
``first_fit`` (default), ``best_fit`` or ``buddy`` (a reservation then owns the
power-of-two block ≥ ``reserve_tokens``: the slack counts as reserved).
``compact()`` slides reservations together (:mod:`.compaction`); it needs the
per-sequence records, so the engine must dissolve the decode cohort first.

For a model with sliding-window layers (``groups``, :class:`sim.catalog.KVGroups`),
slots are tokens of one layer group: a reservation holds ``reserve_tokens`` for
each full-attention group and only ``min(reserve_tokens, window)`` for each
sliding-window group (a ring of the window's tokens), and a sequence's ``used``
counts the slots it keeps. A sequence may still grow to ``reserve_tokens``.
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
from sim.allocators.cohort import Cohort
from sim.allocators.compaction import CompactionMixin, compact_allocator
from sim.allocators.placement import make_arena
from sim.catalog import KVGroups


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class StaticAllocator(Allocator, CompactionMixin):
    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        reserve_tokens: int,
        placement: str = "first_fit",
        groups: KVGroups | None = None,
    ):
        """``groups``: the model's KV cache groups when some layers slide (slots are then tokens of
        one group, ``capacity_tokens`` and ``kv_bytes_per_token`` counted so); ``None``: one slot
        per token."""
        super().__init__(capacity_tokens, kv_bytes_per_token)
        #: Token length each reservation allows (a sequence past it overflows).
        self.reserve = reserve_tokens
        self.groups = groups if groups is not None and groups.sliding else None
        #: Slots one reservation asks for: ``reserve_tokens``, or per group for a sliding-window model.
        self.reserve_slots = reserve_tokens if self.groups is None else self.groups.slots_held(reserve_tokens)
        if not 0 < self.reserve_slots <= capacity_tokens:
            slots = "" if self.groups is None else f" ({self.reserve_slots} slots)"
            raise ValueError(f"reserve_tokens {reserve_tokens}{slots} must be in (0, {capacity_tokens}]")
        self.placement = placement
        self.arena = make_arena(placement, capacity_tokens)
        #: Slots one reservation owns: ``reserve_slots``, or its power-of-two block for buddy.
        self.block = self.arena.granted(self.reserve_slots)
        if self.block > self.arena.max_extent:
            raise ValueError(
                f"reserve_tokens {reserve_tokens} needs a {placement} block of {self.block} slots; "
                f"the largest in {capacity_tokens} is {self.arena.max_extent}"
            )
        self.extent: dict[int, int] = {}  # seq -> start slot
        # A sliding group's slots stop growing at the window: the cohort's n-per-step growth does not apply.
        self.cohort = StaticCohort(self) if self.groups is None else None
        if self.groups is not None:
            self.token_slots = self.groups.count

    def _slots(self, tokens: int) -> int:
        """Slots a sequence of ``tokens`` tokens keeps."""
        return tokens if self.groups is None else self.groups.slots_held(tokens)

    def admit(self, seq: int, tokens: int) -> Grow:
        assert seq not in self.extent, f"seq {seq} admitted twice"
        if tokens > self.reserve:
            self.refusals[EXCEEDS_RESERVATION] += 1
            return Grow.OVERFLOW
        start = self.arena.allocate(self.reserve_slots)
        if start is None:
            stranded = self.arena.free_total >= self.block
            self.refusals[NO_CONTIGUOUS_EXTENT if stranded else INSUFFICIENT_FREE] += 1
            return Grow.NO_SPACE
        self.work.events += 1
        self.extent[seq] = start
        self._set_used(seq, self._slots(tokens))
        return Grow.OK

    def grow(self, seq: int, tokens: int) -> Grow:
        if tokens > self.reserve:
            self.refusals[EXCEEDS_RESERVATION] += 1
            return Grow.OVERFLOW
        slots = self._slots(tokens)
        if slots > self.used[seq]:
            self._set_used(seq, slots)
        return Grow.OK

    def release(self, seq: int) -> None:
        self.releases += 1
        self.arena.free(self.extent.pop(seq), self.reserve_slots)
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return len(self.extent) * self.block

    def largest_free_extent_tokens(self) -> int:
        return self.arena.largest_free()

    def compact(self) -> int:
        """Slide reservations together (see :mod:`.compaction`); returns the used tokens copied."""
        # Sliding-window layer groups have no cohort (their slots stop growing at the window), so
        # every member's ``used`` is exact; only a live cohort keeps its members' tokens aggregate.
        assert self.cohort is None or self.cohort.n == 0, (
            "dissolve the decode cohort before compacting (its members' tokens are aggregate)"
        )
        return compact_allocator(self, self.extent, lambda s: self.block)

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        # Iteration j needs tokens_now + j slots; the reservation caps it.
        headroom = int(self.reserve - tokens_now.max()) + 1 if len(seqs) else max_steps
        k = max(1, min(max_steps, headroom))
        if self.groups is None:
            used = self.used_total + len(seqs) * np.arange(k, dtype=np.float64)
        else:
            g = self.groups
            assert g.window is not None  # groups with sliding layers have a window
            t = tokens_now[None, :] + np.arange(k, dtype=np.int64)[:, None]
            kept = g.full * t + g.sliding * np.minimum(t, g.window)
            now = sum(self._slots(int(x)) for x in tokens_now)
            used = (self.used_total - now + kept.sum(axis=1)).astype(np.float64)
        return DecodePlan(k, np.full(k, float(self.reserved_tokens())), used)

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        for s, t in zip(seqs, tokens_after.tolist()):
            assert t <= self.reserve
            self._set_used(s, self._slots(t))


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class StaticCohort(Cohort):
    """Members of a static arena: growth is free until a member reaches its reservation."""

    def __init__(self, arena: StaticAllocator):
        super().__init__()
        self.arena = arena

    def _join(self, seq: int, held_tokens: int, a: int) -> None:
        assert self.arena.used[seq] == held_tokens
        del self.arena.used[seq]

    def _leave(self, seq: int, a: int, tokens: int) -> None:
        self.arena.used[seq] = tokens

    def grantable_steps(self, G: int, max_steps: int) -> int:
        if not self.a:
            return max_steps
        # Iteration from step G + i needs a + G + i + 1 <= reserve for the member with the largest a.
        return max(0, min(max_steps, self.arena.reserve - max(self.a.values()) - G))

    def preview(self, G: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arena = self.arena
        reserved = np.full(steps, float(arena.reserved_tokens()))
        used = arena.used_total + self.n * np.arange(1, steps + 1, dtype=np.float64)
        return reserved, used, np.zeros(steps)

    def block_events(self, G: int, steps: int) -> list[int]:
        return [0] * steps  # reservations are taken at admission

    def advance(self, G: int, steps: int) -> None:
        assert steps <= self.grantable_steps(G, steps), "cohort grown past a reservation"
        self.arena.used_total += self.n * steps
