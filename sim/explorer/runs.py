"""A run behind the page's cache: a scenario's canonical JSON is the cache key (:func:`canonical_json`),
:func:`run_canonical` simulates it into a :class:`RunData`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from sim.config import SCENARIO_DIR, Scenario, scenario_from_dict
from sim.engine.budget import EXPLORER_BUDGET


def canonical_json(sc: Scenario) -> str:
    """Canonical JSON of a resolved scenario: the cache key of its run.

    Only explicitly set keys are kept (``exclude_unset``): whether ``num_requests`` was given
    changes what a ``duration_s`` run does, so a full dump would not round-trip.
    """
    return json.dumps(sc.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":"))


def scenario_from_canonical(key: str) -> Scenario:
    return scenario_from_dict(json.loads(key), base_dir=SCENARIO_DIR)


@dataclass
class RunData:
    """What the page keeps of a run (picklable: Streamlit's cache copies it)."""

    key: str
    summary: dict
    requests: pa.Table
    timeseries: pa.Table
    wall_s: float
    scenario_name: str = ""


def empty_run() -> RunData:
    """A run with no rows (typed like a real one): the page draws empty chart frames from it."""
    from sim.output.metrics import Recorder

    rec = Recorder(1)
    return RunData("", {}, rec.requests_table(), rec.timeseries_table(), 0.0)


def run_canonical(key: str, progress: Callable[[int, int], None] | None = None) -> RunData:
    """Simulate the scenario whose canonical JSON is ``key``, within :data:`EXPLORER_BUDGET`."""
    from sim.engine.cluster import simulate

    sc = scenario_from_canonical(key)
    res = simulate(sc, progress=progress, budget=EXPLORER_BUDGET)
    return RunData(key, res.summary, res.requests, res.timeseries, res.run_info.get("wall_s", 0.0), sc.name)


def check_runnable(sc: Scenario) -> None:
    """Build what a run of ``sc`` builds (workload, deployment, allocator, cost model) without
    simulating, so an upload that could never run is refused at once rather than at Run.

    The request count is capped for the check: the page's Requests knob may still lower it, and
    a large count only costs time here.
    """
    from sim.engine.deployment import Deployment, with_engine_defaults
    from sim.workload.generator import build_workload, total_length_percentile

    sc = with_engine_defaults(sc)
    limit = EXPLORER_BUDGET.max_requests or 1000
    n = sc.workload.num_requests
    if n is not None and n > limit:
        sc = sc.model_copy(update={"workload": sc.workload.model_copy(update={"num_requests": limit})})
    wl = build_workload(sc)
    dep = Deployment.from_scenario(sc, lambda q: total_length_percentile(sc, wl, q))
    dep.make_allocator(sc)
    dep.make_cost_model(sc)
