"""Two regions in one KV budget: a static arena of reservations and a paged block pool.

Each sequence lives in one region, which caps how long it may grow there: a reservation holds
``reserve`` tokens; the pool holds up to ``pool_limit_tokens`` per sequence (``None``: as many as
fit). A sequence that outgrows its region **moves** to the other one: its KV is copied once (one
device copy of the tokens it holds, in :attr:`~sim.allocators.base.Allocator.work`, priced by
the cost model's copy curve) and what it held is freed for the next request.

* When the other region has no room now, :meth:`grow` answers ``Grow.EVICT``: the scheduler
  preempts that sequence (recompute or swap, as for any preemption) and it is admitted in the
  region it now belongs to when room frees up (remembered here, so it does not take its old kind
  of place and move again).
* When the other region could never hold it (longer than its per-sequence cap), ``OVERFLOW``: the
  engine applies ``allocator.overflow``.

Two kinds are built on it: ``hybrid_tail`` (:mod:`.hybrid_tail`: reservations for requests
predicted long, the pool for the rest, capped at the long threshold) and ``static`` with
``overflow: fallback`` (:class:`StaticFallbackAllocator`: reservations, and a paged fallback
region for sequences that outgrow theirs).

There is no decode cohort: the engine grows sequences one by one (windows through
:meth:`decode_plan`), and a window ends before any sequence would cross its region's cap, so the
move happens at the same iteration in both engine modes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from mypy_extensions import mypyc_attr

from sim.allocators.base import EXCEEDS_RESERVATION, Allocator, AllocWork, DecodePlan, Grow
from sim.allocators.paged import PagedAllocator
from sim.allocators.static import StaticAllocator


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class TieredAllocator(Allocator):
    """A :class:`StaticAllocator` and a :class:`PagedAllocator` side by side; subclasses choose
    where a new sequence goes (:meth:`_prefer`)."""

    #: Refusal-count prefixes of the two regions (``refusal_counts``).
    static_label = "static."
    pool_label = "paged."

    def __init__(
        self, static: StaticAllocator, pool: PagedAllocator, kv_bytes_per_token: int, *, pool_limit_tokens: int | None
    ):
        self.static = static
        self.pool = pool
        super().__init__(static.capacity_tokens + pool.capacity_tokens, kv_bytes_per_token, composite=True)
        self.pool_limit = pool_limit_tokens if pool_limit_tokens is not None else pool.capacity_tokens
        self._where: dict[int, Allocator] = {}
        #: Sequences evicted because the region they outgrew into was full: admitted there next time.
        self._belongs: dict[int, Allocator] = {}
        #: Sequences that entered each region by a move, their bytes copied, and evictions.
        self.moves_in: Counter[str] = Counter()
        self.moved_bytes: Counter[str] = Counter()
        #: Sequences admitted straight into each region although it was not their preferred one
        #: (already too long for it, or evicted into it).
        self.placed_in: Counter[str] = Counter()
        self.evictions = 0

    # --- placement ---------------------------------------------------------------------------
    def _prefer(self, seq: int) -> Allocator:
        """The region a new sequence goes to when it fits under that region's cap."""
        return self.static

    def _cap(self, part: Allocator) -> int:
        """Tokens one sequence may hold in ``part``."""
        return self.static.reserve if part is self.static else self.pool_limit

    def _other(self, part: Allocator) -> Allocator:
        return self.pool if part is self.static else self.static

    def _name(self, part: Allocator) -> str:
        return "static" if part is self.static else "pool"

    def region_of(self, seq: int) -> int:
        """0: the static arena, 1: the pool (the scheduler preempts within a region: ``Regions``)."""
        return 0 if self._where[seq] is self.static else 1

    def _sync(self, seq: int, part: Allocator) -> None:
        self._set_used(seq, part.used[seq])

    # --- the interface ---------------------------------------------------------------------
    def admit(self, seq: int, tokens: int) -> Grow:
        preferred = self._prefer(seq)
        part = self._belongs.get(seq, preferred)
        if tokens > self._cap(part):
            part = self._other(part)
            if tokens > self._cap(part):
                self.refusals[EXCEEDS_RESERVATION] += 1
                return Grow.OVERFLOW
        r = part.admit(seq, tokens)
        if r is Grow.OK:
            self._belongs.pop(seq, None)
            if part is not preferred:
                self.placed_in[self._name(part)] += 1
            self._where[seq] = part
            self._sync(seq, part)
        return r

    def grow(self, seq: int, tokens: int) -> Grow:
        # The engine calls this for every running sequence at every iteration that is not a
        # decode window: _cap and _sync are written out here (a third of a hybrid plan's CPU).
        part = self._where[seq]
        if tokens > (self.static.reserve if part is self.static else self.pool_limit):
            return self._move(seq, part, tokens)
        r = part.grow(seq, tokens)
        if r is Grow.OK:
            u = part.used[seq]
            used = self.used
            old = used[seq]  # every sequence in a region is counted here (check_invariants)
            if u != old:
                self.used_total += u - old
                used[seq] = u
        return r

    def _move(self, seq: int, src: Allocator, tokens: int) -> Grow:
        """``seq`` outgrew ``src``: copy it into the other region, or say why it cannot go."""
        dst = self._other(src)
        if tokens > self._cap(dst):
            self.refusals[EXCEEDS_RESERVATION] += 1
            return Grow.OVERFLOW
        held = src.used[seq]
        if dst.admit(seq, tokens) is not Grow.OK:
            self.evictions += 1
            self._belongs[seq] = dst
            return Grow.EVICT
        src.release(seq)
        self.releases += 1  # memory became free: a refused admission may fit now
        nbytes = held * self.bpt
        self.work.copy_ops += 1
        self.work.copy_bytes += nbytes
        self.moves_in[self._name(dst)] += 1
        self.moved_bytes[self._name(dst)] += nbytes
        self._where[seq] = dst
        self._sync(seq, dst)
        return Grow.OK

    def release(self, seq: int) -> None:
        self.releases += 1
        self._where.pop(seq).release(seq)
        self._drop_used(seq)

    def reserved_tokens(self) -> int:
        return self.static.reserved_tokens() + self.pool.reserved_tokens()

    def largest_free_extent_tokens(self) -> int:
        # What one new sequence could take: a static slot or the pool's free blocks.
        return max(self.static.largest_free_extent_tokens(), self.pool.largest_free_extent_tokens())

    def largest_free_during(self, grown: np.ndarray) -> np.ndarray | None:
        # A window grows only the pool (static slots are reserved whole at admission): its free
        # blocks shrink by what the members take, the static slots stay as they are.
        return np.maximum(
            float(self.static.largest_free_extent_tokens()), self.pool.largest_free_extent_tokens() - grown
        )

    def refusal_counts(self) -> dict[str, int]:
        c = Counter(self.refusals)
        c.update({f"{self.static_label}{k}": v for k, v in self.static.refusals.items()})
        c.update({f"{self.pool_label}{k}": v for k, v in self.pool.refusals.items()})
        return dict(c)

    def take_work(self) -> AllocWork:
        for part in (self.static, self.pool):
            self.work.add(part.take_work())
        return super().take_work()

    def window_event_s(self, cost) -> float:
        return self.pool.window_event_s(cost)

    def decode_plan(self, seqs: list[int], tokens_now: np.ndarray, max_steps: int) -> DecodePlan:
        # One pass over the members with Python bools (iterating a NumPy mask makes a scalar per
        # element): each region's members in window order, and the mask for their tokens.
        static, where = self.static, self._where
        flags: list[bool] = []
        static_ids: list[int] = []
        pool_ids: list[int] = []
        for s in seqs:
            if where[s] is static:
                flags.append(True)
                static_ids.append(s)
            else:
                flags.append(False)
                pool_ids.append(s)
        in_static = np.array(flags, dtype=bool)
        plans = []
        k = max_steps
        for part, mask, ids in ((static, in_static, static_ids), (self.pool, ~in_static, pool_ids)):
            p = None
            if ids:
                t = tokens_now[mask]
                p = part.decode_plan(ids, t, max_steps)
                # The window ends before a member would outgrow its region (a move copies).
                k = min(k, p.steps, self._cap(part) - int(t.max()) + 1)
            plans.append((part, p))
        k = max(1, k)
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
        return DecodePlan(k, reserved, used, events)

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        static, where = self.static, self._where
        static_idx: list[int] = []
        pool_idx: list[int] = []
        for i, s in enumerate(seqs):
            if where[s] is static:
                static_idx.append(i)
            else:
                pool_idx.append(i)
        for part, idx in ((static, static_idx), (self.pool, pool_idx)):
            if idx:
                part.advance_decode([seqs[i] for i in idx], tokens_after[idx])
        # _sync for every member, written out.
        used = self.used
        total = self.used_total
        for s in seqs:
            u = where[s].used[s]
            total += u - used.get(s, 0)
            used[s] = u
        self.used_total = total

    def check_invariants(self) -> None:
        super().check_invariants()
        self.static.check_invariants()
        self.pool.check_invariants()
        assert set(self._where) == set(self.used)
        assert self.used_total == self.static.used_total + self.pool.used_total
        for s, part in self._where.items():
            assert s in part.used and self.used[s] == part.used[s] <= self._cap(part), (s, self.used[s])

    def move_report(self) -> dict[str, int]:
        """What the summary reports of moves between the regions (counts and bytes)."""
        return {
            "moves_to_static": self.moves_in["static"],
            "moves_to_pool": self.moves_in["pool"],
            "move_copy_bytes": sum(self.moved_bytes.values()),
            "evictions": self.evictions,
        }


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules (tests, registered kinds)
class StaticFallbackAllocator(TieredAllocator):
    """``static`` with ``overflow: fallback``: every sequence gets a reservation; one that outgrows
    it moves, with its KV, to a paged fallback region (``allocator.fallback_fraction`` of KV
    memory) and grows there block by block. A sequence already longer than a reservation when it
    is admitted (a long prompt, a preempted sequence coming back) starts in the fallback region."""

    static_label = ""
    pool_label = "fallback."

    def __init__(self, static: StaticAllocator, fallback: PagedAllocator, kv_bytes_per_token: int):
        super().__init__(static, fallback, kv_bytes_per_token, pool_limit_tokens=None)

    def move_report(self) -> dict[str, int]:
        return {
            "fallback_entries": self.moves_in["pool"] + self.placed_in["pool"],
            "fallback_moves": self.moves_in["pool"],
            "fallback_copy_bytes": self.moved_bytes["pool"],
            "fallback_evictions": self.evictions,
        }
