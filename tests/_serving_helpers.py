"""Shared rows, clients and fitting starts of the serving-benchmark tests (``tests/test_serving_*.py``)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from calibration.serving_bench import (
    BenchRow,
)
from calibration.serving_fit import (
    EngineTerms,
    builtin_terms,
    evaluate,
)
from calibration.serving_runs import Clients
from sim.engine_presets import FITTED_TERMS, PRESETS

REPO = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HEADER = "model,gpu,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms"
GOOD = f"{LLAMA},h100_sxm,vllm,1,128,16,2,20.5,7.25"
#: Few requests per client after one warm-up request: enough for stable means on fixed lengths.
TINY = Clients(requests_per_client=3, warmup=1)
#: The fitting tests' clients: no per-request spread (whatever a preset's default), so the terms alone decide.
FIXED = Clients(requests_per_client=3, warmup=1, client_cv=0.0)
#: Where the fitting tests start, whatever the presets' fitted values are (these were theirs before any fit).
START = {
    "host_s": 1e-3,
    "host_per_seq_s": 10e-6,
    "host_hidden": 0.0,
    "frontend_s": 5e-3,
    "client_cv": 0.0,
    "stream_per_token_s": 0.0,
}


def row(**kw) -> BenchRow:
    d = dict(
        model=LLAMA, gpu="h100_sxm", engine="vllm", tp=1, isl=128, osl=16, concurrency=2, ttft_ms=20.0, tpot_ms=7.0
    )
    d.update(kw)
    return BenchRow(**d)


def measured(rows: list[BenchRow], terms: EngineTerms, clients: Clients = FIXED) -> list[BenchRow]:
    """``rows`` with kvsim's own TTFT and TPOT under ``terms`` as their "measurements"."""
    sims = evaluate(rows, terms, clients)
    assert all(s.error is None for s in sims), [s.error for s in sims]
    return [replace(r, ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms) for r, s in zip(rows, sims)]


def with_terms(**engines: dict) -> EngineTerms:
    """:data:`START` for every engine, with ``engines``' terms changed."""
    assert set(START) == set(FITTED_TERMS)
    t = EngineTerms({e: dict(START) for e in PRESETS})
    for e, v in engines.items():
        t.engines[e].update(v)
    return t


def kvsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=180
    )


def apart_runs(spread: float | None) -> list[BenchRow]:
    """Four TensorRT-LLM runs at 4 clients, prompts of 512 to 4096 tokens, with kvsim's own TTFT and
    TPOT (clients starting together, or ``spread`` request cycles apart) as the measurements, and no
    spread recorded: what a file from such a benchmark holds."""
    rows = [
        row(engine="trtllm", isl=isl, osl=128, concurrency=4, start_spread_cycles=spread)
        for isl in (512, 1024, 2048, 4096)
    ]
    return [replace(r, start_spread_cycles=None) for r in measured(rows, builtin_terms(), TINY)]


def vllm_result(**kw) -> dict:
    """The fields of a ``vllm bench serve --save-result`` file the reader uses (and a few it ignores)."""
    doc = {
        "date": "20250101-000000",
        "backend": "vllm",
        "model_id": LLAMA,
        "tokenizer_id": LLAMA,
        "num_prompts": 40,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 12.5,
        "completed": 40,
        "total_input_tokens": 40 * 512 + 7,
        "total_output_tokens": 40 * 64 - 3,
        "request_throughput": 3.2,
        "mean_ttft_ms": 61.5,
        "median_ttft_ms": 60.0,
        "mean_tpot_ms": 8.25,
        "median_tpot_ms": 8.2,
        "mean_itl_ms": 8.3,
    }
    doc.update(kw)
    return doc


def kv_bound_runs(capacity: int) -> list[BenchRow]:
    """Llama-3.1-8B / TensorRT-LLM runs at 32 and 64 clients, 1024-token prompts and 128 to 2048
    output tokens, with kvsim's own TTFT and TPOT on a server holding ``capacity`` tokens of KV as the
    measurements, and no capacity recorded: what a file from such a server holds."""
    rows = [
        row(engine="trtllm", isl=1024, osl=osl, concurrency=c, kv_cache_tokens=capacity)
        for c in (32, 64)
        for osl in (128, 512, 1024, 2048)
    ]
    return [replace(r, kv_cache_tokens=None) for r in measured(rows, builtin_terms(), TINY)]
