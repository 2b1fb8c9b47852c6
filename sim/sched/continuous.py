"""Continuous batching, vLLM-v1 style.

Each iteration: running requests first, in admission order, each asking for
its next tokens (a prefill chunk under the token budget, or one decode
token); when the allocator cannot grow a request, the most recently admitted
running request is preempted by recompute (its memory freed, it goes back to
the head of the queue) until the grow succeeds or the request itself was the
victim. Then, only if nothing was preempted, waiting requests are admitted in
FCFS order while sequences, token budget and memory allow; the first one
that does not fit stops admission (no overtaking).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from sim.allocators.base import Allocator, Grow
from sim.allocators.capabilities import AdmissionBreaker, LengthHints, PrefixAdmission, Regions
from sim.config import SchedulerConfig
from sim.cost.model import BatchShape
from sim.request import PROMPT_EXCEEDS_RESERVATION, PROMPT_EXCEEDS_TOKEN_BUDGET, Request
from sim.workload.predictor import LengthPredictor, PredictionTally, PromptPredictor


@dataclass(slots=True, init=False)
class StepPlan:
    """One iteration: ``items`` are ``(request, new_tokens)``."""

    items: list[tuple[Request, int]]
    batch: BatchShape
    #: Every item is a one-token decode; no prefill chunk.
    pure_decode: bool
    #: Requests preempted while forming this batch.
    preempted: int
    #: Running requests that outgrew a static reservation (to truncate or reject), and
    #: waiting ones whose prompt alone exceeds it.
    overflowed: list[Request] = field(default_factory=list)
    rejected_at_admission: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    #: The allocator's circuit breaker held admissions back this iteration.
    paused: bool = False

    # An explicit __init__ (``init=False``): the compiled build (sim/native.py) runs it natively, a
    # generated dataclass __init__ would stay interpreted. Same parameters as the fields.
    def __init__(
        self,
        items: list[tuple[Request, int]],
        batch: BatchShape,
        pure_decode: bool,
        preempted: int,
        overflowed: list[Request] | None = None,
        rejected_at_admission: list[Request] | None = None,
        admitted: list[Request] | None = None,
        paused: bool = False,
    ):
        self.items, self.batch, self.pure_decode, self.preempted = items, batch, pure_decode, preempted
        self.overflowed = [] if overflowed is None else overflowed
        self.rejected_at_admission = [] if rejected_at_admission is None else rejected_at_admission
        self.admitted = [] if admitted is None else admitted
        self.paused = paused


class ContinuousScheduler:
    """A :class:`sim.sched.interface.Scheduler`; the only kind the engine's decode cohort runs with."""

    supports_cohort = True

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
        #: Prefill chunks share iterations with decodes (vLLM); ``False``: an iteration either prefills
        #: (continuing chunks and admissions, decodes wait) or decodes (SGLang's default). The engine's
        #: decode cohort assumes mixed iterations, so prefill-apart scheduling runs per iteration.
        self.mixed = cfg.mixed_batches is not False
        if not self.mixed:
            self.supports_cohort = False
        #: Admit a request only when KV for its prompt and whole output fits beside every running
        #: request's (TensorRT-LLM's GUARANTEED_NO_EVICT): running requests then never need preempting.
        self.reserve_output = bool(cfg.reserve_output)
        #: ``swap`` preemption: host bytes available to hold preempted sequences' KV (0 = recompute).
        self.swap_capacity_bytes = swap_capacity_bytes
        #: ``lifo`` or ``lowest_priority`` (see PreemptionConfig.victim).
        self.victim_policy = victim_policy
        self.swap_used_bytes = 0
        self.swaps_out = 0
        self.swaps_in = 0
        #: KV tokens thrown away by recompute preemptions (computed again later).
        self.recomputed_tokens = 0
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        #: KV length attended per token is capped by a sliding window (``None`` = full).
        self.kv_cap = kv_cap
        #: The window of a mixed model's sliding-window layers (``None``: no such layers).
        self.window_kv_cap = window_kv_cap
        self.preemptions = 0
        # (request id, tokens asked, allocator releases) of the last refused admission: asking
        # again before anything was released cannot succeed, and would count a refusal per iteration.
        self._refused: tuple[int, int, int] | None = None
        self._admissions = 0
        #: Prefix caching: tokens per request hash block, and the time of this iteration (LRU).
        self.hash_block_tokens = hash_block_tokens
        self.now = 0.0
        # The allocator's optional features (sim/allocators/capabilities.py), looked up once.
        self._prefix: PrefixAdmission | None = allocator if isinstance(allocator, PrefixAdmission) else None
        self._hints: LengthHints | None = allocator if isinstance(allocator, LengthHints) else None
        #: Predicts each request's total length for an allocator that routes by it (``None``: none does).
        self.predictor: LengthPredictor | None = None
        #: The predictor's long/short calls against the truth, at each request's first admission.
        self.predictions: PredictionTally | None = None
        if self._hints is not None:
            self.predictor = length_predictor if length_predictor is not None else PromptPredictor()
            self.predictions = PredictionTally(self._hints.long_threshold)
        self._breaker: AdmissionBreaker | None = allocator if isinstance(allocator, AdmissionBreaker) else None
        self._regions: Regions | None = allocator if isinstance(allocator, Regions) else None
        #: Prefix caching: blocks the pool hands out before it evicts a cached-free block of a prefix
        #: (``PrefixCachingPagedAllocator.blocks_before_evicting``; ``None``: no prefix caching).
        self._evict_guard: Callable[[Sequence[Hashable], int, int, int, int], tuple[int, int] | None] | None = (
            getattr(allocator, "blocks_before_evicting", None) if self._prefix is not None else None
        )
        #: Requests preempted since the engine last looked (it stamps their last progress).
        self.now_hint_preempted: list[Request] = []

    @property
    def evicts_queue_head_prefix(self) -> bool:
        """Prefix caching: blocks running sequences take may evict a cached-free block of the prefix
        the head of the queue finds cached, so a decode window must heed
        :meth:`admission_steady_blocks` (``False``: no prefix caching)."""
        return self._evict_guard is not None

    def can_admit_more(self) -> bool:
        return len(self.running) < self.cfg.max_num_seqs

    def _chunk(self, req: Request, budget: int) -> int | None:
        """Tokens ``req`` computes this iteration under ``budget``: all it has left, or the budget
        when chunked prefill splits it; ``None`` when it does not fit and may not be split."""
        need = req.prompt + req.generated - req.computed
        if need > budget:
            if not self.cfg.chunked_prefill:
                return None
            need = budget
        return need

    def _never_fits(self, req: Request) -> bool:
        """Unchunked, ``req``'s remaining tokens exceed the whole budget: no iteration can take it."""
        cfg = self.cfg
        return not cfg.chunked_prefill and req.prompt + req.generated - req.computed > cfg.max_num_batched_tokens

    def admission_blocked(self, start: int) -> bool:
        """``schedule(start=start)`` with only the ``start`` cohort requests running would admit
        nothing and change nothing (no queue, no free sequence slot or token budget, or the head
        of the queue was refused and nothing was released since). Callers exclude allocators with
        an admission breaker; prefix caching answers ``False`` (its chunk size depends on the cache)."""
        waiting = self.waiting
        if not waiting:
            return True
        if self._prefix is not None:
            return False
        head = self._head_chunk(start)
        if head is None:
            return True
        req, need, _ = head
        if need is None:
            return not self._never_fits(req)  # schedule() turns such a request away
        return self._refused == (req.id, need, self.alloc.releases)

    def _head_chunk(self, start: int) -> tuple[Request, int | None, int] | None:
        """The queue's head, its chunk (``None``: none fits) and the token budget of the next
        ``schedule(start=start)``, when that schedule would come to the head (a queue, a free
        sequence slot and budget left); ``None`` otherwise."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens - start
        if not self.waiting or len(self.running) >= cfg.max_num_seqs or budget <= 0:
            return None
        req = self.waiting[0]
        return req, self._chunk(req, budget), budget

    def _admission_need(self, req: Request, need: int, budget: int) -> int:
        """The tokens ``schedule`` asks the allocator to admit ``req`` with (its refusal key):
        ``need`` (its chunk under ``budget``), or with prefix caching the chunk after what it finds
        cached now (read-only)."""
        prefix = self._prefix
        if prefix is not None and req.hashes and not req.computed:
            cached = prefix.cached_prefix_tokens(
                req.hashes, self.hash_block_tokens, req.prompt, tokens=req.prompt + req.generated
            )
            return min(req.prompt + req.generated - cached, budget)
        return need

    def _head_refused(self, start: int) -> tuple[Request, int, int] | None:
        """The queue's head, its chunk and the budget of the next ``schedule(start=start)``, when
        that schedule would come to it (a free sequence slot, budget, a chunk that fits, room for
        its whole output under ``reserve_output``) and it is the request refused last; ``None``
        otherwise."""
        waiting, refused = self.waiting, self._refused
        if not waiting or refused is None or refused[0] != waiting[0].id:
            return None
        head = self._head_chunk(start)
        if head is None:
            return None
        req, need, budget = head
        if need is None or (self.reserve_output and not self._fits_whole_output(req)):
            return None
        return req, need, budget

    def admission_retry_due(self, start: int) -> bool:
        """The next ``schedule(start=start)`` (nothing else changing) would ask the allocator again
        to admit the head of the queue it refused last: memory was released since, or the head
        asks for other tokens (prefix caching: cached blocks it would have shared were evicted).
        Stepping retries there, so a decode window must end before it. Whether an admission
        breaker holds admissions back then is the caller's to check."""
        head = self._head_refused(start)
        if head is None:
            return False
        req, need, budget = head
        return self._refused != (req.id, self._admission_need(req, need, budget), self.alloc.releases)

    def admission_steady_blocks(self, start: int, within: int) -> int | None:
        """Blocks running sequences may take from the free pool before the head of the queue,
        refused last and unchanged since, would ask for other tokens at ``schedule(start=start)``:
        with prefix caching, the next block taken after these evicts a cached-free block of the
        prefix it finds cached, so its chunk grows and stepping asks again (a refusal each time,
        nothing having been freed). ``None``: no such limit (no prefix caching, the chunk is the
        whole budget either way, or no cached-free block of its prefix is that close in the
        eviction order: within ``within`` blocks)."""
        if self._evict_guard is None:
            return None
        head = self._head_refused(start)
        if head is None:
            return None
        req, need, budget = head
        if not req.hashes or req.computed:
            return None
        tokens = req.prompt + req.generated
        found = self._evict_guard(req.hashes, self.hash_block_tokens, req.prompt, tokens, within)
        if found is None:
            return None
        cached, steady = found
        need = min(tokens - cached, budget)
        if need >= budget or self._refused != (req.id, need, self.alloc.releases):
            return None  # a shorter cached prefix leaves the chunk at the budget; or it asks again anyway
        return steady

    def _pick_victim(self, req: Request) -> int:
        """Index in ``running`` of the request to preempt so that ``req`` can grow."""
        running = self.running
        regions = self._regions
        if regions is not None:
            # Only a sequence in req's region frees memory req can use (req itself always qualifies).
            where = regions.region_of(req.id)
            cands = [k for k in range(len(running)) if regions.region_of(running[k].id) == where]
            if self.victim_policy == "lifo":
                return cands[-1]
            return max(cands, key=lambda k: (-running[k].priority, running[k].seq_no))
        if self.victim_policy == "lifo":
            return len(running) - 1
        # Lowest priority first; among equals the most recently admitted (vLLM's priority policy).
        return max(range(len(running)), key=lambda k: (-running[k].priority, running[k].seq_no))

    def _preempt_last(self, index: int | None = None) -> Request:
        victim = self.running.pop(len(self.running) - 1 if index is None else index)
        alloc = self.alloc
        nbytes = victim.computed * alloc.token_slots * alloc.bpt
        if victim.computed and self.swap_used_bytes + nbytes <= self.swap_capacity_bytes:
            # Swap: the KV goes to host memory over PCIe and comes back on re-admission.
            self.swap_used_bytes += nbytes
            victim.swapped = True
            alloc.work.swap_ops += 1
            alloc.work.swap_out_bytes += nbytes
            self.swaps_out += 1
        else:
            self.recomputed_tokens += victim.computed
            victim.computed = 0  # recompute: re-prefill prompt + generated later
        alloc.release(victim.id)
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        self.now_hint_preempted.append(victim)
        return victim

    def drop_stale(self, now: float, stale_after_s: float) -> list[Request]:
        """Waiting requests that have not advanced for ``stale_after_s`` (queued or preempted)."""
        stale = [r for r in self.waiting if now - r.last_progress > stale_after_s]
        for r in stale:
            self.waiting.remove(r)
        return stale

    def schedule(self, start: int = 0, batch: BatchShape | None = None) -> StepPlan:
        """Form the next iteration's batch.

        ``start`` running requests (the engine's decode cohort, already granted
        their token, whose shape is in ``batch``) are skipped: scheduling
        resumes with ``running[start]`` under the budget they left.
        """
        if not self.mixed:
            return self._schedule_apart()
        return self._schedule(start, batch, "mixed")

    def _prefilling(self, req: Request) -> bool:
        """``req`` still has prompt (or, after a recompute preemption, generated) tokens to compute."""
        return req.generated == 0 or req.computed + 1 < req.prompt + req.generated

    def _schedule_apart(self) -> StepPlan:
        """Prefill iterations apart from decode iterations: prefill when a chunk is pending or a
        request may be admitted, else decode every running request."""
        admissible = bool(self.waiting) and len(self.running) < self.cfg.max_num_seqs
        if admissible or any(self._prefilling(r) for r in self.running):
            plan = self._schedule(0, None, "prefill")
            if plan.items or plan.preempted or plan.rejected_at_admission or plan.overflowed:
                return plan
        return self._schedule(0, None, "decode")

    def _fits_whole_output(self, req: Request) -> bool:
        """``reserve_output``: KV for ``req``'s prompt and whole output fits beside every running
        request's, in the allocator's blocks."""
        bs = max(int(getattr(self.alloc, "block_size", 1)), 1)
        promised = sum(-(-(r.prompt + r.output) // bs) * bs for r in self.running)
        # Every token counted in every layer group (an upper bound where some layers slide).
        slots = self.alloc.token_slots
        return (promised + -(-(req.prompt + req.output) // bs) * bs) * slots <= self.alloc.capacity_tokens

    def _schedule(self, start: int, batch: BatchShape | None, mode: str) -> StepPlan:
        cfg = self.cfg
        alloc = self.alloc
        batch = batch if batch is not None else BatchShape()
        budget = cfg.max_num_batched_tokens - batch.decode_seqs
        items: list[tuple[Request, int]] = []
        overflowed: list[Request] = []
        preempted = 0
        pure_decode = True
        running = self.running

        i = start
        while i < len(running) and budget > 0:
            req = running[i]
            if mode != "mixed" and self._prefilling(req) != (mode == "prefill"):
                i += 1
                continue
            need = self._chunk(req, budget)
            if need is None:
                i += 1
                continue
            r = alloc.grow(req.id, req.computed + need)
            while r is Grow.NO_SPACE:
                k = self._pick_victim(req)
                victim = self._preempt_last(k)
                preempted += 1
                if victim is req:
                    break
                if k < i:
                    # Already given tokens this iteration: take them back.
                    for j, (other, n_other) in enumerate(items):
                        if other is victim:
                            del items[j]
                            budget += n_other
                            break
                    i -= 1
                r = alloc.grow(req.id, req.computed + need)
            if r is Grow.NO_SPACE:  # req itself was preempted
                if self.victim_policy == "lifo" and self._regions is None:
                    break  # it was last, so the loop ends
                continue  # the next request moved into its place
            if r is Grow.EVICT:
                # req outgrew its region and the one it must move to is full: it waits for room there.
                self._preempt_last(i)
                preempted += 1
                continue
            if r is Grow.OVERFLOW:
                running.pop(i)
                alloc.release(req.id)
                overflowed.append(req)
                continue
            items.append((req, need))
            if need != 1 or req.computed + 1 != req.prompt + req.generated or req.generated == 0:
                pure_decode = False
            budget -= need
            i += 1

        admitted: list[Request] = []
        rejected: list[Request] = []
        paused = False
        breaker, prefix, hints = self._breaker, self._prefix, self._hints
        if preempted == 0 and breaker is not None and self.waiting and breaker.admission_paused():
            paused = True
        elif preempted == 0 and mode != "decode":
            waiting = self.waiting
            while waiting and len(running) < cfg.max_num_seqs and budget > 0:
                req = waiting[0]
                need = self._chunk(req, budget)  # req.computed > 0 only when swapped in
                if need is None:
                    if self._never_fits(req):
                        # A server refuses it (TensorRT-LLM: input longer than max_num_tokens); waiting
                        # would block every request behind it for ever.
                        waiting.popleft()
                        req.reason = PROMPT_EXCEEDS_TOKEN_BUDGET
                        rejected.append(req)
                        continue
                    break
                if self.reserve_output and not self._fits_whole_output(req):
                    break
                cached = 0
                if prefix is not None and req.hashes and not req.computed:
                    # Cached prefix blocks are shared, not computed: the chunk starts after them. A
                    # recomputed request (generated > 0) may reuse every cached prompt block but must
                    # compute its last token, the same cap admit_prefix applies to the tokens it holds.
                    cached = prefix.cached_prefix_tokens(
                        req.hashes, self.hash_block_tokens, req.prompt, tokens=req.prompt + req.generated
                    )
                    need = min(req.prompt + req.generated - cached, budget)
                if self._refused == (req.id, need, alloc.releases):
                    break
                predicted = 0
                if hints is not None:
                    assert self.predictor is not None
                    predicted = self.predictor.predict_total(req)
                    hints.hint(req.id, predicted)
                # Prefill iterations apart from decode (SGLang) admit a prompt only when all of it
                # fits (its PrefillAdder checks the whole input against the free pool): one that fits
                # a chunk but not the rest would preempt itself at its next chunk, be admitted again,
                # and starve the decoders that would free the memory, forever.
                whole = mode == "prefill"
                if prefix is not None and req.hashes and not req.computed:
                    r, got = prefix.admit_prefix(
                        req.id,
                        req.prompt + req.generated if whole else cached + need,
                        req.hashes,
                        self.hash_block_tokens,
                        self.now,
                        prompt_tokens=req.prompt,
                    )
                    if r is Grow.OK:
                        assert got == cached, (got, cached)
                        req.computed = cached
                else:
                    r = alloc.admit(req.id, req.prompt + req.generated if whole else req.computed + need)
                if r is Grow.NO_SPACE:
                    self._refused = (req.id, need, alloc.releases)
                    break
                waiting.popleft()
                if r is Grow.OVERFLOW:
                    req.reason = PROMPT_EXCEEDS_RESERVATION
                    rejected.append(req)
                    continue
                if self.predictions is not None and req.preemptions == 0:
                    # Scoring only: the true length is read here, after the prediction was used.
                    self.predictions.record(predicted, req.prompt + req.output)
                if req.swapped:
                    nbytes = req.computed * alloc.token_slots * alloc.bpt
                    self.swap_used_bytes -= nbytes
                    alloc.work.swap_ops += 1
                    alloc.work.swap_in_bytes += nbytes
                    self.swaps_in += 1
                    req.swapped = False
                running.append(req)
                req.seq_no = self._admissions
                self._admissions += 1
                admitted.append(req)
                items.append((req, need))
                pure_decode = False
                budget -= need

        cap = self.kv_cap
        for req, n in items:
            if n == 1 and req.generated > 0 and req.computed + 1 == req.prompt + req.generated:
                batch.decode_seqs += 1
                kv = req.computed + 1
                batch.decode_kv_tokens += kv if cap is None or kv < cap else cap
            else:
                ctx = req.computed if cap is None else min(req.computed, cap)
                batch.prefill_chunks.append((n, ctx))
        wcap = self.window_kv_cap
        if wcap is not None:
            # A mixed model's sliding-window layers attend at most their window (the cost model caps
            # the prefill chunks' contexts itself).
            for req, n in items:
                if n == 1 and req.generated > 0 and req.computed + 1 == req.prompt + req.generated:
                    batch.decode_window_kv_tokens += min(req.computed + 1, wcap)
        return StepPlan(
            items,
            batch,
            pure_decode and bool(items or batch.decode_seqs),
            preempted,
            overflowed,
            rejected,
            admitted,
            paused,
        )
