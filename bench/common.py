"""Shared pieces: timing a run, the machine's state, JSON output, tables."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
# Wide tables when piped (rich would wrap them at 80 columns).
console = Console(width=None if sys.stdout.isatty() else 180)


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict:
    import numpy
    import simpy

    import sim

    return {
        "native": sim.NATIVE_STATE,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "simpy": simpy.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_start": load_avg(),
        "kvsim_debug": bool(os.environ.get("KVSIM_DEBUG")),
    }


def warn_debug() -> None:
    if os.environ.get("KVSIM_DEBUG"):
        console.print("[yellow]KVSIM_DEBUG is set: engine self-checks slow every run; unset it to benchmark[/]")


def timed_run(
    scenario: str, overrides: dict | None = None, out_dir: Path | None = None, step_breakdown: bool = False
) -> dict:
    """Simulate a scenario in this process: its summary, wall and CPU seconds, load average around it
    (``step_breakdown``: split its iteration time too, :mod:`sim.cost.breakdown`)."""
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    sc = load_scenario(scenario, dict(overrides or {}))
    load0 = load_avg()
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc, out_dir=out_dir, step_breakdown=step_breakdown)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {
        "scenario": scenario,
        "overrides": dict(overrides or {}),
        "wall_s": wall,
        "cpu_s": cpu,
        "load_avg_before": load0,
        "load_avg_after": load_avg(),
        "summary": res.summary,
        "result": res,
    }


def child_run(scenario: str, overrides: dict, timeout_s: float | None = None, interpreted: bool = False) -> dict:
    """Simulate in a fresh interpreter (``python -m bench.child``) and return what it measured,
    peak RSS included; the parent's RUSAGE_CHILDREN maximum is added as a cross-check.
    ``interpreted``: the plain sources, even where a compiled build exists (``KVSIM_NATIVE=0``)."""
    cmd = [sys.executable, "-m", "bench.child", scenario, json.dumps(overrides)]
    env = {k: v for k, v in os.environ.items() if k != "KVSIM_DEBUG"}
    if interpreted:
        env["KVSIM_NATIVE"] = "0"
    w0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"bench.child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = time.perf_counter() - w0
    out["children_maxrss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return out


def rel_diff(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    a, b = float(a), float(b)
    den = max(abs(a), abs(b))
    return 0.0 if den == 0 else abs(a - b) / den


def write_json(out: Path, name: str, data: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path


def table(title: str, columns: list[str], rows: list[list]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="left" if c == columns[0] else "right")
    for r in rows:
        t.add_row(*[_fmt(x) for x in r])
    console.print(t)


def _fmt(x) -> str:
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        if abs(x) >= 1e-3:
            return f"{x:.4f}"
        return f"{x:.2e}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)
