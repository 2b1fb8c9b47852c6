"""``kvsim guide``: the seed article's situations, simulated fresh, as a decision guide.

Every situation of the article (``/work/shared/seed/kv-cache-static-vs-dynamic.txt``) is a
scenario file in ``scenarios/`` (:data:`SITUATIONS` names it) and a list of allocator
variants (scenario overrides). :func:`run_situation` simulates every variant,
:func:`check_claims` turns the article's claims about that situation into checks with
numbers (reproduced / partly / did not reproduce), :func:`recommendation` asks the goodput
planner's :func:`sim.analysis.planner.recommend` to pick a variant, and :func:`render` writes it all
as ``docs/decision-guide.md``.

Definitions used in the guide (all from ``summary.json`` and the run's tables):

* **KV waste** = 1 − ``kv_token_utilization``: reserved KV that holds no token, time-weighted
  over busy iterations (the article's "memory you can't use").
* **Reserved KV (GiB·s)** = ∫ reserved dt, recovered as ``kv_memory_utilization`` ·
  capacity · makespan ÷ ``kv_token_utilization``.
* **Mean running** = time-weighted mean of running sequences (the effective batch size).
* **Jitter** = p99 / p50 of decode-only iteration times (timeseries ``first_step_s``,
  weighted by the iterations a row stands for: :func:`sim.analysis.planner.measure`).
* **SLO attainment and goodput at load**: the planner's goodput search (the highest rate
  meeting the SLO) costs ~10 simulations per variant, too many for a 5-minute guide, and is
  undefined for closed-loop and trace arrivals. The guide reports instead, *at the
  scenario's own load*, attainment (requests meeting the situation's SLO ÷ all requests,
  :func:`sim.analysis.slo.attainment`) and **goodput at load** = requests meeting the SLO ÷ makespan ÷
  GPUs. The planner's ``recommend`` then ranks variants on that (ties within 5 %: fewer
  refused/truncated, then goodput, then jitter, then memory waste). For a true goodput,
  ``kvsim plan SCENARIO --slo ...``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import typer

from sim.analysis.slo import SLO

GIB = 2.0**30
REPRODUCED, PARTLY, NOT_REPRODUCED, SKIPPED = "reproduced", "partly", "did not reproduce", "skipped"
DEFAULT_OUT = Path("docs/decision-guide.md")


# --- situations ------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict
    strategy: str
    #: A contrast run (another load or workload): shown, but not a candidate for the recommendation.
    contrast: bool = False


@dataclass(frozen=True)
class Claim:
    id: str
    article: str
    check: Callable[["SituationResult"], "ClaimResult"]


@dataclass
class ClaimResult:
    verdict: str
    finding: str
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Situation:
    key: str
    number: str
    title: str
    scenario: str
    question: str
    variants: tuple[Variant, ...]
    slo: SLO
    claims: tuple[Claim, ...] = ()
    #: Extra per-variant columns: header → function(Run, SituationResult) → formatted string.
    extra: tuple[tuple[str, Callable[["Run", "SituationResult"], str]], ...] = ()
    #: Why the situation cannot run in this build (None: it can). Called before any run.
    unavailable: Callable[[], str | None] | None = None
    #: Why its results are not meaningful yet, from a first run (None: they are).
    incomplete: Callable[["Run"], str | None] | None = None


@dataclass
class Run:
    variant: Variant
    summary: dict
    requests: object
    timeseries: object
    measure: dict
    attainment: float
    goodput_per_gpu: float
    gpus: int
    capacity_tokens_total: int
    wall_s: float

    @property
    def s(self) -> dict:
        return self.summary

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
        from sim.analysis.plots import summed_over_replicas
        t, v = summed_over_replicas(ts, ["running"])
        dt = np.diff(t, append=t[-1])
        # The series holds each state until the next change: weight by the time it holds.
        return float(np.dot(v["running"], dt) / dt.sum()) if dt.sum() > 0 else 0.0

    def peak_running(self) -> int:
        from sim.analysis.plots import summed_over_replicas
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
        return {"status": np.asarray(r.column("status").to_pylist()), "arrival": col("arrival_s"),
                "first": col("first_token_s"), "finish": col("finish_s"), "prompt": col("prompt_tokens"),
                "output": col("output_tokens"), "generated": col("generated_tokens")}

    def gate_reserved_gib(self) -> float:
        """Peak KV reserved before the last request produced its first token (the article's 'gate')."""
        q = self.requests_np()
        ok = q["status"] == "completed"
        if not ok.any() or self.timeseries.num_rows == 0:
            return 0.0
        t_gate = float(np.nanmax(q["first"][ok]))
        from sim.analysis.plots import summed_over_replicas
        t, v = summed_over_replicas(self.timeseries, ["kv_reserved_bytes"])
        sel = t <= t_gate + 1e-9
        return float(v["kv_reserved_bytes"][sel].max() / GIB) if sel.any() else 0.0

    def long_request_p99(self, threshold_tokens: int) -> tuple[float | None, float | None, int]:
        """(TTFT p99, e2e p99, count) of completed requests longer than ``threshold_tokens`` in total."""
        q = self.requests_np()
        sel = (q["status"] == "completed") & (q["prompt"] + q["output"] > threshold_tokens)
        if not sel.any():
            return None, None, 0
        return (float(np.percentile((q["first"] - q["arrival"])[sel], 99)),
                float(np.percentile((q["finish"] - q["arrival"])[sel], 99)), int(sel.sum()))

    def mean_request_tokens(self) -> float:
        q = self.requests_np()
        return float((q["prompt"] + q["output"]).mean())


@dataclass
class SituationResult:
    situation: Situation
    runs: dict[str, Run]
    skipped: str | None = None
    claims: list[tuple[Claim, ClaimResult]] = field(default_factory=list)
    recommendation: dict | None = None
    num_requests: int | None = None
    wall_s: float = 0.0

    def __getitem__(self, name: str) -> Run:
        return self.runs[name]


# --- formatting helpers ------------------------------------------------------------------

def _pct(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


def _g(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.3g}{unit}"


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _rel(a: float, b: float) -> float:
    """Relative change of a vs b."""
    return a / b - 1.0 if b else math.inf


# --- claims ------------------------------------------------------------------------------
# Each check states what it compares, runs on the situation's fresh results and returns the
# verdict with the numbers. REPRODUCED: the direction and the article's magnitude; PARTLY:
# the direction, not the magnitude (or only some of the strategies named); NOT_REPRODUCED:
# the simulation finds the opposite or no effect.

def _c_burst_batch(r: SituationResult) -> ClaimResult:
    st, pg = r["static-4k"], r["paged"]
    ms, mp = st.mean_running(), pg.mean_running()
    v = {"static_mean_running": ms, "paged_mean_running": mp, "static_peak": st.peak_running(), "paged_peak": pg.peak_running()}
    f = (f"mean running sequences (effective batch): static 4K slots {ms:.1f} (peak {v['static_peak']}) vs paged {mp:.1f} "
         f"(peak {v['paged_peak']}), {_rel(ms, mp):+.0%}")
    return ClaimResult(REPRODUCED if ms < 0.8 * mp else PARTLY if ms < mp else NOT_REPRODUCED, f, v)


def _c_burst_tail(r: SituationResult) -> ClaimResult:
    st, pg = r["static-4k"], r["paged"]
    a, b = st.s["ttft_s"]["p99"], pg.s["ttft_s"]["p99"]
    v = {"static_ttft_p99": a, "paged_ttft_p99": b}
    f = f"p99 TTFT: static 4K slots {a:.2f} s vs paged {b:.2f} s ({_ratio(a, b):.1f}×)"
    return ClaimResult(REPRODUCED if a > 1.0 and a > 2 * b else PARTLY if a > b else NOT_REPRODUCED, f, v)


def _c_burst_throughput(r: SituationResult) -> ClaimResult:
    st, pg = r["static-4k"], r["paged"]
    a, b = st.s["throughput_tokens_per_s"], pg.s["throughput_tokens_per_s"]
    v = {"static_tok_s": a, "paged_tok_s": b}
    f = (f"throughput: static {a:.0f} tok/s vs paged {b:.0f} tok/s ({_rel(a, b):+.0%}); both serve the same offered "
         f"load, so the loss shows as queueing (TTFT) more than as lost throughput")
    return ClaimResult(REPRODUCED if a < 0.7 * b else PARTLY if a < b else NOT_REPRODUCED, f, v)


def _c_long_gate(r: SituationResult) -> ClaimResult:
    st, dy = r["static"], r["dynamic-chunk"]
    a, b = st.gate_reserved_gib(), dy.gate_reserved_gib()
    v = {"static_gate_gib": a, "dynamic_gate_gib": b}
    f = (f"peak KV reserved before the last first token: static {a:.1f} GiB, dynamic (chunk) {b:.1f} GiB "
         f"(the ten prompts alone hold {dy.s['kv_bytes_per_token'] * 10 * 16384 / GIB:.1f} GiB)")
    return ClaimResult(REPRODUCED if min(a, b) > 40 * 1e9 / GIB else PARTLY if max(a, b) > 40 * 1e9 / GIB else NOT_REPRODUCED, f, v)


def _c_long_waste(r: SituationResult) -> ClaimResult:
    st = r["static"]
    out = {}
    parts = []
    for n in ("dynamic-token", "dynamic-chunk", "paged"):
        cut = 1.0 - r[n].reserved_gib_s() / st.reserved_gib_s()
        out[n] = cut
        parts.append(f"{n} {cut:.0%}")
    v = {"reserved_cut": out, "static_waste": st.waste()}
    f = (f"reserved KV (GiB·s) cut vs static (waste {st.waste():.0%}): " + ", ".join(parts))
    lo, hi = min(out.values()), max(out.values())
    verdict = REPRODUCED if 0.4 <= lo and hi <= 0.6 else PARTLY if hi > 0.2 else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_long_prefill(r: SituationResult) -> ClaimResult:
    st, dy, pz = r["static"], r["dynamic-chunk"], r["paged-zero"]
    a, b, c = st.s["ttft_s"]["p50"], dy.s["ttft_s"]["p50"], pz.s["ttft_s"]["p50"]
    v = {"static_ttft_p50": a, "dynamic_ttft_p50": b, "paged_zero_ttft_p50": c}
    f = (f"p50 TTFT (prefill of 16K under chunked prefill): static {a:.2f} s, dynamic (chunk) {b:.2f} s, paged with "
         f"zero-fill {c:.2f} s (static/dynamic {_ratio(a, b):.2f}×). The simulator charges no zeroing for a static "
         f"reservation and zero-fill of reused pages at HBM bandwidth: no doubling")
    return ClaimResult(REPRODUCED if a > 1.8 * b else PARTLY if a > 1.05 * b else NOT_REPRODUCED, f, v)


def _c_long_step_cost(r: SituationResult) -> ClaimResult:
    tk, ch = r["dynamic-token"], r["dynamic-chunk"]
    a, b = tk.alloc_ms_per_iteration(), ch.alloc_ms_per_iteration()
    v = {"token_alloc_ms_per_iter": a, "chunk_alloc_ms_per_iter": b, "token_events": tk.s["allocation_events"],
         "chunk_events": ch.s["allocation_events"], "token_copy_gib": tk.s["copy_bytes"] / GIB,
         "chunk_copy_gib": ch.s["copy_bytes"] / GIB}
    f = (f"allocation work per iteration: token by token {a:.3f} ms ({v['token_events']} events, "
         f"{v['token_copy_gib']:.0f} GiB realloc copies) vs 512-token chunks {b:.3f} ms ({v['chunk_events']} events, "
         f"{v['chunk_copy_gib']:.0f} GiB copied), {_ratio(a, b):.1f}×")
    return ClaimResult(REPRODUCED if a > 2 * b else PARTLY if a > b else NOT_REPRODUCED, f, v)


def _c_long_p99(r: SituationResult) -> ClaimResult:
    tk, ch = r["dynamic-token"], r["dynamic-chunk"]
    a, b = tk.s["e2e_s"]["p99"], ch.s["e2e_s"]["p99"]
    cut = 1.0 - b / a
    v = {"token_e2e_p99": a, "chunk_e2e_p99": b, "cut": cut}
    f = f"p99 generation time (end to end): token growth {a:.2f} s vs chunk growth {b:.2f} s: chunks cut it by {cut:.1%} (article: 18 %)"
    return ClaimResult(REPRODUCED if 0.12 <= cut <= 0.25 else PARTLY if cut > 0 else NOT_REPRODUCED, f, v)


def _c_long_zero(r: SituationResult) -> ClaimResult:
    g, z = r["paged"], r["paged-zero"]
    a, b = g.s["allocation_time_s"], z.s["allocation_time_s"]
    cut = 1.0 - a / b if b else 0.0
    v = {"generation_alloc_s": a, "zero_alloc_s": b, "cut": cut, "zero_fill_gib": z.s["zero_fill_bytes"] / GIB}
    f = (f"paged allocation time: zero-fill on reuse {b * 1e3:.1f} ms ({v['zero_fill_gib']:.1f} GiB zeroed) vs "
         f"generation counter {a * 1e3:.1f} ms: {cut:.0%} less (article: 40 %)")
    return ClaimResult(REPRODUCED if 0.3 <= cut <= 0.5 else PARTLY if cut > 0 else NOT_REPRODUCED, f, v)


def _c_var_static_waste(r: SituationResult) -> ClaimResult:
    w = r["static"].waste()
    v = {"static_waste": w, "paged_waste": r["paged"].waste()}
    f = f"static reservation rounded up to max_model_len wastes {w:.1%} of reserved KV (article: 40–60 %)"
    return ClaimResult(REPRODUCED if 0.4 <= w <= 0.6 else PARTLY if w > 0.4 else NOT_REPRODUCED, f, v)


def _paged_waste(names: tuple[str, ...]):
    def check(r: SituationResult) -> ClaimResult:
        ws = {n: r[n].waste() for n in names}
        f = "paged waste (reserved but unused KV): " + ", ".join(f"{n} {w:.2%}" for n, w in ws.items()) + " (article: < 5 %)"
        return ClaimResult(REPRODUCED if max(ws.values()) < 0.05 else NOT_REPRODUCED, f, ws)
    return check


def _c_var_util(r: SituationResult) -> ClaimResult:
    st = r["static"]
    u = st.s["kv_memory_utilization"]
    v = {"static_kv_memory_utilization": u, "paged_kv_memory_utilization": r["paged"].s["kv_memory_utilization"]}
    f = (f"static: KV memory holding tokens (used ÷ capacity, time-weighted) {u:.0%} while requests queue (p99 TTFT "
         f"{st.s['ttft_s']['p99']:.1f} s) vs paged {v['paged_kv_memory_utilization']:.0%} (p99 TTFT "
         f"{r['paged'].s['ttft_s']['p99']:.1f} s); 'GPU utilization' read as KV memory in use")
    return ClaimResult(REPRODUCED if 0.2 <= u <= 0.4 else PARTLY if u < 0.5 else NOT_REPRODUCED, f, v)


def _c_var_stranded(r: SituationResult) -> ClaimResult:
    s = {n: r[n].s["stranded_refusals"] for n in ("static", "dynamic", "paged")}
    pre = {n: r[n].s["preemptions"] for n in ("static", "dynamic", "paged")}
    v = {"stranded": s, "preemptions": pre}
    f = (f"allocations refused although enough memory was free in total (stranded): static {s['static']}, dynamic "
         f"contiguous {s['dynamic']}, paged {s['paged']}; preemptions {pre['static']} / {pre['dynamic']} / {pre['paged']}. "
         f"Equal-size static slots never strand (any freed slot fits the next); uneven contiguous extents do")
    verdict = REPRODUCED if s["static"] > 0 and s["paged"] == 0 else PARTLY if s["dynamic"] > 0 else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_small_overhead(r: SituationResult) -> ClaimResult:
    st, pg = r["static"], r["paged"]
    a, b = pg.s["tpot_s"]["p50"], st.s["tpot_s"]["p50"]
    ta, tb = pg.s["throughput_tokens_per_s"], st.s["throughput_tokens_per_s"]
    v = {"paged_tpot_p50": a, "static_tpot_p50": b, "paged_tok_s": ta, "static_tok_s": tb,
         "mean_running": st.mean_running(), "static_waste": st.waste()}
    f = (f"≤ 8 sequences: TPOT p50 paged {a * 1e3:.2f} ms vs static {b * 1e3:.2f} ms ({_rel(a, b):+.1%}); throughput "
         f"paged {ta:.0f} vs static {tb:.0f} tok/s: static's {st.waste():.0%} waste costs nothing while 8 slots fit, "
         f"the 20 % paged-attention factor applies to attention only, a small share of a small batch's step")
    verdict = (REPRODUCED if a > 1.05 * b and ta <= tb * 1.001 else PARTLY if a > b and ta <= tb * 1.001 else NOT_REPRODUCED)
    return ClaimResult(verdict, f, v)


def _c_small_amortize(r: SituationResult) -> ClaimResult:
    st, pg = r["static@256"], r["paged@256"]
    a, b = pg.s["throughput_tokens_per_s"], st.s["throughput_tokens_per_s"]
    v = {"paged_tok_s": a, "static_tok_s": b, "paged_mean_running": pg.mean_running(), "static_mean_running": st.mean_running(),
         "paged_ttft_p99": pg.s["ttft_s"]["p99"], "static_ttft_p99": st.s["ttft_s"]["p99"]}
    f = (f"max_num_seqs 256 at 20 req/s: paged {a:.0f} vs static {b:.0f} tok/s ({_rel(a, b):+.0%}), mean running "
         f"{v['paged_mean_running']:.0f} vs {v['static_mean_running']:.0f}, p99 TTFT {v['paged_ttft_p99']:.2f} vs "
         f"{v['static_ttft_p99']:.2f} s")
    return ClaimResult(REPRODUCED if a > b else NOT_REPRODUCED, f, v)


def _c_stream_jitter(r: SituationResult) -> ClaimResult:
    j = {n: r[n].measure.get("decode_jitter") for n in ("dynamic-token", "dynamic-chunk", "static", "paged")}
    v = {"jitter": j}
    f = ("decode-step jitter p99/p50: " + ", ".join(f"{n} {_g(x)}" for n, x in j.items())
         + " (the article's rule: act above 1.10)")
    a, b = j["dynamic-token"] or 0, j["static"] or 0
    f += (f"; token growth {'exceeds' if a > 1.1 else 'stays within'} the rule, static "
          f"{'stays within' if b <= 1.1 else 'exceeds'} it" + (" (narrowly: the steps are dominated by batch "
                                                               "composition, not allocation)" if a < 1.25 else ""))
    # Reproduced: token growth breaks the rule, static keeps it, and the gap is clear (≥ 20 %).
    verdict = REPRODUCED if a > 1.1 >= b and a >= 1.2 * b else PARTLY if a > b else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_stream_tail(r: SituationResult) -> ClaimResult:
    dt, st = r["dynamic-token"], r["static"]
    a, b = dt.s["e2e_s"]["p99"], st.s["e2e_s"]["p99"]
    v = {"dynamic_e2e_p99": a, "static_e2e_p99": b, "dynamic_e2e_p50": dt.s["e2e_s"]["p50"], "static_e2e_p50": st.s["e2e_s"]["p50"],
         "dynamic_alloc_s": dt.s["allocation_time_s"], "dynamic_copy_gib": dt.s["copy_bytes"] / GIB}
    f = (f"end-to-end p99: dynamic token growth {a * 1e3:.0f} ms vs static {b * 1e3:.0f} ms ({_ratio(a, b):.2f}×; article "
         f"2.1 s → 320 ms, 6.6×); p50 {v['dynamic_e2e_p50'] * 1e3:.0f} vs {v['static_e2e_p50'] * 1e3:.0f} ms. Token growth "
         f"charged {v['dynamic_alloc_s']:.2f} s of allocation work ({v['dynamic_copy_gib']:.0f} GiB of realloc copies) "
         f"over the whole run: spread over every step, not bunched into stalls")
    return ClaimResult(REPRODUCED if a > 3 * b else PARTLY if a > b else NOT_REPRODUCED, f, v)


def _c_stream_reserve(r: SituationResult) -> ClaimResult:
    st = r["static"]
    mean = st.mean_request_tokens()
    res = st.s["reserve_tokens"] or 0
    v = {"reserve_tokens": res, "mean_request_tokens": mean, "ratio": res / mean if mean else None,
         "static_waste": st.waste()}
    f = (f"static reserves {res} tokens per request vs {mean:.0f} on average ({v['ratio']:.1f}×; article: 4×); waste "
         f"{st.waste():.0%}")
    return ClaimResult(REPRODUCED if 3 <= v["ratio"] <= 6 else PARTLY, f, v)


def _c_offline_pack(r: SituationResult) -> ClaimResult:
    st, dc, pg = r["static"], r["dynamic+compaction"], r["paged"]
    a, b, c = dc.mean_running(), st.mean_running(), pg.mean_running()
    v = {"dynamic_compaction_mean_running": a, "static_mean_running": b, "paged_mean_running": c}
    f = (f"mean sequences per forward pass: dynamic + compaction {a:.0f}, static {b:.0f} ({_rel(a, b):+.0%}; article "
         f"+30 %), paged {c:.0f} ({_rel(c, b):+.0%})")
    return ClaimResult(REPRODUCED if a >= 1.3 * b else PARTLY if a > b else NOT_REPRODUCED, f, v)


def _c_offline_throughput(r: SituationResult) -> ClaimResult:
    names = ("static", "dynamic", "dynamic+compaction", "dynamic+aggressive-compaction", "paged")
    t = {n: r[n].s["throughput_tokens_per_s"] for n in names}
    best = max(t, key=t.get)
    loss = 1.0 - t["static"] / t[best]
    v = {"tok_s": t, "static_loss_vs_best": loss, "best": best,
         "dynamic_preemptions": r["dynamic+compaction"].s["preemptions"],
         "dynamic_stranded": r["dynamic+compaction"].s["stranded_refusals"]}
    f = ("throughput per GPU (tok/s): " + ", ".join(f"{n} {x:.0f}" for n, x in t.items())
         + f"; static is {loss:.0%} below the best ({best}; article: 40 % lower). Denser packing of contiguous extents "
           f"does not turn into throughput: dynamic + compaction strands {v['dynamic_stranded']} allocations and preempts "
           f"{v['dynamic_preemptions']} sequences (recompute)")
    verdict = REPRODUCED if 0.3 <= loss <= 0.5 else PARTLY if loss > 0.05 else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_offline_pause(r: SituationResult) -> ClaimResult:
    out = {}
    for n in ("dynamic+compaction", "dynamic+aggressive-compaction"):
        s = r[n].s
        out[n] = {"compactions": s["compactions"], "pause_s_per_1000": 1000 * s["compaction_time_s"] / max(s["completed"], 1),
                  "copied_gib": s["compaction_bytes"] / GIB}
    a = out["dynamic+compaction"]["pause_s_per_1000"]
    b = out["dynamic+aggressive-compaction"]["pause_s_per_1000"]
    f = (f"compaction pauses per 1,000 sequences: article thresholds (utilization < 70 %, fragmentation > 50 %) "
         f"{out['dynamic+compaction']['compactions']} compactions, {a:.2f} s; compacting whenever fragmentation > 20 % "
         f"{out['dynamic+aggressive-compaction']['compactions']} compactions, {b:.1f} s (article: 5–15 s). Under a full "
         f"arena the article's utilization gate keeps compaction off")
    verdict = REPRODUCED if 5 <= a <= 15 else PARTLY if 5 <= b <= 15 else NOT_REPRODUCED
    return ClaimResult(verdict, f, out)


def _c_budget_arith(r: SituationResult) -> ClaimResult:
    st = r["static"]
    cap = st.capacity_tokens_total
    slots = cap // st.s["reserve_tokens"]
    peak = st.peak_running()
    v = {"slots": slots, "peak_running": peak, "concurrency": 128, "capacity_gib": st.s["kv_capacity_bytes_per_replica"] / GIB}
    f = (f"{v['capacity_gib']:.1f} GiB of KV ÷ (4,096 tokens × 512 KiB) = {slots} static slots; peak running "
         f"{peak} while 128 sessions wait (article: 12 vs 20); static p50 TTFT {st.s['ttft_s']['p50']:.1f} s vs paged "
         f"{r['paged'].s['ttft_s']['p50']:.1f} s")
    return ClaimResult(REPRODUCED if slots < 32 and peak <= slots else NOT_REPRODUCED, f, v)


def _c_budget_breaker(r: SituationResult) -> ClaimResult:
    hr, pg = r["hybrid_reserve"], r["paged"]
    v = {"hybrid_preemptions": hr.s["preemptions"], "paged_preemptions": pg.s["preemptions"],
         "hybrid_ttft_p50": hr.s["ttft_s"]["p50"], "paged_ttft_p50": pg.s["ttft_s"]["p50"],
         "hybrid_ttft_p99": hr.s["ttft_s"]["p99"], "paged_ttft_p99": pg.s["ttft_s"]["p99"],
         "hybrid_paused_s": hr.s["admissions_paused_s"], "hybrid_tok_s": hr.s["throughput_tokens_per_s"],
         "paged_tok_s": pg.s["throughput_tokens_per_s"]}
    fewer = v["hybrid_preemptions"] < v["paged_preemptions"]
    queue = v["hybrid_ttft_p50"] > v["paged_ttft_p50"]
    f = (f"preemptions: hybrid_reserve {v['hybrid_preemptions']} vs paged {v['paged_preemptions']}; queueing: TTFT p50 "
         f"{v['hybrid_ttft_p50']:.1f} vs {v['paged_ttft_p50']:.1f} s ({_rel(v['hybrid_ttft_p50'], v['paged_ttft_p50']):+.0%}), "
         f"p99 {v['hybrid_ttft_p99']:.1f} vs {v['paged_ttft_p99']:.1f} s, admissions paused {v['hybrid_paused_s']:.2f} s; "
         f"throughput {v['hybrid_tok_s']:.0f} vs {v['paged_tok_s']:.0f} tok/s")
    verdict = REPRODUCED if fewer and queue else PARTLY if fewer else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_budget_swap(r: SituationResult) -> ClaimResult:
    sw, pg = r["paged-swap"], r["paged"]
    a, b = sw.s["e2e_s"]["p99"], pg.s["e2e_s"]["p99"]
    v = {"swap_e2e_p99": a, "recompute_e2e_p99": b, "swaps_out": sw.s["swaps_out"], "swap_alloc_s": sw.s["allocation_time_s"]}
    f = (f"paging preempted KV to host memory (swap, {v['swaps_out']} swaps out) vs recompute: e2e p99 {a:.1f} vs {b:.1f} s "
         f"({_ratio(a, b):.2f}×; article: 5× latency spike)")
    return ClaimResult(REPRODUCED if a > 3 * b else PARTLY if a > 1.1 * b else NOT_REPRODUCED, f, v)


def _c_encdec(r: SituationResult) -> ClaimResult:
    st, p95, pg = r["static"], r["static-p95"], r["paged"]
    v = {"static_waste": st.waste(), "static_p95_waste": p95.waste(), "paged_waste": pg.waste(),
         "static_tpot_p50": st.s["tpot_s"]["p50"], "paged_tpot_p50": pg.s["tpot_s"]["p50"],
         "static_ttft_p99": st.s["ttft_s"]["p99"], "paged_ttft_p99": pg.s["ttft_s"]["p99"],
         "static_goodput": st.goodput_per_gpu, "paged_goodput": pg.goodput_per_gpu,
         "p95_unserved": p95.s["rejected"] + p95.s["truncated"]}
    f = (f"input-heavy encoder-decoder: KV waste static {v['static_waste']:.0%}, static p95 {v['static_p95_waste']:.0%} "
         f"({v['p95_unserved']} refused or truncated), paged {v['paged_waste']:.1%}; TPOT p50 static "
         f"{v['static_tpot_p50'] * 1e3:.0f} ms vs paged {v['paged_tpot_p50'] * 1e3:.0f} ms (contiguous attention is "
         f"cheaper); p99 TTFT {v['static_ttft_p99']:.2f} vs {v['paged_ttft_p99']:.2f} s; goodput at load "
         f"{v['static_goodput']:.3g} vs {v['paged_goodput']:.3g} req/s/GPU")
    ok = v["static_goodput"] >= 0.95 * v["paged_goodput"]
    verdict = REPRODUCED if ok and v["static_waste"] < 0.3 else PARTLY if ok or v["static_tpot_p50"] < v["paged_tpot_p50"] else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_prefix_lfu(r: SituationResult) -> ClaimResult:
    lru, lfu = r["lru"], r["lfu"]
    a, b = lru.s.get("prefix_hit_rate"), lfu.s.get("prefix_hit_rate")
    v = {"lru_hit_rate": a, "lfu_hit_rate": b, "lru_ttft_p50": lru.s["ttft_s"]["p50"], "lfu_ttft_p50": lfu.s["ttft_s"]["p50"],
         "lru_ttft_p99": lru.s["ttft_s"]["p99"], "lfu_ttft_p99": lfu.s["ttft_s"]["p99"]}
    f = (f"prefix hit rate LRU {_pct(a, 1)} vs LFU {_pct(b, 1)}; TTFT p50 {v['lru_ttft_p50']:.2f} vs {v['lfu_ttft_p50']:.2f} s, "
         f"p99 {v['lru_ttft_p99']:.2f} vs {v['lfu_ttft_p99']:.2f} s (article: below 70 % switch to LFU)")
    if a is None or b is None:
        return ClaimResult(SKIPPED, "summary.json has no prefix_hit_rate yet", v)
    verdict = REPRODUCED if b > a + 0.01 else PARTLY if b >= a else NOT_REPRODUCED
    return ClaimResult(verdict, f, v)


def _c_prefix_ttft(r: SituationResult) -> ClaimResult:
    off, lru = r["no-prefix-cache"], r["lru"]
    a, b = lru.s["ttft_s"]["p50"], off.s["ttft_s"]["p50"]
    v = {"lru_ttft_p50": a, "off_ttft_p50": b, "lru_ttft_p99": lru.s["ttft_s"]["p99"], "off_ttft_p99": off.s["ttft_s"]["p99"],
         "lru_hit_rate": lru.s.get("prefix_hit_rate")}
    f = (f"TTFT p50 with prefix caching (LRU, hit rate {_pct(v['lru_hit_rate'], 1)}) {a:.2f} s vs without {b:.2f} s; p99 "
         f"{v['lru_ttft_p99']:.2f} vs {v['off_ttft_p99']:.2f} s")
    return ClaimResult(REPRODUCED if a < 0.9 * b else PARTLY if a < b else NOT_REPRODUCED, f, v)


def _long_threshold(run: Run) -> int:
    q = run.requests_np()
    return int(np.percentile(q["prompt"] + q["output"], 90))


def _c_worst_jitter(r: SituationResult) -> ClaimResult:
    w, b = r["paged"], r["paged-no-outliers"]
    v = {"with_tpot_p99": w.s["tpot_s"]["p99"], "without_tpot_p99": b.s["tpot_s"]["p99"],
         "with_jitter": w.measure.get("decode_jitter"), "without_jitter": b.measure.get("decode_jitter"),
         "with_ttft_p99": w.s["ttft_s"]["p99"], "without_ttft_p99": b.s["ttft_s"]["p99"],
         "with_preemptions": w.s["preemptions"]}
    f = (f"paged, 10 % outliers at 4× vs none: TPOT p99 {v['with_tpot_p99'] * 1e3:.0f} vs {v['without_tpot_p99'] * 1e3:.0f} ms, "
         f"decode jitter {_g(v['with_jitter'])} vs {_g(v['without_jitter'])}, TTFT p99 {v['with_ttft_p99']:.2f} vs "
         f"{v['without_ttft_p99']:.2f} s, {v['with_preemptions']} preemptions")
    worse = v["with_tpot_p99"] > 1.2 * v["without_tpot_p99"]
    return ClaimResult(REPRODUCED if worse else PARTLY if v["with_tpot_p99"] > v["without_tpot_p99"] else NOT_REPRODUCED, f, v)


def _c_hybrid_tail(r: SituationResult) -> ClaimResult:
    st, pg, hy = r["static"], r["paged"], r["hybrid_tail"]
    thr = _long_threshold(pg)
    lp, hp = pg.long_request_p99(thr), hy.long_request_p99(thr)
    v = {"static_waste": st.waste(), "hybrid_waste": hy.waste(), "paged_waste": pg.waste(),
         "static_reserved_gib_s": st.reserved_gib_s(), "hybrid_reserved_gib_s": hy.reserved_gib_s(),
         "threshold_tokens": thr, "paged_long_e2e_p99": lp[1], "hybrid_long_e2e_p99": hp[1],
         "paged_long_ttft_p99": lp[0], "hybrid_long_ttft_p99": hp[0], "long_requests": lp[2]}
    v["hybrid_ttft_p99_all"], v["paged_ttft_p99_all"] = hy.s["ttft_s"]["p99"], pg.s["ttft_s"]["p99"]
    mem = v["hybrid_waste"] < v["static_waste"]
    # Better long-request latency: e2e p99 at least 5 % lower without a TTFT p99 more than twice paged's.
    lat = (hp[1] or math.inf) < 0.95 * (lp[1] or math.inf) and (hp[0] or math.inf) <= 2 * (lp[0] or math.inf)
    f = (f"hybrid_tail vs static: KV waste {v['hybrid_waste']:.0%} vs {v['static_waste']:.0%}; vs paged on the "
         f"{lp[2]} requests longer than {thr} tokens (p90 of paged's run): e2e p99 {_g(hp[1])} vs {_g(lp[1])} s "
         f"({_rel(hp[1] or 0, lp[1] or 1):+.0%}), TTFT p99 {_g(hp[0])} vs {_g(lp[0])} s; all requests' TTFT p99 "
         f"{_g(v['hybrid_ttft_p99_all'])} vs {_g(v['paged_ttft_p99_all'])} s. The static partition (30 % of KV) holds "
         f"only a few max_model_len slots, and FCFS admission makes every request wait behind a long one waiting "
         f"for a slot (the predictor is an oracle of the true length: the best case for hybrid_tail)")
    return ClaimResult(REPRODUCED if mem and lat else PARTLY if mem or lat else NOT_REPRODUCED, f, v)


def _c_p95(r: SituationResult) -> ClaimResult:
    mx, p95 = r["static-max"], r["static-p95"]
    a, b = mx.waste(), p95.waste()
    rel = 1.0 - b / a
    wasted_max = mx.reserved_gib_s() * a
    wasted_p95 = p95.reserved_gib_s() * b
    bytes_cut = 1.0 - wasted_p95 / wasted_max if wasted_max else 0.0
    unserved = p95.s["rejected"] + p95.s["truncated"]
    v = {"max_waste": a, "p95_waste": b, "relative_cut": rel, "points_cut": a - b, "wasted_gib_s_cut": bytes_cut,
         "p95_reserve": p95.s["reserve_tokens"], "max_reserve": mx.s["reserve_tokens"], "p95_unserved": unserved,
         "requests": p95.s["requests"]}
    f = (f"static at p95 ({v['p95_reserve']} tokens) vs at max_model_len ({v['max_reserve']}): waste fraction "
         f"{a:.0%} → {b:.0%} ({rel:.0%} relative, {a - b:.0%} points; article ~30 %); wasted GiB·s cut by "
         f"{bytes_cut:.0%}; cost: {unserved} of {v['requests']} requests refused or truncated")
    return ClaimResult(REPRODUCED if 0.2 <= rel <= 0.4 else PARTLY if rel > 0 else NOT_REPRODUCED, f, v)


def _c_p95_misses(r: SituationResult) -> ClaimResult:
    p95 = r["static-p95"]
    s = p95.s
    frac = (s["rejected"] + s["truncated"]) / s["requests"]
    v = {"rejected": s["rejected"], "truncated": s["truncated"], "fraction": frac}
    f = (f"static p95: {s['rejected']} prompts longer than the reservation refused, {s['truncated']} answers truncated: "
         f"{frac:.1%} of requests (a p95 ceiling misses ~5 % by construction)")
    return ClaimResult(REPRODUCED if frac <= 0.02 else PARTLY if frac <= 0.06 else NOT_REPRODUCED, f, v)


# --- extra columns -----------------------------------------------------------------------

def _x_gate(run: Run, r: "SituationResult" = None) -> str:
    return f"{run.gate_reserved_gib():.1f}"


def _x_alloc(run: Run, r: "SituationResult" = None) -> str:
    return f"{run.alloc_ms_per_iteration():.3f}"


def _x_copy(run: Run, r: "SituationResult" = None) -> str:
    return f"{run.s['copy_bytes'] / GIB:.0f}"


def _x_comp(run: Run, r: "SituationResult" = None) -> str:
    s = run.s
    return f"{s['compactions']} / {s['compaction_time_s']:.2f}"


def _x_hit(run: Run, r: "SituationResult" = None) -> str:
    return _pct(run.s.get("prefix_hit_rate"), 1)


def _x_paused(run: Run, r: "SituationResult" = None) -> str:
    return f"{run.s['admissions_paused_s']:.2f}"


def _x_peak(run: Run, r: "SituationResult" = None) -> str:
    return str(run.peak_running())


def _x_swaps(run: Run, r: "SituationResult" = None) -> str:
    return f"{run.s['swaps_out']}"


def _x_reserve(run: Run, r: "SituationResult" = None) -> str:
    return str(run.s.get("reserve_tokens") or "-")


def _x_long(run: Run, r: "SituationResult") -> str:
    _, e2e, n = run.long_request_p99(_long_threshold(r.runs["paged"]))
    return f"{_g(e2e)} ({n})"


def _model_available(name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        from sim.catalog import MODELS
        return None if name in MODELS else (f"model {name!r} is not in the catalog yet (kvsim list models); the scenario "
                                            f"is written for it and runs once it is added")
    return check


def _needs_prefix_hit_rate(run: Run) -> str | None:
    if "prefix_hit_rate" not in run.summary:
        return ("allocator.prefix_caching is not wired into the engine yet: summary.json has no prefix_hit_rate, and "
                "enabling it changes nothing")
    return None


# --- the situations ------------------------------------------------------------------------

def _v(name: str, strategy: str, contrast: bool = False, **over) -> Variant:
    return Variant(name, {k.replace("__", "."): v for k, v in over.items()}, strategy, contrast)


_STATIC = {"allocator__kind": "static", "allocator__reserve": "max_model_len", "allocator__overflow": "reject"}
_STATIC_P95 = {"allocator__kind": "static", "allocator__reserve": "p95", "allocator__overflow": "truncate"}
_PAGED = {"allocator__kind": "paged", "allocator__block_size": 16}
_DYN_CHUNK = {"allocator__kind": "dynamic", "allocator__growth": "chunk", "allocator__chunk_tokens": 512,
              "allocator__compaction__enabled": False}
_DYN_TOKEN = {"allocator__kind": "dynamic", "allocator__growth": "token", "allocator__compaction__enabled": False}


def _replay(kind: str, number: str) -> Situation:
    return Situation(
        f"azure-{kind}-replay", number, f"Replay of the Azure 2023 {kind} trace",
        f"azure-{kind}-replay",
        "Real arrivals and lengths at the recorded rate (and 4× faster, contrast rows): what does each strategy "
        "cost on production traffic?",
        (_v("static", "static: reserve max_model_len", **_STATIC),
         _v("static-p95", "static at the p95 length, longer requests truncated", **_STATIC_P95),
         _v("dynamic", "dynamic contiguous growth in 512-token chunks", **_DYN_CHUNK),
         _v("paged", "paged block pool (16 tokens)", **_PAGED),
         _v("hybrid_tail", "hybrid: static floor for the p90+ tail, paged rest", allocator__kind="hybrid_tail"),
         _v("static@4x", "static, trace replayed 4× faster", True, workload__arrival__time_scale=0.25, **_STATIC),
         _v("paged@4x", "paged, trace replayed 4× faster", True, workload__arrival__time_scale=0.25, **_PAGED)),
        SLO(ttft_s=1.0, tpot_s=0.05),
        (Claim(f"{kind}-static-waste", "Static allocation often wastes 40-60% of memory because every sequence is padded "
                                       "to the configured maximum length (Step 1).", _c_var_static_waste),
         Claim(f"{kind}-paged-waste", "A page pool (PagedAttention) removes the padding: little memory is left unused.",
               _paged_waste(("paged", "paged@4x")))),
        extra=(("reserve (tokens)", _x_reserve), ("peak running", _x_peak)),
    )


SITUATIONS: tuple[Situation, ...] = (
    Situation(
        "high-throughput-burst", "1", "High-throughput API, bursty short prompts", "high-throughput-burst",
        "Does a fixed 4K-token slot per request shrink the effective batch and blow up p99 TTFT when a burst of short "
        "prompts arrives, compared with a paged pool?",
        (_v("static-4k", "static: a 4,096-token slot per request", allocator__kind="static", allocator__reserve=4096,
            allocator__overflow="reject"),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(ttft_s=0.5, tpot_s=0.05),
        (Claim("burst-batch", "Every request claims a fixed 4K slot: you waste memory on padding and the effective batch "
                              "size shrinks.", _c_burst_batch),
         Claim("burst-tail", "What breaks first is tail latency: p99 drifts from 120 ms to over a second.", _c_burst_tail),
         Claim("burst-throughput", "...and throughput collapses.", _c_burst_throughput)),
        extra=(("mean running", lambda r, _=None: f"{r.mean_running():.1f}"), ("peak running", _x_peak)),
    ),
    Situation(
        "long-context", "2", "Long context: ten concurrent 16K prompts", "long-context",
        "Static full-context reservation vs dynamic growth token by token vs in 512-token chunks vs paged: prefill "
        "latency, memory at the gate, per-step allocation cost, p99 generation time.",
        (_v("static", "static: reserve the full 32K context per request", **_STATIC),
         _v("dynamic-token", "dynamic contiguous growth, token by token", **_DYN_TOKEN),
         _v("dynamic-chunk", "dynamic contiguous growth in 512-token chunks", **_DYN_CHUNK),
         _v("paged", "paged pool, generation counter on page reuse", allocator__page_reuse="generation", **_PAGED),
         _v("paged-zero", "paged pool, zero-fill on page reuse", allocator__page_reuse="zero", **_PAGED)),
        SLO(ttft_s=15.0, tpot_s=0.06),
        (Claim("long-gate", "Run ten 16K prompts concurrently and the KV footprint balloons past 40 GB before you compute a "
                            "single output token.", _c_long_gate),
         Claim("long-waste", "Dynamic allocation - slots that expand only as the sequence grows - cuts wasted memory by "
                             "40-60 %.", _c_long_waste),
         Claim("long-prefill", "Prefill latency doubles because the allocator is busy zeroing pages that will never hold "
                               "real tokens (static reservation).", _c_long_prefill),
         Claim("long-step-cost", "Dynamic growth introduces allocation overhead per token step; pre-allocating in coarse "
                                 "chunks (every 512 tokens) instead of token-by-token avoids it.", _c_long_step_cost),
         Claim("long-p99", "Chunked pre-allocation cut their p99 generation time by 18 %.", _c_long_p99),
         Claim("long-zero", "Use a generation counter instead of zero-filling freed pages: allocation time dropped 40 % "
                            "(Step 3).", _c_long_zero)),
        extra=(("KV at gate (GiB)", _x_gate), ("alloc ms / iteration", _x_alloc), ("copied (GiB)", _x_copy)),
    ),
    Situation(
        "variable-length-batch", "3", "Variable-length batch: 128 / 2,048 / 14,000-token prompts", "variable-length-batch",
        "Static reservation rounded up to the longest sequence vs dynamic contiguous growth vs paged: waste, utilization, "
        "stranded memory and 'sporadic OOM'.",
        (_v("static", "static: reserve max_model_len (16,384) per request", **_STATIC),
         _v("dynamic", "dynamic contiguous growth in 512-token chunks (first fit)", **_DYN_CHUNK),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(ttft_s=2.0, tpot_s=0.1),
        (Claim("var-static-waste", "Static allocation rounds up to the longest sequence: it often wastes 40-60 % of memory.",
               _c_var_static_waste),
         Claim("var-paged-waste", "PagedAttention and similar schemes solve fragmentation.", _paged_waste(("paged",))),
         Claim("var-util", "The symptom: GPU utilization hovers around 30 %.", _c_var_util),
         Claim("var-stranded", "OOM errors appear sporadically: the allocator fragmented the cache across uneven slot "
                               "sizes, leaving stranded memory no single new sequence can fit into.", _c_var_stranded)),
        extra=(("stranded refusals", lambda r, _=None: str(r.s["stranded_refusals"])), ("copied (GiB)", _x_copy)),
    ),
    Situation(
        "small-batch", "4", "Small batches (≤ 8 sequences)", "small-batch",
        "Does paged attention's indirection cost more than fragmentation saves when at most 8 sequences run? (Contrast "
        "rows: 256 sequences at 20 req/s.)",
        (_v("static", "static: reserve max_model_len (8,192)", **_STATIC),
         _v("paged", "paged block pool (16 tokens)", **_PAGED),
         _v("static@256", "static, max_num_seqs 256 at 20 req/s", True, scheduler__max_num_seqs=256,
            workload__arrival__rate=20.0, **_STATIC),
         _v("paged@256", "paged, max_num_seqs 256 at 20 req/s", True, scheduler__max_num_seqs=256,
            workload__arrival__rate=20.0, **_PAGED)),
        SLO(ttft_s=1.0, tpot_s=0.02),
        (Claim("small-overhead", "On small batches (≤ 8 sequences) the paged-attention overhead can exceed the "
                                 "fragmentation savings.", _c_small_overhead),
         Claim("small-amortize", "Teams saw no improvement from vLLM's dynamic cache because their batch was too small "
                                 "for the overhead to amortize (it does at large batches).", _c_small_amortize)),
        extra=(("mean running", lambda r, _=None: f"{r.mean_running():.1f}"),),
    ),
    Situation(
        "streaming-chatbot", "5", "Streaming chatbot, 50-token answers", "streaming-chatbot",
        "Does dynamic token-by-token growth jitter the decode steps, and does static max-length reservation smooth the "
        "tail?",
        (_v("dynamic-token", "dynamic contiguous growth, token by token", **_DYN_TOKEN),
         _v("dynamic-chunk", "dynamic contiguous growth in 512-token chunks", **_DYN_CHUNK),
         _v("static", "static: reserve max_model_len (2,048)", **_STATIC),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(ttft_s=0.2, tpot_s=0.015),
        (Claim("stream-jitter", "Each output token triggers a reallocation, which jitters latency unpredictably; static "
                                "wins where allocation jitter is unacceptable.", _c_stream_jitter),
         Claim("stream-tail", "A chatbot returning 50 tokens: median 200 ms, p99 2.1 s with a dynamic KV cache; static "
                              "pre-allocation smoothed the tail to 320 ms.", _c_stream_tail),
         Claim("stream-reserve", "Cost? We reserved 4× the average memory per request.", _c_stream_reserve)),
        extra=(("jitter p99/p50", lambda r, _=None: _g(r.measure.get("decode_jitter"))), ("alloc ms / iteration", _x_alloc),
               ("copied (GiB)", _x_copy)),
    ),
    Situation(
        "batch-offline", "6", "Batch offline: packing density, compaction pauses", "batch-offline",
        "Does dynamic allocation with compaction pack more sequences per GPU than static over-reservation, and what do "
        "the compaction pauses cost?",
        (_v("static", "static: reserve max_model_len (8,192)", **_STATIC),
         _v("dynamic", "dynamic contiguous growth (512-token chunks), no compaction", **_DYN_CHUNK),
         _v("dynamic+compaction", "dynamic + stall compaction at the article's thresholds (util < 70 %, frag > 50 %)",
            allocator__kind="dynamic", allocator__growth="chunk", allocator__compaction__enabled=True),
         _v("dynamic+aggressive-compaction", "dynamic + stall compaction whenever fragmentation > 20 %",
            allocator__kind="dynamic", allocator__growth="chunk", allocator__compaction__enabled=True,
            allocator__compaction__below_utilization=1.0, allocator__compaction__above_fragmentation=0.2),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(e2e_s=300.0),
        (Claim("offline-pack", "Dynamic allocation with slab reclaim can pack 30 % more sequences into the same VRAM "
                               "compared to static over-reservation.", _c_offline_pack),
         Claim("offline-pause", "The trade-off: a compaction pause of 5-15 seconds per thousand sequences.", _c_offline_pause),
         Claim("offline-throughput", "Applying the latency service's (static) config offline: throughput is 40 % lower.",
               _c_offline_throughput)),
        extra=(("mean running", lambda r, _=None: f"{r.mean_running():.0f}"), ("compactions / pause s", _x_comp),
               ("stranded refusals", lambda r, _=None: str(r.s["stranded_refusals"]))),
    ),
    Situation(
        "hard-memory-budget", "7", "Hard memory budget: 48 GiB on 4 cards, 128 sessions", "hard-memory-budget",
        "Plain paged (preempt by recompute) vs hybrid_reserve (emergency reserve + preemption threshold + admission "
        "breaker) vs static slots vs swapping to host memory.",
        (_v("static", "static: reserve max_model_len (4,096)", **_STATIC),
         _v("paged", "paged pool, preemption by recompute", **_PAGED),
         _v("paged-swap", "paged pool, preemption by swap to host memory", allocator__preemption__mode="swap", **_PAGED),
         _v("hybrid_reserve", "hybrid: 15 % reserve + preempt at 95 % + admission breaker at 10 % free",
            allocator__kind="hybrid_reserve")),
        SLO(ttft_s=25.0, tpot_s=0.1),
        (Claim("budget-arith", "Static: max sequences = budget ÷ (max length × per-token KV); if that is 12 and "
                               "concurrency is 20 you drop or queue requests.", _c_budget_arith),
         Claim("budget-breaker", "Reserve a static emergency pool and wrap dynamic allocation in a circuit breaker that "
                                 "pauses new requests: that adds queueing latency and saves the card from OOM "
                                 "(fewer preemptions).", _c_budget_breaker),
         Claim("budget-swap", "Teams page KV caches to CPU RAM and watch latency spike 5×.", _c_budget_swap)),
        extra=(("peak running", _x_peak), ("paused s", _x_paused), ("swaps out", _x_swaps)),
    ),
    Situation(
        "encoder-decoder", "8", "Encoder-decoder (T5-class)", "encoder-decoder",
        "With the encoder's cache held for the whole decode, input ≫ output: does a fixed (static) block make sense, or "
        "does a paged pool win?",
        (_v("static", "static: reserve max_model_len (4,096)", **_STATIC),
         _v("static-p95", "static at the p95 length, longer requests truncated", **_STATIC_P95),
         _v("dynamic", "dynamic contiguous growth in 512-token chunks", **_DYN_CHUNK),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(ttft_s=2.0, tpot_s=0.1),
        (Claim("encdec-static", "Encoder-heavy models can reserve a fixed block (static pre-allocation makes sense); "
                                "decoder-only runs demand adaptive room.", _c_encdec),),
        unavailable=_model_available("flan-t5-xl"),
    ),
    Situation(
        "shared-prefix", "9", "Shared prefixes (RAG, multi-turn): prefix caching", "shared-prefix",
        "Prefix-cache hit rate and TTFT on the Mooncake trace; LRU vs LFU eviction.",
        (_v("no-prefix-cache", "paged, no prefix caching", allocator__prefix_caching__enabled=False, **_PAGED),
         _v("lru", "paged + prefix caching, LRU eviction", allocator__prefix_caching__enabled=True,
            allocator__prefix_caching__eviction="lru", **_PAGED),
         _v("lfu", "paged + prefix caching, LFU eviction", allocator__prefix_caching__enabled=True,
            allocator__prefix_caching__eviction="lfu", **_PAGED)),
        SLO(ttft_s=2.0, tpot_s=0.05),
        (Claim("prefix-ttft", "Reused prefixes (cache hits) save recomputation.", _c_prefix_ttft),
         Claim("prefix-lfu", "When the hit rate drops below 70 %, LRU is dumping prefixes that repeat: switch to a "
                             "frequency-aware policy (LFU).", _c_prefix_lfu)),
        extra=(("prefix hit rate", _x_hit),),
        incomplete=_needs_prefix_hit_rate,
    ),
    Situation(
        "worst-case-outliers", "10", "Worst case: 10 % of requests at 4× the median", "worst-case-outliers",
        "How much do 4× outliers hurt, and does a separate static pool for the long tail (hybrid_tail) or a plain paged "
        "pool with preemption handle them better? (Contrast row: no outliers.)",
        (_v("static", "static: reserve max_model_len (16,384)", **_STATIC),
         _v("paged", "paged pool, preemption by recompute", **_PAGED),
         _v("hybrid_tail", "hybrid: static max_model_len slots (30 % of KV) for the p90+ tail, paged rest",
            allocator__kind="hybrid_tail"),
         _v("paged-no-outliers", "paged, outlier_fraction 0", True, workload__lengths__outlier_fraction=0.0, **_PAGED)),
        SLO(ttft_s=1.0, tpot_s=0.05),
        (Claim("worst-jitter", "Run a mix where 10 % of sequences are 4× the median: latency jitter jumps; the seam blows "
                               "out on the outlier, not the average.", _c_worst_jitter),
         Claim("worst-hybrid", "Pin a static floor for the top 10 % of lengths and let dynamic allocation handle the rest "
                               "(hybrid_tail): less waste than pure static, better long-request latency than pure "
                               "dynamic.", _c_hybrid_tail)),
        extra=(("requests above the p90 length: e2e p99 s (n)", _x_long),),
    ),
    Situation(
        "peak-vs-average", "11", "Peak vs average: reserve at max vs at p95", "peak-vs-average",
        "Static reservation at max_model_len vs one notch above p95 (overflow truncated) vs p99 vs paged.",
        (_v("static-max", "static: reserve max_model_len (16,384)", **_STATIC),
         _v("static-p95", "static at the p95 length, longer requests truncated", **_STATIC_P95),
         _v("static-p99", "static at the p99 length, longer requests truncated", allocator__kind="static",
            allocator__reserve="p99", allocator__overflow="truncate"),
         _v("paged", "paged block pool (16 tokens)", **_PAGED)),
        SLO(ttft_s=0.5, tpot_s=0.03),
        (Claim("p95-waste", "Set the static ceiling one notch above your measured p95 sequence length - not the absolute "
                            "max. That cuts waste by roughly 30 %.", _c_p95),
         Claim("p95-misses", "...while keeping cache misses rare enough to handle with a fallback.", _c_p95_misses)),
        extra=(("reserve (tokens)", _x_reserve),),
    ),
    _replay("conv", "12a"),
    _replay("code", "12b"),
)

BY_KEY = {s.key: s for s in SITUATIONS}


# --- running -------------------------------------------------------------------------------

_CACHE: dict[tuple, Run] = {}


def run_variant(sit: Situation, variant: Variant, num_requests: int | None = None) -> Run:
    """Simulate one variant of a situation (cached per process: tests and the guide share runs)."""
    key = (sit.scenario, variant.name, tuple(sorted(variant.overrides.items())), num_requests)
    if key in _CACHE:
        return _CACHE[key]
    from sim.engine.cluster import simulate
    from sim.config import load_scenario
    over = dict(variant.overrides)
    if num_requests is not None:
        over["workload.num_requests"] = num_requests
    sc = load_scenario(sit.scenario, over)
    t0 = time.perf_counter()
    res = simulate(sc)
    from sim.analysis.planner import measure
    gpus = sc.gpu.replicas * sc.gpu.tensor_parallel
    m = measure(res, sit.slo)
    s = res.summary
    met = float(m["attainment"]) * s["requests"]
    run = Run(variant, s, res.requests, res.timeseries, m, m["attainment"],
              met / s["makespan_s"] / gpus if s["makespan_s"] else 0.0, gpus,
              int(s["kv_capacity_bytes_per_replica"] // s["kv_bytes_per_token"]) * sc.gpu.replicas,
              time.perf_counter() - t0)
    _CACHE[key] = run
    return run


def run_situation(sit: Situation | str, num_requests: int | None = None) -> SituationResult:
    """Every variant of a situation, its claims and the planner's recommendation."""
    if isinstance(sit, str):
        sit = BY_KEY[sit]
    t0 = time.perf_counter()
    if sit.unavailable is not None:
        why = sit.unavailable()
        if why:
            return SituationResult(sit, {}, skipped=why, num_requests=num_requests)
    runs: dict[str, Run] = {}
    for v in sit.variants:
        runs[v.name] = run_variant(sit, v, num_requests)
        if sit.incomplete is not None and len(runs) == 1:
            # Probe with a variant that should show the feature; the first may be the 'off' baseline.
            probe = run_variant(sit, sit.variants[-1], num_requests)
            why = sit.incomplete(probe)
            if why:
                return SituationResult(sit, {}, skipped=why, num_requests=num_requests)
    r = SituationResult(sit, runs, num_requests=num_requests)
    r.claims = [(c, _safe_check(c, r)) for c in sit.claims]
    r.recommendation = recommendation(r)
    r.wall_s = time.perf_counter() - t0
    return r


def partial_result(sit: Situation | str, names: list[str], num_requests: int | None = None) -> SituationResult:
    """Only the named variants of a situation (for tests: a claim needs only some of them)."""
    if isinstance(sit, str):
        sit = BY_KEY[sit]
    by = {v.name: v for v in sit.variants}
    return SituationResult(sit, {n: run_variant(sit, by[n], num_requests) for n in names}, num_requests=num_requests)


def claim(sit: Situation | str, claim_id: str) -> Claim:
    if isinstance(sit, str):
        sit = BY_KEY[sit]
    return next(c for c in sit.claims if c.id == claim_id)


def _safe_check(c: Claim, r: SituationResult) -> ClaimResult:
    try:
        return c.check(r)
    except Exception as exc:  # a check that cannot compute (e.g. an empty run at a tiny size) says so
        return ClaimResult(SKIPPED, f"could not be checked: {type(exc).__name__}: {exc}")


def recommendation(r: SituationResult) -> dict:
    """The goodput planner's recommendation (:func:`sim.analysis.planner.recommend`) over the non-contrast
    variants, with goodput = SLO-meeting requests/s per GPU at the scenario's load."""
    from sim.analysis.planner import recommend
    sit = r.situation
    cands = []
    first = None
    for v in sit.variants:
        if v.contrast:
            continue
        run = r.runs[v.name]
        first = first or run
        g = run.goodput_per_gpu * run.gpus
        op = {"rate": None, "replicas": None, **run.measure}
        c = {"name": v.name, "strategy": v.strategy, "overrides": v.overrides, "status": "ok" if g > 0 else "infeasible",
             "goodput_rps": g, "goodput_per_gpu_rps": run.goodput_per_gpu, "gpus": run.gpus, "operating_point": op,
             "message": "" if g > 0 else (f"at the scenario's load only {run.attainment:.0%} of requests meet the SLO "
                                          f"({op['rejected']} rejected, {op['truncated']} truncated)")}
        cands.append(c)
    p = {"tolerance": 0.05, "target_rate": None, "candidates": cands, "slo_text": sit.slo.describe(),
         "gpu": _gpu_text(sit), "tensor_parallel": None}
    rec = recommend(p)
    if rec["candidate"] is not None:
        best = next(c for c in cands if c["name"] == rec["candidate"])
        run = r.runs[best["name"]]
        knobs = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
        rec["text"] = (f"Use {best['name']} — {best['strategy']} (set {knobs}): {run.attainment:.0%} of requests meet the "
                       f"SLO at the scenario's load, goodput at load {run.goodput_per_gpu:.3g} req/s per GPU.")
    else:
        rec["text"] = ("No variant gets any request within the SLO at the scenario's load: relax the SLO, add memory or "
                       "lower the load.")
    return rec


def _gpu_text(sit: Situation) -> str:
    from sim.config import load_scenario
    sc = load_scenario(sit.scenario)
    return f"{sc.gpu.replicas} × {sc.gpu.name} (TP{sc.gpu.tensor_parallel})"


def run_all(num_requests: int | None = None, progress: Callable[[str, SituationResult], None] | None = None
            ) -> list[SituationResult]:
    out = []
    for sit in SITUATIONS:
        r = run_situation(sit, num_requests)
        out.append(r)
        if progress:
            progress(sit.key, r)
    return out


# --- rendering -----------------------------------------------------------------------------

_COLS = ["variant", "TTFT p50 / p99 s", "TPOT p50 / p99 ms", "tok/s per GPU", "SLO attain.", "goodput at load req/s/GPU",
         "KV waste", "KV mem util", "ext. frag", "preempt", "rejected / trunc."]


def _row(run: Run) -> list[str]:
    s = run.summary
    rej = s["rejected"]
    return [
        f"`{run.variant.name}`" + (" (contrast)" if run.variant.contrast else ""),
        f"{_g(s['ttft_s']['p50'])} / {_g(s['ttft_s']['p99'])}",
        f"{_g((s['tpot_s']['p50'] or 0) * 1e3)} / {_g((s['tpot_s']['p99'] or 0) * 1e3)}",
        f"{s['throughput_tokens_per_s'] / run.gpus:.0f}",
        _pct(run.attainment, 1),
        _g(run.goodput_per_gpu),
        _pct(run.waste(), 1),
        _pct(s["kv_memory_utilization"], 1),
        _pct(s["kv_external_fragmentation"], 1),
        str(s["preemptions"]),
        f"{rej} / {s['truncated']}",
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def _scenario_facts(sit: Situation, num_requests: int | None) -> str:
    from sim.config import load_scenario
    over = {"workload.num_requests": num_requests} if num_requests else {}
    sc = load_scenario(sit.scenario, over)
    a = sc.workload.arrival
    arr = {"poisson": lambda: f"Poisson {a.rate:g} req/s", "gamma": lambda: f"gamma {a.rate:g} req/s, cv {a.cv:g}",
           "trace": lambda: f"trace replay (time_scale {a.time_scale:g})",
           "closed_loop": lambda: f"closed loop, {a.concurrency} clients"}[a.kind]()
    return (f"`scenarios/{sit.scenario}.yaml` — {sc.model.name} on {sc.gpu.replicas} × {sc.gpu.name} "
            f"(TP{sc.gpu.tensor_parallel}, gpu_memory_utilization {sc.gpu.gpu_memory_utilization:g}), {arr}, "
            f"{sc.workload.num_requests} requests, max_model_len {sc.workload.max_model_len:,}, max_num_seqs "
            f"{sc.scheduler.max_num_seqs}")


def render(results: list[SituationResult], num_requests: int | None = None) -> str:
    L: list[str] = []
    L += ["# Decision guide: static vs dynamic KV-cache allocation, situation by situation", "",
          "Generated by `kvsim guide` (`sim/analysis/guide.py`) from fresh simulations of the scenarios in `scenarios/`; do not "
          "edit by hand. Each section is one situation of the seed article *When KV Cache Management Becomes the "
          "Bottleneck* (`/work/shared/seed/kv-cache-static-vs-dynamic.txt`): the scenario, a table per allocator "
          "variant, the recommendation of the goodput planner's rules (`sim.analysis.planner.recommend`) with its reasons, and "
          "the article's claims checked against the simulation, with the numbers.", ""]
    if num_requests:
        L += [f"**Reduced size:** every scenario ran with `workload.num_requests={num_requests}`.", ""]
    L += ["**Columns.** TTFT/TPOT percentiles over completed requests. *tok/s per GPU*: prompt + output tokens per "
          "second ÷ GPUs. *SLO attain.*: requests meeting the situation's SLO ÷ all requests (rejected and truncated "
          "ones miss), at the scenario's own load. *Goodput at load*: SLO-meeting requests ÷ makespan ÷ GPUs — not "
          "the planner's goodput search (highest rate that meets the SLO: `kvsim plan`), which would cost ~10 "
          "simulations per row and is undefined for closed-loop and trace arrivals; in the recommendation's reasons "
          "'goodput' means this at-load figure. *KV waste*: 1 − used ÷ reserved KV, time-weighted (reserved memory that "
          "holds no token). *KV mem util*: used ÷ capacity over the makespan. *Ext. frag*: 1 − largest free extent ÷ "
          "free, time-weighted (free memory no single new sequence can take). *Jitter*: p99 ÷ p50 of decode-only step "
          "times (timeseries `first_step_s`). Contrast rows are context (another load or workload), not candidates.", "",
          "**Verdicts.** *reproduced*: the simulation finds the article's direction and magnitude; *partly*: the "
          "direction but not the magnitude, or only for some of the strategies; *did not reproduce*: no effect or the "
          "opposite; *skipped*: the feature is not in this build yet. The simulator was not tuned to agree: scenario "
          "defaults, seed 1.", ""]
    # Summary of claims.
    L += ["## Claims at a glance", ""]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.situation.number, r.situation.title, "-", SKIPPED, r.skipped])
            continue
        for c, cr in r.claims:
            rows.append([r.situation.number, r.situation.title, c.id, cr.verdict, cr.finding])
    L += _table(["#", "situation", "claim", "verdict", "finding"], rows) + [""]
    counts: dict[str, int] = {}
    for r in results:
        for _, cr in r.claims:
            counts[cr.verdict] = counts.get(cr.verdict, 0) + 1
    L += ["Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    for r in results:
        sit = r.situation
        L += [f"## {sit.number}. {sit.title}", "", f"**Question.** {sit.question}", "", _scenario_facts(sit, num_requests), ""]
        if r.skipped:
            L += [f"**Skipped:** {r.skipped}.", ""]
            continue
        cms = sorted({f"`{run.summary['cost_model']}`" + ("" if run.summary["cost_model_calibrated"] else " (uncalibrated roofline prior)")
                      for run in r.runs.values()})
        L += [f"SLO: {sit.slo.describe()}. Cost model (summary `cost_model`): {', '.join(cms)}.", ""]
        L += _table(_COLS, [_row(run) for run in r.runs.values()]) + [""]
        if sit.extra:
            hdr = ["variant"] + [h for h, _ in sit.extra]
            L += _table(hdr, [[f"`{run.variant.name}`"] + [fn(run, r) for _, fn in sit.extra] for run in r.runs.values()])
            L += [""]
        rec = r.recommendation or {}
        L += [f"**Recommendation (planner rules, at the scenario's load).** {rec.get('text', '-')}", ""]
        L += [f"- {x}" for x in rec.get("reasons", [])] + [""]
        L += ["**The article's claims here.**", ""]
        L += _table(["claim", "the article", "verdict", "what the simulation finds"],
                    [[c.id, c.article, f"**{cr.verdict}**", cr.finding] for c, cr in r.claims]) + [""]
    L += ["## Reproducing", "", "```bash", ".venv/bin/kvsim guide                      # all situations, scenario defaults",
          ".venv/bin/kvsim guide --num-requests 200    # quicker, noisier", "```", "",
          "Each situation's scenario runs alone too (`kvsim run scenarios/<name>.yaml`; its header comment lists the "
          "`--set` overrides of every variant). `tests/test_claims.py` asserts the direction of every finding above.", ""]
    return "\n".join(L)


def write_guide(out: str | Path = DEFAULT_OUT, num_requests: int | None = None,
                progress: Callable[[str, SituationResult], None] | None = None) -> tuple[Path, list[SituationResult]]:
    results = run_all(num_requests, progress)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, num_requests))
    return out, results


def guide_command(
    out: Path = typer.Option(DEFAULT_OUT, "--out", "-o", help="Markdown file to write."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "-n", min=1,
                                               help="Override workload.num_requests of every scenario (quicker, noisier)."),
):
    """Simulate every situation of the seed article and write the decision guide (docs/decision-guide.md)."""
    import sys
    t0 = time.perf_counter()

    def progress(key: str, r: SituationResult) -> None:
        verdicts = ", ".join(cr.verdict for _, cr in r.claims) or (f"skipped: {r.skipped}" if r.skipped else "-")
        sys.stderr.write(f"{key}: {r.wall_s:.1f} s — {verdicts}\n")

    if isinstance(out, typer.models.OptionInfo):  # called as a plain function
        out = DEFAULT_OUT
    if isinstance(num_requests, typer.models.OptionInfo):
        num_requests = None
    from sim.output.staging import out_file
    out = out_file(out)
    path, _ = write_guide(out, num_requests, progress)
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
