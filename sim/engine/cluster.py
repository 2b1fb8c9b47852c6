"""Run a scenario: workload → router → replicas, in one SimPy environment."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Generator

import simpy

from sim import NATIVE_STATE
from sim.config import Scenario
from sim.cost.model import CostModel
from sim.engine.budget import RunBudget, run_within
from sim.engine.deployment import Deployment
from sim.output.metrics import Recorder, clean_json, summarize
from sim.output.results import RunResult
from sim.engine.replica import Replica
from sim.request import EXCEEDS_MAX_MODEL_LEN, REJECTED, Request
from sim.engine.router import Router
from sim.sched.continuous import ContinuousScheduler
from sim.sched.static_batch import StaticBatchScheduler
from sim.workload.generator import build_workload, total_length_percentile

ProgressFn = Callable[[int, int], None]


def simulate(sc: Scenario, progress: ProgressFn | None = None, out_dir: str | Path | None = None,
             budget: RunBudget | None = None) -> RunResult:
    """Simulate ``sc`` to the end of its workload. Same scenario and seed ⇒ identical result.

    With ``out_dir``, request and time-series rows stream to Parquet files there as the run goes.
    With ``budget`` (:mod:`sim.engine.budget`), the request count is checked before the event loop
    and events and wall time while it runs.
    """
    wall0 = time.perf_counter()
    if budget is not None:
        budget.check_scenario(sc)
    wl = build_workload(sc)
    if budget is not None:
        budget.check_workload(wl)
    dep = Deployment.from_scenario(sc, lambda q: total_length_percentile(sc, wl, q))
    env = simpy.Environment()
    out = Path(out_dir) if out_dir is not None else None
    rec = Recorder(dep.kv_bytes_per_token, out, sc.timeseries.every_s)
    total = len(wl)
    max_len = sc.workload.max_model_len
    done_count = [0]
    step = max(1, total // 100)

    def on_finish(req: Request) -> None:
        done_count[0] += 1
        if progress is not None and done_count[0] % step == 0:
            progress(done_count[0], total)
        if closed_loop and req.client >= 0:
            env.process(_client_next(req.client))

    cost: CostModel | None = None
    replicas: list[Replica] = []
    for i in range(sc.gpu.replicas):
        alloc = dep.make_allocator(sc)
        if cost is None:
            cost = dep.make_cost_model(sc)
        swap = sc.allocator.preemption.swap_capacity_bytes if sc.allocator.preemption.mode == "swap" else 0
        sched_cls = StaticBatchScheduler if sc.scheduler.kind == "static_batch" else ContinuousScheduler
        sched: Any = sched_cls(sc.scheduler, alloc, dep.model.sliding_window, swap_capacity_bytes=swap)
        sched.hash_block_tokens = wl.hash_block_tokens
        sched.victim_policy = sc.allocator.preemption.victim
        replicas.append(Replica(env, i, sched, alloc, cost, rec, fast_forward=sc.engine.mode == "fast_forward",
                                overflow=sc.allocator.overflow, on_finish=on_finish,
                                compaction=sc.allocator.compaction if sc.allocator.compaction.enabled else None,
                                stale_after_s=sc.allocator.stale_after_s if sc.allocator.kind == "hybrid_reserve" else None))
    assert cost is not None  # at least one replica (the config requires it)
    router = Router(sc.router, replicas, wl.hash_block_tokens)
    prompts: list[int] = wl.prompt_tokens.tolist()
    outputs: list[int] = wl.output_tokens.tolist()

    hashes = wl.hashes
    priority = wl.priority

    def submit(rid: int, client: int = -1) -> None:
        req = Request(rid, prompts[rid], outputs[rid], env._now, client, hashes[rid] if hashes is not None else None,
                      int(priority[rid]) if priority is not None else 0)
        if req.prompt + req.output > max_len:
            req.status, req.reason, req.finish = REJECTED, EXCEEDS_MAX_MODEL_LEN, env._now
            rec.request_done(req)
            on_finish(req)
            return
        router.pick(req).submit(req)

    closed_loop = wl.arrival_s is None
    next_id = [0]

    def _client_next(client: int) -> Generator[simpy.Event, Any, None]:
        if wl.think_time_s > 0:
            yield env.timeout(wl.think_time_s)
        rid = next_id[0]
        if rid >= total or (wl.duration_s is not None and env._now > wl.duration_s):
            return
        next_id[0] += 1
        submit(rid, client)

    arrivals: list[float] = wl.arrival_s.tolist() if wl.arrival_s is not None else []
    next_arrival = [0]

    def arrive(_event: object = None) -> None:
        # A callback chain, not a process: one timeout per distinct arrival time and no generator
        # to resume (this runs once per request). Same order and times as a process would give.
        rid = next_arrival[0]
        now = env._now
        while rid < len(arrivals) and arrivals[rid] <= now:
            submit(rid)
            rid += 1
        next_arrival[0] = rid
        if rid < len(arrivals):
            env.timeout(arrivals[rid] - now).callbacks.append(arrive)

    if closed_loop:
        for c in range(min(wl.closed_loop_clients, total)):
            next_id[0] += 1
            submit(c, c)
    else:
        arrive()
    if budget is None:
        env.run()
    else:
        run_within(env, budget, wall0)
    rec.close()
    # Closed loop bounded by duration stops sending: only requests that were sent exist.
    summary = summarize(rec, replicas, dep.kv_bytes_per_token)
    summary.update({
        "scenario": sc.name,
        "seed": sc.seed,
        "allocator": sc.allocator.kind,
        "engine_mode": sc.engine.mode,
        "cost_model": cost.name,
        "cost_model_calibrated": cost.calibrated,
        "cost_model_out_of_range": dict(sorted(cost.out_of_range.items())),
        "kv_bytes_per_token": dep.kv_bytes_per_token,
        "reserve_tokens": dep.reserve_tokens,
        "sim_events": next(env._eid),  # SimPy's event counter: every event ever scheduled
        "windows": int(sum(r.windows for r in replicas)),
    })
    # Which engine ran (sim/native.py): same results either way, about twice the speed compiled.
    info = {"wall_s": time.perf_counter() - wall0, "hot_path": NATIVE_STATE}
    if progress is not None:
        progress(total, total)
    return RunResult(sc, clean_json(summary), rec, out, info)
