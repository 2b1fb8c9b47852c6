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

At the operating point (the goodput, or the target rate on the chosen replica count) it
measures what the seed article reasons with: memory waste (1 − KV token utilization),
internal and external fragmentation over time, decode-step jitter (p99/p50 of the iteration
latency of decode-only iterations; the article's rule: a spike above 10 % of p50), preemptions
and rejections, and turns them into a recommendation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.budget import RunBudget
from sim.errors import ConfigError
from sim.output.results import replace_file
from sim.output.staging import out_dir
from sim.analysis.slo import SLO, attainment

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
        "strategy": "static at the p95 length ceiling, longer requests truncated",
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

DEFAULT_TOL = 0.05
#: The seed article's jitter rule: a decode-step spike above 10 % of p50 calls for static.
JITTER_RULE = 1.10
MAX_EVALS = 24
_BRACKET_STEPS = 12


# --- the search (pure: evaluate is any rate → attainment function) --------------------

@dataclass
class GoodputSearch:
    #: Highest rate found with attainment ≥ target (0 when none was found).
    goodput: float
    #: ``ok`` (bracketed and verified), ``infeasible`` (no rate down to start/2^12 passes),
    #: ``unbounded`` (start·2^12 still passes), ``budget`` (evaluations ran out; goodput is a lower bound).
    status: str
    #: rate → attainment of every evaluation.
    probes: dict[float, float] = field(default_factory=dict)
    #: The verification pair: goodput × (1 + tol), and its attainment (< target when status is ok).
    next_rate: float | None = None
    next_attainment: float | None = None


def find_goodput(evaluate: Callable[[float], float], start: float, target: float, tol: float = DEFAULT_TOL,
                 max_evals: int = MAX_EVALS) -> GoodputSearch:
    """Bracket by doubling/halving from ``start``, then bisect (geometric mean) until
    hi ≤ lo·(1 + tol), then verify that lo·(1 + tol) misses the target."""
    probes: dict[float, float] = {}

    def passes(r: float) -> bool:
        if r not in probes:
            probes[r] = evaluate(r)
        return probes[r] >= target

    def budget() -> bool:
        return len(probes) >= max_evals

    lo: float | None = None
    hi: float | None = None
    if passes(start):
        lo = start
    else:
        hi = start
        r = start
        for _ in range(_BRACKET_STEPS):
            r /= 2
            if passes(r):
                lo = r
                break
            hi = r
        if lo is None:
            return GoodputSearch(0.0, "infeasible", probes)
    while not budget():
        if hi is None or hi <= lo:
            # Look for a failing rate above lo.
            r, hi = lo, None
            for _ in range(_BRACKET_STEPS):
                r *= 2
                if passes(r):
                    lo = r
                else:
                    hi = r
                    break
                if budget():
                    break
            if hi is None:
                return GoodputSearch(lo, "unbounded" if not budget() else "budget", probes)
            continue
        if hi <= lo * (1 + tol):
            check = lo * (1 + tol)
            if passes(check):
                lo = check  # non-monotone: a higher rate passes; keep searching above it
                continue
            return GoodputSearch(lo, "ok", probes, check, probes[check])
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return GoodputSearch(lo, "budget", probes)


def fewest_replicas(passes: Callable[[int], bool], start: int, limit: int = 4096) -> tuple[int | None, dict[int, bool]]:
    """Smallest n ≥ 1 with ``passes(n)``, searching from ``start`` (down by one, or up by
    doubling then bisection); ``None`` when even ``limit`` fails."""
    seen: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = passes(n)
        return seen[n]

    n = max(1, min(start, limit))
    if ok(n):
        while n > 1 and ok(n - 1):
            n -= 1
        return n, seen
    bad = n
    good = None
    while good is None:
        if bad >= limit:
            return None, seen
        cand = min(bad * 2, limit)
        if ok(cand):
            good = cand
        else:
            bad = cand
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, seen


# --- measurements at a point ----------------------------------------------------------

def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    return float(v[min(np.searchsorted(cum, q / 100.0 * cum[-1]), len(v) - 1)])


def measure(result, slo: SLO) -> dict:
    """The operating-point facts of one run (see the module docstring)."""
    from sim.analysis.plots import decode_only_mask, fragmentation_series
    s = result.summary
    ts = result.timeseries
    out = {
        "attainment": attainment(result.requests, slo),
        "ttft_p90_s": s["ttft_s"]["p90"], "tpot_p90_s": s["tpot_s"]["p90"], "e2e_p90_s": s["e2e_s"]["p90"],
        "throughput_requests_per_s": s["throughput_requests_per_s"],
        "throughput_tokens_per_s": s["throughput_tokens_per_s"],
        "kv_token_utilization": s["kv_token_utilization"],
        "memory_waste": None if s["kv_token_utilization"] is None else 1.0 - s["kv_token_utilization"],
        "kv_memory_utilization": s["kv_memory_utilization"],
        "preemptions": s["preemptions"], "rejected": s["rejected"], "rejected_by_reason": s["rejected_by_reason"],
        "truncated": s["truncated"], "requests": s["requests"], "reserve_tokens": s.get("reserve_tokens"),
        "allocation_time_s": s.get("allocation_time_s"),
        "external_frag_mean": None, "external_frag_max": None, "decode_step_p50_ms": None,
        "decode_step_p99_ms": None, "decode_jitter": None, "decode_batch_p50": None, "decode_batch_p99": None,
    }
    if ts.num_rows:
        t, _internal, external = fragmentation_series(ts)
        dt = np.diff(t, append=t[-1])  # each state holds until the next change
        if dt.sum() > 0:
            out["external_frag_mean"] = float(np.dot(external, dt) / dt.sum())
        out["external_frag_max"] = float(external.max())
        dec = decode_only_mask(ts)
        if dec.any():
            step = ts.column("first_step_s").to_numpy()[dec]
            # A fast-forwarded row stands for `iterations` decode steps.
            w = ts.column("iterations").to_numpy()[dec].astype(np.float64)
            p50, p99 = _weighted_percentile(step, w, 50), _weighted_percentile(step, w, 99)
            batch = ts.column("running").to_numpy()[dec].astype(np.float64)
            out.update(decode_step_p50_ms=p50 * 1e3, decode_step_p99_ms=p99 * 1e3,
                       decode_jitter=p99 / p50 if p50 > 0 else None,
                       decode_batch_p50=_weighted_percentile(batch, w, 50),
                       decode_batch_p99=_weighted_percentile(batch, w, 99))
    return out


def _kv_series(ts, max_points: int = 1500) -> dict:
    from sim.analysis.plots import summed_over_replicas
    if ts.num_rows == 0:
        return {"t_s": [], "reserved_gib": [], "used_gib": [], "capacity_gib": []}
    t, s = summed_over_replicas(ts, ["kv_capacity_bytes", "kv_reserved_bytes", "kv_used_bytes"])
    idx = np.unique(np.r_[np.linspace(0, t.size - 1, min(max_points, t.size)).astype(int), t.size - 1])
    g = 2.0**30
    return {"t_s": t[idx].round(4).tolist(), "reserved_gib": (s["kv_reserved_bytes"][idx] / g).round(4).tolist(),
            "used_gib": (s["kv_used_bytes"][idx] / g).round(4).tolist(),
            "capacity_gib": (s["kv_capacity_bytes"][idx] / g).round(4).tolist()}


# --- one candidate (runs in a worker process) -----------------------------------------

def plan_candidate(task: dict) -> dict:
    """Goodput search, replica search and operating point of one candidate. Never raises."""
    from sim.engine.cluster import simulate
    name = task["name"]
    slo = SLO(**task["slo"])
    base, base_dir = task["base"], task["base_dir"]
    base_replicas = task["base_replicas"]
    base_requests = task["base_requests"]
    tol = task["tol"]
    out: dict[str, Any] = {"name": name, "strategy": task["strategy"], "overrides": task["overrides"],
                           "upper_bound": task.get("upper_bound", False),
                           "status": "ok", "message": "", "probes": [], "replica_probes": []}
    last: dict[tuple, Any] = {}

    def run(rate: float, replicas: int):
        key = (rate, replicas)
        if key not in last:
            over = dict(task["overrides"])
            over["workload.arrival.rate"] = rate
            over["gpu.replicas"] = replicas
            if base_requests is not None and replicas != base_replicas:
                over["workload.num_requests"] = max(1, round(base_requests * replicas / base_replicas))
            sc = scenario_from_dict(apply_overrides(base, over), base_dir)
            last.clear()  # keep only the latest run: its tables are what the operating point needs
            budget = task.get("budget")
            last[key] = simulate(sc, budget=RunBudget(**budget) if budget else None)
        return last[key]

    def probe(rate: float, replicas: int) -> dict:
        res = run(rate, replicas)
        s = res.summary
        p = {"rate": rate, "replicas": replicas, "attainment": attainment(res.requests, slo),
             "ttft_p90_s": s["ttft_s"]["p90"], "tpot_p90_s": s["tpot_s"]["p90"],
             "throughput_requests_per_s": s["throughput_requests_per_s"],
             "throughput_tokens_per_s": s["throughput_tokens_per_s"],
             "completed": s["completed"], "rejected": s["rejected"], "truncated": s["truncated"],
             "preemptions": s["preemptions"]}
        return p

    t0 = time.perf_counter()
    try:
        probes: dict[float, dict] = {}

        def evaluate(rate: float) -> float:
            probes[rate] = probe(rate, base_replicas)
            return probes[rate]["attainment"]

        search = find_goodput(evaluate, task["start_rate"], slo.attainment, tol, task["max_evals"])
        out["probes"] = [probes[r] for r in sorted(probes)]
        out["search_status"] = search.status
        out["goodput_rps"] = search.goodput
        out["goodput_per_gpu_rps"] = search.goodput / (base_replicas * task["tp"])
        out["replicas"] = base_replicas
        out["gpus"] = base_replicas * task["tp"]
        out["verify"] = {"rate": search.goodput, "attainment": search.probes.get(search.goodput),
                         "next_rate": search.next_rate, "next_attainment": search.next_attainment}
        if search.status == "infeasible":
            worst = probes[min(probes)]
            out["status"] = "infeasible"
            out["message"] = (f"even at {min(probes):.3g} req/s only {worst['attainment']:.0%} of requests meet the SLO "
                              f"({worst['rejected']} rejected, {worst['truncated']} truncated)")
            return out
        if search.status != "ok":
            out["message"] = {"unbounded": "attainment met at every rate tried: goodput is a lower bound",
                              "budget": "evaluation budget spent: goodput is a lower bound"}[search.status]
        op_rate, op_replicas = search.goodput, base_replicas
        target_rate = task.get("target_rate")
        if target_rate:
            per_replica = search.goodput / base_replicas
            start = max(1, math.ceil(target_rate / per_replica)) if per_replica > 0 else base_replicas
            rprobes: dict[int, dict] = {}

            def sustains(n: int) -> bool:
                rprobes[n] = probe(target_rate, n)
                return rprobes[n]["attainment"] >= slo.attainment

            n, _ = fewest_replicas(sustains, start, task["max_replicas"])
            out["replica_probes"] = [rprobes[k] for k in sorted(rprobes)]
            out["replicas_needed"] = n
            out["gpus_needed"] = None if n is None else n * task["tp"]
            if n is not None:
                op_rate, op_replicas = target_rate, n
        res = run(op_rate, op_replicas)
        out["operating_point"] = {"rate": op_rate, "replicas": op_replicas, **measure(res, slo)}
        out["kv_series"] = _kv_series(res.timeseries)
    except ConfigError as exc:
        out.update(status="skipped", message=str(exc))
    except Exception as exc:  # one candidate's crash must not take the plan down
        out.update(status="failed", message=f"{type(exc).__name__}: {exc}")
    finally:
        out["wall_s"] = time.perf_counter() - t0
    return out


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


def plan(scenario: str | Path, slo: SLO, overrides: dict | None = None, allocators: list[str] | None = None,
         target_rate: float | None = None, tol: float = DEFAULT_TOL, workers: int | None = None,
         progress: Callable[[int, int, str], None] | None = None, max_evals: int = MAX_EVALS,
         max_replicas: int = 256, budget: RunBudget | None = None) -> dict:
    """Plan a scenario: the dict written to ``plan.json`` (see :mod:`sim.analysis.planner`).
    ``budget`` limits every simulation of the search (:mod:`sim.engine.budget`)."""
    from sim.analysis.sweep import default_workers, process_pool
    if not 0 < tol < 1:
        raise ConfigError("--tolerance", tol, "a relative tolerance in (0, 1), e.g. 0.05")
    if target_rate is not None and not target_rate > 0:
        raise ConfigError("--target-rate", target_rate, "requests/s > 0")
    data, base_dir = read_scenario_dict(scenario)
    data = apply_overrides(data, overrides or {})
    sc = scenario_from_dict(data, base_dir)
    if sc.workload.arrival.kind not in ("poisson", "gamma"):
        raise ConfigError("workload.arrival.kind", sc.workload.arrival.kind,
                          "poisson or gamma: the planner varies workload.arrival.rate")
    names = select_candidates(allocators)
    base_requests = sc.workload.num_requests if sc.workload.duration_s is None else None
    common = {"slo": slo.as_dict(), "base": data, "base_dir": str(base_dir), "base_replicas": sc.gpu.replicas,
              "base_requests": base_requests, "tol": tol, "start_rate": sc.workload.arrival.rate,
              "tp": sc.gpu.tensor_parallel, "target_rate": target_rate, "max_evals": max_evals,
              "max_replicas": max_replicas, "budget": None if budget is None else budget.__dict__}
    skipped, tasks = [], []
    for n in names:
        why = _availability(n, data, base_dir)
        if why:
            skipped.append({"name": n, "reason": why})
        else:
            tasks.append({**common, "name": n, "overrides": CANDIDATES[n]["overrides"],
                          "strategy": CANDIDATES[n]["strategy"], "upper_bound": CANDIDATES[n].get("upper_bound", False)})
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    if tasks:
        from concurrent.futures import as_completed
        with process_pool(min(workers or default_workers(), len(tasks))) as pool:
            futs = {pool.submit(plan_candidate, t): t["name"] for t in tasks}
            for f in as_completed(futs):
                results[futs[f]] = f.result()
                if progress:
                    progress(len(results), len(tasks), futs[f])
    cands = [results[t["name"]] for t in tasks]
    for c in cands:
        if c["status"] == "skipped":
            skipped.append({"name": c["name"], "reason": c["message"]})
    cands = [c for c in cands if c["status"] != "skipped"]
    out = {
        "scenario": sc.name,
        "scenario_file": str(scenario),
        "overrides": overrides or {},
        "slo": slo.as_dict(),
        "slo_text": slo.describe(),
        "attainment_target": slo.attainment,
        "tolerance": tol,
        "target_rate": target_rate,
        "start_rate": sc.workload.arrival.rate,
        "num_requests": sc.workload.num_requests,
        "replicas": sc.gpu.replicas,
        "tensor_parallel": sc.gpu.tensor_parallel,
        "gpu": sc.gpu.name,
        "model": sc.model.name,
        "cost_model_calibrated": sc.cost_model.profile not in (None, "none"),
        "candidates": cands,
        "skipped": skipped,
        "simulations": sum(len(c["probes"]) + len(c["replica_probes"]) + 1 for c in cands),
        "wall_s": time.perf_counter() - t0,
    }
    out["recommendation"] = recommend(out)
    return out


# --- the recommendation ---------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _upper_bound_reasons(p: dict) -> list[str]:
    """One line per upper-bound candidate: what it reached, beside the real candidates of its kind."""
    out = []
    for u in p["candidates"]:
        if not u.get("upper_bound"):
            continue
        kind = u["overrides"].get("allocator.kind")
        peers = [c for c in p["candidates"] if not c.get("upper_bound") and c["overrides"].get("allocator.kind") == kind
                 and c["status"] == "ok"]
        got = f"{u['goodput_rps']:.3g} req/s" if u["status"] == "ok" else u["status"]
        vs = ", ".join(f"{c['name']} {c['goodput_rps']:.3g} req/s" for c in peers)
        out.append(f"{u['name']} is an upper bound, not a candidate (it routes by each request's true output length, "
                   f"which no server knows): goodput {got}" + (f" vs {vs}" if vs else ""))
    return out


def recommend(p: dict) -> dict:
    """Pick a candidate and say why, in the seed article's terms, from the measured numbers.
    Upper-bound candidates (``upper_bound``) are reported, never picked."""
    feasible = [c for c in p["candidates"] if c["status"] == "ok" and c.get("goodput_rps", 0) > 0
                and not c.get("upper_bound")]
    if not feasible:
        return {"candidate": None, "text": "No candidate meets the SLO at any rate tried: relax the SLO, add memory "
                                           "(tensor parallelism) or shorten max_model_len.", "reasons": []}
    tol = p["tolerance"]
    target = p.get("target_rate")
    if target:
        sized = [c for c in feasible if c.get("replicas_needed")]
        pool = sized or feasible
        fewest = min(c.get("gpus_needed") or math.inf for c in pool)
        pool = [c for c in pool if (c.get("gpus_needed") or math.inf) == fewest]
    else:
        pool = feasible
    best_g = max(c["goodput_per_gpu_rps"] for c in pool)
    # Goodputs within the search tolerance are a tie: the search cannot tell them apart.
    tied = [c for c in pool if c["goodput_per_gpu_rps"] >= best_g / (1 + tol)]

    def jitter(c):
        j = c["operating_point"].get("decode_jitter")
        return j if j is not None else math.inf

    def unserved(c):
        o = c["operating_point"]
        return (o["rejected"] + (o.get("truncated") or 0)) / max(o["requests"], 1)

    # Among ties: fewer requests refused or cut short, then goodput, then the article's
    # preference for steady decode steps, then less reserved-but-unused memory.
    best = min(tied, key=lambda c: (round(unserved(c), 3), -c["goodput_per_gpu_rps"], jitter(c),
                                    c["operating_point"].get("memory_waste") or 0.0))
    op = best["operating_point"]
    others = [c for c in feasible if c is not best]
    reasons = []
    gpus = best.get("gpus_needed") if target else best["gpus"]
    if target and best.get("replicas_needed"):
        reasons.append(f"{best['replicas_needed']} replica(s) × TP{p['tensor_parallel']} = {gpus} GPU(s) sustain "
                       f"{target:g} req/s with {op['attainment']:.1%} of requests within the SLO "
                       f"({p['slo_text']}); {best['replicas_needed'] - 1 or 'fewer'} replica(s) do not")
    for c in others:
        ratio = best["goodput_rps"] / c["goodput_rps"] if c["goodput_rps"] else math.inf
        more = "∞" if ratio == math.inf else f"{ratio:.2g}×"
        extra = f", needs {c['gpus_needed']} GPU(s)" if target and c.get("gpus_needed") else ""
        reasons.append(f"goodput {best['goodput_rps']:.3g} req/s vs {c['name']} {c['goodput_rps']:.3g} req/s "
                       f"({more}{extra})")
    for c in p["candidates"]:
        if c["status"] == "infeasible" and not c.get("upper_bound"):
            reasons.append(f"{c['name']} never meets the SLO: {c['message']}")
    reasons += _upper_bound_reasons(p)
    waste = ", ".join(f"{c['name']} {_pct(c['operating_point'].get('memory_waste'))}" for c in [best, *others])
    reasons.append(f"memory waste (reserved but unused KV, time-weighted) at each operating point: {waste}")
    statics = [c for c in [best, *others] if c["overrides"].get("allocator.kind") == "static"]
    if statics:
        s = statics[0]
        rt = s["operating_point"].get("reserve_tokens")
        if rt:
            reasons.append(f"{s['name']} reserves {rt} tokens per request up front: the article's 'memory you can't use' "
                           f"— it caps concurrency at capacity ÷ reservation whatever the real lengths")
    frag = ", ".join(f"{c['name']} {_pct(c['operating_point'].get('external_frag_mean'))} "
                     f"(max {_pct(c['operating_point'].get('external_frag_max'))})" for c in [best, *others])
    reasons.append(f"external fragmentation (1 − largest free extent / free, time-weighted mean): {frag}")
    everyone = [best, *others]
    jit = ", ".join(f"{c['name']} {c['operating_point']['decode_jitter']:.2f}" for c in everyone
                    if c["operating_point"].get("decode_jitter") is not None)
    if jit:
        over = [c for c in everyone if (c["operating_point"].get("decode_jitter") or 0) > JITTER_RULE]
        under = [c for c in everyone if c not in over and c["operating_point"].get("decode_jitter") is not None]

        def batch(c):
            o = c["operating_point"]
            return f"{o['decode_batch_p50']:.0f}–{o['decode_batch_p99']:.0f}"

        charged = {c["name"]: c["operating_point"].get("allocation_time_s") or 0.0 for c in everyone}
        alloc_note = ("the cost model charged no allocation work in these runs" if not any(charged.values()) else
                      "allocation work charged (s, whole run): " + ", ".join(f"{k} {v:.3g}" for k, v in charged.items()))
        if not over:
            note = "all within the article's 10 % rule, so jitter does not call for static"
        elif not under:
            note = ("every strategy exceeds the article's 10 % rule, so the spikes come from batch composition, "
                    "not from allocation: static would not remove them")
        elif best not in over:
            note = (f"{best['name']} is within the article's 10 % rule; above it: {', '.join(c['name'] for c in over)}")
        else:
            u = max(under, key=lambda c: c["goodput_rps"])
            note = (f"{best['name']} is above the article's 10 % rule. Decode batch (p50–p99 sequences): "
                    + ", ".join(f"{c['name']} {batch(c)}" for c in everyone)
                    + f": the step time follows the batch size; {alloc_note}. {u['name']} stays within the rule; "
                      f"choose it only if steady "
                      f"decode steps matter more than goodput ({u['goodput_rps']:.3g} vs {best['goodput_rps']:.3g} req/s)")
        reasons.append(f"decode-step jitter p99/p50: {jit} — {note}")
    for c in others:
        o = c["operating_point"]
        if o["rejected"] or o.get("truncated"):
            reasons.append(f"{c['name']} refuses {o['rejected']} and truncates {o.get('truncated') or 0} of "
                           f"{o['requests']} requests at its operating point (the cost of a length ceiling)")
    reasons.append(f"at the operating point: {op['preemptions']} preemptions, {op['rejected']} rejected"
                   + (f" ({', '.join(f'{k}: {v}' for k, v in op['rejected_by_reason'].items())})" if op["rejected"] else "")
                   + (f", {op['truncated']} truncated" if op.get("truncated") else ""))
    knobs = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
    if target:
        how_many = (f"{best['replicas_needed']} replica(s), {gpus} GPU(s) for {target:g} req/s"
                    if best.get("replicas_needed") else f"more than {p.get('max_replicas', 256)} replicas")
    else:
        how_many = (f"{best['gpus']} GPU(s) serve up to {best['goodput_rps']:.3g} req/s within the SLO; "
                    f"for a rate R plan ⌈R / {best['goodput_per_gpu_rps']:.3g}⌉ GPUs (check with --target-rate)")
    text = f"Use {best['name']} — {best['strategy']} (set {knobs}) on {p['gpu']}: {how_many}."
    return {"candidate": best["name"], "text": text, "reasons": reasons}


# --- outputs --------------------------------------------------------------------------

def write_plan(p: dict, out: str | Path) -> Path:
    """``plan.json`` and ``plan.html`` (plotly; needs the ``report`` extra) into ``out``."""
    import json
    out = out_dir(out)
    text = json.dumps(p, indent=1, default=float) + "\n"
    replace_file(out / "plan.json", lambda path: path.write_text(text))
    from sim.analysis import plots
    from sim.analysis.report import write_html
    figs = [plots.attainment_vs_rate(p), plots.latency_throughput(p), plots.plan_kv_memory(p)]
    intro = [f"<p><b>{_esc(p['recommendation']['text'])}</b></p>",
             "<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in p["recommendation"]["reasons"]) + "</ul>",
             f"<p>SLO: {_esc(p['slo_text'])}; goodput tolerance {p['tolerance']:.0%}; "
             f"{p['simulations']} simulations.</p>"]
    if p["skipped"]:
        intro.append("<p>Skipped: " + "; ".join(_esc(f"{s['name']}: {s['reason']}") for s in p["skipped"]) + "</p>")
    write_html(out / "plan.html", f"kvsim plan: {p['scenario']}", figs, "".join(intro), (PLAN_COLUMNS, plan_rows(p)))
    return out


def _esc(s: str) -> str:
    import html
    return html.escape(str(s))


PLAN_COLUMNS = ["candidate", "goodput req/s", "GPUs", "goodput/GPU", "attain@goodput", "attain@+tol", "TTFT p90 s",
                "TPOT p90 s", "waste", "ext frag", "jitter p99/p50", "preempt", "rejected"]


def plan_rows(p: dict) -> list[list[str]]:
    """The plan table (one row per candidate), as strings."""
    rows = []
    target = p.get("target_rate")
    for c in p["candidates"]:
        if c["status"] != "ok":
            rows.append([c["name"], "0 (infeasible)" if c["status"] == "infeasible" else c["status"], "-", "-", "-", "-",
                         "-", "-", "-", "-", "-", "-", "-"])
            continue
        op, v = c["operating_point"], c["verify"]
        gpus = c.get("gpus_needed") if target else c["gpus"]
        rows.append([
            c["name"] + (" (upper bound)" if c.get("upper_bound") else "")
            + ("" if c.get("search_status") == "ok" else f" ({c.get('search_status')})"),
            f"{c['goodput_rps']:.3g}", str(gpus if gpus is not None else f">{p.get('max_replicas', '?')}"),
            f"{c['goodput_per_gpu_rps']:.3g}",
            "-" if v["attainment"] is None else f"{v['attainment']:.3f}",
            "-" if v["next_attainment"] is None else f"{v['next_attainment']:.3f}",
            _num(op["ttft_p90_s"]), _num(op["tpot_p90_s"]), _pct(op["memory_waste"]), _pct(op["external_frag_mean"]),
            "-" if op["decode_jitter"] is None else f"{op['decode_jitter']:.2f}", str(op["preemptions"]), str(op["rejected"]),
        ])
    return rows


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"
