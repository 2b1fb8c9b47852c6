"""Compaction of a contiguous arena: move live extents together so free space coalesces.

``first_fit`` / ``best_fit``: :func:`slide_down` moves the live extents towards
address 0 in address order (each to the end of the one before it), so the free
space becomes one extent at the end of the arena. An extent already in place
does not move.

``buddy``: sliding would break block alignment, so compaction re-places every
live block from scratch in an empty buddy arena, largest first
(:func:`repack`). With power-of-two blocks placed largest first, each always
fits (the blocks of size ≥ 2^k fitted in the top-level blocks of size ≥ 2^k
before, and splitting those leaves only pieces ≥ 2^k), and the free space ends
up as the buddy decomposition of what is left at the high addresses.

Cost, charged by :func:`compact_allocator` to the allocator's pending work: a
moved extent copies the tokens its sequence *holds* (``used``), not its whole
reservation: the slack of an extent holds nothing worth copying.
``copy_bytes += moved_used_tokens × kv_bytes_per_token``; no allocation events.
A compaction that changes the layout increments the allocator's ``releases``
(the scheduler retries a refused admission only after that counter moves).

The engine decides when to compact with :func:`should_compact`, the article's
thresholds: utilization (reserved ÷ capacity) below 0.70 *and* external
fragmentation (1 − largest free extent ÷ free) above 0.50.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr, trait

if TYPE_CHECKING:
    from sim.allocators.placement import AnyArena

#: The article's background-compaction thresholds.
BELOW_UTILIZATION = 0.70
ABOVE_FRAGMENTATION = 0.50


def slide_down(extents: dict[Hashable, tuple[int, int]]) -> dict[Hashable, int]:
    """New starts for ``extents`` (key -> (start, size)) packed from 0 in their address order."""
    new: dict[Hashable, int] = {}
    pos = 0
    for key, (start, size) in sorted(extents.items(), key=lambda kv: kv[1][0]):
        assert start >= pos, "extents overlap"
        new[key] = pos
        pos += size
    return new


def repack(extents: dict[Hashable, tuple[int, int]], allocate: Callable[[int], int | None]) -> dict[Hashable, int]:
    """New starts from ``allocate`` (an empty arena's) called largest first, ties by old address."""
    new: dict[Hashable, int] = {}
    for key, (_, size) in sorted(extents.items(), key=lambda kv: (-kv[1][1], kv[1][0])):
        s = allocate(size)
        assert s is not None, "repacking lost a block"
        new[key] = s
    return new


def fragmentation(free_tokens: int, largest_free_tokens: int) -> float:
    """1 − largest free extent ÷ free (0 when nothing is free)."""
    return 0.0 if free_tokens <= 0 else 1.0 - largest_free_tokens / free_tokens


def should_compact(
    utilization: float,
    fragmentation: float,
    *,
    below_utilization: float = BELOW_UTILIZATION,
    above_fragmentation: float = ABOVE_FRAGMENTATION,
) -> bool:
    """The article's trigger: utilization below 70 % and fragmentation above 50 %."""
    return utilization < below_utilization and fragmentation > above_fragmentation


def compact_allocator(alloc, starts: dict[int, int], sizes: Callable[[int], int]) -> int:
    """Compact ``alloc.arena`` holding ``starts`` (seq -> start, updated in place) of ``sizes(seq)`` slots.

    Charges ``copy_bytes`` for the used tokens of every extent whose start changed to
    ``alloc.work`` and returns those tokens. ``alloc.used[seq]`` must be known for
    every sequence (no sequence may sit in an aggregate decode cohort).
    """
    if not starts:
        return 0
    extents = {s: (start, sizes(s)) for s, start in starts.items()}
    new = alloc.arena.compact(extents)
    moved = 0
    for s, start in new.items():
        if start != starts[s]:
            moved += alloc.used[s]
            starts[s] = start
    if moved:
        alloc.work.copy_ops += 1  # one compaction pass, priced as one copy of all moved bytes
        alloc.work.copy_bytes += moved * alloc.bpt
    if new != {s: e[0] for s, e in extents.items()}:
        # The layout changed: a refused admission may fit now (see the scheduler's retry guard).
        alloc.releases += 1
    return moved


@trait
@mypyc_attr(allow_interpreted_subclasses=True)  # its allocators are subclassed outside the compiled modules
class CompactionMixin:
    """``fragmentation`` / ``utilization`` / ``should_compact`` for an allocator with an ``arena``.

    The allocator implements ``compact() -> moved_tokens``.
    """

    # Provided by the allocator the mixin is combined with (a trait, so that compiled allocators
    # can combine it: mypyc allows multiple inheritance only from traits, after the one base class).
    arena: AnyArena
    capacity_tokens: int

    def reserved_tokens(self) -> int:
        raise NotImplementedError

    def fragmentation(self) -> float:
        """1 − largest free extent ÷ free (0 when nothing is free)."""
        return fragmentation(self.arena.free_total, self.arena.largest_free())

    def utilization(self) -> float:
        """Reserved ÷ capacity."""
        return self.reserved_tokens() / self.capacity_tokens

    def should_compact(
        self, below_utilization: float = BELOW_UTILIZATION, above_fragmentation: float = ABOVE_FRAGMENTATION
    ) -> bool:
        return should_compact(
            self.utilization(),
            self.fragmentation(),
            below_utilization=below_utilization,
            above_fragmentation=above_fragmentation,
        )
