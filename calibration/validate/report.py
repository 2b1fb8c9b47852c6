"""A validation's ``validation.html`` (plotly) and the rows of the CLI's table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .replay import Run


def _cdf(x):
    x = np.sort(np.asarray(x, dtype=np.float64))
    return x, (np.arange(1, x.size + 1) / max(x.size, 1))


def write_html(path: Path, runs: list[Run], doc: dict) -> Path | None:
    """Measured vs simulated CDFs (TTFT, TPOT, e2e), KV blocks over time, per-iteration times, host speed."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    titles = []
    for r in runs:
        t = f"{r.load}/{r.allocator}"
        titles += [
            f"{t}: TTFT CDF",
            f"{t}: TPOT CDF",
            f"{t}: e2e CDF",
            f"{t}: KV blocks in use",
            f"{t}: iteration time ({doc['clock']} clock)",
            f"{t}: host speed (cpu_norm probe)",
        ]
    fig = make_subplots(
        rows=len(runs),
        cols=6,
        subplot_titles=titles,
        horizontal_spacing=0.035,
        vertical_spacing=0.3 / max(len(runs), 1),
    )
    sim_c = "#d62728"
    colors = {"cpu_norm": "#9467bd", "cpu": "#1f77b4", "wall": "#17becf"}
    for i, r in enumerate(runs, start=1):
        first = next(iter(r.sim))
        sim_r = r.sim[first]
        req = sim_r.requests
        okm = np.asarray(req["status"].to_pylist()) == "completed"
        a, f, e, g = (req[c].to_numpy()[okm] for c in ("arrival_s", "first_token_s", "finish_s", "generated_tokens"))
        s_vals = [f - a, ((e - f)[g > 1] / (g[g > 1] - 1)), e - a]
        for c, res in r.engine.items():
            for k, rr in enumerate([res] + list(r.engine_more.get(c, []))):
                ok = [q for q in rr.requests if q["status"] == "completed"]
                m_vals = (
                    [q["first_token_s"] - q["arrival_s"] for q in ok],
                    [
                        (q["finish_s"] - q["first_token_s"]) / (q["generated_tokens"] - 1)
                        for q in ok
                        if q["generated_tokens"] > 1
                    ],
                    [q["finish_s"] - q["arrival_s"] for q in ok],
                )
                for j, mv in enumerate(m_vals, start=1):
                    x, y = _cdf(mv)
                    # further replays of the same trace: thinner, so the run-to-run spread shows
                    fig.add_trace(
                        go.Scatter(
                            x=x,
                            y=y,
                            mode="lines",
                            line={"color": colors.get(c, "#1f77b4"), "width": 2 if k == 0 else 1},
                            opacity=1.0 if k == 0 else 0.5,
                            name=f"measured (engine, {c} clock)"
                            + (" replay 1" if k == 0 and c in r.engine_more else ""),
                            legendgroup=c,
                            showlegend=(i == 1 and j == 1 and k == 0),
                        ),
                        i,
                        j,
                    )
            its = res.iterations
            fig.add_trace(
                go.Scatter(
                    x=[it["end_s"] for it in its],
                    y=[it["blocks_in_use"] for it in its],
                    mode="lines",
                    line={"color": colors.get(c, "#1f77b4"), "shape": "hv"},
                    showlegend=False,
                ),
                i,
                4,
            )
        for j, sv in enumerate(s_vals, start=1):
            x, y = _cdf(sv)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line={"color": sim_c, "dash": "dash"},
                    name="simulated",
                    legendgroup="s",
                    showlegend=(i == 1 and j == 1),
                ),
                i,
                j,
            )
            fig.update_xaxes(title_text="s", row=i, col=j)
        ts = sim_r.timeseries
        bpt = sim_r.summary["kv_bytes_per_token"]
        B = int(doc["config"]["kv"]["block_size"])
        fig.add_trace(
            go.Scatter(
                x=ts["t_s"].to_numpy(),
                y=ts["kv_reserved_bytes"].to_numpy() / bpt / B,
                mode="lines",
                line={"color": sim_c, "dash": "dash", "shape": "hv"},
                showlegend=False,
            ),
            i,
            4,
        )
        rows = r.diagnostics[next(iter(r.diagnostics))]["rows"]
        fig.add_trace(
            go.Scatter(
                x=[q["predicted_s"] * 1e3 for q in rows],
                y=[q["measured_s"] * 1e3 for q in rows],
                mode="markers",
                marker={"size": 3, "color": ["#2ca02c" if q["pure_decode"] else "#ff7f0e" for q in rows]},
                showlegend=False,
                text=[f"seqs {q['seqs']} tokens {q['tokens']}" for q in rows],
            ),
            i,
            5,
        )
        hi = max([q["measured_s"] * 1e3 for q in rows] + [1.0])
        fig.add_trace(
            go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line={"color": "#999", "dash": "dot"}, showlegend=False),
            i,
            5,
        )
        sp = r.diagnostics.get("cpu_norm", {}).get("speed_probes", {}).get("series", [])
        if sp:
            fig.add_trace(
                go.Scatter(
                    x=[q[0] for q in sp],
                    y=[q[3] for q in sp],
                    mode="lines",
                    line={"color": colors["cpu_norm"], "shape": "hv"},
                    showlegend=False,
                    text=[f"probe {q[2] * 1e3:.2f} ms" for q in sp],
                ),
                i,
                6,
            )
            fig.update_xaxes(title_text="engine t (s)", row=i, col=6)
            fig.update_yaxes(title_text="reference / probe", row=i, col=6)
        fig.update_xaxes(title_text="t (s)", row=i, col=4)
        fig.update_xaxes(title_text="predicted ms (green: pure decode)", row=i, col=5)
        fig.update_yaxes(title_text="measured ms", row=i, col=5)
    errs = {(row["load"], row["allocator"], row["metric"]): row["rel_error"] for row in doc["rows"]}
    p50 = [v for (l_, a_, m), v in errs.items() if m in ("tpot_p50", "e2e_p50", "ttft_p50") and v is not None]
    fig.update_layout(
        height=330 * len(runs),
        width=2200,
        title=f"kvsim validate: {doc['name']} on {doc['device']['cpu'] if doc['device']['kind'] == 'cpu' else doc['device']['kind']}"
        f" ({doc['shape']['model']}, {doc['device']['dtype']}); profile {doc['profile']['name']}; "
        f"max |rel error| of p50 TTFT/TPOT/e2e: {max(p50) if p50 else float('nan'):.1%}",
    )
    from ..html_report import write_figure_html

    return write_figure_html(fig, path)


def format_table(doc: dict) -> list[list[str]]:
    """Rows for the CLI: load, allocator, metric, measured, simulated, rel error (and, with replays,
    the replay spread: (max − min) ÷ median of the engine's replays; then, where the run has it, the
    cell's sensitivity to step time, :func:`cell_sensitivity`)."""
    out = []
    sens = any("sensitivity" in r for r in doc["rows"])
    for r in doc["rows"]:

        def f(v):
            return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

        row = [
            r["load"],
            r["allocator"],
            r["metric"],
            f(r["measured"]),
            f(r["simulated"]),
            "-" if r["rel_error"] is None else f"{r['rel_error']:.1%}",
        ]
        if "replay_spread" in r:
            sp = r["replay_spread"]
            row.append("-" if sp is None else f"{sp:.1%}")
        if sens:
            row.append("-" if r.get("sensitivity") is None else f"{r['sensitivity']:.1f}")
        out.append(row)
    return out
