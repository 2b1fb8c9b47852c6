"""What an allocator may do beyond the interface every one implements.

:class:`~sim.allocators.base.Allocator` is what the engine always calls (``admit``, ``grow``,
``release``, ``decode_plan``…). The features below are optional; each is a
:class:`typing.Protocol`, and an allocator has one when it defines its methods — there is
nothing to declare or register. The engine asks once, when it builds the scheduler, a replica
or the router (``alloc if isinstance(alloc, Capability) else None``), keeps the answer (the
allocator typed as that capability, or ``None``) and never looks again, so a feature cannot be
half-present or switched on by accident later. ``isinstance`` on these protocols checks that
every method exists (it is slow: microseconds), so it is never called per iteration.

==================  ==========================================  =========================  ============================
capability          methods                                     used by                    built-in allocators with it
==================  ==========================================  =========================  ============================
PrefixLookup        ``cached_prefix_tokens``                    router (prefix_affinity)   paged + prefix_caching
PrefixAdmission     ``cached_prefix_tokens``, ``admit_prefix``  scheduler (admission)      paged + prefix_caching
PrefixCacheReport   ``hit_tokens``, ``queried_tokens``          summary (prefix_hit_rate)  paged + prefix_caching
Compactable         ``should_compact``, ``compact``             replica (compaction)       static, dynamic
AdmissionBreaker    ``admission_paused``, ``paused_at``         scheduler, replica         hybrid_reserve
LengthHints         ``hint``, ``long_threshold``                scheduler (admission)      hybrid_tail
MoveReport          ``move_report``                             summary                    hybrid_tail, static+fallback
Regions             ``region_of``                               scheduler (preemption)     hybrid_tail, static+fallback
==================  ==========================================  =========================  ============================

What each one means to the engine is in the class docstrings. A scenario that asks for a
feature the allocator lacks still runs, with the plain behaviour (compaction is not run,
prefix-affinity routing sees no cached prefix).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from sim.allocators.base import Grow


@runtime_checkable
class PrefixLookup(Protocol):
    """Reports how much of a prompt is already cached, without changing anything."""

    def cached_prefix_tokens(
        self,
        hashes: Sequence[Hashable],
        hash_block_tokens: int,
        prompt_tokens: int | None = None,
        *,
        tokens: int | None = None,
    ) -> int:
        """Prompt tokens (a multiple of the block size) a request with these block hashes would
        find cached now; at least one of ``tokens`` (default the prompt; prompt and generated
        tokens for a recomputed request) is always left to compute."""
        ...


@runtime_checkable
class PrefixAdmission(PrefixLookup, Protocol):
    """Admits a request sharing the cached blocks of its prefix; the scheduler then starts its
    prefill after the cached tokens (they are shared, not computed)."""

    def admit_prefix(
        self,
        seq: int,
        tokens: int,
        hashes: Sequence[Hashable],
        hash_block_tokens: int,
        now: float | None = None,
        *,
        prompt_tokens: int | None = None,
    ) -> tuple[Grow, int]:
        """``admit`` for ``tokens`` slots, sharing the longest cached run of the prefix: returns
        ``(Grow.OK, cached_tokens)`` or ``(Grow.NO_SPACE, 0)`` with nothing changed. ``now``
        (simulated seconds) never decreases."""
        ...


@runtime_checkable
class PrefixCacheReport(Protocol):
    """Counts cache hits for the summary (``prefix_hit_tokens``, ``prefix_queried_tokens``,
    ``prefix_hit_rate``)."""

    @property
    def hit_tokens(self) -> int:
        """Prompt tokens found cached, over the run."""
        ...

    @property
    def queried_tokens(self) -> int:
        """Cacheable prompt tokens looked up, over the run."""
        ...


@runtime_checkable
class Compactable(Protocol):
    """Moves live extents together (``allocator.compaction``). The replica dissolves the decode
    cohort first and charges the copy bytes the allocator records in ``work``."""

    def should_compact(self, below_utilization: float, above_fragmentation: float) -> bool:
        """Utilisation (reserved ÷ capacity) is below the first and fragmentation (1 − largest
        free extent ÷ free) above the second."""
        ...

    def compact(self) -> int:
        """Compact now; returns the tokens moved."""
        ...


@runtime_checkable
class AdmissionBreaker(Protocol):
    """Holds new requests back while memory is short (a circuit breaker): the scheduler admits
    nothing while :meth:`admission_paused`, and the replica counts that time as
    ``admissions_paused_s``."""

    def admission_paused(self) -> bool:
        """``True`` while new requests must wait."""
        ...

    def paused_at(self, reserved_tokens: np.ndarray) -> np.ndarray:
        """Whether the breaker is open at each of these reserved totals (a fast-forwarded
        window's iterations)."""
        ...


@runtime_checkable
class LengthHints(Protocol):
    """Wants each request's predicted total length before it is admitted. The scheduler predicts
    it with the scenario's ``allocator.length_predictor`` (``sim/workload/predictor.py``) and counts
    how often the long/short call was wrong (summary ``length_predictor``)."""

    #: A request predicted longer than this many tokens in total is routed as long.
    long_threshold: int

    def hint(self, seq: int, total_tokens: int) -> None:
        """``seq`` is predicted to hold ``total_tokens`` tokens (prompt + output) when it finishes;
        called before each admission attempt."""
        ...


@runtime_checkable
class MoveReport(Protocol):
    """Moves sequences between regions of its memory (``sim/allocators/tiered.py``) and counts
    them for the summary."""

    def move_report(self) -> dict[str, int]:
        """Summary key → count or bytes over the run (summed over replicas)."""
        ...


@runtime_checkable
class Regions(Protocol):
    """Keeps sequences in separate regions of memory (``sim/allocators/tiered.py``): when a sequence
    cannot grow, the scheduler preempts a victim from its region (freeing another region's memory
    would not help), by its usual policy among those."""

    def region_of(self, seq: int) -> int:
        """The region a live sequence occupies (equal numbers: the same memory)."""
        ...


#: Every capability, for listings and tests.
CAPABILITIES: tuple[type, ...] = (
    PrefixLookup,
    PrefixAdmission,
    PrefixCacheReport,
    Compactable,
    AdmissionBreaker,
    LengthHints,
    MoveReport,
    Regions,
)


def capabilities_of(obj: object) -> list[str]:
    """Names of the capabilities ``obj`` has."""
    return [p.__name__ for p in CAPABILITIES if isinstance(obj, p)]
