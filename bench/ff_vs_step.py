"""Fast-forward against per-iteration stepping on the same scenarios.

For each scenario both engine modes run in this process, side by side: wall and CPU time, SimPy
events (``sim_events``), windows and iterations, and the largest relative difference between
the two modes over the summary's percentiles and counts (0 up to float rounding: the modes are
equivalent, ``tests/test_engine.py``). A third run steps with the step-time breakdown on
(``kvsim run --step-breakdown``): its CPU time against fast-forward's, and whether its summary
differs from the plain step run's (it must not).
"""

from __future__ import annotations

from pathlib import Path

from .common import rel_diff, table, timed_run, write_json

_CLOSED = {"kind": "closed_loop", "concurrency": 64}

#: (label, scenario, overrides, quick overrides)
CASES = [
    ("chat-api", "chat-api", {"workload.num_requests": 2000}, {"workload.num_requests": 300}),
    ("bench-saturated", "bench-saturated", {}, {"workload.num_requests": 300}),
    (
        "chat-api static",
        "chat-api",
        {"workload.num_requests": 2000, "allocator.kind": "static", "allocator.reserve": "max_model_len"},
        {"workload.num_requests": 300, "allocator.kind": "static", "allocator.reserve": "max_model_len"},
    ),
    # TensorRT-LLM's preset holds each first token one iteration (engine.first_token_lag) and forms
    # batches ahead; 64 closed-loop clients keep a first token held most of the time.
    (
        "chat-api trtllm closed-loop",
        "chat-api",
        {"workload.num_requests": 2000, "engine.kind": "trtllm", "workload.arrival": _CLOSED},
        {"workload.num_requests": 300, "engine.kind": "trtllm", "workload.arrival": _CLOSED},
    ),
]

METRICS = [(k, p) for k in ("ttft_s", "tpot_s", "e2e_s") for p in ("p50", "p90", "p99", "mean")]
SCALARS = ["makespan_s", "throughput_tokens_per_s", "kv_token_utilization", "kv_memory_utilization"]
COUNTS = ["requests", "completed", "rejected", "preemptions", "iterations", "truncated"]


def compare(a: dict, b: dict) -> tuple[float, str]:
    """Largest relative difference between two summaries over percentiles, rates and counts."""
    worst, where = 0.0, "-"
    items = [(f"{k}.{p}", a[k][p], b[k][p]) for k, p in METRICS]
    items += [(k, a.get(k), b.get(k)) for k in SCALARS + COUNTS]
    for name, x, y in items:
        d = rel_diff(x, y)
        if d > worst:
            worst, where = d, name
    return worst, where


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["cpu_s"])


def run(quick: bool, out: Path) -> dict:
    rows, results = [], []
    repeats = 1 if quick else 2
    for label, scenario, over, qover in CASES:
        o = qover if quick else over
        timed_run(scenario, {**o, "workload.num_requests": 20})  # warm-up: imports, traces, profile
        ffs, sts, sps = [], [], []
        for _ in range(repeats):  # alternate the modes so load drifts hit both alike
            ffs.append(timed_run(scenario, {**o, "engine.mode": "fast_forward"}))
            sts.append(timed_run(scenario, {**o, "engine.mode": "step"}))
            sps.append(timed_run(scenario, {**o, "engine.mode": "step"}, step_breakdown=True))
        ff, st, sp = _best(ffs), _best(sts), _best(sps)
        sf, ss = ff["summary"], st["summary"]
        worst, where = compare(sf, ss)
        split_diff, _ = compare(ss, sp["summary"])
        n = sf["requests"]
        r = {
            "case": label,
            "scenario": scenario,
            "overrides": o,
            "requests": n,
            "ff": {k: ff[k] for k in ("wall_s", "cpu_s", "load_avg_before", "load_avg_after")}
            | {k: sf[k] for k in ("sim_events", "windows", "iterations", "preemptions")},
            "step": {k: st[k] for k in ("wall_s", "cpu_s", "load_avg_before", "load_avg_after")}
            | {k: ss[k] for k in ("sim_events", "windows", "iterations", "preemptions")},
            "events_ratio_step_over_ff": ss["sim_events"] / max(sf["sim_events"], 1),
            "cpu_ratio_step_over_ff": st["cpu_s"] / max(ff["cpu_s"], 1e-9),
            "split_cpu_s": sp["cpu_s"],
            "cpu_ratio_split_over_ff": sp["cpu_s"] / max(ff["cpu_s"], 1e-9),
            "split_max_rel_diff_from_step": split_diff,
            "ff_events_per_request": sf["sim_events"] / n,
            "iterations_per_request": sf["iterations"] / n,
            "iterations_per_window_ff": sf["iterations"] / max(sf["windows"], 1),
            "max_rel_metric_diff": worst,
            "max_rel_metric_diff_at": where,
        }
        results.append(r)
        rows.append(
            [
                label,
                n,
                ff["wall_s"],
                st["wall_s"],
                ff["cpu_s"],
                st["cpu_s"],
                sp["cpu_s"],
                r["cpu_ratio_split_over_ff"],
                f"{split_diff:.0e}",
                sf["sim_events"],
                ss["sim_events"],
                r["events_ratio_step_over_ff"],
                sf["windows"],
                sf["iterations"],
                r["ff_events_per_request"],
                r["iterations_per_request"],
                f"{worst:.1e}",
                str(ff["load_avg_before"][:1]),
            ]
        )
    table(
        "fast-forward vs step (best of the repeats by CPU time)",
        [
            "case",
            "requests",
            "ff wall",
            "step wall",
            "ff cpu",
            "step cpu",
            "split cpu",
            "split/ff cpu",
            "split vs step",
            "ff events",
            "step events",
            "step/ff",
            "ff windows",
            "iterations",
            "ff ev/req",
            "iters/req",
            "max rel diff",
            "load",
        ],
        rows,
    )
    data = {"bench": "ff-vs-step", "quick": quick, "cases": results}
    write_json(out, "ff-vs-step", data)
    return data
