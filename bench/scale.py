"""10k / 100k / 1M requests of bench-1m, each in its own interpreter: wall, requests/s, peak RSS."""

from __future__ import annotations

from pathlib import Path

from .common import child_run, console, table, write_json

SCENARIO = "bench-1m"
FULL = [10_000, 100_000, 1_000_000]
QUICK = [2_000, 10_000]
#: Requests of the compiled-vs-interpreted comparison, and how many interleaved pairs.
SIDE, SIDE_QUICK, PAIRS = 100_000, 10_000, 2


def _side_by_side(n: int) -> dict:
    """The compiled build against the plain sources on the same requests, interleaved (this host's
    speed drifts, so pairs run back to back): CPU seconds and their ratio per pair."""
    pairs = []
    for i in range(PAIRS):
        console.print(f"[dim]scale: {n:,} requests, compiled vs interpreted, pair {i + 1} of {PAIRS}…[/]")
        c = child_run(SCENARIO, {"workload.num_requests": n})
        p = child_run(SCENARIO, {"workload.num_requests": n}, interpreted=True)
        assert (c["native"], p["native"]) == ("compiled", "off"), (c["native"], p["native"])
        if (c["completed"], c["sim_events"], c["makespan_s"]) != (p["completed"], p["sim_events"], p["makespan_s"]):
            raise RuntimeError(f"compiled and interpreted runs differ: {c} vs {p}")
        pairs.append(
            {"compiled_cpu_s": c["cpu_s"], "interpreted_cpu_s": p["cpu_s"], "speedup": p["cpu_s"] / c["cpu_s"]}
        )
    table(
        f"compiled vs interpreted hot path ({n:,} requests of {SCENARIO}, CPU s, interleaved)",
        ["pair", "compiled", "interpreted", "speed-up"],
        [[i + 1, r["compiled_cpu_s"], r["interpreted_cpu_s"], f"{r['speedup']:.2f}×"] for i, r in enumerate(pairs)],
    )
    return {"requests": n, "pairs": pairs}


def run(quick: bool, out: Path, sizes: list[int] | None = None) -> dict:
    rows, results = [], []
    for n in sizes or (QUICK if quick else FULL):
        console.print(f"[dim]scale: {n:,} requests of {SCENARIO}…[/]")
        r = child_run(SCENARIO, {"workload.num_requests": n})
        r["requests_per_s"] = n / r["wall_s"]
        r["us_per_request_wall"] = 1e6 * r["wall_s"] / n
        r["us_per_request_cpu"] = 1e6 * r["cpu_s"] / n
        r["events_per_request"] = r["sim_events"] / n
        r["iterations_per_request"] = r["iterations"] / n
        results.append(r)
        rows.append(
            [
                f"{n:,}",
                r["wall_s"],
                r["cpu_s"],
                r["requests_per_s"],
                r["us_per_request_cpu"],
                r["peak_rss_mb"],
                r["sim_events"],
                r["events_per_request"],
                r["iterations_per_request"],
                f"{r['load_avg_before'][:1]}→{r['load_avg_after'][:1]}",
            ]
        )
    table(
        f"scale ({SCENARIO}; hot path: {results[0]['native']})",
        [
            "requests",
            "wall s",
            "cpu s",
            "req/s (wall)",
            "µs/req (cpu)",
            "peak RSS MB",
            "sim events",
            "events/req",
            "iters/req",
            "load",
        ],
        rows,
    )
    data = {
        "bench": "scale",
        "quick": quick,
        "scenario": SCENARIO,
        "runs": results,
        "targets": {"1M wall_s <= 60": None, "1M peak_rss_mb <= 2048": None},
    }
    if results[0]["native"] == "compiled":
        data["compiled_vs_interpreted"] = _side_by_side(SIDE_QUICK if quick else SIDE)
    big = [r for r in results if r["requests"] >= 1_000_000]
    if big:
        data["targets"] = {
            "1M wall_s <= 60": big[0]["wall_s"] <= 60,
            "1M peak_rss_mb <= 2048": big[0]["peak_rss_mb"] <= 2048,
        }
    write_json(out, "scale", data)
    return data
