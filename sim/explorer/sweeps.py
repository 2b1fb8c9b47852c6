"""Small sweeps and plans from the page: the axes it may vary and their values, a grid sweep or a
goodput plan of the edited scenario run in the session folder, and a dataset's default plot axes."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from sim.config import Scenario, scenario_from_dict
from sim.engine.budget import EXPLORER_BUDGET
from sim.errors import ConfigError
from sim.explorer.page_budget import ACTION_BUDGET_S, plan_within, sweep_within
from sim.explorer.uploads import UploadStore, resolve_paths

#: Axes a page sweep may vary, with example values (free text is parsed per value, scalars only).
SWEEP_AXES: dict[str, str] = {
    "allocator.kind": "static, paged",
    "workload.arrival.rate": "5, 10, 15, 20",
    "allocator.block_size": "16, 64, 256",
    "scheduler.max_num_seqs": "64, 128, 256",
    "scheduler.max_num_batched_tokens": "2048, 8192",
    "gpu.replicas": "1, 2",
    "workload.arrival.cv": "1, 2, 4",
    "allocator.reserve": "max_model_len, p99, p95",
}
MAX_AXIS_VALUES = 12
MAX_SWEEP_POINTS = 48


def parse_axis_values(text: str, key: str) -> list:
    """``"5, 10, 20"`` → ``[5, 10, 20]`` for one of :data:`SWEEP_AXES` (each value a YAML scalar)."""
    if key not in SWEEP_AXES:
        raise ConfigError("sweep axis", key, f"one of {', '.join(SWEEP_AXES)}")
    values = []
    for raw in str(text).split(","):
        raw = raw.strip()
        if not raw:
            continue
        try:
            v = yaml.safe_load(raw)
        except yaml.YAMLError:
            v = raw
        except ValueError:
            # PyYAML hands an over-long integer literal to int(), which refuses more than
            # sys.get_int_max_str_digits() digits (and so would every reader downstream).
            raise ConfigError(
                key,
                f"a number of {len(raw):,} digits",
                f"plain numbers of at most {sys.get_int_max_str_digits():,} digits separated by commas",
            ) from None
        if not isinstance(v, (int, float, str)) or isinstance(v, bool):
            raise ConfigError(key, raw, "plain numbers or words separated by commas")
        values.append(v)
    if not values:
        raise ConfigError(key, text, "at least one value, separated by commas")
    if len(values) > MAX_AXIS_VALUES:
        raise ConfigError(key, f"{len(values)} values", f"at most {MAX_AXIS_VALUES} values per axis in the page")
    return list(dict.fromkeys(values))


def check_axes_read(base: Scenario, grid: Mapping[str, Sequence]) -> None:
    """Refuse an axis that no point reads: its values would all give the same run. ``base`` is the
    base scenario; ``grid`` the swept values. An ``allocator.*`` axis needs a point whose allocator
    kind reads it, a ``workload.arrival.*`` axis one whose arrival kind does (a swept
    ``allocator.kind`` or ``workload.arrival.kind``, or a key a knob depends on such as
    ``allocator.overflow``, counts point by point). The rule is
    :func:`sim.analysis.sweep.check_sweep_axes`, which ``kvsim sweep`` (and so
    :func:`run_small_sweep`) applies too: asked here before the scenario is written."""
    from sim.allocators.knob_use import grid_configs
    from sim.analysis.sweep.spec import check_sweep_axes
    from sim.workload.arrival_use import grid_arrivals

    check_sweep_axes(grid, grid_configs(base.allocator, grid), grid_arrivals(base.workload.arrival, grid))


def _write_run_scenario(
    data: dict, store: UploadStore, sub: str, check: Callable[[Scenario], None] | None = None
) -> Path:
    """The scenario with vetted absolute paths, written into the session folder (for sweep/plan
    files); ``check`` may refuse the validated scenario before anything is written."""
    resolved = resolve_paths(data, store.trace_paths(), store.profiles)
    sc = scenario_from_dict(resolved)
    if check is not None:
        check(sc)
    text = yaml.safe_dump(resolved, sort_keys=False)
    folder = store.dir / sub / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scenario.yaml"
    path.write_text(text)
    return path


def run_small_sweep(
    data: dict,
    grid: dict[str, list],
    num_requests: int,
    store: UploadStore,
    progress: Callable[[int, int, int], None] | None = None,
    workers: int = 1,
    total_wall_s: float | None = ACTION_BUDGET_S,
    slo=None,
    step_breakdown: bool = False,
):
    """Run a grid sweep of the edited scenario (``sim.analysis.sweep``); returns (dataset table, failures).
    ``slo`` (:class:`sim.analysis.slo.SLO` with a bound): each point's attainment of it (``slo.*`` columns);
    ``step_breakdown``: each point's iteration time by part (``step_share.*`` columns).
    No point starts after ``total_wall_s`` seconds: those not run are rows of status ``skipped``
    (:func:`sim.explorer.page_budget.sweep_within`)."""
    points = 1
    for values in grid.values():
        points *= len(values)
    if points > MAX_SWEEP_POINTS:
        raise ConfigError(
            "sweep", f"{points} points", f"at most {MAX_SWEEP_POINTS} points from the page (use kvsim sweep)"
        )
    _check_page_requests(num_requests)
    base = _write_run_scenario(data, store, "sweeps", lambda sc: check_axes_read(sc, grid))
    spec: dict[str, Any] = {
        "name": "explorer",
        "base": base.name,
        "set": {"workload.num_requests": int(num_requests)},
        "grid": {k: list(v) for k, v in grid.items()},
    }
    if slo is not None and (slo.ttft_s or slo.tpot_s or slo.e2e_s):
        spec["slo"] = {
            **{f"{m}_s": getattr(slo, f"{m}_s") for m in ("ttft", "tpot", "e2e") if getattr(slo, f"{m}_s")},
            "attainment": slo.attainment,
        }
    if step_breakdown:
        spec["step_breakdown"] = True
    sweep_file = base.parent / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return sweep_within(
        sweep_file, base.parent / "dataset", total_wall_s, progress, workers=workers, budget=EXPLORER_BUDGET
    )


def run_small_plan(
    data: dict,
    slo,
    candidates: list[str],
    num_requests: int,
    store: UploadStore,
    progress: Callable[[int, int, str], None] | None = None,
    tol: float = 0.1,
    max_evals: int = 10,
    workers: int = 1,
    seeds: int = 1,
    break_even: bool = False,
    on_candidate: Callable[[dict], None] | None = None,
    total_wall_s: float | None = ACTION_BUDGET_S,
) -> dict:
    """Goodput per candidate allocator for the edited scenario (``sim.analysis.planner.plan``);
    ``on_candidate`` receives each candidate as it finishes (the page streams them into its table).
    The plan is ended after ``total_wall_s`` seconds (:class:`~sim.explorer.page_budget.ActionBudgetSpent`
    names the candidates that finished: :func:`sim.explorer.page_budget.plan_within`)."""
    if not (getattr(slo, "ttft_s", None) or getattr(slo, "tpot_s", None)):
        # Every run meets an SLO without bounds: the plan would recommend "within the SLO" for nothing.
        raise ConfigError(
            "SLO", "TTFT bound 0 and TPOT bound 0", "at least one bound above 0 for a plan (sidebar: SLO)"
        )
    _check_page_requests(num_requests)
    base = _write_run_scenario(data, store, "plans")
    kwargs = {
        "overrides": {"workload.num_requests": int(num_requests)},
        "allocators": candidates or None,
        "tol": tol,
        "workers": workers,
        "max_evals": max_evals,
        "seeds": seeds,
        "break_even": break_even,
        "budget": EXPLORER_BUDGET,
    }
    return plan_within(base, slo, kwargs, total_wall_s, progress, on_candidate)


def plan_stream_rows(cands: list[dict], seeds: int = 1) -> list[dict]:
    """The plan table's rows for the candidates finished so far (before the recommendation exists)."""
    from sim.analysis.plan_output import candidate_row, plan_columns

    partial = {"seeds": seeds, "target_rate": None}
    cols = plan_columns(partial)
    return [dict(zip(cols, candidate_row(partial, c))) for c in cands]


def _check_page_requests(num_requests) -> None:
    limit = EXPLORER_BUDGET.max_requests
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or not 1 <= num_requests <= (limit or 0):
        raise ConfigError(
            "workload.num_requests",
            num_requests,
            f"an integer in [1, {limit}] in the page (its budget; kvsim sweep and kvsim plan have none)",
        )


def numeric_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]


def sweep_param_columns(table: pa.Table) -> list[str]:
    """The swept axes of a dataset: dotted scenario keys (``allocator.kind``) plus ``seed``."""
    prefixes = ("model.", "gpu.", "workload.", "scheduler.", "allocator.", "cost_model.", "engine.")
    cols = [c for c in table.column_names if c.startswith(prefixes)]
    if "seed" in table.column_names and len(set(table.column("seed").to_pylist())) > 1:
        cols.append("seed")
    return cols


def default_index(options: list, preferred: str) -> int:
    return options.index(preferred) if preferred in options else 0


def default_sweep_axes(table: pa.Table) -> tuple[str | None, str | None]:
    """(x, color) to plot a dataset by: a numeric swept axis on x, a categorical one as color."""
    params = sweep_param_columns(table)
    numeric = set(numeric_columns(table))
    x = next((c for c in params if c in numeric and c != "seed"), params[0] if params else None)
    color = next((c for c in params if c != x and c not in numeric), None)
    if color is None:
        color = next((c for c in params if c != x and c != "seed"), None)
    return x, color
