"""The Compare tab: one column per allocator configuration (its label and overrides) and the KPIs side
by side, best and worst marked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.explorer.knobs import _reserve_value, allocator_knobs
from sim.explorer.kpi import KPI_SPEC, format_kpi


def compare_rows(kpis_by_label: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per KPI: ``{"KPI": label, <run label>: formatted value, ..., "best": label|""}``
    plus ``_best``/``_worst`` (labels) and ``_differs`` for highlighting."""
    labels = list(kpis_by_label)
    rows = []
    for key, label, _, better in KPI_SPEC:
        vals = {lb: kpis_by_label[lb].get(key) for lb in labels}
        row: dict[str, Any] = {"KPI": label}
        row.update({lb: format_kpi(key, v) for lb, v in vals.items()})
        present = {lb: v for lb, v in vals.items() if v is not None}
        differs = len(set(row[lb] for lb in labels)) > 1
        best = worst = ""
        if better and differs and len(present) > 1:
            order = sorted(present, key=lambda lb: present[lb], reverse=better == "high")
            if present[order[0]] != present[order[-1]]:
                best, worst = order[0], order[-1]
        row["_best"], row["_worst"], row["_differs"] = best, worst, differs
        rows.append(row)
    return rows


ALLOCATOR_KNOBS = ("kind", "block_size", "reserve", "overflow")


def allocator_label(cfg: Mapping[str, Any]) -> str:
    kind = cfg.get("kind", "paged")
    if kind == "paged":
        return f"paged b={cfg.get('block_size', 16)}"
    if kind == "static":
        return f"static {cfg.get('reserve', 'max_model_len')} ({cfg.get('overflow', 'reject')})"
    knobs = allocator_knobs(kind)
    extra = " ".join(f"{k}={cfg[k]}" for k in knobs if k in cfg and cfg[k] != knobs[k])
    return f"{kind} {extra}".strip()


def allocator_overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted overrides for one Compare column: the kind and its knobs (``KINDS``) only."""
    kind = cfg.get("kind", "paged")
    out: dict[str, Any] = {"allocator.kind": kind}
    for k, default in allocator_knobs(kind).items():
        v = cfg.get(k, default)
        out[f"allocator.{k}"] = _reserve_value(v) if k == "reserve" else v
    return out


def unique_labels(cfgs: list[Mapping[str, Any]]) -> list[str]:
    labels: list[str] = []
    seen: dict[str, int] = {}
    for cfg in cfgs:
        lb = allocator_label(cfg)
        seen[lb] = seen.get(lb, 0) + 1
        labels.append(lb if seen[lb] == 1 else f"{lb} #{seen[lb]}")
    return labels
