"""The reference engine's KV memory managers: the paged block pool and the static arena of contiguous
reservations, both preallocated once."""

from __future__ import annotations

import bisect

#: What an admission or a grow answers: done, no memory free now, or more than a static reservation holds.
NO_SPACE, OVERFLOW, OK = "no_space", "overflow", "ok"


class BlockPool:
    """Free-block list + block tables (``paged``)."""

    paged = True

    def __init__(self, num_blocks: int, block_size: int):
        self.B = block_size
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.tables: dict[int, list[int]] = {}
        self.events = 0

    def _take(self, table: list[int], tokens: int) -> str:
        need = -(-tokens // self.B) - len(table)
        if need > len(self.free):
            return NO_SPACE
        for _ in range(need):
            table.append(self.free.pop())
        self.events += max(need, 0)
        return OK

    def admit(self, rid: int, tokens: int) -> str:
        table: list[int] = []
        r = self._take(table, tokens)
        if r == OK:
            self.tables[rid] = table
        return r

    def grow(self, rid: int, tokens: int) -> str:
        return self._take(self.tables[rid], tokens)

    def release(self, rid: int) -> None:
        self.free.extend(reversed(self.tables.pop(rid)))

    def slot(self, rid: int, p: int) -> int:
        return self.tables[rid][p // self.B] * self.B + p % self.B

    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free)

    def reserved_tokens(self) -> int:
        return self.blocks_in_use() * self.B


class StaticArena:
    """``reserve`` contiguous slots per request in one arena, first fit (``static``)."""

    paged = False

    def __init__(self, capacity: int, reserve: int, block_size: int):
        if not 0 < reserve <= capacity:
            raise ValueError(f"reserve {reserve} must be in (0, {capacity}]")
        self.cap, self.R, self.B = capacity, reserve, block_size
        self.starts, self.sizes = [0], [capacity]  # free extents, sorted by start
        self.owner: dict[int, int] = {}
        self.events = 0

    def admit(self, rid: int, tokens: int) -> str:
        if tokens > self.R:
            return OVERFLOW
        for i, s in enumerate(self.sizes):
            if s >= self.R:
                start = self.starts[i]
                if s == self.R:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += self.R
                    self.sizes[i] -= self.R
                self.owner[rid] = start
                self.events += 1
                return OK
        return NO_SPACE

    def grow(self, rid: int, tokens: int) -> str:
        return OVERFLOW if tokens > self.R else OK

    def release(self, rid: int) -> None:
        start, size = self.owner.pop(rid), self.R
        i = bisect.bisect_left(self.starts, start)
        left = i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start
        right = i < len(self.starts) and self.starts[i] == start + size
        if left and right:
            self.sizes[i - 1] += size + self.sizes[i]
            del self.starts[i], self.sizes[i]
        elif left:
            self.sizes[i - 1] += size
        elif right:
            self.starts[i] = start
            self.sizes[i] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)

    def slot(self, rid: int, p: int) -> int:
        return self.owner[rid] + p

    def reserved_tokens(self) -> int:
        return len(self.owner) * self.R

    def blocks_in_use(self) -> float:
        """Reserved slots in block units (what a paged pool of the same memory would count)."""
        return self.reserved_tokens() / self.B
