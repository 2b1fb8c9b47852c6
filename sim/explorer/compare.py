"""The Compare tab: one column per allocator configuration (its label and overrides) and the KPIs side
by side, best and worst marked."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sim.explorer.knobs import allocator_knobs, reserve_value
from sim.explorer.kpi import KPI_SPEC, format_kpi


def compare_rows(kpis_by_label: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per KPI: ``{"KPI": label, <run label>: formatted value, ...}`` plus ``_best``/``_worst``
    (the labels of every column holding the best / worst value: tied columns are all marked; empty
    when every value is the same) and ``_differs`` for highlighting."""
    labels = list(kpis_by_label)
    rows = []
    for key, label, _, better in KPI_SPEC:
        vals = {lb: kpis_by_label[lb].get(key) for lb in labels}
        row: dict[str, Any] = {"KPI": label}
        row.update({lb: format_kpi(key, v) for lb, v in vals.items()})
        present = {lb: v for lb, v in vals.items() if v is not None}
        differs = len(set(row[lb] for lb in labels)) > 1
        best: list[str] = []
        worst: list[str] = []
        if better and differs and len(present) > 1:
            hi, lo = max(present.values()), min(present.values())
            if hi != lo:
                top, bottom = (hi, lo) if better == "high" else (lo, hi)
                best = [lb for lb, v in present.items() if v == top]
                worst = [lb for lb, v in present.items() if v == bottom]
        row["_best"], row["_worst"], row["_differs"] = best, worst, differs
        rows.append(row)
    return rows


def breakdown_rows(breakdowns: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Runs' ``step_time_breakdown`` side by side: a ``busy time`` row, then one row per part that
    some run spent time on, in :data:`sim.cost.breakdown.PARTS` order: ``{"part", "what", <run
    label>: "seconds s (share)"}``."""
    from sim.cost.breakdown import PARTS

    rows: list[dict[str, Any]] = [
        {
            "part": "busy time",
            "what": "the replicas' iterations, all parts",
            **{lb: f"{float(b['busy_s']):.4g} s ({b['iterations']:,} iterations)" for lb, b in breakdowns.items()},
        }
    ]
    for part, what in PARTS.items():
        if not any(b["seconds"].get(part) for b in breakdowns.values()):
            continue
        row: dict[str, Any] = {"part": part, "what": what}
        for lb, b in breakdowns.items():
            v = float(b["seconds"].get(part, 0.0))
            row[lb] = f"{v:.4g} s ({float(b['share'].get(part, 0.0)):.1%})" if v else "–"
        rows.append(row)
    return rows


ALLOCATOR_KNOBS = ("kind", "block_size", "reserve", "overflow")


def allocator_label(cfg: Mapping[str, Any]) -> str:
    """A Compare column's name: the kind, its main knobs, and every other knob not at its default
    (two paged columns that differ only in ``page_reuse`` must not both read ``paged b=16``)."""
    kind = cfg.get("kind", "paged")
    knobs = allocator_knobs(kind)
    if kind == "paged":
        head, shown = f"paged b={cfg.get('block_size', 16)}", {"block_size"}
    elif kind == "static":
        head, shown = (
            f"static {cfg.get('reserve', 'max_model_len')} ({cfg.get('overflow', 'reject')})",
            {
                "reserve",
                "overflow",
            },
        )
    else:
        head, shown = kind, set()
    extra = " ".join(f"{k}={cfg[k]}" for k in knobs if k not in shown and k in cfg and cfg[k] != knobs[k])
    return f"{head} {extra}".strip()


def allocator_overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted overrides for one Compare column: the kind and its knobs (``KINDS``) only."""
    kind = cfg.get("kind", "paged")
    out: dict[str, Any] = {"allocator.kind": kind}
    for k, default in allocator_knobs(kind).items():
        v = cfg.get(k, default)
        out[f"allocator.{k}"] = reserve_value(v) if k == "reserve" else v
    return out


def inputs_key(*parts: Any) -> str:
    """What a page action (a comparison, a sweep, a plan) was run on, as one string: the edited
    Explore scenario and the action's own widgets. The page keeps it with the results and marks them
    stale ("press Run again") when the inputs on screen give another key."""
    return json.dumps(parts, sort_keys=True, default=str)


def compare_inputs_key(data: Mapping[str, Any], cfgs: Sequence[Mapping[str, Any]]) -> str:
    """:func:`inputs_key` of a comparison: the edited scenario (``data``) and the configurations."""
    return inputs_key(data, list(cfgs))


def unique_labels(cfgs: list[Mapping[str, Any]]) -> list[str]:
    labels: list[str] = []
    seen: dict[str, int] = {}
    for cfg in cfgs:
        lb = allocator_label(cfg)
        seen[lb] = seen.get(lb, 0) + 1
        labels.append(lb if seen[lb] == 1 else f"{lb} #{seen[lb]}")
    return labels
