"""Command-line options that ``kvsim calibrate --from-serving-bench`` and ``kvsim validate
--serving-bench`` share: the same flag, the same meaning, one help text. ``mode`` opens each help
text with the option that turns the mode on, since both commands also have other modes the option
does not apply to.
"""

from __future__ import annotations

import typer

WEIGHT_DTYPES = "bf16|fp16|fp8|fp8_block|nvfp4|mxfp4|w4a16"


def engine_option(mode: str, what: str):
    return typer.Option(
        None,
        "--engine",
        help=f"{mode}: {what} (vllm|sglang|trtllm); for JSON results, their engine (default: the one their "
        "backend names, else vllm).",
    )


#: What ``--model`` is for JSON results, in ``validate`` and ``calibrate`` alike.
MODEL_FOR_RESULTS = (
    "with JSON results: the model they ran (a Hugging Face id, a catalog model or a config.json path), in "
    "place of their model_id (SGLang's bench_serving writes none)"
)


def model_option(mode: str):
    return typer.Option(None, "--model", help=f"{mode} {MODEL_FOR_RESULTS}.")


def weights_option(mode: str):
    return typer.Option(
        None,
        "--weights",
        help=f"{mode} with JSON results: their weights ({WEIGHT_DTYPES}; default or auto: the checkpoint's, as kvsim run "
        "--model takes it, else bf16).",
    )


def kv_option(mode: str):
    return typer.Option(
        None,
        "--kv",
        help=f"{mode} with JSON results: their KV cache dtype (bf16|fp16|fp8; default or auto: the engine's).",
    )


def kv_cache_tokens_option(mode: str):
    return typer.Option(
        None,
        "--kv-cache-tokens",
        min=1,
        max=1 << 34,
        help=f"{mode} with vllm JSON results: the KV capacity their server reported, in tokens (vLLM's log line "
        "'GPU KV cache size: N tokens'; default: derived from the GPU's memory).",
    )


def gpu_option(mode: str):
    return typer.Option(None, "--gpu", help=f"{mode} with vllm JSON results: the GPU they ran on.")


def max_evals_option(mode: str):
    return typer.Option(100, "--max-evals", min=1, max=100000, help=f"{mode}: simulations of the rows per engine fit.")


def workers_option(mode: str):
    return typer.Option(1, "--workers", min=1, max=256, help=f"{mode}: processes.")


def exclude_group_option(mode: str):
    return typer.Option(
        None,
        "--exclude-group",
        help=f"{mode}: do not fit on this (model/gpu/engine) group (repeatable); "
        "'suspect' = the groups whose runs are faster than their engine's kernels allow.",
    )


def _flagged_option(flag: str, flagged: str, treated: str):
    """An option that treats what one of the checks flags: ``flagged`` names what it finds,
    ``treated`` how it is then simulated."""

    def option(mode: str, where: str, when: str):
        return typer.Option(False, flag, help=f"{mode}: {flagged} ({where} names them) run {treated}, {when}.")

    return option


hold_back_option = _flagged_option(
    "--hold-back-flagged",
    "the runs whose TTFT follows completions",
    "with concurrency - 1 requests running, one waiting",
)
spread_option = _flagged_option(
    "--spread-flagged",
    "the groups whose clients did not start together",
    "with their clients' starts spread over a request cycle",
)
cache_option = _flagged_option(
    "--cache-flagged",
    "the groups whose runs are faster than their engine's kernels allow",
    "with the least share of every prompt served from the prefix cache that makes them possible",
)


kv_from_runs_option = _flagged_option(
    "--kv-from-runs",
    "the deployments whose runs wait for KV",
    "with the KV capacity those runs imply (the middle of their bracket) where a row sets none",
)


def clients_option(mode: str):
    return typer.Option(
        None,
        "--clients",
        help=f"{mode}: how the benchmark's clients met the server where a row gives no start_spread_cycles: auto (the "
        "default: together for a row whose source_id names an aiconfigurator-core collector run, as every run of "
        "'builtin' does, else apart), together (started at once, in step) or apart (first requests spread over a "
        "request cycle).",
    )


def served_by_option(mode: str):
    return typer.Option(
        None,
        "--served-by",
        help=f"{mode}: how the servers were configured where a row does not say: auto (the default: "
        "aiconfigurator's settings for a row whose source_id names an aiconfigurator-core collector run, as every "
        "run of 'builtin' does, else each engine's own), aiconfigurator (the settings aiconfigurator-core gives an "
        "aggregated deployment at the run's concurrency, for every row) or defaults (each engine's own).",
    )
