"""A finished run, and its directory: requests.parquet, timeseries.parquet, summary.json, scenario.yaml."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sim.config import Scenario
from sim.output.metrics import Recorder


class RunResult:
    """A finished run. ``requests``/``timeseries`` are read from ``out_dir`` on first use when the
    run streamed them there, so a million-request run never holds them in memory unasked."""

    def __init__(self, scenario: Scenario, summary: dict, rec: Recorder, out_dir: Path | None, run_info: dict):
        self.scenario = scenario
        self.summary = summary
        self.out_dir = out_dir
        #: Wall-clock facts about the run itself (not part of the deterministic summary).
        self.run_info = run_info
        self._rec = rec
        self._requests: pa.Table | None = None
        self._timeseries: pa.Table | None = None

    @property
    def requests(self) -> pa.Table:
        if self._requests is None:
            self._requests = self._rec.requests_table()
        return self._requests

    @property
    def timeseries(self) -> pa.Table:
        if self._timeseries is None:
            self._timeseries = self._rec.timeseries_table()
        return self._timeseries


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

    ``summary.json`` holds the full ``cost_model_profile`` block (:mod:`sim.output.provenance`: built-in
    or file, path, name, device, date, method, content hash) that the run took from the cost model
    that priced it (the profile file is not read again); an older summary's block is completed from
    what it says, also on ``result.summary``.

    Every file is written under a temporary name and renamed into place."""
    from sim.output.provenance import with_cost_profile

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    streamed = result.out_dir is not None and Path(result.out_dir).resolve() == out.resolve()
    if not streamed:
        replace_file(out / "requests.parquet", lambda p: pq.write_table(result.requests, p))
        replace_file(out / "timeseries.parquet", lambda p: pq.write_table(result.timeseries, p))
    result.summary = with_cost_profile(result.summary, result.scenario)
    summary = json.dumps(result.summary, indent=2, sort_keys=True) + "\n"
    replace_file(out / "summary.json", lambda p: p.write_text(summary))
    replace_file(out / "scenario.yaml", lambda p: p.write_text(result.scenario.to_yaml()))
    return out
