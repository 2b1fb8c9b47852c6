"""A run directory: requests.parquet, timeseries.parquet, summary.json, scenario.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from .cluster import RunResult


def write_run(result: RunResult, out: str | Path) -> Path:
    """Write the run directory (the Parquet files are already there when the run streamed to ``out``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    streamed = result.out_dir is not None and Path(result.out_dir).resolve() == out.resolve()
    if not streamed:
        pq.write_table(result.requests, out / "requests.parquet")
        pq.write_table(result.timeseries, out / "timeseries.parquet")
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, sort_keys=True) + "\n")
    (out / "scenario.yaml").write_text(result.scenario.to_yaml())
    return out
