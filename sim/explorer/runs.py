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
