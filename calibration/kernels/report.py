"""The calibration's HTML fit report: measured points against the fitted curves, one panel per family."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.catalog import ModelSpec
from sim.cost.profile import Profile
from sim.cost.profile_model import per_gpu_heads

from .. import fit as F
from .measure import Measurements
from .plan import REFERENCE_BLOCK_SIZE


def write_report(path: Path, profile: Profile, meas: Measurements, fits: dict, model: ModelSpec) -> Path | None:
    """Measured points vs fitted curves, one panel per family. None when plotly is missing."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    dtype = profile.provenance.get("compute_dtype", profile.dtypes["weight"][0])
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    fig = make_subplots(
        rows=3,
        cols=2,
        subplot_titles=(
            "GEMMs: time vs tokens m",
            "prefill attention: time vs prompt length (per batch)",
            f"decode attention ({profile.provenance.get('attention_backend', {}).get('name', 'sdpa')}, paged, block 16): "
            "time vs KV length (per batch)",
            "memory ops: time vs bytes",
            "CPU step overhead vs batch",
            "decode: paged / contiguous",
        ),
    )
    colors = [
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
    for i, (key, curve) in enumerate(profile.gemm.items()):
        proj = curve.meta.get("projection", key)
        n, k = (int(x) for x in key.split(":")[0].split("x"))
        rows = meas.select("gemm", kernel=proj)
        c = colors[i % len(colors)]
        fig.add_trace(
            go.Scatter(
                x=[r["m"] for r in rows],
                y=[r["median_s"] for r in rows],
                mode="markers",
                marker={"color": c},
                name=f"{proj} {n}x{k} measured",
                legendgroup=proj,
            ),
            1,
            1,
        )
        mf = np.geomspace(curve.x[0], curve.x[-1], 80)
        fig.add_trace(
            go.Scatter(
                x=mf,
                y=F.predict_gemm(fits["gemm"], dtype, mf, n, k),
                mode="lines",
                line={"color": c},
                name=f"{proj} fit",
                legendgroup=proj,
                showlegend=False,
            ),
            1,
            1,
        )
    for fam, (r_, c_), kernel in (
        ("context_attention", (1, 2), None),
        ("generation_attention", (2, 1), "decode_paged"),
    ):
        sel = meas.select(fam) if kernel is None else meas.select(fam, kernel=kernel, block_size=REFERENCE_BLOCK_SIZE)
        for i, b in enumerate(sorted({r["batch"] for r in sel})):
            rows = sorted([r for r in sel if r["batch"] == b], key=lambda r: r["length"])
            c = colors[i % len(colors)]
            fig.add_trace(
                go.Scatter(
                    x=[r["length"] for r in rows],
                    y=[r["median_s"] for r in rows],
                    mode="markers",
                    marker={"color": c},
                    name=f"{fam.split('_')[0]} b={b}",
                    legendgroup=f"{fam}{b}",
                ),
                r_,
                c_,
            )
            lf = np.geomspace(rows[0]["length"], rows[-1]["length"], 60)
            pred = (
                F.predict_context(fits[fam], dtype, dtype, d, b, lf, h, kvh)
                if fam == "context_attention"
                else F.predict_generation(fits[fam], dtype, d, b, lf, h, kvh)
            )
            fig.add_trace(
                go.Scatter(x=lf, y=pred, mode="lines", line={"color": c}, showlegend=False, legendgroup=f"{fam}{b}"),
                r_,
                c_,
            )
    mem = profile.memory
    for i, (kern, lat, bw) in enumerate(
        (
            ("zero_fill", mem["zero_latency_s"], mem["zero_bandwidth_bytes_per_s"]),
            ("copy", mem["copy_latency_s"], mem["copy_bandwidth_bytes_per_s"]),
        )
    ):
        rows = meas.select("memory", kernel=kern)
        xs = np.array([r["nbytes"] for r in rows], dtype=float)
        c = colors[i]
        fig.add_trace(
            go.Scatter(
                x=xs, y=[r["median_s"] for r in rows], mode="markers", marker={"color": c}, name=f"{kern} measured"
            ),
            2,
            2,
        )
        fig.add_trace(go.Scatter(x=xs, y=lat + xs / bw, mode="lines", line={"color": c}, name=f"{kern} fit"), 2, 2)
    rows = meas.select("cpu_overhead")
    xb = np.array([r["batch"] for r in rows], dtype=float)
    cpu = profile.cpu_overhead["by_tp"]["1"]
    fig.add_trace(go.Scatter(x=xb, y=[r["median_s"] for r in rows], mode="markers", name="CPU step measured"), 3, 1)
    fig.add_trace(
        go.Scatter(x=xb, y=cpu["intercept_s"] + cpu["per_seq_s"] * xb, mode="lines", name="CPU step fit"), 3, 1
    )
    contig = {
        (r["batch"], r["length"]): r["median_s"]
        for r in meas.select("generation_attention", kernel="decode_contiguous")
    }
    for i, bs in enumerate(
        sorted({r["block_size"] for r in meas.select("generation_attention", kernel="decode_paged")})
    ):
        rows = [
            r
            for r in meas.select("generation_attention", kernel="decode_paged", block_size=bs)
            if (r["batch"], r["length"]) in contig
        ]
        fig.add_trace(
            go.Scatter(
                x=[r["batch"] * r["length"] for r in rows],
                y=[r["median_s"] / contig[(r["batch"], r["length"])] for r in rows],
                mode="markers",
                marker={"color": colors[i % len(colors)]},
                name=f"paged/contiguous block {bs}",
            ),
            3,
            2,
        )
    for r_, c_ in ((1, 1), (1, 2), (2, 1), (2, 2), (3, 2)):
        fig.update_xaxes(type="log", row=r_, col=c_)
        if (r_, c_) != (3, 2):
            fig.update_yaxes(type="log", row=r_, col=c_)
    fig.update_yaxes(title_text="seconds")
    q = profile.fit_quality
    sub = ", ".join(
        f"{k} {v['overall']['median_rel_err']:.1%}/{v['overall']['p95_rel_err']:.1%}"
        for k, v in q.items()
        if isinstance(v, dict) and "overall" in v
    )
    att = profile.provenance.get("attention_backend") or {}
    fig.update_layout(
        height=1300,
        title=f"kvsim calibrate: {profile.name} on {profile.device['name']} "
        f"(torch {profile.provenance['device_info']['torch']}; attention "
        f"{att.get('name', 'sdpa')} {att.get('version', '')}); held-out median/p95: {sub}",
    )
    from ..html_report import write_figure_html

    return write_figure_html(fig, path)
