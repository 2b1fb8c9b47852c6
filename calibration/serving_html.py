"""``serving_validation.html``: simulated against measured TTFT and TPOT per row, coloured by group,
with the flagged groups named in the legend and the clients' timing panel where it was run;
plotly.js embedded, so the page works offline.
"""

from __future__ import annotations

from pathlib import Path

from .serving_tables import largest_pair


def write_html(doc: dict, path: Path) -> Path:
    """Predicted against measured TTFT and TPOT per group (log-log, the diagonal and ±20 % bands),
    each row's TPOT error against its prefill share of wall time with the group's line
    (``tpot_error_split``), and what the group's largest pair of GPU counts buys against
    concurrency, measured and simulated (``tp_scaling``): one colour per group across the four
    panels. With ``client_timing``, a fifth panel: each group's TTFT median |error| as simulated and
    under each other client timing."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    timing = doc.get("client_timing") or {}
    fig = make_subplots(
        rows=3 if timing else 2,
        cols=2,
        specs=[[{}, {}], [{}, {}]] + ([[{"colspan": 2}, None]] if timing else []),
        subplot_titles=(
            "mean TTFT (ms)",
            "mean TPOT (ms)",
            "TPOT error (%) against prefill share",
            "what more GPUs buy: TPOT at the smaller GPU count / at the larger",
            *(["TTFT median |error| (%) with the clients timed otherwise (--client-timing)"] if timing else []),
        ),
    )
    groups = sorted({r["group"] for r in doc["results"]})
    flagged = doc.get("ttft_follows_completions", {})
    fast = doc.get("faster_than_kernels", {})
    fast_runs = doc.get("fast_runs", {})
    split = doc.get("tpot_error_split", {})
    scaling = doc.get("tp_scaling", {})
    held = doc.get("held_back", {})
    apart = doc.get("clients_apart", {})
    spread = doc.get("spread", [])
    cached = doc.get("cached", [])
    share = doc.get("least_cached_share", {})
    roofline = doc.get("roofline_priced", {})
    kv = doc.get("kv_capacity", {})
    kv_set = doc.get("kv_from_runs", {})
    # Groups whose every run started its clients apart (--clients, or the rows' own column).
    started_apart = {
        g for g in groups if all(r.get("start_spread_cycles") for r in doc["results"] if r["group"] == g)
    } - set(spread)
    palette = qualitative.Plotly
    for i, g in enumerate(groups):
        color = palette[i % len(palette)]
        # A group that looks mis-measured says so in the legend.
        notes = (
            ([f"TTFT follows completions at c {'/'.join(map(str, flagged[g]))}"] if g in flagged else [])
            + ([f"simulated with c - 1 running at c {'/'.join(map(str, held[g]))}"] if g in held else [])
            + (["clients not started together"] if g in apart else [])
            + (["simulated with their starts spread"] if g in spread else [])
            + (["clients simulated apart"] if g in started_apart else [])
            + ([f"faster than its kernels: GPU busy {fast[g]:.2f}x"] if g in fast else [])
            + (
                [f"{len(fast_runs[g])} run{'s' if len(fast_runs[g]) > 1 else ''} faster than the kernels"]
                if g in fast_runs
                else []
            )
            + ([f"simulated with {share[g]:.0%} of each prompt cached"] if g in cached and g in share else [])
            + ([f"{roofline[g]} runs priced by the roofline prior"] if g in roofline else [])
            + [
                f"waits for KV from {v['waits_from']:,} tokens at {k[len(g) + 1 :].split()[0]}"
                + (f", simulated with {kv_set[k]:,}" if k in kv_set else "")
                for k, v in kv.items()
                if k.startswith(g + " tp")
            ]
        )
        label = g if not notes else f"{g} ({'; '.join(notes)})"
        rs = [r for r in doc["results"] if r["group"] == g and r["error"] is None]
        text = [
            f"isl {r['isl']} osl {r['osl']} c {r['concurrency']} tp {r['tp']}"
            + (f", GPU busy {r['implied_gpu_busy']:.2f}x" if r.get("implied_gpu_busy") is not None else "")
            for r in rs
        ]
        for col, m in ((1, "ttft_ms"), (2, "tpot_ms")):
            fig.add_trace(
                go.Scatter(
                    x=[r[m] for r in rs],
                    y=[r["sim_" + m] for r in rs],
                    mode="markers",
                    name=label,
                    legendgroup=g,
                    showlegend=col == 1,
                    text=text,
                    marker={"size": 6, "color": color},
                ),
                row=1,
                col=col,
            )
        if g in scaling:
            top, pts = largest_pair(scaling[g])
            for key, dash in (("measured", "solid"), ("simulated", "dash")):
                fig.add_trace(
                    go.Scatter(
                        x=[p["concurrency"] for p in pts],
                        y=[p[key] for p in pts],
                        mode="lines+markers",
                        name=f"{g}: TP {top[0]} to {top[1]}, {key}",
                        legendgroup=g,
                        showlegend=False,
                        text=[f"{p['runs']} length pairs" for p in pts],
                        line={"color": color, "dash": dash, "width": 2},
                    ),
                    row=2,
                    col=2,
                )
        shared = [
            (r, t) for r, t in zip(rs, text) if r.get("prefill_share") is not None and r["tpot_rel_err"] is not None
        ]
        fig.add_trace(
            go.Scatter(
                x=[r["prefill_share"] for r, _ in shared],
                y=[100 * r["tpot_rel_err"] for r, _ in shared],
                mode="markers",
                name=label,
                legendgroup=g,
                showlegend=False,
                text=[t for _, t in shared],
                marker={"size": 5, "color": color},
            ),
            row=2,
            col=1,
        )
        if g in split:
            f = split[g]
            lo, hi = f["prefill_share"]
            fig.add_trace(
                go.Scatter(
                    x=[lo, hi],
                    y=[100 * (f["decode"] + f["per_prefill"] * x) for x in (lo, hi)],
                    mode="lines",
                    name=f"{g}: {f['decode']:+.1%} with no prefill, {f['per_prefill']:+.2f} per prefill share",
                    legendgroup=g,
                    showlegend=False,
                    line={"color": color, "dash": "dash", "width": 2},
                ),
                row=2,
                col=1,
            )
    for col, m in ((1, "ttft_ms"), (2, "tpot_ms")):
        vals = [r[m] for r in doc["results"]] + [r["sim_" + m] for r in doc["results"] if r["sim_" + m]]
        lo, hi = min(vals) * 0.8, max(vals) * 1.25
        for f, dash in ((1.0, "solid"), (1.2, "dot"), (1 / 1.2, "dot")):
            fig.add_trace(
                go.Scatter(
                    x=[lo, hi],
                    y=[lo * f, hi * f],
                    mode="lines",
                    showlegend=False,
                    line={"color": "grey", "dash": dash, "width": 1},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(type="log", title_text="measured", row=1, col=col)
        fig.update_yaxes(type="log", title_text="simulated", row=1, col=col)
    fig.add_hline(y=0, line={"color": "grey", "width": 1}, row=2, col=1)
    fig.update_xaxes(title_text="share of wall time in prefills (measured rate x kvsim's prefill)", row=2, col=1)
    fig.update_yaxes(title_text="(simulated - measured) / measured, %", row=2, col=1)
    fig.add_hline(y=1, line={"color": "grey", "width": 1}, row=2, col=2)
    fig.update_xaxes(type="log", title_text="concurrency (solid: measured, dashed: simulated)", row=2, col=2)
    fig.update_yaxes(title_text="TPOT gain", row=2, col=2)
    if timing:
        _timing_panel(fig, go, doc, timing, row=3)
    o = doc["score"]["overall"]
    n_skipped = len(doc.get("skipped_rows", []))
    left_out = f" ({n_skipped} rows of the file left out: skipped_rows in serving_validation.json)" if n_skipped else ""
    fig.update_layout(
        title=f"kvsim against real servers: {doc['rows']} runs{left_out}, {doc['protocol']}<br>"
        f"TTFT median |err| {o['ttft'].get('median_abs', float('nan')):.1%}, "
        f"TPOT median |err| {o['tpot'].get('median_abs', float('nan')):.1%}",
        height=1700 if timing else 1200,
        width=1500,
    )
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
    return path


def _timing_panel(fig, go, doc: dict, timing: dict, row: int) -> None:
    """Grouped bars: per group and over all rows, TTFT median |error| as simulated and under each
    timing of ``timing`` (:func:`calibration.client_timing.client_timing`)."""
    from .client_timing import median_pct

    groups = sorted(doc["score"]["groups"])
    columns = {"as simulated": doc["score"], **timing}
    for name, v in columns.items():
        ys = [median_pct(v["groups"][g]["ttft"]) for g in groups] + [median_pct(v["overall"]["ttft"])]
        fig.add_trace(
            go.Bar(
                x=[*groups, "all"],
                y=ys,
                name=f"clients {name}",
                legendgroup="client timing",
                text=[None if y is None else f"{y:.0f}" for y in ys],
            ),
            row=row,
            col=1,
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="TTFT median |error|, %", row=row, col=1)
