"""HTML files of calibration and validation: one plotly figure per page, plotly.js embedded.

GPU hosts that calibrate are often offline, so a page must not load plotly.js from a CDN: it would
render blank there. The library is inlined (about 4.7 MB per page), as ``sim.analysis.report`` does for run
and sweep reports.
"""

from __future__ import annotations

from pathlib import Path


def write_figure_html(fig, path: Path | str) -> Path:
    """Write ``fig`` as a self-contained HTML page (plotly.js inlined); returns the path."""
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    return path
