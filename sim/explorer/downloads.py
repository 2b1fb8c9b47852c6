"""Downloads: result tables as Parquet or CSV bytes, charts as one self-contained HTML page."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
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


def server_dirs(hidden_dirs: Sequence[str | os.PathLike] = ()) -> list[str]:
    """Folders of the server a download must not show, longest first: ``hidden_dirs`` (the
    session's private folder), the built-in scenarios and the folder the ``sim`` package is
    installed in (a checkout's root: a built-in profile ``<root>/sim/profiles/h100-sxm.json``
    becomes ``sim/profiles/h100-sxm.json``), each also as its resolved path."""
    import sim
    from sim.package_data import SCENARIO_DIR

    dirs = [*hidden_dirs, SCENARIO_DIR, Path(sim.__file__).parent.parent]
    out = {str(f).rstrip("/") for d in dirs if d and str(d).strip("/") for f in (Path(d), Path(d).resolve())}
    return sorted(out, key=len, reverse=True)


def hide_server_paths(text: str, hidden_dirs: Sequence[str | os.PathLike] = ()) -> str:
    """``text`` with every path under :func:`server_dirs` made relative to that folder (the folder
    itself becomes ``.``); plain and JSON-escaped spellings alike."""
    import json
    import re

    for d in server_dirs(hidden_dirs):
        for form in dict.fromkeys((d, json.dumps(d)[1:-1])):
            # The folder followed by a separator, or ending the path (not "/srv/data" for "/srv/d").
            text = re.sub(re.escape(form) + r"(?:/|\\/)+", "", text)
            text = re.sub(re.escape(form) + r"(?![\w.@+-])", ".", text)
    return text


def public_table(table: pa.Table, hidden_dirs: Sequence[str | os.PathLike] = ()) -> pa.Table:
    """``table`` with :func:`hide_server_paths` applied to its text columns (a sweep dataset's
    ``cost_model_profile`` names the profile file it ran with)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            values = table.column(i).to_pylist()
            if any(v and "/" in v for v in values):
                new = [None if v is None else hide_server_paths(v, hidden_dirs) for v in values]
                table = table.set_column(i, field, pa.array(new, field.type))
    return table


def summary_download(summary: Mapping[str, Any], hidden_dirs: Sequence[str | os.PathLike] = ()) -> str:
    """``summary.json`` for the page's download: a run's summary names the profile file that priced
    it (``cost_model_profile.path``, an uploaded profile's in the session's private folder), made
    relative as :func:`hide_server_paths` does."""
    import json

    return hide_server_paths(json.dumps(summary, indent=2, sort_keys=True), hidden_dirs)


def plan_download(p: Mapping[str, Any], hidden_dirs: Sequence[str | os.PathLike] = ()) -> str:
    """``plan.json`` for the page's download: the plan ran on a scenario written into the session's
    private folder, a server path that means nothing to the user (and should not be shown), so
    ``scenario_file`` is left out and any other path under ``hidden_dirs`` or the package's folder
    (``assumptions[].profile``) is made relative (:func:`hide_server_paths`)."""
    from sim.analysis.plan_output import plan_json

    out = dict(p)
    out.pop("scenario_file", None)
    return hide_server_paths(plan_json(out), hidden_dirs)
