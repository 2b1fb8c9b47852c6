"""A run behind the page's cache: a scenario's canonical JSON is the cache key (:func:`canonical_json`),
:func:`run_canonical` simulates it into a :class:`RunData`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from sim.config import SCENARIO_DIR, Scenario, scenario_from_dict, set_keys
from sim.engine.budget import EXPLORER_BUDGET, BudgetExceeded, RunBudget


def canonical_json(sc: Scenario) -> str:
    """Canonical JSON of a resolved scenario: the cache key of its run.

    The keys it sets at every depth (:func:`sim.config.set_keys`, what a sweep sends its workers and
    a run writes): whether ``num_requests`` was given changes what a ``duration_s`` run does, so a
    full dump would not round-trip. Pydantic's ``exclude_unset`` would not either: it drops a
    section its parent never marked set even where keys inside it were set, so two scenarios that
    run differently could share one key and one cached run.
    """
    return json.dumps(set_keys(sc), sort_keys=True, separators=(",", ":"))


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


def run_canonical(
    key: str, progress: Callable[[int, int], None] | None = None, budget: RunBudget = EXPLORER_BUDGET
) -> RunData:
    """Simulate the scenario whose canonical JSON is ``key``, within ``budget`` (the page's:
    :data:`EXPLORER_BUDGET`), its request cap applied to closed loops too (:func:`closed_loop_bound`)."""
    from sim.engine.cluster import simulate

    sc = scenario_from_canonical(key)
    run_sc, run_budget = closed_loop_bound(sc, budget)
    res = simulate(run_sc, progress=progress, budget=run_budget)
    check_closed_loop_requests(sc, res.summary, budget)
    return RunData(key, res.summary, res.requests, res.timeseries, res.run_info.get("wall_s", 0.0), sc.name)


def step_breakdown(key: str, budget: RunBudget = EXPLORER_BUDGET) -> dict:
    """Where the iteration time of the run of ``key`` goes (``summary.json``'s ``step_time_breakdown``,
    :mod:`sim.cost.breakdown`): the scenario run again with ``engine.mode: step``, which gives the same
    results and prices each iteration on its own, within ``budget``."""
    from sim.cost.breakdown import stepped
    from sim.engine.cluster import simulate

    sc = scenario_from_canonical(key)
    run_sc, run_budget = closed_loop_bound(sc, budget)
    res = simulate(stepped(run_sc), budget=run_budget, step_breakdown=True)
    check_closed_loop_requests(sc, res.summary, budget)
    return res.summary["step_time_breakdown"]


def _closed_loop_unbounded(sc: Scenario) -> bool:
    """A closed loop whose request count only the run tells (cut by ``duration_s``, no ``num_requests``)."""
    from sim.workload.generator import request_bound

    return sc.workload.arrival.kind == "closed_loop" and request_bound(sc) is None


def closed_loop_bound(sc: Scenario, budget: RunBudget = EXPLORER_BUDGET) -> tuple[Scenario, RunBudget]:
    """The scenario and budget to run ``sc`` with so that ``budget``'s request cap holds for a
    closed loop cut by ``duration_s`` as it does for an open loop (refused past it).

    An open loop's count is known before the run and checked then; a closed loop's is not, and the
    engine would draw a pool of 262,144 requests for it. So: more clients than the cap is refused at
    once (each client sends a request at the start, naming ``workload.arrival.concurrency``); else
    the pool is one request past the cap, and :func:`check_closed_loop_requests` refuses a run that
    sent more than the cap. Any other scenario is returned as it is."""
    limit = budget.max_requests
    if limit is None or not _closed_loop_unbounded(sc):
        return sc, budget
    clients = sc.workload.arrival.concurrency or 0
    if clients > limit:
        raise BudgetExceeded(
            f"{budget.source}: workload.arrival.concurrency",
            clients,
            f"at most {limit} clients: each sends a request at once, and the page runs at most {limit} requests "
            "per run (lower the clients, or set workload.num_requests)",
        )
    wl = sc.workload.model_copy(update={"num_requests": limit + 1})
    return sc.model_copy(update={"workload": wl}), dataclasses.replace(budget, max_requests=limit + 1)


def check_closed_loop_requests(sc: Scenario, summary: dict, budget: RunBudget = EXPLORER_BUDGET) -> None:
    """Refuse the run of a closed loop cut by ``duration_s`` that sent more requests than
    ``budget`` allows (see :func:`closed_loop_bound`)."""
    limit = budget.max_requests
    if limit is None or not _closed_loop_unbounded(sc):
        return
    sent = int(summary.get("requests") or 0)
    if sent > limit:
        raise BudgetExceeded(
            f"{budget.source}: requests",
            f"more than {limit} (a closed loop of {sc.workload.arrival.concurrency} clients "
            f"for workload.duration_s = {sc.workload.duration_s:g} s)",
            f"at most {limit} requests per run (lower workload.duration_s, or set workload.num_requests)",
        )


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
    dep = Deployment.from_scenario(sc, lambda q: total_length_percentile(wl, q))
    dep.make_allocator(sc)
    dep.make_cost_model(sc)
