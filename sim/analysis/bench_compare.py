"""Replay a serving benchmark in the simulator and set its latencies beside the measured ones.

:func:`compare_result` takes one :class:`~sim.analysis.bench_results.BenchResult` and

1. builds a scenario that sends the same requests (prompt and output lengths of the successful
   requests with at least one output token, in the file's order) with the same arrival process, chosen in this order:
   ``start_times`` in the file → a trace of those send times; ``request_rate: inf`` → every request
   at t = 0; a finite rate → vLLM's generator: gamma gaps of shape ``burstiness`` and mean
   ``1/rate`` (constant gaps for ``burstiness: inf``), scaled so the last request is sent at
   ``N / rate``, drawn with the scenario's seed (the same process, not the same draw). With
   ``max_concurrency`` (the benchmark's semaphore) those times are when requests become due and
   the scenario caps requests in flight (``workload.arrival.max_concurrency``): each is sent at
   the later of its time and a free slot, as the benchmark sends it; vLLM takes ``start_times``
   after the slot is acquired, so replaying them under the cap is exact where the simulated
   server is as fast, and holds the cap where it is slower. The exception is ``max_concurrency``
   with ``request_rate: inf`` and no ``start_times``: a closed loop of that many clients, each
   sending its next request when its last one ended, started apart (see :func:`scenario_dict`);
2. simulates it (the run directory holds the trace, ``scenario.yaml`` runnable with
   ``kvsim run``, and the usual Parquet files);
3. reports mean, p50, p90 and p99 of TTFT, TPOT, ITL and end-to-end latency (milliseconds)
   and the throughputs, measured and simulated, with the relative error
   ``(simulated − measured) / measured``. The measured throughputs are the header's; one the
   header lacks is computed from the per-request lists over ``duration``, which a note says
   (:func:`throughput_note`).

The measured statistics are computed from the per-request lists as vLLM computes its own
(``numpy.percentile``, linear interpolation, over successful requests); aggregates in the
file's header are checked against them and a difference of more than 1 % is reported. vLLM's
TTFT and end-to-end aggregates also count successful requests without an output token, which
are left out here (the report says so beside such a difference).

Simulated ITL: the benchmark's ITLs are the gaps between a request's streamed chunks. The
simulator streams one token per iteration to every decoding request, so a request's gaps are the
gaps between the ends of the iterations of its replica after its first token, up to its last
(:func:`simulated_itl_s`). Iteration ends come from the time series, which has one row per
iteration because the replay runs in ``engine.mode: step`` (the same results as fast-forward,
property-tested). With ``engine.mode: fast_forward`` set, a window of ``m`` pure-decode
iterations is one row with its first iteration's duration, and its others are spread evenly over
the rest of the window: their batch is fixed, but their step times grow with the attended
context, which the even spread flattens.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from sim import __version__
from sim.analysis.bench_results import BenchResult
from sim.config import APART_SPREAD_CYCLES
from sim.errors import ConfigError

#: The statistics reported per metric, in table order.
STATS = ("mean", "p50", "p90", "p99")
#: (key in the JSON, label) of the latency metrics, in table order.
METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)"))
#: (key, label) of the throughputs.
THROUGHPUTS = (
    ("request_throughput", "requests/s"),
    ("output_throughput", "output tokens/s"),
    ("total_token_throughput", "total tokens/s (prompt + output)"),
)
#: Header aggregates that differ from the per-request lists by more than this are reported.
HEADER_TOLERANCE = 0.01
TRACE_NAME = "bench_requests.csv"
#: The header's aggregate fields (``mean_ttft_ms``, ``median_itl_ms``, ``p99_tpot_ms``, ...).
_AGGREGATE = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def stats(values: np.ndarray) -> dict[str, float | None]:
    """Mean and p50/p90/p99 of ``values`` (``None`` each when empty)."""
    if values.size == 0:
        return {s: None for s in STATS}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


# --- the scenario ----------------------------------------------------------------------------


#: ``backend`` of a result file → kvsim's engine preset (vLLM's and SGLang's benchmark clients'
#: names of those servers); another backend (``openai-chat``, ``tgi`` …) names a protocol or a
#: server kvsim has no preset for, and is simulated as vLLM with a note.
BACKEND_ENGINES = {
    "vllm": "vllm",
    "vllm-chat": "vllm",
    "sglang": "sglang",
    "sglang-native": "sglang",
    "sglang-oai": "sglang",
    "sglang-oai-chat": "sglang",
    "tensorrt-llm": "trtllm",
    "tensorrt_llm": "trtllm",
    "trtllm": "trtllm",
    "trt-llm": "trtllm",
    "trt": "trtllm",
}
#: How a ``kvsim compare`` user picks another format than the one a variant id is simulated with.
COMPARE_FORMAT_HINT = "--model NAME, or --set model.weight_dtype=... / model.kv_dtype=..., for another model or format"


def engine_of(res: BenchResult) -> tuple[str, str | None]:
    """The engine preset the file's ``backend`` names, and a note where it names none kvsim has."""
    backend = res.header.get("backend")
    if backend is None or (isinstance(backend, str) and not backend.strip()):
        return "vllm", None
    kind = BACKEND_ENGINES.get(str(backend).strip().lower())
    if kind is not None:
        return kind, None
    return "vllm", f"backend {backend!r} names no serving engine kvsim has a preset for; simulated as vllm (--engine)"


def strict_json(doc) -> str:
    """``doc`` as strict JSON (indented, one newline at the end): an infinity (a header's
    ``request_rate: Infinity``) as the string ``"inf"`` (``"-inf"``), as vLLM writes an unbounded
    rate, and NaN as null; ``json.dumps`` would write the bare ``Infinity`` that strict readers refuse."""

    def fix(x):
        if isinstance(x, dict):
            return {k: fix(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [fix(v) for v in x]
        if isinstance(x, (float, np.floating)) and not math.isfinite(x):
            return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if isinstance(x, np.generic):
            return x.item()
        return x

    return json.dumps(fix(doc), indent=1, allow_nan=False) + "\n"


def send_times(res: BenchResult, seed: int) -> np.ndarray | None:
    """Send times in seconds from the benchmark's start, one per request; with ``max_concurrency``
    the times requests become due (each is sent at the later of it and a free slot). ``None`` for a
    closed loop: ``max_concurrency`` with ``request_rate: inf`` and no ``start_times``."""
    n = len(res)
    if res.start_s is not None:
        return res.start_s
    rate, b = res.request_rate, res.burstiness
    if math.isinf(rate):
        return None if res.max_concurrency is not None else np.zeros(n)
    if math.isinf(b):
        delays = np.full(n, 1.0 / rate)
    else:
        delays = np.random.default_rng(seed).gamma(b, 1.0 / (rate * b), n)
    t = np.cumsum(delays)
    # vLLM rescales the cumulative delays so the last request goes out at N / rate exactly.
    return t * ((n / rate) / t[-1])


def arrival_text(res: BenchResult) -> str:
    """How the replay sends requests, for the table's title and the JSON."""
    mc = res.max_concurrency
    if mc is not None and res.start_s is None and math.isinf(res.request_rate):
        return f"closed loop, {mc} clients"
    cap = "" if mc is None else f", at most {mc} in flight (max_concurrency)"
    if res.start_s is not None:
        return f"the file's start_times (trace){cap}"
    if math.isinf(res.request_rate):
        return "all requests at t = 0 (request_rate inf)"
    kind = "Poisson" if res.burstiness == 1.0 else f"gamma, burstiness {res.burstiness:g}"
    return f"{kind} at {res.request_rate:g} requests/s{cap}"


def _model_section(res: BenchResult, model: str | None) -> dict:
    """``--model``, else the file's ``model_id`` when kvsim has its shape (a catalog model, a shipped
    config, a config path, or an id naming one of them: ``meta-llama/Llama-3.1-8B-Instruct``;
    :func:`sim.model_ids.section_of`)."""
    from sim.model_ids import format_problem, known_ids, model_argument, section_of

    if model is not None:
        return model_argument(model)
    mid = res.header.get("model_id")
    # A quantized variant runs its own format (sim.model_ids.model_of_id): the file says no other.
    section = section_of(mid, formats=True) if isinstance(mid, str) and mid else None
    if section is None:
        # Keyed by the file: in a folder, the other files' model_id may be known, and they are still compared.
        why = format_problem(mid) if isinstance(mid, str) and mid else None
        raise ConfigError(
            f"{res.path}: model_id",
            mid,
            why or f"{known_ids()}; else pass --model NAME or --model path/to/config.json (kvsim list models)",
        )
    return {k: v for k, v in section.items() if v is not None}


def scenario_dict(
    res: BenchResult,
    *,
    engine: str | None = None,
    model: str | None = None,
    gpu: str | None = None,
    tp: int | None = None,
    profile: str | None = None,
    seed: int = 0,
) -> dict:
    """The scenario (as YAML data) that replays ``res``; its requests are in :data:`TRACE_NAME`
    beside it (:func:`write_trace`). ``engine``: the preset, else the one the file's ``backend``
    names (:func:`engine_of`)."""
    n = len(res)
    times = send_times(res, seed)
    if times is None:
        # vllm bench serve's semaphore admits its first max_concurrency requests together, but nothing
        # in the file says whether they stayed in step, and clients in step at an engine's default
        # token budget re-form a prefill wave every cycle: the replay starts them apart, as
        # `kvsim validate --serving-bench` does a run of a harness it has not seen keep them in step.
        arrival = {
            "kind": "closed_loop",
            "concurrency": int(res.max_concurrency or 1),
            "start_spread_cycles": APART_SPREAD_CYCLES,
        }
        lengths: dict | None = {"kind": "trace", "path": TRACE_NAME, "format": "csv"}
    else:
        arrival = {"kind": "trace", "path": TRACE_NAME, "format": "csv"}
        if res.max_concurrency is not None:
            # The benchmark's semaphore: each request is sent at the later of its time and a free slot.
            arrival["max_concurrency"] = int(res.max_concurrency)
        lengths = None
    longest = int((res.prompt_tokens + res.output_tokens).max())
    workload: dict = {"num_requests": n, "max_model_len": max(2, longest), "arrival": arrival}
    if lengths is not None:
        workload["lengths"] = lengths
    data: dict = {
        "name": run_name(res),
        "seed": seed,
        "description": f"replay of {res.name} ({arrival_text(res)}), written by kvsim compare",
        "model": _model_section(res, model),
        "workload": workload,
        # Step mode records every iteration (same results as fast-forward): exact simulated ITLs.
        "engine": {"kind": engine or engine_of(res)[0], "mode": "step"},
    }
    if gpu is not None or tp is not None:
        data["gpu"] = {
            **({"name": gpu} if gpu is not None else {}),
            **({"tensor_parallel": tp} if tp is not None else {}),
        }
    if profile is not None:
        data["cost_model"] = {"profile": profile}
    return data


def run_name(res: BenchResult) -> str:
    """``compare-<file stem>``, made a safe run name."""
    from sim.config import NAME_RE

    stem = "compare-" + "".join(c if c.isalnum() or c in "._-" else "_" for c in res.path.stem)[:100]
    return stem if NAME_RE.match(stem) else "compare"


def write_trace(res: BenchResult, seed: int, path: Path) -> None:
    """The requests as a generic CSV trace (``arrival_s, prompt_tokens, output_tokens``; arrivals
    0 for a closed loop, whose clients decide the send times)."""
    times = send_times(res, seed)
    t = np.zeros(len(res)) if times is None else times
    rows = "".join(
        f"{a!r},{p},{o}\n" for a, p, o in zip(t.tolist(), res.prompt_tokens.tolist(), res.output_tokens.tolist())
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)


# --- simulated ITL -----------------------------------------------------------------------------


def iteration_ends(ts: pa.Table) -> dict[int, np.ndarray]:
    """Per replica, the end time (s) of every iteration, from the time series (one row per
    batch change; a window's iterations after its first spread evenly over the rest of it)."""
    rep = ts["replica"].to_numpy()
    t = ts["t_s"].to_numpy()
    m = ts["iterations"].to_numpy().astype(np.int64)
    w = ts["window_s"].to_numpy()
    f = ts["first_step_s"].to_numpy()
    out: dict[int, np.ndarray] = {}
    for r in np.unique(rep).tolist():
        sel = np.flatnonzero((rep == r) & (m > 0))
        mm = m[sel]
        row = np.repeat(np.arange(len(sel)), mm)
        k = np.arange(int(mm.sum())) - np.repeat(np.cumsum(mm) - mm, mm)
        t0, ff, ww = (t[sel] - w[sel])[row], f[sel][row], w[sel][row]
        rest = np.maximum(mm - 1, 1)[row]
        ends = np.where(k == 0, t0 + ff, t0 + ff + (ww - ff) * k / rest)
        ends[np.cumsum(mm) - 1] = t[sel]  # a row's last iteration ends at the row's time exactly
        out[int(r)] = np.sort(ends, kind="stable")
    return out


def _nearest(ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    i = np.clip(np.searchsorted(ends, x), 1, len(ends) - 1)
    return np.where(np.abs(ends[i - 1] - x) <= np.abs(ends[i] - x), i - 1, i)


def simulated_itl_s(requests: pa.Table, ts: pa.Table) -> tuple[np.ndarray, int]:
    """Every simulated inter-token gap (s) of completed requests, and how many iterations
    fell between a request's first and last token beyond its ``generated − 1`` tokens (an
    iteration it got no token in: after a preemption, or a prefill-only iteration of an engine
    that runs prefill apart from decodes); those gaps are counted as gaps of their own."""
    ok = np.asarray(requests["status"].to_pylist()) == "completed"
    rep = requests["replica"].to_numpy()[ok]
    first = requests["first_token_s"].to_numpy()[ok]
    fin = requests["finish_s"].to_numpy()[ok]
    gen = requests["generated_tokens"].to_numpy()[ok]
    parts, extra = [], 0
    for r, ends in iteration_ends(ts).items():
        sel = (rep == r) & (gen > 1)
        if not sel.any() or len(ends) < 2:
            continue
        i0 = _nearest(ends, first[sel])
        i1 = _nearest(ends, fin[sel])
        extra += int(np.maximum((i1 - i0) - (gen[sel] - 1), 0).sum())
        weight = np.zeros(len(ends) + 1, dtype=np.int64)
        np.add.at(weight, i0 + 1, 1)
        np.add.at(weight, i1 + 1, -1)
        weight = np.maximum(np.cumsum(weight)[: len(ends)], 0)
        gaps = np.diff(ends, prepend=ends[0])
        parts.append(np.repeat(gaps, weight))
    return (np.concatenate(parts) if parts else np.zeros(0)), extra


# --- the comparison --------------------------------------------------------------------------


def measured_metrics(res: BenchResult) -> dict[str, dict]:
    return {
        "ttft_ms": stats(res.ttft_s * 1e3),
        "tpot_ms": stats(res.tpot_s() * 1e3),
        "itl_ms": stats(res.itl_flat_s() * 1e3),
        "e2el_ms": stats(res.e2el_s() * 1e3),
    }


def measured_throughput(res: BenchResult) -> dict[str, float | None]:
    """The header's throughputs (checked when the file was read), else the lists' totals over
    ``duration`` (``None`` without it): :func:`throughput_note` says which."""
    d = res.duration_s
    computed = {
        "request_throughput": len(res) / d if d else None,
        "output_throughput": float(res.output_tokens.sum()) / d if d else None,
        "total_token_throughput": float(res.output_tokens.sum() + res.prompt_tokens.sum()) / d if d else None,
    }
    out = {}
    for k, v in computed.items():
        hv = _header_throughput(res.header, k)
        out[k] = hv if hv is not None else v
    return out


def _header_throughput(header: dict, key: str) -> float | None:
    v = header.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def throughput_note(res: BenchResult) -> str | None:
    """One line naming the throughputs the header lacks and what is reported instead; ``None``
    when it has all three."""
    missing = [k for k, _ in THROUGHPUTS if _header_throughput(res.header, k) is None]
    if not missing:
        return None
    names = ", ".join(missing)
    if res.duration_s is None:
        return f"{names} not in the header, nor duration: no measured throughput to compare"
    return f"{names} not in the header: computed from the per-request lists over duration ({res.duration_s:.4g} s)"


def header_check(res: BenchResult) -> list[str]:
    """The header's ``mean_/median_/pNN_*_ms`` aggregates that differ from the lists by > 1 %."""
    pat = _AGGREGATE
    # vLLM counts a successful request without an output token in TTFT and E2EL, not in TPOT or ITL.
    why = (
        f" ({res.no_output} request{'s' if res.no_output > 1 else ''} without an output token left out here; "
        "vLLM's TTFT and E2EL count those that succeeded)"
        if res.no_output
        else ""
    )
    lists = {"ttft": res.ttft_s, "tpot": res.tpot_s(), "itl": res.itl_flat_s(), "e2el": res.e2el_s()}
    out = []
    for key, v in res.header.items():
        mt = pat.match(key)
        if not mt or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        stat, metric = mt.groups()
        vals = lists[metric] * 1e3
        if vals.size == 0:
            continue
        mine = (
            float(vals.mean())
            if stat == "mean"
            else float(np.percentile(vals, 50 if stat == "median" else float(stat[1:])))
        )
        if abs(mine - v) > HEADER_TOLERANCE * max(abs(v), 1e-9) + 1e-6:
            note = why if metric in ("ttft", "e2el") else ""
            out.append(f"{key} in the header is {v:.4g} but {mine:.4g} from the per-request lists{note}")
    return out


def _rel(sim: float | None, meas: float | None) -> float | None:
    if sim is None or meas is None or meas == 0:
        return None
    return (sim - meas) / meas


def compare_result(
    res: BenchResult,
    run_dir: Path,
    *,
    engine: str | None = None,
    model: str | None = None,
    gpu: str | None = None,
    tp: int | None = None,
    profile: str | None = None,
    overrides: dict | None = None,
    seed: int = 0,
) -> dict:
    """Simulate ``res`` (run directory ``run_dir``) and compare; the JSON document of one file.
    ``engine``: the preset, else the file's ``backend``'s (:func:`engine_of`)."""
    from sim.config import apply_overrides, scenario_from_dict
    from sim.engine.cluster import simulate
    from sim.model_ids import variant_note
    from sim.output.results import write_run

    plain = scenario_dict(res, engine=engine, model=model, gpu=gpu, tp=tp, profile=profile, seed=seed)
    data = apply_overrides(plain, overrides or {})
    # What the replay took that the file does not say, one line each (printed before the table).
    notes: list[str] = []
    ident = model if model is not None else res.header.get("model_id")
    if isinstance(ident, str) and not any(k == "model" or k.startswith("model.") for k in overrides or {}):
        note = variant_note(ident, plain["model"], COMPARE_FORMAT_HINT)
        if note is not None:
            notes.append(note)
    if engine is None and "engine.kind" not in (overrides or {}):
        why = engine_of(res)[1]
        if why is not None:
            notes.append(why)
    tp_note = throughput_note(res)
    if tp_note is not None:
        notes.append(tp_note)
    write_trace(res, seed, run_dir / TRACE_NAME)
    sc = scenario_from_dict(data, base_dir=run_dir)
    if sc.timeseries.every_s is not None:
        raise ConfigError(
            "timeseries.every_s",
            sc.timeseries.every_s,
            "unset for kvsim compare (simulated ITLs need one time-series row per batch change)",
        )
    result = simulate(sc, out_dir=run_dir)
    write_run(result, run_dir)
    rq, ts = result.requests, result.timeseries
    ok = np.asarray(rq["status"].to_pylist()) == "completed"
    arrival = rq["arrival_s"].to_numpy()[ok]
    first = rq["first_token_s"].to_numpy()[ok]
    fin = rq["finish_s"].to_numpy()[ok]
    gen = rq["generated_tokens"].to_numpy()[ok]
    prompt = rq["prompt_tokens"].to_numpy()[ok]
    multi = gen > 1
    itl, extra = simulated_itl_s(rq, ts)
    sim = {
        "ttft_ms": stats((first - arrival) * 1e3),
        "tpot_ms": stats((fin - first)[multi] / (gen[multi] - 1) * 1e3),
        "itl_ms": stats(itl * 1e3),
        "e2el_ms": stats((fin - arrival) * 1e3),
    }
    # Both durations run from the benchmark's start (t = 0, before the first send) to the last response.
    dur = float(fin.max()) if fin.size else 0.0
    sim_tp = {
        "request_throughput": int(ok.sum()) / dur if dur else None,
        "output_throughput": float(gen.sum()) / dur if dur else None,
        "total_token_throughput": float(gen.sum() + prompt.sum()) / dur if dur else None,
    }
    meas = measured_metrics(res)
    meas_tp = measured_throughput(res)
    rows = [
        {
            "metric": k,
            "stat": s,
            "measured": meas[k][s],
            "simulated": sim[k][s],
            "rel_error": _rel(sim[k][s], meas[k][s]),
        }
        for k, _ in METRICS
        for s in STATS
    ]
    rows += [
        {
            "metric": k,
            "stat": "-",
            "measured": meas_tp[k],
            "simulated": sim_tp[k],
            "rel_error": _rel(sim_tp[k], meas_tp[k]),
        }
        for k, _ in THROUGHPUTS
    ]
    warnings = [*res.warnings, *header_check(res)]
    rejected = int((~ok).sum())
    if rejected:
        warnings.append(
            f"{rejected} of {len(ok)} simulated requests were rejected ({result.summary['rejected_by_reason']})"
        )
    if extra:
        warnings.append(
            f"{extra} iterations ran between a request's first and last token without giving it one "
            "(preemption, or prefill iterations apart from decodes); each counts as a gap of its own"
        )
    s = result.summary
    return {
        "file": str(res.path),
        "kvsim_version": __version__,
        "benchmark": {
            k: res.header.get(k)
            for k in (
                "backend",
                "model_id",
                "date",
                "num_prompts",
                "request_rate",
                "burstiness",
                "max_concurrency",
                "duration",
                "completed",
                "failed",
            )
        },
        "requests": {
            "in_file": res.num_requests,
            "failed_left_out": res.failed,
            "no_output_left_out": res.no_output,
            "simulated": len(res),
            "simulated_completed": int(ok.sum()),
        },
        "arrival": arrival_text(res),
        "simulation": {
            "model": sc.model.hf_config or sc.model.name,
            "gpu": sc.gpu.name,
            "tensor_parallel": sc.gpu.tensor_parallel,
            "replicas": sc.gpu.replicas,
            "engine": sc.engine.kind,
            "cost_model": s["cost_model"],
            "cost_model_calibrated": s["cost_model_calibrated"],
            "seed": sc.seed,
            "run_dir": str(run_dir),
            "preemptions": s["preemptions"],
            "itl_iterations_without_token": extra,
        },
        "rows": rows,
        "notes": notes,
        "warnings": warnings,
    }
