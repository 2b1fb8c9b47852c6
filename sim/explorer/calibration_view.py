"""The Calibration tab: provenance and fit quality per profile (:func:`profile_rows`), and a profile's
fitted curve against the measured table points it came from (:func:`calibration_figure`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def preferred_curve(family: str) -> str:
    """A representative measured curve to show first (Llama-3.1-8B-sized shapes)."""
    return {
        "gemm": "4096x4096:bf16",
        "generation_attention": "32/8/128:bf16",
        "context_attention": "32/8/128:bf16",
        "allreduce": "2",
    }.get(family, "")


def default_curve(profile, family: str) -> str | None:
    """The preferred curve when the profile has it measured, else its first measured one, else the first."""
    keys = profile.curve_keys(family)
    if not keys:
        return None
    measured = [k for k in keys if profile.curve(family, k).meta.get("measured_shape", True)]
    pref = preferred_curve(family)
    if pref in measured:
        return pref
    return measured[0] if measured else keys[0]


def profile_rows(names: list[str] | None = None, loader=None) -> list[dict[str, Any]]:
    """Provenance and held-out fit quality of each profile (built-ins by default)."""
    from sim.cost.profile import list_profiles, load_profile

    loader = loader or load_profile
    rows = []
    for name in names if names is not None else list_profiles():
        p = loader(name)
        prov, fq = p.provenance, p.fit_quality
        row = {
            "profile": name,
            "device": prov.get("device") or p.device.get("name"),
            "backend": prov.get("backend", ""),
        }
        for fam in ("gemm", "context_attention", "generation_attention"):
            fam_q = fq.get(fam) if isinstance(fq, dict) else None
            o = fam_q.get("overall") if isinstance(fam_q, dict) else None
            o = o if isinstance(o, dict) else {}
            med, p95 = o.get("median_rel_err"), o.get("p95_rel_err")
            # A profile written by hand may carry anything here: show what is a number, "–" otherwise.
            row[f"{fam} median / p95 err"] = f"{med:.1%} / {p95:.1%}" if _is_number(med) and _is_number(p95) else "–"
        row.update({"date": prov.get("date", ""), "source": prov.get("source", "")})
        rows.append(row)
    return rows


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


CURVE_FAMILIES = ("gemm", "generation_attention", "context_attention", "allreduce")


def curve_keys(profile, family: str) -> list[str]:
    return profile.curve_keys(family)


def _source_table(profile, needle: str) -> Path | None:
    try:
        from calibration.tables import DEFAULT_TABLES_DIR
    except ImportError:
        return None
    for rel in profile.provenance.get("source_tables", []):
        if needle in rel:
            p = (DEFAULT_TABLES_DIR / rel).resolve()
            if p.is_file() and DEFAULT_TABLES_DIR.resolve() in p.parents:
                return p
    return None


def measured_points(profile, family: str, key: str) -> dict | None:
    """Measured rows behind one curve of a built-in profile, from the repository's kernel tables
    (``None`` when the table is not shipped or the shape was not measured)."""
    import numpy as np

    try:
        from calibration import tables as T
    except ImportError:
        return None
    if family == "gemm":
        path = _source_table(profile, "gemm_perf")
        if path is None:
            return None
        shape, dtype = key.split(":")
        n, k = (int(x) for x in shape.split("x"))
        curve = profile.curve("gemm", key)
        table_dtype = curve.meta.get("table_dtype", dtype)
        t = T.read_gemm(path)
        sel = (t.n == n) & (t.k == k) & (t.dtype == table_dtype)
        if not sel.any():
            return None
        order = np.argsort(t.m[sel])
        return {"x": t.m[sel][order], "t_s": t.latency_s[sel][order]}
    if family in ("generation_attention", "context_attention"):
        kind = "generation" if family.startswith("generation") else "context"
        path = _source_table(profile, f"{kind}_attention_perf")
        if path is None:
            return None
        shape, kv_dtype = key.split(":")
        h, kvh, d = (int(x) for x in shape.split("/"))
        at = T.read_attention(path, kind)
        sel = (at.heads == h) & (at.kv_heads == kvh) & (at.head_dim == d) & (at.kv_dtype == kv_dtype)
        if kind == "context":
            sel &= at.attn_dtype == kv_dtype if (at.attn_dtype == kv_dtype).any() else sel
        if not sel.any():
            return None
        return {"batch": at.batch[sel], "length": at.length[sel], "t_s": at.latency_s[sel]}
    if family == "allreduce":
        path = _source_table(profile, "nccl_perf")
        if path is None:
            return None
        nt = T.read_nccl(path)
        sel = nt.num_gpus == int(key)
        if not sel.any():
            return None
        return {"x": nt.nbytes[sel], "t_s": nt.latency_s[sel]}
    return None


def calibration_figure(profile, family: str, key: str, max_batches: int = 6):
    """Measured points (markers) against the profile's fitted curve (lines), log-log."""
    import numpy as np
    import plotly.graph_objects as go

    from sim.analysis.plots import palette

    fig = go.Figure()
    pts = measured_points(profile, family, key)
    curve = profile.curve(family, key)
    if family in ("gemm", "allreduce"):
        xlab = "tokens (m)" if family == "gemm" else "message bytes"
        fig.add_trace(go.Scatter(x=curve.x, y=curve.t_s * 1e6, mode="lines", name="profile curve"))
        if pts is not None:
            fig.add_trace(
                go.Scatter(
                    x=pts["x"],
                    y=pts["t_s"] * 1e6,
                    mode="markers",
                    name="measured",
                    marker=dict(size=6, symbol="circle-open"),
                )
            )
    else:
        xlab = "KV tokens per sequence" if family.startswith("generation") else "prompt length (tokens)"
        idx = np.unique(np.linspace(0, len(curve.batch) - 1, min(max_batches, len(curve.batch))).round().astype(int))
        colors = palette(len(idx))
        for c, i in zip(colors, idx):
            b = curve.batch[i]
            fig.add_trace(
                go.Scatter(
                    x=curve.length,
                    y=curve.t_s[i] * 1e6,
                    mode="lines",
                    name=f"batch {b:g} curve",
                    line=dict(color=c),
                    legendgroup=str(b),
                )
            )
            if pts is not None:
                sel = pts["batch"] == b
                if sel.any():
                    o = np.argsort(pts["length"][sel])
                    fig.add_trace(
                        go.Scatter(
                            x=pts["length"][sel][o],
                            y=pts["t_s"][sel][o] * 1e6,
                            mode="markers",
                            name=f"batch {b:g} measured",
                            legendgroup=str(b),
                            marker=dict(color=c, size=6, symbol="circle-open"),
                        )
                    )
    note = "" if pts is not None else " (no measured table for this shape: curve only)"
    fig.update_layout(
        title=f"{profile.name}: {family} {key}{note}",
        xaxis_title=xlab,
        yaxis_title="time (µs)",
        xaxis_type="log",
        yaxis_type="log",
    )
    return fig, pts is not None
