"""The scenarios, traces and profiles that ship with kvsim, as the page lists them (a scenario may name
only these and what its session uploaded, :mod:`sim.explorer.uploads`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sim.config import SCENARIO_DIR, list_scenarios, read_scenario_dict, scenario_from_dict
from sim.errors import ConfigError

TRACE_EXTENSIONS = (".csv", ".jsonl", ".parquet")


def builtin_traces() -> dict[str, Path]:
    """Trace files shipped under ``scenarios/``, keyed by their path relative to it (``traces/x.csv``)."""
    out = {}
    for p in sorted(SCENARIO_DIR.rglob("*")):
        if p.is_file() and p.suffix.lower() in TRACE_EXTENSIONS:
            out[p.relative_to(SCENARIO_DIR).as_posix()] = p
    return out


@lru_cache(maxsize=64)
def _has_arrivals(path: str, mtime: float) -> bool:
    from sim.workload.traces import read_trace

    try:
        return read_trace(Path(path), "auto").arrival_s is not None
    except ConfigError:
        return False


def builtin_arrival_traces() -> list[str]:
    """The built-in traces with arrival times (``workload.arrival.kind: trace`` needs them; the
    length-statistics files have none), as uploaded traces are filtered by ``has_arrivals``."""
    return [name for name, p in builtin_traces().items() if _has_arrivals(str(p), p.stat().st_mtime)]


def builtin_profiles() -> list[str]:
    try:
        from sim.cost.profile import list_profiles
    except ImportError:  # pragma: no cover - profile module absent in an old tree
        return []
    return list_profiles()


def builtin_scenarios() -> list[str]:
    """Names of the YAML files under ``scenarios/`` that are simulator scenarios (other specs
    kept there, such as ``kvsim validate`` files, are left out)."""
    names = []
    for name in list_scenarios():
        try:
            data, _ = read_scenario_dict(SCENARIO_DIR / f"{name}.yaml")
            scenario_from_dict(data)
        except ConfigError:
            continue
        names.append(name)
    return names


def builtin_scenario(name: str) -> dict:
    """Raw YAML mapping of a built-in scenario (only names from :func:`builtin_scenarios`)."""
    if name not in builtin_scenarios():
        raise ConfigError("scenario", name, f"a built-in scenario ({', '.join(builtin_scenarios())})")
    data, _ = read_scenario_dict(SCENARIO_DIR / f"{name}.yaml")
    return data
