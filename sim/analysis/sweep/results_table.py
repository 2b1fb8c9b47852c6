"""A sweep's results as ``kvsim sweep`` prints them: the axes, completed / refused, the main
metrics and, with an SLO, the share of requests that met it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

RESULT_COLUMNS = (
    ("ttft_s.p90", "TTFT p90 s", "{:.3g}"),
    ("tpot_s.p90", "TPOT p90 s", "{:.3g}"),
    ("throughput_requests_per_s", "req/s", "{:.3g}"),
    ("preemptions", "preempt", "{:d}"),
    ("kv_internal_fragmentation", "KV waste", "{:.0%}"),
)


def result_rows(table: pa.Table, axes: Sequence[str], limit: int = 40) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a sweep's results as ``kvsim sweep`` prints them: each point's axis values,
    ``completed / refused``, :data:`RESULT_COLUMNS` and, where the sweep has an SLO, the share of
    requests that met it and whether that reaches the target (a failed point: its error), at most
    ``limit`` rows in point order."""
    cols = table.column_names
    seeds = "seed" in cols and len(set(table.column("seed").to_pylist())) > 1
    slo = "slo.attainment" in cols
    head = [
        *axes,
        *(["seed"] if seeds else []),
        "completed / refused",
        *(h for _, h, _ in RESULT_COLUMNS),
        *(["SLO attained"] if slo else []),
    ]
    rows = []
    for r in table.slice(0, limit).to_pylist():
        row = [_cell(r.get(a)) for a in axes] + ([str(r.get("seed"))] if seeds else [])
        if r.get("status") != "ok":
            rows.append(row + [f"failed: {r.get('error') or ''}"[:80]] + [""] * (len(head) - len(row) - 1))
            continue
        row.append(f"{r.get('completed')} / {r.get('rejected')}")
        for c, _, fmt in RESULT_COLUMNS:
            v = r.get(c)
            row.append("-" if v is None else fmt.format(v))
        if slo:
            att = r.get("slo.attainment")
            # One decimal: 89.6 % against a 90 % target must not print as a met 90 %.
            cell = "-" if att is None else f"{att * 100:.1f}% " + ("met" if r.get("slo.met") else "missed")
            long = r.get("slo.attainment.long")
            # The joint share can pass while every long prompt misses (they are few): say so.
            row.append(cell if long is None else f"{cell} (long {long * 100:.1f}%)")
        rows.append(row)
    return head, rows


def _cell(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(base scenario)"
