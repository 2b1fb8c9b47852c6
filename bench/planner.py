"""planner: the guided goodput search against the exhaustive one, on the plannable built-in scenarios.

For each scenario (Poisson or gamma arrivals; ``bench-1m`` left out: a million requests per run)
both searches plan every candidate under the scenario's SLO from its guide situation
(``scenarios/guide/``), interleaved so both see the same machine load. Reported: median wall and
CPU seconds of each search over the repeats (with the load average before each), simulations and
simulated requests, whether the recommendations and GPU counts are the same, and the largest
relative difference between a candidate's goodputs (same answer: below the search tolerance).

    python -m bench planner --quick    # chat-api at 40 req/s and three more scenarios at their own size, 3 repeats
    python -m bench planner            # every scenario at its own size, once (tens of minutes on 2 cores)

The ``--quick`` table is the one in docs/sweeps.md: about 1.5 minutes with the compiled engine on an
idle 2-core machine, 6 minutes interpreted (``KVSIM_NATIVE=0``) at load 1-5. A line on stderr per
scenario, per finished candidate and per finished plan shows where a run is.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .common import load_avg, table, write_json

#: Scenario → (SLO as ``--slo`` items, target rate or None). SLOs from the guide situations.
SCENARIOS: dict[str, tuple[list[str], float | None]] = {
    "chat-api": (["ttft_p90_s=0.5", "tpot_p90_s=0.05"], 40.0),
    "batch-offline": (["e2e_s=300"], None),
    "encoder-decoder": (["ttft_s=2", "tpot_s=0.1"], None),
    "high-throughput-burst": (["ttft_s=0.5", "tpot_s=0.05"], None),
    "peak-vs-average": (["ttft_s=0.5", "tpot_s=0.03"], None),
    "small-batch": (["ttft_s=1", "tpot_s=0.02"], None),
    "streaming-chatbot": (["ttft_s=0.2", "tpot_s=0.015"], None),
    "variable-length-batch": (["ttft_s=2", "tpot_s=0.1"], None),
    "worst-case-outliers": (["ttft_s=1", "tpot_s=0.05"], None),
    "bench-saturated": (["ttft_s=10", "tpot_s=0.2"], None),
}
QUICK = ("chat-api", "peak-vs-average", "small-batch", "streaming-chatbot")
QUICK_REPEATS = 3


def compare(
    scenario: str,
    slo_items: list[str],
    overrides: dict | None = None,
    target_rate: float | None = None,
    workers: int | None = None,
    allocators: list[str] | None = None,
    repeats: int = 1,
    start_method: str | None = None,
    quiet: bool = False,
) -> dict:
    """Plan ``scenario`` with both searches (exhaustive first, then guided, ``repeats`` times
    interleaved) and compare their answers. ``start_method="fork"``: workers forked from this
    process, as ``kvsim plan`` starts them (only for a caller that holds no threads). Unless
    ``quiet``, one line on stderr per finished candidate and per finished plan, so a slow run can be
    told from a hung one."""
    from sim.analysis.planner import plan
    from sim.analysis.slo import parse_slos

    slo = parse_slos(slo_items)
    runs: dict[str, list[dict]] = {"exhaustive": [], "guided": []}
    plans: dict[str, dict] = {}
    for rep in range(repeats):
        for search in ("exhaustive", "guided"):
            load = load_avg()[0]
            t0 = time.perf_counter()
            what = f"{scenario} {search}" + (f" {rep + 1}/{repeats}" if repeats > 1 else "")

            def progress(done: int, total: int, name: str, what: str = what, t0: float = t0) -> None:
                _say(f"{what}: candidate {done}/{total} ({name}) done, {time.perf_counter() - t0:.0f} s")

            p = plan(
                scenario,
                slo,
                overrides=overrides,
                allocators=allocators,
                target_rate=target_rate,
                workers=workers,
                search=search,
                start_method=start_method,
                progress=None if quiet else progress,
            )
            if not quiet:
                _say(f"{what}: planned in {time.perf_counter() - t0:.1f} s")
            runs[search].append(
                {
                    "wall_s": time.perf_counter() - t0,
                    "cpu_s": p["cpu_s"],
                    "load": load,
                    "simulations": p["simulations"],
                    "simulated_requests": p["simulated_requests"],
                }
            )
            plans[search] = p
    ex, gu = plans["exhaustive"], plans["guided"]
    tol = ex["tolerance"]
    by_ex = {c["name"]: c for c in ex["candidates"]}
    cands = []
    for c in gu["candidates"]:
        e = by_ex.get(c["name"])
        if e is None:
            continue
        ge, gg = e.get("goodput_rps", 0.0), c.get("goodput_rps", 0.0)
        ratio = gg / ge if ge > 0 else (1.0 if gg == 0 else float("inf"))
        cands.append(
            {
                "name": c["name"],
                "exhaustive_rps": ge,
                "guided_rps": gg,
                "ratio": ratio,
                "exhaustive_edge_rps": e.get("goodput_est_rps"),
                "guided_edge_rps": c.get("goodput_est_rps"),
                "status": [e["status"], c["status"]],
                "search_status": [e.get("search_status"), c.get("search_status")],
                "gpus": [e.get("gpus_needed"), c.get("gpus_needed")],
                "within_tolerance": 1 / (1 + tol) < ratio < 1 + tol if ge > 0 and gg > 0 else ge == gg,
            }
        )
    return {
        "scenario": scenario,
        "slo": slo_items,
        "overrides": overrides or {},
        "target_rate": target_rate,
        "tolerance": tol,
        "runs": runs,
        "candidates": cands,
        "recommendation": [ex["recommendation"]["candidate"], gu["recommendation"]["candidate"]],
        "same_recommendation": ex["recommendation"]["candidate"] == gu["recommendation"]["candidate"],
        "same_gpus": all(c["gpus"][0] == c["gpus"][1] for c in cands),
        "all_within_tolerance": all(c["within_tolerance"] for c in cands),
        "max_ratio_dev": max((abs(c["ratio"] - 1) for c in cands if c["ratio"] not in (0, float("inf"))), default=0.0),
    }


def _say(line: str) -> None:
    """A progress line on stderr (the table and the JSON are the results)."""
    sys.stderr.write(f"planner: {line}\n")
    sys.stderr.flush()


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def rows(results: list[dict]) -> list[list]:
    """The comparison table: one row per scenario, exhaustive / guided in each cell."""
    out = []
    for r in results:
        ex, gu = r["runs"]["exhaustive"], r["runs"]["guided"]

        def med(key, runs):
            return _median([x[key] for x in runs])

        out.append(
            [
                r["scenario"] + (f" @ {r['target_rate']:g} req/s" if r["target_rate"] else ""),
                f"{med('wall_s', ex):.1f} / {med('wall_s', gu):.1f}",
                f"{med('cpu_s', ex):.1f} / {med('cpu_s', gu):.1f}",
                f"{ex[0]['simulations']} / {gu[0]['simulations']}",
                f"{ex[0]['simulated_requests']} / {gu[0]['simulated_requests']}",
                " / ".join(str(x) for x in r["recommendation"]),
                f"{r['max_ratio_dev']:.1%}",
                "yes" if r["same_recommendation"] and r["all_within_tolerance"] and r["same_gpus"] else "NO",
                "–".join(f"{x:.1f}" for x in (min(x["load"] for x in ex + gu), max(x["load"] for x in ex + gu))),
            ]
        )
    return out


COLUMNS = [
    "scenario",
    "wall s",
    "cpu s",
    "simulations",
    "requests",
    "recommendation",
    "max goodput diff",
    "same answer",
    "load",
]


def run(quick: bool, out: Path) -> dict:
    import multiprocessing

    fork = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    names = QUICK if quick else tuple(SCENARIOS)
    workers = min(2, os.cpu_count() or 1)
    repeats = QUICK_REPEATS if quick else 1
    results = []
    for i, name in enumerate(names):
        slo, target = SCENARIOS[name]
        _say(f"scenario {i + 1}/{len(names)}: {name}" + (f" @ {target:g} req/s" if target else ""))
        results.append(compare(name, slo, None, target, workers, repeats=repeats, start_method=fork))
    title = f"planner: exhaustive / guided search ({'median of ' + str(repeats) if repeats > 1 else 'one run'} each)"
    table(title, COLUMNS, rows(results))
    data = {
        "bench": "planner",
        "quick": quick,
        "repeats": repeats,
        "scenarios": results,
        "all_same": all(r["same_recommendation"] and r["all_within_tolerance"] and r["same_gpus"] for r in results),
    }
    write_json(out, "planner", data)
    return data
