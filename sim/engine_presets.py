"""Serving engines as a kernel profile runs them: a small set of framework terms per engine.

A profile prices GPU kernels. A serving engine adds what its framework does around them, and
:class:`EnginePreset` names those terms (seconds unless the name says otherwise):

* **kernels** — which engine's measured kernel tables price the GEMMs and attention
  (``Profile.kernels[engine]``; profiles without them use their default tables);
* **host time** — scheduling, input preparation, sampling and output handling that is *not*
  hidden behind the GPU, per iteration (``host_s``) and per running sequence
  (``host_per_seq_s``);
* **CUDA graphs** — iterations of at most ``graph_max_tokens`` tokens replay captured graphs, as
  the kernel tables were measured; others run eagerly and pay ``eager_per_layer_s`` of launch
  gaps per layer (``graph_mixed``: mixed prefill/decode iterations replay too, vLLM's
  piecewise graphs);
* **fused elementwise kernels** — the memory-bound kernels per layer the engine launches after
  its fusions (add + RMSNorm, SiLU·mul, RoPE);
* **custom all-reduce** — messages of at most ``custom_allreduce_max_bytes`` use the engine's
  own all-reduce kernel (``Profile.custom_allreduce[engine]``), larger ones NCCL;
* **front end** — per request, HTTP, tokenisation and detokenisation before the engine sees it
  and after it is done (``frontend_s`` + ``frontend_per_token_s`` × prompt tokens), counted in
  TTFT;
* **scheduling** — the server defaults the preset's scheduler runs with when a scenario does not
  set them (``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``), whether prefill
  chunks share iterations with decodes (``mixed_batches``: vLLM yes; SGLang runs prefill batches
  apart), and admission (``reserve_output``: TensorRT-LLM's GUARANTEED_NO_EVICT admits a request
  only when KV for its prompt and its full requested output fits, and never preempts).

The defaults of the engine-level terms (host, eager gaps, front end) are fitted on end-to-end
serving benchmarks (``kvsim calibrate --from-serving-bench``; docs/calibration.md, "Accuracy
against real servers"); the structural ones (graph sizes, fused kernel counts, all-reduce
limits, scheduler defaults) come from each engine's source code and documentation, cited per
field below. ``reference`` is kvsim's own torch engine: the profile's measured CPU overhead and
kernels as they are, no engine terms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

ENGINE_KINDS = ("vllm", "sglang", "trtllm", "reference")


@dataclass(frozen=True)
class EnginePreset:
    """One serving engine's framework terms (see the module docstring). Seconds, bytes, tokens."""

    name: str
    #: Kernel tables the engine runs (a ``Profile.kernels`` key); ``None``: the profile's default tables.
    kernels: str | None
    #: Exposed host time per iteration, and per running sequence per iteration.
    host_s: float
    host_per_seq_s: float
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
    #: Where each value comes from.
    sources: tuple[tuple[str, str], ...] = ()

    def with_overrides(self, **terms) -> "EnginePreset":
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


#: Terms a serving benchmark can fit (the rest are structural: taken from the engines' code).
FITTED_TERMS = ("host_s", "host_per_seq_s", "eager_per_layer_s", "frontend_s", "frontend_per_token_s")

_VLLM_SRC = "vLLM 0.12.0 (engine/arg_utils.py get_batch_defaults; config/vllm.py capture sizes; " \
            "cuda_communicator.py custom all-reduce 8 MiB)"
_SGL_SRC = "SGLang 0.5.x (server_args.py: chunked_prefill_size 8192, enable_mixed_chunk False, " \
           "cuda_graph_max_bs 160-256; custom all-reduce 8 MiB; overlap scheduler on)"
_TRT_SRC = "TensorRT-LLM 1.0-1.2 (trtllm-serve: max_batch_size 2048, max_num_tokens 8192, chunked prefill off, " \
           "GUARANTEED_NO_EVICT; decode-only CUDA graphs up to 128; AllReduce+RMSNorm fusion)"

#: Built-in presets. Fitted terms hold the values of ``kvsim calibrate --from-serving-bench`` on the
#: training file shipped in calibration/data/serving-bench (see docs/calibration.md).
PRESETS: dict[str, EnginePreset] = {
    "vllm": EnginePreset(
        name="vllm", kernels="vllm", host_s=1.0e-3, host_per_seq_s=10e-6, graph_max_tokens=512, graph_mixed=True,
        eager_per_layer_s=20e-6, elementwise_per_layer=3, custom_allreduce_max_bytes=8 << 20,
        frontend_s=5e-3, frontend_per_token_s=0.0, max_num_seqs=1024, max_num_batched_tokens=8192,
        chunked_prefill=True, mixed_batches=True, reserve_output=False, sources=(("structure", _VLLM_SRC),)),
    "sglang": EnginePreset(
        name="sglang", kernels="sglang", host_s=0.5e-3, host_per_seq_s=10e-6, graph_max_tokens=160, graph_mixed=False,
        eager_per_layer_s=20e-6, elementwise_per_layer=4, custom_allreduce_max_bytes=8 << 20,
        frontend_s=5e-3, frontend_per_token_s=0.0, max_num_seqs=2048, max_num_batched_tokens=8192,
        chunked_prefill=True, mixed_batches=False, reserve_output=False, sources=(("structure", _SGL_SRC),)),
    "trtllm": EnginePreset(
        name="trtllm", kernels="trtllm", host_s=1.0e-3, host_per_seq_s=10e-6, graph_max_tokens=128, graph_mixed=False,
        eager_per_layer_s=20e-6, elementwise_per_layer=2, custom_allreduce_max_bytes=8_000_000,
        frontend_s=5e-3, frontend_per_token_s=0.0, max_num_seqs=2048, max_num_batched_tokens=8192,
        chunked_prefill=False, mixed_batches=True, reserve_output=True, sources=(("structure", _TRT_SRC),)),
}


def get_preset(kind: str) -> EnginePreset | None:
    """The preset of ``engine.kind`` (``None`` for ``reference``: the profile's own terms)."""
    return PRESETS.get(kind)
