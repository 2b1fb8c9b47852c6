"""Run a scenario: workload → router → replicas, in one SimPy environment."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from sim import NATIVE_STATE, __version__
from sim.allocators.capabilities import LengthHints
from sim.config import Scenario, SchedulerConfig
from sim.cost.breakdown import PartsMeter
from sim.cost.model import BatchShape, CostModel
from sim.engine.budget import RunBudget, run_within
from sim.engine.deployment import Deployment, with_engine_defaults
from sim.engine.replica import Later, Replica
from sim.engine.router import Router
from sim.engine.simpy_shortcuts import events_scheduled, now as clock
from sim.errors import ConfigError
from sim.output.metrics import Recorder, clean_json, percentiles, summarize
from sim.output.provenance import cost_model_block
from sim.output.results import RunResult
from sim.request import EXCEEDS_MAX_MODEL_LEN, REJECTED, Request
from sim.sched.registry import make_scheduler
from sim.workload.generator import Workload, build_workload, total_length_percentile
from sim.workload.predictor import LengthPredictor, make_predictor

ProgressFn = Callable[[int, int], None]
#: Called with each request as it ends (completed or rejected); returning True ends the run there.
StopFn = Callable[[Request], bool]


def request_cycle_s(cost: CostModel, wl: Workload, sched: SchedulerConfig) -> float:
    """One closed-loop request's cycle, estimated from the cost model: its prompt prefilled alone
    (in chunks of the token budget), then its output decoded at the full concurrency, at the mean
    prompt and output lengths."""
    counted = dict(cost.out_of_range)  # an estimate, not part of the run: leave its counts out
    p = max(1, int(round(float(np.mean(wl.prompt_tokens)))))
    o = max(1, int(round(float(np.mean(wl.output_tokens)))))
    budget = max(1, sched.max_num_batched_tokens)
    prefill, done = 0.0, 0
    while done < p:
        chunk = min(budget, p - done)
        prefill += cost.step_time_s(BatchShape(prefill_chunks=[(chunk, done)]))
        done += chunk
    n = max(1, min(wl.closed_loop_clients, sched.max_num_seqs))
    decode = cost.step_time_s(BatchShape(decode_seqs=n, decode_kv_tokens=n * (p + o // 2)))
    cost.out_of_range.clear()
    cost.out_of_range.update(counted)
    return prefill + o * decode


def client_wait_stats(waits: list[float]) -> dict[str, float | None]:
    """p50, p90, p99, mean and max of the seconds requests waited in the client for a free slot
    (``workload.arrival.max_concurrency``); ``None`` each with no request sent."""
    w = np.asarray(waits, dtype=np.float64)
    return {**percentiles(w), "max": float(w.max()) if w.size else None}


class _ToEngine:
    """The callback that hands a request to a replica once the front end is done with it."""

    def __init__(self, router: Router, req: Request):
        self.router, self.req = router, req

    def __call__(self, _event: object) -> None:
        self.router.pick(self.req).submit(self.req)


def length_predictor(sc: Scenario, wl: Workload) -> LengthPredictor:
    """``allocator.length_predictor`` for ``sc``; ``quantile`` is fitted on the lengths ``wl`` is drawn
    from (:meth:`Workload.reference_lengths`), never on its own requests."""
    a = sc.allocator
    reference = wl.reference_lengths() if a.length_predictor == "quantile" else None
    return make_predictor(a.length_predictor, a.predictor_quantile, reference)


def simulate(
    sc: Scenario,
    progress: ProgressFn | None = None,
    out_dir: str | Path | None = None,
    budget: RunBudget | None = None,
    stop: StopFn | None = None,
    step_breakdown: bool = False,
) -> RunResult:
    """Simulate ``sc`` to the end of its workload. Same scenario and seed ⇒ identical result.

    With ``out_dir``, request and time-series rows stream to Parquet files there as the run goes.
    With ``budget`` (:mod:`sim.engine.budget`), the request count is checked before the event loop
    and events and wall time while it runs.
    With ``stop``, the run ends at the first request end for which ``stop`` returns True (the
    planner's sequential test); the result then covers the requests ended so far and
    ``info["halted"]`` is True.
    With ``step_breakdown`` (the scenario in ``engine.mode: step``), ``summary["step_time_breakdown"]``
    says where the replicas' busy time went (:mod:`sim.cost.breakdown`).
    """
    wall0 = time.perf_counter()
    if step_breakdown and sc.engine.mode != "step":
        raise ConfigError(
            "engine.mode",
            sc.engine.mode,
            "step for a step-time breakdown (one priced iteration per iteration run; same results)",
        )
    sc = with_engine_defaults(sc)
    if budget is not None:
        budget.check_scenario(sc)
    wl = build_workload(sc)
    if budget is not None:
        budget.check_workload(wl)
    dep = Deployment.from_scenario(sc, lambda q: total_length_percentile(wl, q))
    env = simpy.Environment()
    out = Path(out_dir) if out_dir is not None else None
    rec = Recorder(dep.kv_slot_bytes, out, sc.timeseries.every_s)
    total = len(wl)
    max_len = sc.workload.max_model_len
    done_count = [0]
    step = max(1, total // 100)
    halt = env.event() if stop is not None else None

    per_token_s = sc.workload.arrival.completion_per_token_s
    reader_free = [0.0]

    def _send_next(client: int) -> None:
        env.process(_client_next(client))

    def on_finish(req: Request) -> None:
        done_count[0] += 1
        if halt is not None and stop is not None and not halt.triggered and stop(req):
            halt.succeed()
        if progress is not None and done_count[0] % step == 0:
            progress(done_count[0], total)
        if cap is not None:
            # Its end frees the client's slot: the longest-waiting due request goes out now.
            in_flight[0] -= 1
            release_held()
        if closed_loop and req.client >= 0:
            if per_token_s > 0:
                # One finished request at a time: a response waits for those before it.
                now = clock(env)
                done = max(now, reader_free[0]) + per_token_s * req.output
                reader_free[0] = done
                env.timeout(done - now).callbacks.append(Later(_send_next, req.client))
            else:
                env.process(_client_next(req.client))

    cost: CostModel | None = None
    meter: PartsMeter | None = None
    predictor: LengthPredictor | None = None
    replicas: list[Replica] = []
    for i in range(sc.gpu.replicas):
        alloc = dep.make_allocator(sc)
        if cost is None:
            cost = dep.make_cost_model(sc)
            if step_breakdown:
                meter = PartsMeter(cost)
        if predictor is None and isinstance(alloc, LengthHints):
            predictor = length_predictor(sc, wl)
        swap = sc.allocator.preemption.swap_capacity_bytes if sc.allocator.preemption.mode == "swap" else 0
        sched = make_scheduler(
            dep.scheduler or sc.scheduler,
            alloc,
            kv_cap=dep.model.uniform_sliding_window,
            window_kv_cap=dep.model.mixed_window,
            swap_capacity_bytes=swap,
            hash_block_tokens=wl.hash_block_tokens,
            victim_policy=sc.allocator.preemption.victim,
            length_predictor=predictor,
        )
        replicas.append(
            Replica(
                env,
                i,
                sched,
                alloc,
                cost if meter is None else meter,
                rec,
                fast_forward=sc.engine.mode == "fast_forward",
                overflow=sc.allocator.overflow,
                on_finish=on_finish,
                compaction=sc.allocator.compaction if sc.allocator.compaction.enabled else None,
                stale_after_s=sc.allocator.stale_after_s if sc.allocator.kind == "hybrid_reserve" else None,
                stream_per_token_s=dep.engine.stream_per_token_s if dep.engine is not None else 0.0,
                schedule_ahead=dep.engine.schedule_ahead if dep.engine is not None else False,
                first_token_lag=dep.engine.first_token_lag if dep.engine is not None else 0,
            )
        )
    assert cost is not None  # at least one replica (the config requires it)
    split = (
        (sc.length_split.prompt_tokens, sc.length_split.long_replicas(sc.gpu.replicas))
        if sc.router == "length_split"
        else (0, 0)
    )
    router = Router(sc.router, replicas, wl.hash_block_tokens, split)
    prompts: list[int] = wl.prompt_tokens.tolist()
    outputs: list[int] = wl.output_tokens.tolist()

    hashes = wl.hashes
    priority = wl.priority
    front_s = (dep.engine.frontend_s if dep.engine is not None else 0.0) + sc.workload.arrival.client_s
    front_tok_s = dep.engine.frontend_per_token_s if dep.engine is not None else 0.0
    jitter: list[float] | None = wl.frontend_jitter.tolist() if wl.frontend_jitter is not None else None
    think: list[float] | None = wl.think_s.tolist() if wl.think_s is not None else None

    def submit(rid: int, client: int = -1) -> None:
        t = clock(env)
        req = Request(
            rid,
            prompts[rid],
            outputs[rid],
            t,
            client,
            hashes[rid] if hashes is not None else None,
            int(priority[rid]) if priority is not None else 0,
        )
        if req.prompt + req.output > max_len:
            req.status, req.reason, req.finish = REJECTED, EXCEEDS_MAX_MODEL_LEN, t
            rec.request_done(req)
            on_finish(req)
            return
        delay = front_s + front_tok_s * req.prompt
        if jitter is not None:
            delay *= jitter[rid]
        if delay > 0:
            # The server's front end (HTTP, tokenisation) holds the request before the engine sees it;
            # its arrival stays the client's send time, so TTFT counts the front end.
            env.timeout(delay).callbacks.append(_ToEngine(router, req))
            return
        router.pick(req).submit(req)

    closed_loop = wl.arrival_s is None
    next_id = [0]

    def _client_next(client: int) -> Generator[simpy.Event, Any, None]:
        if think is not None:
            yield env.timeout(think[min(next_id[0], len(think) - 1)])
        elif wl.think_time_s > 0:
            yield env.timeout(wl.think_time_s)
        rid = next_id[0]
        if rid >= total or (wl.duration_s is not None and clock(env) > wl.duration_s):
            return
        next_id[0] += 1
        submit(rid, client)

    arrivals: list[float] = wl.arrival_s.tolist() if wl.arrival_s is not None else []
    next_arrival = [0]
    # The client's cap on requests in flight (open loop only): requests due while it is reached
    # wait in ``held``, first come first served; each is sent (its arrival at the server) when a
    # request in flight ends. ``client_wait`` is each sent request's seconds from due to sent.
    cap = None if closed_loop else wl.max_concurrency
    held: deque[int] = deque()
    in_flight = [0]
    releasing = [False]
    client_wait: list[float] = []

    def release_held() -> None:
        # A request rejected as it is sent ends inside ``submit`` and lands here again: the outer
        # loop goes on sending instead, so the order stays FIFO and the stack flat.
        if releasing[0] or cap is None:
            return
        releasing[0] = True
        now = clock(env)
        while held and in_flight[0] < cap:
            rid = held.popleft()
            in_flight[0] += 1
            client_wait.append(max(0.0, now - arrivals[rid]))
            submit(rid)
        releasing[0] = False

    def arrive(_event: object = None) -> None:
        # A callback chain, not a process: one timeout per distinct arrival time and no generator
        # to resume (this runs once per request). Same order and times as a process would give.
        rid = next_arrival[0]
        now = clock(env)
        while rid < len(arrivals) and arrivals[rid] <= now:
            if cap is None:
                submit(rid)
            else:
                held.append(rid)
            rid += 1
        next_arrival[0] = rid
        release_held()
        if rid < len(arrivals):
            env.timeout(arrivals[rid] - now).callbacks.append(arrive)

    def start(client: int) -> None:
        rid = next_id[0]
        if rid >= total:
            return
        next_id[0] += 1
        submit(rid, client)

    if closed_loop:
        offsets = wl.start_offsets
        spread_s = 0.0
        if offsets is not None:
            arr = sc.workload.arrival
            spread_s = arr.start_spread_s
            if arr.start_spread_cycles > 0:
                spread_s += arr.start_spread_cycles * request_cycle_s(cost, wl, sc.scheduler)
        for c in range(min(wl.closed_loop_clients, total)):
            if offsets is not None and offsets[c] * spread_s > 0:
                env.timeout(float(offsets[c]) * spread_s).callbacks.append(Later(start, c))
            else:
                start(c)
    else:
        arrive()
    if budget is not None:
        run_within(env, budget, wall0, until=halt)
    elif halt is None:
        env.run()
    else:
        try:
            env.run(until=halt)
        except RuntimeError:
            # SimPy's "no scheduled events left": every request ended without ``stop`` saying so.
            if halt.triggered or env.peek() != float("inf"):
                raise
    rec.close()
    # Closed loop bounded by duration stops sending: only requests that were sent exist.
    summary = summarize(rec, replicas, dep.kv_slot_bytes)
    if predictor is not None and "length_predictor" in summary:
        summary["length_predictor"] = {**predictor.describe(), **summary["length_predictor"]}
    summary.update(
        {
            "kvsim_version": __version__,
            "scenario": sc.name,
            "seed": sc.seed,
            "allocator": sc.allocator.kind,
            "engine_mode": sc.engine.mode,
            "engine": sc.engine.kind,  # resolved by with_engine_defaults: the serving engine's preset, or reference
            "cost_model": cost.name,
            "cost_model_calibrated": cost.calibrated,
            # Which profile priced the run, from the bytes the cost model parsed (sim.output.provenance).
            "cost_model_profile": cost_model_block(sc, cost),
            "cost_model_out_of_range": dict(sorted(cost.out_of_range.items())),
            "kv_bytes_per_token": dep.kv_bytes_per_token,
            "reserve_tokens": dep.reserve_tokens,
            "sim_events": events_scheduled(env),
            "windows": int(sum(r.stats.windows for r in replicas)),
        }
    )
    if cap is not None:
        # Seconds each sent request waited in the client for a slot (not in TTFT or latency).
        summary["client_wait_s"] = client_wait_stats(client_wait)
    if sc.router == "length_split":
        summary["length_split_replicas"] = split[1]
    if meter is not None:
        summary["step_time_breakdown"] = meter.breakdown(
            float(sum(r.stats.busy_s for r in replicas)), float(sum(r.stats.alloc_work_s for r in replicas))
        )
    groups = dep.kv_layer_groups()
    if groups is not None:
        summary["kv_layer_groups"] = groups
    described = cost.describe()
    if described.get("moe_kernel"):
        # Which fitted fused-MoE kernel priced the experts, and its held-out error on its table.
        summary["cost_model_moe_kernel"] = described["moe_kernel"]
    if described.get("mla_kernel"):
        summary["cost_model_mla_kernel"] = described["mla_kernel"]
    # Which engine ran (sim/native.py): same results either way, about twice the speed compiled.
    info = {
        "wall_s": time.perf_counter() - wall0,
        "hot_path": NATIVE_STATE,
        "halted": halt is not None and halt.triggered,
    }
    if progress is not None:
        progress(total, total)
    return RunResult(sc, clean_json(summary), rec, out, info)
