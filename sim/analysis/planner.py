"""Capacity planning: goodput per allocation strategy, GPUs for a target rate, a recommendation.

For each candidate allocator configuration (:data:`CANDIDATES`) the planner finds its
**goodput** (DistServe): the highest Poisson arrival rate (``workload.arrival.rate``, requests/s
offered to the whole deployment) at which at least the target fraction of requests meet every
SLO (:mod:`sim.analysis.slo`). The search doubles (or halves) the scenario's rate until the attainment
target is bracketed, then bisects geometrically until the bracket is within a relative
tolerance ``tol`` (default 5 %), and finally *verifies* the answer: attainment at the reported
goodput is ≥ the target and at goodput × (1 + tol) it is not (if a noisy, non-monotone curve
passes there, the search continues above). With a target rate it also finds the fewest
``gpu.replicas`` (n passes, n − 1 does not) that sustain that rate; ``workload.num_requests`` is
scaled with the replica count so each replica sees as many requests as in the base scenario.

At the operating point (the goodput, or the target rate on the chosen replica count, over the
same scaled request count the replica search ran) it measures what the seed article reasons
with: memory waste (1 − KV token utilization), internal and external fragmentation over time,
decode-step jitter (p99/p50 of the iteration latency of decode-only iterations; the article's
rule: a spike above 10 % of p50), preemptions and rejections; :mod:`sim.analysis.recommend` turns
them into a recommendation and :mod:`sim.analysis.plan_output` into ``plan.json``, ``plan.html``
and the terminal table.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.analysis.recommend import recommend, seed_intervals
from sim.analysis.search import (
    DEFAULT_TOL,
    MAX_EVALS,
    GoodputSearch,
    fewest_replicas,
    find_goodput,
    find_goodput_guided,
    interpolated_goodput,
)
from sim.analysis.sequential import DEFAULT_CONFIDENCE
from sim.analysis.slo import SLO, attainment, miss_shares
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.budget import BudgetExceeded, RunBudget
from sim.errors import ConfigError
from sim.limits import MAX_RATE, MIN_RATE

__all__ = [
    "CANDIDATES",
    "DEFAULT_TOL",
    "MAX_EVALS",
    "GoodputSearch",
    "fewest_replicas",
    "find_goodput",
    "find_goodput_guided",
    "interpolated_goodput",
    "measure",
    "plan",
    "plan_candidate",
]

#: Candidate allocator configurations: name → overrides (dotted scenario keys) and the
#: strategy in the seed article's words. Adding a candidate is one entry; a candidate whose
#: allocator kind this build lacks is skipped with a message. ``upper_bound``: the candidate reads
#: what no server knows (hybrid_tail's oracle length predictor): planned and shown for reference,
#: never recommended. ``default: False``: planned only when named (``--allocators``).
CANDIDATES: dict[str, dict[str, Any]] = {
    "static": {
        "overrides": {"allocator.kind": "static", "allocator.reserve": "max_model_len", "allocator.overflow": "reject"},
        "strategy": "static: reserve max_model_len per request",
    },
    "static-p95": {
        "overrides": {"allocator.kind": "static", "allocator.reserve": "p95", "allocator.overflow": "truncate"},
        "strategy": "static at the p95 length ceiling, longer prompts refused and longer answers truncated",
    },
    "static-p95-fallback": {
        "overrides": {"allocator.kind": "static", "allocator.reserve": "p95", "allocator.overflow": "fallback"},
        "strategy": "static at the p95 length ceiling, longer requests moved to a paged fallback region (10 % of KV)",
    },
    "paged": {
        "overrides": {"allocator.kind": "paged", "allocator.block_size": 16},
        "strategy": "dynamic, paged block pool (block 16 tokens)",
    },
    "paged-b32": {
        "overrides": {"allocator.kind": "paged", "allocator.block_size": 32},
        "strategy": "dynamic, paged block pool (block 32 tokens)",
    },
    "dynamic": {
        "overrides": {"allocator.kind": "dynamic"},
        "strategy": "dynamic contiguous growth (realloc-and-copy)",
    },
    "hybrid_tail": {
        "overrides": {"allocator.kind": "hybrid_tail", "allocator.length_predictor": "prompt"},
        "strategy": "hybrid: static floor for the long tail + paged rest; long once the prompt alone is (a request "
        "that outgrows the threshold moves to a slot)",
    },
    "hybrid_tail-quantile": {
        "overrides": {"allocator.kind": "hybrid_tail", "allocator.length_predictor": "quantile"},
        "strategy": "hybrid: static floor for the long tail + paged rest; long predicted from the prompt (prompt + "
        "p90 of the output given the prompt)",
        "default": False,
    },
    "hybrid_tail-oracle": {
        "overrides": {"allocator.kind": "hybrid_tail", "allocator.length_predictor": "oracle"},
        "strategy": "hybrid_tail routed by each request's true length (oracle): an upper bound, not a strategy a "
        "server can run",
        "upper_bound": True,
    },
    "hybrid_reserve": {
        "overrides": {"allocator.kind": "hybrid_reserve"},
        "strategy": "hybrid: emergency reserve + eviction + admission breaker",
    },
}

#: What ``--target-rate`` may be: it becomes ``workload.arrival.rate``, so that key's range, checked
#: before any simulation rather than by every candidate's first run.
TARGET_RATE_ALLOWED = (
    f"requests/s in [{MIN_RATE:g}, {MAX_RATE:g}] (the range of workload.arrival.rate, offered to the whole deployment)"
)
#: Goodput searches: ``guided`` (default: saturation estimate, quick runs that stop when decided,
#: full runs only to settle the answer) and ``exhaustive`` (every probe a full run).
SEARCHES = ("guided", "exhaustive")
#: Workload seeds per candidate by default (one: the plan stays fast; ``--seeds`` adds intervals).
DEFAULT_SEEDS = 1
#: The guided search's first rate, as a fraction of the cost model's saturation estimate.
START_FRACTION = 0.9
#: Quick runs may stop on the sequential test's statistical pass only at loads up to this fraction
#: of the saturation estimate (per replica); above it only misses (certain or tested) stop them.
#: Near saturation the queue makes long excursions that a run's first requests cannot foresee:
#: at 0.97 of saturation on chat-api the test passed runs whose full attainment was 0.78.
TESTED_MAX_LOAD = 0.8
#: Nor when fewer than this many of the workload's longest requests fit at once in the memory
#: that holds them (:func:`sim.analysis.saturation.tail_room`): two long requests that coincide
#: then queue or preempt each other, which is rare enough not to show in a run's first requests
#: (with a static p95 reservation and a fallback region holding 1.6 of them, the test would pass
#: runs after 450 of 800 requests at 0.92 attainment whose complete runs reach 0.56-0.73).
MIN_TAIL_ROOM = 2.0


# --- measurements at a point ----------------------------------------------------------


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    return float(v[min(np.searchsorted(cum, q / 100.0 * cum[-1]), len(v) - 1)])


def measure(result, slo: SLO) -> dict:
    """The operating-point facts of one run (see the module docstring)."""
    from sim.analysis.columns import column
    from sim.analysis.plots import decode_only_mask, fragmentation_series

    s = result.summary
    ts = result.timeseries
    out = {
        "attainment": attainment(result.requests, slo),
        "ttft_p90_s": s["ttft_s"]["p90"],
        "tpot_p90_s": s["tpot_s"]["p90"],
        "e2e_p90_s": s["e2e_s"]["p90"],
        "throughput_requests_per_s": s["throughput_requests_per_s"],
        "throughput_tokens_per_s": s["throughput_tokens_per_s"],
        "kv_token_utilization": s["kv_token_utilization"],
        "memory_waste": None if s["kv_token_utilization"] is None else 1.0 - s["kv_token_utilization"],
        "kv_memory_utilization": s["kv_memory_utilization"],
        "preemptions": s["preemptions"],
        "rejected": s["rejected"],
        "rejected_by_reason": s["rejected_by_reason"],
        "truncated": s["truncated"],
        "requests": s["requests"],
        "reserve_tokens": s.get("reserve_tokens"),
        "allocation_time_s": s.get("allocation_time_s"),
        "external_frag_mean": None,
        "external_frag_max": None,
        "decode_step_p50_ms": None,
        "decode_step_p99_ms": None,
        "decode_jitter": None,
        "decode_batch_p50": None,
        "decode_batch_p99": None,
    }
    if ts.num_rows:
        t, _internal, external = fragmentation_series(ts)
        dt = np.diff(t, append=t[-1])  # each state holds until the next change
        if dt.sum() > 0:
            out["external_frag_mean"] = float(np.dot(external, dt) / dt.sum())
        out["external_frag_max"] = float(external.max())
        dec = decode_only_mask(ts)
        if dec.any():
            step = column(ts, "first_step_s")[dec]
            # A fast-forwarded row stands for `iterations` decode steps.
            w = column(ts, "iterations")[dec].astype(np.float64)
            p50, p99 = _weighted_percentile(step, w, 50), _weighted_percentile(step, w, 99)
            batch = column(ts, "running")[dec].astype(np.float64)
            out.update(
                decode_step_p50_ms=p50 * 1e3,
                decode_step_p99_ms=p99 * 1e3,
                decode_jitter=p99 / p50 if p50 > 0 else None,
                decode_batch_p50=_weighted_percentile(batch, w, 50),
                decode_batch_p99=_weighted_percentile(batch, w, 99),
            )
    return out


def kv_reserved_peak(ts) -> float | None:
    """The fullest replica's peak of reserved KV memory, as a share of its capacity (``None``
    without time-series rows)."""
    from sim.analysis.columns import column

    if ts.num_rows == 0:
        return None
    cap = column(ts, "kv_capacity_bytes").astype(np.float64)
    peak = column(ts, "kv_reserved_bytes_max").astype(np.float64)
    ok = cap > 0
    return float((peak[ok] / cap[ok]).max()) if ok.any() else None


def _kv_series(ts, max_points: int = 1500) -> dict:
    from sim.analysis.plots import summed_over_replicas

    if ts.num_rows == 0:
        return {"t_s": [], "reserved_gib": [], "used_gib": [], "capacity_gib": []}
    t, s = summed_over_replicas(ts, ["kv_capacity_bytes", "kv_reserved_bytes", "kv_used_bytes"])
    idx = np.unique(np.r_[np.linspace(0, t.size - 1, min(max_points, t.size)).astype(int), t.size - 1])
    g = 2.0**30
    return {
        "t_s": t[idx].round(4).tolist(),
        "reserved_gib": (s["kv_reserved_bytes"][idx] / g).round(4).tolist(),
        "used_gib": (s["kv_used_bytes"][idx] / g).round(4).tolist(),
        "capacity_gib": (s["kv_capacity_bytes"][idx] / g).round(4).tolist(),
    }


# --- one candidate (runs in a worker process) -----------------------------------------


class _Runner:
    """Simulations of one candidate: scenarios by (rate, replicas, seed offset), quick and full runs.

    Every run of a seed draws the same arrivals (scaled by the rate) and lengths, whatever the
    candidate: the workload depends only on the workload keys and the seed, which candidates
    do not touch (common random numbers: differences between candidates are not sampling noise).
    """

    def __init__(self, task: dict):
        self.task = task
        self.slo = SLO(**task["slo"])
        self.base, self.base_dir = task["base"], task["base_dir"]
        self.base_replicas, self.base_requests = task["base_replicas"], task["base_requests"]
        self.overrides = {**task["overrides"], **task.get("extra_overrides", {})}
        self.sims = self.quick_sims = self.requests = 0
        self._results: dict[tuple, Any] = {}
        #: The cost model's saturation estimate at the base replica count (requests/s), once known.
        self.saturation: float | None = task.get("saturation")
        #: How many of the longest requests fit at once where they are held, once known.
        self.tail_room: float | None = task.get("tail_room")
        budget = task.get("budget")
        #: Limits on every simulation (the explorer's; none from the CLI).
        self.budget: RunBudget | None = RunBudget(**budget) if budget else None

    def scenario(self, rate: float, replicas: int, seed: int = 0):
        """The candidate at ``rate`` on ``replicas``, with requests × replicas ÷ base replicas."""
        over = dict(self.overrides)
        over["workload.arrival.rate"] = rate
        over["gpu.replicas"] = replicas
        if self.base_requests is not None and replicas != self.base_replicas:
            over["workload.num_requests"] = max(1, round(self.base_requests * replicas / self.base_replicas))
        if seed:
            over["seed"] = self.task["base_seed"] + seed
        return scenario_from_dict(apply_overrides(self.base, over), self.base_dir)

    def _record(self, rate: float, replicas: int, seed: int, res, att: float | None, exact: bool, ended: int) -> dict:
        s = res.summary
        return {
            "rate": rate,
            "replicas": replicas,
            "seed": self.task["base_seed"] + seed,
            "attainment": att,
            "exact": exact,
            "ended": ended,
            "requests": len(res.requests) if exact else None,
            "ttft_p90_s": s["ttft_s"]["p90"],
            "tpot_p90_s": s["tpot_s"]["p90"],
            "throughput_requests_per_s": s["throughput_requests_per_s"],
            "throughput_tokens_per_s": s["throughput_tokens_per_s"],
            "completed": s["completed"],
            "rejected": s["rejected"],
            "truncated": s["truncated"],
            "preemptions": s["preemptions"],
            "misses": miss_shares(res.requests, self.slo),
            "kv_reserved_peak": kv_reserved_peak(res.timeseries),
        }

    def full(self, rate: float, replicas: int, seed: int = 0) -> tuple[dict, Any]:
        """A complete run: its probe record and result (the latest two are kept for the operating point)."""
        from sim.engine.cluster import simulate

        key = (rate, replicas, seed)
        if key not in self._results:
            res = simulate(self.scenario(rate, replicas, seed), budget=self.budget)
            self.sims += 1
            self.requests += res.requests.num_rows
            att = attainment(res.requests, self.slo)
            self._keep(key, self._record(rate, replicas, seed, res, att, True, res.requests.num_rows), res)
        return self._results[key]

    def limits(self) -> None:
        """Fill in :attr:`saturation` and :attr:`tail_room` where unknown, at the base replica count
        and the scenario's rate (one draw of the workload for both)."""
        if self.saturation is None or self.tail_room is None:
            from sim.analysis.saturation import load_limits

            sat, room = load_limits(self.scenario(self.task["start_rate"], self.base_replicas))
            self.saturation = sat if self.saturation is None else self.saturation
            self.tail_room = room if self.tail_room is None else self.tail_room

    def quick(self, rate: float, replicas: int, seed: int = 0) -> dict:
        """A run stopped as soon as its answer is decided (:mod:`sim.analysis.sequential`): on a
        statistical pass only well below saturation (:data:`TESTED_MAX_LOAD`). A run that
        completes is kept like a full one."""
        from sim.analysis.sequential import AttainmentTest
        from sim.engine.cluster import simulate
        from sim.workload.generator import build_workload

        key = (rate, replicas, seed)
        if key in self._results:
            return self._results[key][0]
        sc = self.scenario(rate, replicas, seed)
        n = sc.workload.num_requests if sc.workload.duration_s is None else len(build_workload(sc))
        sat = self.saturation
        tested_pass = bool(sat and math.isfinite(sat) and rate / replicas <= TESTED_MAX_LOAD * sat / self.base_replicas)
        if tested_pass:
            self.limits()
            tested_pass = self.tail_room is not None and self.tail_room >= MIN_TAIL_ROOM
        test = AttainmentTest(self.slo, n, self.task["confidence"], tested_pass=tested_pass)
        res = simulate(sc, budget=self.budget, stop=test)
        test.finish()
        self.sims += 1
        self.requests += test.ended
        complete = not res.run_info.get("halted")
        att = attainment(res.requests, self.slo) if complete else test.estimate
        rec = self._record(rate, replicas, seed, res, att, complete, test.ended)
        rec.update(decision=test.decision, how=test.how)
        if complete:
            self._keep(key, rec, res)
        else:
            self.quick_sims += 1
        return rec

    def _keep(self, key: tuple, rec: dict, res) -> None:
        if len(self._results) >= 2:
            self._results.pop(next(iter(self._results)))
        self._results[key] = (rec, res)


def _search_seed(runner: _Runner, task: dict, seed: int, start: float) -> tuple[GoodputSearch, list[dict], list[dict]]:
    """Goodput search on one seed at the base replica count: the search, its complete and stopped probe records."""
    from sim.analysis.search import Evaluation

    target = runner.slo.attainment
    reps = runner.base_replicas
    records: dict[float, dict] = {}

    def full(rate: float) -> float:
        records[rate] = runner.full(rate, reps, seed)[0]
        return records[rate]["attainment"]

    def evaluate(rate: float, complete: bool) -> Evaluation:
        if complete:
            rec = records[rate] = runner.full(rate, reps, seed)[0]
            return Evaluation(rec["attainment"] >= target, rec["attainment"], True, True)
        rec = records[rate] = runner.quick(rate, reps, seed)
        return Evaluation(rec["decision"] == "pass", rec["attainment"], rec["how"] != "tested", rec["exact"])

    if task["search"] == "exhaustive":
        search = find_goodput(full, start, target, task["tol"], task["max_evals"])
    else:
        search = find_goodput_guided(evaluate, start, target, task["tol"], task["max_evals"])
    done = [records[r] for r in sorted(records)]
    return search, [r for r in done if r["exact"]], [r for r in done if not r["exact"]]


def _guided_start(runner: _Runner, task: dict) -> float:
    runner.limits()
    if task.get("hint_goodput"):
        return float(task["hint_goodput"])
    sat = runner.saturation
    assert sat is not None  # limits() filled it in
    return START_FRACTION * sat if math.isfinite(sat) and sat > 0 else task["start_rate"]


def plan_candidate(task: dict) -> dict:
    """Goodput search (per seed), replica search and operating point of one candidate. Never raises."""
    name = task["name"]
    runner = _Runner(task)
    slo = runner.slo
    base_replicas = runner.base_replicas
    guided = task["search"] == "guided"
    out: dict[str, Any] = {
        "name": name,
        "strategy": task["strategy"],
        "overrides": task["overrides"],
        "upper_bound": bool(task.get("upper_bound")),
        "status": "ok",
        "message": "",
        "probes": [],
        "quick_probes": [],
        "replica_probes": [],
    }
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        start = _guided_start(runner, task) if guided else task["start_rate"]
        out["saturation_estimate_rps"] = runner.saturation
        search, probes, quick = _search_seed(runner, task, 0, start)
        out["tail_room"] = runner.tail_room
        out["probes"], out["quick_probes"] = probes, quick
        out["search_status"] = search.status
        out["goodput_rps"] = search.goodput
        out["goodput_est_rps"] = search.estimate(slo.attainment)
        out["goodput_per_gpu_rps"] = search.goodput / (base_replicas * task["tp"])
        out["replicas"] = base_replicas
        out["gpus"] = base_replicas * task["tp"]
        out["verify"] = {
            "rate": search.goodput,
            "attainment": search.probes.get(search.goodput),
            "next_rate": search.next_rate,
            "next_attainment": search.next_attainment,
            "next_exact": search.next_rate in search.probes,
        }
        seeds = [
            {
                "seed": task["base_seed"],
                "goodput_rps": search.goodput,
                "goodput_est_rps": out["goodput_est_rps"],
                "status": search.status,
            }
        ]
        for k in range(1, task["seeds"]):
            hint = out["goodput_est_rps"] if search.status == "ok" else start
            s_k, p_k, q_k = _search_seed(runner, task, k, hint if guided else task["start_rate"])
            seeds.append(
                {
                    "seed": task["base_seed"] + k,
                    "goodput_rps": s_k.goodput,
                    "goodput_est_rps": s_k.estimate(slo.attainment),
                    "status": s_k.status,
                    "probes": p_k,
                    "quick_probes": q_k,
                }
            )
        out["seed_goodputs"] = seeds
        if search.status == "infeasible":
            lowest = min([*probes, *quick], key=lambda p: p["rate"])
            out["status"] = "infeasible"
            out["message"] = (
                f"even at {lowest['rate']:.3g} req/s only {lowest['attainment']:.0%} of requests meet the "
                f"SLO ({lowest['rejected']} rejected, {lowest['truncated']} truncated"
                + ("" if lowest["exact"] else f", of the first {lowest['ended']} to end")
                + ")"
            )
            return out
        if search.goodput <= 0.0:
            # No rate was confirmed to meet the SLO within the budget: nothing to operate at.
            out["status"] = "budget"
            out["message"] = "evaluation budget spent before any rate was confirmed to meet the SLO"
            return out
        if search.status != "ok":
            out["message"] = {
                "unbounded": "attainment met at every rate tried: goodput is a lower bound",
                "budget": "evaluation budget spent: goodput is a lower bound",
            }[search.status]
        if task.get("upper_bound"):
            # Never recommended, and its reason line reads only its goodput: no replica search and
            # no operating point (they were half of its simulated requests).
            return out
        op_rate, op_replicas = search.goodput, base_replicas
        target_rate = task.get("target_rate")
        if target_rate:
            n = _replica_search(runner, task, out, search.goodput)
            out["replicas_needed"] = n
            out["gpus_needed"] = None if n is None else n * task["tp"]
            if n is not None:
                op_rate, op_replicas = target_rate, n
        if task.get("operating_point", True):
            # The run at the scale that decided the GPU count (n × base requests): the probe's own
            # result when it ran to the end, else that run completed. A shorter run can miss the
            # queue episodes that the search's run saw (one outlier-slot wait in 800 requests over
            # 6 replicas against 4800), and every candidate of a table is measured alike.
            rec, res = runner.full(op_rate, op_replicas)
            out["operating_point"] = {"rate": op_rate, "replicas": op_replicas, **measure(res, slo)}
            out["kv_series"] = _kv_series(res.timeseries)
    except ConfigError as exc:
        out.update(status="skipped", message=str(exc))
    except Exception as exc:  # one candidate's crash must not take the plan down
        out.update(status="failed", message=f"{type(exc).__name__}: {exc}")
    finally:
        out["wall_s"] = time.perf_counter() - t0
        out["cpu_s"] = time.process_time() - cpu0
        out["simulations"], out["quick_simulations"], out["simulated_requests"] = (
            runner.sims,
            runner.quick_sims,
            runner.requests,
        )
    return out


def _replica_search(runner: _Runner, task: dict, out: dict, goodput: float) -> int | None:
    """Fewest replicas sustaining the target rate (n passes, n − 1 does not), from ⌈target ÷ goodput
    per replica⌉. Guided: quick runs, whose decisions are exact (complete runs, certain misses)
    except tested passes at loads up to :data:`TESTED_MAX_LOAD` of saturation."""
    target_rate, target = task["target_rate"], runner.slo.attainment
    base_replicas = runner.base_replicas
    per_replica = goodput / base_replicas
    start = task.get("hint_replicas") or (
        max(1, math.ceil(target_rate / per_replica)) if per_replica > 0 else base_replicas
    )
    rprobes: dict[int, dict] = {}

    def sustains(n: int) -> bool:
        if task["search"] == "exhaustive":
            rprobes[n] = runner.full(target_rate, n)[0]
            return rprobes[n]["attainment"] >= target
        rprobes[n] = runner.quick(target_rate, n)
        return rprobes[n]["decision"] == "pass"

    # A pool for long prompts and one for the others: two replicas at least.
    lowest = 2 if task.get("split_router") else 1
    n, _ = fewest_replicas(sustains, max(start, lowest), task["max_replicas"], lowest)
    out["replica_probes"] = [rprobes[k] for k in sorted(rprobes)]
    return n


# --- the plan -------------------------------------------------------------------------


def select_candidates(names: list[str] | None) -> list[str]:
    """The named candidates, or every default one."""
    if not names:
        return [n for n, c in CANDIDATES.items() if c.get("default", True)]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ConfigError("--allocators", unknown[0], f"candidate names: {', '.join(CANDIDATES)}")
    return list(dict.fromkeys(names))


def _availability(name: str, base: dict, base_dir) -> str | None:
    """Why a candidate cannot run in this build (``None`` when it can)."""
    from sim.allocators import KINDS

    over = CANDIDATES[name]["overrides"]
    kind = over.get("allocator.kind")
    if kind is not None and kind not in KINDS:
        return f"allocator kind {kind!r} is not in this build (available: {', '.join(KINDS)})"
    try:
        scenario_from_dict(apply_overrides(base, over), base_dir)
    except ConfigError as exc:
        return str(exc)
    return None


def plan(
    scenario: str | Path,
    slo: SLO,
    overrides: dict | None = None,
    allocators: list[str] | None = None,
    target_rate: float | None = None,
    tol: float = DEFAULT_TOL,
    workers: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    max_evals: int = MAX_EVALS,
    max_replicas: int = 256,
    search: str = "guided",
    seeds: int = DEFAULT_SEEDS,
    confidence: float = DEFAULT_CONFIDENCE,
    break_even: bool | list[str] = False,
    on_candidate: Callable[[dict], None] | None = None,
    start_method: str | None = None,
    on_start: Callable[[], None] | None = None,
    budget: RunBudget | None = None,
) -> dict:
    """Plan a scenario: the dict written to ``plan.json`` (see :mod:`sim.analysis.planner`).

    ``progress(done, total, name)`` and ``on_candidate(candidate)`` are called as candidates
    finish (in the calling process); ``break_even`` adds the values of the unmeasured constants
    at which the recommendation would flip (:mod:`sim.analysis.assumptions`; a list of constant
    kinds, ``paged_overhead``, ``alloc_event_s`` or ``kv_capacity``, limits it to those). ``start_method``
    ``"fork"`` starts the workers from this process after it has loaded the simulator (saves
    each worker its imports and first-run warm-up; only for a caller without threads, such as
    the CLI before its progress bar: ``on_start`` is called once the workers exist); the
    default starts them fresh (forkserver). ``budget`` limits every simulation of the search
    (:mod:`sim.engine.budget`).
    """
    from sim.analysis.sweep import default_workers

    if not 0 < tol < 1:
        raise ConfigError("--tolerance", tol, "a relative tolerance in (0, 1), e.g. 0.05")
    if target_rate is not None and not MIN_RATE <= target_rate <= MAX_RATE:
        raise ConfigError("--target-rate", target_rate, TARGET_RATE_ALLOWED)
    if search not in SEARCHES:
        raise ConfigError("--search", search, f"one of {', '.join(SEARCHES)}")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= 100:
        raise ConfigError("--seeds", seeds, "an integer from 1 to 100")
    if not 0.5 <= confidence < 1:
        raise ConfigError("--confidence", confidence, "a probability in [0.5, 1), e.g. 0.95")
    data, base_dir = read_scenario_dict(scenario)
    data = apply_overrides(data, overrides or {})
    sc = scenario_from_dict(data, base_dir)
    if sc.workload.arrival.kind not in ("poisson", "gamma"):
        raise ConfigError(
            "workload.arrival.kind",
            sc.workload.arrival.kind,
            "poisson or gamma: the planner varies workload.arrival.rate",
        )
    if sc.router == "length_split" and sc.length_split.share is None and target_rate is not None:
        # The replica search varies the count: a fixed count kept for long prompts would leave none
        # for the others at the low end, and mean another split at each count. Without a target
        # rate the plan runs at gpu.replicas only, where the count is what the scenario says.
        raise ConfigError(
            "length_split.replicas",
            sc.length_split.replicas,
            "a share of the replicas for a plan with --target-rate, which varies gpu.replicas: --set "
            "length_split.share=0.25 (the long-prompt pool rounded from it, at least one replica each side)",
        )
    if sc.workload.arrival.max_concurrency is not None:
        # A client cap holds back what the client offers: at any rate the server sees at most that
        # many requests, every one within the SLO, so the search would answer one GPU for any load.
        raise ConfigError(
            "workload.arrival.max_concurrency",
            sc.workload.arrival.max_concurrency,
            "unset (--set workload.arrival.max_concurrency=null): the planner offers the whole rate to "
            "the servers, and a client cap would hold it back",
        )
    names = select_candidates(allocators)
    base_requests = sc.workload.num_requests if sc.workload.duration_s is None else None
    common = {
        "slo": slo.as_dict(),
        "base": data,
        "base_dir": str(base_dir),
        "base_replicas": sc.gpu.replicas,
        "base_requests": base_requests,
        "base_seed": sc.seed,
        "tol": tol,
        "start_rate": sc.workload.arrival.rate,
        "tp": sc.gpu.tensor_parallel,
        "target_rate": target_rate,
        "max_evals": max_evals,
        "max_replicas": max_replicas,
        "search": search,
        "seeds": seeds,
        "confidence": confidence,
        "budget": None if budget is None else budget.__dict__,
        "split_router": sc.router == "length_split",
    }
    skipped, tasks = [], []
    for n in names:
        why = _availability(n, data, base_dir)
        if why:
            skipped.append({"name": n, "reason": why})
        else:
            tasks.append(
                {
                    **common,
                    "name": n,
                    "overrides": CANDIDATES[n]["overrides"],
                    "strategy": CANDIDATES[n]["strategy"],
                    "upper_bound": CANDIDATES[n].get("upper_bound", False),
                }
            )
    t0, cpu0 = time.perf_counter(), time.process_time()
    results: dict[str, dict] = {}
    pool = _Pool(min(workers or default_workers(), max(len(tasks), 1)), start_method)
    # Before any worker forks: the profile it loads is the one they share (see _cost_model_profile).
    profile_block = _cost_model_profile(sc)
    try:
        if start_method == "fork" and tasks:
            _prewarm(sc)
            pool.start()
        if on_start:
            on_start()
        # Most expensive first, so that no long task starts last (longest-processing-time order).
        order = sorted(tasks, key=_task_cost, reverse=True)
        for t, r in pool.map_unordered(plan_candidate, order):
            results[t["name"]] = r
            seed_intervals([r], confidence)
            if on_candidate:
                on_candidate(r)
            if progress:
                progress(len(results), len(tasks), t["name"])
        cands = [results[t["name"]] for t in tasks]
        for c in cands:
            if c["status"] == "skipped":
                skipped.append({"name": c["name"], "reason": c["message"]})
        cands = [c for c in cands if c["status"] != "skipped"]
        split = sc.length_split
        out: dict[str, Any] = {
            "scenario": sc.name,
            "scenario_file": str(scenario),
            "overrides": overrides or {},
            "slo": slo.as_dict(),
            "slo_text": slo.describe(),
            "attainment_target": slo.attainment,
            "tolerance": tol,
            "search": search,
            "seeds": seeds,
            "confidence": confidence,
            "seed": sc.seed,
            "target_rate": target_rate,
            "start_rate": sc.workload.arrival.rate,
            "num_requests": sc.workload.num_requests,
            "replicas": sc.gpu.replicas,
            "router": sc.router,
            # The long-prompt pool of router length_split: a share of each replica count tried, or
            # (a plan without --target-rate, at gpu.replicas only) the scenario's count.
            "length_split": (
                {
                    "prompt_tokens": split.prompt_tokens,
                    **({"share": split.share} if split.share is not None else {"replicas": split.replicas}),
                }
                if sc.router == "length_split"
                else None
            ),
            "tensor_parallel": sc.gpu.tensor_parallel,
            "gpu": sc.gpu.name,
            "model": sc.model.name,
            "weight_dtype": sc.model.weight_dtype,
            "kv_dtype": sc.model.kv_dtype,
            # From the cost model the runs build: ``auto`` falls back to the roofline prior where no
            # built-in profile covers the GPU, model or dtypes (as cost_model_profile then says).
            "cost_model_profile": profile_block,
            "cost_model_calibrated": profile_block["kind"] != "roofline",
            "candidates": cands,
            "skipped": skipped,
        }
        out["recommendation"] = recommend(out)
        if _split_binding_run(out, {t["name"]: t for t in tasks}):
            out["recommendation"] = recommend(out)  # its what-binds line now says where the time went
        from sim.analysis.assumptions import break_evens, listed

        if break_even and out["recommendation"]["candidate"] is not None:
            kinds = None if break_even is True else list(break_even)
            out["assumptions"] = break_evens(out, common, pool, kinds)
        else:
            out["assumptions"] = listed(sc, out)
        out["accuracy"] = _accuracy(sc, out["cost_model_calibrated"])
    except BaseException:
        # Ctrl-C, SIGTERM or a failed task: kill the workers now rather than wait for every
        # queued candidate (the plan is discarded, whatever they would still compute).
        pool.stop()
        raise
    pool.close()
    everyone = [*cands, *(a.get("runs", {}) for a in out.get("assumptions", []))]
    out["simulations"] = sum(c.get("simulations", 0) for c in everyone)
    out["quick_simulations"] = sum(c.get("quick_simulations", 0) for c in everyone)
    out["simulated_requests"] = sum(c.get("simulated_requests", 0) for c in everyone)
    out["wall_s"] = time.perf_counter() - t0
    # CPU seconds of the plan itself and of its workers' candidate tasks (not their start-up).
    out["cpu_s"] = time.process_time() - cpu0 + sum(c.get("cpu_s", 0.0) for c in everyone)
    return out


#: CPU seconds of each candidate's task in the default plan (``cpu_s`` in plan.json of ``kvsim plan
#: chat-api --slo ttft_p90_s=0.5 --slo tpot_p90_s=0.05 --target-rate 40``, compiled engine). Only
#: orders the work: allocators without a decode cohort (tiered regions, contiguous growth) grow
#: every sequence one by one at every mixed iteration and cost 3-6 times what the paged pool does.
_TASK_CPU_S = {
    "hybrid_tail": 1.3,
    "hybrid_tail-quantile": 1.3,
    "hybrid_tail-oracle": 0.8,
    "static-p95-fallback": 0.75,
    "static": 0.65,
    "dynamic": 0.65,
    "static-p95": 0.25,
    "hybrid_reserve": 0.2,
    "paged": 0.2,
    "paged-b32": 0.15,
}


def _split_binding_run(p: dict, tasks: dict[str, dict]) -> bool:
    """Run the recommended candidate's :func:`binding_run` again, iteration by iteration, and keep
    where its iteration time went (``binding_split``: :mod:`sim.cost.breakdown`). One more full
    simulation; ``False`` when there is no such run."""
    from sim.analysis.recommend import binding_run
    from sim.cost.breakdown import stepped
    from sim.engine.cluster import simulate

    best = next((c for c in p["candidates"] if c["name"] == p["recommendation"].get("candidate")), None)
    if best is None or best["name"] not in tasks:
        return False
    r = binding_run(best, p["replicas"] or 1, p["attainment_target"])
    if r is None:
        return False
    runner = _Runner(tasks[best["name"]])
    sc = runner.scenario(r["rate"], r["replicas"], r["seed"] - runner.task["base_seed"])
    try:
        res = simulate(stepped(sc), budget=runner.budget, step_breakdown=True)
    except BudgetExceeded:  # the page's budget: the plan stands without it
        return False
    best["binding_split"] = res.summary["step_time_breakdown"]
    best["simulations"] = best.get("simulations", 0) + 1
    best["simulated_requests"] = best.get("simulated_requests", 0) + res.requests.num_rows
    return True


def _cost_model_profile(sc) -> dict:
    """The ``cost_model_profile`` block (:mod:`sim.output.provenance`) of the runs of ``sc``: which
    profile prices them, or the roofline prior (``auto`` may fall back to it), learnt by building the
    cost model as a run does, in this process before the workers fork, so the hash is that of the
    bytes their shared profile was parsed from."""
    from sim.engine.deployment import Deployment, with_engine_defaults
    from sim.output.provenance import cost_model_block, roofline_block
    from sim.workload.generator import build_workload, total_length_percentile

    try:
        full = with_engine_defaults(sc)
        wl = build_workload(full)
        dep = Deployment.from_scenario(full, lambda q: total_length_percentile(wl, q))
        return cost_model_block(sc, dep.make_cost_model(full))
    except ConfigError:  # no run could build it either (every candidate says why): nothing was priced
        return roofline_block(sc)


def _task_cost(task: dict) -> float:
    return _TASK_CPU_S.get(task["name"], 1.0)


def _prewarm(sc) -> None:
    """Load what every simulation needs (modules, the trace, the cost model) before forking workers."""
    import sim.analysis.sequential  # noqa: F401
    import sim.engine.cluster  # noqa: F401
    from sim.analysis.saturation import saturation_rate

    saturation_rate(sc)


def _noop() -> None:
    return None


def _init_worker(parent_pid: int) -> None:
    """Pool initializer: :func:`~sim.analysis.worker_lifetime.init_worker`, and SIGTERM's default.

    A forked worker inherits the command's SIGTERM handler, which raises; a SIGTERM to the process
    group would then end an idle worker with a traceback on stderr instead of just ending it.
    """
    from sim.analysis.worker_lifetime import init_worker

    init_worker(parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Pool:
    """Worker processes for candidate tasks, started once per plan (forkserver or spawn by default)."""

    def __init__(self, workers: int, start_method: str | None = None):
        self.workers = max(1, workers)
        self.start_method = start_method
        self._pool = None

    def _get(self):
        if self._pool is None:
            from sim.analysis.sweep import process_pool

            self._pool = process_pool(self.workers, self.start_method, initializer=_init_worker)
        return self._pool

    def start(self) -> None:
        """Start the workers now (with fork, every worker is forked at the first task)."""
        self._get().submit(_noop).result()

    def map_unordered(self, fn: Callable[[dict], dict], tasks: list[dict]):
        """(task, fn(task)) as each finishes."""
        from concurrent.futures import as_completed

        if not tasks:
            return
        pool = self._get()
        futs = {pool.submit(fn, t): t for t in tasks}
        for f in as_completed(futs):
            yield futs[f], f.result()

    def close(self) -> None:
        """Let the workers go once the plan is done (every task has delivered its result)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def stop(self) -> None:
        """Cancel the queued tasks and kill the workers (:meth:`WorkerPool.stop`), without waiting."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()


def _accuracy(sc, calibrated: bool) -> str:
    """How far the plan's absolute figures may be from a real server's (:mod:`sim.analysis.accuracy`)."""
    from sim.analysis.accuracy import accuracy_line
    from sim.engine.deployment import gpu_spec, with_engine_defaults

    engine = with_engine_defaults(sc).engine.kind
    model = sc.model.name or "the model"
    return accuracy_line(model, sc.model.weight_dtype, gpu_spec(sc.gpu).name, engine, calibrated, sc.engine.terms_file)
