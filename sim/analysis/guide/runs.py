"""One simulated variant of a situation (:class:`Run`) and a situation's results.

Definitions used by the checks and the tables (all from ``summary.json`` and the run's tables):

* **KV waste** = 1 − ``kv_token_utilization``: reserved KV that holds no token, time-weighted
  over busy iterations (the article's "memory you can't use").
* **Reserved KV (GiB·s)** = ∫ reserved dt, recovered as ``kv_memory_utilization`` ·
  capacity · makespan ÷ ``kv_token_utilization``.
* **Mean running** = time-weighted mean of running sequences (the effective batch size).
* **Jitter** = p99 / p50 of decode-only iteration times (timeseries ``first_step_s``,
  weighted by the iterations a row stands for: :func:`sim.analysis.planner.measure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim.analysis.plots import summed_over_replicas

if TYPE_CHECKING:
    import pyarrow as pa

    from sim.analysis.guide.claims import ClaimResult
    from sim.analysis.guide.situations import Claim, Situation, Variant

GIB = 2.0**30


@dataclass
class Run:
    """A variant's simulation: its summary, request and time-series tables, and the planner's
    measures at the situation's SLO (``attainment`` 0–1, ``goodput_per_gpu`` req/s per GPU)."""

    variant: Variant
    summary: dict
    requests: pa.Table
    timeseries: pa.Table
    measure: dict
    attainment: float
    goodput_per_gpu: float
    gpus: int
    capacity_tokens_total: int
    wall_s: float

    @property
    def s(self) -> dict:
        return self.summary

    @property
    def upper_bound(self) -> bool:
        """The run read what no server knows (hybrid_tail's ``oracle`` length predictor)."""
        return bool((self.summary.get("length_predictor") or {}).get("upper_bound"))

    def waste(self) -> float:
        u = self.summary["kv_token_utilization"]
        return 1.0 if u is None else 1.0 - u

    def reserved_gib_s(self) -> float:
        s = self.summary
        if not s["kv_token_utilization"]:
            return 0.0
        used = s["kv_memory_utilization"] * self.capacity_tokens_total * s["makespan_s"]
        return used / s["kv_token_utilization"] * s["kv_bytes_per_token"] / GIB

    def mean_running(self) -> float:
        ts = self.timeseries
        if ts.num_rows == 0:
            return 0.0
        t, v = summed_over_replicas(ts, ["running"])
        dt = np.diff(t, append=t[-1])
        # The series holds each state until the next change: weight by the time it holds.
        return float(np.dot(v["running"], dt) / dt.sum()) if dt.sum() > 0 else 0.0

    def peak_running(self) -> int:
        if self.timeseries.num_rows == 0:
            return 0
        _, v = summed_over_replicas(self.timeseries, ["running"])
        return int(v["running"].max())

    def alloc_ms_per_iteration(self) -> float:
        it = self.summary["iterations"]
        return 1e3 * self.summary["allocation_time_s"] / it if it else 0.0

    def requests_np(self) -> dict[str, np.ndarray]:
        r = self.requests
        col = lambda c: r.column(c).to_numpy(zero_copy_only=False)  # noqa: E731
        return {
            "status": np.asarray(r.column("status").to_pylist()),
            "arrival": col("arrival_s"),
            "first": col("first_token_s"),
            "finish": col("finish_s"),
            "prompt": col("prompt_tokens"),
            "output": col("output_tokens"),
            "generated": col("generated_tokens"),
        }

    def gate_reserved_gib(self) -> float:
        """Peak KV reserved before the last request produced its first token (the article's 'gate'), GiB."""
        q = self.requests_np()
        ok = q["status"] == "completed"
        if not ok.any() or self.timeseries.num_rows == 0:
            return 0.0
        t_gate = float(np.nanmax(q["first"][ok]))
        t, v = summed_over_replicas(self.timeseries, ["kv_reserved_bytes"])
        sel = t <= t_gate + 1e-9
        return float(v["kv_reserved_bytes"][sel].max() / GIB) if sel.any() else 0.0

    def long_request_p99(self, threshold_tokens: int) -> tuple[float | None, float | None, int]:
        """(TTFT p99 s, e2e p99 s, count) of completed requests longer than ``threshold_tokens`` in total."""
        q = self.requests_np()
        sel = (q["status"] == "completed") & (q["prompt"] + q["output"] > threshold_tokens)
        if not sel.any():
            return None, None, 0
        return (
            float(np.percentile((q["first"] - q["arrival"])[sel], 99)),
            float(np.percentile((q["finish"] - q["arrival"])[sel], 99)),
            int(sel.sum()),
        )

    def mean_request_tokens(self) -> float:
        q = self.requests_np()
        return float((q["prompt"] + q["output"]).mean())


@dataclass
class SituationResult:
    """A situation's runs by variant name, its claims' verdicts and the planner's recommendation
    (``skipped``: why the situation did not run: a model it needs is missing from the catalog)."""

    situation: Situation
    runs: dict[str, Run]
    skipped: str | None = None
    claims: list[tuple[Claim, ClaimResult]] = field(default_factory=list)
    recommendation: dict | None = None
    num_requests: int | None = None
    wall_s: float = 0.0

    def __getitem__(self, name: str) -> Run:
        return self.runs[name]


# --- number formatting shared by the findings and the tables ---------------------------------


def fmt_pct(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


def fmt_g(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.3g}{unit}"
