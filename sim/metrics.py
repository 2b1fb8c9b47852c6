"""What a run records, and the summary computed from it.

Per request: one row when it ends (completed or rejected). Per replica: one
time-series row per batch change (an iteration, or a fast-forwarded window of
identical-composition iterations, recorded at its end before finished
sequences free their memory, so peaks are kept).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .request import COMPLETED, Request

if TYPE_CHECKING:
    from .replica import Replica

REQUEST_COLUMNS = ["id", "replica", "status", "reason", "truncated", "arrival_s", "admitted_s", "first_token_s",
                   "finish_s", "prompt_tokens", "output_tokens", "generated_tokens", "preemptions"]
TIMESERIES_COLUMNS = ["t_s", "replica", "running", "waiting", "batch_tokens", "iterations", "window_s",
                      "first_step_s", "kv_capacity_bytes", "kv_reserved_bytes", "kv_used_bytes", "kv_free_bytes",
                      "kv_largest_free_extent_bytes", "kv_internal_fragmentation", "kv_external_fragmentation"]


class Recorder:
    def __init__(self, kv_bytes_per_token: int):
        self.bpt = kv_bytes_per_token
        self.req_rows: list[tuple] = []
        self.ts_cols: dict[str, list] = {c: [] for c in TIMESERIES_COLUMNS}

    def request_done(self, r: Request) -> None:
        self.req_rows.append((r.id, r.replica, r.status, r.reason, r.truncated, r.arrival, r.admitted,
                              r.first_token, r.finish, r.prompt, r.output, r.generated, r.preemptions))

    def step(self, rep: "Replica", iterations: int, window_s: float, first_step_s: float, batch_tokens: int) -> None:
        a = rep.alloc
        reserved = a.reserved_tokens()
        bpt = self.bpt
        c = self.ts_cols
        c["t_s"].append(rep.env.now)
        c["replica"].append(rep.index)
        c["running"].append(len(rep.sched.running))
        c["waiting"].append(len(rep.sched.waiting))
        c["batch_tokens"].append(batch_tokens)
        c["iterations"].append(iterations)
        c["window_s"].append(window_s)
        c["first_step_s"].append(first_step_s)
        c["kv_capacity_bytes"].append(a.capacity_tokens * bpt)
        c["kv_reserved_bytes"].append(reserved * bpt)
        c["kv_used_bytes"].append(a.used_total * bpt)
        c["kv_free_bytes"].append((a.capacity_tokens - reserved) * bpt)
        largest = a.largest_free_extent_tokens()
        free = a.capacity_tokens - reserved
        c["kv_largest_free_extent_bytes"].append(largest * bpt)
        c["kv_internal_fragmentation"].append(1.0 - a.used_total / reserved if reserved else 0.0)
        c["kv_external_fragmentation"].append(1.0 - largest / free if free else 0.0)

    def requests_table(self) -> pa.Table:
        rows = sorted(self.req_rows)
        cols = list(zip(*rows)) if rows else [[] for _ in REQUEST_COLUMNS]
        types = [pa.int64(), pa.int32(), pa.string(), pa.string(), pa.bool_(), pa.float64(), pa.float64(),
                 pa.float64(), pa.float64(), pa.int64(), pa.int64(), pa.int64(), pa.int32()]
        return pa.table({name: pa.array(col, type=t) for name, col, t in zip(REQUEST_COLUMNS, cols, types)})

    def timeseries_table(self) -> pa.Table:
        return pa.table({k: pa.array(v) for k, v in self.ts_cols.items()})


def _pct(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean())}


def summarize(req: pa.Table, replicas: list["Replica"], bpt: int) -> dict:
    """Headline metrics of a run (see docs/scenario.md, "Outputs")."""
    status = np.asarray(req["status"].to_pylist())
    ok = status == COMPLETED
    arrival = req["arrival_s"].to_numpy()
    first = req["first_token_s"].to_numpy()
    finish = req["finish_s"].to_numpy()
    gen = req["generated_tokens"].to_numpy()
    prompt = req["prompt_tokens"].to_numpy()
    ttft = (first - arrival)[ok]
    e2e = (finish - arrival)[ok]
    multi = ok & (gen > 1)
    tpot = ((finish - first)[multi] / (gen[multi] - 1))
    t_start = float(arrival.min()) if arrival.size else 0.0
    t_end = float(finish.max()) if finish.size else 0.0
    makespan = max(t_end - t_start, 1e-12)
    reasons: dict[str, int] = {}
    for reason in np.asarray(req["reason"].to_pylist())[~ok]:
        reasons[str(reason)] = reasons.get(str(reason), 0) + 1
    used = sum(r.used_token_s for r in replicas)
    reserved = sum(r.reserved_token_s for r in replicas)
    capacity = sum(r.alloc.capacity_tokens for r in replicas) * makespan
    refusals: dict[str, int] = {}
    for r in replicas:
        for k, v in r.alloc.refusal_counts().items():
            refusals[k] = refusals.get(k, 0) + v
    busy = sum(r.busy_s for r in replicas)
    out_tokens = int(gen[ok].sum())
    work = {"events": 0, "copy_bytes": 0, "zero_bytes": 0, "swap_out_bytes": 0, "swap_in_bytes": 0}
    for r in replicas:
        for k in work:
            work[k] += getattr(r.alloc.work_total, k)
    return {
        "requests": int(len(status)),
        "completed": int(ok.sum()),
        "rejected": int((~ok).sum()),
        "rejected_by_reason": dict(sorted(reasons.items())),
        "truncated": int(np.asarray(req["truncated"].to_pylist(), dtype=bool).sum()),
        "preemptions": int(sum(r.sched.preemptions for r in replicas)),
        "ttft_s": _pct(ttft),
        "tpot_s": _pct(tpot),
        "e2e_s": _pct(e2e),
        "makespan_s": makespan,
        "throughput_tokens_per_s": (out_tokens + int(prompt[ok].sum())) / makespan,
        "output_tokens_per_s": out_tokens / makespan,
        "throughput_requests_per_s": float(ok.sum()) / makespan,
        "kv_token_utilization": used / reserved if reserved > 0 else None,
        "kv_memory_utilization": used / capacity if capacity > 0 else None,
        "kv_capacity_bytes_per_replica": int(replicas[0].alloc.capacity_tokens * bpt),
        "allocator_refusals": dict(sorted(refusals.items())),
        "stranded_refusals": refusals.get("no_contiguous_extent", 0),
        "kv_internal_fragmentation": 1.0 - used / reserved if reserved > 0 else None,
        "kv_external_fragmentation": sum(r.ext_frag_s for r in replicas) / busy if busy > 0 else None,
        "admissions_paused_s": sum(r.paused_s for r in replicas),
        "compactions": int(sum(r.compactions for r in replicas)),
        "compaction_bytes": int(sum(r.compaction_bytes for r in replicas)),
        "compaction_time_s": sum(r.compaction_s for r in replicas),
        "swaps_out": int(sum(r.sched.swaps_out for r in replicas)),
        "swaps_in": int(sum(r.sched.swaps_in for r in replicas)),
        "allocation_events": work["events"],
        "allocation_time_s": sum(r.alloc_work_s for r in replicas),
        "copy_bytes": work["copy_bytes"],
        "zero_fill_bytes": work["zero_bytes"],
        "swap_out_bytes": work["swap_out_bytes"],
        "swap_in_bytes": work["swap_in_bytes"],
        "iterations": int(sum(r.iterations for r in replicas)),
        "busy_fraction": sum(r.busy_s for r in replicas) / (makespan * len(replicas)),
    }


def clean_json(obj):
    """Replace NaN/inf by None so summary.json is strict JSON."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
