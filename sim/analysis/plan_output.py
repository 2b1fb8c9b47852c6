"""A plan as files and tables: ``plan.json`` (strict JSON), ``plan.html`` and the rows of the
terminal table (``kvsim plan``, the explorer's Plan page)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sim.analysis.recommend import jitter_text, lower_bound_mark, pct, per_gpu, problem_lines
from sim.analysis.sequential import DEFAULT_CONFIDENCE
from sim.output.results import replace_file
from sim.output.staging import out_dir


def plan_dtypes(p: dict) -> str:
    """`` (weights fp8, KV fp8)`` for a plan's title: what the model serves, which a checkpoint may
    set without the scenario saying so (empty for a plan written before the fields existed)."""
    if not p.get("weight_dtype"):
        return ""
    return f" (weights {p['weight_dtype']}, KV {p['kv_dtype']})"


def plan_router(p: dict) -> str:
    """``; router length_split: 25% of the replicas for prompts of 8192+ tokens`` for a plan's title
    (``1 of the replicas`` for a pool given as a count; empty for the other routers, which serve
    every request alike)."""
    split = p.get("length_split")
    if not split:
        return ""
    pool = (
        f"{split['share']:.0%} of the replicas (at least 1 each side)"
        if split.get("share") is not None
        else f"{split['replicas']} of the replicas"
    )
    return f"; router length_split: {pool} for prompts of {split['prompt_tokens']}+ tokens"


def plan_json(p: dict) -> str:
    """``p`` as strict JSON (no NaN or infinity: ``null``), as ``plan.json`` holds it."""
    import json

    # allow_nan=False: a NaN or infinity that slipped past _strict fails here, not in the reader.
    return json.dumps(_strict(p), indent=1, allow_nan=False) + "\n"


def write_plan(p: dict, out: str | Path) -> Path:
    """``plan.json`` and ``plan.html`` (plotly; needs the ``report`` extra) into ``out``."""
    out = out_dir(out)
    text = plan_json(p)
    replace_file(out / "plan.json", lambda path: path.write_text(text))
    from sim.analysis import plots
    from sim.analysis.report import write_html

    figs = [plots.attainment_vs_rate(p), plots.latency_throughput(p), plots.plan_kv_memory(p)]
    intro = [
        f"<p><b>{_esc(p['recommendation']['text'])}</b></p>",
        "<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in p["recommendation"]["reasons"]) + "</ul>",
    ]
    lines = assumption_lines(p)
    if lines:
        intro.append(
            "<p>Assumptions (unmeasured constants of the cost model and the KV capacity):</p><ul>"
            + "".join(f"<li>{_esc(a)}</li>" for a in lines)
            + "</ul>"
        )
    if p.get("accuracy"):
        intro.append(f"<p>Accuracy: {_esc(p['accuracy'])}.</p>")
    intro.append(
        f"<p>SLO: {_esc(p['slo_text'])}{_esc(plan_router(p))}; goodput tolerance {p['tolerance']:.0%}; "
        f"{_esc(search_summary(p))}.</p>"
    )
    problems = problem_lines(p)
    if problems:
        intro.append("<p>Not planned: " + "; ".join(_esc(line) for line in problems) + "</p>")
    write_html(out / "plan.html", f"kvsim plan: {p['scenario']}", figs, "".join(intro), (plan_columns(p), plan_rows(p)))
    return out


def _strict(x: Any) -> Any:
    """``x`` with every value JSON can hold: NumPy scalars and arrays as Python numbers and lists,
    and NaN or infinity (a metric of a run with no request of its kind, an unbounded saturation
    estimate) as null. ``json.dumps`` would write them as ``NaN``/``Infinity``, which strict JSON
    readers (``jq``, browsers, most languages) refuse."""
    if isinstance(x, dict):
        return {str(k): _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, np.ndarray):
        return _strict(x.tolist())
    if x is None or isinstance(x, (str, bool)):
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    v = float(x)  # as json.dumps(default=float) did for any other number type
    return v if math.isfinite(v) else None


def search_summary(p: dict) -> str:
    """How much simulation the plan took, in one line."""
    return (
        f"{p.get('search', 'guided')} search, {p.get('seeds', 1)} seed(s): {p['simulations']} simulations "
        f"({p.get('quick_simulations', 0)} stopped early when decided, {p.get('simulated_requests', 0)} requests) "
        f"in {p.get('wall_s', 0):.1f} s"
    )


def assumption_lines(p: dict) -> list[str]:
    """One line per unmeasured constant of the plan's cost model and deployment (:mod:`sim.analysis.assumptions`)."""
    return [a["text"] for a in p.get("assumptions") or []]


def _esc(s: str) -> str:
    import html

    return html.escape(str(s))


#: The plan table's columns (``plan_columns`` adds the interval column when the plan has seeds, and
#: names the per-GPU column after the statistic the recommendation ranks by).
PLAN_COLUMNS = [
    "candidate",
    "goodput req/s",
    "edge req/s",
    "GPUs",
    "edge/GPU",
    "attain@goodput",
    "attain@+tol",
    "TTFT p90 s",
    "TPOT p90 s",
    "waste",
    "ext frag",
    "jitter p99/p50",
    "preempt",
    "rejected",
]


_PER_GPU_COLUMN = {"goodput_mean_rps": "mean edge/GPU", "goodput_est_rps": "edge/GPU", "goodput_rps": "goodput/GPU"}


def _table_basis(p: dict) -> str:
    """The statistic of the per-GPU column: the recommendation's, or while candidates stream in
    (no recommendation yet) the one it will rank by when every candidate settles."""
    basis = (p.get("recommendation") or {}).get("basis")
    if basis:
        return basis
    return "goodput_mean_rps" if (p.get("seeds") or 1) > 1 else "goodput_est_rps"


def plan_columns(p: dict) -> list[str]:
    cols = list(PLAN_COLUMNS)
    cols[4] = _PER_GPU_COLUMN[_table_basis(p)]
    if (p.get("replicas") or 1) > 1:
        # The goodput search runs at the scenario's replica count: say so where it is not one.
        cols[1], cols[2] = (f"{c} ({p['replicas']} replicas)" for c in cols[1:3])
    if (p.get("seeds") or 1) > 1:
        # The verified goodput, its edge and the attainments beside them are the first seed's search.
        seed = p.get("seed")
        of = f" (seed {seed})" if seed is not None else " (first seed)"
        cols[1], cols[2] = cols[1] + of, cols[2] + of
        cols.insert(3, f"edge over {p['seeds']} seeds ({p.get('confidence', DEFAULT_CONFIDENCE):.0%})")
    return cols


def candidate_row(p: dict, c: dict) -> list[str]:
    """One candidate's row of the plan table, as strings (a candidate dict as it streams in)."""
    seeds = (p.get("seeds") or 1) > 1
    if c["status"] != "ok":
        row = [c["name"], "0 (infeasible)" if c["status"] == "infeasible" else c["status"]] + ["-"] * 12
        return row[:3] + ["-"] + row[3:] if seeds else row
    op, v = c.get("operating_point") or {}, c["verify"]
    gpus = c.get("gpus_needed") if p.get("target_rate") else c["gpus"]
    sized = not p.get("target_rate") or "replicas_needed" in c  # an upper bound is not sized
    nxt = v.get("next_attainment")
    basis = _table_basis(p)
    # A goodput that is only a lower bound (search_status unbounded or budget) is marked ≥ in its
    # cells, not in the name: the name column is narrow enough to cut a long suffix.
    lb = lower_bound_mark(c)
    row = [
        c["name"] + (" (upper bound)" if c.get("upper_bound") else ""),
        f"{lb}{c['goodput_rps']:.3g}",
        lb + _num(c.get("goodput_est_rps")) if c.get("goodput_est_rps") is not None else "-",
        "-" if not sized else str(gpus if gpus is not None else f">{p.get('max_replicas', '?')}"),
        lb + _num(per_gpu(c, basis)) if c.get(basis) else "-",
        "-" if v["attainment"] is None else f"{v['attainment']:.3f}",
        "-" if nxt is None else ("" if v.get("next_exact", True) else "≈") + f"{nxt:.3f}",
        _num(op.get("ttft_p90_s")),
        _num(op.get("tpot_p90_s")),
        pct(op.get("memory_waste")),
        pct(op.get("external_frag_mean")),
        "-" if op.get("decode_jitter") is None else jitter_text(op["decode_jitter"]),
        str(op.get("preemptions", "-")),
        str(op.get("rejected", "-")),
    ]
    if seeds:
        ci = c.get("goodput_ci_rps")
        m = c.get("goodput_mean_rps")
        row.insert(3, "-" if not (ci and m) else f"{m:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] ±{(ci[1] - ci[0]) / 2 / m:.1%}")
    return row


def plan_rows(p: dict) -> list[list[str]]:
    """The plan table (one row per candidate), as strings."""
    return [candidate_row(p, c) for c in p["candidates"]]


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"
