"""Several ``kvsim validate`` runs of one spec, read together: what repeats and what is one run's luck.

One validation run on a shared host carries a level of its own (the host's speed during its replays
against during its calibration; docs/validation.md, "What limits accuracy"), so one run's table mixes the
simulator's systematic error with that run's luck. Over several runs of the same spec the two come
apart:

* per run: its cells within 10 % and 5 %, median and worst error, mean signed error (its level);
* per cell: the mean signed error over the runs (the systematic part) with its standard deviation
  (what a single run adds) and how many runs put the cell beyond 10 %;
* per cell, its sensitivity to step time (d ln metric / d ln step time, from the simulator; the
  rows' own, or recomputed from the run's traces and profiles for runs written before rows carried
  it) and the mean signed error ÷ that: the uniform step-time error the cell's lean amounts to;
* the runs' median: per cell the median of the runs' signed errors, scored as one table. Errors,
  not values: each run's times are in its own unit (the ``cpu_norm`` clock is at the host speed of
  that run's calibration, and its arrival rates follow), so medians of values would pair one run's
  measurement with another's simulation.

Signed errors are ``(simulated − measured) ÷ measured``: negative means the simulator is fast.

    kvsim validate-runs runs/v1 runs/v2 runs/v3 [--out runs/validate-runs.json]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import ConfigError

from .metrics import TARGET_METRICS as JUDGED  # the cells a validation is judged on
from .sensitivity import SENSITIVITY_MIN

#: the bars the tables count against (fractions)
BARS = (0.10, 0.05)
KEY = "validate-runs"
_LOAD_ORDER = {"light": 0, "medium": 1, "saturating": 2}


@dataclass(frozen=True)
class Run:
    """One validation run's judged cells: ``cells[(load, allocator, metric)] = (measured, simulated)``
    in seconds; ``setup``: what must be equal for runs to be read together (model shape, KV memory,
    scheduler, workload, loads, the table's clock, device kind); ``engine``: the spec's engine options
    (replays, calibration choices; empty in runs written before they were recorded), which may differ."""

    path: str
    name: str
    cells: dict
    setup: dict
    engine: dict
    elapsed_s: float | None
    #: ``{(load, allocator, metric): d ln metric / d ln step time}`` where known
    sensitivity: dict = field(default_factory=dict)


def load_run(path: str | Path, recompute_sensitivity: bool = True) -> Run:
    """A run folder (or its ``validation.json``). Raises :class:`ConfigError` naming the path when it
    is not a validation run or has no judged cells. A run whose rows carry no ``sensitivity`` gets it
    recomputed from its traces and profiles (seconds of simulator time; none where they are missing)
    unless ``recompute_sensitivity`` is false."""
    p = Path(path)
    f = p / "validation.json" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"{KEY}.runs", str(path), "a kvsim validate output folder (with validation.json) or the file")
    from sim.inputs import load_json, read_text

    try:
        doc = load_json(read_text(f, f"{KEY}.runs", "validation.json"), f"{KEY}.runs", str(f))  # bounded
        rows = doc["rows"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{KEY}.runs", str(path), f"a validation.json with rows ({exc.__class__.__name__}: {exc})"
        ) from None
    cells, sens = {}, {}
    for r in rows:
        if r.get("metric") in JUDGED and r.get("measured") and r.get("simulated") is not None:
            cells[(r["load"], r["allocator"], r["metric"])] = (float(r["measured"]), float(r["simulated"]))
            if r.get("sensitivity") is not None:
                sens[(r["load"], r["allocator"], r["metric"])] = float(r["sensitivity"])
    if not cells:
        raise ConfigError(
            f"{KEY}.runs", str(path), f"a validation.json with measured and simulated {', '.join(JUDGED)} rows"
        )
    config = dict(doc.get("config") or {})
    engine = config.pop("engine", None) or {}
    setup = {
        "shape": doc.get("shape"),
        "config": config,
        "clock": doc.get("clock"),
        "device": (doc.get("device") or {}).get("kind"),
    }
    name = p.name if p.is_dir() else p.parent.name
    if not sens and recompute_sensitivity:
        from .sensitivity import run_sensitivity

        try:
            by_cell = run_sensitivity(f.parent)
        except (ConfigError, OSError, KeyError, ValueError, TypeError):
            by_cell = {}  # an incomplete or foreign folder: its errors are still worth reading without it
        sens = {
            (lo, a, m): v
            for (lo, a), d in by_cell.items()
            for m, v in d.items()
            if (lo, a, m) in cells and v is not None
        }
    return Run(str(path), name, cells, setup, dict(engine), doc.get("elapsed_s"), sens)


def signed_error(measured: float, simulated: float) -> float:
    """``(simulated − measured) ÷ measured``: negative when the simulator is fast."""
    return (simulated - measured) / measured


def _score(errs: np.ndarray) -> dict:
    a = np.abs(errs)
    return {
        "cells": int(errs.size),
        **{f"within_{int(b * 100)}pct": int((a <= b).sum()) for b in BARS},
        "median_abs_error": float(np.median(a)),
        "max_abs_error": float(a.max()),
        "rms_error": float(np.sqrt(np.mean(errs**2))),
        "mean_signed_error": float(errs.mean()),
    }


def combine(runs: list[Run]) -> dict:
    """The runs read together (see the module docstring). Needs two or more runs of one setup with the
    same cells (else :class:`ConfigError` naming the run and what differs); a run whose engine options
    (replays, calibration choices) differ from the first's that records them is named in ``engine_differs``."""
    if len(runs) < 2:
        raise ConfigError(f"{KEY}.runs", len(runs), "two or more validation runs of one spec")
    keys = sorted(runs[0].cells)
    for r in runs[1:]:
        if r.setup != runs[0].setup:
            what = [k for k in r.setup if r.setup[k] != runs[0].setup.get(k)]
            raise ConfigError(
                f"{KEY}.runs",
                r.path,
                f"a run of the same setup as {runs[0].path} (they differ in "
                f"{', '.join(what)}): runs of different setups measure different things",
            )
        if sorted(r.cells) != keys:
            missing = sorted(set(keys) ^ set(r.cells))[:3]
            raise ConfigError(
                f"{KEY}.runs",
                r.path,
                f"the same cells as {runs[0].path} (they differ in {', '.join('/'.join(k) for k in missing)})",
            )
    E = np.array([[signed_error(*r.cells[k]) for k in keys] for r in runs])  # runs × cells
    per_run = [{"run": r.name, "path": r.path, **_score(E[i]), "elapsed_s": r.elapsed_s} for i, r in enumerate(runs)]
    per_cell = []
    for j, (load, alloc, metric) in enumerate(keys):
        e = E[:, j]
        sv = [r.sensitivity[(load, alloc, metric)] for r in runs if (load, alloc, metric) in r.sensitivity]
        sens = float(np.mean(sv)) if sv else None
        per_cell.append(
            {
                "load": load,
                "allocator": alloc,
                "metric": metric,
                "mean_signed_error": float(e.mean()),
                "sd": float(e.std(ddof=1)),
                "runs_beyond_10pct": int((np.abs(e) > 0.10).sum()),
                "min": float(e.min()),
                "max": float(e.max()),
                "sensitivity": sens,
                "step_equivalent": (float(e.mean() / sens) if sens is not None and sens >= SENSITIVITY_MIN else None),
            }
        )
    med = np.median(E, axis=0)
    n_all = int((np.abs(E) <= 0.10).all(axis=1).sum())
    known = [r for r in runs if r.engine]  # runs written before validation.json recorded them: unknown, not different
    differs = [r.name for r in known[1:] if r.engine != known[0].engine]
    return {
        "runs": per_run,
        "cells": per_cell,
        "pooled": {
            "runs": len(runs),
            "cells_per_run": len(keys),
            "runs_all_within_10pct": n_all,
            "cells_beyond_10pct": int((np.abs(E) > 0.10).sum()),
            "cell_results": int(E.size),
            "mean_signed_error": float(E.mean()),
            "systematic_rms": float(np.sqrt(np.mean(E.mean(axis=0) ** 2))),
            "worst_cell_mean": max(per_cell, key=lambda c: abs(c["mean_signed_error"])),
        },
        "median_of_runs": {
            **_score(med),
            "cells_detail": [
                {"load": k[0], "allocator": k[1], "metric": k[2], "signed_error": float(x)} for k, x in zip(keys, med)
            ],
        },
        "engine_differs": differs,
    }


def _pct(x: float, signed: bool = False) -> str:
    return f"{x * 100:+.1f}" if signed else f"{x * 100:.1f}"


def _cell_table(title: str, cells: list[dict], text) -> list[str]:
    """A load × metric Markdown table of ``cells`` (one row per allocator and load), each entry
    ``text(cell)`` (an empty entry where a cell is missing)."""
    metrics = [m for m in JUDGED if any(c["metric"] == m for c in cells)]
    rows = sorted({(c["allocator"], c["load"]) for c in cells}, key=lambda x: (x[0], _LOAD_ORDER.get(x[1], 9), x[1]))
    by = {(c["allocator"], c["load"], c["metric"]): c for c in cells}
    out = [
        "",
        title,
        "",
        "| load | allocator | " + " | ".join(m.replace("_", " ") for m in metrics) + " |",
        "|---|---|" + "---|" * len(metrics),
    ]
    for alloc, load in rows:
        vals = [("" if (c := by.get((alloc, load, m))) is None else text(c)) for m in metrics]
        out.append(f"| {load} | {alloc} | " + " | ".join(vals) + " |")
    return out


def _error_text(c: dict) -> str:
    return f"{_pct(c['mean_signed_error'], True)} ± {_pct(c['sd'])}" + (
        f" ({c['runs_beyond_10pct']})" if c["runs_beyond_10pct"] else ""
    )


def _sensitivity_text(c: dict) -> str:
    if c.get("sensitivity") is None:
        return ""
    eq = c.get("step_equivalent")
    return f"{c['sensitivity']:.1f}" + (f" ({_pct(eq, True)})" if eq is not None else "")


def markdown(doc: dict) -> str:
    """The per-run and per-cell tables as Markdown (what the CLI prints)."""
    out = ["| run | within 10 % | within 5 % | median | worst | RMS | mean signed |", "|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        out.append(
            f"| {r['run']} | {r['within_10pct']} / {r['cells']} | {r['within_5pct']} | {_pct(r['median_abs_error'])} % | "
            f"{_pct(r['max_abs_error'])} % | {_pct(r['rms_error'])} % | {_pct(r['mean_signed_error'], True)} % |"
        )
    cells = doc["cells"]
    out += _cell_table("Mean signed error per cell over the runs, % ± s.d. (runs beyond 10 %):", cells, _error_text)
    if any(c.get("sensitivity") is not None for c in cells):
        out += _cell_table(
            "Sensitivity to step time per cell (d ln metric / d ln step time, simulator, mean over the "
            "runs) and, in brackets, the mean signed error ÷ it: the uniform step-time error, %, the "
            "cell's lean amounts to:",
            cells,
            _sensitivity_text,
        )
    p, m = doc["pooled"], doc["median_of_runs"]
    out += [
        "",
        f"{p['runs']} runs: all {p['cells_per_run']} cells within 10 % in {p['runs_all_within_10pct']}; "
        f"{p['cells_beyond_10pct']} of {p['cell_results']} cell results beyond 10 %; mean signed "
        f"{_pct(p['mean_signed_error'], True)} %; systematic RMS (of the cell means) {_pct(p['systematic_rms'])} %.",
        f"The runs' median (per cell, the median of the runs' signed errors): {m['within_10pct']} / {m['cells']} "
        f"within 10 %, {m['within_5pct']} within 5 %, worst {_pct(m['max_abs_error'])} %.",
    ]
    if doc["engine_differs"]:
        out.append(
            f"Note: the spec's engine options differ from the first run's in {', '.join(doc['engine_differs'])}."
        )
    return "\n".join(out)
