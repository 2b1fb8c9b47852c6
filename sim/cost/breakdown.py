"""Where a run's iteration time goes: the cost model's parts of every iteration, summed.

``kvsim run --step-breakdown`` wraps the run's cost model in :class:`PartsMeter`, which prices each
iteration as the model does and adds up :meth:`CostModel.step_parts` beside it. It needs
``engine.mode: step`` (one priced iteration per iteration run): a fast-forwarded window prices
iterations that an arrival may cut before they run. The allocator's work and what the replica adds
on its own (the after-prefill excess, background compaction copies) come from the replica's totals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sim.cost.model import BatchShape, CostModel

if TYPE_CHECKING:
    from sim.config import Scenario

#: The parts of an iteration, in the order they are shown, with what each holds.
PARTS: dict[str, str] = {
    "linear": "the layers' GEMMs (QKV, output, MLP; a mixture-of-experts model's experts)",
    "lm_head": "the LM head GEMM, one row per sequence",
    "attention": "decode and prefill attention as a contiguous KV cache would run it",
    "attention_layout": "what the KV layout adds to attention: a paged cache's block-table indirection (0 contiguous)",
    "allreduce": "tensor-parallel all-reduces, two per layer",
    "elementwise": "norms, RoPE, activation and residual adds",
    "host": "host time not hidden behind the GPU (scheduling, sampling, launches)",
    "launch": "launch gaps of iterations run eagerly (beyond the CUDA-graph sizes)",
    "host_bound": "the GPU waiting on the host: an iteration's host-time floor above its GPU work",
    "unsplit": "iteration time of a cost model that does not split it",
    "kv_memory_ops": "the allocator's work: allocations, copies, zero-fill, swaps",
    "other": "the rest of the busy time: the after-prefill excess, background compaction copies",
}


def stepped(sc: Scenario) -> Scenario:
    """``sc`` in ``engine.mode: step``, which a breakdown needs (the same results, priced iteration by
    iteration)."""
    return sc.model_copy(update={"engine": sc.engine.model_copy(update={"mode": "step"})})


class PartsMeter(CostModel):
    """``inner`` as the replicas see it, adding up the parts of every iteration it prices."""

    def __init__(self, inner: CostModel):
        super().__init__()
        self.inner = inner
        self.name, self.calibrated = inner.name, inner.calibrated
        # The same objects, not copies: the inner model counts into them.
        self.out_of_range = inner.out_of_range
        self.after_prefill_s = inner.after_prefill_s
        self.substitutions = inner.substitutions
        #: Seconds per part over every iteration priced, and the priced total.
        self.parts: dict[str, float] = {}
        self.priced_s = 0.0
        self.iterations = 0

    def step_time_s(self, batch: BatchShape) -> float:
        t = self.inner.step_time_s(batch)
        self.priced_s += t
        self.iterations += 1
        for k, v in self.inner.step_parts(batch).items():
            self.parts[k] = self.parts.get(k, 0.0) + v
        return t

    def mixed_step_time_s(self, batch: BatchShape) -> float:
        return self.step_time_s(batch)

    def decode_times_s(
        self, num_seqs: int, kv_tokens: np.ndarray, window_kv_tokens: np.ndarray | None = None
    ) -> np.ndarray:
        raise RuntimeError("a step breakdown prices one iteration at a time (engine.mode: step)")

    def take_back_out_of_range(self, reprice: Callable[[], object]) -> None:
        self.inner.take_back_out_of_range(reprice)

    def step_parts(self, batch: BatchShape) -> dict[str, float]:
        return self.inner.step_parts(batch)

    def copy_time_s(self, nbytes: float) -> float:
        return self.inner.copy_time_s(nbytes)

    def zero_fill_time_s(self, nbytes: float) -> float:
        return self.inner.zero_fill_time_s(nbytes)

    def host_transfer_time_s(self, nbytes: float) -> float:
        return self.inner.host_transfer_time_s(nbytes)

    def alloc_time_s(self, events: int) -> float:
        return self.inner.alloc_time_s(events)

    def describe(self) -> dict:
        return self.inner.describe()

    def profile_provenance(self) -> dict | None:
        return self.inner.profile_provenance()

    def breakdown(self, busy_s: float, memory_s: float) -> dict:
        """The run's breakdown (``summary.json`` ``step_time_breakdown``): ``seconds`` per part, in
        :data:`PARTS` order, with the allocator's work (``memory_s``) and the rest of the replicas'
        busy time (``busy_s``); ``share`` of the busy time each; ``iterations`` priced."""
        seconds = {k: self.parts[k] for k in PARTS if k in self.parts}
        seconds["kv_memory_ops"] = memory_s
        other = busy_s - self.priced_s - memory_s
        # Summation order leaves ulps where nothing else was charged: not a negative part.
        seconds["other"] = 0.0 if abs(other) <= 1e-9 * busy_s else other
        return {
            "busy_s": busy_s,
            "iterations": self.iterations,
            "seconds": seconds,
            "share": {k: (v / busy_s if busy_s > 0 else 0.0) for k, v in seconds.items()},
        }
