"""Request-level static batching (FasterTransformer style), the baseline continuous batching replaced.

A batch forms from the queue (FCFS, up to ``max_num_seqs``, as long as the
allocator can hold every member's *padded* final length); every member is
padded to the batch's longest prompt and decodes until the batch's longest
output is done; nobody joins until the whole batch finishes, and every member
is returned when it does. Memory for the padded length is taken at admission
(the engine cannot preempt mid-batch), so "static rounds up to the longest
sequence" is what the KV numbers show. The token budget does not apply.
"""

from __future__ import annotations

from collections import deque

from sim.allocators.base import Allocator, Grow
from sim.config import SchedulerConfig
from sim.cost.model import BatchShape
from sim.request import PROMPT_EXCEEDS_RESERVATION, Request
from sim.sched.continuous import StepPlan
from sim.workload.predictor import LengthPredictor, PredictionTally


class StaticBatchScheduler:
    """A :class:`sim.sched.interface.Scheduler` that never preempts (members hold their padded
    length from admission), so swap capacity, victim policy, prefix hashes and length predictors
    do not apply."""

    #: The engine's decode cohort assumes continuous batching.
    supports_cohort = False

    def __init__(
        self,
        cfg: SchedulerConfig,
        allocator: Allocator,
        *,
        kv_cap: int | None,
        swap_capacity_bytes: int,
        hash_block_tokens: int,
        victim_policy: str,
        window_kv_cap: int | None = None,
        length_predictor: LengthPredictor | None = None,
    ):
        self.cfg = cfg
        self.alloc = allocator
        self.kv_cap = kv_cap
        self.window_kv_cap = window_kv_cap
        self.victim_policy = victim_policy
        self.now = 0.0
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.preemptions = 0
        self.swaps_out = self.swaps_in = 0
        self.recomputed_tokens = 0
        self._prompt = 0  # padded prompt length of the current batch
        self._steps = 0  # decode steps the batch runs (longest output − 1)
        self._step = 0  # decode steps done
        self._admissions = 0
        self.now_hint_preempted: list[Request] = []
        #: A batch takes every member's padded final length at admission, so nothing is predicted.
        self.predictions: PredictionTally | None = None

    def can_admit_more(self) -> bool:
        return False  # nobody joins a running batch

    def drop_stale(self, now: float, stale_after_s: float) -> list[Request]:
        stale = [r for r in self.waiting if now - r.last_progress > stale_after_s]
        for r in stale:
            self.waiting.remove(r)
        return stale

    def completing(self, done: list[Request]) -> list[Request]:
        """Members finish together, when the batch's last decode step is done."""
        if self.running and self._step >= self._steps and all(r.generated >= r.output for r in self.running):
            return list(self.running)
        return []

    def _form(self) -> tuple[list[Request], list[Request]]:
        batch: list[Request] = []
        rejected: list[Request] = []
        prompt = out = 0
        while self.waiting and len(batch) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            p, o = max(prompt, req.prompt), max(out, req.output)
            final = p + o - 1
            # Every member must hold the padded final length; re-check those already in.
            trial = [r.id for r in batch] + [req.id]
            ok = True
            for r in batch:
                self.alloc.release(r.id)
            granted = []
            for sid in trial:
                res = self.alloc.admit(sid, final)
                if res is not Grow.OK:
                    ok = False
                    if res is Grow.OVERFLOW and sid == req.id and not batch:
                        self.waiting.popleft()
                        req.reason = PROMPT_EXCEEDS_RESERVATION
                        rejected.append(req)
                    break
                granted.append(sid)
            if not ok:
                for sid in granted:
                    self.alloc.release(sid)
                for r in batch:  # restore the batch as it was
                    assert self.alloc.admit(r.id, prompt + out - 1) is Grow.OK
                if rejected and rejected[-1] is req:
                    continue
                break
            self.waiting.popleft()
            batch.append(req)
            prompt, out = p, o
        self._prompt, self._steps, self._step = prompt, max(0, out - 1), 0
        return batch, rejected

    def schedule(self, start: int = 0, batch: BatchShape | None = None) -> StepPlan:
        shape = BatchShape()
        if not self.running:
            members, rejected = self._form()
            for r in members:
                r.seq_no = self._admissions
                self._admissions += 1
            self.running.extend(members)
            # One padded prefill for the whole batch.
            shape.prefill_chunks = [(self._prompt, 0)] * len(members)
            items = [(r, r.prompt) for r in members]
            return StepPlan(items, shape, False, 0, [], rejected, list(members))
        n = len(self.running)
        kv = self._prompt + self._step + 1
        shape.decode_seqs = n
        shape.decode_kv_tokens = n * (kv if self.kv_cap is None else min(kv, self.kv_cap))
        if self.window_kv_cap is not None:
            shape.decode_window_kv_tokens = n * min(kv, self.window_kv_cap)
        self._step += 1
        items = [(r, 1) for r in self.running if r.generated < r.output]
        return StepPlan(items, shape, False, 0, [], [])
