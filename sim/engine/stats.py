"""What one replica measures over a run: one method per event its iteration loops account.

Every loop of :class:`sim.engine.replica.Replica` (per-sequence stepping, fast-forwarded decode
windows, the decode cohort) reports through these methods, so a new per-iteration metric is an
edit here (and, for a time-series column, in ``Recorder.step``). The summary
(:func:`sim.output.metrics.summarize`) reads the totals.

Time integrals are in token·seconds, times in simulated seconds. Each total is a running sum in
the order the events happen, so results are bit-identical whichever path an iteration took.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.replica import Replica
    from sim.output.metrics import Recorder


class ReplicaStats:
    """Totals of one replica, updated by the events below."""

    def __init__(self, replica: Replica, recorder: Recorder):
        self.rep = replica
        self.rec = recorder
        #: ∫ used tokens dt and ∫ reserved tokens dt over busy iterations.
        self.used_token_s = 0.0
        self.reserved_token_s = 0.0
        #: Seconds the replica was running iterations.
        self.busy_s = 0.0
        #: Iterations, and batch changes (an iteration, or a fast-forwarded window of them).
        self.iterations = 0
        self.windows = 0
        #: Seconds charged for allocator work (part of busy time).
        self.alloc_work_s = 0.0
        #: Seconds during which requests waited while the admission breaker was open.
        self.paused_s = 0.0
        #: ∫ external fragmentation dt over busy time (value at each batch change's start).
        self.ext_frag_s = 0.0
        self.compactions = 0
        self.compaction_bytes = 0
        self.compaction_s = 0.0
        #: Each compaction: (time s, bytes moved, copy seconds).
        self.compaction_log: list[tuple[float, int, float]] = []

    def alloc_work(self, seconds: float) -> None:
        """Allocator work priced into an iteration (allocations, copies, zero-fill, swaps)."""
        self.alloc_work_s += seconds

    def iteration(
        self, now: float, dt: float, used: int, reserved: int, frag: float, paused: bool, batch_tokens: int
    ) -> None:
        """One iteration of ``dt`` seconds ended at ``now``: ``used``/``reserved`` tokens and
        external fragmentation ``frag`` while it ran; ``paused``: the breaker held admissions."""
        self.used_token_s += used * dt
        self.reserved_token_s += reserved * dt
        self.busy_s += dt
        self.ext_frag_s += frag * dt
        if paused:
            self.paused_s += dt
        self.iterations += 1
        self.windows += 1
        self.rec.step(self.rep, now, 1, dt, dt, batch_tokens)

    def window(
        self,
        now: float,
        m: int,
        wall: float,
        first_s: float,
        used_s: float,
        reserved_s: float,
        frag: float,
        paused_s: float,
        members: int,
        reserved_peak: int = 0,
    ) -> None:
        """``m`` pure-decode iterations of ``members`` sequences ran as one window of ``wall``
        seconds (the first ``first_s``), ended at ``now``: ``used_s``/``reserved_s`` are their
        token·second integrals, ``frag`` the external fragmentation at its start, ``paused_s`` the
        seconds the breaker was open, ``reserved_peak`` the most slots reserved in any of them."""
        self.used_token_s += used_s
        self.reserved_token_s += reserved_s
        self.busy_s += wall
        self.ext_frag_s += frag * wall
        if paused_s:
            self.paused_s += paused_s
        self.iterations += m
        self.windows += 1
        self.rec.step(self.rep, now, m, wall, first_s, members, reserved_peak)

    def compaction(self, now: float, moved_bytes: int, seconds: float) -> None:
        """A compaction at ``now`` moved ``moved_bytes`` in ``seconds`` of copies."""
        self.compactions += 1
        self.compaction_bytes += moved_bytes
        self.compaction_s += seconds
        self.compaction_log.append((now, moved_bytes, seconds))
