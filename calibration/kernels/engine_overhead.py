"""The reference engine's per-iteration framework overhead, measured with its own loop.

What isolated kernels miss (scheduling, block tables, metadata tensors, the forward's small ops,
sampling, bookkeeping): each engine iteration's time minus what the profile's kernel curves
predict for the same batch shape, fitted ``a + b·S + c·P`` (:func:`fit_overhead`) and put into a
profile's CPU-step term (:func:`with_engine_overhead`).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from typing import Any

import numpy as np

from sim.catalog import ModelSpec
from sim.cost.profile import Profile

#: Batch sizes (max_num_seqs) of the offline engine runs that measure its per-iteration overhead.
ENGINE_OVERHEAD_BATCHES = (1, 2, 4, 8, 16)
#: how the engine-overhead runs fill a batch of ``b`` (``measure_engine_overhead``'s ``mix``):
#: ``offline``: ``b`` requests at t = 0, ``output_tokens`` each (every prefill at the start, then
#: decode); ``queued``: ``b + max(1, b // 2)`` requests at t = 0 with outputs uniform in
#: ``output_range``, ``max_num_seqs = b``, so waiting requests are admitted as others finish and
#: their prefill chunks run beside ``b - 1`` long decodes, as in a loaded replay
OVERHEAD_MIXES = ("offline", "queued")


def kernels_only(profile: Profile) -> Profile:
    """A copy of ``profile`` whose CPU-side step overhead is zero (kernels, elementwise and allocation only)."""
    import copy

    p = copy.deepcopy(profile)
    by = p.cpu_overhead.setdefault("by_tp", {})
    for k in list(by) or ["1"]:
        by[k] = {
            **by.get(k, {}),
            "intercept_s": 0.0,
            "per_seq_s": 0.0,
            "batch_range": [1, 1 << 20],
            "after_prefill_s": [],
        }
    return p


def kernel_cost(profile: Profile, model: ModelSpec, allocator: str, block_size: int):
    """The cost model of ``profile``'s kernels alone (CPU-side step overhead zeroed) for the
    reference engine's ``allocator`` layout: what the engine overhead is measured against."""
    from sim.catalog import GPUS
    from sim.cost.model import Layout
    from sim.cost.profile_model import ProfileCostModel

    dt = profile.dtypes["weight"][0]
    return ProfileCostModel(
        kernels_only(profile),
        model,
        GPUS["cpu"],
        weight_dtype=dt,
        kv_dtype=dt,
        layout=Layout(paged=allocator == "paged", block_size=block_size),
    )


def row_time_s(row: dict, clock: str) -> float:
    """An engine iteration row's time on ``clock``: thread CPU seconds for ``cpu``, else the
    measured seconds (wall, or the ``cpu_norm`` clock's normalised CPU time)."""
    return row["cpu_s"] if clock == "cpu" else row["measured_s"]


def _predict(cost, chunks, decode_seqs: int, decode_kv: int, alloc_events: int) -> float:
    from sim.cost.model import BatchShape

    shape = BatchShape([tuple(c) for c in chunks], decode_seqs, decode_kv)
    return cost.step_time_s(shape) + cost.alloc_time_s(alloc_events)


def engine_iteration_rows(result, cost) -> list[dict]:
    """One row per engine iteration: its batch shape (``chunks``: the prefill chunks as
    ``[new tokens, context]``), measured wall and thread-CPU seconds, and ``cost``'s prediction."""
    rows = []
    for i, it in enumerate(result.iterations):
        chunks = [list(c) for c in it["prefill_chunks"]]
        rows.append(
            {
                "iteration": i,
                "seqs": it["decode_seqs"] + len(chunks),
                "decode_seqs": it["decode_seqs"],
                "prefill_chunks": len(chunks),
                "tokens": it["decode_seqs"] + it["prefill_tokens"],
                "decode_kv_tokens": it["decode_kv_tokens"],
                "pure_decode": not chunks,
                "measured_s": it["end_s"] - it["start_s"],
                "cpu_s": it["cpu_s"],
                "chunks": chunks,
                "alloc_events": it["alloc_events"],
                "predicted_s": _predict(cost, chunks, it["decode_seqs"], it["decode_kv_tokens"], it["alloc_events"]),
            }
        )
        if "decode_kv_max" in it:  # the longest decoding sequence (the padded CUDA decode call pads to it)
            rows[-1]["decode_kv_max"] = it["decode_kv_max"]
        if "after_probe" in it:  # cpu_norm runs: the iteration right after a host-speed probe
            rows[-1]["after_probe"] = bool(it["after_probe"])
    return rows


def repredict(rows: list[dict], cost, clock: str) -> list[dict]:
    """``rows`` (engine overhead rows) with ``predicted_s`` and ``residual_s`` recomputed against
    ``cost`` (kernels only, :func:`kernel_cost`): how the overhead rounds are refitted on kernel
    curves re-timed after they ran. Rows without ``chunks`` (overhead rows that do not record
    their prefill chunks) are returned unchanged."""
    out = []
    for r in rows:
        if "chunks" not in r:
            out.append(r)
            continue
        pred = _predict(cost, r["chunks"], r["decode_seqs"], r["decode_kv_tokens"], r["alloc_events"])
        out.append({**r, "predicted_s": pred, "residual_s": row_time_s(r, clock) - pred})
    return out


def decode_since_prefill(rows: list[dict]) -> list[int]:
    """Per engine iteration row (in run order), how many pure-decode iterations have run since the
    last iteration with a prefill chunk, this one included (0 for an iteration with prefill; a run
    starts with one, as nothing is computed before its first prefill)."""
    out, k = [], 0
    for r in rows:
        k = k + 1 if r["pure_decode"] else 0
        out.append(k)
    return out


def measure_engine_overhead(
    profile: Profile | dict[str, Profile],
    model: ModelSpec,
    *,
    allocators=("paged",),
    block_size: int = 16,
    dtype: str = "fp32",
    threads: int = 1,
    batches=ENGINE_OVERHEAD_BATCHES,
    passes: int = 3,
    prompt_range=(16, 384),
    output_tokens: int = 24,
    max_num_batched_tokens: int = 256,
    mixes=("offline",),
    output_range=(8, 48),
    seed: int = 0,
    device: str = "cpu",
    clock: str = "wall",
    between_runs=None,
    probes: dict | None = None,
    probe_ref_s: dict | None = None,
    net=None,
    prefill_probes: dict | None = None,
    prefill_probe_ref_s: dict | None = None,
    kernels: str = "auto",
) -> dict[str, dict]:
    """Per-iteration framework overhead of the reference engine (``calibration.engine``), per cache layout.

    The engine runs offline batches (``b`` requests at t = 0, ``max_num_seqs = b``, prompts
    uniform in ``prompt_range``, ``output_tokens`` each) through its own loop: scheduling,
    block tables, metadata tensors, the forward with its small ops (norms, RoPE, cache
    writes, masks, views), sampling and bookkeeping. Each iteration's time minus what the
    profile's kernel curves predict for the same batch shape (GEMMs, attention,
    elementwise, allocations; CPU overhead zeroed) is the overhead route 1's isolated
    kernels miss. It is fitted ``a + b·S + c·P`` (``S`` sequences, ``P`` prefill tokens) by
    :func:`fit_overhead`: ``a + b·S`` on steady-state decode iterations, ``c`` = what an iteration
    with prefill leaves per prefill token (see there). The layouts' runs are interleaved
    (pass by pass, batch by batch) so a slow episode of a shared host hits all of them alike.
    ``mixes`` (:data:`OVERHEAD_MIXES`, each row tagged ``mix``): how each batch is filled;
    ``queued`` adds runs whose prefills join running decodes mid-stream (``output_range`` its outputs).

    ``clock="wall"``: iteration wall time (what latencies are made of; on a shared host it
    includes the time the engine thread was not running). ``clock="cpu"``: the engine
    thread's CPU time (``time.thread_time``; one torch thread, so every CPU kernel runs on
    it): the engine's own cost on a quiet host (not the step time on CUDA, which is async).
    ``between_runs``: called after each engine run (``kvsim validate`` times its host-speed
    probe there, so the probe's reference spans the measurement). ``clock="cpu_norm"`` with
    ``probes`` (``{allocator: SpeedProbe}``) and ``probe_ref_s`` (``{allocator: seconds}``): each run on
    the engine's ``cpu_norm`` clock (thread CPU time × reference ÷ median of the last probes, as a
    replay), so the residual is at the probe's reference speed; ``prefill_probes`` and
    ``prefill_probe_ref_s`` (same keys, optional): the engine's prefill probe as in a replay. ``net``: a
    :class:`~calibration.engine.Transformer` of ``model`` to reuse (else one is drawn with ``seed``).
    ``kernels``: the paged layout's attention backend (as the engine's ``EngineConfig.kernels``).
    Returns ``{allocator: fit}`` (each with its rows).
    """
    if clock not in ("cpu", "wall", "cpu_norm"):
        raise ValueError("clock: cpu, cpu_norm or wall")
    if clock == "cpu_norm" and (not probes or not probe_ref_s):
        raise ValueError("clock='cpu_norm' needs probes and probe_ref_s per allocator")
    if not mixes or any(m not in OVERHEAD_MIXES for m in mixes):
        raise ValueError(f"mixes: one or more of {', '.join(OVERHEAD_MIXES)}; got {mixes!r}")
    from ..engine import Engine, EngineConfig, Transformer

    profiles = profile if isinstance(profile, dict) else {a: profile for a in allocators}
    costs = {a: kernel_cost(profiles[a], model, a, block_size) for a in allocators}
    net = net if net is not None else Transformer(model, dtype, device, seed)
    rng = random.Random(seed)
    rows: dict[str, list] = {a: [] for a in allocators}
    probe_log: dict[str, list] = {a: [] for a in allocators}
    t0 = time.perf_counter()
    for p, b, mix in itertools.product(range(passes), batches, mixes):
        if mix == "offline":
            trace = [(0.0, rng.randint(*prompt_range), output_tokens) for _ in range(b)]
            longest = prompt_range[1] + output_tokens
        else:
            trace = [(0.0, rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(b + max(1, b // 2))]
            longest = prompt_range[1] + output_range[1]
        for a in allocators:
            cfg = EngineConfig(
                model,
                num_blocks=b * -(-longest // block_size) + 1,
                block_size=block_size,
                max_num_seqs=b,
                max_num_batched_tokens=max_num_batched_tokens,
                allocator=a,
                reserve=longest,
                max_model_len=longest,
                dtype=dtype,
                threads=threads,
                seed=seed,
                device=device,
                kernels=kernels,
            )
            if clock == "cpu_norm":
                assert probes is not None and probe_ref_s is not None  # checked above
                pre = (
                    {"prefill_probe": prefill_probes[a], "prefill_probe_ref_s": prefill_probe_ref_s[a]}
                    if prefill_probes and prefill_probe_ref_s
                    else {}
                )
                res = Engine(cfg, model=net).run(
                    trace, clock="cpu_norm", probe=probes[a], probe_ref_s=probe_ref_s[a], **pre
                )
                probe_log[a] += res.info["speed_probes"]
            else:
                res = Engine(cfg, model=net).run(trace, clock="wall", lead_s=0.0)
            its = engine_iteration_rows(res, costs[a])
            for r, since in zip(its, decode_since_prefill(its)):
                if r["iteration"] == 0:
                    continue  # the first iteration of a run warms caches
                r["residual_s"] = row_time_s(r, clock) - r["predicted_s"]
                r.update(batch=b, pass_=p, run=f"{p}/{b}/{mix}", since_prefill=since, mix=mix)
                rows[a].append(r)
            if between_runs is not None:
                between_runs()
    elapsed = round(time.perf_counter() - t0, 2)
    meta = {
        "block_size": block_size,
        "dtype": dtype,
        "threads": threads,
        "clock": clock,
        "elapsed_s": elapsed,
        "passes": passes,
        "batches": list(batches),
        "prompt_range": list(prompt_range),
        "output_tokens": output_tokens,
        "mixes": list(mixes),
        **({"output_range": list(output_range)} if "queued" in mixes else {}),
    }
    out = {a: {**fit_overhead(rows[a], clock), "allocator": a, **meta} for a in allocators}
    for a in allocators:
        if probe_log[a]:  # cpu_norm only
            assert probe_ref_s is not None
            out[a]["speed_probes"] = probe_log[a]
            out[a]["probe_ref_s"] = float(probe_ref_s[a])
    return out


#: decode iterations right after an iteration with a prefill chunk that run slower than the steady
#: state (cache and allocator state after a prefill's large activations). Measured on this 2-vCPU
#: host, one sequence, paged, 64 outputs, thread CPU time: the 1st to 5th decode iteration after the
#: prefill 2.87 / 2.93 / 2.63 / 2.59 / 2.44 ms, the 6th on 2.28 ms; in the validation replays the
#: first decode iterations after a mixed one ran 5–12 % above the model, the later ones 1–10 % below.
AFTER_PREFILL = 5


#: how the overhead fit summarises the residuals of a group of iterations (``fit_overhead``)
FIT_CENTERS = ("trimmed", "median", "mean")


#: the fewest values a ``trimmed`` centre trims (5 % off each end of 20 is one value)
TRIM_MIN = 20


#: the fewest steady-state decode iterations at one sequence count for the overhead fit to measure
#: that count's departure from its line (``fit_overhead``'s ``by_seqs``)
BY_SEQS_MIN = 20


def step_overhead_s(fit: dict, seqs) -> np.ndarray:
    """The overhead fit's seconds per iteration of ``seqs`` sequences before its per-prefill-token part:
    ``intercept_s + per_seq_s·S``, plus ``per_seq_delta_s`` interpolated between its measured counts
    (nothing beyond them), as ``sim.cost.profile_model.ProfileCostModel`` charges it."""
    S = np.asarray(seqs, dtype=np.float64)
    out = fit["intercept_s"] + fit["per_seq_s"] * S
    delta = fit.get("per_seq_delta_s") or {}
    xs, ys = delta.get("seqs") or [], delta.get("delta_s") or []
    if xs:
        inside = (S >= xs[0]) & (S <= xs[-1])
        out = out + np.where(inside, np.interp(S, xs, ys), 0.0)
    return out


def _untrimmed(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` between its 5th and 95th percentiles (a mask)."""
    lo, hi = np.percentile(x, [5, 95])
    return (x >= lo) & (x <= hi)


def _center(x: np.ndarray, how: str) -> float:
    """``trimmed``: the mean of the values between their 5th and 95th percentiles (the median of
    fewer than :data:`TRIM_MIN` values, too few to trim); ``median``; ``mean``."""
    if how == "median" or (how == "trimmed" and len(x) < TRIM_MIN):
        return float(np.median(x))
    if how == "mean":
        return float(np.mean(x))
    return float(np.mean(x[_untrimmed(x)]))


def fit_overhead(
    rows: list[dict],
    clock: str,
    *,
    steady: bool = True,
    after_prefill: bool = True,
    center: str = "trimmed",
    by_seqs: bool = True,
    mixed_decode: bool = True,
) -> dict:
    """Fit the engine's overhead ``a + b·S + c·P`` to its calibration rows (``residual_s`` = iteration
    time minus the kernel curves' prediction), and the after-prefill excess of decode iterations.

    * ``center``: how a group of residuals is summarised. ``trimmed`` (default): the mean of those
      between their 5th and 95th percentiles. A replay's busy time is a *sum* of iteration times, so
      the fit must price the mean iteration, and iteration times are skewed right (a median sits
      below the mean); the trim keeps a shared host's slow episodes out. ``median`` (the earlier
      fit) left the simulator 2.2 % fast on average; refitted on the same replays of
      eleven full runs, ``trimmed`` put 376 against 374 of 396 cells within 10 %, mean RMS error
      4.7 against 5.1 % (``mean``: 376, 4.8 %), and on two fresh runs 35 and 29 against 34 and 29
      of 36 (docs/validation.md, "The fit's centre").
    * ``a + b·S``: non-negative least squares on the centre of the residuals of **steady-state**
      pure-decode iterations per ``S`` (more than :data:`AFTER_PREFILL` decode iterations after the
      run's last iteration with a prefill chunk; all pure-decode rows where too few), weighted by the
      square root of their count ÷ the median iteration time at ``S`` (relative error, what latencies
      are compared in).
    * ``c`` per prefill token: what iterations with prefill leave after ``a + b·S``, summed over
      them ÷ their prefill tokens (``trimmed``: without the 5 % highest and lowest per token;
      ``median``: the median per token).
    * ``after_prefill_s`` (with ``steady`` and ``after_prefill``): for ``k`` = 1 … :data:`AFTER_PREFILL`,
      the centre of the excess over ``a + b·S`` of the pure-decode iterations ``k`` after the last
      iteration with prefill (never below 0; trailing zeros dropped). The simulator adds it to those decode
      iterations (``CostModel.after_prefill_s``), the engine's virtual clock too. Without it the
      steady-state fit prices them 5–15 % low; with it, on the same replays (six full runs), 204
      against 188 of 216 cells came within 10 % (docs/validation.md).
    * ``steady=False``: ``a + b·S`` from every pure-decode iteration (an earlier fit), which
      averages the after-prefill excess into ``a`` and ``b`` (so no ``after_prefill_s``).
    * ``by_seqs``: also each sequence count's departure from ``a + b·S`` (``per_seq_delta_s``: the centre
      of its steady-state residuals minus the line, at counts with at least :data:`BY_SEQS_MIN` of them),
      which the simulator interpolates between those counts; ``c`` and ``after_prefill_s`` are then
      measured against the line with its departures (:func:`step_overhead_s`).
    * ``mixed_decode``: the iterations with prefill are fitted ``c·P + g·D`` (``D`` decoding sequences in
      them; ``mixed_per_decode_s`` = ``g``), non-negative least squares weighted by ``1/P`` (which, with
      ``g`` = 0, is the sum ratio above), on the same rows the trim keeps: what a decoding sequence
      costs in an iteration with prefill beyond what it costs in a pure decode iteration.
    """
    from scipy.optimize import nnls

    if center not in FIT_CENTERS:
        raise ValueError(f"center: one of {', '.join(FIT_CENTERS)}; got {center!r}")
    S = np.array([r["seqs"] for r in rows], dtype=float)
    T = np.array([r["tokens"] for r in rows], dtype=float)
    R = np.array([r["residual_s"] for r in rows])
    xs = np.array(sorted(set(S.tolist())))
    med = np.array([np.median(R[S == x]) for x in xs])
    dec = np.array([r["pure_decode"] for r in rows])
    since = np.array([r.get("since_prefill", 1 << 30) for r in rows])
    meas_t = np.array([row_time_s(r, clock) for r in rows])
    late = dec & (since > AFTER_PREFILL)
    steady = steady and late.sum() >= 10  # else too few steady-state rows: every decode row
    sel = late if steady else (dec if dec.any() else np.ones(len(rows), dtype=bool))
    xd = np.array(sorted(set(S[sel].tolist())))
    md = np.array([_center(R[sel & (S == x)], center) for x in xd])
    w = np.array([math.sqrt(np.sum(sel & (S == x))) / np.median(meas_t[sel & (S == x)]) for x in xd])
    (a, b_), _ = nnls(np.column_stack([np.ones_like(xd), xd]) * w[:, None], md * w)
    line: dict[str, Any] = {"intercept_s": float(a), "per_seq_s": float(b_)}
    if by_seqs:
        keep_x = [i for i, x in enumerate(xd) if np.sum(sel & (S == x)) >= BY_SEQS_MIN]
        line["per_seq_delta_s"] = {
            "seqs": [int(xd[i]) for i in keep_x],
            "delta_s": [float(md[i] - a - b_ * xd[i]) for i in keep_x],
        }
    base = step_overhead_s(line, S)
    mixed = ~dec & (T > S)
    D = np.array([r.get("decode_seqs", 0) for r in rows], dtype=float)
    c_, g_ = 0.0, 0.0
    if mixed.any():
        rr, pp = R[mixed] - base[mixed], T[mixed] - S[mixed]
        if center == "median":
            c_ = float(max(0.0, np.median(rr / pp)))
        else:  # what the mixed iterations leave in all, per prefill token (trimmed: per-token outliers out)
            trim = center == "trimmed" and len(rr) >= TRIM_MIN
            keep = _untrimmed(rr / pp) if trim else np.ones(len(rr), dtype=bool)
            if mixed_decode:
                wt = 1.0 / np.sqrt(pp[keep])
                (c_, g_), _ = nnls(np.column_stack([pp[keep], D[mixed][keep]]) * wt[:, None], rr[keep] * wt)
                c_, g_ = float(c_), float(g_)
            else:
                c_ = float(max(0.0, rr[keep].sum() / pp[keep].sum()))
    after_s: list[float] = []
    after_n: list[int] = []
    if steady and after_prefill:
        for k in range(1, AFTER_PREFILL + 1):
            m = dec & (since == k)
            after_n.append(int(m.sum()))
            after_s.append(float(max(0.0, _center(R[m] - base[m], center))) if m.sum() >= 5 else 0.0)
        after_s = [x if x >= 1e-7 else 0.0 for x in after_s]  # below 0.1 us: float noise, not excess
        while after_s and after_s[-1] == 0.0:
            after_s.pop()
    pred = base + c_ * (T - S) + g_ * np.where(mixed, D, 0.0)
    if after_s:  # the decode iterations' excess, as the simulator charges it
        pred = pred + np.array(
            [after_s[int(k) - 1] if d and 1 <= k <= len(after_s) else 0.0 for d, k in zip(dec, since)]
        )
    meas = meas_t
    kern = np.array([r["predicted_s"] for r in rows])
    wall = np.array([r["measured_s"] for r in rows])
    err = np.abs(kern + pred - meas) / meas
    return {
        **line,
        "per_token_s": c_,
        "mixed_per_decode_s": g_,
        "after_prefill_s": after_s,
        "after_prefill_samples": after_n,
        "steady_decode_iterations": int(sel.sum()),
        "batch_range": [int(xs.min()), int(xs.max())],
        "tokens_range": [int(T.min()), int(T.max())],
        "cpu_over_wall": round(float(np.sum([r["cpu_s"] for r in rows]) / wall.sum()), 4),
        "iterations": len(rows),
        "median_by_seqs": {str(int(x)): float(m) for x, m in zip(xs, med)},
        # steady pure decode per S: iterations, median measured, median predicted (kernels + this fit), seconds
        "decode_by_seqs": {
            str(int(x)): [
                int(np.sum(sel & (S == x))),
                float(np.median(meas_t[sel & (S == x)])),
                float(np.median((kern + base)[sel & (S == x)])),
            ]
            for x in xd
        },
        "fit_median_rel_err": round(float(np.median(err)), 4),
        "fit_p90_rel_err": round(float(np.percentile(err, 90)), 4),
        "residual_share_median": round(float(np.median(pred / meas)), 4),
        "rows": rows,
    }


def with_engine_overhead(profile: Profile, overhead: dict, model: ModelSpec) -> Profile:
    """``profile`` whose CPU-side step term is the reference engine's measured overhead (``measure_engine_overhead``).

    The per-prefill-token part ``c·P`` is charged through the profile's only per-token
    channel, the elementwise term (``layers × bytes per token / bandwidth``, every token
    computed): its bandwidth is lowered so that channel grows by exactly ``c`` per token, and
    ``cpu_overhead`` becomes ``a + (b − c)·S`` (a decode sequence is one token), so a step
    costs ``a + b·S + c·(T − S) = a + b·S + c·P`` on top of the kernels. The fit's
    ``after_prefill_s`` goes into ``cpu_overhead`` as is (see ``sim.cost.model.CostModel``).
    """
    import copy

    from sim.catalog import GPUS
    from sim.cost.profile_model import ProfileCostModel

    p = copy.deepcopy(profile)
    c = float(overhead.get("per_token_s", 0.0))
    if c > 0:
        kd = p.dtypes["weight"][0]
        cm = ProfileCostModel(p, model, GPUS["cpu"], weight_dtype=kd, kv_dtype=kd)
        old = cm.elementwise_per_token_s * model.layers  # seconds per token through the elementwise channel
        ew = dict(p.elementwise)
        ew["kernel_route_bandwidth_bytes_per_s"] = ew["bandwidth_bytes_per_s"]
        ew["bandwidth_bytes_per_s"] = float(ew["bandwidth_bytes_per_s"]) * old / (old + c)
        ew["engine_per_token_s"] = c
        ew["source"] = (
            ew.get("source", "") + "; bandwidth lowered to include the reference engine's measured "
            f"per-token framework cost ({c * 1e6:.2f} us/token, measure_engine_overhead)"
        )
        p.elementwise = ew
    kernel_route = p.cpu_overhead.get("by_tp", {}).get("1")
    p.cpu_overhead = {
        "by_tp": {
            "1": {
                "intercept_s": overhead["intercept_s"],
                "per_seq_s": max(overhead["per_seq_s"] - float(overhead.get("per_token_s", 0.0)), 0.0),
                "batch_range": overhead["batch_range"],
                "fit_median_rel_err": overhead["fit_median_rel_err"],
                "fit_p90_rel_err": overhead["fit_p90_rel_err"],
                **(
                    {"after_prefill_s": [float(x) for x in overhead["after_prefill_s"]]}
                    if overhead.get("after_prefill_s")
                    else {}
                ),
                **(
                    {"per_seq_delta_s": overhead["per_seq_delta_s"]}
                    if (overhead.get("per_seq_delta_s") or {}).get("seqs")
                    else {}
                ),
                **(
                    {"mixed_per_decode_s": float(overhead["mixed_per_decode_s"])}
                    if overhead.get("mixed_per_decode_s")
                    else {}
                ),
            }
        },
        "parts": [
            "the reference engine's whole iteration beyond the profile's kernels: scheduling, block tables, "
            "metadata tensors, norms/RoPE/cache writes/masks/views, sampling, bookkeeping"
        ],
        "source": f"measured: calibration.engine offline runs ({overhead['allocator']} cache, block "
        f"{overhead['block_size']}, {overhead['dtype']}, {overhead['threads']} thread(s)), iteration "
        f"{ {'cpu': 'thread CPU', 'cpu_norm': 'thread CPU (x probe reference / host speed)'}.get(overhead.get('clock') or 'wall', 'wall') } time "
        "minus the kernel curves' prediction for the same batch shape, per sequence count, fitted a + b x "
        "sequences plus each well-measured count's departure from that line (per_seq_delta_s; "
        "kvsim.calibration.kernels.measure_engine_overhead)",
        "median_by_seqs": overhead["median_by_seqs"],
        "kernel_route_step_cpu": kernel_route,
        "note": "host-side and framework work per step, not overlapped with kernels (CPU: same thread)",
    }
    p.provenance = {
        **p.provenance,
        "engine_overhead": {k: v for k, v in overhead.items() if k not in ("rows", "speed_probes")},
    }
    return p
