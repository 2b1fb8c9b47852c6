"""A run directory: requests.parquet, timeseries.parquet, summary.json, scenario.yaml."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from .cluster import RunResult


def replace_file(path: Path, write) -> None:
    """``write(tmp)`` to a hidden temporary name beside ``path``, then rename it over ``path``: readers
    never see a half-written file, an interrupted write leaves the old one, and a symlink at
    ``path`` is replaced rather than written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_run(result: RunResult, out: str | Path) -> Path:
    """Write the run directory (the Parquet files are already there when the run streamed to ``out``).

    Every file is written under a temporary name and renamed into place."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    streamed = result.out_dir is not None and Path(result.out_dir).resolve() == out.resolve()
    if not streamed:
        replace_file(out / "requests.parquet", lambda p: pq.write_table(result.requests, p))
        replace_file(out / "timeseries.parquet", lambda p: pq.write_table(result.timeseries, p))
    summary = json.dumps(result.summary, indent=2, sort_keys=True) + "\n"
    replace_file(out / "summary.json", lambda p: p.write_text(summary))
    replace_file(out / "scenario.yaml", lambda p: p.write_text(result.scenario.to_yaml()))
    return out
