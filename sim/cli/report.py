"""``kvsim report RUN_DIR|SWEEP_DIR``: the command (registered in :mod:`sim.cli.main`; ``python -m sim.cli.report`` runs it alone)."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.sweep import fail
from sim.errors import ConfigError


def report_command(
    path: Path = typer.Argument(..., help="A run directory (kvsim run --out) or a sweep dataset (kvsim sweep --out)."),
    png: bool = typer.Option(False, "--png", help="Also write one PNG per figure (kaleido; needs Chromium/Chrome)."),
    x: str | None = typer.Option(
        None, "--x", help="Sweep: axis for curves and heatmap columns (default: the rate axis)."
    ),
    y: str | None = typer.Option(
        None,
        "--y",
        help="Sweep: axis for heatmap rows (default: the next varying axis); other varying axes get a panel each.",
    ),
    z: list[str] | None = typer.Option(
        None, "--z", help="Sweep: heatmap metric (repeatable; default TTFT/TPOT p90, throughput, KV utilization)."
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Output directory (default: PATH itself)."),
):
    """Write a self-contained plotly report.html (plotly.js inlined) for a run or a sweep."""
    try:
        from sim.analysis.report import report
    except ImportError as exc:  # plotly is an optional extra
        fail(ConfigError("report", str(path), f"plotly installed: pip install 'kvsim[report]' ({exc})"))
    try:
        written = report(path, png=png, x=x, y=y, z=z or None, out=out)
    except ConfigError as exc:
        fail(exc)
    except ImportError as exc:
        fail(ConfigError("report", str(path), f"plotly installed: pip install 'kvsim[report]' ({exc})"))
    print(written)


def _main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(report_command)
    app()


if __name__ == "__main__":
    _main()
