"""``kvsim sweep SWEEP.yaml``: the command (registered in :mod:`sim.cli.main`; ``python -m sim.cli.sweep`` runs it alone).

Exit status: 0 every point ok; 1 some points failed (listed, one per line); 2 bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

from sim.errors import ConfigError


def fail(exc: ConfigError) -> NoReturn:
    """One plain ``error: ...`` line on stderr and exit status 2 (as ``sim.cli.main`` does)."""
    sys.stderr.write(f"error: {exc}\n")
    raise typer.Exit(2)


def stdout_console():
    from rich.console import Console

    # Piped output keeps whole cells instead of rich's 80-column default.
    return Console(width=None if sys.stdout.isatty() else 160)


def sweep_command(
    sweep_file: Path = typer.Argument(..., help="Sweep YAML: base scenario, axes (grid/zip), seeds."),
    workers: int | None = typer.Option(None, "--workers", "-w", help="Parallel points (default: CPU cores)."),
    backend: str = typer.Option("local", "--backend", help="local (process pool) or ray."),
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster: the head's host:6379, or ray://host:10001 (Ray Client; default: a local Ray).",
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Dataset directory (default sweeps/<sweep name>)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; print the dataset path only."),
):
    """Run every point of a sweep into one resumable Parquet dataset (points already done are skipped)."""
    from rich.table import Table

    from sim.analysis.sweep import DROPPED_DIR, describe_params, run_sweep

    try:
        res = run_sweep(sweep_file, workers=workers, backend=backend, address=address, out=out, progress=not quiet)
    except ConfigError as exc:
        fail(exc)
    if res.skipped or res.dropped:
        # The dataset holds exactly this file's points: say what an earlier sweep there gave.
        apart = f" ({res.kept_apart} finished, kept in {res.out / DROPPED_DIR}/)" if res.kept_apart else ""
        sys.stderr.write(
            f"{res.out}: reused {res.skipped} finished point(s) of {res.total} ({res.relabelled} rewritten "
            f"with this file's axis values); dropped {res.dropped} point(s) no longer in the sweep file or whose named files changed{apart}\n"
        )
    if quiet:
        print(res.out)
    else:
        t = Table(title=f"sweep {res.name}", show_header=False)
        t.add_column("k")
        t.add_column("v", justify="right")
        for k, v in (
            ("points", res.total),
            ("already in the dataset (skipped)", res.skipped),
            ("simulated now", res.ran),
            ("invalid (recorded failed)", res.invalid),
            ("failed", len(res.failures)),
            ("wall time (s)", f"{res.wall_s:.1f}"),
            *((("SLO", res.slo_text),) if res.slo_text else ()),
        ):
            t.add_row(k, str(v))
        console = stdout_console()
        console.print(t)
        _print_results(console, res)
        console.print(
            f"dataset: {res.out}/ (part-*.parquet, one row per point; read with sim.analysis.sweep.read_dataset, "
            f"a pyarrow Table; kvsim report {res.out} plots it)",
            highlight=False,
        )
    if res.failures:
        sys.stderr.write(f"{len(res.failures)} of {res.total} points failed:\n")
        for f in res.failures:
            sys.stderr.write(f"failed {f['point_id']} ({describe_params(f['params'])}): {f['error']}\n")
        raise typer.Exit(1)


#: Points whose results ``kvsim sweep`` prints.
LIMIT = 40


def _print_results(console, res) -> None:
    """Each point's axis values and headline metrics (the first :data:`LIMIT` points)."""
    from rich.table import Table

    from sim.analysis.sweep import result_rows

    table = res.table()
    head, rows = result_rows(table, res.axes, LIMIT)
    if not rows:
        return
    t = Table(title=f"results (KV waste: reserved but unused; kvsim report {res.out} for plots)")
    for h in head:
        t.add_column(h, justify="left" if h in res.axes else "right")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    if table.num_rows > LIMIT:
        console.print(f"… and {table.num_rows - LIMIT} more points in the dataset", highlight=False)


def _main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(sweep_command)
    app()


if __name__ == "__main__":
    _main()
