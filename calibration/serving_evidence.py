"""What a benchmark file's runs say beyond their errors: about their benchmark, and about the server.

* Groups that look mis-measured (docs/calibration.md, *Groups that look mis-measured*): runs
  faster than their engine's kernels (:func:`faster_than_kernels`, :func:`runs_faster_than_kernels`,
  :func:`least_cached_share`), clients that cannot have started together (:func:`clients_apart`),
  TTFT that follows completions (:func:`ttft_follows_completions`), and the treatment of each
  (:func:`cache_flagged`, :func:`spread_flagged`, :func:`hold_back_flagged`), which reads the
  group's own measured times;
* where the errors come from (:func:`tpot_error_split`, :func:`ttft_vs_prefill`, :func:`tp_scaling`,
  :func:`gpu_shares`, :func:`prompt_costs`) and what KV capacity the runs held
  (:func:`kv_capacity_evidence`, :func:`kv_from_runs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from sim.config import APART_SPREAD_CYCLES
from sim.errors import ConfigError

from .serving_bench import BenchRow
from .serving_runs import RowResult, row_scenario


def completion_gap_ratios(rows: Iterable[BenchRow], max_concurrency: int = 32) -> dict[tuple[str, int, int], float]:
    """Median TTFT ÷ (request cycle ÷ concurrency) per (group, concurrency, osl), over rows of at
    most ``max_concurrency`` clients; the cycle is TTFT + (osl − 1) × TPOT, so cycle ÷ c is the mean
    time between two completions. A server's TTFT set by prefill and queueing does not depend on the
    output length, and the ratio halves as the output doubles; a ratio near 1 at every output length
    says each request waited for another one to finish (docs/calibration.md, mis-measured groups)."""
    by: dict[tuple[str, int, int], list[float]] = {}
    for r in rows:
        if r.concurrency > max_concurrency:
            continue
        by.setdefault((r.group, r.concurrency, r.osl), []).append(r.ttft_ms / (r.cycle_ms / r.concurrency))
    return {k: float(np.median(v)) for k, v in sorted(by.items())}


def ttft_follows_completions(rows: Iterable[BenchRow], max_concurrency: int = 32) -> dict[str, list[int]]:
    """Per group, the concurrencies at which its TTFT follows the time between completions instead
    of the server (:func:`completion_gap_ratios`): runs of two or more output lengths (the longest
    at least twice the shortest) whose ratio at the longest output is still at least 0.9 and has
    fallen by less than 45 % from the shortest. A TTFT set by prefill and queueing keeps the ratio
    falling with the output (by half per doubling); none of the groups measured on servers alone
    comes near these bounds (docs/calibration.md)."""
    by: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for (group, c, osl), r in completion_gap_ratios(rows, max_concurrency).items():
        by.setdefault((group, c), []).append((osl, r))
    out: dict[str, list[int]] = {}
    for (group, c), pts in sorted(by.items()):
        (short, r_short), (long, r_long) = min(pts), max(pts)
        if long >= 2 * short and r_long >= 0.9 and r_long >= 0.55 * r_short:
            out.setdefault(group, []).append(c)
    return out


def hold_back_flagged(
    rows: Iterable[BenchRow], flagged: dict[str, list[int]] | None = None
) -> tuple[list[BenchRow], dict[str, list[int]]]:
    """``rows`` with the runs :func:`ttft_follows_completions` flags (``flagged``, when the caller
    has them already) given ``max_num_seqs`` = concurrency − 1 (where they set none, or one no
    lower than the concurrency): the benchmark
    as if one request always waited for another to finish, the explanation docs/calibration.md
    gives for those runs. Also returns what was held back, ``{group: [concurrency, ...]}``. The flag
    reads the runs' own measured TTFT, so a prediction made this way is not blind to the group it
    treats."""
    rows = list(rows)
    if flagged is None:
        flagged = ttft_follows_completions(rows)
    out: list[BenchRow] = []
    held: dict[str, set[int]] = {}
    for r in rows:
        unset = r.max_num_seqs is None or r.max_num_seqs >= r.concurrency
        if unset and r.concurrency >= 2 and r.concurrency in flagged.get(r.group, ()):
            r = replace(r, max_num_seqs=r.concurrency - 1)
            held.setdefault(r.group, set()).add(r.concurrency)
        out.append(r)
    return out, {g: sorted(cs) for g, cs in sorted(held.items())}


#: A group whose runs need the GPU computing this many times their wall time is faster than its
#: engine's kernels can be (:func:`faster_than_kernels`); the shipped file's consistent groups
#: reach a median of 1.02 at most.
BUSY_LIMIT = 1.25


def _priced_steps(
    rows: Iterable[BenchRow], profile: str | None = None, host: bool = False
) -> list[tuple[float, float] | None]:
    """Per row, at its engine's own kernel prices (with its preset's host time where ``host``, else
    none): what one prompt adds to an iteration of the other clients' decodes (its own iteration
    where the engine runs prefills apart), and the decode iteration of all ``concurrency`` clients
    at the mean KV length (seconds; ``None`` where the profile cannot price the row)."""
    from sim.config import scenario_from_dict
    from sim.cost.model import BatchShape
    from sim.engine.deployment import Deployment, with_engine_defaults

    idle = None if host else {"host_s": 0.0, "host_per_seq_s": 0.0}
    models: dict[tuple, Any] = {}
    out: list[tuple[float, float] | None] = []
    for r in rows:
        # Everything of the row that reaches the cost model or the batching: its CUDA-graph sizes
        # (the served runs capture up to their concurrency) and whether prompts mix with decodes.
        key = (r.model, r.gpu, r.engine, r.weights, r.kv, r.tp, r.cuda_graph_max_batch, r.mixed_batches)
        try:
            if key not in models:
                # The engine's own batching where the row leaves it unset (vLLM and TensorRT-LLM mix).
                sc = with_engine_defaults(scenario_from_dict(row_scenario(r, engine=idle, profile=profile)))
                models[key] = (Deployment.from_scenario(sc).make_cost_model(sc), bool(sc.scheduler.mixed_batches))
        except ConfigError:
            models[key] = (None, True)
        cm, mixed = models[key]
        if cm is None:
            out.append(None)
            continue
        c, kv = r.concurrency, r.isl + r.osl // 2
        others = (c - 1) * kv
        cached = r.cached_prompt_tokens or 0
        chunk = [(r.isl - cached, cached)]
        prefill = cm.step_time_s(BatchShape(chunk, c - 1 if mixed else 0, others if mixed else 0))
        if mixed and c > 1:
            prefill -= cm.step_time_s(BatchShape([], c - 1, others))
        out.append((prefill, cm.step_time_s(BatchShape([], c, c * kv))))
    return out


def gpu_shares(rows: Iterable[BenchRow], profile: str | None = None) -> list[tuple[float, float] | None]:
    """Per row, the shares of its wall time the GPU must spend on prefills and on decode iterations
    to deliver the measured throughput at the row's engine's own kernel prices, host and front-end
    time left out: ``(prefill, decode)``. Prefill: per second, the request rate (concurrency ÷
    request cycle) times one prompt's prefill, priced as the time it adds to an iteration of the
    other requests' decodes (its own iteration where the engine runs prefills apart). Decode: the
    decode iterations of all clients (rate × (osl − 1) ÷ concurrency) at the mean KV length.
    ``None`` where the profile cannot price the row."""
    rows = list(rows)
    out: list[tuple[float, float] | None] = []
    for r, steps in zip(rows, _priced_steps(rows, profile)):
        if steps is None:
            out.append(None)
            continue
        prefill, decode = steps
        rate = r.concurrency / (r.cycle_ms / 1e3)
        out.append((rate * prefill, rate * (r.osl - 1) / r.concurrency * decode))
    return out


def prompt_costs(rows: Iterable[BenchRow], profile: str | None = None) -> list[tuple[float, float] | None]:
    """Per row, what one prompt adds to the iteration the other clients decode in, measured and
    priced (seconds): measured from the run's request cycle, whose ``osl`` iterations carry
    ``concurrency`` prompts, as (cycle ÷ osl − the decode iteration at the row's price) ÷
    (concurrency ÷ osl); priced at the engine's own kernels and its preset's host time
    (:func:`_priced_steps`). A measured cost well above the price at short prompts and equal to it
    at long ones is a floor on an iteration with a prompt (``engine.eager_host_per_layer_s``).
    ``None`` where the profile cannot price the row."""
    rows = list(rows)
    out: list[tuple[float, float] | None] = []
    for r, steps in zip(rows, _priced_steps(rows, profile, host=True)):
        if steps is None:
            out.append(None)
            continue
        prefill, decode = steps
        per_iteration = r.cycle_ms / 1e3 / r.osl
        out.append(((per_iteration - decode) / (r.concurrency / r.osl), prefill))
    return out


def implied_gpu_busy(
    rows: Iterable[BenchRow], profile: str | None = None, shares: list[tuple[float, float] | None] | None = None
) -> list[float | None]:
    """Per row, the share of its wall time the GPU must compute to deliver the measured throughput
    (:func:`gpu_shares`, prefill and decode together; ``shares`` when already computed for
    ``rows``). A closed loop can keep the GPU busy at most all the time (1); more says the
    measurement is faster than the kernels can be (cached prefixes, prompts shorter than ``isl``,
    speculative decoding). ``None`` where the profile cannot price the row."""
    return [None if x is None else x[0] + x[1] for x in (gpu_shares(rows, profile) if shares is None else shares)]


#: Fewest rows, and narrowest spread of prefill shares, over which :func:`tpot_error_split` fits a line.
SPLIT_MIN_ROWS = 6
SPLIT_MIN_SPREAD = 0.1


def _line(
    pts: list[tuple[float, float]], min_rows: int, spread_ok: Callable[[np.ndarray], bool]
) -> tuple[np.ndarray, float, float] | None:
    """Least-squares line through ``pts`` (x, y): (the x values, slope, intercept), or ``None``
    with fewer than ``min_rows`` points or x values that ``spread_ok`` finds too alike."""
    if len(pts) < min_rows:
        return None
    x, y = np.array(pts).T
    if not spread_ok(x):
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return x, float(slope), float(intercept)


def tpot_error_split(results: list[RowResult], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """Where a group's TPOT error comes from: a least-squares line through its rows' relative TPOT
    errors against their prefill share of wall time (``shares``: :func:`gpu_shares` by row). Its
    intercept is the error of runs that are all decode (decode iterations mispriced: host time,
    decode kernels, all-reduce); its slope, how the error moves as prefills take over the GPU
    (prefills mispriced, or batched differently from the server). Per group and
    per tensor-parallel size within it, where at least :data:`SPLIT_MIN_ROWS` rows spread their
    prefill shares over :data:`SPLIT_MIN_SPREAD` or more: ``{"decode": intercept, "per_prefill":
    slope, "rows": n, "prefill_share": [lowest, highest]}``."""

    def line(pts: list[tuple[float, float]]) -> dict | None:
        fit = _line(pts, SPLIT_MIN_ROWS, lambda x: x.max() - x.min() >= SPLIT_MIN_SPREAD)
        if fit is None:
            return None
        x, slope, intercept = fit
        return {
            "decode": round(intercept, 4),
            "per_prefill": round(slope, 4),
            "rows": len(pts),
            "prefill_share": [round(float(x.min()), 3), round(float(x.max()), 3)],
        }

    by: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for r in results:
        sh = shares.get(r.row)
        if sh is None or r.tpot_err is None:
            continue
        by.setdefault(r.row.group, {}).setdefault(r.row.tp, []).append((sh[0], r.tpot_err))
    out: dict[str, dict] = {}
    for g, tps in sorted(by.items()):
        whole = line([p for pts in tps.values() for p in pts])
        if whole is None:
            continue
        per_tp = {str(tp): fit for tp, pts in sorted(tps.items()) if (fit := line(pts)) is not None}
        out[g] = {**whole, "by_tp": per_tp}
    return out


#: Fewest runs, and least ratio of the longest prefill to the shortest, over which
#: :func:`ttft_vs_prefill` fits a line.
TTFT_LINE_MIN_ROWS = 4
TTFT_LINE_MIN_RATIO = 1.5


def ttft_vs_prefill(results: list[RowResult], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """What sets TTFT where a group's server is least loaded: a least-squares line through the mean
    TTFT of its runs at its lowest concurrency against one prompt's prefill at the engine's kernel
    prices (the time it adds to an iteration of the other clients' decodes: :func:`gpu_shares`'
    prefill share × request cycle ÷ concurrency), measured and simulated. An intercept near zero and a
    slope above 1 say prompts wait behind others' prefills (clients arriving together); a large
    intercept and a slope near 1, a fixed front end. Per group with at least
    :data:`TTFT_LINE_MIN_ROWS` such runs whose prefills span a ratio of
    :data:`TTFT_LINE_MIN_RATIO` or more: ``{"concurrency": c, "runs": n, "prefill_ms": [shortest,
    longest], "measured": {"intercept_ms": a, "per_prefill": b}, "simulated": {...} or None}``
    (``None``: too few of the runs simulated)."""

    def line(pts: list[tuple[float, float]]) -> dict | None:
        fit = _line(pts, TTFT_LINE_MIN_ROWS, lambda x: x.max() >= TTFT_LINE_MIN_RATIO * x.min())
        return None if fit is None else {"intercept_ms": round(fit[2], 1), "per_prefill": round(fit[1], 3)}

    by: dict[str, list[tuple[BenchRow, float, float | None]]] = {}
    for r in results:
        sh = shares.get(r.row)
        if sh is None:
            continue
        w = r.row
        by.setdefault(w.group, []).append((w, sh[0] * w.cycle_ms / w.concurrency, r.ttft_ms))
    out: dict[str, dict] = {}
    for g, pts in sorted(by.items()):
        c = min(w.concurrency for w, _, _ in pts)
        low = [(w, p, s) for w, p, s in pts if w.concurrency == c and p > 0]
        measured = line([(p, w.ttft_ms) for w, p, _ in low])
        if measured is None:
            continue
        xs = [p for _, p, _ in low]
        out[g] = {
            "concurrency": c,
            "runs": len(low),
            "prefill_ms": [round(min(xs), 1), round(max(xs), 1)],
            "measured": measured,
            "simulated": line([(p, s) for _, p, s in low if s is not None]),
        }
    return out


#: Least lowest concurrency, and most growth of TTFT per prefill there, at which a group's clients
#: cannot have started together (:func:`clients_apart`). Four clients arriving at once wait for
#: one another's prompts in the first wave if nowhere else: 1.15 prefills per prefill at least over
#: 10 requests each, 2 to 2.5 when they stay in step. Clients a request cycle apart still meet now
#: and then, a prompt waiting for another's prefill and, where batches are formed ahead, for the
#: iteration after it: kvsim's own TensorRT-LLM runs give 1.28-1.34 so, 1.8 with the clients
#: together (3 requests each). The shipped groups: 0.98 for the flagged one, 3.5 and more for the others.
APART_MIN_CONCURRENCY = 4
APART_MAX_PER_PREFILL = 1.5


def clients_apart(rows: Iterable[BenchRow], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """Groups whose clients did not start together: at their lowest concurrency (at least
    :data:`APART_MIN_CONCURRENCY`), the measured TTFT grows by less than
    :data:`APART_MAX_PER_PREFILL` per unit of one prompt's prefill (:func:`ttft_vs_prefill`'s
    measured line): prompts do not wait for one another, not even in a first wave. A benchmark that
    ramps its clients up (aiperf ``--concurrency-ramp-duration``, ``vllm bench serve
    --ramp-up-strategy``) or leaves out its first requests does this; nothing in a row records it.
    ``{group: {"concurrency": c, "per_prefill": slope}}``."""
    lines = ttft_vs_prefill([RowResult(r, None, None) for r in rows], shares)
    return {
        g: {"concurrency": v["concurrency"], "per_prefill": v["measured"]["per_prefill"]}
        for g, v in lines.items()
        if v["concurrency"] >= APART_MIN_CONCURRENCY and v["measured"]["per_prefill"] < APART_MAX_PER_PREFILL
    }


#: A run waits for KV (:func:`kv_capacity_evidence`) when its TTFT is at least this many times that of
#: the same prompt length and concurrency at the shortest output; it holds its clients' KV when under
#: :data:`KV_HOLDS_RATIO`. Without a KV limit a closed loop's TTFT does not grow with the output
#: length (the shipped Qwen3-32B runs: 0.86-1.17 times); waiting for KV multiplies it (1.57-5.4).
KV_WAITS_RATIO = 1.5
KV_HOLDS_RATIO = 1.2


def _derived_kv_tokens(row: BenchRow, profile: str | None) -> int | None:
    """The KV capacity kvsim derives for ``row``'s deployment (tokens; ``None`` when it cannot)."""
    from sim.config import scenario_from_dict
    from sim.engine.deployment import derived_kv_cache_tokens

    try:
        return derived_kv_cache_tokens(scenario_from_dict(row_scenario(row, profile=profile)))
    except ConfigError:
        return None


def kv_capacity_evidence(rows: Iterable[BenchRow], profile: str | None = None) -> dict[str, dict]:
    """What a file's runs say of the KV capacity their server held, beside the one kvsim derives.

    Per group, tensor-parallel size and weight dtype: runs of one prompt length and concurrency at
    several output lengths, each compared with the shortest. A closed loop's TTFT does not depend on
    the output length unless its requests wait for KV, which needs ``concurrency × (isl + osl)``
    tokens when every client's request is at its full length (what TensorRT-LLM reserves on
    admission; vLLM and SGLang preempt or queue near it). Runs whose TTFT grows
    :data:`KV_WAITS_RATIO` times or more wait; under :data:`KV_HOLDS_RATIO` they fit. The capacity lies
    between the most tokens a fitting run needs (``holds_up_to``; ``None``: no such run) and the
    fewest a waiting run needs (``waits_from``). Reported where some run waits and the two are
    consistent (a group whose TTFT grows with the output for another reason, waiting for a
    completion, has waiting runs below fitting ones and is left out), and, where a group waits at
    several tensor-parallel sizes, where more GPUs wait at more tokens: their memory holds more KV,
    and a wait that does not move with it (a token stream's ceiling) is not for KV. ``derived``: the capacity
    kvsim derives from the GPU's memory for the first waiting run (``gpu.kv_cache_tokens`` replaces
    it). ``{"<group> tp<N> <weights>": {...}}``."""
    series: dict[tuple, list[BenchRow]] = {}
    for r in rows:
        if r.kv_cache_tokens is not None or r.cached_prompt_tokens:
            continue  # a pinned capacity or a shared prefix: the demand is not c × (isl + osl)
        series.setdefault((r.group, r.tp, r.weights, r.kv, r.isl, r.concurrency), []).append(r)
    holds: dict[tuple, list[int]] = {}
    waits: dict[tuple, list[BenchRow]] = {}
    for key, runs in series.items():
        runs.sort(key=lambda r: r.osl)
        base = runs[0]
        for r in runs[1:]:
            ratio = r.ttft_ms / base.ttft_ms
            need = r.concurrency * (r.isl + r.osl)
            if ratio >= KV_WAITS_RATIO:
                waits.setdefault(key[:4], []).append(r)
            elif ratio < KV_HOLDS_RATIO:
                holds.setdefault(key[:4], []).append(need)
    found: dict[tuple, tuple[int | None, int, BenchRow, list[BenchRow]]] = {}
    for key, waiting in waits.items():
        first = min(waiting, key=lambda r: (r.concurrency * (r.isl + r.osl), r.isl))
        hi = first.concurrency * (first.isl + first.osl)
        lo = max(holds.get(key, []), default=None)
        if lo is None or lo < hi:
            found[key] = (lo, hi, first, waiting)
    by_group: dict[tuple, list[tuple[int, int]]] = {}
    for (group, tp, weights, kv), (_, hi, _, _) in found.items():
        by_group.setdefault((group, weights, kv), []).append((tp, hi))
    not_kv = {g for g, pts in by_group.items() if any(a[1] >= b[1] for a, b in zip(sorted(pts), sorted(pts)[1:]))}
    out: dict[str, dict] = {}
    for key, (lo, hi, first, waiting) in sorted(found.items(), key=lambda kv: str(kv[0])):
        group, tp, weights, kv = key
        if (group, weights, kv) in not_kv:
            continue
        out[kv_key(first)] = {
            "holds_up_to": lo,
            "waits_from": hi,
            "derived": _derived_kv_tokens(first, profile),
            "waiting_runs": sorted(
                {f"{r.isl}/{r.osl} c{r.concurrency}" for r in waiting},
                key=lambda s: (int(s.split(" c")[1]), s),
            ),
        }
    return out


def kv_key(row: BenchRow) -> str:
    """The key :func:`kv_capacity_evidence` files ``row``'s deployment under."""
    return f"{row.group} tp{row.tp} {row.weights}"


def kv_from_runs(rows: Iterable[BenchRow], evidence: dict[str, dict]) -> tuple[list[BenchRow], dict[str, int]]:
    """``rows`` with the KV capacity their runs imply (:func:`kv_capacity_evidence`, ``evidence``)
    where a row sets none, and the capacity given to each deployment so treated: the middle of the
    bracket where it has both ends; one with only an upper end (every run waits) is left as it is,
    since nothing bounds it below. Like the other treatments it reads the runs' own measured TTFT,
    so a prediction made with it is not blind to the group it treats."""
    given = {k: (v["holds_up_to"] + v["waits_from"]) // 2 for k, v in evidence.items() if v["holds_up_to"] is not None}
    out: list[BenchRow] = []
    used: dict[str, int] = {}
    for r in rows:
        k = kv_key(r)
        if k in given and r.kv_cache_tokens is None and not r.cached_prompt_tokens:
            r = replace(r, kv_cache_tokens=given[k])
            used[k] = given[k]
        out.append(r)
    return out, dict(sorted(used.items()))


def spread_flagged(rows: Iterable[BenchRow], flagged: dict[str, dict]) -> tuple[list[BenchRow], list[str]]:
    """``rows`` with the runs of the groups :func:`clients_apart` flags (``flagged``) given a start
    spread of :data:`APART_SPREAD_CYCLES` where they set none, and the groups so treated. The flag
    reads the runs' own measured TTFT, so a prediction made this way is not blind to the group it
    treats."""
    out: list[BenchRow] = []
    spread: set[str] = set()
    for r in rows:
        if r.group in flagged and r.start_spread_cycles is None:
            r = replace(r, start_spread_cycles=APART_SPREAD_CYCLES)
            spread.add(r.group)
        out.append(r)
    return out, sorted(spread)


def tp_scaling(results: list[RowResult]) -> dict[str, list[dict]]:
    """What a larger GPU count buys, measured and simulated: per group, per pair of its
    tensor-parallel sizes (each with the next larger one it was run at) and per concurrency, the
    median over prompt and output lengths run at both sizes of TPOT at the smaller size ÷ TPOT at
    the larger (above 1: the larger size shortens the step). ``{group: [{"tp": [small, large],
    "concurrency": c, "runs": n, "measured": gain, "simulated": gain}]}``, rows the simulation could
    not run left out."""
    tpot: dict[tuple[str, int, int, int], dict[int, tuple[float, float]]] = {}
    run_at: dict[str, set[int]] = {}
    for r in results:
        w = r.row
        run_at.setdefault(w.group, set()).add(w.tp)
        if r.tpot_ms is not None:
            tpot.setdefault((w.group, w.isl, w.osl, w.concurrency), {})[w.tp] = (w.tpot_ms, r.tpot_ms)
    sizes = {g: sorted(tps) for g, tps in run_at.items()}
    gains: dict[tuple[str, int, int, int], list[tuple[float, float]]] = {}
    for (g, _isl, _osl, c), by_tp in tpot.items():
        tps = sizes[g]
        for lo, hi in zip(tps, tps[1:]):
            if lo in by_tp and hi in by_tp:
                (m_lo, s_lo), (m_hi, s_hi) = by_tp[lo], by_tp[hi]
                gains.setdefault((g, lo, hi, c), []).append((m_lo / m_hi, s_lo / s_hi))
    out: dict[str, list[dict]] = {}
    for (g, lo, hi, c), pts in sorted(gains.items()):
        m, s = np.median(np.array(pts), axis=0)
        out.setdefault(g, []).append(
            {
                "tp": [lo, hi],
                "concurrency": c,
                "runs": len(pts),
                "measured": round(float(m), 3),
                "simulated": round(float(s), 3),
            }
        )
    return out


def faster_than_kernels(
    rows: Iterable[BenchRow], profile: str | None = None, busy: list[float | None] | None = None
) -> dict[str, float]:
    """Groups whose runs are faster than their engine's kernels allow: median
    :func:`implied_gpu_busy` (``busy``, when already computed for ``rows``) above
    :data:`BUSY_LIMIT`, by group."""
    rows = list(rows)
    by: dict[str, list[float]] = {}
    for r, b in zip(rows, implied_gpu_busy(rows, profile) if busy is None else busy):
        if b is not None:
            by.setdefault(r.group, []).append(b)
    return {g: round(float(np.median(v)), 2) for g, v in sorted(by.items()) if np.median(v) > BUSY_LIMIT}


def runs_faster_than_kernels(
    rows: Iterable[BenchRow], busy: list[float | None], fast: dict[str, float]
) -> dict[str, list[dict]]:
    """Single runs faster than their engine's kernels allow in groups :func:`faster_than_kernels`
    does not flag as a whole (``fast``): :func:`implied_gpu_busy` (``busy``, in row order) above
    :data:`BUSY_LIMIT`. By group, in row order, each run's ``isl``, ``osl``, ``concurrency``, ``tp``
    and ``implied_gpu_busy``. Such a run did not serve what its row says (cached prefixes, shorter
    prompts, speculative decoding): no server model reaches it."""
    out: dict[str, list[dict]] = {}
    for r, b in zip(rows, busy):
        if b is not None and b > BUSY_LIMIT and r.group not in fast:
            out.setdefault(r.group, []).append(
                {"isl": r.isl, "osl": r.osl, "concurrency": r.concurrency, "tp": r.tp, "implied_gpu_busy": round(b, 3)}
            )
    return out


#: Prompt tokens :func:`cache_flagged` rounds a cached share down to: the engines' KV block.
CACHE_BLOCK_TOKENS = 16


def least_cached_share(
    rows: Iterable[BenchRow], shares: list[tuple[float, float] | None], fast: dict[str, float]
) -> dict[str, float]:
    """For each group :func:`faster_than_kernels` flags (``fast``), the least share of every prompt
    that must have come from the prefix cache for its runs to be possible at all: the median over
    its runs of the share that brings the GPU time they need (:func:`gpu_shares`, ``shares`` in row
    order) down to their wall time, ``1 − (1 − decode) ÷ prefill``, within [0, 1]. A lower bound:
    a server also spends time off the GPU, so its runs needed more of their prompts cached."""
    by: dict[str, list[float]] = {}
    for r, x in zip(rows, shares):
        if r.group in fast and x is not None and x[0] > 0:
            by.setdefault(r.group, []).append(min(max(1.0 - (1.0 - x[1]) / x[0], 0.0), 1.0))
    return {g: round(float(np.median(v)), 2) for g, v in sorted(by.items())}


def cache_flagged(rows: Iterable[BenchRow], share: dict[str, float]) -> tuple[list[BenchRow], list[str]]:
    """``rows`` with the prompts of each group in ``share`` (:func:`least_cached_share`) that much
    served from the prefix cache (``cached_prompt_tokens``, rounded down to
    :data:`CACHE_BLOCK_TOKENS`) where a run sets none, and the groups so treated. The share is read
    from the runs' own measured times, so a prediction made this way is not blind to the group it
    treats."""
    out: list[BenchRow] = []
    cached: set[str] = set()
    for r in rows:
        s = share.get(r.group)
        if s and r.cached_prompt_tokens is None:
            n = min(int(s * r.isl) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS, r.isl - 1)
            if n:
                r = replace(r, cached_prompt_tokens=n)
                cached.add(r.group)
        out.append(r)
    return out, sorted(cached)
