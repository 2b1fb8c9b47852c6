"""One model replica: a SimPy process running the iteration loop.

Each iteration the scheduler forms a batch, the allocator grows or frees, the
cost model prices the batch and the process yields a timeout.

``engine.mode: step`` does exactly that, one timeout per iteration (the
reference). ``fast_forward`` pays per change of batch composition instead:

* Decoding sequences form a *cohort* (``sim/allocators/cohort.py``) that the
  allocator grows in aggregate, so an iteration costs O(prefill requests +
  admissions), not O(running sequences).
* A batch of pure decodes whose composition cannot change before a known
  iteration (the first completion, the first allocator refusal, the first
  queued request to turn stale under ``stale_after_s``, the first schedule
  that would ask again to admit the queue's head it refused) runs as one
  window of ``k`` iterations: their times come from one vectorised cost-model
  call, and the allocator grants the window's growth at once. The cost model's
  out-of-range counts are those of the iterations that ran.
* A schedule asks to admit the queue's head again when memory was released
  since its refusal or it asks for other tokens. With prefill iterations apart
  (``mixed_batches: false``) admission comes before the decodes grow, so memory
  their growth frees (a move between regions, a relocated extent) reaches the
  queue at the next iteration: the window ends after one. With prefix caching,
  growth that evicts a cached block of the head's prefix lengthens its chunk:
  the window ends where stepping would ask again (and be refused again).
* An arrival that could join the batch interrupts a window at the end of the
  iteration in progress, exactly when per-iteration stepping would have seen it.
  With ``schedule_ahead`` (batches formed one iteration ahead) it joins, and
  cuts the window, one iteration later.
* Anything irregular (a refusal that needs preemption, a static reservation
  overflowing, a token budget smaller than the cohort) dissolves the cohort
  and runs that iteration through the per-sequence scheduler.

The equivalence of the modes is a property test (``tests/test_engine.py``,
``tests/test_ff_step_equivalence.py``).
"""

from __future__ import annotations

import heapq
import os
from bisect import bisect_right
from collections.abc import Callable, Generator
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import simpy

from sim.allocators.base import Allocator
from sim.allocators.capabilities import AdmissionBreaker, Compactable
from sim.allocators.cohort import Cohort
from sim.config import CompactionConfig
from sim.cost.model import BatchShape, CostModel
from sim.engine.simpy_shortcuts import now as clock, retarget
from sim.engine.stats import ReplicaStats
from sim.engine.stream import OutputStream
from sim.request import (
    CANNOT_FIT_EMPTY_REPLICA,
    COMPLETED,
    EXCEEDS_RESERVATION,
    PROMPT_EXCEEDS_RESERVATION,
    REJECTED,
    STALE,
    Request,
)
from sim.sched.continuous import ContinuousScheduler, StepPlan
from sim.sched.interface import CompletesTogether, Scheduler

if TYPE_CHECKING:
    from sim.output.metrics import Recorder


DEBUG = bool(os.environ.get("KVSIM_DEBUG"))


def _seq_no(req: Request) -> int:
    return req.seq_no


class Later:
    """A callback that calls ``fn(arg)`` when its event fires (a client's delayed start; a request
    done once its client has its last token)."""

    def __init__(self, fn: Callable[[Any], None], arg: Any):
        self.fn, self.arg = fn, arg

    def __call__(self, _event: object) -> None:
        self.fn(self.arg)


@dataclass(slots=True, init=False)
class _Window:
    """A priced decode window of the cohort from step ``G`` (its first iteration granted)."""

    #: Seconds of each of its ``k`` iterations (allocator work included).
    times: list[float]
    k: int
    #: Reserved and used tokens while the first iteration runs (later ones: ``Cohort.integrals``).
    reserved0: float
    used0: float
    #: Allocation events of iterations 2..k and the seconds one event costs.
    events: list[int] | None
    per_event_s: float
    frag: float
    waiting_at_start: bool
    members: int
    #: The cost model's out-of-range counts before the window was priced, the iterations priced
    #: and what they attended (``kv_first`` tokens in the first, ``members`` more in each next one;
    #: or ``kv_list``): iterations priced but not run are not counted (:meth:`Replica._oor_ran`).
    oor: dict[str, int]
    priced: int
    kv_first: int
    kv_list: list[float] | None

    # An explicit __init__ (``init=False``): the compiled build (sim/native.py) runs it natively, a
    # generated dataclass __init__ would stay interpreted. Same parameters as the fields.
    def __init__(
        self,
        times: list[float],
        k: int,
        reserved0: float,
        used0: float,
        events: list[int] | None,
        per_event_s: float,
        frag: float,
        waiting_at_start: bool,
        members: int,
        oor: dict[str, int],
        priced: int,
        kv_first: int,
        kv_list: list[float] | None,
    ):
        self.times, self.k, self.reserved0, self.used0 = times, k, reserved0, used0
        self.events, self.per_event_s, self.frag = events, per_event_s, frag
        self.waiting_at_start, self.members = waiting_at_start, members
        self.oor, self.priced, self.kv_first, self.kv_list = oor, priced, kv_first, kv_list


class Replica:
    """One replica's iteration loop over its scheduler, allocator and cost model; what it
    measures goes to :attr:`stats`."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        scheduler: Scheduler,
        allocator: Allocator,
        cost: CostModel,
        recorder: Recorder,
        *,
        fast_forward: bool,
        overflow: str,
        on_finish: Callable[[Request], None] | None = None,
        compaction: CompactionConfig | None = None,
        stale_after_s: float | None = None,
        stream_per_token_s: float = 0.0,
        schedule_ahead: bool = False,
        first_token_lag: int = 0,
    ):
        self.env = env
        self.index = index
        self.sched = scheduler
        self.alloc = allocator
        self.cost = cost
        self.rec = recorder
        self.fast_forward = fast_forward
        self.overflow = overflow
        self.on_finish = on_finish
        #: The server's token-streaming process (``None``: clients see each token when it is made).
        self._stream: OutputStream | None = OutputStream(stream_per_token_s) if stream_per_token_s > 0 else None
        #: When clients see the tokens of the latest iteration (or window's last one) through the
        #: stream; ``-1`` before any or without a stream.
        self._last_out = -1.0
        #: The engine forms each iteration's batch while the one before it runs (an overlap
        #: scheduler, async scheduling): a request that reaches the engine while an iteration runs
        #: misses the batch already formed for the next one and joins the one after. Such requests
        #: wait in ``_pending`` (engine arrival time, request) until :meth:`_release`.
        self._ahead = schedule_ahead
        self._pending: list[tuple[float, Request]] = []
        #: When the latest iteration began: the batch of the iteration after it was formed then.
        self._last_start = 0.0
        self._lag = first_token_lag
        self._held: list[tuple[Request, int]] = []
        #: Outstanding (running + waiting) requests per replica of the cluster, this one at
        #: ``index``; the router shares it (``sim/engine/router.py``). Changed by submit and _end only.
        self.loads: list[int] = [0] * (index + 1)
        self._idle: simpy.Event | None = None
        self._in_window = False
        self._truncated = False
        #: Inside :meth:`_settle`, the iteration about to run is already formed; a request that
        #: reaches the queue then (a held client request sent as one ends there) waits for the
        #: next schedule, as an arrival during that iteration would.
        self._settling = False
        #: Such a request reached an empty queue: a window starting now stops after one
        #: iteration, where stepping first schedules it (an arrival would cut it there).
        self._late = False
        # The running window (``_run_window``): its start, iteration end offsets, iterations to run.
        self._win_t0 = 0.0
        self._win_ends: list[float] = []
        #: The first of the running window's iterations scheduled with a request queued that arrived
        #: into an empty queue while it ran (one that could not join: no free sequence slot, so the
        #: window ran on); past its last iteration when none did (:meth:`_queued_from`).
        self._win_queued = 0
        self._win_m = 0
        #: Totals of the run (time integrals, iterations, allocator work, compactions…).
        self.stats = ReplicaStats(self, recorder)
        # The allocator's and scheduler's optional features, looked up once.
        self._breaker: AdmissionBreaker | None = allocator if isinstance(allocator, AdmissionBreaker) else None
        #: The continuous scheduler (``None``: another kind), whose admission retries windows heed.
        self._cs: ContinuousScheduler | None = scheduler if isinstance(scheduler, ContinuousScheduler) else None
        #: Prefill iterations apart from decodes: a schedule asks to admit before the decodes grow.
        self._admits_first = self._cs is not None and not self._cs.mixed
        #: Prefix caching: growth inside a window may evict the queue head's cached prefix.
        self._evict_guard = self._cs is not None and self._cs.evicts_queue_head_prefix
        completes = scheduler if isinstance(scheduler, CompletesTogether) else None
        #: Static batching returns a batch's members together (``None``: each request alone).
        self._completing: Callable[[list[Request]], list[Request]] | None = (
            completes.completing if completes is not None else None
        )
        # Cohort state: G counts cohort iterations; a member with generation offset b has
        # generated b + G tokens and finishes at G == output − b (heap of (G_fin, id, req)).
        # The cohort assumes victims come from the tail of the running list (LIFO), and prices its
        # members' attention from their summed length (a mixed model's sliding-window layers need
        # each member's length capped at the window: those run per sequence).
        self.cohort: Cohort | None = (
            allocator.cohort
            if fast_forward
            and scheduler.supports_cohort
            and scheduler.victim_policy == "lifo"
            and scheduler.window_kv_cap is None
            else None
        )
        if self.cohort is not None:
            #: The cohort, typed as present: only the cohort loop and its methods read it.
            self._co: Cohort = self.cohort
        self.G = 0
        self._gen_off: dict[int, int] = {}
        self._fin: list[tuple[int, int, Request]] = []
        # Background compaction (allocators that can compact): a SimPy process checks the
        # thresholds every period_s while the replica is busy; the move happens at the next
        # iteration boundary (KV cannot move under a running kernel).
        self._compactable: Compactable | None = (
            allocator if compaction is not None and isinstance(allocator, Compactable) else None
        )
        self.compaction = compaction if self._compactable is not None else None
        self._compact_due = False
        self.stale_after_s = stale_after_s
        self._activity: simpy.Event | None = None
        self._bg_copy_left_s = 0.0
        # The cost model's after-prefill excess (CostModel.after_prefill_s) and the pure decode
        # iterations run since the last iteration with prefill (starts past the list: no prefill yet).
        self._after: list[float] = list(cost.after_prefill_s)
        self._since_prefill = len(self._after)
        #: Block pools: every free block serves any sequence, so external fragmentation is 0.
        self._one_extent = allocator.single_extent
        loop = self._loop_cohort if self.cohort is not None else self._loop
        self.proc = env.process(loop())
        if self.compaction is not None:
            env.process(self._compactor())

    # --- called by the router --------------------------------------------------------
    def outstanding(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting) + len(self._pending)

    def submit(self, req: Request) -> None:
        """Queue ``req``; wake the loop if it is idle or if ``req`` could join the current window."""
        sched = self.sched
        was_empty = not sched.waiting and not self._pending
        req.replica = self.index
        self.loads[self.index] += 1
        if self._activity is not None and not self._activity.triggered:
            self._activity.succeed()
        if self._idle is not None:
            sched.waiting.append(req)
            if not self._idle.triggered:
                self._idle.succeed()
            return
        if self._settling and not self._ahead and was_empty and sched.can_admit_more():
            self._late = True
        if self._ahead:
            # The next iteration's batch is already formed: ``req`` can first join the one after.
            self._pending.append((clock(self.env), req))
        else:
            sched.waiting.append(req)
        if self._in_window and was_empty and self._breaker is not None:
            # Stepping counts the breaker's paused time from the first iteration scheduled with
            # ``req`` queued (the one after the iteration in progress, or after the next with the
            # batch formed ahead); the window counts it from there (``_paused_s``), cut or not.
            now = clock(self.env)
            self._win_queued = bisect_right(self._win_ends, now - self._win_t0) + 1 + (1 if self._ahead else 0)
        if self._in_window and not self._truncated and was_empty and sched.can_admit_more():
            self._cut_window(1 if self._ahead else 0)
        if self._in_window and self.stale_after_s is not None:
            # It may turn stale before the window ends: stepping would drop it at that boundary.
            self._cut_window_stale(req.last_progress)

    def _release(self) -> None:
        """At an iteration boundary: the pending requests that reached the engine before the batch
        of the coming iteration was formed (when the latest iteration began) join the queue; all of
        them when nothing runs (no iteration was formed ahead)."""
        pending = self._pending
        cut = self._last_start if self.sched.running else float("inf")
        n = 0
        while n < len(pending) and pending[n][0] <= cut:
            n += 1
        if n:
            self.sched.waiting.extend(r for _, r in pending[:n])
            del pending[:n]

    # --- compaction ----------------------------------------------------------------------
    def _compactor(self) -> Generator[simpy.Event, Any, None]:
        cfg, alloc = self.compaction, self._compactable
        assert cfg is not None and alloc is not None
        env = self.env
        while True:
            if not self.sched.running and not self.sched.waiting:
                self._activity = env.event()
                yield self._activity  # nothing is scheduled while idle, so a finished run ends
                self._activity = None
            yield env.timeout(cfg.period_s)
            if self._compact_due or not self.sched.running:
                continue
            if alloc.should_compact(cfg.below_utilization, cfg.above_fragmentation):
                self._compact_due = True
                if self._in_window and not self._truncated:
                    self._cut_window()

    def _run_compaction(self) -> None:
        """Move live extents together now; stall mode charges the copy to the next iteration."""
        self._compact_due = False
        if self.cohort is not None and self.cohort.n:
            self._dissolve()  # the move needs every sequence's own token count
        assert self._compactable is not None and self.compaction is not None
        before = self.alloc.work.copy_bytes
        self._compactable.compact()
        moved = self.alloc.work.copy_bytes - before
        if not moved:
            return
        t = self.cost.copy_time_s(moved)
        self.stats.compaction(clock(self.env), int(moved), t)
        if self.compaction.mode == "background":
            # Copies run beside iterations: take them out of the stall path, slow the next ones.
            w = self.alloc.work
            w.copy_ops -= 1
            w.copy_bytes -= moved
            self.alloc.work_total.copy_ops += 1
            self.alloc.work_total.copy_bytes += moved
            self._bg_copy_left_s += t

    def _background_penalty(self, times: np.ndarray) -> None:
        """Slow iterations while a background compaction's copies are in flight (in place)."""
        if self._bg_copy_left_s <= 0:
            return
        assert self.compaction is not None
        extra = times * self.compaction.background_slowdown
        cum = np.cumsum(extra)
        take = np.minimum(cum, self._bg_copy_left_s)
        add = np.diff(take, prepend=0.0)
        times += add
        # Only the iterations that actually run consume it; callers pass exactly those.
        self._bg_copy_left_s -= float(add.sum())

    # --- shared pieces -----------------------------------------------------------------
    def _drop_stale(self, now: float) -> None:
        """Between iterations: drop queued requests that have not advanced for stale_after_s (a
        decode window ends where one turns stale: :meth:`_stale_cut`, :meth:`_cut_window_stale`)."""
        for req in self.sched.now_hint_preempted:
            req.last_progress = now
        self.sched.now_hint_preempted.clear()
        if self.stale_after_s is not None and self.sched.waiting:
            for req in self.sched.drop_stale(now, self.stale_after_s):
                req.reason = STALE
                self._end(req, REJECTED, now)

    def _settle(self, plan: StepPlan, now: float) -> None:
        """Record admissions and end requests the scheduler turned away."""
        self._settling = True
        self._settle_ends(plan, now)
        self._settling = False

    def _settle_ends(self, plan: StepPlan, now: float) -> None:
        for req in plan.admitted:
            if req.admitted < 0:
                req.admitted = now
        for req in plan.rejected_at_admission:
            self._end(req, REJECTED, now)
        for req in plan.overflowed:
            if req.generated == 0:
                # Its prompt outgrew the reservation mid-prefill (a chunk was admitted): there is no
                # output to truncate to, as when the whole prompt is refused at admission.
                req.reason = PROMPT_EXCEEDS_RESERVATION
                self._end(req, REJECTED, now)
            elif self.overflow == "truncate":
                # Its output ends at the token the latest iteration made; like a request that
                # completes there, it ends when the stream has sent that token to its client.
                req.truncated = True
                self._end(req, COMPLETED, now, self._last_out)
            else:
                req.reason = EXCEEDS_RESERVATION
                self._end(req, REJECTED, now)

    def _paused_s(self, plan: StepPlan | None, reserved: np.ndarray, times: np.ndarray, queued_from: int) -> float:
        """Breaker time in a window of ``times``: it opens mid-window when free memory crosses its
        threshold, in the iterations from ``queued_from`` on (those scheduled with requests queued:
        :meth:`_queued_from`)."""
        if plan is not None and plan.paused:
            return float(times.sum())
        if queued_from < len(times) and self._breaker is not None:
            if queued_from:
                times, reserved = times[queued_from:], reserved[queued_from:]
            return float(times[self._breaker.paused_at(reserved)].sum())
        return 0.0

    def _queued_from(self, waiting_at_start: bool, m: int) -> int:
        """The first of the ``m`` iterations a window ran that was scheduled with requests queued:
        ``0`` when some were queued as it began; else where the first arrival into the empty queue
        was first seen (:meth:`submit`); ``m`` when none arrived. A window of one iteration is not
        armed (arrivals wait for the next schedule), so ``_win_queued`` is left from another."""
        if waiting_at_start:
            return 0
        return min(self._win_queued, m) if m > 1 else m

    def _ext_frag(self) -> float:
        if self._one_extent:
            return 0.0
        a = self.alloc
        free = a.capacity_tokens - a.reserved_tokens()
        return 0.0 if free <= 0 else 1.0 - a.largest_free_extent_tokens() / free

    def _advance_items(
        self, items: list[tuple[Request, int]], now: float, done: list[Request], firsts: list[Request] | None = None
    ) -> int:
        """Per-sequence effect of one iteration on ``items``; returns the tokens it made (their first
        tokens' requests appended to ``firsts`` where given)."""
        made = 0
        for req, n in items:
            req.computed += n
            if req.computed == req.prompt + req.generated:
                req.generated += 1
                made += 1
                if req.first_token < 0:
                    req.first_token = now
                    if firsts is not None:
                        firsts.append(req)
                if req.generated >= req.output:
                    done.append(req)
        return made

    def _advance_and_finish(
        self, items: list[tuple[Request, int]], now: float, done: list[Request], made: int = 0
    ) -> None:
        """The end of an iteration that ended at ``now``: ``items`` advance, then ``done`` and what
        they completed end. With a token stream, the first and last tokens are those the clients
        see once the stream has sent the iteration's tokens (``made`` of them besides the items':
        the cohort's)."""
        stream = self._stream
        lag = self._lag
        if stream is None and not lag:
            self._advance_items(items, now, done)
            self._finish(done, now)
            return
        if self._held:
            self._tick_held(now)
        firsts: list[Request] = []
        made += self._advance_items(items, now, done, firsts)
        out = stream.deliver(now, made) if stream is not None else -1.0
        self._last_out = out
        for req in firsts:
            if out > now:
                req.first_token = out
            if lag:
                self._held.append((req, lag))
        self._finish(done, now, out)

    def _tick_held(self, now: float, ends: list[float] | None = None, m: int = 1) -> None:
        """An iteration, or a window of ``m`` (``ends``: their end offsets from its start), ended at
        ``now``: a first token held ``left`` more iterations reaches its client at the end of the
        ``left``-th of them (no earlier than the stream sent it)."""
        keep: list[tuple[Request, int]] = []
        for req, left in self._held:
            if left > m:
                keep.append((req, left - m))
                continue
            # The last end is ``now`` itself: no rounding through the window's start.
            t = now if left == m or ends is None else now - float(ends[m - 1]) + float(ends[left - 1])
            if t > req.first_token:
                req.first_token = t
        self._held = keep

    def _window_seen(self, now: float, ends: list[float], m: int, k: int) -> float:
        """When clients see the last of ``m`` window iterations of ``k`` tokens each that ended at
        ``now`` (``ends``: their end offsets); ``-1`` without a token stream."""
        stream = self._stream
        if stream is None:
            return -1.0
        out = stream.deliver_window(now - float(ends[m - 1]), ends, m, k)
        self._last_out = out
        return out

    def _finish(self, done: list[Request], now: float, out: float = -1.0) -> None:
        if self._completing is not None:
            done = self._completing(done)
        if not done:
            return
        # Running order, whichever path found them: closed-loop clients react in this order.
        if len(done) > 1:
            done.sort(key=_seq_no)
        running, release = self.sched.running, self.alloc.release
        for req in done:
            running.remove(req)
            release(req.id)
            self._end(req, COMPLETED, now, out)

    def _end(self, req: Request, status: str, now: float, out: float = -1.0) -> None:
        """``req`` leaves the engine at ``now``; its client sees its last token at ``out`` where
        that is later (the server's token stream)."""
        req.status = status
        req.finish = out if out > now else now
        if self._held:
            self._held = [h for h in self._held if h[0] is not req]
        self.loads[self.index] -= 1
        self.rec.request_done(req)
        if self.on_finish is not None:
            if out > now:
                self.env.timeout(out - now).callbacks.append(Later(self.on_finish, req))
            else:
                self.on_finish(req)

    def _idle_wait(self) -> Generator[simpy.Event, Any, None]:
        self._idle = self.env.event()
        yield self._idle
        self._idle = None

    def _work_s(self) -> float:
        """Charge the allocator's pending work (allocations, copies, zero-fill, swaps) to this iteration."""
        t = self.alloc.take_work_s(self.cost)
        self.stats.alloc_work(t)
        return t

    def _after_prefill_step(self, batch: BatchShape) -> float:
        """Seconds the after-prefill excess adds to one iteration of ``batch`` about to run (and the
        count of decode iterations since a prefill moved past it)."""
        if batch.prefill_chunks:
            self._since_prefill = 0
            return 0.0
        s = self._since_prefill
        if batch.decode_seqs == 0 or s >= len(self._after):
            return 0.0
        self._since_prefill = s + 1
        return self._after[s]

    def _after_prefill_window(self, times: list[float] | np.ndarray) -> None:
        """Add the after-prefill excess to the first iterations of a decode window (priced, not yet
        run: :meth:`_after_prefill_ran` counts the ones that ran)."""
        s, after = self._since_prefill, self._after
        for j in range(min(len(times), len(after) - s)):
            times[j] += after[s + j]

    def _after_prefill_ran(self, m: int) -> None:
        if self._since_prefill < len(self._after):
            self._since_prefill = min(self._since_prefill + m, len(self._after))

    def _step_time(self, plan: StepPlan) -> float:
        dt = self.cost.step_time_s(plan.batch) + self._work_s()
        if self._after:
            dt += self._after_prefill_step(plan.batch)
        if self._bg_copy_left_s > 0:
            arr = np.array([dt])
            self._background_penalty(arr)
            dt = float(arr[0])
        return dt

    def _one_iteration(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        """Yield through one iteration of ``plan`` and account for it (time, memory, time series)."""
        it = self._iteration_begin(plan)
        self._last_start = clock(self.env)
        yield self.env.timeout(it[0])
        self._iteration_end(plan, it)

    def _iteration_begin(self, plan: StepPlan) -> tuple[float, int, int, float]:
        """Price one iteration: (seconds, used and reserved tokens while it runs, external fragmentation)."""
        a = self.alloc
        return self._step_time(plan), a.used_total, a.reserved_tokens(), self._ext_frag()

    def _iteration_end(self, plan: StepPlan, it: tuple[float, int, int, float]) -> None:
        dt, used, reserved, frag = it
        self.stats.iteration(clock(self.env), dt, used, reserved, frag, plan.paused, plan.batch.num_tokens)

    def _single_step(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        """One iteration through the per-sequence path."""
        yield from self._one_iteration(plan)
        self._advance_and_finish(plan.items, clock(self.env), [])

    def _oor_ran(self, n: int, m: int, priced: int, kv_first: int, kv_list: list[float] | None) -> None:
        """A decode window of ``n`` sequences was priced for ``priced`` iterations, more than the
        ``m`` that ran (an arrival, a stale request or a compaction cut it), and the cost model
        counted queries outside its measured range: take back the counts of the iterations that did
        not run (:meth:`CostModel.take_back_out_of_range`). The iterations attended ``kv_first`` KV
        tokens in the first and ``n`` more in each next one, or ``kv_list``."""
        cost = self.cost
        if kv_list is None:
            cost.take_back_out_of_range(lambda: cost.decode_window_times(n, kv_first + n * m, priced - m))
        else:
            rest = kv_list[m:priced]
            cost.take_back_out_of_range(lambda: cost.decode_times_list(n, rest))

    def _retry_due(self, start: int) -> bool:
        """The next schedule would ask again to admit the queue's head it refused
        (:meth:`ContinuousScheduler.admission_retry_due`), unless the admission breaker holds
        admissions back then (it stays open inside a window: reservations only grow there)."""
        cs = self._cs
        if cs is None or not cs.waiting:
            return False
        if self._breaker is not None and self._breaker.admission_paused():
            return False
        return cs.admission_retry_due(start)

    def _steady_steps(self, start: int, blocks: list[int]) -> int:
        """Iterations of a decode window (its first granted, the next ones taking ``blocks`` from
        the free pool each) to run before the next schedule would ask again to admit the queue's
        head it refused, as stepping would: with prefix caching, a block taken past
        :meth:`ContinuousScheduler.admission_steady_blocks` evicts part of the head's cached
        prefix, so its chunk grows. With mixed batches a schedule grows the decodes, then admits:
        the window ends before the iteration whose growth evicts; with prefill iterations apart it
        admits first, so that iteration still runs in the window."""
        k = 1 + len(blocks)
        cs = self._cs
        if cs is None or not cs.waiting:
            return k
        if self._breaker is not None and self._breaker.admission_paused():
            return k
        steady = cs.admission_steady_blocks(start, sum(blocks))
        if steady is None:
            return k
        c = 0
        for b in blocks:
            steady -= b
            if steady < 0:
                break
            c += 1
        return min(k, 1 + c + (1 if self._admits_first else 0))

    def _run_window(self, times: list[float], k: int) -> Generator[simpy.Event, Any, tuple[int, list[float]]]:
        """Yield through ``k`` iterations of ``times``; returns how many ran (an arrival may cut it
        short, see :meth:`_cut_window`) and the iterations' end offsets (running sums, left to right
        like ``np.cumsum``)."""
        env = self.env
        self._last_start = clock(env)
        if k == 1:
            yield env.timeout(times[0])
            return 1, times
        ends = self._arm_window(times)
        yield env.timeout(ends[-1])
        return self._disarm_window(), ends

    def _arm_window(self, times: list[float]) -> list[float]:
        """A window of ``times`` starts now (arrivals may cut it); returns its iterations' end
        offsets. The caller yields a timeout to the last one, then calls :meth:`_disarm_window`."""
        ends = list(accumulate(times))
        self._win_t0 = clock(self.env)
        self._win_ends = ends
        self._win_m = len(ends)
        self._win_queued = len(ends)
        self._in_window = True
        self._truncated = False
        return ends

    def _disarm_window(self) -> int:
        """The window is over: how many of its iterations ran (the last of them began at ``_last_start``)."""
        self._in_window = False
        self._truncated = False
        m = self._win_m
        if m > 1:
            self._last_start = self._win_t0 + self._win_ends[m - 2]
        return m

    def _cut_window(self, later: int = 0) -> None:
        """End the running window at the end of the iteration in progress (where stepping would
        first see what changed), or ``later`` iterations after it: the process now waits on a
        timeout there instead.

        The process is moved, not interrupted: see :func:`sim.engine.simpy_shortcuts.retarget`.
        """
        self._truncated = True
        env, t0, ends = self.env, self._win_t0, self._win_ends
        now = clock(env)
        m = bisect_right(ends, now - t0) + 1 + later
        if m >= self._win_m:
            return  # the window ends there anyway (its last iteration, or a stale request's cut)
        self._win_m = m
        retarget(self.proc, env.timeout(max(0.0, t0 + ends[m - 1] - now)))

    def _stale_steps(self, t0: float, ends: list[float], last_progress: float) -> int:
        """Iterations of a window that began at ``t0`` (its iterations ending at offsets ``ends``)
        up to the first boundary where a request waiting since ``last_progress`` is stale
        (``stale_after_s``; stepping drops it there): all of them if it stays fresh."""
        stale_s = self.stale_after_s
        assert stale_s is not None
        # The first end where it is stale, by bisection (the test grows with the end offset).
        lo, hi = 0, len(ends)
        while lo < hi:
            mid = (lo + hi) // 2
            if t0 + ends[mid] - last_progress > stale_s:
                hi = mid
            else:
                lo = mid + 1
        return min(lo + 1, len(ends))

    def _stale_cut(self, times: list[float]) -> int:
        """Iterations of a window of ``times`` beginning now to run: up to the boundary where the
        earliest waiting request turns stale, so that it is dropped there as stepping drops it."""
        waiting = self.sched.waiting
        if self.stale_after_s is None or not waiting or len(times) == 1:
            return len(times)
        oldest = min(r.last_progress for r in waiting)
        return self._stale_steps(clock(self.env), list(accumulate(times)), oldest)

    def _cut_window_stale(self, last_progress: float) -> None:
        """A request waiting since ``last_progress`` joined the queue while a window runs: end the
        window at the boundary where it turns stale (no earlier than the iteration in progress)."""
        env, t0, ends = self.env, self._win_t0, self._win_ends
        now = clock(env)
        m = max(self._stale_steps(t0, ends, last_progress), bisect_right(ends, now - t0) + 1)
        if m >= self._win_m:
            return
        self._win_m = m
        retarget(self.proc, env.timeout(max(0.0, t0 + ends[m - 1] - now)))

    def _at_boundary(self) -> Generator[simpy.Event, Any, bool]:
        """Between iterations: wait while idle, compact, drop stale requests. ``True`` when there is work."""
        sched = self.sched
        if not sched.running and not sched.waiting:
            yield from self._idle_wait()
            return False
        return self._boundary_work()

    def _boundary_work(self) -> bool:
        """:meth:`_at_boundary` once there is work: compact, drop stale requests; ``True`` if work remains."""
        sched = self.sched
        now = clock(self.env)
        if self._compact_due:
            self._run_compaction()
        if self.stale_after_s is not None or sched.now_hint_preempted:
            self._drop_stale(now)
            if not sched.running and not sched.waiting:
                return False
        sched.now = now
        if DEBUG:
            assert self.loads[self.index] == self.outstanding(), "outstanding count drifted"
        return True

    def _stuck(self, plan: StepPlan) -> None:
        """Nothing was scheduled: fine if requests are running (budget) or none wait, or if ``plan``
        freed memory (requests overflowed, preempted or turned away after the queue's head was
        refused): the next schedule tries the head again. Otherwise the head cannot be admitted
        even into this empty replica, so it never will be: it is rejected
        (``cannot_fit_empty_replica``) and the queue moves on."""
        sched = self.sched
        if plan.overflowed or plan.rejected_at_admission or plan.preempted:
            return
        if not sched.running and sched.waiting:
            req = sched.waiting.popleft()
            if req.swapped and isinstance(sched, ContinuousScheduler):
                # Its KV was swapped out at a preemption: the host copy is dropped with it.
                alloc = self.alloc
                sched.swap_used_bytes -= req.computed * alloc.token_slots * alloc.bpt
                req.swapped = False
            req.reason = CANNOT_FIT_EMPTY_REPLICA
            self._end(req, REJECTED, clock(self.env))

    # --- per-sequence loop (step mode, and allocators without a cohort) -----------------
    def _loop(self) -> Generator[simpy.Event, Any, None]:
        sched = self.sched
        while True:
            self._late = False  # a boundary: whatever reached the queue is scheduled now
            if self._pending:
                self._release()
            if not (yield from self._at_boundary()):
                continue
            plan = sched.schedule()
            self._settle(plan, clock(self.env))
            if not plan.items:
                self._stuck(plan)
                continue
            if self.fast_forward and plan.pure_decode and plan.preempted == 0:
                yield from self._decode_window(plan)
            else:
                yield from self._single_step(plan)

    def _decode_window(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        reqs = [r for r, _ in plan.items]
        n = len(reqs)
        ids = [r.id for r in reqs]
        tokens_now = np.fromiter((r.computed + 1 for r in reqs), dtype=np.int64, count=n)
        max_steps = min(r.output - r.generated for r in reqs)
        if self._bg_copy_left_s > 0 or self._pending or self._late:
            # Background copies slow each iteration; pending (or late) requests join after this one. (A held
            # first token does not stop a window: the engine's work does not depend on it, and the
            # window's iteration ends say when it is released.)
            max_steps = 1
        elif plan.overflowed and self.sched.waiting:
            # A sequence that outgrew its reservation was just turned away and freed it: stepping
            # offers that memory to the queue at the next iteration, so the window ends there.
            max_steps = 1
        elif self._admits_first and self._retry_due(0):
            # Prefill iterations apart: this plan asked to admit the queue's head before its decodes
            # grew, and their growth freed memory (a move to another region, a relocation) or
            # evicted blocks of the head's cached prefix. Stepping asks again at the next iteration.
            max_steps = 1
        dp = self.alloc.decode_plan(ids, tokens_now, max_steps)
        k = dp.steps
        if k > 1 and dp.events is not None and self._evict_guard:
            cut = self._steady_steps(0 if self._admits_first else n, [int(e) for e in dp.events[1:k].tolist()])
            if cut < k:
                dp = self.alloc.decode_plan(ids, tokens_now, cut)
                k = dp.steps
        j = np.arange(k, dtype=np.int64)
        cap = self.sched.kv_cap
        if cap is None:
            kv = float(tokens_now.sum()) + n * j.astype(np.float64)
        else:
            kv = np.minimum(tokens_now[None, :] + j[:, None], cap).sum(axis=1).astype(np.float64)
        wcap = self.sched.window_kv_cap
        oor = dict(self.cost.out_of_range)
        kvw = None
        if wcap is None:
            times = self.cost.decode_times_s(n, kv)
        else:
            kvw = np.minimum(tokens_now[None, :] + j[:, None], wcap).sum(axis=1).astype(np.float64)
            times = self.cost.decode_times_s(n, kv, kvw)
        if self._after:
            self._after_prefill_window(times)
        times[0] += self._work_s()
        self._background_penalty(times)
        frag = self._ext_frag()
        if dp.events is not None and k > 1:
            extra_t = self.alloc.window_work_time_s(self.cost, dp.events[1:])
            times[1:] += extra_t
        # Late requests were queued after this window's first iteration was formed.
        waiting_at_start = bool(self.sched.waiting) and not self._late
        tl = times.tolist()
        if self.stale_after_s is not None and waiting_at_start and k > 1:
            # A queued request turning stale ends the window there: stepping drops it at that boundary.
            tl = tl[: self._stale_cut(tl)]
        m, ends = yield from self._run_window(tl, len(tl))
        if m < k and self.cost.out_of_range != oor:
            # Count the cost model's out-of-range queries of the iterations that ran only (see _oor_ran).
            cost = self.cost
            kv_rest, kvw_rest = kv[m:k], None if kvw is None else kvw[m:k]
            cost.take_back_out_of_range(lambda: cost.decode_times_s(n, kv_rest, kvw_rest))
        if self._after:
            self._after_prefill_ran(m)
        if dp.events is not None and m > 1:
            self.stats.alloc_work(float(extra_t[: m - 1].sum()))
        tm = times[:m]
        if not self._one_extent and m > 1 and dp.events is not None and dp.events[1:m].any():
            # Blocks taken from the free pool inside the window shrink what is free, so the
            # fragmentation moves with each iteration, as stepping sees it (hybrid_tail's pool).
            reserved = dp.reserved_tokens[:m].astype(np.float64)
            largest = self.alloc.largest_free_during(reserved - reserved[0])
            if largest is not None:
                free = self.alloc.capacity_tokens - reserved
                per = np.where(free > 0, 1.0 - largest / np.maximum(free, 1.0), 0.0)
                frag = float(np.dot(per, tm)) / float(ends[m - 1])
        paused_s = self._paused_s(plan, dp.reserved_tokens[:m], tm, self._queued_from(waiting_at_start, m))
        if m > 1:
            self.alloc.advance_decode(ids, tokens_now + (m - 1))
            self.alloc.take_work()  # into the totals; its time was charged above through extra_t
        now = clock(self.env)
        # The window's peak reservation for the time series: a sliding window's blocks slide out
        # within it, so the state at its end can be below an earlier iteration's.
        self.stats.window(
            now,
            m,
            float(ends[m - 1]),
            float(times[0]),
            float(np.dot(dp.used_tokens[:m], tm)),
            float(np.dot(dp.reserved_tokens[:m], tm)),
            frag,
            paused_s,
            n,
            int(dp.reserved_tokens[:m].max()),
        )
        if self._held:
            self._tick_held(now, ends, m)
        done = []
        for r in reqs:
            r.computed += m
            r.generated += m
            if r.generated >= r.output:
                done.append(r)
        self._finish(done, now, self._window_seen(now, ends, m, n))

    # --- cohort loop (fast_forward with an aggregate-capable allocator) ----------------
    def _join(self, req: Request) -> None:
        self._co.join(req.id, req.computed, self.G)
        b = req.generated - self.G
        self._gen_off[req.id] = b
        heapq.heappush(self._fin, (req.output - b, req.id, req))

    def _leave(self, req: Request) -> None:
        req.computed = self._co.leave(req.id, self.G)
        req.generated = self._gen_off.pop(req.id) + self.G

    def _dissolve(self) -> None:
        """Every member back to per-sequence records (the cohort is empty afterwards)."""
        for _, _, req in self._fin:
            self._leave(req)
        self._fin.clear()

    def _rejoin(self) -> None:
        """Decoding running requests (the front of ``running``) become members."""
        for req in self.sched.running:
            if req.generated > 0 and req.computed + 1 == req.prompt + req.generated and req.id not in self._gen_off:
                self._join(req)

    def _kv_attended(self, steps: int) -> list[float]:
        """Σ KV length attended by the members in each of ``steps`` iterations from ``G``."""
        co = self._co
        cap = self.sched.kv_cap
        G = self.G
        if cap is None:
            # Integers below 2**53: exact, as the float64 array arithmetic was.
            n = len(co.a)
            base = co.sum_a + n * G
            if steps == 1:
                return [float(base + n)]
            return [float(base + n * j) for j in range(1, steps + 1)]
        j = np.arange(1, steps + 1, dtype=np.float64)
        a = np.fromiter(co.a.values(), dtype=np.int64, count=co.n)
        return np.minimum(a[None, :] + G + j[:, None], cap).sum(axis=1).astype(np.float64).tolist()

    def _loop_cohort(self) -> Generator[simpy.Event, Any, None]:
        # Flat on purpose: this loop runs once per batch change of every replica, so the phases
        # are plain methods around the yields instead of nested generators.
        sched = cast(ContinuousScheduler, self.sched)  # the cohort runs with continuous batching only
        co = self._co
        env = self.env
        running, waiting = sched.running, sched.waiting
        budget_cap = sched.cfg.max_num_batched_tokens
        kv_cap = sched.kv_cap
        plan: StepPlan | None
        while True:
            self._late = False  # a boundary: whatever reached the queue is scheduled now
            if self._pending:
                self._release()
            if not running and not waiting:
                yield from self._idle_wait()
                continue
            if self._compact_due or self.stale_after_s is not None or sched.now_hint_preempted or DEBUG:
                if not self._boundary_work():
                    continue
            else:
                sched.now = clock(env)  # _boundary_work's only effect when nothing else is due
            n = len(co.a)
            # The cohort takes this iteration's token first (it is the front of the running list).
            if n > budget_cap or (n and not co.advance_one(self.G)):
                # Preemption, overflow or a starved budget ahead: one exact per-sequence iteration.
                self._dissolve()
                plan = sched.schedule()
                self._settle(plan, clock(env))
                if not plan.items:
                    self._stuck(plan)
                    continue
                yield from self._single_step(plan)
                self._rejoin()
                continue
            if DEBUG:
                assert all(r.id in self._gen_off for r in running[:n]), "cohort is not the front of running"
                assert not any(r.id in self._gen_off for r in running[n:]), "a member sits behind a prefilling request"
                assert all(running[i].seq_no < running[i + 1].seq_no for i in range(len(running) - 1)), (
                    "running out of order"
                )
            if n and len(running) == n and self._breaker is None and (not waiting or sched.admission_blocked(n)):
                # Nothing to schedule beside the cohort (no prefill, and the queue is empty or cannot
                # move): a pure-decode window, without forming a plan.
                plan = None
            else:
                batch = BatchShape(decode_seqs=n, decode_kv_tokens=0)
                if n:
                    if kv_cap is None:
                        batch.decode_kv_tokens = co.sum_a + n * (self.G + 1)
                    else:
                        batch.decode_kv_tokens = int(self._kv_attended(1)[0])
                plan = sched.schedule(start=n, batch=batch)
                self._settle(plan, clock(env))
                if not plan.items and not n:
                    self._stuck(plan)
                    continue
                if plan.items or plan.preempted:
                    it = self._iteration_begin(plan)
                    self._last_start = clock(env)
                    yield env.timeout(it[0])
                    self._mixed_end(plan, it)
                    continue
            # A pure-decode window of the cohort.
            w = self._window_begin()
            self._last_start = clock(env)
            if w.k == 1:
                yield env.timeout(w.times[0])
                m, ends = 1, w.times
            else:
                ends = self._arm_window(w.times)
                yield env.timeout(ends[-1])
                m = self._disarm_window()
            self._window_end(plan, w, m, ends)

    def _mixed_end(self, plan: StepPlan, it: tuple[float, int, int, float]) -> None:
        """After an iteration of the cohort's token (granted before it) plus per-sequence prefill
        items, priced as ``it``: its accounting, completions, first tokens, and new cohort members."""
        self._iteration_end(plan, it)
        now = clock(self.env)
        self.G += 1
        done: list[Request] = []
        members = len(self._co.a)  # each made a token this iteration, finished or not
        self._pop_finished(done)
        self._advance_and_finish(plan.items, now, done, members)
        for req, _ in plan.items:
            if req.status == "" and req.generated > 0 and req.computed + 1 == req.prompt + req.generated:
                self._join(req)

    def _pop_finished(self, done: list[Request]) -> None:
        fin = self._fin
        while fin and fin[0][0] <= self.G:
            _, _, req = heapq.heappop(fin)
            self._leave(req)
            done.append(req)

    def _advance_window(self, m: int, w: _Window) -> tuple[float, float, list[float] | None]:
        """Grant the allocator growth of the first ``m`` iterations of ``w`` that ran; returns their
        used and reserved token·second integrals, and their reserved token totals where the
        admission breaker needs them."""
        times = w.times
        t = times[0]
        if m == 1:
            return w.used0 * t, w.reserved0 * t, [w.reserved0] if self._breaker is not None else None
        # Totals only for the iterations that ran (an arrival often cuts a window short).
        co = self._co
        G1 = self.G + 1
        du, dr = co.integrals(G1, times, 1, m, w.used0 * t, w.reserved0 * t)
        reserved = [w.reserved0] + co.preview_totals(G1, m - 1)[0] if self._breaker is not None else None
        co.advance(G1, m - 1)
        self.alloc.take_work_s(self.cost)  # into the totals; its time was charged through ``per_event_s``
        assert w.events is not None  # a window of more than one iteration has them
        self.stats.alloc_work(sum(w.events[: m - 1]) * w.per_event_s)
        return du, dr, reserved

    def _window_begin(self) -> _Window:
        """Price a window from step ``G`` (its first iteration granted, its work pending in the
        allocator, its totals the allocator's now)."""
        co, alloc, G, cost = self._co, self.alloc, self.G, self.cost
        n = len(co.a)
        k_fin = self._fin[0][0] - G  # iterations until the first member finishes (≥ 1)
        if self._bg_copy_left_s > 0 or self._pending or self._late:
            # As in the decode plan above: one iteration at a time.
            k_fin = 1
        # The first iteration is granted; the rest of the window must be grantable from G + 1.
        k = 1 + (co.grantable_steps(G + 1, k_fin - 1) if k_fin > 1 else 0)
        events: list[int] | None = None
        if k > 1:
            events = co.block_events(G + 1, k - 1)
            if self._evict_guard:
                k = self._steady_steps(n, events)
                events = events[: k - 1] if k > 1 else None
        # Python lists, not arrays: most windows are a few iterations, where numpy's per-call
        # overhead was the engine's largest cost (the floats are the same).
        oor = dict(cost.out_of_range)
        kv_first = co.sum_a + n * (G + 1)
        kv_list = None
        if self.sched.kv_cap is None:
            times = cost.decode_window_times(n, kv_first, k)
        else:
            kv_list = self._kv_attended(k)
            times = cost.decode_times_list(n, kv_list)
        priced = k
        if self._after:
            self._after_prefill_window(times)
        times[0] += self._work_s()
        if self._bg_copy_left_s > 0:
            arr = np.array(times)
            self._background_penalty(arr)
            times = arr.tolist()
        per_event = 0.0
        if events is not None:
            per_event = alloc.window_event_s(cost)
            times[1:] = [t + e * per_event for t, e in zip(times[1:], events)]
            if self.stale_after_s is not None and self.sched.waiting:
                # A queued request turning stale ends the window there: stepping drops it at that boundary.
                j = self._stale_cut(times)
                if j < k:
                    k, times, events = j, times[:j], events[: j - 1] if j > 1 else None
        frag = self._ext_frag()
        return _Window(
            times,
            k,
            float(alloc.reserved_tokens()),
            float(alloc.used_total),
            events,
            per_event,
            frag,
            bool(self.sched.waiting) and not self._late,
            n,
            oor,
            priced,
            kv_first,
            kv_list,
        )

    def _window_end(self, plan: StepPlan | None, w: _Window, m: int, ends: list) -> None:
        """Account the ``m`` iterations of window ``w`` that ran (``plan`` is ``None`` when the
        cohort was all that ran and the queue could not move), then end what completed."""
        if self._after:
            self._after_prefill_ran(m)
        if m < w.priced and self.cost.out_of_range != w.oor:
            self._oor_ran(w.members, m, w.priced, w.kv_first, w.kv_list)
        used_s, reserved_s, reserved = self._advance_window(m, w)
        paused_s = 0.0
        queued_from = self._queued_from(w.waiting_at_start, m)
        if (plan is not None and plan.paused) or (queued_from < m and self._breaker is not None):
            paused_s = self._paused_s(plan, np.array(reserved), np.array(w.times[:m]), queued_from)
        now = clock(self.env)
        self.stats.window(now, m, ends[m - 1], w.times[0], used_s, reserved_s, w.frag, paused_s, w.members)
        self.G += m
        if self._held:
            self._tick_held(now, ends, m)
        out = self._window_seen(now, ends, m, w.members)
        fin = self._fin
        if (fin and fin[0][0] <= self.G) or self._completing is not None:
            done: list[Request] = []
            self._pop_finished(done)
            self._finish(done, now, out)
