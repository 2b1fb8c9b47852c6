"""``kvsim guide``: the seed article's situations, simulated fresh, as a decision guide.

Every situation of the article *When KV Cache Management Becomes the Bottleneck: Choosing
Between Static and Dynamic Allocation* is data: a file in ``scenarios/guide/`` names its
scenario (in ``scenarios/``), its allocator variants (scenario overrides), its SLO and the
article's claims about it, each bound to a check (:mod:`.situations` reads and validates them).
:func:`run_situation` simulates every variant (:mod:`.runs` holds the measurements of one),
evaluates the claims (:mod:`.claims`: reproduced / partly / did not reproduce, with numbers)
and asks the goodput planner's :func:`sim.analysis.recommend.recommend` to pick a variant;
:mod:`.render` writes it all as ``docs/decision-guide.md``.

**SLO attainment and goodput at load**: the planner's goodput search (the highest rate meeting
the SLO) costs ~10 simulations per variant, too many for a 5-minute guide, and is undefined for
closed-loop and trace arrivals. The guide reports instead, *at the scenario's own load*,
attainment (requests meeting the situation's SLO ÷ all requests, :func:`sim.analysis.slo.attainment`)
and **goodput at load** = requests meeting the SLO ÷ makespan ÷ GPUs. The planner's
``recommend`` then ranks variants on that (ties within 5 %: fewer refused/truncated, then
goodput, then jitter, then memory waste). For a true goodput, ``kvsim plan SCENARIO --slo ...``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.analysis.guide.claims import NOT_REPRODUCED, PARTLY, REPRODUCED, SKIPPED, ClaimResult
from sim.analysis.guide.render import render
from sim.analysis.guide.runs import Run, SituationResult, fmt_pct
from sim.analysis.guide.situations import Claim, Situation, Variant, by_key, situations
from sim.analysis.planner import measure
from sim.analysis.recommend import recommend
from sim.catalog import MODELS
from sim.config import load_scenario

__all__ = [
    "DEFAULT_OUT",
    "NOT_REPRODUCED",
    "PARTLY",
    "REPRODUCED",
    "SKIPPED",
    "Claim",
    "ClaimResult",
    "Run",
    "Situation",
    "SituationResult",
    "Variant",
    "by_key",
    "claim",
    "partial_result",
    "recommendation",
    "run_all",
    "run_situation",
    "run_variant",
    "situations",
    "write_guide",
]

DEFAULT_OUT = Path("docs/decision-guide.md")

_CACHE: dict[tuple, Run] = {}


def _situation(sit: Situation | str) -> Situation:
    return by_key()[sit] if isinstance(sit, str) else sit


def run_variant(sit: Situation, variant: Variant, num_requests: int | None = None) -> Run:
    """Simulate one variant of a situation (cached per process: tests and the guide share runs)."""
    key = (sit.scenario, variant.name, tuple(sorted(variant.overrides.items())), num_requests)
    if key in _CACHE:
        return _CACHE[key]
    from sim.engine.cluster import simulate

    over = dict(variant.overrides)
    if num_requests is not None:
        over["workload.num_requests"] = num_requests
    sc = load_scenario(sit.scenario, over)
    t0 = time.perf_counter()
    res = simulate(sc)
    gpus = sc.gpu.replicas * sc.gpu.tensor_parallel
    m = measure(res, sit.slo)
    s = res.summary
    met = float(m["attainment"]) * s["requests"]
    run = Run(
        variant,
        s,
        res.requests,
        res.timeseries,
        m,
        m["attainment"],
        met / s["makespan_s"] / gpus if s["makespan_s"] else 0.0,
        gpus,
        int(s["kv_capacity_bytes_per_replica"] // s["kv_bytes_per_token"]) * sc.gpu.replicas,
        time.perf_counter() - t0,
    )
    _CACHE[key] = run
    return run


def run_situation(sit: Situation | str, num_requests: int | None = None) -> SituationResult:
    """Every variant of a situation, its claims and the planner's recommendation."""
    sit = _situation(sit)
    t0 = time.perf_counter()
    if sit.requires_model is not None and sit.requires_model not in MODELS:
        why = (
            f"model {sit.requires_model!r} is not in the catalog yet (kvsim list models); the scenario is written "
            f"for it and runs once it is added"
        )
        return SituationResult(sit, {}, skipped=why, num_requests=num_requests)
    runs = {v.name: run_variant(sit, v, num_requests) for v in sit.variants}
    r = SituationResult(sit, runs, num_requests=num_requests)
    r.claims = [(c, _safe_check(c, r)) for c in sit.claims]
    r.recommendation = recommendation(r)
    r.wall_s = time.perf_counter() - t0
    return r


def partial_result(sit: Situation | str, names: list[str], num_requests: int | None = None) -> SituationResult:
    """Only the named variants of a situation (for tests: a claim needs only some of them)."""
    sit = _situation(sit)
    by = {v.name: v for v in sit.variants}
    return SituationResult(sit, {n: run_variant(sit, by[n], num_requests) for n in names}, num_requests=num_requests)


def claim(sit: Situation | str, claim_id: str) -> Claim:
    return next(c for c in _situation(sit).claims if c.id == claim_id)


def _safe_check(c: Claim, r: SituationResult) -> ClaimResult:
    try:
        return c.check(r)
    except Exception as exc:  # a check that cannot compute (e.g. an empty run at a tiny size) says so
        return ClaimResult(SKIPPED, f"could not be checked: {type(exc).__name__}: {exc}")


def recommendation(r: SituationResult) -> dict:
    """The goodput planner's recommendation (:func:`sim.analysis.recommend.recommend`) over the non-contrast
    variants, with goodput = SLO-meeting requests/s per GPU at the scenario's load (upper-bound variants
    are reported beside, never picked)."""
    sit = r.situation
    cands: list[dict[str, Any]] = []
    for v in sit.variants:
        if v.contrast:
            continue
        run = r.runs[v.name]
        # Per GPU, the figure the headline and the table quote, so the reasons' goodputs read against them.
        g = run.goodput_per_gpu
        op = {"rate": None, "replicas": None, **run.measure}
        c: dict[str, Any] = {
            "name": v.name,
            "strategy": v.strategy,
            "overrides": v.overrides,
            "upper_bound": run.upper_bound,
            "status": "ok" if g > 0 else "infeasible",
            "goodput_rps": g,
            "goodput_per_gpu_rps": run.goodput_per_gpu,
            "gpus": run.gpus,
            "operating_point": op,
            "message": ""
            if g > 0
            else (
                f"at the scenario's load only {fmt_pct(run.attainment, 1)} of requests meet the SLO "
                f"({op['rejected']} rejected, {op['truncated']} truncated)"
            ),
        }
        cands.append(c)
    p = {
        "tolerance": 0.05,
        "target_rate": None,
        "candidates": cands,
        "slo_text": sit.slo.describe(),
        "gpu": _gpu_text(sit),
        "tensor_parallel": None,
    }
    rec = recommend(p)
    if rec["candidate"] is not None:
        best = next(c for c in cands if c["name"] == rec["candidate"])
        run = r.runs[best["name"]]
        knobs = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
        rec["text"] = (
            f"Use {best['name']} — {best['strategy']} (set {knobs}): {fmt_pct(run.attainment, 1)} of requests meet the "
            f"SLO at the scenario's load, goodput at load {run.goodput_per_gpu:.3g} req/s per GPU."
        )
    else:
        rec["text"] = (
            "No variant gets any request within the SLO at the scenario's load: relax the SLO, add memory or "
            "lower the load."
        )
    return rec


def _gpu_text(sit: Situation) -> str:
    sc = load_scenario(sit.scenario)
    return f"{sc.gpu.replicas} × {sc.gpu.name} (TP{sc.gpu.tensor_parallel})"


def run_all(
    num_requests: int | None = None, progress: Callable[[str, SituationResult], None] | None = None
) -> list[SituationResult]:
    out = []
    for sit in situations():
        r = run_situation(sit, num_requests)
        out.append(r)
        if progress:
            progress(sit.key, r)
    return out


def write_guide(
    out: str | Path = DEFAULT_OUT,
    num_requests: int | None = None,
    progress: Callable[[str, SituationResult], None] | None = None,
) -> tuple[Path, list[SituationResult]]:
    """Simulate every situation and write the guide to ``out``."""
    results = run_all(num_requests, progress)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, num_requests))
    return out, results
