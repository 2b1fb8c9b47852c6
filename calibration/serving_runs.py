"""Benchmark rows as kvsim runs: the scenario of a row, its simulation, and the errors scored.

:func:`row_scenario` turns a row (:class:`calibration.serving_bench.BenchRow`) into a kvsim
scenario (closed loop, fixed lengths, the engine preset of the row's engine with its server
defaults, the benchmark's clients: :class:`Clients`), :func:`simulate_row` runs it and averages
TTFT and TPOT over the requests after each client's warm-up requests, as benchmark clients do;
:func:`score` gives per-row and per-group errors. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sim.engine_presets import ENGINE_BLOCK_SIZE, default_kv, get_preset
from sim.errors import ConfigError

from .serving_bench import EXPERT_WEIGHTS, GPU_IDS, BenchRow, resolve_model

# --- rows as scenarios -----------------------------------------------------------------------


@dataclass(frozen=True)
class Clients:
    """How the benchmark's clients run: ``requests_per_client`` requests each, the first ``warmup``
    of each client's left out of the means. The
    defaults are the benchmarks behind the shipped file as aiconfigurator-core runs them: aiperf /
    genai-perf ``--request-count`` and SGLang's ``bench_serving --num-prompts`` of 10 × concurrency,
    every request in the means (vLLM's ``bench serve`` likewise counts every request of
    ``--num-prompts``, which a vLLM result's ``completed`` gives: :attr:`BenchRow.requests`). A row
    without its own ``start_spread_cycles`` starts its clients this many request cycles apart (0:
    together, whatever a preset's scenario default; ``None``: the preset's); ``validate`` and
    ``calibrate`` give every row its own first (:func:`calibration.serving_selection.clients_rows`). Each
    request's client and front-end jitter (``client_cv``) is the engine preset's unless set here."""

    requests_per_client: int = 10
    warmup: int = 0
    start_spread_cycles: float | None = 0.0
    client_cv: float | None = None


def row_scenario(
    row: BenchRow,
    clients: Clients = Clients(),
    *,
    engine: dict | None = None,
    profile: str | None = None,
    seed: int = 0,
) -> dict:
    """The kvsim scenario (raw mapping) of one benchmark row.

    ``engine`` holds ``engine.*`` overrides (fitted terms); the scheduler keys are left unset so
    the engine preset's server defaults apply, except the token budget, raised to fit one prompt
    where the engine cannot chunk it.
    """
    model = resolve_model(row.model)
    gpu = GPU_IDS.get(row.gpu, row.gpu)
    kv = row.kv or default_kv(row.engine, row.weights, gpu)
    # fp16 weights cost what bf16 ones do (two bytes, the same tensor-core rate); the profiles price bf16.
    # A checkpoint's quantised experts (MXFP4, W4A16) take their dtype from its config, its other weights are bf16.
    model.update({"weight_dtype": "bf16" if row.weights in ("fp16", *EXPERT_WEIGHTS) else row.weights, "kv_dtype": kv})
    n = row.requests if row.requests is not None else row.concurrency * (clients.requests_per_client + clients.warmup)
    spread = row.start_spread_cycles if row.start_spread_cycles is not None else clients.start_spread_cycles
    sc: dict = {
        "name": "serving-bench",
        "seed": seed,
        "model": model,
        "gpu": {
            "name": gpu,
            "tensor_parallel": row.tp,
            **({"kv_cache_tokens": row.kv_cache_tokens} if row.kv_cache_tokens is not None else {}),
        },
        "workload": {
            "num_requests": n,
            "max_model_len": row.isl + row.osl,
            "arrival": {
                "kind": "closed_loop",
                "concurrency": row.concurrency,
                **({"start_spread_cycles": spread} if spread is not None else {}),
                **({"client_cv": clients.client_cv} if clients.client_cv is not None else {}),
            },
            "lengths": {"kind": "fixed", "prompt_tokens": row.isl, "output_tokens": row.osl},
        },
        "allocator": {"kind": "paged", "block_size": ENGINE_BLOCK_SIZE.get(row.engine, 16)},
        "engine": {
            "kind": row.engine,
            **({"graph_max_tokens": row.cuda_graph_max_batch} if row.cuda_graph_max_batch is not None else {}),
            **({"schedule_ahead": row.schedule_ahead} if row.schedule_ahead is not None else {}),
            **(engine or {}),
        },
        "cost_model": {"profile": profile or "auto"},
    }
    if row.cached_prompt_tokens:
        # One shared prefix in front of every prompt; the first request computes it, the others find it
        # in the prefix cache (the engines' default: vLLM's automatic prefix caching, SGLang's radix
        # cache, TensorRT-LLM's KV block reuse).
        sc["workload"]["lengths"]["prompt_tokens"] = row.isl - row.cached_prompt_tokens
        sc["workload"]["prefix"] = {"fraction": 1.0, "prefix_tokens": row.cached_prompt_tokens, "groups": 1}
        sc["allocator"]["prefix_caching"] = {"enabled": True}
    preset = get_preset(row.engine)
    if preset is not None and not preset.chunked_prefill and row.isl + row.concurrency > preset.max_num_batched_tokens:
        # Without chunked prefill a prompt joins an iteration whole, beside every running decode:
        # with the default budget an 8192-token prompt would wait until no request decodes, one
        # request at a time, where the measured runs (TTFT 1.2 s at isl 8192, c 4, one H200)
        # show none of that. Benchmarks set the budget from the longest input they send.
        sc["scheduler"] = {"max_num_batched_tokens": row.isl + row.concurrency}
    if row.max_num_seqs is not None:
        sc.setdefault("scheduler", {})["max_num_seqs"] = row.max_num_seqs
    if row.max_num_batched_tokens is not None:
        sc.setdefault("scheduler", {})["max_num_batched_tokens"] = row.max_num_batched_tokens
    if row.mixed_batches is not None:
        sc.setdefault("scheduler", {})["mixed_batches"] = row.mixed_batches
    return sc


@dataclass
class RowResult:
    """A row's measured and simulated means (ms) and relative errors ((sim − meas) / meas)."""

    row: BenchRow
    ttft_ms: float | None
    tpot_ms: float | None
    error: str | None = None
    calibrated: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def ttft_err(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms / self.row.ttft_ms - 1.0

    @property
    def tpot_err(self) -> float | None:
        return None if self.tpot_ms is None else self.tpot_ms / self.row.tpot_ms - 1.0

    def to_json(self) -> dict:
        return {
            **asdict(self.row),
            "group": self.row.group,
            "sim_ttft_ms": self.ttft_ms,
            "sim_tpot_ms": self.tpot_ms,
            "ttft_rel_err": self.ttft_err,
            "tpot_rel_err": self.tpot_err,
            "error": self.error,
            "cost_model_calibrated": self.calibrated,
            **self.extra,
        }


def simulate_row(
    row: BenchRow,
    clients: Clients = Clients(),
    *,
    engine: dict | None = None,
    profile: str | None = None,
    seed: int = 0,
) -> RowResult:
    """Simulate one row; means over requests after each client's warm-up (request ids at or above
    ``concurrency × warmup``: a closed loop hands out ids in send order)."""
    from sim.config import scenario_from_dict
    from sim.engine.cluster import simulate

    try:
        sc = scenario_from_dict(row_scenario(row, clients, engine=engine, profile=profile, seed=seed))
        res = simulate(sc)
    except ConfigError as exc:
        return RowResult(row, None, None, error=str(exc))
    t = res.requests.to_pydict()
    ids = np.asarray(t["id"])
    keep = (ids >= row.concurrency * clients.warmup) & (np.asarray(t["status"]) == "completed")
    if not keep.any():
        return RowResult(row, None, None, error="no request completed after the warm-up")
    first, arr, fin = (np.asarray(t[k])[keep] for k in ("first_token_s", "arrival_s", "finish_s"))
    gen = np.asarray(t["generated_tokens"])[keep]
    ttft = float(np.mean(first - arr)) * 1e3
    multi = gen > 1
    tpot = float(np.mean((fin - first)[multi] / (gen[multi] - 1))) * 1e3 if multi.any() else None
    return RowResult(
        row,
        ttft,
        tpot,
        calibrated=bool(res.summary.get("cost_model_calibrated")),
        extra={"preemptions": res.summary.get("preemptions", 0)},
    )


def setup_error(row: BenchRow) -> str | None:
    """Why ``row`` cannot be simulated whatever the engine's terms (its model's weights do not fit
    its GPUs, say), or ``None``: its scenario and deployment are built, nothing is simulated."""
    from sim.config import scenario_from_dict
    from sim.engine.deployment import Deployment

    try:
        Deployment.from_scenario(scenario_from_dict(row_scenario(row, Clients())))
    except ConfigError as exc:
        return str(exc)
    return None


# --- scoring ---------------------------------------------------------------------------------


def error_stats(errs: list[float | None]) -> dict:
    """Median and p90 |error| (rows without one are left out), share within 10 % and 20 %, signed bias (median signed error)."""
    e = np.asarray([x for x in errs if x is not None and math.isfinite(x)], dtype=np.float64)
    if e.size == 0:
        return {"n": 0}
    a = np.abs(e)
    return {
        "n": int(e.size),
        "median_abs": float(np.median(a)),
        "p90_abs": float(np.percentile(a, 90)),
        "within_10": float(np.mean(a <= 0.10)),
        "within_20": float(np.mean(a <= 0.20)),
        "bias": float(np.median(e)),
    }


def _stats(rs: list[RowResult]) -> dict:
    return {
        "ttft": error_stats([r.ttft_err for r in rs]),
        "tpot": error_stats([r.tpot_err for r in rs]),
        "rows": len(rs),
        "failed": sum(r.error is not None for r in rs),
    }


def score(results: list[RowResult], set_aside: Iterable[str] = ()) -> dict:
    """Per (model, GPU, engine) group and overall: TTFT and TPOT error statistics, failed rows.

    ``set_aside``: groups whose measurements look wrong as a whole (faster than their kernels,
    clients that cannot have started together: :mod:`calibration.serving_evidence`); where any of
    them is among the results and rows remain without them, ``overall_unflagged`` gives the same
    statistics over the other groups' rows of the same predictions, and names the groups left out.
    """
    groups: dict[str, list[RowResult]] = {}
    for r in results:
        groups.setdefault(r.row.group, []).append(r)
    out: dict[str, Any] = {"groups": {}, "overall": _stats(results)}
    for g, rs in sorted(groups.items()):
        out["groups"][g] = _stats(rs)
    aside = sorted(set(set_aside) & set(groups))
    rest = [r for r in results if r.row.group not in aside]
    if aside and rest:
        out["overall_unflagged"] = {**_stats(rest), "set_aside": aside}
    return out
