"""Aggregate bookkeeping for sequences that all decode one token per iteration.

Between two changes of batch composition every decoding sequence grows by
exactly one token per iteration, so an allocator does not need to touch each
sequence each iteration: it needs how many sequences there are, and, for a
block pool, how many of them cross a block boundary at each iteration. A
:class:`Cohort` keeps that aggregate. Member ``s`` that held ``c`` tokens when
it joined at cohort step ``G0`` holds ``a_s + G`` tokens at cohort step ``G``,
with ``a_s = c − G0``; its per-sequence records in the allocator are rebuilt
only when it leaves. This is what makes the engine pay per batch change and
not per token (see ``sim/engine/replica.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class Cohort(ABC):
    """Decoding members of one allocator, advanced together."""

    def __init__(self) -> None:
        #: member seq -> a (tokens held = a + G)
        self.a: dict[int, int] = {}
        #: Σ a over members: the members hold ``sum_a + n·G`` tokens at step G.
        self.sum_a = 0

    @property
    def n(self) -> int:
        return len(self.a)

    def join(self, seq: int, held_tokens: int, G: int) -> None:
        """``seq`` (already holding ``held_tokens`` slots in the allocator) becomes a member at step ``G``."""
        a = held_tokens - G
        self._join(seq, held_tokens, a)
        self.a[seq] = a
        self.sum_a += a

    def leave(self, seq: int, G: int) -> int:
        """``seq`` stops being a member at step ``G``; its allocator records are rebuilt. Returns its tokens."""
        a = self.a.pop(seq)
        self.sum_a -= a
        tokens = a + G
        self._leave(seq, a, tokens)
        return tokens

    @abstractmethod
    def _join(self, seq: int, held_tokens: int, a: int) -> None:
        """Move ``seq`` out of the allocator's per-sequence records into the aggregate."""

    @abstractmethod
    def _leave(self, seq: int, a: int, tokens: int) -> None:
        """Rebuild ``seq``'s per-sequence records for ``tokens`` held."""

    @abstractmethod
    def grantable_steps(self, G: int, max_steps: int) -> int:
        """How many iterations from ``G`` (each growing every member by one token) fit without a refusal, ≤ ``max_steps``."""

    @abstractmethod
    def preview(self, G: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per iteration of ``steps`` starting at ``G`` (grantable): the reserved and used
        token totals of the whole allocator while it runs (after its growth), and its
        allocation events. Changes nothing."""

    def block_events(self, G: int, steps: int) -> list[int]:
        """Allocation events of each of ``steps`` iterations from ``G`` (grantable); changes nothing."""
        return [int(e) for e in self.preview(G, steps)[2]]

    def preview_totals(self, G: int, steps: int) -> tuple[list[float], list[float]]:
        """:meth:`preview`'s reserved and used totals as Python lists."""
        reserved, used, _ = self.preview(G, steps)
        return reserved.tolist(), used.tolist()

    def integrals(
        self, G: int, times: list[float], first: int, stop: int, used_s: float, reserved_s: float
    ) -> tuple[float, float]:
        """``used_s`` and ``reserved_s`` plus Σ used·t and Σ reserved·t (token·seconds) over the
        iterations of ``times[first:stop]``, the first from step ``G`` (all grantable), added left to
        right; changes nothing."""
        reserved, used = self.preview_totals(G, stop - first)
        for i in range(first, stop):
            t = times[i]
            used_s += used[i - first] * t
            reserved_s += reserved[i - first] * t
        return used_s, reserved_s

    def advance_one(self, G: int) -> bool:
        """Grant the iteration from ``G`` if it fits (``True``); else change nothing (``False``)."""
        if self.grantable_steps(G, 1) < 1:
            return False
        self.advance(G, 1)
        return True

    @abstractmethod
    def advance(self, G: int, steps: int) -> None:
        """Grant ``steps`` iterations starting at ``G`` (must be grantable); their work goes to the allocator's pending work."""
