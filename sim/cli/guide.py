"""``kvsim guide``: simulate every situation of the seed article and write the decision guide."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from sim.analysis.guide import DEFAULT_OUT, SituationResult, write_guide


def guide_command(
    out: Path = typer.Option(DEFAULT_OUT, "--out", "-o", help="Markdown file to write."),
    num_requests: int | None = typer.Option(
        None, "--num-requests", "-n", min=1, help="Override workload.num_requests of every scenario (quicker, noisier)."
    ),
):
    """Simulate every situation of the seed article and write the decision guide (docs/decision-guide.md)."""
    t0 = time.perf_counter()

    def progress(key: str, r: SituationResult) -> None:
        verdicts = ", ".join(cr.verdict for _, cr in r.claims) or (f"skipped: {r.skipped}" if r.skipped else "-")
        sys.stderr.write(f"{key}: {r.wall_s:.1f} s — {verdicts}\n")

    if isinstance(out, typer.models.OptionInfo):  # called as a plain function
        out = DEFAULT_OUT
    if isinstance(num_requests, typer.models.OptionInfo):
        num_requests = None
    from sim.output.staging import out_file

    out = out_file(out)
    path, _ = write_guide(out, num_requests, progress)
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
