"""What the engine requires of a scheduler (:class:`Scheduler`), and what it may offer.

A scheduler owns the replica's queue (``waiting``) and batch (``running``) and forms each
iteration's batch (:meth:`Scheduler.schedule`), asking the allocator for memory as it admits and
grows requests. The engine (``sim/engine/replica.py``) runs the iterations, ends requests and
accounts time; it reads the scheduler only through these members. Kinds are chosen by name
through :mod:`sim.sched.registry`; each is built with the keyword arguments of
:class:`SchedulerFactory`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sim.allocators.base import Allocator
    from sim.config import SchedulerConfig
    from sim.cost.model import BatchShape
    from sim.request import Request
    from sim.sched.continuous import StepPlan
    from sim.workload.predictor import LengthPredictor, PredictionTally


class Scheduler(Protocol):
    """The members the engine uses. Counters are totals over the run, read by the summary."""

    #: Admitted requests in admission order (the engine removes finished ones).
    running: list[Request]
    #: Queued requests, head first (the engine appends arrivals).
    waiting: deque[Request]
    #: KV length attended per token is capped at this many tokens (``None``: full attention).
    kv_cap: int | None
    #: The window of the sliding-window layers of a model that mixes them with full-attention
    #: layers (``None``: none): batch shapes then carry those layers' attended KV
    #: (``BatchShape.decode_window_kv_tokens``) beside the full layers'.
    window_kv_cap: int | None
    #: Simulated seconds of the iteration being formed (set by the engine before ``schedule``).
    now: float
    #: Requests preempted since the engine last looked (it stamps their last progress, clears it).
    now_hint_preempted: list[Request]
    preemptions: int
    swaps_out: int
    swaps_in: int
    #: KV tokens thrown away by recompute preemptions.
    recomputed_tokens: int
    #: The engine may grow decoding sequences as one cohort (``sim/allocators/cohort.py``): it
    #: then calls ``schedule(start=n, batch=...)`` for the rest of the batch and the methods of
    #: :class:`sim.sched.continuous.ContinuousScheduler` it needs (continuous batching only).
    supports_cohort: bool
    #: ``lifo`` or ``lowest_priority`` (``allocator.preemption.victim``); the cohort needs ``lifo``.
    victim_policy: str
    #: How the length predictor's long/short calls compared with the truth (``None``: the allocator
    #: does not route by length, or the scheduler does not predict).
    predictions: PredictionTally | None

    def schedule(self, start: int = 0, batch: BatchShape | None = None) -> StepPlan:
        """Form the next iteration's batch."""
        ...

    def can_admit_more(self) -> bool:
        """Whether a request arriving now could join the batch at the next iteration."""
        ...

    def drop_stale(self, now: float, stale_after_s: float) -> list[Request]:
        """Remove and return waiting requests that have not advanced for ``stale_after_s``."""
        ...


@runtime_checkable
class CompletesTogether(Protocol):
    """A scheduler whose batch members finish together (request-level static batching)."""

    def completing(self, done: list[Request]) -> list[Request]:
        """The requests that finish now, given those whose last token was just computed."""
        ...


class SchedulerFactory(Protocol):
    """How the registry builds a scheduler: a scheduler class's constructor."""

    def __call__(
        self,
        cfg: SchedulerConfig,
        allocator: Allocator,
        *,
        kv_cap: int | None,
        window_kv_cap: int | None,
        swap_capacity_bytes: int,
        hash_block_tokens: int,
        victim_policy: str,
        length_predictor: LengthPredictor | None = None,
    ) -> Scheduler: ...
