"""What a validation compares: latency percentiles, throughput and KV use of an engine run and a
simulator run, relative errors, medians over the engine's replays, and the table in one line."""

from __future__ import annotations

import numpy as np

METRICS = (
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "tpot_p50",
    "tpot_p90",
    "tpot_p99",
    "e2e_p50",
    "e2e_p90",
    "e2e_p99",
    "throughput",
    "peak_kv_blocks",
    "preemptions",
)


def latency_metrics(arrival, first, finish, prompt, generated) -> dict:
    """The summary's definitions: TTFT, TPOT = (finish − first)/(generated − 1), e2e; tokens/s over the makespan."""
    arrival, first, finish = (np.asarray(x, dtype=np.float64) for x in (arrival, first, finish))
    prompt, generated = np.asarray(prompt), np.asarray(generated)
    out = {}
    multi = generated > 1
    series = {
        "ttft": first - arrival,
        "tpot": (finish - first)[multi] / (generated[multi] - 1),
        "e2e": finish - arrival,
    }
    for k, v in series.items():
        for q in (50, 90, 99):
            out[f"{k}_p{q}"] = float(np.percentile(v, q)) if v.size else None
    makespan = float(finish.max() - arrival.min())
    out["throughput"] = float((prompt.sum() + generated.sum()) / makespan)
    return out


def rel_error(measured, simulated) -> float | None:
    if measured is None or simulated is None:
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return float(abs(simulated - measured) / abs(measured))


def engine_metrics(res) -> dict:
    """The latency metrics, peak KV blocks and preemptions of one reference-engine run ``res``."""
    ok = [r for r in res.requests if r["status"] == "completed"]
    m = latency_metrics(
        [r["arrival_s"] for r in ok],
        [r["first_token_s"] for r in ok],
        [r["finish_s"] for r in ok],
        [r["prompt_tokens"] for r in ok],
        [r["generated_tokens"] for r in ok],
    )
    m["peak_kv_blocks"] = float(res.peak_blocks())
    m["preemptions"] = int(res.preemptions())
    return m


def sim_metrics(result, block_size: int) -> dict:
    """The same metrics as :func:`engine_metrics` of a simulated run (``block_size``: tokens per KV block)."""
    req = result.requests
    ok = np.asarray(req["status"].to_pylist()) == "completed"
    col = lambda c: req[c].to_numpy()[ok]  # noqa: E731
    m = latency_metrics(
        col("arrival_s"), col("first_token_s"), col("finish_s"), col("prompt_tokens"), col("generated_tokens")
    )
    bpt = result.summary["kv_bytes_per_token"]
    ts = result.timeseries
    m["peak_kv_blocks"] = float(ts["kv_reserved_bytes"].to_numpy().max() / bpt / block_size) if ts.num_rows else 0.0
    m["preemptions"] = int(result.summary["preemptions"])
    return m


def percentiles(x) -> dict:
    """``p10``, ``p50``, ``p90`` and ``p99`` of ``x`` (empty for no values)."""
    x = np.asarray(x, dtype=np.float64)
    if not x.size:
        return {}
    return {f"p{q}": float(np.percentile(x, q)) for q in (10, 50, 90, 99)}


def median_metrics(per: list[dict]) -> dict:
    """Each metric's median over the engine's replays of one trace (one replay: its own values).

    The simulator is deterministic; the engine is not (a shared host's speed moves within a replay),
    so one replay's percentiles carry that noise, which queueing amplifies at medium load. The
    median over replays keeps one disturbed replay from setting the measurement."""
    out: dict[str, float | None] = {}
    for k in per[0]:
        vals = [m[k] for m in per]
        if any(v is None for v in vals):
            out[k] = None
            continue
        med = float(np.median(vals))
        out[k] = int(med) if all(isinstance(v, int) for v in vals) and med.is_integer() else med
    return out


def replay_spread(vals: list) -> float | None:
    """(max − min) ÷ median of one metric over the engine's replays: its run-to-run noise."""
    if len(vals) < 2 or any(v is None for v in vals):
        return None
    med = float(np.median(vals))
    if med == 0:
        return 0.0 if max(vals) == min(vals) else None
    return float((max(vals) - min(vals)) / abs(med))


#: the cells the fidelity target is stated on: p50 and p90 of TTFT, TPOT and e2e
TARGET_METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90")


def error_summary(rows: list[dict]) -> dict:
    """The table in a line: of the p50/p90 TTFT, TPOT and e2e cells, how many are within 10 % and 5 %,
    the median and the worst error, and (with replays) how many errors are below the cell's own
    replay spread, i.e. cannot be told from the engine's run-to-run noise by this run."""
    cells = [r for r in rows if r["metric"] in TARGET_METRICS and r["rel_error"] is not None]
    if not cells:
        return {"cells": 0}
    errs = np.array([r["rel_error"] for r in cells])
    worst = cells[int(np.argmax(errs))]
    out = {
        "cells": len(cells),
        "within_10pct": int((errs <= 0.10).sum()),
        "within_5pct": int((errs <= 0.05).sum()),
        "median_rel_error": float(np.median(errs)),
        "max_rel_error": float(errs.max()),
        "worst": f"{worst['load']}/{worst['allocator']} {worst['metric']}",
    }
    spread = [r for r in cells if r.get("replay_spread") is not None]
    if spread:
        out["below_replay_spread"] = sum(r["rel_error"] <= r["replay_spread"] for r in spread)
    eq = [r for r in cells if r.get("step_equivalent") is not None]
    if eq:
        top = max(eq, key=lambda r: r["step_equivalent"])
        out["max_step_equivalent"] = float(top["step_equivalent"])
        out["max_step_equivalent_cell"] = f"{top['load']}/{top['allocator']} {top['metric']}"
        worst_s = max(eq, key=lambda r: r["sensitivity"])
        out["max_sensitivity"] = float(worst_s["sensitivity"])
        out["max_sensitivity_cell"] = f"{worst_s['load']}/{worst_s['allocator']} {worst_s['metric']}"
    return out
