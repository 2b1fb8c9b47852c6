"""cProfile of one run: the top entries by own time and by cumulative time.

cProfile slows Python-heavy code 2–4×, unevenly (many small calls suffer most), so read the
shares, not the absolute seconds; the unprofiled wall time is measured first for scale.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from .common import console, load_avg, table, timed_run, write_json

SCENARIO = "bench-1m"
TOP = 25


def _entries(stats: pstats.Stats, key: str, total: float) -> list[dict]:
    stats.sort_stats(key)
    out = []
    for func in stats.fcn_list[:TOP]:
        cc, nc, tt, ct, _ = stats.stats[func]
        file, line, name = func
        where = f"{Path(file).name}:{line}({name})" if file != "~" else name
        if "site-packages" in file:
            where = f"{file.split('site-packages/')[1]}:{line}({name})"
        out.append(
            {
                "function": where,
                "ncalls": nc,
                "tottime_s": tt,
                "cumtime_s": ct,
                "tottime_share": tt / total if total else 0.0,
                "cumtime_share": ct / total if total else 0.0,
            }
        )
    return out


def run(quick: bool, out: Path, scenario: str = SCENARIO, requests: int | None = None) -> dict:
    n = requests or (10_000 if quick else 100_000)
    over = {"workload.num_requests": n}
    plain = timed_run(scenario, over)
    console.print(f"[dim]profile: {n:,} requests of {scenario}, unprofiled wall {plain['wall_s']:.2f} s; profiling…[/]")
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    sc = load_scenario(scenario, over)
    load0 = load_avg()
    prof = cProfile.Profile()
    prof.enable()
    simulate(sc)
    prof.disable()
    out.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(out / "profile.pstats")
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = stats.total_tt
    by_tottime = _entries(stats, "tottime", total)
    by_cumtime = _entries(stats, "cumulative", total)
    table(
        f"profile: {n:,} requests of {scenario} — top {TOP} by own time (profiled total {total:.1f} s)",
        ["function", "calls", "own s", "own %", "cum s", "cum %"],
        [
            [
                e["function"],
                e["ncalls"],
                e["tottime_s"],
                f"{100 * e['tottime_share']:.1f}",
                e["cumtime_s"],
                f"{100 * e['cumtime_share']:.1f}",
            ]
            for e in by_tottime
        ],
    )
    table(
        "by cumulative time",
        ["function", "calls", "own s", "cum s", "cum %"],
        [
            [e["function"], e["ncalls"], e["tottime_s"], e["cumtime_s"], f"{100 * e['cumtime_share']:.1f}"]
            for e in by_cumtime
        ],
    )
    data = {
        "bench": "profile",
        "quick": quick,
        "scenario": scenario,
        "requests": n,
        "unprofiled_wall_s": plain["wall_s"],
        "unprofiled_cpu_s": plain["cpu_s"],
        "unprofiled_load_avg": plain["load_avg_before"],
        "profiled_total_s": total,
        "load_avg_profiled": load0,
        "summary": {k: plain["summary"][k] for k in ("sim_events", "windows", "iterations", "preemptions")},
        "top_by_tottime": by_tottime,
        "top_by_cumtime": by_cumtime,
        "pstats_file": str(out / "profile.pstats"),
    }
    write_json(out, "profile", data)
    return data
