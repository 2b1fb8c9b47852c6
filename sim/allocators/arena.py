"""A contiguous address space of token slots with first-fit placement.

Extents are half-open ``[start, start + size)`` in token slots. Free extents
are kept sorted by start and coalesced on free, so fragmentation is the real
consequence of the order in which extents come and go.
"""

from __future__ import annotations

import bisect


class Arena:
    """First-fit allocator over ``size`` slots."""

    def __init__(self, size: int):
        self.size = size
        self._starts: list[int] = [0]
        self._sizes: list[int] = [size]
        self.free_total = size

    def allocate(self, size: int) -> int | None:
        """Start of a free extent of ``size`` slots (lowest address that fits), or ``None``."""
        for i, s in enumerate(self._sizes):
            if s >= size:
                start = self._starts[i]
                if s == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += size
                    self._sizes[i] -= size
                self.free_total -= size
                return start
        return None

    def free(self, start: int, size: int) -> None:
        """Return ``[start, start+size)``; it must be allocated. Merges with free neighbours."""
        i = bisect.bisect_left(self._starts, start)
        assert i == len(self._starts) or self._starts[i] >= start + size, "double free or overlap"
        assert i == 0 or self._starts[i - 1] + self._sizes[i - 1] <= start, "double free or overlap"
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

    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    def free_extents(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._sizes))
