"""One model replica: a SimPy process running the iteration loop.

Each iteration the scheduler forms a batch, the allocator grows or frees, the
cost model prices the batch and the process yields a timeout. In
``fast_forward`` mode a batch of pure decodes whose composition cannot change
before a known iteration (the first completion, the first allocator refusal)
is advanced as one window of ``k`` iterations: their times come from one
vectorised cost-model call and the allocator applies the window's growth at
once. An arrival that could join the batch interrupts the window at the end
of the iteration in progress, exactly when per-iteration stepping would have
seen it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import simpy

from .allocators.base import Allocator
from .costmodel import CostModel
from .request import COMPLETED, EXCEEDS_RESERVATION, REJECTED, Request
from .scheduler import ContinuousScheduler, StepPlan

if TYPE_CHECKING:
    from .metrics import Recorder


class Replica:
    def __init__(self, env: simpy.Environment, index: int, scheduler: ContinuousScheduler, allocator: Allocator,
                 cost: CostModel, recorder: "Recorder", *, fast_forward: bool, overflow: str,
                 on_finish: Callable[[Request], None] | None = None):
        self.env = env
        self.index = index
        self.sched = scheduler
        self.alloc = allocator
        self.cost = cost
        self.rec = recorder
        self.fast_forward = fast_forward
        self.overflow = overflow
        self.on_finish = on_finish
        self._idle: simpy.Event | None = None
        self._in_window = False
        self._truncated = False
        # Time integrals over busy iterations, in token·seconds.
        self.used_token_s = 0.0
        self.reserved_token_s = 0.0
        self.busy_s = 0.0
        self.iterations = 0
        self.windows = 0
        self.proc = env.process(self._loop())

    # --- called by the router --------------------------------------------------------
    def outstanding(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting)

    def submit(self, req: Request) -> None:
        """Queue ``req``; wake the loop if it is idle or if ``req`` could join the current window."""
        sched = self.sched
        was_empty = not sched.waiting
        req.replica = self.index
        sched.waiting.append(req)
        if self._idle is not None:
            if not self._idle.triggered:
                self._idle.succeed()
        elif self._in_window and not self._truncated and was_empty and sched.can_admit_more():
            self._truncated = True
            self.proc.interrupt()

    # --- the loop ----------------------------------------------------------------------
    def _loop(self):
        env = self.env
        sched = self.sched
        while True:
            if not sched.running and not sched.waiting:
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            plan = sched.schedule()
            now = env.now
            for req in plan.admitted:
                if req.admitted < 0:
                    req.admitted = now
            for req in plan.rejected_at_admission:
                self._end(req, REJECTED, now)
            for req in plan.overflowed:
                if self.overflow == "truncate":
                    req.truncated = True
                    self._end(req, COMPLETED, now)
                else:
                    req.reason = EXCEEDS_RESERVATION
                    self._end(req, REJECTED, now)
            if not plan.items:
                if sched.running or not sched.waiting:
                    continue
                raise RuntimeError(f"replica {self.index}: a waiting request cannot be admitted into an empty replica")
            if self.fast_forward and plan.pure_decode and plan.preempted == 0:
                yield from self._decode_window(plan)
            else:
                yield from self._single_step(plan)

    def _single_step(self, plan: StepPlan):
        dt = self.cost.step_time_s(plan.batch)
        st = self.alloc
        used = st.used_total
        reserved = st.reserved_tokens()
        yield self.env.timeout(dt)
        self.used_token_s += used * dt
        self.reserved_token_s += reserved * dt
        self.busy_s += dt
        self.iterations += 1
        self.windows += 1
        self.rec.step(self, 1, dt, dt, plan.batch.num_tokens)
        now = self.env.now
        done = []
        for req, n in plan.items:
            req.computed += n
            if req.computed == req.prompt + req.generated:
                req.generated += 1
                if req.first_token < 0:
                    req.first_token = now
                if req.generated >= req.output:
                    done.append(req)
        self._finish(done, now)

    def _decode_window(self, plan: StepPlan):
        env = self.env
        reqs = [r for r, _ in plan.items]
        n = len(reqs)
        ids = [r.id for r in reqs]
        tokens_now = np.fromiter((r.computed + 1 for r in reqs), dtype=np.int64, count=n)
        max_steps = min(r.output - r.generated for r in reqs)
        dp = self.alloc.decode_plan(ids, tokens_now, max_steps)
        k = dp.steps
        j = np.arange(k, dtype=np.int64)
        cap = self.sched.kv_cap
        if cap is None:
            kv = float(tokens_now.sum()) + n * j.astype(np.float64)
        else:
            kv = np.minimum(tokens_now[None, :] + j[:, None], cap).sum(axis=1).astype(np.float64)
        times = self.cost.decode_times_s(n, kv)
        ends = np.cumsum(times)
        t0 = env.now
        m = k
        if k > 1:
            self._in_window = True
            self._truncated = False
        try:
            yield env.timeout(float(ends[-1]))
        except simpy.Interrupt:
            # Finish the iteration in progress, then stop the window there.
            done_steps = int(np.searchsorted(ends, env.now - t0, side="right"))
            m = min(done_steps + 1, k)
            while True:
                try:
                    yield env.timeout(max(0.0, t0 + float(ends[m - 1]) - env.now))
                    break
                except simpy.Interrupt:
                    continue
        self._in_window = False
        self._truncated = False
        tm = times[:m]
        self.used_token_s += float(np.dot(dp.used_tokens[:m], tm))
        self.reserved_token_s += float(np.dot(dp.reserved_tokens[:m], tm))
        wall = float(ends[m - 1])
        self.busy_s += wall
        self.iterations += m
        self.windows += 1
        if m > 1:
            self.alloc.advance_decode(ids, tokens_now + (m - 1))
        self.rec.step(self, m, wall, float(times[0]), n)
        now = env.now
        done = []
        for r in reqs:
            r.computed += m
            r.generated += m
            if r.generated >= r.output:
                done.append(r)
        self._finish(done, now)

    def _finish(self, done: list[Request], now: float) -> None:
        for req in done:
            self.sched.running.remove(req)
            self.alloc.release(req.id)
            self._end(req, COMPLETED, now)

    def _end(self, req: Request, status: str, now: float) -> None:
        req.status = status
        req.finish = now
        self.rec.request_done(req)
        if self.on_finish is not None:
            self.on_finish(req)
