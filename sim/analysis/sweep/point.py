"""One sweep point run in a worker process (:func:`run_point`: the point's scenario simulated and its
summary flattened into columns), and the process pool the sweep and the planner run points in."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sim.analysis.slo import SLO, slo_columns
from sim.analysis.sweep.spec import Point
from sim.config import scenario_from_dict
from sim.engine.budget import RunBudget

if TYPE_CHECKING:
    from sim.analysis.worker_lifetime import WorkerPool


#: Metric columns are the run summary flattened; these keys are already columns of the row.
ROW_KEYS = ("point", "point_id", "status", "error", "seed", "wall_s")
#: A summary dict of these keys only is a distribution: one column each (``client_wait_s`` adds ``max``).
_PCT_KEYS = {"p50", "p90", "p99", "mean", "max"}


def flatten_summary(summary: dict) -> dict[str, Any]:
    """Run summary → flat metric columns: percentile dicts become ``ttft_s.p90`` etc.; a step-time
    breakdown ``step_s.<part>`` (seconds; ``step_s.busy`` all of them) and ``step_share.<part>``;
    other dicts (reasons, refusals, whose keys vary) become JSON strings."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if k in ROW_KEYS:
            continue
        if k == "step_time_breakdown":
            # Numbers to plot, not a JSON text: seconds and share of the busy time per part.
            out["step_s.busy"] = v["busy_s"]
            out.update({f"step_s.{part}": x for part, x in v["seconds"].items()})
            out.update({f"step_share.{part}": x for part, x in v["share"].items()})
            continue
        if isinstance(v, dict) and v and set(v) <= _PCT_KEYS:
            for c, x in v.items():
                out[f"{k}.{c}"] = x
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v, sort_keys=True)
        else:
            out[k] = v
    return out


def run_point(task: dict) -> dict:
    """Simulate one point (in a worker process). Never raises: failures come back as data."""
    from sim.engine.cluster import simulate

    t0 = time.perf_counter()
    try:
        sc = scenario_from_dict(task["scenario"], base_dir=task["base_dir"])
        budget = task.get("budget")
        breakdown = bool(task.get("step_breakdown"))
        result = simulate(sc, budget=RunBudget(**budget) if budget else None, step_breakdown=breakdown)
        metrics = flatten_summary(result.summary)
        if task.get("slo") is not None:
            metrics.update(slo_columns(result.requests, SLO(**task["slo"])))
        return {"status": "ok", "error": None, "metrics": metrics, "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # a point's failure is a result, not a crash of the sweep
        return {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "metrics": {},
            "wall_s": time.perf_counter() - t0,
        }


def lost_result(what: str, exc: Exception) -> dict:
    """A point's result when the process running it died: failed, with no time measured."""
    return {"status": "failed", "error": f"{what}: {type(exc).__name__}: {exc}", "metrics": {}, "wall_s": None}


def process_pool(
    workers: int, start_method: str | None = None, initializer: Callable[[int], None] | None = None
) -> WorkerPool:
    """A pool whose workers die with this process, however it ends
    (:mod:`sim.analysis.worker_lifetime`). By default they start fresh (forkserver, else spawn: no
    fork of a parent that may hold threads or a bar); ``start_method="fork"`` is for a caller
    that knows it holds no threads yet and wants workers with its imports already loaded.
    ``initializer``: called with this process's id in each worker; it must do what
    :func:`~sim.analysis.worker_lifetime.init_worker` does (the default)."""
    from sim.analysis.worker_lifetime import WorkerPool, init_worker

    methods = multiprocessing.get_all_start_methods()
    if start_method is None:
        start_method = "forkserver" if "forkserver" in methods else "spawn"
    ctx = multiprocessing.get_context(start_method)
    return WorkerPool(
        max_workers=workers, mp_context=ctx, initializer=initializer or init_worker, initargs=(os.getpid(),)
    )


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def point_task(p: Point, budget: RunBudget | None = None) -> dict:
    """The task a worker runs for point ``p`` (:func:`run_point`): what it needs, nothing more."""
    return {
        "point_id": p.point_id,
        "scenario": p.scenario,
        "base_dir": p.base_dir,
        "budget": None if budget is None else budget.__dict__,
        "slo": p.slo,
        "step_breakdown": p.step_breakdown,
    }
