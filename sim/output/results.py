"""A finished run, and its directory: requests.parquet, timeseries.parquet, summary.json, scenario.yaml."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from sim.config import SCENARIO_DIR, Scenario, file_fields
from sim.inputs import candidate_paths, is_file
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


def write_run(result: RunResult, out: str | Path, run_dir: str | Path | None = None) -> Path:
    """Write the run directory (the Parquet files are already there when the run streamed to ``out``).
    ``run_dir``: the folder the files end up in when ``out`` is a staging folder moved there
    (``kvsim run``); the file paths in ``scenario.yaml`` are written to be read from it
    (:func:`rerunnable_scenario`).

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
    rerun = rerunnable_scenario(result.scenario, Path(run_dir) if run_dir is not None else out)
    replace_file(out / "scenario.yaml", lambda p: p.write_text(rerun.to_yaml()))
    return out


def rerunnable_scenario(sc: Scenario, run_dir: Path) -> Scenario:
    """``sc`` with every file it names by a relative path (a trace, a profile JSON, a model's
    ``config.json``, an engine terms file: the fields :func:`sim.config.file_fields` lists, at any
    depth) named so that ``run_dir/scenario.yaml`` reads the same file from any working directory.

    A rerun resolves a relative path against the file's own folder (the run folder), then
    ``scenarios/``, then the working directory; the path as the scenario gave it was relative to
    the scenario's folder or to the working directory of the run, neither of which the run folder
    remembers. So each such path becomes relative to the run folder where the two share a folder
    below the file system's root, else absolute; ``cost_model.profile``, which is read from the
    working directory only, always becomes absolute. Names of shipped files (a built-in trace or
    profile, a shipped model's id, ``auto``) and absolute paths are kept as they are. ``sc`` itself
    is not changed: the run's summary keeps the paths as given."""
    out = sc.model_copy(deep=True)
    base, run_dir = Path(sc.base_dir), Path(run_dir)
    for _key, section, name, value in _file_values(out, file_fields()):
        new = _rerun_path(name, value, base, run_dir)
        if new != value:
            setattr(section, name, new)
    return out


def user_files(sc: Scenario) -> dict[str, Path]:
    """The files ``sc`` names that are neither shipped nor built in, by dotted key (a list's
    sections by index: ``workload.lengths.components.0.path``), as a run finds them; a name that
    finds no file (a built-in profile, a shipped model's id) is left out. What a run reads from
    them is not in the scenario's values, so a sweep hashes their content into its point ids."""
    base, out = Path(sc.base_dir), {}
    for key, _section, name, value in _file_values(sc, file_fields()):
        p = Path(value).expanduser() if name == "hf_config" else Path(value)
        if name == "profile":
            found = p if is_file(p) else None
        else:
            found = next((c for c in candidate_paths(p, base) if _names_file(name, c)), None)
        if found is None or (not p.is_absolute() and found == SCENARIO_DIR / p):
            continue
        out[key] = found / "config.json" if found.is_dir() else found
    return out


def _file_values(section: BaseModel, names: set[str], prefix: str = ""):
    """``(dotted key, section, field name, value)`` of every string field in ``names`` at any depth."""
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            yield from _file_values(value, names, f"{prefix}{name}.")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, BaseModel):
                    yield from _file_values(v, names, f"{prefix}{name}.{i}.")
        elif name in names and isinstance(value, str):
            yield f"{prefix}{name}", section, name, value


def _rerun_path(field: str, value: str, base: Path, run_dir: Path) -> str:
    """``value`` of the file-naming ``field`` as ``run_dir``'s scenario.yaml should name it."""
    p = Path(value).expanduser() if field == "hf_config" else Path(value)
    if p.is_absolute():
        return value
    if field == "profile":
        # sim.cost.profile.load_profile: a file relative to the working directory, else a built-in name.
        return str(p.resolve()) if is_file(p) else value
    found = next((c for c in candidate_paths(p, base) if _names_file(field, c)), None)
    if found is None or found == SCENARIO_DIR / p:
        return value  # a shipped model's id, or a file shipped under scenarios/: found from anywhere
    target, folder = found.resolve(), run_dir.resolve()
    try:
        shared = os.path.commonpath([target, folder]) != target.anchor
    except ValueError:  # on different drives (Windows): no relative path joins them
        shared = False
    if shared:
        rel = os.path.relpath(target, folder)
        # Checked, not assumed: a symlinked folder on the way makes ``..`` climb elsewhere.
        if (folder / rel).resolve() == target:
            return rel
    return str(target)


def _names_file(field: str, cand: Path) -> bool:
    # model.hf_config may name the folder of a checkpoint (sim.hf_config.resolve_hf_config).
    if field == "hf_config" and cand.is_dir():
        return is_file(cand / "config.json")
    return is_file(cand)
