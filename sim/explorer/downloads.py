"""Downloads: result tables as Parquet or CSV bytes, charts as one self-contained HTML page."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import pyarrow as pa


def table_bytes(table: pa.Table, fmt: str) -> bytes:
    """A result table as Parquet or CSV bytes."""
    buf = io.BytesIO()
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, buf)
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, buf)
    else:
        raise ValueError(fmt)
    return buf.getvalue()


def figures_html(figs: Mapping[str, Any], title: str = "kvsim charts") -> str:
    """One self-contained HTML page with every figure (plotly.js inlined once: works offline)."""
    parts = []
    for i, (name, fig) in enumerate(figs.items()):
        parts.append(f"<h2>{_html_escape(name)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_html_escape(title)}</title></head>"
        f"<body><h1>{_html_escape(title)}</h1>{''.join(parts)}</body></html>"
    )


def _html_escape(s: str) -> str:
    import html

    return html.escape(str(s))


def plan_download(p: Mapping[str, Any], hidden_dirs: tuple = ()) -> str:
    """``plan.json`` for the page's download: the plan ran on a scenario written into the session's
    private folder, a server path that means nothing to the user (and should not be shown), so
    ``scenario_file`` is left out and any other path under ``hidden_dirs`` is made relative."""
    import json

    from sim.analysis.planner import plan_json

    out = dict(p)
    out.pop("scenario_file", None)
    text = plan_json(out)
    for d in hidden_dirs:
        if not d:
            continue
        # Paths sit inside JSON strings: replace their JSON-escaped spelling.
        prefix = json.dumps(str(d).rstrip("/") + "/")[1:-1]
        text = text.replace(prefix, "")
    return text
