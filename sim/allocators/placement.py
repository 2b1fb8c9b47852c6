"""Placement policies over a contiguous space of token slots.

An arena hands out extents ``[start, start + granted(size))`` of a space of
``size`` token slots. All arenas share one interface:

* ``allocate(size) -> start | None``: a free extent for ``size`` slots;
* ``free(start, size)``: give back what ``allocate(size)`` (or a successful
  ``try_extend(start, _, size)``) returned; ``size`` is the size asked for;
* ``try_extend(start, size, new_size) -> bool``: grow an extent in place when
  the slots right after it are free (nothing changes when it cannot);
* ``granted(size)``: the slots a request of ``size`` actually occupies (the
  size itself, or the power-of-two block for buddy): what an allocator reports
  as reserved;
* ``largest_free()``: the largest extent one request could get now;
* ``free_total``; ``free_extents()``: ``(start, size)`` sorted by start;
* ``max_extent``: the largest extent any request could ever get;
* ``compact(extents) -> new starts``: see :mod:`.compaction`;
* ``check()``: internal consistency (tests).

Policies (:func:`make_arena`):

``first_fit``
    the lowest-addressed free extent that fits.
``best_fit``
    the smallest free extent that fits, lowest address on ties.
``buddy``
    power-of-two blocks that split in halves and merge with their free buddy.
    A request takes the smallest power-of-two block ≥ its size, so internal
    fragmentation (block − size) is real and counted as reserved. The arena
    is *not* rounded down to a power of two: its size is split into top-level
    blocks, one per set bit of the size, largest first at address 0 (so each
    is aligned to its own size). Top-level blocks never merge with each other,
    so the largest possible extent (``max_extent``) is the largest power of
    two ≤ the size. ``largest_free()`` is the largest free *block*: two
    adjacent free blocks that are not buddies cannot serve one request.

Free extents are kept as sorted lists, so every operation is O(number of free
extents) at worst, never O(capacity).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable

from sim.allocators import compaction

PLACEMENTS = ("first_fit", "best_fit", "buddy")


class FitArena:
    """Free extents sorted by start and coalesced on free; subclasses choose the extent."""

    placement = ""

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("arena size must be positive")
        self.size = size
        self.max_extent = size
        self._starts: list[int] = [0]
        self._sizes: list[int] = [size]
        self.free_total = size

    def granted(self, size: int) -> int:
        return size

    def _pick(self, size: int) -> int | None:
        """Index of the free extent that serves ``size`` slots, or ``None``."""
        raise NotImplementedError

    def allocate(self, size: int) -> int | None:
        """Start of a free extent of ``size`` slots chosen by the policy, or ``None``."""
        i = self._pick(size)
        if i is None:
            return None
        start = self._starts[i]
        if self._sizes[i] == size:
            del self._starts[i], self._sizes[i]
        else:
            self._starts[i] += size
            self._sizes[i] -= size
        self.free_total -= size
        return start

    def free(self, start: int, size: int) -> None:
        """Return ``[start, start+size)``; it must be allocated. Merges with free neighbours."""
        i = bisect.bisect_left(self._starts, start)
        assert i == len(self._starts) or self._starts[i] >= start + size, "double free or overlap"
        assert i == 0 or self._starts[i - 1] + self._sizes[i - 1] <= start, "double free or overlap"
        assert 0 <= start and start + size <= self.size, "extent outside the arena"
        merge_left = i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start
        merge_right = i < len(self._starts) and self._starts[i] == start + size
        if merge_left and merge_right:
            self._sizes[i - 1] += size + self._sizes[i]
            del self._starts[i], self._sizes[i]
        elif merge_left:
            self._sizes[i - 1] += size
        elif merge_right:
            self._starts[i] = start
            self._sizes[i] += size
        else:
            self._starts.insert(i, start)
            self._sizes.insert(i, size)
        self.free_total += size

    def try_extend(self, start: int, size: int, new_size: int) -> bool:
        """Grow ``[start, start+size)`` to ``new_size`` slots in place if the slots after it are free."""
        extra = new_size - size
        if extra <= 0:
            return True
        end = start + size
        i = bisect.bisect_left(self._starts, end)
        if i == len(self._starts) or self._starts[i] != end or self._sizes[i] < extra:
            return False
        if self._sizes[i] == extra:
            del self._starts[i], self._sizes[i]
        else:
            self._starts[i] += extra
            self._sizes[i] -= extra
        self.free_total -= extra
        return True

    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    def free_extents(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._sizes))

    def compact(self, extents: dict[Hashable, tuple[int, int]]) -> dict[Hashable, int]:
        """Slide the live ``extents`` (key -> (start, granted size)) towards 0 in address order.

        Returns every key's new start; afterwards the free space is one extent at the end.
        """
        new = compaction.slide_down(extents)
        live = sum(size for _, size in extents.values())
        assert live == self.size - self.free_total, "compact() was not given every live extent"
        self._starts = [live] if live < self.size else []
        self._sizes = [self.size - live] if live < self.size else []
        return new

    def check(self) -> None:
        assert len(self._starts) == len(self._sizes)
        assert sum(self._sizes) == self.free_total
        prev_end = -1
        for s, n in zip(self._starts, self._sizes):
            assert n > 0 and s > prev_end, "free extents unsorted, empty or not coalesced"
            prev_end = s + n
        assert prev_end <= self.size


class FirstFitArena(FitArena):
    """The lowest-addressed free extent that fits."""

    placement = "first_fit"

    def _pick(self, size: int) -> int | None:
        for i, s in enumerate(self._sizes):
            if s >= size:
                return i
        return None


class BestFitArena(FitArena):
    """The smallest free extent that fits; the lowest address among equals."""

    placement = "best_fit"

    def _pick(self, size: int) -> int | None:
        best = None
        best_size = 0
        for i, s in enumerate(self._sizes):
            if s >= size and (best is None or s < best_size):
                best, best_size = i, s
                if s == size:
                    break
        return best


def _order(n: int) -> int:
    """Smallest k with 2**k ≥ n (n ≥ 1)."""
    return (n - 1).bit_length()


class BuddyArena:
    """Binary buddy allocator over ``size`` slots split into power-of-two top-level blocks."""

    placement = "buddy"

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("arena size must be positive")
        self.size = size
        self.max_extent = 1 << (size.bit_length() - 1)
        # Top-level blocks, one per set bit, largest first: each starts at a multiple of its size.
        self._top_starts: list[int] = []
        self._top_orders: list[int] = []
        pos = 0
        for k in range(size.bit_length() - 1, -1, -1):
            if size >> k & 1:
                self._top_starts.append(pos)
                self._top_orders.append(k)
                pos += 1 << k
        self._top = dict(zip(self._top_starts, self._top_orders))
        self._init_free()

    def _init_free(self) -> None:
        #: order -> sorted starts of free blocks of that order
        self._free: list[list[int]] = [[] for _ in range(self.max_extent.bit_length())]
        #: start -> order of every free block
        self._free_block: dict[int, int] = {}
        #: start -> order of every allocated block
        self._alloc: dict[int, int] = {}
        self.free_total = 0
        for s, k in zip(self._top_starts, self._top_orders):
            self._add_free(s, k)

    def initial_blocks(self) -> list[tuple[int, int]]:
        """The top-level blocks ``(start, size)``: the free blocks of an empty arena."""
        return [(s, 1 << k) for s, k in zip(self._top_starts, self._top_orders)]

    def granted(self, size: int) -> int:
        return 1 << _order(size)

    def _add_free(self, start: int, k: int) -> None:
        bisect.insort(self._free[k], start)
        self._free_block[start] = k
        self.free_total += 1 << k

    def _take_free(self, start: int, k: int) -> None:
        lst = self._free[k]
        del lst[bisect.bisect_left(lst, start)]
        del self._free_block[start]
        self.free_total -= 1 << k

    def allocate(self, size: int) -> int | None:
        """Start of the smallest free block ≥ ``size`` (lowest address among them), split down to fit."""
        want = _order(size)
        for k in range(want, len(self._free)):
            if self._free[k]:
                break
        else:
            return None
        start = self._free[k][0]
        self._take_free(start, k)
        while k > want:  # keep the lower half, free the upper half
            k -= 1
            self._add_free(start + (1 << k), k)
        self._alloc[start] = want
        return start

    def free(self, start: int, size: int) -> None:
        """Return the block at ``start`` (allocated for ``size``); merges with free buddies."""
        k = self._alloc.pop(start)
        assert k == _order(size), f"block at {start} has order {k}, freed as size {size}"
        while self._top.get(start) != k:
            buddy = start ^ (1 << k)
            if self._free_block.get(buddy) != k:
                break
            self._take_free(buddy, k)
            start = min(start, buddy)
            k += 1
        self._add_free(start, k)

    def try_extend(self, start: int, size: int, new_size: int) -> bool:
        """Grow the block at ``start`` to the block for ``new_size`` in place: possible when
        ``start`` is aligned to the new block and every upper buddy on the way is free."""
        k = self._alloc[start]
        assert k == _order(size)
        want = _order(new_size)
        if want <= k:
            return True
        if start % (1 << want):
            return False
        t = bisect.bisect_right(self._top_starts, start) - 1
        if self._top_orders[t] < want:
            return False
        for j in range(k, want):
            if self._free_block.get(start + (1 << j)) != j:
                return False
        for j in range(k, want):
            self._take_free(start + (1 << j), j)
        self._alloc[start] = want
        return True

    def largest_free(self) -> int:
        for k in range(len(self._free) - 1, -1, -1):
            if self._free[k]:
                return 1 << k
        return 0

    def free_extents(self) -> list[tuple[int, int]]:
        """Free blocks ``(start, size)`` sorted by start (adjacent non-buddies are not merged)."""
        return sorted((s, 1 << k) for s, k in self._free_block.items())

    def allocated_blocks(self) -> list[tuple[int, int]]:
        return sorted((s, 1 << k) for s, k in self._alloc.items())

    def compact(self, extents: dict[Hashable, tuple[int, int]]) -> dict[Hashable, int]:
        """Re-place every live block from scratch, largest first (ties: lower old address first).

        Greedy largest-first placement of power-of-two blocks always succeeds when the
        blocks fitted before, and leaves them packed at the low addresses of the top-level
        blocks; the free space is then the buddy decomposition of what is left (not one
        extent unless that is a power of two).
        """
        assert sum(size for _, size in extents.values()) == self.size - self.free_total, (
            "compact() was not given every live extent"
        )
        self._init_free()
        return compaction.repack(extents, self.allocate)

    def check(self) -> None:
        total = 0
        for k, lst in enumerate(self._free):
            assert lst == sorted(lst)
            for s in lst:
                assert self._free_block[s] == k
                assert s % (1 << k) == 0, "free block not aligned to its size"
                total += 1 << k
        assert len(self._free_block) == sum(map(len, self._free))
        assert total == self.free_total
        for s, k in self._alloc.items():
            assert s % (1 << k) == 0, "allocated block not aligned to its size"
        # No two free buddies of the same order (they would have merged).
        for s, k in self._free_block.items():
            if self._top.get(s) != k:
                assert self._free_block.get(s ^ (1 << k)) != k, f"free buddies at {s} order {k} not merged"


AnyArena = FitArena | BuddyArena

_ARENAS: dict[str, type[AnyArena]] = {"first_fit": FirstFitArena, "best_fit": BestFitArena, "buddy": BuddyArena}


def make_arena(placement: str, size: int) -> AnyArena:
    """An arena of ``size`` slots with ``placement`` ∈ ``first_fit | best_fit | buddy``."""
    try:
        cls = _ARENAS[placement]
    except KeyError:
        raise ValueError(f"placement {placement!r}: expected one of {', '.join(PLACEMENTS)}") from None
    return cls(size)
