"""The one interface every KV allocation strategy implements.

Sizes are tracked in token slots inside an allocator and reported in bytes
(``slots × kv_bytes_per_token``) by :meth:`Allocator.stats`. A slot is one token
on every layer, or one token in one layer group for allocators that hold a
model's KV per layer group (sliding-window layers beside full-attention ones:
:class:`sim.catalog.KVGroups`). The engine calls
``admit`` when a request first gets memory, ``grow`` before each iteration so
that the slots for the tokens it computes exist, and ``release`` when a
sequence finishes or is preempted. ``decode_plan``/``advance_decode`` let the
fast-forward engine apply many decode iterations at once with the same result
as calling ``grow`` once per iteration.

Optional features (prefix caching, compaction, an admission breaker, length
hints) are protocols in :mod:`.capabilities`: an allocator has one when it
defines its methods. Kinds are chosen by name through :mod:`.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from sim.allocators.cohort import Cohort
    from sim.cost.model import CostModel


class Grow(IntEnum):
    """Outcome of :meth:`Allocator.grow` / :meth:`Allocator.admit`."""

    OK = 0
    #: Not enough free memory now; preempting another sequence may help.
    NO_SPACE = 1
    #: The sequence outgrew what this allocator will ever give it (static reservation).
    OVERFLOW = 2
    #: (``grow`` only) The sequence outgrew its region and the region it must move to has no room
    #: now: preempt this sequence itself (preempting others would not help); it is admitted where it
    #: belongs when room frees up (:mod:`.tiered`). Only allocators without a decode cohort answer it.
    EVICT = 3


#: Refusal reasons counted in stats.
INSUFFICIENT_FREE = "insufficient_free"
#: Enough memory is free in total but no contiguous extent fits: stranded memory.
NO_CONTIGUOUS_EXTENT = "no_contiguous_extent"
EXCEEDS_RESERVATION = "exceeds_reservation"


@dataclass(slots=True)
class AllocatorStats:
    """A snapshot, in bytes. ``used ≤ reserved ≤ capacity`` and ``reserved + free == capacity``."""

    capacity_bytes: int
    reserved_bytes: int
    used_bytes: int
    free_bytes: int
    largest_free_extent_bytes: int
    live_sequences: int
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def external_fragmentation(self) -> float:
        """1 − largest free extent ÷ free (0 when nothing is free)."""
        return 0.0 if self.free_bytes == 0 else 1.0 - self.largest_free_extent_bytes / self.free_bytes


@dataclass(slots=True)
class AllocWork:
    """Memory work an allocator did, for the cost model to charge (counts and bytes)."""

    #: Page or extent allocations (allocation latency each).
    events: int = 0
    #: Device-to-device copies (realloc-and-copy, compaction): count and bytes.
    copy_ops: int = 0
    copy_bytes: int = 0
    #: memsets of reused memory: count and bytes.
    zero_ops: int = 0
    zero_bytes: int = 0
    #: Device→host and host→device transfers (swap): count and bytes.
    swap_ops: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0

    def add(self, other: AllocWork) -> None:
        self.events += other.events
        # Most pending work is allocation events alone (paged decode growth): skip empty kinds.
        if other.copy_ops or other.copy_bytes:
            self.copy_ops += other.copy_ops
            self.copy_bytes += other.copy_bytes
        if other.zero_ops or other.zero_bytes:
            self.zero_ops += other.zero_ops
            self.zero_bytes += other.zero_bytes
        if other.swap_ops or other.swap_out_bytes or other.swap_in_bytes:
            self.swap_ops += other.swap_ops
            self.swap_out_bytes += other.swap_out_bytes
            self.swap_in_bytes += other.swap_in_bytes

    def any(self) -> bool:
        return bool(self.events or self.copy_ops or self.zero_ops or self.swap_ops)

    def time_s(self, cost: CostModel) -> float:
        """Seconds this work costs on ``cost`` (a :class:`sim.cost.model.CostModel`).

        Each copy, memset and transfer is its own operation: curves with a fixed
        per-call cost charge it once per operation (at the mean size).
        """
        t = 0.0
        if self.events:
            t += cost.alloc_time_s(self.events)
        if self.copy_ops:
            t += self.copy_ops * cost.copy_time_s(self.copy_bytes / self.copy_ops)
        if self.zero_ops:
            t += self.zero_ops * cost.zero_fill_time_s(self.zero_bytes / self.zero_ops)
        if self.swap_ops:
            t += self.swap_ops * cost.host_transfer_time_s((self.swap_out_bytes + self.swap_in_bytes) / self.swap_ops)
        return t


@dataclass(slots=True)
class DecodePlan:
    """What ``k`` pure-decode iterations do to the allocator.

    Iteration ``j`` (0-based) of the window computes one token for every
    sequence; ``reserved_tokens[j]`` and ``used_tokens[j]`` are the totals held
    during that iteration.
    """

    steps: int
    reserved_tokens: np.ndarray
    used_tokens: np.ndarray
    #: Allocation events of each iteration after the first (length ``steps``; entry 0 is
    #: already in the allocator's pending work); ``None`` = none.
    events: np.ndarray | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class Allocator(ABC):
    """Base: per-sequence used-token bookkeeping and refusal counting."""

    #: Aggregate decode growth (:mod:`.cohort`); ``None`` = the engine grows sequences one by one.
    cohort: Cohort | None = None

    # What a subclass declares about itself comes through the constructor, not class attributes:
    # compiled code reads this class's own slots, which a class attribute of an interpreted
    # subclass would not change.
    def __init__(
        self, capacity_tokens: int, kv_bytes_per_token: int, *, single_extent: bool = False, composite: bool = False
    ):
        """``single_extent``: every free slot serves any sequence (a block pool), so the largest
        free extent is all that is free and external fragmentation is 0 (the engine skips it).
        ``composite``: built from allocators that keep their own pending ``work``, which this
        class's ``take_work`` gathers."""
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        self.single_extent = single_extent
        #: Bytes of one slot: a token (of one layer group where KV is held per group).
        self.bpt = kv_bytes_per_token
        #: Slots one token of a sequence takes at most: one per layer group (1 unless an allocator
        #: holds KV per layer group). Whole-output promises and swaps count a token so.
        self.token_slots = 1
        self.capacity_tokens = capacity_tokens
        self.used: dict[int, int] = {}
        self.used_total = 0
        self.refusals: Counter[str] = Counter()
        #: Incremented by every release: memory can only have become free if this moved.
        self.releases = 0
        #: Work done since the engine last charged it (drained every iteration) and in total.
        self.work = AllocWork()
        self.work_total = AllocWork()
        #: Pending work is this allocator's own ``work`` (composites gather their parts' in take_work).
        self._own_work = not composite

    # --- the interface -------------------------------------------------------------
    @abstractmethod
    def admit(self, seq: int, tokens: int) -> Grow:
        """Give a new sequence memory for its first ``tokens`` tokens.

        On anything but ``OK`` nothing changes and the reason is counted.
        """

    @abstractmethod
    def grow(self, seq: int, tokens: int) -> Grow:
        """Make sure ``seq`` holds slots for ``tokens`` tokens in total (never shrinks)."""

    @abstractmethod
    def release(self, seq: int) -> None:
        """Return everything ``seq`` holds to the free pool."""

    @abstractmethod
    def reserved_tokens(self) -> int:
        """Token slots owned by live sequences."""

    @abstractmethod
    def largest_free_extent_tokens(self) -> int:
        """The longest run of free slots one new sequence could take contiguously."""

    def largest_free_during(self, grown: np.ndarray) -> np.ndarray | None:
        """:meth:`largest_free_extent_tokens` while each iteration of a decode window runs,
        ``grown[i]`` tokens reserved since its start (the state now is the window's start), or
        ``None`` where growth inside a window does not change it."""
        return None

    @abstractmethod
    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        """How many decode iterations (≤ ``max_steps``) can run without a refusal.

        ``tokens_now[i]`` is what ``seqs[i]`` holds for the first iteration of
        the window, already granted by :meth:`grow`; iteration ``j`` needs
        ``tokens_now + j``. Always at least 1 step. Changes nothing.
        Iterations after the first may only be included if their growth does
        no allocator work other than ``DecodePlan.events`` (allocation events,
        charged per iteration through :meth:`window_work_time_s`): anything
        else (a copy, a compaction) must end the window before it.
        """

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        """Apply the growth of a decode window: ``grow(seq, tokens_after[i])`` for all, all of which must succeed."""
        for s, t in zip(seqs, tokens_after.tolist()):
            r = self.grow(s, t)
            assert r is Grow.OK, f"decode window growth refused for seq {s}"

    def refusal_counts(self) -> dict[str, int]:
        return dict(self.refusals)

    def take_work(self) -> AllocWork:
        """Work pending since the last call, moved into the run's total."""
        w = self.work
        if not w.any():
            return w  # nothing pending (the common case in decode windows): no new object
        self.work = AllocWork()
        self.work_total.add(w)
        return w

    def take_work_s(self, cost: CostModel) -> float:
        """:meth:`take_work`, priced on ``cost`` (seconds). Allocation events alone (a block pool's
        growth: most batch changes) move into the totals in place, without a new record."""
        w = self.work
        if w.copy_ops or w.zero_ops or w.swap_ops or not self._own_work:
            return self.take_work().time_s(cost)
        events = w.events
        if not events:
            return 0.0
        w.events = 0
        self.work_total.events += events
        return cost.alloc_time_s(events)

    def window_event_s(self, cost: CostModel) -> float:
        """Seconds of allocator work per allocation event inside a decode window."""
        return cost.alloc_time_s(1)

    def window_work_time_s(self, cost: CostModel, events: np.ndarray) -> np.ndarray:
        """Seconds of allocator work per iteration of a decode window, given its allocation events.

        Allocation latency is charged per event, so one event's price times the counts.
        """
        return events * self.window_event_s(cost)

    # --- derived -------------------------------------------------------------------
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.reserved_tokens()

    def stats(self) -> AllocatorStats:
        reserved = self.reserved_tokens()
        return AllocatorStats(
            capacity_bytes=self.capacity_tokens * self.bpt,
            reserved_bytes=reserved * self.bpt,
            used_bytes=self.used_total * self.bpt,
            free_bytes=(self.capacity_tokens - reserved) * self.bpt,
            largest_free_extent_bytes=self.largest_free_extent_tokens() * self.bpt,
            live_sequences=len(self.used),
            refusals=dict(self.refusals),
        )

    def _set_used(self, seq: int, tokens: int) -> None:
        self.used_total += tokens - self.used.get(seq, 0)
        self.used[seq] = tokens

    def _drop_used(self, seq: int) -> None:
        self.used_total -= self.used.pop(seq)

    def check_invariants(self) -> None:
        """Assert the accounting identities; used by tests after every operation."""
        reserved = self.reserved_tokens()
        assert 0 <= self.used_total <= reserved <= self.capacity_tokens, (
            self.used_total,
            reserved,
            self.capacity_tokens,
        )
        assert self.used_total == sum(self.used.values())
        assert self.largest_free_extent_tokens() <= self.capacity_tokens - reserved
