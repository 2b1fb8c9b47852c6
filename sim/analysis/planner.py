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
rule: a spike above 10 % of p50), preemptions and rejections, and turns them into a
recommendation.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.analysis.search import (
    DEFAULT_TOL,
    MAX_EVALS,
    GoodputSearch,
    fewest_replicas,
    find_goodput,
    find_goodput_guided,
    interpolated_goodput,
)
from sim.analysis.slo import SLO, attainment, miss_shares
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.budget import RunBudget
from sim.errors import ConfigError
from sim.limits import MAX_RATE, MIN_RATE
from sim.output.results import replace_file
from sim.output.staging import out_dir

__all__ = [
    "CANDIDATES",
    "DEFAULT_TOL",
    "MAX_EVALS",
    "GoodputSearch",
    "PLAN_COLUMNS",
    "assumption_lines",
    "candidate_row",
    "fewest_replicas",
    "find_goodput",
    "find_goodput_guided",
    "interpolated_goodput",
    "measure",
    "plan",
    "plan_candidate",
    "plan_columns",
    "plan_json",
    "plan_rows",
    "problem_lines",
    "recommend",
    "seed_intervals",
    "write_plan",
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
#: The seed article's jitter rule: a decode-step spike above 10 % of p50 calls for static.
JITTER_RULE = 1.10
#: Differences the recommendation's tie-breaks do not act on: goodput edges within 2 % (the
#: interpolated edges of two searches of the same candidate differ by up to 0.5 %, bench/planner.py),
#: decode jitter within 0.05 (p99/p50), memory waste within one point.
GOODPUT_RESOLUTION = 0.02
JITTER_RESOLUTION = 0.05
WASTE_RESOLUTION = 0.01
#: Goodput searches: ``guided`` (default: saturation estimate, quick runs that stop when decided,
#: full runs only to settle the answer) and ``exhaustive`` (every probe a full run).
SEARCHES = ("guided", "exhaustive")
#: Workload seeds per candidate by default (one: the plan stays fast; ``--seeds`` adds intervals).
DEFAULT_SEEDS = 1
#: Confidence of the early-stopping test and of the goodput intervals over seeds.
DEFAULT_CONFIDENCE = 0.95
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
#: (a static p95 reservation with a fallback region holding 1.6 of them passed runs after 450 of
#: 800 requests at 0.92 attainment whose complete runs reached 0.56-0.73).
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


def plan_dtypes(p: dict) -> str:
    """`` (weights fp8, KV fp8)`` for a plan's title: what the model serves, which a checkpoint may
    set without the scenario saying so (empty for a plan written before the fields existed)."""
    if not p.get("weight_dtype"):
        return ""
    return f" (weights {p['weight_dtype']}, KV {p['kv_dtype']})"


def jitter_text(j: float) -> str:
    """A decode jitter (p99/p50) at two decimals, or more where two would print a value on the
    wrong side of the article's rule as the rule itself (1.104 is above 1.10, not at it)."""
    for d in range(2, 7):
        text = f"{j:.{d}f}"
        if float(text) != JITTER_RULE or j == JITTER_RULE:
            return text
    return repr(float(j))


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


#: A replica whose reserved KV memory peaks at this share of its capacity has run out of it.
KV_FULL = 0.95
_BOUND_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency", "refused": "refused", "truncated": "truncated"}


def binding_line(c: dict, base_replicas: int, target: float) -> str | None:
    """What stops ``c`` above its goodput, from the lowest-rate run at the base replica count that
    missed the target above the goodput: which bound its requests missed, and whether KV memory
    filled (reserved peak ≥ :data:`KV_FULL` of capacity, preemptions, refusals) or not."""
    goodput = c.get("goodput_rps") or 0.0
    runs = [
        r
        for r in [*c.get("probes", []), *c.get("quick_probes", [])]
        if r.get("replicas") == base_replicas
        and r.get("misses")
        and r.get("attainment") is not None
        and r["attainment"] < target
        and r["rate"] > goodput
    ]
    if not runs:
        return None
    r = min(runs, key=lambda x: x["rate"])
    m = r["misses"]
    parts = ", ".join(f"{_BOUND_NAMES[k]} {v:.1%}" for k, v in m.items() if v > 0) or "none"
    peak = r.get("kv_reserved_peak")
    full = (peak is not None and peak >= KV_FULL) or r["preemptions"] > 0 or m.get("refused", 0) > 0
    memory = f"KV memory reserved at most {peak:.0%} of capacity" if peak is not None else "KV memory unknown"
    memory += f", {r['preemptions']} preemptions" if r["preemptions"] else ", no preemptions"
    latency = max(("ttft", "tpot", "e2e"), key=lambda k: m.get(k, 0.0))
    if full:
        verdict = (
            "KV memory binds: it fills, so requests wait for room, are preempted or refused; memory wasted less "
            "(another allocator), more of it (a larger GPU, a wider --tp) or shorter max_model_len lifts the goodput"
        )
    elif m.get(latency, 0.0) > 0:
        why = {
            "ttft": "time in the queue and in prefill",
            "tpot": "the decode step at that batch size",
            "e2e": "time in the queue, prefill and decode",
        }[latency]
        verdict = (
            f"not KV memory but {_BOUND_NAMES[latency]} binds ({why}): an allocator that saves memory would not "
            "lift the goodput, faster iterations would (a wider --tp, a faster GPU)"
        )
    else:
        verdict = "no single bound stands out"
    return (
        f"what binds above the goodput: at {r['rate']:.3g} req/s ({r['attainment']:.1%} within the SLO) the misses "
        f"are {parts} of requests; {memory} — {verdict}"
    )


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
        if self.tail_room is None:
            from sim.analysis.saturation import tail_room

            self.tail_room = tail_room(self.scenario(self.task["start_rate"], self.base_replicas))
        tested_pass = bool(
            sat
            and math.isfinite(sat)
            and rate / replicas <= TESTED_MAX_LOAD * sat / self.base_replicas
            and self.tail_room >= MIN_TAIL_ROOM
        )
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
    from sim.analysis.saturation import saturation_rate

    if runner.saturation is None:
        runner.saturation = saturation_rate(runner.scenario(task["start_rate"], runner.base_replicas))
    if task.get("hint_goodput"):
        return float(task["hint_goodput"])
    sat = runner.saturation
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

    n, _ = fewest_replicas(sustains, start, task["max_replicas"])
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


def mean_interval(values: list[float], confidence: float) -> tuple[float, float, float]:
    """Mean and the two-sided Student-t confidence interval of the mean of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    from scipy.stats import t as student_t

    h = float(student_t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - h, m + h


def seed_intervals(cands: list[dict], confidence: float) -> None:
    """Each candidate's goodput over seeds: mean and confidence interval (of the interpolated goodputs)."""
    for c in cands:
        seeds = c.get("seed_goodputs") or []
        if len(seeds) < 2 or any(s["status"] != "ok" for s in seeds):
            continue
        m, lo, hi = mean_interval([s["goodput_est_rps"] for s in seeds], confidence)
        c["goodput_mean_rps"], c["goodput_ci_rps"] = m, [lo, hi]


# --- the recommendation ---------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


#: Why a search's goodput is only a lower bound (``search_status``), in the recommendation's words.
_LOWER_BOUND_WHY = {
    "unbounded": "every rate the search tried met the SLO, up to the highest it tries",
    "budget": "the search's evaluation budget ran out before any rate missed the SLO",
}


def _lower_bound(c: dict) -> str:
    """``"≥"`` for a candidate whose goodput is only a lower bound (its search never saw a rate
    miss the SLO), else ``""``."""
    return "≥" if c.get("search_status") in _LOWER_BOUND_WHY else ""


def _upper_bound_reasons(p: dict, basis: str) -> list[str]:
    """One line per upper-bound candidate: what it reached, beside the real candidates of its kind
    (goodputs on the recommendation's ``basis``)."""
    label = basis_label(basis, p)
    named = f" ({label})" if label else ""
    out = []
    for u in p["candidates"]:
        if not u.get("upper_bound"):
            continue
        kind = u["overrides"].get("allocator.kind")
        peers = [
            c
            for c in p["candidates"]
            if not c.get("upper_bound") and c["overrides"].get("allocator.kind") == kind and c["status"] == "ok"
        ]
        got = f"{_basis_value(u, basis):.3g} req/s" if u["status"] == "ok" else u["status"]
        vs = ", ".join(f"{c['name']} {_basis_value(c, basis):.3g} req/s" for c in peers)
        out.append(
            f"{u['name']} is an upper bound, not a candidate (it routes by each request's true output length, "
            f"which no server knows): goodput{named} {got}" + (f" vs {vs}" if vs else "")
        )
    return out


def _within(a: float, b: float, resolution: float, relative: bool = False) -> bool:
    """Whether ``a`` and ``b`` measure the same: within ``resolution`` of each other (absolute, or
    relative to the larger); an unmeasured (infinite) value is the same only as another."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    gap = abs(a - b)
    if relative:
        gap /= max(abs(a), abs(b), 1e-300)
    return gap <= resolution * (1 + 1e-9)


def _apart(
    cands: list[dict],
    ref: dict,
    key: Callable[[dict], float],
    unit: str,
    resolution: float,
    relative: bool = False,
    decimals: int | None = None,
    percent: bool = False,
) -> dict[str, str]:
    """Each candidate's ``key`` as text (name → text), all at one precision: the fewest decimals
    (from three significant digits, or from ``decimals``) at which every value that differs from
    ``ref``'s prints apart from it, and every one beyond ``resolution`` of it prints beyond it (a
    waste of 0.65 % against 1.33 % is not shown as 1 % against 1 %)."""
    scale = 100.0 if percent else 1.0
    vals = {c["name"]: key(c) * scale for c in cands}
    r = key(ref) * scale
    res = resolution if relative else resolution * scale
    finite = [abs(v) for v in vals.values() if math.isfinite(v)]
    if decimals is None:
        top = max(finite, default=0.0)
        decimals = 0 if percent or top == 0 else max(0, 2 - math.floor(math.log10(top)))
    d = decimals
    for d in range(decimals, decimals + 5):
        if all(
            v == r
            or not (math.isfinite(v) and math.isfinite(r))
            or (
                round(v, d) != round(r, d)
                and (_within(v, r, res, relative) or not _within(round(v, d), round(r, d), res, relative))
            )
            for v in vals.values()
        ):
            break
    sep = "" if unit in ("", "%") else " "
    return {n: (f"{v:.{d}f}{sep}{unit}" if math.isfinite(v) else "not measured") for n, v in vals.items()}


class _TieStep:
    """One tie-break of the recommendation: ``best(cands)`` is the best of those in the running,
    ``same(best, c)`` whether ``c`` measures the same as it; ``show(cands, ref)`` gives each one's
    value as text (at a precision that separates it from ``ref``'s); ``out`` and ``within`` word a
    candidate dropped or kept beside the best."""

    def __init__(
        self,
        criterion: str,
        short: str,
        best: Callable[[list[dict]], dict],
        same: Callable[[dict, dict], bool],
        show: Callable[[list[dict], dict], dict[str, str]],
        out: str,
        within: str,
    ):
        self.criterion, self.short, self.best, self.same = criterion, short, best, same
        self.show, self.out, self.within = show, out, within

    def clause(self, keep: list[dict], ref: dict, nxt: list[dict]) -> str:
        """The reason's words for this step: who it dropped, against which best and value."""
        vals = self.show(keep, ref)
        dropped = [c for c in keep if not any(c is k for k in nxt)]
        kept = [c for c in nxt if c is not ref]

        def named(cs: list[dict]) -> str:
            return ", ".join(f"{c['name']} ({vals[c['name']]})" for c in cs)

        text = (
            f"{self.criterion}: {named(dropped)} {'is' if len(dropped) == 1 else 'are'} out, {self.out} {named([ref])}"
        )
        if kept and self.within:
            text += f"; {named(kept)} {self.within} of it"
        return text


def _list_order_clause(keep: list[dict], steps: list[_TieStep]) -> str:
    """The reason's words when the candidates left after every tie-break are picked from by list order."""
    first, rest = keep[0], keep[1:]
    facts = []
    for step in steps:
        if not step.short:
            continue  # a step that only restates another's value (the jitter rule and the jitter)
        vals = step.show(keep, first)
        facts.append(f"{step.short} " + ", ".join(f"{c['name']} {vals[c['name']]}" for c in keep))
    return (
        f"{', '.join(c['name'] for c in rest)} {'measures' if len(rest) == 1 else 'measure'} the same as "
        f"{first['name']} on every tie-break ({'; '.join(facts)}), so the order of the candidate list "
        f"decides: {first['name']} comes first"
    )


#: The goodput statistics the recommendation can rank by, best first, and how the reasons name
#: each: the mean edge over seeds (``--seeds``, docs/sweeps.md), the edge of one search, the verified
#: goodput (a candidate without a search, such as the guide's variants).
_BASES = {"goodput_mean_rps": "mean edge over {seeds} seeds", "goodput_est_rps": "edge", "goodput_rps": ""}


def goodput_basis(cands: list[dict]) -> str:
    """The key of the first statistic of :data:`_BASES` that every one of ``cands`` has.

    One basis for the ranking, the table's per-GPU column and every reason: ranking by the mean
    over seeds while the reasons quoted the first seed's goodput is how a plan once recommended the
    candidate its own reasons showed behind. A candidate whose seeds did not all settle has no mean,
    and then no candidate is ranked by its mean (comparing one's mean with another's single seed
    mixes two statistics)."""
    for key in _BASES:
        if all(c.get(key) for c in cands):
            return key
    return "goodput_rps"


def basis_label(basis: str, p: dict) -> str:
    """How the reasons and the table name ``basis`` ("" for the verified goodput)."""
    return _BASES[basis].format(seeds=p.get("seeds") or 1)


def _basis_value(c: dict, basis: str) -> float:
    """``c``'s goodput (req/s, whole deployment) on ``basis``."""
    return c.get(basis) or c.get("goodput_rps") or 0.0


def _per_gpu(c: dict, basis: str) -> float:
    """``c``'s goodput per GPU on ``basis`` (GPUs of the base scenario, as ``goodput_per_gpu_rps``)."""
    g = c.get("goodput_rps")
    return c["goodput_per_gpu_rps"] * _basis_value(c, basis) / g if g else c.get("goodput_per_gpu_rps", 0.0)


def noise_comparison(a: dict, b: dict, confidence: float) -> dict | None:
    """Paired goodput difference a − b over the seeds both searched (common random numbers:
    the same workload draws per seed), with its confidence interval; None without seeds."""
    # Without a mean the seed goodputs are not current (a seed that did not settle, or a candidate
    # re-planned at another constant by the break-even search, which keeps the nominal seeds).
    if not (a.get("goodput_mean_rps") and b.get("goodput_mean_rps")):
        return None
    sa = {s["seed"]: s for s in a.get("seed_goodputs") or [] if s["status"] == "ok"}
    sb = {s["seed"]: s for s in b.get("seed_goodputs") or [] if s["status"] == "ok"}
    common = sorted(set(sa) & set(sb))
    if len(common) < 2:
        return None
    m, lo, hi = mean_interval([sa[k]["goodput_est_rps"] - sb[k]["goodput_est_rps"] for k in common], confidence)
    return {"other": b["name"], "diff_rps": m, "ci_rps": [lo, hi], "seeds": len(common), "within_noise": lo <= 0 <= hi}


def one_line(text: object) -> str:
    """``text`` on one line (an exception's message may span several)."""
    return " ".join(str(text).split())


def problem_lines(p: dict) -> list[str]:
    """One line per candidate that was skipped or failed for a cause other than the SLO, with the cause."""
    lines = [f"skipped {s['name']}: {one_line(s['reason'])}" for s in p.get("skipped") or []]
    for c in p["candidates"]:
        if c["status"] == "failed":
            lines.append(f"failed {c['name']}: {one_line(c['message'])}")
        elif c["status"] not in ("ok", "infeasible"):
            lines.append(f"{c['name']}: no goodput ({c['status']}): {one_line(c['message'])}")
    return lines


_SLO_ADVICE = "relax the SLO, add memory (tensor parallelism) or shorten max_model_len"


def _no_recommendation(p: dict) -> dict:
    """Why nothing is recommended. The SLO advice is given only for candidates the SLO stopped: for
    one that crashed or was refused, relaxing the SLO changes nothing."""
    real = [c for c in p["candidates"] if not c.get("upper_bound")]
    slo_bound = [c for c in real if c["status"] == "infeasible"]
    other = [c["name"] for c in real if c["status"] not in ("ok", "infeasible")]
    other += [s["name"] for s in p.get("skipped") or []]
    reasons = [f"{c['name']} never meets the SLO: {c['message']}" for c in slo_bound]
    names = ", ".join(c["name"] for c in slo_bound)
    if slo_bound and not other:
        text = f"No candidate meets the SLO at any rate tried: {_SLO_ADVICE}."
    elif slo_bound:
        text = (
            f"No candidate meets the SLO: {names} {'never meets' if len(slo_bound) == 1 else 'never meet'} it at "
            f"any rate tried ({_SLO_ADVICE}); {', '.join(other)} "
            f"{'was' if len(other) == 1 else 'were'} not planned for another cause (listed above)."
        )
    elif other:
        text = (
            f"No recommendation: every candidate ({', '.join(other)}) failed or was skipped for a cause other "
            "than the SLO (listed above); relaxing the SLO would not help."
        )
    else:
        text = "No recommendation: only upper bounds were planned, and an upper bound is never recommended."
    reasons += _upper_bound_reasons(p, "goodput_rps")
    return {"candidate": None, "text": text, "reasons": reasons, "basis": None}


def recommend(p: dict) -> dict:
    """Pick a candidate and say why, in the seed article's terms, from the measured numbers.
    Upper-bound candidates (``upper_bound``) are reported, never picked."""
    feasible = [
        c for c in p["candidates"] if c["status"] == "ok" and c.get("goodput_rps", 0) > 0 and not c.get("upper_bound")
    ]
    if not feasible:
        return _no_recommendation(p)
    tol = p["tolerance"]
    target = p.get("target_rate")
    conf = p.get("confidence", DEFAULT_CONFIDENCE)
    basis = goodput_basis(feasible)
    label = basis_label(basis, p)
    named = f" ({label})" if label else ""

    def value(c):
        return _basis_value(c, basis)

    def ranked(c):
        return _per_gpu(c, basis)

    if target:
        sized = [c for c in feasible if c.get("replicas_needed")]
        pool = sized or feasible
        fewest = min(c.get("gpus_needed") or math.inf for c in pool)
        pool = [c for c in pool if (c.get("gpus_needed") or math.inf) == fewest]
    else:
        pool = feasible
    leader = max(pool, key=ranked)
    best_g = ranked(leader)

    # Goodputs within the search tolerance are a tie: the search cannot tell them apart. With
    # seeds, so are those whose paired difference from the leader is within noise: the seeds cannot.
    def tie_kind(c) -> str | None:
        if c is leader:
            return "leader"
        if ranked(c) >= best_g / (1 + tol):
            return f"within the {tol:.0%} search tolerance"
        n = noise_comparison(leader, c, conf) if basis == "goodput_mean_rps" else None
        if n and n["within_noise"]:
            return (
                f"within noise over {n['seeds']} seeds (paired difference {n['diff_rps']:+.3g} req/s, "
                f"{conf:.0%} interval {n['ci_rps'][0]:+.3g} … {n['ci_rps'][1]:+.3g})"
            )
        return None

    kinds = {c["name"]: tie_kind(c) for c in pool}
    tied = [c for c in pool if kinds[c["name"]]]

    def jitter(c):
        j = c["operating_point"].get("decode_jitter")
        return j if j is not None else math.inf

    def over_rule(c) -> bool:
        return jitter(c) > JITTER_RULE

    def rule_text(cs, ref):
        # At digits that print every jitter apart from the rule's 1.10 (1.1004 is above it, not at it).
        rule = {"name": "", "operating_point": {"decode_jitter": JITTER_RULE}}
        return _apart([*cs, rule], rule, jitter, "", JITTER_RESOLUTION, decimals=2)

    def waste(c):
        return c["operating_point"].get("memory_waste") or 0.0

    def unserved(c):
        o = c["operating_point"]
        return o["rejected"] + (o.get("truncated") or 0)

    def goodput_same(b, c) -> bool:
        if _within(ranked(b), ranked(c), GOODPUT_RESOLUTION, relative=True):
            return True
        n = noise_comparison(b, c, conf) if basis == "goodput_mean_rps" else None
        return bool(n and n["within_noise"])

    # Among ties, in turn: fewer requests refused or cut short; higher goodput (the interpolated
    # edges, since the brackets are only known to the tolerance); the article's jitter rule (a
    # candidate within it over one above it, however close their jitters: the rule is the
    # article's line, the resolution only says which gaps are noise); the article's preference for
    # steady decode steps; less reserved-but-unused memory; the order of the candidate list (the
    # simpler strategy first). Each step keeps the best of the candidates still in the running and
    # every one that measures the same as that best (within the step's resolution of it: judged
    # against the best, never from one kept candidate to the next, so that small gaps do not chain
    # into a large one), so that differences smaller than the measurement can resolve do not decide.
    steps = [
        _TieStep(
            "fewer requests refused or truncated at the operating point",
            "refused or truncated",
            best=lambda cs: min(cs, key=lambda c: round(unserved(c) / max(c["operating_point"]["requests"], 1), 3)),
            same=lambda b, c: (
                round(unserved(b) / max(b["operating_point"]["requests"], 1), 3)
                == round(unserved(c) / max(c["operating_point"]["requests"], 1), 3)
            ),
            show=lambda cs, ref: {c["name"]: f"{unserved(c)} of {c['operating_point']['requests']}" for c in cs},
            out="more than",
            within="",
        ),
        _TieStep(
            f"higher goodput{named}",
            f"goodput{named}",
            best=lambda cs: max(cs, key=ranked),
            same=goodput_same,
            show=lambda cs, ref: _apart(cs, ref, value, "req/s", GOODPUT_RESOLUTION, relative=True),
            out=f"more than {GOODPUT_RESOLUTION:.0%} below"
            + (" and not within noise of" if basis == "goodput_mean_rps" else ""),
            within=f"within {GOODPUT_RESOLUTION:.0%}" + (" or within noise" if basis == "goodput_mean_rps" else ""),
        ),
        _TieStep(
            f"the article's 10 % rule on decode jitter (p99/p50 at most {JITTER_RULE:.2f})",
            "",
            best=lambda cs: min(cs, key=jitter),
            same=lambda b, c: over_rule(b) == over_rule(c),
            show=rule_text,
            out="above the rule, unlike",
            within="",
        ),
        _TieStep(
            "steadier decode steps (p99/p50)",
            "decode jitter",
            best=lambda cs: min(cs, key=jitter),
            same=lambda b, c: _within(jitter(b), jitter(c), JITTER_RESOLUTION),
            show=lambda cs, ref: _apart(cs, ref, jitter, "", JITTER_RESOLUTION, decimals=2),
            out=f"more than {JITTER_RESOLUTION:g} above",
            within=f"within {JITTER_RESOLUTION:g}",
        ),
        _TieStep(
            "less memory waste",
            "memory waste",
            best=lambda cs: min(cs, key=waste),
            same=lambda b, c: _within(waste(b), waste(c), WASTE_RESOLUTION),
            show=lambda cs, ref: _apart(cs, ref, waste, "%", WASTE_RESOLUTION, percent=True),
            out="more than one point above",
            within="within one point",
        ),
    ]
    keep, decided = tied, []
    for step in steps:
        ref = step.best(keep)
        nxt = [c for c in keep if c is ref or step.same(ref, c)]
        if len(nxt) < len(keep):
            decided.append(step.clause(keep, ref, nxt))
        keep = nxt
    best = keep[0]
    if len(keep) > 1:
        decided.append(_list_order_clause(keep, steps))
    op = best["operating_point"]
    others = [c for c in feasible if c is not best]
    reasons = []
    gpus = best.get("gpus_needed") if target else best["gpus"]
    if target and best.get("replicas_needed"):
        reasons.append(
            f"{best['replicas_needed']} replica(s) × TP{p['tensor_parallel']} = {gpus} GPU(s) sustain "
            f"{target:g} req/s with {op['attainment']:.1%} of requests within the SLO "
            f"({p['slo_text']}); {best['replicas_needed'] - 1 or 'fewer'} replica(s) do not"
        )
    target_share = p.get("attainment_target")
    binds = binding_line(best, p.get("replicas") or 1, target_share) if target_share else None
    if binds:
        reasons.append(f"{best['name']}: {binds}")
    if len(tied) > 1:
        why = "; ".join(f"{c['name']} is {kinds[c['name']]}" for c in tied if c is not leader)
        reasons.append(
            f"a tie on goodput{named}: {leader['name']} is the highest; {why} — {best['name']} is picked: "
            + "; ".join(decided)
        )
    for c in others:
        ratio = value(best) / value(c) if value(c) else math.inf
        more = "∞" if ratio == math.inf else f"{ratio:.3g}×"
        if _lower_bound(best) or _lower_bound(c):
            more = "ratio unknown: a lower bound"
        extra = f", needs {c['gpus_needed']} GPU(s)" if target and c.get("gpus_needed") else ""
        tie = "; a tie" if any(c is t for t in tied) else ""
        reasons.append(
            f"goodput{named} {_lower_bound(best)}{value(best):.3g} req/s vs {c['name']} "
            f"{_lower_bound(c)}{value(c):.3g} req/s ({more}{extra}{tie})"
        )
    for c in [best, *others]:
        if _lower_bound(c):
            reasons.append(f"{c['name']}: {c['message']} (marked ≥ in the table)")
    for c in p["candidates"]:
        if c["status"] == "infeasible" and not c.get("upper_bound"):
            reasons.append(f"{c['name']} never meets the SLO: {c['message']}")
    reasons += _upper_bound_reasons(p, basis)
    wastes = ", ".join(f"{c['name']} {_pct(c['operating_point'].get('memory_waste'))}" for c in [best, *others])
    reasons.append(f"memory waste (reserved but unused KV, time-weighted) at each operating point: {wastes}")
    statics = [c for c in [best, *others] if c["overrides"].get("allocator.kind") == "static"]
    if statics:
        s = statics[0]
        rt = s["operating_point"].get("reserve_tokens")
        if rt:
            reasons.append(
                f"{s['name']} reserves {rt} tokens per request up front: the article's 'memory you can't use' "
                f"— it caps concurrency at capacity ÷ reservation whatever the real lengths"
            )
    frag = ", ".join(
        f"{c['name']} {_pct(c['operating_point'].get('external_frag_mean'))} "
        f"(max {_pct(c['operating_point'].get('external_frag_max'))})"
        for c in [best, *others]
    )
    reasons.append(f"external fragmentation (1 − largest free extent / free, time-weighted mean): {frag}")
    everyone = [best, *others]
    jit = ", ".join(
        f"{c['name']} {jitter_text(c['operating_point']['decode_jitter'])}"
        for c in everyone
        if c["operating_point"].get("decode_jitter") is not None
    )
    if jit:
        over = [c for c in everyone if (c["operating_point"].get("decode_jitter") or 0) > JITTER_RULE]
        under = [c for c in everyone if c not in over and c["operating_point"].get("decode_jitter") is not None]

        def batch(c):
            o = c["operating_point"]
            return f"{o['decode_batch_p50']:.0f}–{o['decode_batch_p99']:.0f}"

        charged = {c["name"]: c["operating_point"].get("allocation_time_s") or 0.0 for c in everyone}
        alloc_note = (
            "the cost model charged no allocation work in these runs"
            if not any(charged.values())
            else "allocation work charged (s, whole run): " + ", ".join(f"{k} {v:.3g}" for k, v in charged.items())
        )
        if not over:
            note = "all within the article's 10 % rule, so jitter does not call for static"
        elif not under:
            note = (
                "every strategy exceeds the article's 10 % rule, so the spikes come from batch composition, "
                "not from allocation: static would not remove them"
            )
        elif best not in over:
            note = f"{best['name']} is within the article's 10 % rule; above it: {', '.join(c['name'] for c in over)}"
        else:
            u = max(under, key=value)
            if goodput_same(best, u):
                # No goodput to trade: what kept u out is a tie-break before the rule, or its GPU count.
                if any(c is u for c in tied):
                    why_not = f"; {best['name']} is picked on the tie-break above"
                elif target and u.get("gpus_needed") != best.get("gpus_needed"):
                    why_not = f", but needs {u.get('gpus_needed') or 'more'} GPU(s) against {gpus}"
                else:
                    why_not = ""
                trade = (
                    f"{u['name']} stays within the rule at the same goodput{named} ({value(u):.3g} vs "
                    f"{value(best):.3g} req/s, within {GOODPUT_RESOLUTION:.0%}){why_not}"
                )
            else:
                trade = (
                    f"{u['name']} stays within the rule; choose it only if steady decode steps matter more "
                    f"than goodput{named} ({value(u):.3g} vs {value(best):.3g} req/s)"
                )
            note = (
                f"{best['name']} is above the article's 10 % rule. Decode batch (p50–p99 sequences): "
                + ", ".join(f"{c['name']} {batch(c)}" for c in everyone)
                + f": the step time follows the batch size; {alloc_note}. {trade}"
            )
        reasons.append(f"decode-step jitter p99/p50: {jit} — {note}")
    for c in others:
        o = c["operating_point"]
        if o["rejected"] or o.get("truncated"):
            reasons.append(
                f"{c['name']} refuses {o['rejected']} and truncates {o.get('truncated') or 0} of "
                f"{o['requests']} requests at its operating point (the cost of a length ceiling)"
            )
    reasons.append(
        f"at the operating point: {op['preemptions']} preemptions, {op['rejected']} rejected"
        + (f" ({', '.join(f'{k}: {v}' for k, v in op['rejected_by_reason'].items())})" if op["rejected"] else "")
        + (f", {op['truncated']} truncated" if op.get("truncated") else "")
    )
    knobs = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
    if target:
        how_many = (
            f"{best['replicas_needed']} replica(s), {gpus} GPU(s) for {target:g} req/s"
            if best.get("replicas_needed")
            else f"more than {p.get('max_replicas', 256)} replicas"
        )
    elif _lower_bound(best):
        # The search never found a rate that misses: no capacity, only a floor under it.
        why = _LOWER_BOUND_WHY.get(best.get("search_status", ""), "")
        how_many = (
            f"{best['gpus']} GPU(s) serve at least {best['goodput_rps']:.3g} req/s within the SLO — a lower "
            f"bound, not a capacity ({why}), so no GPU count follows from it: check a rate with --target-rate"
        )
    else:
        # The verified goodput, not the ranking basis: a complete run at this rate met the target.
        edge = _basis_value(best, basis)
        # The reasons compare the ranking statistic (the interpolated edge): say why two rates appear.
        edge_note = (
            f" (the highest rate a complete run met; the reasons compare the {basis_label(basis, p)}, "
            f"{edge:.3g} req/s, interpolated between it and the first rate that missed)"
            if basis != "goodput_rps" and f"{edge:.3g}" != f"{best['goodput_rps']:.3g}"
            else ""
        )
        how_many = (
            f"{best['gpus']} GPU(s) serve up to {best['goodput_rps']:.3g} req/s within the SLO{edge_note}; "
            f"for a rate R plan ⌈R / {best['goodput_per_gpu_rps']:.3g}⌉ GPUs (check with --target-rate)"
        )
    text = f"Use {best['name']} — {best['strategy']} (set {knobs}) on {p['gpu']}: {how_many}."
    o = best.get("operating_point") or {}
    if o.get("rejected") or o.get("truncated"):
        # Refused and truncated requests only count as SLO misses: a length ceiling can win within
        # the SLO's slack by not serving its longest requests, which the headline must say.
        text += (
            f" It does so by refusing {o.get('rejected') or 0} and truncating {o.get('truncated') or 0} of "
            f"{o.get('requests')} requests at its operating point: serve them and compare the others."
        )
    noise = [n for n in (noise_comparison(best, c, conf) for c in pool if c is not best) if n is not None]
    close = [n for n in noise if n["within_noise"]]
    if close:
        text += (
            " Within noise of "
            + ", ".join(
                f"{n['other']} (goodput difference {n['diff_rps']:+.2g} req/s, {conf:.0%} interval "
                f"{n['ci_rps'][0]:+.2g} … {n['ci_rps'][1]:+.2g} over {n['seeds']} seeds)"
                for n in close
            )
            + ": the seeds do not separate them."
        )
    by_name = {c["name"]: c for c in pool}
    for n in noise:
        # A real difference below the goodput tie-break's resolution does not decide: said so here,
        # beside the tie line that shows what did.
        share = abs(n["diff_rps"]) / max(value(best), value(by_name[n["other"]]), 1e-300)
        verdict = (
            "within noise"
            if n["within_noise"]
            else "a real difference"
            + (
                f", but {share:.1%} of the goodput: less than the {GOODPUT_RESOLUTION:.0%} the goodput "
                "tie-break acts on"
                if share <= GOODPUT_RESOLUTION
                else ""
            )
        )
        reasons.insert(
            0,
            f"{best['name']} − {n['other']} goodput: {n['diff_rps']:+.3g} req/s, {conf:.0%} interval "
            f"{n['ci_rps'][0]:+.3g} … {n['ci_rps'][1]:+.3g} over {n['seeds']} seeds (same workloads per "
            f"seed) — {verdict}",
        )
    return {"candidate": best["name"], "text": text, "reasons": reasons, "noise": noise, "basis": basis}


# --- outputs --------------------------------------------------------------------------


def plan_json(p: dict) -> str:
    """``p`` as strict JSON (no NaN or infinity: ``null``), as ``plan.json`` holds it."""
    import json

    # allow_nan=False: a NaN or infinity that slipped past _strict fails here, not in the reader.
    return json.dumps(_strict(p), indent=1, allow_nan=False) + "\n"


def write_plan(p: dict, out: str | Path) -> Path:
    """``plan.json`` and ``plan.html`` (plotly; needs the ``report`` extra) into ``out``."""
    out = out_dir(out)
    text = plan_json(p)
    replace_file(out / "plan.json", lambda path: path.write_text(text))
    from sim.analysis import plots
    from sim.analysis.report import write_html

    figs = [plots.attainment_vs_rate(p), plots.latency_throughput(p), plots.plan_kv_memory(p)]
    intro = [
        f"<p><b>{_esc(p['recommendation']['text'])}</b></p>",
        "<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in p["recommendation"]["reasons"]) + "</ul>",
    ]
    lines = assumption_lines(p)
    if lines:
        intro.append(
            "<p>Assumptions (unmeasured constants of the cost model and the KV capacity):</p><ul>"
            + "".join(f"<li>{_esc(a)}</li>" for a in lines)
            + "</ul>"
        )
    if p.get("accuracy"):
        intro.append(f"<p>Accuracy: {_esc(p['accuracy'])}.</p>")
    intro.append(
        f"<p>SLO: {_esc(p['slo_text'])}; goodput tolerance {p['tolerance']:.0%}; {_esc(search_summary(p))}.</p>"
    )
    problems = problem_lines(p)
    if problems:
        intro.append("<p>Not planned: " + "; ".join(_esc(line) for line in problems) + "</p>")
    write_html(out / "plan.html", f"kvsim plan: {p['scenario']}", figs, "".join(intro), (plan_columns(p), plan_rows(p)))
    return out


def _strict(x: Any) -> Any:
    """``x`` with every value JSON can hold: NumPy scalars and arrays as Python numbers and lists,
    and NaN or infinity (a metric of a run with no request of its kind, an unbounded saturation
    estimate) as null. ``json.dumps`` would write them as ``NaN``/``Infinity``, which strict JSON
    readers (``jq``, browsers, most languages) refuse."""
    if isinstance(x, dict):
        return {str(k): _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, np.ndarray):
        return _strict(x.tolist())
    if x is None or isinstance(x, (str, bool)):
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    v = float(x)  # as json.dumps(default=float) did for any other number type
    return v if math.isfinite(v) else None


def search_summary(p: dict) -> str:
    """How much simulation the plan took, in one line."""
    return (
        f"{p.get('search', 'guided')} search, {p.get('seeds', 1)} seed(s): {p['simulations']} simulations "
        f"({p.get('quick_simulations', 0)} stopped early when decided, {p.get('simulated_requests', 0)} requests) "
        f"in {p.get('wall_s', 0):.1f} s"
    )


def _accuracy(sc, calibrated: bool) -> str:
    """How far the plan's absolute figures may be from a real server's (:mod:`sim.analysis.accuracy`)."""
    from sim.analysis.accuracy import accuracy_line
    from sim.engine.deployment import gpu_spec, with_engine_defaults

    engine = with_engine_defaults(sc).engine.kind
    model = sc.model.name or "the model"
    return accuracy_line(model, sc.model.weight_dtype, gpu_spec(sc.gpu).name, engine, calibrated, sc.engine.terms_file)


def assumption_lines(p: dict) -> list[str]:
    """One line per unmeasured constant of the plan's cost model and deployment (:mod:`sim.analysis.assumptions`)."""
    return [a["text"] for a in p.get("assumptions") or []]


def _esc(s: str) -> str:
    import html

    return html.escape(str(s))


#: The plan table's columns (``plan_columns`` adds the interval column when the plan has seeds, and
#: names the per-GPU column after the statistic the recommendation ranks by).
PLAN_COLUMNS = [
    "candidate",
    "goodput req/s",
    "edge req/s",
    "GPUs",
    "edge/GPU",
    "attain@goodput",
    "attain@+tol",
    "TTFT p90 s",
    "TPOT p90 s",
    "waste",
    "ext frag",
    "jitter p99/p50",
    "preempt",
    "rejected",
]
_PER_GPU_COLUMN = {"goodput_mean_rps": "mean edge/GPU", "goodput_est_rps": "edge/GPU", "goodput_rps": "goodput/GPU"}


def _table_basis(p: dict) -> str:
    """The statistic of the per-GPU column: the recommendation's, or while candidates stream in
    (no recommendation yet) the one it will rank by when every candidate settles."""
    basis = (p.get("recommendation") or {}).get("basis")
    if basis:
        return basis
    return "goodput_mean_rps" if (p.get("seeds") or 1) > 1 else "goodput_est_rps"


def plan_columns(p: dict) -> list[str]:
    cols = list(PLAN_COLUMNS)
    cols[4] = _PER_GPU_COLUMN[_table_basis(p)]
    if (p.get("replicas") or 1) > 1:
        # The goodput search runs at the scenario's replica count: say so where it is not one.
        cols[1], cols[2] = (f"{c} ({p['replicas']} replicas)" for c in cols[1:3])
    if (p.get("seeds") or 1) > 1:
        # The verified goodput, its edge and the attainments beside them are the first seed's search.
        seed = p.get("seed")
        of = f" (seed {seed})" if seed is not None else " (first seed)"
        cols[1], cols[2] = cols[1] + of, cols[2] + of
        cols.insert(3, f"edge over {p['seeds']} seeds ({p.get('confidence', DEFAULT_CONFIDENCE):.0%})")
    return cols


def candidate_row(p: dict, c: dict) -> list[str]:
    """One candidate's row of the plan table, as strings (a candidate dict as it streams in)."""
    seeds = (p.get("seeds") or 1) > 1
    if c["status"] != "ok":
        row = [c["name"], "0 (infeasible)" if c["status"] == "infeasible" else c["status"]] + ["-"] * 12
        return row[:3] + ["-"] + row[3:] if seeds else row
    op, v = c.get("operating_point") or {}, c["verify"]
    gpus = c.get("gpus_needed") if p.get("target_rate") else c["gpus"]
    sized = not p.get("target_rate") or "replicas_needed" in c  # an upper bound is not sized
    nxt = v.get("next_attainment")
    basis = _table_basis(p)
    # A goodput that is only a lower bound (search_status unbounded or budget) is marked ≥ in its
    # cells, not in the name: the name column is narrow enough to cut a long suffix.
    lb = _lower_bound(c)
    row = [
        c["name"] + (" (upper bound)" if c.get("upper_bound") else ""),
        f"{lb}{c['goodput_rps']:.3g}",
        lb + _num(c.get("goodput_est_rps")) if c.get("goodput_est_rps") is not None else "-",
        "-" if not sized else str(gpus if gpus is not None else f">{p.get('max_replicas', '?')}"),
        lb + _num(_per_gpu(c, basis)) if c.get(basis) else "-",
        "-" if v["attainment"] is None else f"{v['attainment']:.3f}",
        "-" if nxt is None else ("" if v.get("next_exact", True) else "≈") + f"{nxt:.3f}",
        _num(op.get("ttft_p90_s")),
        _num(op.get("tpot_p90_s")),
        _pct(op.get("memory_waste")),
        _pct(op.get("external_frag_mean")),
        "-" if op.get("decode_jitter") is None else jitter_text(op["decode_jitter"]),
        str(op.get("preemptions", "-")),
        str(op.get("rejected", "-")),
    ]
    if seeds:
        ci = c.get("goodput_ci_rps")
        m = c.get("goodput_mean_rps")
        row.insert(3, "-" if not (ci and m) else f"{m:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] ±{(ci[1] - ci[0]) / 2 / m:.1%}")
    return row


def plan_rows(p: dict) -> list[list[str]]:
    """The plan table (one row per candidate), as strings."""
    return [candidate_row(p, c) for c in p["candidates"]]


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"
