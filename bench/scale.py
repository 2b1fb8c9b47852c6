"""10k / 100k / 1M requests of bench-1m, each in its own interpreter: wall, requests/s, peak RSS."""

from __future__ import annotations

from pathlib import Path

from .common import child_run, console, table, write_json

SCENARIO = "bench-1m"
FULL = [10_000, 100_000, 1_000_000]
QUICK = [2_000, 10_000]


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
        rows.append([f"{n:,}", r["wall_s"], r["cpu_s"], r["requests_per_s"], r["us_per_request_cpu"], r["peak_rss_mb"],
                     r["sim_events"], r["events_per_request"], r["iterations_per_request"],
                     f"{r['load_avg_before'][:1]}→{r['load_avg_after'][:1]}"])
    table(f"scale ({SCENARIO})", ["requests", "wall s", "cpu s", "req/s (wall)", "µs/req (cpu)", "peak RSS MB",
                                   "sim events", "events/req", "iters/req", "load"], rows)
    data = {"bench": "scale", "quick": quick, "scenario": SCENARIO, "runs": results,
            "targets": {"1M wall_s <= 60": None, "1M peak_rss_mb <= 2048": None}}
    big = [r for r in results if r["requests"] >= 1_000_000]
    if big:
        data["targets"] = {"1M wall_s <= 60": big[0]["wall_s"] <= 60, "1M peak_rss_mb <= 2048": big[0]["peak_rss_mb"] <= 2048}
    write_json(out, "scale", data)
    return data
