"""A wall-time budget for one page action (a sweep, a plan), on top of each run's own budget.

:data:`~sim.engine.budget.EXPLORER_BUDGET` caps one simulation (60 s); a page sweep of 48 points or
a plan of 10 candidates × 10 seeds × 10 evaluations multiplies it to tens of minutes per click.
:data:`ACTION_BUDGET_S` caps the action as a whole:

* a sweep (:func:`sweep_within`) starts no point once the budget is spent (checked as each point
  finishes: the point running then ends within its own 60 s); the points that finished are kept and
  the others come back as rows of status ``skipped`` (:func:`sweep_note` says so in one line).
  Pressing Run sweep again continues: the finished points are reused from the session folder.
* a plan (:func:`plan_within`) runs in a process of its own that is ended when the budget is spent
  (its worker processes end with it); the candidates that finished are kept and
  :class:`ActionBudgetSpent` names those and the ones that did not.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from sim.errors import ConfigError

#: Wall-clock seconds of one page action (a sweep or a plan), all its runs together.
ACTION_BUDGET_S = 300.0
#: Status of a sweep point not run because the page action's budget was spent.
SKIPPED = "skipped"
#: Skipped points a message names (the table lists them all).
NAMED_SKIPPED = 5


class ActionBudgetSpent(ConfigError):
    """A plan stopped at the page's budget: ``finished`` (candidate dicts, as ``on_candidate`` got
    them) and ``not_finished`` (candidate names)."""

    def __init__(self, message: str, finished: list[dict], not_finished: list[str]):
        self.key, self.value, self.allowed = "page budget", None, message
        ValueError.__init__(self, message)
        self.finished = finished
        self.not_finished = not_finished


class _Stop(Exception):
    """Raised from a sweep's progress hook: no further point is started."""


def _deadline(total_wall_s: float | None) -> float | None:
    if total_wall_s is None:
        return None
    if not total_wall_s >= 0:
        raise ValueError(f"total_wall_s must be a non-negative number, got {total_wall_s!r}")
    return time.monotonic() + total_wall_s


# --- sweeps ---------------------------------------------------------------------------------


def sweep_within(
    sweep_file: Path,
    out: Path,
    total_wall_s: float | None = ACTION_BUDGET_S,
    progress: Callable[[int, int, int], None] | None = None,
    workers: int = 1,
    budget=None,
) -> tuple[pa.Table, list[dict]]:
    """``run_sweep(sweep_file, out=out)`` that starts no point after ``total_wall_s`` seconds:
    (dataset table, failures), the points not run as rows of status ``skipped``."""
    from sim.analysis.sweep import run_sweep

    deadline = _deadline(total_wall_s)

    def hook(done: int, total: int, failed: int) -> None:
        if progress is not None:
            progress(done, total, failed)
        if deadline is not None and done < total and time.monotonic() >= deadline:
            raise _Stop

    try:
        res = run_sweep(sweep_file, workers=workers, out=out, progress=hook, budget=budget)
    except _Stop:
        return _stopped_sweep(sweep_file, out, total_wall_s or 0.0)
    return res.table(), res.failures


def _stopped_sweep(sweep_file: Path, out: Path, total_wall_s: float) -> tuple[pa.Table, list[dict]]:
    from sim.analysis.sweep import load_sweep, read_dataset

    table = read_dataset(out)
    points = load_sweep(sweep_file).points()
    done = set(table.column("point_id").to_pylist())
    todo = [p for p in points if p.point_id not in done]
    why = f"not run: the page's budget of {total_wall_s:g} s per sweep was spent"
    cols: dict[str, pa.Array] = {
        "point": pa.array([p.index for p in todo], pa.int64()),
        "point_id": pa.array([p.point_id for p in todo], pa.string()),
        "status": pa.array([SKIPPED] * len(todo), pa.string()),
        "error": pa.array([why] * len(todo), pa.string()),
        "seed": pa.array([p.seed for p in todo], pa.int64()),
    }
    keys = list(dict.fromkeys(k for p in todo for k in p.params))
    for k in keys:
        if k in cols:
            continue
        values = [p.params.get(k) for p in todo]
        t = table.schema.field(k).type if k in table.column_names else None
        try:
            cols[k] = pa.array(values, t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            cols[k] = pa.nulls(len(todo), t or pa.string())
    failures = [
        {"point_id": r.get("point_id"), "params": {k: r.get(k) for k in keys}, "error": r.get("error")}
        for r in table.select(
            [c for c in ("point_id", "status", "error", *keys) if c in table.column_names]
        ).to_pylist()
        if r.get("status") not in ("ok", SKIPPED)
    ]
    if todo:
        table = pa.concat_tables([table, pa.table(cols)], promote_options="permissive")
        if "point" in table.column_names:
            table = table.sort_by([("point", "ascending")])
    return table, failures


def sweep_note(table: pa.Table | None, params: Sequence[str] = ()) -> str | None:
    """One line for a sweep that stopped at the page's budget (rows of status ``skipped``), naming
    the first skipped points by ``params`` (their axis columns); ``None`` for a complete sweep."""
    if table is None or "status" not in table.column_names:
        return None
    status = table.column("status").to_pylist()
    skipped = [i for i, s in enumerate(status) if s == SKIPPED]
    if not skipped:
        return None
    params = [c for c in params if c in table.column_names]
    rows = table.take(pa.array(skipped[:NAMED_SKIPPED], pa.int64())).to_pylist()
    named = "; ".join(", ".join(f"{c}={r[c]}" for c in params) or str(r.get("point_id")) for r in rows)
    more = f"; and {len(skipped) - NAMED_SKIPPED} more" if len(skipped) > NAMED_SKIPPED else ""
    why = str(rows[0].get("error") or "not run").removeprefix("not run: ")
    return (
        f"Sweep stopped: {why}. {len(status) - len(skipped)} of {len(status)} points finished, "
        f"{len(skipped)} not run ({named}{more}; status '{SKIPPED}' in the table). Press Run sweep again to "
        "continue (finished points are reused), or sweep fewer points or requests (or use kvsim sweep)."
    )


# --- plans ----------------------------------------------------------------------------------


def plan_within(
    scenario: Path,
    slo,
    kwargs: dict[str, Any],
    total_wall_s: float | None = ACTION_BUDGET_S,
    progress: Callable[[int, int, str], None] | None = None,
    on_candidate: Callable[[dict], None] | None = None,
) -> dict:
    """``plan(scenario, slo, **kwargs)`` ended after ``total_wall_s`` seconds: the plan dict, or
    :class:`ActionBudgetSpent` naming the candidates that finished and those that did not.
    ``progress`` and ``on_candidate`` are called in this thread as candidates finish."""
    from sim.analysis.planner import plan, select_candidates

    if total_wall_s is None:
        return plan(scenario, slo, progress=progress, on_candidate=on_candidate, **kwargs)
    deadline = _deadline(total_wall_s)
    assert deadline is not None
    names = select_candidates(kwargs.get("allocators"))
    methods = multiprocessing.get_all_start_methods()
    # Not fork: the page's server holds threads.
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    q = ctx.Queue()
    # Not a daemon: a daemonic process may not start the plan's worker processes.
    proc = ctx.Process(  # type: ignore[attr-defined]  # every concrete context has Process
        target=_plan_child, args=(str(scenario), slo, kwargs, q, os.getpid()), name="kvsim-plan", daemon=False
    )
    finished: list[dict] = []
    proc.start()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = q.get(timeout=min(left, 0.25))
            except queue.Empty:
                if not proc.is_alive():
                    try:
                        msg = q.get(timeout=1.0)
                    except queue.Empty:
                        raise RuntimeError(
                            f"the plan's process ended without a result (exit code {proc.exitcode})"
                        ) from None
                else:
                    continue
            kind = msg[0]
            if kind == "candidate":
                finished.append(msg[1])
                if on_candidate is not None:
                    on_candidate(msg[1])
            elif kind == "progress":
                if progress is not None:
                    progress(*msg[1:])
            elif kind == "done":
                return msg[1]
            elif kind == "config_error":
                raise ConfigError(*msg[1:])
            else:
                raise RuntimeError(msg[1])
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        q.close()
    done = [c.get("name") for c in finished]
    left_names = [n for n in names if n not in done]
    what = (
        f"{len(done)} of {len(names)} candidates finished ({', '.join(map(str, done)) or 'none'}), "
        f"not finished: {', '.join(left_names)}"
        if left_names
        else f"all {len(names)} candidates finished but not the break-even runs"
    )
    raise ActionBudgetSpent(
        f"Plan stopped at the page's budget of {total_wall_s:g} s: {what}. Pick fewer candidates, seeds or "
        "requests per run, or run kvsim plan.",
        finished,
        left_names,
    )


def _plan_child(scenario: str, slo, kwargs: dict, q, parent_pid: int) -> None:
    """The plan, in a process of its own that ends with the page's server."""
    from sim.analysis.planner import plan
    from sim.analysis.worker_lifetime import init_worker

    init_worker(parent_pid)
    try:
        out = plan(
            scenario,
            slo,
            progress=lambda d, n, name: q.put(("progress", d, n, name)),
            on_candidate=lambda c: q.put(("candidate", c)),
            **kwargs,
        )
        q.put(("done", out))
    except ConfigError as exc:
        value = exc.value
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - any value the error names is still shown
            value = str(value)
        q.put(("config_error", exc.key, value, exc.allowed))
    except BaseException as exc:  # noqa: BLE001 - reported by the page
        q.put(("error", f"{type(exc).__name__}: {exc}"))
