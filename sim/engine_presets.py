"""Serving engines as a kernel profile runs them: a small set of framework terms per engine.

A profile prices GPU kernels. A serving engine adds what its framework does around them, and
:class:`EnginePreset` names those terms (seconds unless the name says otherwise):

* **kernels** — which engine's measured kernel tables price the GEMMs and attention
  (``Profile.kernels[engine]``; profiles without them use their default tables);
* **host time** — scheduling, input preparation, sampling and output handling per iteration
  (``host_s``) and per running sequence (``host_per_seq_s``), of which ``host_hidden`` is hidden
  behind the GPU: an iteration takes ``max(GPU + (1 − host_hidden) × host, host)``;
* **CUDA graphs** — iterations of at most ``graph_max_tokens`` tokens replay captured graphs, as
  the kernel tables were measured; others run eagerly and pay ``eager_per_layer_s`` of launch
  gaps per layer (``graph_mixed``: mixed prefill/decode iterations replay too, vLLM's
  piecewise graphs); the host launches an eager iteration's kernels one layer after another,
  ``eager_host_per_layer_s`` per layer, and the GPU cannot finish before the last launch, so an
  eager iteration takes at least its host time plus ``layers × eager_host_per_layer_s``;
* **fused elementwise kernels** — the memory-bound kernels per layer the engine launches after
  its fusions (add + RMSNorm, SiLU·mul, RoPE);
* **custom all-reduce** — messages of at most ``custom_allreduce_max_bytes`` use the engine's
  own all-reduce kernel (``Profile.custom_allreduce[engine]``), larger ones NCCL;
* **fused fp8 input quantization** — an fp8 linear layer timed alone quantizes its bf16 input in a
  kernel of its own; an engine that writes fp8 straight from the previous kernel
  (``fp8_quant_fused``: RMSNorm, SwiGLU and attention with fp8 outputs) does not pay it, so its fp8
  GEMMs are priced at the table's time less that fixed cost (``Profile.fp8_gemm_excess_s``);
* **front end** — per request, HTTP, tokenisation and detokenisation before the engine sees it
  and after it is done (``frontend_s`` + ``frontend_per_token_s`` × prompt tokens), counted in
  TTFT;
* **token stream** — the one front-end process that sends every output token to its client,
  ``stream_per_token_s`` each, in the order the engine made them (``sim/engine/stream.py``): a
  ceiling on output tokens per second that no GPU count lifts; tokens it has not sent yet wait,
  which adds to TTFT and delays a closed-loop client's next request;
* **scheduling** — the server defaults the preset's scheduler runs with when a scenario does not
  set them (``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``), whether prefill
  chunks share iterations with decodes (``mixed_batches``: vLLM yes; SGLang runs prefill batches
  apart), and admission (``reserve_output``: TensorRT-LLM's GUARANTEED_NO_EVICT admits a request
  only when KV for its prompt and its full requested output fits, and never preempts); with
  ``schedule_ahead`` each batch is formed while the iteration before it runs (overlap schedulers),
  so a request arriving mid-iteration joins the iteration after the next;
* **first token** — ``first_token_lag`` iterations pass after the one that made a request's first
  token before its client sees it (TensorRT-LLM's runs show one; later tokens are not held).

The defaults of the engine-level terms (host, eager gaps, front end) are fitted on end-to-end
serving benchmarks (``kvsim calibrate --from-serving-bench``; docs/calibration.md, "Accuracy
against real servers"); the structural ones (graph sizes, fused kernel counts, all-reduce
limits, scheduler defaults) come from each engine's source code and documentation, cited per
field below. ``reference`` is kvsim's own torch engine: the profile's measured CPU overhead and
kernels as they are, no engine terms.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from sim.errors import ConfigError

ENGINE_KINDS = ("vllm", "sglang", "trtllm", "reference")


@dataclass(frozen=True)
class EnginePreset:
    """One serving engine's framework terms (see the module docstring). Seconds, bytes, tokens."""

    name: str
    #: Kernel tables the engine runs (a ``Profile.kernels`` key); ``None``: the profile's default tables.
    kernels: str | None
    #: Host time per iteration, and per running sequence per iteration.
    host_s: float
    host_per_seq_s: float
    #: Share of the host time hidden behind the GPU (async scheduling, overlap schedulers): an
    #: iteration takes max(GPU + (1 − host_hidden) × host, host).
    host_hidden: float
    #: Iterations of at most this many tokens replay CUDA graphs (0: never).
    graph_max_tokens: int
    #: Mixed prefill/decode iterations replay graphs too (vLLM piecewise graphs); else only pure decode.
    graph_mixed: bool
    #: Launch gaps per layer of an eager (non-graph) iteration.
    eager_per_layer_s: float
    #: Memory-bound kernels per layer after the engine's fusions.
    elementwise_per_layer: int
    #: Messages up to this size use the engine's own all-reduce (0: NCCL only).
    custom_allreduce_max_bytes: int
    #: Front-end time per request, fixed and per prompt token, counted in TTFT.
    frontend_s: float
    frontend_per_token_s: float
    #: Scheduler defaults of the engine's server on an 80-141 GB GPU (a scenario's explicit keys win).
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    #: Prefill chunks share iterations with decodes (``False``: prefill iterations run apart).
    mixed_batches: bool
    #: Admit only when KV for the prompt and the whole requested output fits; never preempt.
    reserve_output: bool
    #: fp8 GEMM inputs arrive quantized by the previous kernel: the table's fixed input-quantization
    #: cost (``Profile.fp8_gemm_excess_s``) is not paid.
    fp8_quant_fused: bool = False
    #: Host time to launch one layer's kernels in an eager iteration (a Python model's forward: module
    #: calls, argument checks, launches). An eager iteration lasts at least its host time plus
    #: ``layers ×`` this: on a GPU that computes the layer faster, the host sets the pace. 0 in every
    #: preset: fitted with the other terms, the shipped runs are predicted worse blind
    #: (docs/calibration.md, "Eager iterations and the host").
    eager_host_per_layer_s: float = 0.0
    #: Each iteration's batch is formed while the one before it runs (TensorRT-LLM's and SGLang's
    #: overlap schedulers, vLLM's ``--async-scheduling``): a request that reaches the engine while an
    #: iteration runs joins the iteration after the next. On in TensorRT-LLM's preset (its overlap
    #: scheduler is on by default); off in vLLM's and SGLang's, whose default answers and fitted
    #: terms were measured without it (docs/calibration.md, "Batches formed ahead").
    schedule_ahead: bool = False
    #: Iterations after the one that makes a request's first token before its client sees it
    #: (later tokens are not held). TensorRT-LLM's runs show 1 beside its overlap scheduler; the
    #: code path that holds it is not identified (docs/calibration.md, "The first token, one
    #: iteration late").
    first_token_lag: int = 0
    #: Defaults for the clients' timing when a scenario leaves them unset (``workload.arrival``):
    #: how far closed-loop clients drift apart, in request cycles, and the spread (coefficient of
    #: variation) of each request's client and front-end time.
    client_spread_cycles: float = 0.0
    client_cv: float = 0.0
    #: Default for ``workload.arrival.completion_per_token_s``: seconds per output token that each
    #: finished request holds the benchmark's client (or the server's front end) before its client
    #: sends again, one finished request at a time.
    completion_per_token_s: float = 0.0
    #: Seconds the server's token-streaming process spends per output token, one token at a time
    #: (``sim/engine/stream.py``; 0: tokens reach clients as they are made).
    stream_per_token_s: float = 0.0
    #: Where each value comes from.
    sources: tuple[tuple[str, str], ...] = ()

    def with_overrides(self, **terms) -> EnginePreset:
        unknown = set(terms) - {f.name for f in fields(self)} - {"name", "sources"}
        if unknown:
            raise KeyError(", ".join(sorted(unknown)))
        return replace(self, **terms)

    def terms(self) -> dict:
        """The numeric and boolean terms (what a fit or an overlay may set)."""
        d = asdict(self)
        for k in ("name", "kernels", "sources"):
            d.pop(k)
        return d


#: Terms a serving benchmark can fit, what ``kvsim calibrate --from-serving-bench`` fits (the rest
#: are structural: taken from the engines' code). ``client_spread_cycles`` is not among them:
#: benchmark clients start together (aiperf, genai-perf, ``vllm bench serve``, ``bench_serving``),
#: and what drifts them apart is each request's client and front-end time (``client_cv``); a
#: scenario may still spread its clients' starts. ``stream_per_token_s`` is: the token stream's
#: ceiling shows in runs whose engine outpaces it (docs/calibration.md, "The token stream").
FITTED_TERMS = ("host_s", "host_per_seq_s", "host_hidden", "frontend_s", "client_cv", "stream_per_token_s")

_VLLM_SRC = (
    "vLLM 0.12.0 (engine/arg_utils.py get_batch_defaults; config/vllm.py capture sizes; "
    "cuda_communicator.py custom all-reduce 8 MiB)"
)
_SGL_SRC = (
    "SGLang 0.5.x (server_args.py: chunked_prefill_size 8192, enable_mixed_chunk False, "
    "cuda_graph_max_bs 160-256; custom all-reduce 8 MiB; overlap scheduler on)"
)
_TRT_SRC = (
    "TensorRT-LLM 1.0-1.2 (trtllm-serve: max_batch_size 2048, max_num_tokens 8192, chunked prefill off, "
    "GUARANTEED_NO_EVICT; overlap scheduler on; decode-only CUDA graphs up to 128; AllReduce+RMSNorm fusion; fp8 quantization "
    "fused into RMSNorm / AllReduce+RMSNorm, SwiGLU and the attention output)"
)

_VLLM_FIT_SRC = (
    "fitted on the 673 runs of the shipped silicon_dense_train.csv simulated with each engine's default server "
    "settings, 8 requests per client after 2 warm-ups (host, front end and start spread fitted, client_cv 0); "
    "kept: every documented default answer is priced with it"
)
_FIT_SRC = (
    "kvsim calibrate --from-serving-bench builtin --exclude-group suspect (652 closed-loop runs of "
    "aiconfigurator-core 0.12.0 silicon_dense_train.csv, served and benchmarked as aiconfigurator does; "
    "Nelder-Mead, 60 evaluations per engine)"
)

#: Built-in presets. SGLang's and TensorRT-LLM's fitted terms hold the values of ``kvsim calibrate
#: --from-serving-bench builtin --exclude-group suspect`` (all six ``FITTED_TERMS``, started from
#: the five-term presets with no token stream) on the training file shipped in
#: calibration/data/serving-bench; vLLM's (no token stream) come from the same file simulated with
#: each engine's default server settings (``_VLLM_FIT_SRC``; docs/calibration.md, "Accuracy against real servers").
PRESETS: dict[str, EnginePreset] = {
    "vllm": EnginePreset(
        name="vllm",
        kernels="vllm",
        host_s=2.87e-3,
        host_per_seq_s=35.9e-6,
        host_hidden=0.442,
        graph_max_tokens=512,
        graph_mixed=True,
        eager_per_layer_s=20e-6,
        elementwise_per_layer=3,
        custom_allreduce_max_bytes=8 << 20,
        frontend_s=7.21e-3,
        frontend_per_token_s=0.0,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        chunked_prefill=True,
        mixed_batches=True,
        reserve_output=False,
        client_spread_cycles=0.0995,
        sources=(("structure", _VLLM_SRC), ("fitted", _VLLM_FIT_SRC)),
    ),
    "sglang": EnginePreset(
        name="sglang",
        kernels="sglang",
        host_s=0.5645e-3,
        host_per_seq_s=29.87e-6,
        host_hidden=0.6415,
        graph_max_tokens=160,
        graph_mixed=False,
        eager_per_layer_s=20e-6,
        elementwise_per_layer=4,
        custom_allreduce_max_bytes=8 << 20,
        frontend_s=31.10e-3,
        frontend_per_token_s=0.0,
        max_num_seqs=2048,
        max_num_batched_tokens=8192,
        chunked_prefill=True,
        mixed_batches=False,
        reserve_output=False,
        client_cv=0.01603,
        stream_per_token_s=65.62e-6,
        sources=(("structure", _SGL_SRC), ("fitted", _FIT_SRC)),
    ),
    "trtllm": EnginePreset(
        name="trtllm",
        kernels="trtllm",
        host_s=0.6276e-3,
        host_per_seq_s=6.621e-6,
        host_hidden=0.002603,
        graph_max_tokens=128,
        graph_mixed=False,
        eager_per_layer_s=20e-6,
        elementwise_per_layer=2,
        custom_allreduce_max_bytes=8_000_000,
        frontend_s=5.153e-3,
        frontend_per_token_s=0.0,
        max_num_seqs=2048,
        max_num_batched_tokens=8192,
        chunked_prefill=False,
        mixed_batches=True,
        reserve_output=True,
        fp8_quant_fused=True,
        client_cv=1.198,
        stream_per_token_s=91.55e-6,
        schedule_ahead=True,
        first_token_lag=1,
        sources=(("structure", _TRT_SRC), ("fitted", _FIT_SRC)),
    ),
}


def get_preset(kind: str) -> EnginePreset | None:
    """The preset of ``engine.kind`` (``None`` for ``reference``: the profile's own terms)."""
    return PRESETS.get(kind)


_GiB = 1 << 30
#: vLLM's server defaults on GPUs under 70 GiB, and on every A100 (a larger token budget cost the
#: A100 throughput): vLLM 0.12.0 ``EngineArgs.get_batch_defaults``, OpenAI API server.
VLLM_SMALL_GPU = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
#: SGLang's ``chunked_prefill_size`` and ``cuda_graph_max_bs`` (at tensor parallelism below 4, at 4
#: or more) by GPU memory (``server_args.py``, 0.5.x): below each bound (GiB) the row's values;
#: ``None`` keeps the preset's, which were fitted on 80 and 141 GB GPUs.
SGLANG_MEMORY_TIERS: tuple[tuple[float, int | None, tuple[int, int] | None], ...] = (
    (20, 2048, (8, 8)),
    (35, 2048, (24, 80)),
    (60, 4096, (32, 160)),
    (160, None, None),
    (math.inf, 16384, (512, 512)),
)


def on_gpu(preset: EnginePreset, memory_bytes: int, gpu_name: str, tensor_parallel: int) -> EnginePreset:
    """``preset`` with the server defaults its engine picks for this GPU (bytes of memory per GPU,
    the catalog name): the built-in values are those of an 80-141 GB H100/H200; vLLM and SGLang
    size their token budget, sequence limit and CUDA-graph batch sizes by the GPU's memory
    (:data:`VLLM_SMALL_GPU`, :data:`SGLANG_MEMORY_TIERS`). TensorRT-LLM's server does not."""
    if preset.name == "vllm":
        if memory_bytes < 70 * _GiB or "a100" in gpu_name.lower():
            return replace(
                preset,
                max_num_batched_tokens=VLLM_SMALL_GPU["max_num_batched_tokens"],
                max_num_seqs=VLLM_SMALL_GPU["max_num_seqs"],
            )
        return preset
    if preset.name == "sglang":
        for bound, chunk, graphs in SGLANG_MEMORY_TIERS:
            if memory_bytes < bound * _GiB:
                if chunk is None or graphs is None:
                    return preset
                return replace(
                    preset,
                    max_num_batched_tokens=chunk,
                    graph_max_tokens=graphs[0] if tensor_parallel < 4 else graphs[1],
                )
    return preset


#: Files of fitted terms (``kvsim calibrate --from-serving-bench``), named by ``engine.terms_file``.
TERMS_FORMAT = "kvsim-engine-terms"
#: Allowed range of each fitted term (seconds, or a share).
TERM_RANGES = {
    "host_s": (0.0, 1.0),
    "host_per_seq_s": (0.0, 0.01),
    "host_hidden": (0.0, 1.0),
    "frontend_s": (0.0, 600.0),
    "frontend_per_token_s": (0.0, 0.01),
    "stream_per_token_s": (0.0, 0.01),
    "eager_per_layer_s": (0.0, 0.01),
    "eager_host_per_layer_s": (0.0, 0.01),
    "client_spread_cycles": (0.0, 100.0),
    "client_cv": (0.0, 10.0),
    "completion_per_token_s": (0.0, 0.01),
}


def read_terms_file(path: Path) -> dict[str, dict[str, float]]:
    """``{engine: {term: value}}`` from a terms file, validated (ConfigError naming file, key and value).
    Parsed and validated once per content: a deployment, its engine defaults and its unused-terms
    check each ask, and a plan or sweep builds a deployment per run."""
    from sim.inputs import read_text

    # Bounded: a regular UTF-8 file of at most MAX_TEXT_BYTES, each failure one line naming the file.
    text = read_text(path, "engine.terms_file", "terms JSON file")
    return {engine: dict(terms) for engine, terms in _parse_terms(str(path), text).items()}


@lru_cache(maxsize=16)
def _parse_terms(path: str, text: str) -> dict[str, dict[str, float]]:
    from sim.inputs import load_json

    key = "engine.terms_file"
    # JSON nested at most MAX_NESTING levels (deeper nesting would overflow the JSON parser's recursion).
    doc = load_json(text, key, path, unique_keys=True)
    if not isinstance(doc, dict) or doc.get("format") != TERMS_FORMAT or not isinstance(doc.get("engines"), dict):
        raise ConfigError(
            key,
            str(path),
            f'a JSON object with "format": "{TERMS_FORMAT}" and "engines" '
            "(kvsim calibrate --from-serving-bench writes one)",
        )
    out: dict[str, dict[str, float]] = {}
    for engine, terms in doc["engines"].items():
        if engine not in PRESETS or not isinstance(terms, dict):
            raise ConfigError(f"{path}: engines.{engine}", terms, f"terms of one of {', '.join(PRESETS)}")
        for name, v in terms.items():
            if name not in TERM_RANGES:
                raise ConfigError(f"{path}: engines.{engine}.{name}", v, f"one of {', '.join(TERM_RANGES)}")
            lo, hi = TERM_RANGES[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                raise ConfigError(f"{path}: engines.{engine}.{name}", v, f"a number in [{lo}, {hi}]")
            out.setdefault(engine, {})[name] = float(v)
    return out


# --- engine facts beyond the terms -------------------------------------------------------

#: Other spellings of the engine column's values (benchmark tools and papers write TensorRT-LLM
#: several ways); matched after lower-casing.
ENGINE_ALIASES = {
    "tensorrt-llm": "trtllm",
    "tensorrt_llm": "trtllm",
    "tensorrtllm": "trtllm",
    "trt-llm": "trtllm",
    "trt_llm": "trtllm",
}


def normalize_engine(name: str) -> str:
    """The engine ``name`` spells (lower case; :data:`ENGINE_ALIASES` resolved); unknown names as given."""
    key = str(name).strip().lower()
    return ENGINE_ALIASES.get(key, key)


#: KV block size each engine's server uses by default (vLLM 16, SGLang 1 token, TensorRT-LLM 32).
ENGINE_BLOCK_SIZE = {"vllm": 16, "sglang": 1, "trtllm": 32}


def default_kv(engine: str, weights: str, gpu: str | None = None) -> str:
    """The KV cache dtype a server runs when its command line does not set one.

    TensorRT-LLM's ``KvCacheConfig.dtype`` defaults to ``auto``, which follows the checkpoint's
    quantisation metadata, and the FP8 checkpoints it serves (NVIDIA Model Optimizer's) quantise
    the KV cache too (``kv_cache_quant_algo: FP8``). The shipped training file bears this out: its
    TensorRT-LLM Qwen3-32B fp8 runs on one H100 hold 128 clients of 2048 + 128 tokens with a TTFT
    of 1.6 s, so nearly all of them are resident: about 280 k tokens of KV, 73 GB in bf16 beside
    34 GB of weights on an 80 GB GPU, 36 GB in fp8. vLLM's and SGLang's ``kv_cache_dtype auto`` is
    the model's activation dtype (bf16). A GPU without FP8 tensor cores (``gpu``: a catalog name;
    the A100) has no FP8 KV cache: TensorRT-LLM keeps it in bf16 there.
    """
    from sim.catalog import GPUS

    spec = GPUS.get(gpu) if gpu is not None else None
    if spec is not None and spec.peak_fp8_flops <= 0:
        return "bf16"
    return "fp8" if engine == "trtllm" and (weights.startswith("fp8") or weights == "nvfp4") else "bf16"
