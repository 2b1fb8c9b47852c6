"""Plotly figures of runs, sweeps and plans (used by ``kvsim report``, ``kvsim plan`` and the app).

Plotly is an optional dependency (extras ``report`` / ``app``): it is imported here only, inside
the functions, so ``import sim.analysis.plots`` works without it and the simulator core never needs it.

Inputs are the Arrow tables a run writes (columns in :mod:`sim.output.metrics`), a sweep dataset
(:func:`sim.analysis.sweep.read_dataset`) or a plan dict (``plan.json``, :mod:`sim.analysis.planner`). Times are
seconds of simulated time; memory is plotted in GiB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sim.analysis.columns import column

if TYPE_CHECKING:  # pragma: no cover
    from plotly.graph_objects import Figure

GIB = 2.0**30
#: More points than this in one trace are thinned by striding: a browser draws ~20k SVG points fine.
MAX_POINTS = 20_000
#: Distinct values a chart may give a cell row/column (heatmap) or a line of its own (the colour of
#: :func:`sweep_curves`) when the caller asks for a cap (the explorer does): a heatmap is a
#: ``len(y) × len(x)`` grid, so 2,000 distinct values per axis already make 4M cells (seconds of
#: CPU and tens of MB of JSON); a sweep has a handful per axis.
MAX_DISTINCT = 200
_COMPLETED = "completed"


def graph_objects():
    """``plotly.graph_objects``, imported on first use (an ImportError naming the extra to install
    when plotly is missing)."""
    try:
        import plotly.graph_objects as go
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plots need plotly: pip install 'kvsim[report]'") from exc
    return go


def _subplots(**kw):
    from plotly.subplots import make_subplots

    return make_subplots(**kw)


def _thin(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    n = len(arrays[0]) if arrays else 0
    if n <= MAX_POINTS:
        return arrays
    step = int(np.ceil(n / MAX_POINTS))
    # Keep the last point so the curve reaches the end of the run.
    idx = np.unique(np.r_[np.arange(0, n, step), n - 1])
    return tuple(a[idx] for a in arrays)


# --- per-request latencies -----------------------------------------------------------


def request_latencies(requests: pa.Table) -> dict[str, np.ndarray]:
    """TTFT, TPOT and end-to-end latency (s) of the completed requests (TPOT needs ≥ 2 tokens)."""
    ok = np.asarray(requests.column("status").to_pylist()) == _COMPLETED
    arrival = column(requests, "arrival_s")
    first = column(requests, "first_token_s")
    finish = column(requests, "finish_s")
    gen = column(requests, "generated_tokens")
    multi = ok & (gen > 1)
    return {
        "ttft_s": (first - arrival)[ok],
        "tpot_s": (finish - first)[multi] / (gen[multi] - 1),
        "e2e_s": (finish - arrival)[ok],
    }


def latency_cdf(requests: pa.Table | Mapping[str, pa.Table]) -> Figure:
    """Empirical CDFs of TTFT, TPOT and e2e latency; a dict compares label → requests table."""
    go = graph_objects()
    runs = {"run": requests} if isinstance(requests, pa.Table) else dict(requests)
    fig = _subplots(rows=1, cols=3, subplot_titles=("TTFT (s)", "TPOT (s)", "end-to-end latency (s)"))
    colors = palette(len(runs))
    for i, (label, table) in enumerate(runs.items()):
        lat = request_latencies(table)
        for j, key in enumerate(("ttft_s", "tpot_s", "e2e_s")):
            v = np.sort(lat[key])
            # Fraction of *all* requests: rejected ones never reach the top, so the CDF shows them.
            y = np.arange(1, v.size + 1) / max(table.num_rows, 1)
            v, y = _thin(v, y)
            fig.add_trace(
                go.Scatter(
                    x=v,
                    y=y,
                    mode="lines",
                    name=str(label),
                    legendgroup=str(label),
                    showlegend=j == 0,
                    line=dict(color=colors[i], shape="hv"),
                ),
                row=1,
                col=j + 1,
            )
    fig.update_yaxes(title_text="fraction of requests", range=[0, 1.02], row=1, col=1)
    fig.update_layout(
        title="Latency CDFs (rejected requests never complete: curves stop below 1)", hovermode="x unified"
    )
    return fig


# --- per-replica time series, summed over replicas ------------------------------------


def summed_over_replicas(ts: pa.Table, cols: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Cluster-wide step functions: at every recorded time, the sum over replicas of each
    replica's latest value of ``cols`` (a replica not yet recorded contributes its first value
    for capacity/free columns and 0 otherwise)."""
    t_all = column(ts, "t_s")
    rep = column(ts, "replica")
    order = np.argsort(t_all, kind="stable")
    t_union = np.unique(t_all)
    out = {c: np.zeros(t_union.size, dtype=np.float64) for c in cols}
    for r in np.unique(rep):
        sel = order[rep[order] == r]
        t_r = t_all[sel]
        idx = np.searchsorted(t_r, t_union, side="right") - 1
        before = idx < 0
        idx = np.maximum(idx, 0)
        for c in cols:
            v = column(ts, c)[sel].astype(np.float64)
            vals = v[idx]
            if c not in ("kv_capacity_bytes", "kv_free_bytes", "kv_largest_free_extent_bytes"):
                vals = np.where(before, 0.0, vals)
            out[c] += vals
    return t_union, out


def _step_lines(
    title: str, t: np.ndarray, lines: list[tuple[str, np.ndarray, dict]], yaxis_title: str, **layout
) -> Figure:
    """Time-series lines held between samples (``shape="hv"``): ``(name, values, line style)`` each."""
    go = graph_objects()
    fig = go.Figure()
    for name, v, style in lines:
        fig.add_trace(go.Scatter(x=t, y=v, mode="lines", name=name, line=dict(shape="hv", **style)))
    fig.update_layout(
        title=title, xaxis_title="simulated time (s)", yaxis_title=yaxis_title, hovermode="x unified", **layout
    )
    return fig


def kv_memory(timeseries: pa.Table, title: str = "KV cache memory (all replicas)") -> Figure:
    """Reserved, used and free KV bytes over time (GiB), summed over replicas; capacity dashed."""
    if timeseries.num_rows == 0:
        return _empty(graph_objects().Figure(), title)
    cols = ["kv_capacity_bytes", "kv_reserved_bytes", "kv_used_bytes", "kv_free_bytes"]
    t, s = summed_over_replicas(timeseries, cols)
    t, cap, res, used, free = _thin(
        t, s["kv_capacity_bytes"], s["kv_reserved_bytes"], s["kv_used_bytes"], s["kv_free_bytes"]
    )
    return _step_lines(
        title,
        t,
        [
            ("reserved", res / GIB, dict(color="#d62728", dash=None)),
            ("used", used / GIB, dict(color="#2ca02c", dash=None)),
            ("free", free / GIB, dict(color="#1f77b4", dash=None)),
            ("capacity", cap / GIB, dict(color="#7f7f7f", dash="dash")),
        ],
        "GiB",
    )


def fragmentation_series(timeseries: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, internal, external) over time, cluster-wide.

    internal = (reserved − used) / reserved: reserved memory holding no token (padding of a
    static reservation, the unfilled tail of a page). external = 1 − Σ largest free extent /
    Σ free: free memory no single new sequence can take (the free-weighted mean over replicas).
    Both are 0 where their denominator is 0.
    """
    cols = ["kv_reserved_bytes", "kv_used_bytes", "kv_free_bytes", "kv_largest_free_extent_bytes"]
    t, s = summed_over_replicas(timeseries, cols)
    res, used, free, largest = (s[c] for c in cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        internal = np.where(res > 0, (res - used) / res, 0.0)
        external = np.where(free > 0, 1.0 - largest / free, 0.0)
    return t, internal, np.clip(external, 0.0, 1.0)


def fragmentation(timeseries: pa.Table) -> Figure:
    """Internal and external KV fragmentation over time (see :func:`fragmentation_series`)."""
    title = "KV fragmentation: internal = (reserved − used)/reserved, external = 1 − largest free/free"
    if timeseries.num_rows == 0:
        return _empty(graph_objects().Figure(), title)
    t, internal, external = _thin(*fragmentation_series(timeseries))
    return _step_lines(
        title,
        t,
        [("internal", internal, dict(color="#d62728")), ("external", external, dict(color="#9467bd"))],
        "fraction",
        yaxis_range=[0, 1.02],
    )


def queue_length(timeseries: pa.Table) -> Figure:
    """Running and waiting requests over time, summed over replicas."""
    title = "Requests running and waiting (all replicas)"
    if timeseries.num_rows == 0:
        return _empty(graph_objects().Figure(), title)
    t, s = summed_over_replicas(timeseries, ["running", "waiting"])
    t, running, waiting = _thin(t, s["running"], s["waiting"])
    return _step_lines(title, t, [("running", running, {}), ("waiting", waiting, {})], "requests")


def step_latency(timeseries: pa.Table) -> Figure:
    """Per-iteration latency (``first_step_s``, ms) over time, one marker series per replica,
    decode-only iterations apart from those with prefill work (the seed article's sawtooth)."""
    go = graph_objects()
    fig = go.Figure()
    title = "Iteration latency (first iteration of each recorded window)"
    if timeseries.num_rows == 0:
        return _empty(fig, title)
    t = column(timeseries, "t_s")
    step = column(timeseries, "first_step_s") * 1e3
    decode = decode_only_mask(timeseries)
    rep = column(timeseries, "replica")
    for r in np.unique(rep):
        for mask, kind in ((decode, "decode"), (~decode, "prefill+decode")):
            sel = (rep == r) & mask
            if not sel.any():
                continue
            x, y = _thin(t[sel], step[sel])
            name = f"{kind}" if len(np.unique(rep)) == 1 else f"replica {r} {kind}"
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, marker=dict(size=3)))
    fig.update_layout(title=title, xaxis_title="simulated time (s)", yaxis_title="iteration latency (ms)")
    return fig


def step_breakdown(breakdown: Mapping) -> Figure:
    """Where the busy time went (``summary.json`` ``step_time_breakdown``): one bar per part, largest
    first, labelled with its share of the busy time. ``breakdown`` may also map run labels to
    breakdowns: one bar per run and part, grouped by part."""
    go = graph_objects()
    runs = {"": breakdown} if "seconds" in breakdown else dict(breakdown)
    seconds = {lb: {k: float(v) for k, v in b.get("seconds", {}).items() if v} for lb, b in runs.items()}
    parts = {k for s in seconds.values() for k in s}
    order = sorted(parts, key=lambda k: -max(abs(s.get(k, 0.0)) for s in seconds.values()))
    fig = go.Figure()
    for lb, b in runs.items():
        busy = float(b.get("busy_s") or 0.0)
        s = seconds[lb]
        fig.add_trace(
            go.Bar(
                x=[s.get(k, 0.0) for k in order],
                y=order,
                orientation="h",
                name=lb or "busy time",
                text=[f"{s.get(k, 0.0) / busy:.1%}" if busy > 0 else "" for k in order],
                textposition="auto",
            )
        )
    if len(runs) == 1:
        b = next(iter(runs.values()))
        title = f"Where the busy time went ({float(b.get('busy_s') or 0.0):.4g} s over {b.get('iterations', '?')} iterations)"
    else:
        title = "Where the busy time went, per run (bar labels: share of each run's busy time)"
    fig.update_layout(
        title=title, xaxis_title="seconds (all replicas)", yaxis=dict(autorange="reversed"), barmode="group"
    )
    return fig


def step_shares(table: pa.Table, label_columns: Sequence[str]) -> Figure:
    """A sweep's ``step_share.<part>`` columns (``step_breakdown: true``) as one stacked bar per point,
    labelled by its ``label_columns`` values: the share of its busy time each part took."""
    go = graph_objects()
    title = "Where each point's busy time went (share of its busy time)"
    parts = [c for c in table.column_names if c.startswith("step_share.")]
    fig = go.Figure()
    if not parts or table.num_rows == 0:
        return _empty(fig, title)
    if table.num_rows > MAX_DISTINCT:
        # A bar per point stops being readable long before this: heatmaps of one part say more.
        return _empty(fig, f"{title}: {table.num_rows} points, too many bars (kvsim report --z step_share.<part>)")
    rows = table.to_pylist()
    labels = [", ".join(f"{c.split('.')[-1]}={r.get(c)}" for c in label_columns) or str(r.get("point")) for r in rows]
    for c in sorted(parts, key=lambda c: -sum(float(r.get(c) or 0.0) for r in rows)):
        y = [float(r.get(c) or 0.0) for r in rows]
        if any(y):
            fig.add_trace(go.Bar(x=labels, y=y, name=c.removeprefix("step_share.")))
    fig.update_layout(title=title, barmode="stack", yaxis=dict(title="share of busy time", tickformat=".0%"))
    return fig


def decode_only_mask(timeseries: pa.Table) -> np.ndarray:
    """Rows whose iterations computed one token per running sequence and nothing else."""
    return column(timeseries, "batch_tokens") == column(timeseries, "running")


# --- sweeps ---------------------------------------------------------------------------


def _ok_rows(table: pa.Table) -> pa.Table:
    if "status" in table.column_names:
        import pyarrow.compute as pc

        table = table.filter(pc.equal(table.column("status"), "ok"))
    return table


def _group_mean(keys: list[tuple], values: np.ndarray) -> dict[tuple, float]:
    acc: dict[tuple, list[float]] = {}
    for k, v in zip(keys, values):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        acc.setdefault(k, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in acc.items()}


#: Panels a faceted heatmap may have (one per combination of the axes other than its x and y).
MAX_PANELS = 36


class TooManyValues(ValueError):
    """A chart declined: a column has more distinct values than the chart may draw (one line)."""


def check_distinct(table: pa.Table, columns: dict[str, str], limit: int | None, chart: str) -> None:
    """Raise :class:`TooManyValues` when a column of ``table`` (``{column: its role}``, e.g.
    ``{"workload.a": "x"}``) has more than ``limit`` distinct values (``None``: no limit). Counted
    with Arrow, before any Python list or grid is built."""
    if limit is None:
        return
    import pyarrow.compute as pc

    for col, role in columns.items():
        if col not in table.column_names:
            continue
        n = pc.count_distinct(table.column(col), mode="all").as_py()
        if n > limit:
            raise TooManyValues(
                f"{chart} not drawn: {role} {col!r} has {n:,} distinct values (at most {limit:,}); "
                "filter the dataset or bin that column into fewer values"
            )


def sort_key(v):
    """Order of axis values in charts: numbers first, by value, then everything else by its text."""
    return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, str(v))


def sweep_curves(
    table: pa.Table,
    x: str,
    y: str,
    color: str | None = None,
    by: str | None = None,
    max_distinct: int | None = None,
    with_by: Sequence[str] = (),
    order: Sequence | None = None,
) -> Figure:
    """``y`` against ``x`` over the ok points of a sweep, one line per value of ``color``.

    Points sharing (color, ``by``) — seeds, or axes not shown — are averaged, ``x`` and ``y`` alike,
    and the line is drawn in ``by`` order. ``by`` is the sweep axis that identifies a point apart
    from its seed: ``x`` itself by default; a measured ``x`` (throughput, which differs from seed to
    seed) needs the axis the points were swept over, or each seed would be a point of its own.
    ``by=""``: every point of a line is one (a sweep with no varying axis). ``max_distinct``: raise
    :class:`TooManyValues` instead of drawing more lines than that (one per ``color`` value).
    ``with_by``: columns whose values go with ``by`` (its partners in a sweep's ``zip`` group), named
    on each point's hover text. ``order``: the ``color`` values in the order to draw (default: sorted).
    """
    go = graph_objects()
    t = _ok_rows(table)
    fig = go.Figure()
    by = x if by is None else by
    for c in (x, y) + ((color,) if color else ()) + ((by,) if by else ()):
        if c not in t.column_names:
            raise KeyError(f"column {c!r} not in the sweep table (columns: {', '.join(t.column_names)})")
    if color:
        check_distinct(t, {color: "color"}, max_distinct, "Curves")
    xs = t.column(x).to_pylist()
    bs = t.column(by).to_pylist() if by else [None] * t.num_rows
    cs = t.column(color).to_pylist() if color else ["all"] * t.num_rows
    keys = list(zip(cs, bs))
    ys = np.array([np.nan if v is None else v for v in t.column(y).to_pylist()], dtype=np.float64)
    if by == x:
        xmeans = {k: k[1] for k in keys}
        ymeans = _group_mean(keys, ys)
    else:
        # Both means over the same rows: a seed without a y value does not pull x alone.
        xv = np.array([np.nan if v is None else v for v in xs], dtype=np.float64)
        both = ~(np.isnan(xv) | np.isnan(ys))
        rows = [k for k, ok in zip(keys, both) if ok]
        xmeans = _group_mean(rows, xv[both])
        ymeans = _group_mean(rows, ys[both])
    partners = _values_with(t, by, with_by) if by and with_by else {}

    def hover(b) -> str:
        parts = [f"{by}={b}"] if by and by != x else []
        return ", ".join(parts + ([partners[b]] if b in partners else []))

    colors = set(cs)
    for cval in [c for c in order if c in colors] if order is not None else sorted(colors, key=sort_key):
        pts = sorted(
            ((b, xmeans[(cv, b)], m) for (cv, b), m in ymeans.items() if cv == cval), key=lambda p: sort_key(p[0])
        )
        if not pts:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p[1] for p in pts],
                y=[p[2] for p in pts],
                mode="lines+markers",
                name=f"{color}={cval}" if color else y,
                **({} if by == x and not partners else {"text": [hover(p[0]) for p in pts]}),
            )
        )
    fig.update_layout(
        title=f"{y} vs {x}" + (f" by {color}" if color else ""), xaxis_title=x, yaxis_title=y, legend_title=color or ""
    )
    return fig


def _values_with(t: pa.Table, col: str, others: Sequence[str], short: bool = False) -> dict:
    """Each value of ``col`` → the values ``others`` take with it, as text (``a=1, b=2``; several
    combinations joined by `` / ``). ``short``: only the last part of each dotted name."""
    seen: dict = {}
    cols = [t.column(c).to_pylist() for c in others if c in t.column_names]
    names = [c.rsplit(".", 1)[-1] if short else c for c in others if c in t.column_names]
    for v, *vals in zip(t.column(col).to_pylist(), *cols):
        seen.setdefault(v, {})[", ".join(f"{n}={w}" for n, w in zip(names, vals))] = None
    return {v: " / ".join(texts) for v, texts in seen.items() if any(texts)}


def _combo_key(values: tuple) -> tuple:
    return tuple(sort_key(v) for v in values)


def heatmap(
    table: pa.Table,
    x: str,
    y: str,
    z: str,
    max_distinct: int | None = None,
    facets: Sequence[str] = (),
    x_with: Sequence[str] = (),
    mean_of: str = "points",
    max_panels: int | None = None,
) -> Figure:
    """Mean of ``z`` over the ok points of a sweep on the (``x``, ``y``) grid, one panel per
    combination of the ``facets`` columns (every panel the same ``x`` and ``y`` categories and one
    colour scale). A cell averages the points that share its ``x``, ``y`` and panel: pass every other
    varying axis of the sweep as a facet and only seeds are averaged (``mean_of`` names what a cell
    averages, ``"seeds"`` then). Where a cell averages several points, the title says how many and the
    hover gives each cell's count. ``x_with``: columns that go with ``x`` (its ``zip`` partners),
    named in its category labels. ``max_distinct``: raise :class:`TooManyValues` instead of building
    the grid when ``x`` or ``y`` has more distinct values than that (the grid has ``len(y) ×
    len(x)`` cells); ``max_panels``: the same when the facets have more combinations than that."""
    go = graph_objects()
    t = _ok_rows(table)
    facets = [f for f in facets if f not in (x, y)]
    for c in (x, y, z, *facets, *x_with):
        if c not in t.column_names:
            raise KeyError(f"column {c!r} not in the sweep table (columns: {', '.join(t.column_names)})")
    check_distinct(t, {x: "x", y: "y"}, max_distinct, "Heatmap")
    xs, ys = t.column(x).to_pylist(), t.column(y).to_pylist()
    fs = list(zip(*(t.column(f).to_pylist() for f in facets))) if facets else [()] * t.num_rows
    zs = np.array([np.nan if v is None else v for v in t.column(z).to_pylist()], dtype=np.float64)
    keys = list(zip(fs, xs, ys))
    means = _group_mean(keys, zs)
    counts: dict[tuple, int] = {}
    for k, v in zip(keys, zs):
        if not np.isnan(v):
            counts[k] = counts.get(k, 0) + 1
    xu = sorted(set(xs), key=sort_key)
    yu = sorted(set(ys), key=sort_key)
    xlabel = _values_with(t, x, x_with, short=True) if x_with else {}
    xcats = [f"{v} ({xlabel[v]})" if v in xlabel else str(v) for v in xu]
    combos = sorted(set(fs), key=_combo_key) or [()]  # no ok point: one empty panel
    if max_panels is not None and len(combos) > max_panels:
        raise TooManyValues(
            f"Heatmap not drawn: {len(combos)} combinations of {' × '.join(facets)} would each need a panel "
            f"(at most {max_panels}, so that no cell averages over another axis); choose as x and y the axes "
            "with the most values"
        )
    labels = [", ".join(f"{f}={v}" for f, v in zip(facets, combo)) for combo in combos]
    xname = x + (f" (with {', '.join(x_with)})" if x_with else "")
    n = len(combos)
    ncols = 1 if n == 1 else 2 if n <= 4 else 3
    nrows = -(-n // ncols)
    fig = (
        go.Figure()
        if n == 1
        else _subplots(
            rows=nrows,
            cols=ncols,
            subplot_titles=labels,
            horizontal_spacing=0.08,
            vertical_spacing=min(0.3 / nrows, 0.12),
        )
    )
    for i, (combo, label) in enumerate(zip(combos, labels)):
        grid = [[means.get((combo, xv, yv)) for xv in xu] for yv in yu]
        count = [[counts.get((combo, xv, yv), 0) for xv in xu] for yv in yu]
        where = f"{label}<br>" if label else ""
        trace = go.Heatmap(
            x=xcats,
            y=[str(v) for v in yu],
            z=grid,
            customdata=count,
            coloraxis="coloraxis",
            name=label or None,
            texttemplate="%{z:.3g}",
            hovertemplate=f"{xname}=%{{x}}<br>{y}=%{{y}}<br>{where}{z}=%{{z}}<br>points: %{{customdata}}<extra></extra>",
        )
        if n == 1:
            fig.add_trace(trace)
        else:
            fig.add_trace(trace, row=i // ncols + 1, col=i % ncols + 1)
    title = f"{z} over {x} × {y}"
    if n > 1:
        title += f", one panel per {' × '.join(facets)}"
    elif labels[0]:
        title += f" at {labels[0]}"
    most = max(counts.values(), default=0)
    if most > 1:
        some = "" if min(counts.values()) == most else "up to "
        title += f" (each cell the mean of {some}{most} {mean_of})"
    fig.update_layout(title=title, coloraxis=dict(colorbar=dict(title=z)))
    if n == 1:
        fig.update_layout(xaxis_title=xname, yaxis_title=y)
    else:
        fig.update_layout(height=150 + 330 * nrows)
        for i in range(n):
            fig.update_xaxes(
                title_text=xname if i // ncols == nrows - 1 else None, row=i // ncols + 1, col=i % ncols + 1
            )
            fig.update_yaxes(title_text=y if i % ncols == 0 else None, row=i // ncols + 1, col=i % ncols + 1)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


# --- plans ----------------------------------------------------------------------------


def attainment_vs_rate(plan: dict) -> Figure:
    """SLO attainment against arrival rate for each candidate of a plan, with the target and
    each candidate's goodput marked."""
    go = graph_objects()
    fig = go.Figure()
    cands = plan.get("candidates", [])
    colors = palette(len(cands))
    lines = []
    for i, c in enumerate(cands):
        probes = sorted(c.get("probes", []), key=lambda p: p["rate"])
        if not probes:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p["rate"] for p in probes],
                y=[p["attainment"] for p in probes],
                mode="lines+markers",
                name=c["name"],
                legendgroup=c["name"],
                line=dict(color=colors[i]),
            )
        )
        g = c.get("goodput_rps")
        if g:
            # What add_vline adds, all at once (add_vline re-checks every shape so far: quadratic).
            lines.append(
                dict(
                    type="line",
                    xref="x",
                    yref="y domain",
                    x0=g,
                    x1=g,
                    y0=0,
                    y1=1,
                    line=dict(color=colors[i], dash="dot", width=1),
                )
            )
    fig.update_layout(shapes=lines)
    target = plan.get("attainment_target")
    if target is not None:
        fig.add_hline(y=target, line=dict(color="black", dash="dash"), annotation_text=f"target {target:g}")
    fig.update_layout(
        title="SLO attainment vs arrival rate (dotted: goodput per candidate)",
        xaxis_title="arrival rate (requests/s, per deployment)",
        yaxis_title="SLO attainment",
        xaxis_type="log",
        yaxis_range=[0, 1.02],
    )
    return fig


def latency_throughput(plan: dict) -> Figure:
    """TTFT and TPOT p90 against achieved throughput (requests/s) for each candidate of a plan."""
    go = graph_objects()
    fig = _subplots(rows=1, cols=2, subplot_titles=("TTFT p90 (s)", "TPOT p90 (s)"))
    cands = plan.get("candidates", [])
    colors = palette(len(cands))
    for i, c in enumerate(cands):
        probes = sorted(c.get("probes", []), key=lambda p: p["rate"])
        if not probes:
            continue
        x = [p["throughput_requests_per_s"] for p in probes]
        for j, key in enumerate(("ttft_p90_s", "tpot_p90_s")):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[p.get(key) for p in probes],
                    mode="lines+markers",
                    name=c["name"],
                    legendgroup=c["name"],
                    showlegend=j == 0,
                    line=dict(color=colors[i]),
                ),
                row=1,
                col=j + 1,
            )
    fig.update_xaxes(title_text="throughput (completed requests/s)")
    fig.update_yaxes(type="log")
    fig.update_layout(title="Latency–throughput curves (one point per probed rate)")
    return fig


def palette(n: int) -> list[str]:
    """``n`` line colours (at least one): plotly's ten default colours, repeated."""
    base = [
        "#1f77b4",
        "#ff7f0e",
        "#2ca02c",
        "#d62728",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
        "#bcbd22",
        "#17becf",
    ]
    return [base[i % len(base)] for i in range(max(n, 1))]


def _empty(fig, title: str):
    fig.update_layout(title=title + " (no data)")
    return fig


def plan_kv_memory(plan: dict) -> Figure:
    """KV memory over time at each candidate's operating point (reserved solid, used dotted, GiB)."""
    go = graph_objects()
    fig = go.Figure()
    cands = [c for c in plan.get("candidates", []) if c.get("kv_series")]
    colors = palette(len(cands))
    for i, c in enumerate(cands):
        # Arrays, not lists: plotly checks a list element by element (most of a plan page's CPU).
        s = {k: np.asarray(v, dtype=np.float64) for k, v in c["kv_series"].items()}
        op = c.get("operating_point", {})
        label = f"{c['name']} @ {op.get('rate', 0):.3g} req/s"
        fig.add_trace(
            go.Scatter(
                x=s["t_s"],
                y=s["reserved_gib"],
                mode="lines",
                name=f"{label} reserved",
                legendgroup=c["name"],
                line=dict(color=colors[i], shape="hv"),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=s["t_s"],
                y=s["used_gib"],
                mode="lines",
                name=f"{label} used",
                legendgroup=c["name"],
                line=dict(color=colors[i], dash="dot", shape="hv"),
            )
        )
    if cands and cands[0]["kv_series"]["capacity_gib"]:
        fig.add_hline(
            y=max(cands[0]["kv_series"]["capacity_gib"]),
            line=dict(color="#7f7f7f", dash="dash"),
            annotation_text="KV capacity",
        )
    fig.update_layout(
        title="KV memory at each operating point (solid: reserved, dotted: used)",
        xaxis_title="simulated time (s)",
        yaxis_title="GiB",
    )
    return fig
