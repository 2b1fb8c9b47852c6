"""Scenario files: YAML validated into typed configuration.

Every key is documented in ``docs/scenario.md``. Sections are flat models with
a ``kind`` plus every knob of every kind (defaults filled), so a dotted
override such as ``--set allocator.kind=static`` never has to delete the
knobs of the previous kind. Errors name the key, the value and what is
allowed (:class:`sim.errors.ConfigError`).
"""

from __future__ import annotations

import copy
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_core import to_jsonable_python

from sim.catalog import CUSTOM_GPU, find_gpu
from sim.errors import ConfigError
from sim.inputs import candidate_paths, is_file, load_yaml, read_text
from sim.limits import (
    MAX_BYTES,
    MAX_CV,
    MAX_DIM,
    MAX_GROUPS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MULTIPLIER,
    MAX_NESTING,
    MAX_OVERHEAD_FACTOR,
    MAX_PARAMS,
    MAX_PER_SEQ_OVERHEAD_S,
    MAX_PREFIX_TOKENS_TOTAL,
    MAX_RATE,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SEQS,
    MAX_SIGMA,
    MAX_STEP_OVERHEAD_S,
    MAX_TIME_S,
    MAX_TIME_SCALE,
    MAX_TOKENS,
    MAX_VOCAB,
    MIN_CV,
    MIN_EFFICIENCY,
    MIN_PERIOD_S,
    MIN_RATE,
    MIN_TIME_SCALE,
)
from sim.package_data import SCENARIO_DIR
from sim.strict import strict_scalar

#: Marks a field whose value names a file (``json_schema_extra``). Untrusted scenarios (the
#: explorer's uploads) have every such field vetted at any depth: see :func:`file_fields`.
NAMES_FILE: JsonDict = {"names_file": True}

#: Scenario and sweep names become directory names (``runs/<name>``, ``sweeps/<name>``): no path
#: separators, no leading dot, no ``..``.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,127}$")
NAME_ALLOWED = "letters, digits and _ . + = @ , - (not starting with '.', no '/' or '..'), at most 128 characters"


def check_name(value: str) -> str:
    """``value`` if it is a safe run/sweep name (:data:`NAME_RE`), else ``ValueError``."""
    if not isinstance(value, str) or not NAME_RE.match(value) or ".." in value:
        raise ValueError(f"a name of {NAME_ALLOWED}")
    return value


#: A YAML file's top-level ``kind`` that marks it as a ``kvsim validate`` spec, not a scenario.
VALIDATION_KIND = "validation"

#: ``allocator.kind`` values, in listing order. Each is registered with its builder in
#: ``sim/allocators/kinds.py``, which checks on import that its registrations are exactly these;
#: a kind registered at run time (``sim.allocators.registry.register``) is added here.
ALLOCATOR_KINDS: list[str] = ["static", "dynamic", "paged", "hybrid_tail", "hybrid_reserve"]
#: ``scheduler.kind`` values, likewise (``sim/sched/registry.py``).
SCHEDULER_KINDS: list[str] = ["continuous", "static_batch"]


class FieldError(ValueError):
    """Raised by a model validator about one field of its model: the error names that field (and
    ``value``), not the whole section, as a field's own validation would."""

    def __init__(self, field: str, value: Any, allowed: str):
        super().__init__(allowed)
        self.field = field
        self.value = value
        self.allowed = allowed


def _known_kind(value: str, kinds: list[str]) -> str:
    if value not in kinds:
        raise ValueError(f"one of {', '.join(kinds)}")
    return value


class _Section(BaseModel):
    # Non-finite numbers are refused everywhere; every number has a finite range (sim/limits.py).
    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict(cls, value: Any, info: ValidationInfo) -> Any:
        # No true/false as a number, no number as true/false (sim/strict.py).
        assert info.field_name is not None
        return strict_scalar(cls.model_fields[info.field_name].annotation, value)


class ModelConfig(_Section):
    """A catalog model, a Hugging Face ``config.json`` (``hf_config``), optionally with dims
    overridden, or fully explicit dims (``name: custom``)."""

    name: str | None = "llama-3.1-8b"
    #: A config.json path or a shipped model's Hugging Face id (``sim/hf_config.py``); ``name`` is
    #: then only a label, and weight/KV dtypes not given here come from its quantisation config.
    hf_config: str | None = Field(None, min_length=1, json_schema_extra=NAMES_FILE)
    layers: int | None = Field(None, ge=1, le=MAX_LAYERS)
    hidden: int | None = Field(None, ge=1, le=MAX_DIM)
    heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    head_dim: int | None = Field(None, ge=1, le=MAX_DIM)
    intermediate: int | None = Field(None, ge=1, le=MAX_DIM)
    params: float | None = Field(None, gt=0, le=MAX_PARAMS)
    vocab: int | None = Field(None, ge=1, le=MAX_VOCAB)
    sliding_window: int | None = Field(None, ge=1, le=MAX_TOKENS)
    #: Per-head RMSNorm on queries and keys (the catalog's or config's own unless set).
    qk_norm: bool | None = None
    #: ``fp8_block``: fp8 weights with block-wise scales (DeepGEMM-style kernels; priced on the engine's
    #: block-fp8 GEMM table where it has one, else on its per-tensor fp8 table).
    #: ``nvfp4``: NVIDIA's 4-bit format with fp8 scales per 16 values (Blackwell; priced on the
    #: profile's nvfp4 GEMM tables, which only a Blackwell profile has).
    weight_dtype: Literal["bf16", "fp16", "fp8", "fp8_block", "nvfp4"] = "bf16"
    kv_dtype: Literal["bf16", "fp16", "fp8", "int4"] = "bf16"


#: ``gpu.name: custom`` needs these figures (units in the names); fp8_tflops, fp4_tflops and
#: nvlink_gbps may be 0 (and are, left out).
CUSTOM_GPU_REQUIRED = ("memory_gib", "hbm_tbps", "bf16_tflops", "pcie_gbps")
CUSTOM_GPU_OPTIONAL = ("fp8_tflops", "fp4_tflops", "nvlink_gbps")
CUSTOM_GPU_FIELDS = (*CUSTOM_GPU_REQUIRED, *CUSTOM_GPU_OPTIONAL)


class GpuConfig(_Section):
    name: str = "H100-SXM-80GB"
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    tensor_parallel: Literal[1, 2, 4, 8] = 1
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    #: Bytes per replica kept for activations; ``None`` derives it like vLLM's profiling run.
    activation_reserve_bytes: int | None = Field(None, ge=0, le=MAX_BYTES)
    #: KV capacity per replica in tokens as the server reports it (vLLM's "GPU KV cache size: N
    #: tokens", SGLang's ``max_total_num_tokens``); overrides the capacity derived from memory.
    kv_cache_tokens: int | None = Field(None, ge=1, le=1 << 34)
    #: ``name: custom`` only: the card's figures (dense tensor-core TFLOP/s; 0 = none).
    memory_gib: float | None = Field(None, gt=0, le=4096)
    hbm_tbps: float | None = Field(None, gt=0, le=1000)
    bf16_tflops: float | None = Field(None, gt=0, le=1e6)
    fp8_tflops: float | None = Field(None, ge=0, le=1e6)
    #: Dense FP4 (NVFP4) tensor-core peak: 0 = no FP4 units (nvfp4 weights then run at the fp8 peak).
    fp4_tflops: float | None = Field(None, ge=0, le=1e6)
    nvlink_gbps: float | None = Field(None, ge=0, le=1e5)
    pcie_gbps: float | None = Field(None, gt=0, le=1e5)

    @field_validator("name")
    @classmethod
    def _catalog_name(cls, v: str) -> str:
        # H100, h100_sxm and nvidia-smi's names mean the catalog's card: stored as its name, so the
        # resolved scenario, the profile lookup and the reports all read one spelling.
        return find_gpu(v) or v

    def check_custom(self) -> None:
        """The figures are given for ``name: custom`` and only for it (ConfigError naming the field)."""
        if self.name == "custom":
            for f in CUSTOM_GPU_REQUIRED:
                if getattr(self, f) is None:
                    raise ConfigError(
                        f"gpu.{f}",
                        None,
                        f"gpu.name 'custom' needs {', '.join(CUSTOM_GPU_REQUIRED)} "
                        f"(optional: {', '.join(CUSTOM_GPU_OPTIONAL)}; docs/scenario.md)",
                    )
            return
        for f in CUSTOM_GPU_FIELDS:
            if getattr(self, f) is not None:
                if find_gpu(self.name) is None:
                    # Not a catalog card (H20): its figures go with gpu.name custom, not under its name.
                    raise ConfigError(
                        "gpu.name",
                        self.name,
                        f"a catalog GPU (kvsim list gpus) or '{CUSTOM_GPU}'; {self.name} is not in the catalog "
                        f"(gpu.{f} is given for it): describe it with gpu.name={CUSTOM_GPU} and its "
                        f"{', '.join(CUSTOM_GPU_REQUIRED)} (optional: {', '.join(CUSTOM_GPU_OPTIONAL)})",
                    )
                raise ConfigError(
                    f"gpu.{f}",
                    getattr(self, f),
                    f"only with gpu.name '{CUSTOM_GPU}'; {self.name} has its own figures (kvsim list gpus)",
                )


#: ``start_spread_cycles`` of clients apart: a request cycle, as far apart as clients can drift. A
#: benchmark whose harness kvsim has not seen keep its clients in step is simulated so
#: (``kvsim validate --serving-bench``, ``kvsim compare``; docs/calibration.md, "Which clients meet").
APART_SPREAD_CYCLES = 1.0


class ArrivalConfig(_Section):
    kind: Literal["poisson", "gamma", "trace", "closed_loop"] = "poisson"
    rate: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE)
    cv: float = Field(1.0, ge=MIN_CV, le=MAX_CV)
    path: str | None = Field(None, min_length=1, json_schema_extra=NAMES_FILE)
    format: Literal["auto", "azure", "mooncake", "csv", "parquet"] = "auto"
    time_scale: float = Field(1.0, ge=MIN_TIME_SCALE, le=MAX_TIME_SCALE)
    concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    think_time_s: float = Field(0.0, ge=0, le=MAX_TIME_S)
    #: closed_loop, how benchmark clients time requests: client ``i`` sends its first request at a
    #: uniform random offset in [0, start_spread_s); think times are gamma-distributed with mean
    #: ``think_time_s`` and coefficient of variation ``think_time_cv``.
    start_spread_s: float = Field(0.0, ge=0, le=86400)
    #: The same spread in request cycles (one request's prefill plus its decode at the full
    #: concurrency, estimated from the cost model), added to ``start_spread_s``: how far apart a
    #: benchmark's clients have drifted once it runs steadily.
    start_spread_cycles: float = Field(0.0, ge=0, le=100)
    think_time_cv: float = Field(0.0, ge=0, le=10)
    #: Any arrival kind: per request, client-side time before the server's front end (network,
    #: client event loop), added to the engine's front end (``engine.frontend_s``); the sum is drawn
    #: per request from a gamma distribution with coefficient of variation ``client_cv``. It
    #: counts in TTFT.
    client_s: float = Field(0.0, ge=0, le=600)
    client_cv: float = Field(0.0, ge=0, le=10)
    #: closed_loop: seconds per output token that each finished request holds its client before
    #: the client sends again, and one finished request at a time (a benchmark client's single
    #: event loop reading and counting each response, or a server front end finishing it). Clients
    #: whose requests finish in the same iteration so send again apart: how fixed-length benchmark
    #: clients drift apart, the more so the longer the outputs. Not in TTFT (it is before the send).
    completion_per_token_s: float = Field(0.0, ge=0, le=0.01)
    #: poisson, gamma and trace: the client's cap on requests in flight (sent and not yet finished
    #: or rejected), as ``vllm bench serve --max-concurrency``. A request due (at its drawn or trace
    #: time) while the cap is reached waits in the client, first come first served, and is sent when
    #: one ends; its arrival at the server, from which TTFT and end-to-end latency are measured, is
    #: that send time. ``None``: no cap.
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)

    @model_validator(mode="after")
    def _needs(self):
        # Each names the missing field itself, not the whole section (with a path left from another kind).
        if self.kind in ("poisson", "gamma") and self.rate is None:
            raise FieldError("rate", None, f"requests/s, > 0 (arrival kind {self.kind!r} needs it)")
        if self.kind == "trace" and not self.path:
            raise FieldError("path", None, "a trace file (arrival kind 'trace' needs it)")
        if self.kind == "closed_loop" and self.concurrency is None:
            raise FieldError("concurrency", None, "clients, >= 1 (arrival kind 'closed_loop' needs it)")
        if self.kind == "closed_loop" and self.max_concurrency is not None:
            # A closed loop's clients are its cap already; a second one would silently do nothing.
            raise FieldError(
                "max_concurrency",
                self.max_concurrency,
                "unset with arrival kind 'closed_loop' (its concurrency, the number of clients, is its cap); "
                "a cap for arrival kinds poisson, gamma and trace",
            )
        return self


#: The ``workload.arrival`` keys each arrival kind reads besides ``kind`` (the workload generator,
#: sim/workload/generator.py, and the engine's clients, sim/engine/cluster.py), and
#: :data:`ARRIVAL_COMMON_KEYS`, which every kind reads. One key per field; tests/test_arrival_use.py
#: checks each kind against what changes its runs. A sweep axis on a key that the arrival kind of
#: none of its points reads is refused (sim/workload/arrival_use.py).
ARRIVAL_KEYS: dict[str, tuple[str, ...]] = {
    "poisson": ("rate", "max_concurrency"),
    "gamma": ("rate", "cv", "max_concurrency"),
    "trace": ("path", "format", "time_scale", "max_concurrency"),
    "closed_loop": (
        "concurrency",
        "think_time_s",
        "think_time_cv",
        "start_spread_s",
        "start_spread_cycles",
        "completion_per_token_s",
    ),
}
ARRIVAL_COMMON_KEYS: tuple[str, ...] = ("client_s", "client_cv")


class LengthsConfig(_Section):
    kind: Literal["fixed", "uniform", "lognormal", "empirical", "mixture", "trace"] = "fixed"
    prompt_tokens: int = Field(512, ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(128, ge=1, le=MAX_TOKENS)
    prompt_min: int = Field(1, ge=1, le=MAX_TOKENS)
    prompt_max: int = Field(1024, ge=1, le=MAX_TOKENS)
    output_min: int = Field(1, ge=1, le=MAX_TOKENS)
    output_max: int = Field(256, ge=1, le=MAX_TOKENS)
    prompt_median: float = Field(512.0, ge=1, le=MAX_TOKENS)
    prompt_sigma: float = Field(1.0, ge=0, le=MAX_SIGMA)
    output_median: float = Field(128.0, ge=1, le=MAX_TOKENS)
    output_sigma: float = Field(1.0, ge=0, le=MAX_SIGMA)
    path: str | None = Field(None, min_length=1, json_schema_extra=NAMES_FILE)
    format: Literal["auto", "azure", "mooncake", "csv", "parquet", "length_stats"] = "auto"
    base: LengthsConfig | None = None
    outlier_fraction: float = Field(0.1, ge=0, le=1)
    outlier_multiplier: float = Field(4.0, gt=0, le=MAX_MULTIPLIER)
    #: mixture: what the multiplier scales in an outlier: its prompt and output, or one of them
    #: (long documents with ordinary answers: ``prompt``).
    outlier_scales: Literal["both", "prompt", "output"] = "both"

    @model_validator(mode="after")
    def _needs(self):
        if self.kind == "uniform":
            if self.prompt_min > self.prompt_max:
                raise FieldError("prompt_min", self.prompt_min, f"at most prompt_max ({self.prompt_max})")
            if self.output_min > self.output_max:
                raise FieldError("output_min", self.output_min, f"at most output_max ({self.output_max})")
        if self.kind == "empirical" and not self.path:
            raise FieldError("path", None, "a trace or length-stats file (lengths kind 'empirical' needs it)")
        if self.kind == "mixture" and self.base is None:
            raise FieldError("base", None, "another lengths block (lengths kind 'mixture' needs it)")
        return self


class PrefixConfig(_Section):
    """Synthetic shared prefixes (system prompts, RAG templates): a ``fraction`` of requests get
    one of ``groups`` shared prefixes of ``prefix_tokens`` tokens in front of their prompt."""

    fraction: float = Field(0.0, ge=0, le=1)
    prefix_tokens: int = Field(1024, ge=1, le=MAX_TOKENS)
    groups: int = Field(1, ge=1, le=MAX_GROUPS)

    @model_validator(mode="after")
    def _bounded(self):
        # Each shared prefix keeps one id per 16 tokens for the whole run.
        if self.fraction > 0 and self.prefix_tokens * self.groups > MAX_PREFIX_TOKENS_TOTAL:
            raise ValueError(
                f"prefix_tokens × groups (distinct shared-prefix tokens) of at most "
                f"{MAX_PREFIX_TOKENS_TOTAL}; got {self.prefix_tokens} × {self.groups}"
            )
        return self


class PriorityConfig(_Section):
    """Request classes for priority preemption: ``high_fraction`` of requests get priority 1, the rest 0."""

    high_fraction: float = Field(0.0, ge=0, le=1)


#: ``workload.lengths.kind`` values, in listing order (what error messages list).
LENGTH_KINDS: tuple[str, ...] = typing.get_args(LengthsConfig.model_fields["kind"].annotation)


def count_needed() -> str:
    """What ``workload.num_requests`` may be when nothing else ends the arrivals."""
    return f"{range_text(WorkloadConfig.model_fields['num_requests'])} (or set workload.duration_s)"


class WorkloadConfig(_Section):
    #: Requests to simulate; ``None`` (no count) needs ``duration_s`` or trace arrivals (the whole trace).
    num_requests: int | None = Field(1000, ge=1, le=MAX_REQUESTS)
    #: Seconds of arrivals; with it, ``num_requests`` caps the count only where given explicitly.
    duration_s: float | None = Field(None, gt=0, le=MAX_TIME_S)
    max_model_len: int = Field(8192, ge=2, le=MAX_TOKENS)
    arrival: ArrivalConfig = ArrivalConfig(kind="poisson", rate=1.0)
    #: ``None``: the rows of the arrival trace with trace arrivals, else the defaults of a lengths
    #: block (filled in on validation, so the resolved scenario says what runs).
    lengths: LengthsConfig | None = None
    prefix: PrefixConfig = PrefixConfig()
    priority: PriorityConfig = PriorityConfig()

    @model_validator(mode="after")
    def _bounded(self):
        # Synthetic and closed-loop arrivals have no end of their own: without a count or a
        # duration nothing would stop drawing them.
        if self.num_requests is None and self.duration_s is None and self.arrival.kind != "trace":
            raise FieldError("num_requests", None, count_needed())
        if self.lengths is None and self.arrival.kind != "trace":
            # Every key is optional (docs/scenario.md): `{}` runs the documented defaults.
            self.lengths = LengthsConfig()
        return self


class SchedulerConfig(_Section):
    #: ``continuous`` (vLLM-v1-like iteration-level batching) or ``static_batch`` (request-level,
    #: FasterTransformer-style: a batch padded to its longest member runs to completion).
    kind: str = "continuous"
    max_num_seqs: int = Field(256, ge=1, le=MAX_SEQS)
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_TOKENS)
    chunked_prefill: bool = True
    #: Prefill chunks share iterations with decodes (vLLM) or run in iterations of their own
    #: (SGLang); ``None``: the serving engine's (``engine.kind``).
    mixed_batches: bool | None = None
    #: Admit a request only when KV for its prompt and whole output fits (TensorRT-LLM's
    #: GUARANTEED_NO_EVICT); ``None``: the serving engine's.
    reserve_output: bool | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _known_kind(v, SCHEDULER_KINDS)


class CompactionConfig(_Section):
    """Background compaction of contiguous arenas (the article's thresholds)."""

    enabled: bool = False
    below_utilization: float = Field(0.70, ge=0, le=1)
    above_fragmentation: float = Field(0.50, ge=0, le=1)
    #: ``stall``: the replica pauses for the copy time; ``background``: copies run beside
    #: iterations, which are slowed by ``background_slowdown`` while they last.
    mode: Literal["stall", "background"] = "stall"
    background_slowdown: float = Field(0.25, ge=0, le=MAX_OVERHEAD_FACTOR)
    #: At most one compaction per this many seconds.
    period_s: float = Field(0.5, ge=MIN_PERIOD_S, le=MAX_TIME_S)


class PrefixCachingConfig(_Section):
    enabled: bool = False
    eviction: Literal["lru", "lfu"] = "lru"


class PreemptionConfig(_Section):
    #: ``recompute`` frees a victim's KV and re-prefills it later (vLLM); ``swap`` copies it to
    #: host memory over PCIe and back.
    mode: Literal["recompute", "swap"] = "recompute"
    #: Host memory for swapped KV per replica; a victim that does not fit is recomputed.
    swap_capacity_bytes: int = Field(64 * 2**30, ge=0, le=MAX_BYTES)
    #: ``lifo``: the most recently admitted running request (vLLM); ``lowest_priority``: the
    #: request with the lowest priority (``workload.priority``; ties: most recent).
    victim: Literal["lifo", "lowest_priority"] = "lifo"


class AllocatorConfig(_Section):
    #: One of :data:`ALLOCATOR_KINDS`. Every kind takes the knobs below it reads (its registration
    #: names them; ``kvsim list allocators``) and ignores the rest; the defaults are these.
    kind: str = "paged"
    block_size: int = Field(16, ge=1, le=4096)
    #: static: ``max_model_len``, a token count, or a percentile ``pNN`` of total request length over
    #: the lengths the workload draws from (``Workload.reference_lengths``), not the run's own draws.
    reserve: int | str = "max_model_len"
    #: static: a sequence that outgrows its reservation is rejected, truncated (completed early), or
    #: moved to a paged fallback region of ``fallback_fraction`` of KV memory (one copy of its KV).
    overflow: Literal["reject", "truncate", "fallback"] = "reject"
    fallback_fraction: float = Field(0.1, gt=0, lt=1)
    #: paged: ``zero`` memsets a block before reuse; ``generation`` marks it stale with a counter (free).
    page_reuse: Literal["generation", "zero"] = "generation"
    #: dynamic: grow an extent one token at a time or in chunks of ``chunk_tokens``.
    growth: Literal["token", "chunk"] = "chunk"
    chunk_tokens: int = Field(512, ge=1, le=MAX_TOKENS)
    #: static, dynamic, hybrid_tail's static partition: where extents go.
    placement: Literal["first_fit", "best_fit", "buddy"] = "first_fit"
    compaction: CompactionConfig = CompactionConfig()
    prefix_caching: PrefixCachingConfig = PrefixCachingConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    #: hybrid_tail: requests predicted longer than this (``pNN`` of total length, or tokens) get a
    #: static reservation of ``max_model_len`` from a partition of ``static_fraction`` of KV memory.
    long_threshold: int | str = "p90"
    static_fraction: float = Field(0.3, gt=0, lt=1)
    #: hybrid_tail: how a request's total length is predicted at admission (``sim/workload/predictor.py``):
    #: ``prompt`` (what is known: the prompt and any tokens already generated), ``quantile`` (the
    #: prompt plus the ``predictor_quantile`` quantile of the output length given the prompt, fitted on
    #: the lengths the workload is drawn from) or ``oracle`` (the true length: an upper bound no server
    #: reaches, labelled so in every output). ``prompt`` is the default: a request predicted long
    #: wrongly holds a max_model_len slot, one predicted short wrongly costs one copy when it moves.
    length_predictor: Literal["prompt", "quantile", "oracle"] = "prompt"
    predictor_quantile: float = Field(0.9, gt=0, lt=1)
    #: hybrid_reserve: a reserve only running sequences may grow into; preempt above
    #: ``preempt_at_usage``; pause admissions while free < ``admit_when_free_above``; drop
    #: sequences that have not advanced for ``stale_after_s`` (none = never).
    reserve_fraction: float = Field(0.15, ge=0, lt=1)
    preempt_at_usage: float = Field(0.95, gt=0, le=1)
    admit_when_free_above: float = Field(0.10, ge=0, lt=1)
    stale_after_s: float | None = Field(None, ge=MIN_PERIOD_S, le=MAX_TIME_S)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _known_kind(v, ALLOCATOR_KINDS)


class CostModelConfig(_Section):
    #: ``auto`` (the built-in profile of the GPU when it covers the model, else the roofline
    #: prior), ``none`` (roofline prior), a built-in profile name, or a path to a profile JSON.
    profile: str | None = Field("auto", min_length=1, json_schema_extra=NAMES_FILE)
    compute_efficiency: float = Field(0.6, ge=MIN_EFFICIENCY, le=1)
    memory_efficiency: float = Field(0.8, ge=MIN_EFFICIENCY, le=1)
    step_overhead_s: float = Field(2.0e-3, ge=0, le=MAX_STEP_OVERHEAD_S)
    per_seq_overhead_s: float = Field(10e-6, ge=0, le=MAX_PER_SEQ_OVERHEAD_S)
    paged_attention_overhead: float = Field(0.2, ge=0, le=MAX_OVERHEAD_FACTOR)


class TimeseriesConfig(_Section):
    #: Sample the per-replica time series every this many simulated seconds (last values plus
    #: exact per-interval peaks); ``None`` = one row per batch change.
    every_s: float | None = Field(None, ge=MIN_PERIOD_S, le=MAX_TIME_S)


class EngineConfig(_Section):
    mode: Literal["fast_forward", "step"] = "fast_forward"
    #: The serving engine whose framework terms go on top of the kernel profile
    #: (``sim/engine_presets.py``): ``vllm``, ``sglang``, ``trtllm``, or ``reference`` (kvsim's own
    #: torch engine: the profile's measured CPU overhead, no engine terms). ``auto``: ``vllm``
    #: (``reference`` on ``gpu.name: cpu``, where kvsim's own engine is the only one).
    kind: Literal["auto", "vllm", "sglang", "trtllm", "reference"] = "auto"
    #: Overrides of the preset's terms (``None``: the preset's, or a profile's fitted ones). Seconds.
    host_s: float | None = Field(None, ge=0, le=1)
    host_per_seq_s: float | None = Field(None, ge=0, le=0.01)
    host_hidden: float | None = Field(None, ge=0, le=1)
    eager_per_layer_s: float | None = Field(None, ge=0, le=0.01)
    eager_host_per_layer_s: float | None = Field(None, ge=0, le=0.01)
    frontend_s: float | None = Field(None, ge=0, le=600)
    frontend_per_token_s: float | None = Field(None, ge=0, le=0.01)
    stream_per_token_s: float | None = Field(None, ge=0, le=0.01)
    graph_max_tokens: int | None = Field(None, ge=0, le=1 << 20)
    elementwise_per_layer: int | None = Field(None, ge=0, le=64)
    custom_allreduce_max_bytes: int | None = Field(None, ge=0, le=1 << 40)
    #: fp8 GEMMs take inputs the previous kernel already quantized (no quantization kernel of their own).
    fp8_quant_fused: bool | None = None
    #: The batch of each iteration is formed while the one before it runs (overlap scheduler).
    schedule_ahead: bool | None = None
    #: Iterations after its first token is made before a request's client sees it (0-4).
    first_token_lag: int | None = Field(None, ge=0, le=4)
    #: The engine's defaults for ``workload.arrival`` ``start_spread_cycles``, ``client_cv`` and
    #: ``completion_per_token_s``.
    client_spread_cycles: float | None = Field(None, ge=0, le=100)
    client_cv: float | None = Field(None, ge=0, le=10)
    completion_per_token_s: float | None = Field(None, ge=0, le=0.01)
    #: A file of fitted terms (``kvsim calibrate --from-serving-bench``): its values for this engine
    #: replace the preset's; the keys above still win.
    terms_file: str | None = Field(None, min_length=1, json_schema_extra=NAMES_FILE)


class LengthSplitConfig(_Section):
    """``router: length_split``: a pool of replicas kept for long prompts, so that their prefills
    do not hold up the short requests' first tokens. Requests whose prompt has at least
    ``prompt_tokens`` tokens go to the last ``replicas`` replicas (or ``share`` of them), the others
    to the rest; within a pool, the replica with the fewest running + waiting requests."""

    prompt_tokens: int = Field(8192, ge=1, le=MAX_TOKENS)
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    #: The long-prompt pool as a share of ``gpu.replicas`` instead of a count (the planner varies
    #: the replica count and needs one).
    share: float | None = Field(None, gt=0, lt=1)

    def long_replicas(self, total: int) -> int:
        """Replicas kept for long prompts out of ``total``: ``replicas``, or ``share`` of ``total``
        rounded half up, at least 1 and leaving at least 1 for the others."""
        if self.share is None:
            return self.replicas
        return min(total - 1, max(1, math.floor(self.share * total + 0.5)))


class Scenario(_Section):
    #: Also the default run directory's name (``runs/<name>``).
    name: str = "unnamed"
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    router: Literal["round_robin", "least_outstanding", "prefix_affinity", "length_split"] = "least_outstanding"
    #: The long-prompt pool of ``router: length_split`` (read only with that router).
    length_split: LengthSplitConfig = LengthSplitConfig()
    model: ModelConfig = ModelConfig()
    gpu: GpuConfig = GpuConfig()
    workload: WorkloadConfig = WorkloadConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    allocator: AllocatorConfig = AllocatorConfig()
    cost_model: CostModelConfig = CostModelConfig()
    engine: EngineConfig = EngineConfig()
    timeseries: TimeseriesConfig = TimeseriesConfig()
    #: Directory that relative paths in the scenario resolve against (not a YAML key).
    base_dir: str = Field(default=str(SCENARIO_DIR), exclude=True)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _split_pools(self):
        split = self.length_split
        if split.share is not None and "replicas" in split.model_fields_set:
            raise FieldError(
                "length_split.replicas",
                split.replicas,
                "left out with length_split.share (the long-prompt pool is a count or a share of gpu.replicas)",
            )
        if self.router != "length_split":
            return self
        if split.share is not None:
            if self.gpu.replicas < 2:
                raise FieldError(
                    "gpu.replicas",
                    self.gpu.replicas,
                    "at least 2 with router length_split: a pool for long prompts and one for the others",
                )
            return self
        if self.length_split.replicas >= self.gpu.replicas:
            raise FieldError(
                "length_split.replicas",
                self.length_split.replicas,
                f"fewer than gpu.replicas ({self.gpu.replicas}): router length_split keeps that many replicas "
                "for long prompts and needs at least one for the others",
            )
        return self

    def resolve_path(self, path: str, key: str) -> Path:
        """A trace path: absolute, relative to the scenario file, or relative to ``scenarios/``."""
        for cand in candidate_paths(path, self.base_dir):
            if is_file(cand):
                return cand
        raise ConfigError(key, path, "a readable file (absolute, or relative to the scenario file or scenarios/)")

    def to_yaml(self) -> str:
        """The scenario as YAML that reruns it exactly: the keys it sets (:func:`set_keys`), since
        which keys are set changes a run, not only their values (the serving engine fills the
        scheduler and client keys a scenario leaves unset; ``num_requests`` caps a ``duration_s``
        workload only where given). Every key with the value it runs with, defaults included,
        follows as comments, for reading (what :func:`sim.output.results.write_run` writes runs
        with the serving engine's defaults already filled in, so those are keys it sets)."""
        body = yaml.safe_dump(set_keys(self), sort_keys=False)
        full = yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
        return (
            body
            + "\n# Every key with the value it ran with, for reading only: a key not set above is left to\n"
            + "# its default when this file runs (editing these lines changes nothing).\n"
            + "".join(f"#   {line}\n" for line in full.splitlines())
        )


def set_keys(model: BaseModel) -> dict[str, Any]:
    """The keys set in ``model`` at every depth (its ``model_fields_set``, and each section's) as
    JSON-able data, leaving out every key never set: the data that validates to a model
    that runs as ``model`` does. A full dump would not: every key in it counts as set, so what
    depends on which keys a scenario sets changes (``with_engine_defaults`` fills only unset keys;
    ``num_requests`` caps a ``duration_s`` workload only where given). Values kvsim assigned while
    resolving the scenario (a ``max_model_len`` cut to the model's context, a Hugging Face config's
    dtypes, the serving engine's defaults) count as set. A section some key of which is set is kept
    even where its parent did not mark it set (pydantic's ``exclude_unset`` would drop it). A list
    (or mapping) of sections keeps each element's set keys, not its full dump."""
    out: dict[str, Any] = {}
    given = model.model_fields_set
    for name, f in type(model).model_fields.items():
        if f.exclude:
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            inner = set_keys(value)
            if inner or name in given:
                out[name] = inner
        elif _holds_sections(value):
            # A full dump would mark every key of every element set once loaded again.
            data = _set_data(value)
            if name in given or _sets_any(data):
                out[name] = data
        elif name in given:
            out[name] = model.model_dump(mode="json", include={name})[name]
    return out


def _holds_sections(value: Any) -> bool:
    """Whether ``value`` is a list, tuple or mapping with a section (a pydantic model) in it, at any depth."""
    if isinstance(value, BaseModel):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_sections(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_sections(v) for v in value.values())
    return False


def _sets_any(data: Any) -> bool:
    """Whether :func:`_set_data`'s ``data`` holds any key set in a section."""
    if isinstance(data, dict):
        return bool(data)
    return isinstance(data, list) and any(_sets_any(v) for v in data)


def _set_data(value: Any) -> Any:
    """:func:`set_keys` of each section in a list, tuple or mapping; anything else as JSON data."""
    if isinstance(value, BaseModel):
        return set_keys(value)
    if isinstance(value, (list, tuple)):
        return [_set_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _set_data(v) for k, v in value.items()}
    return to_jsonable_python(value)


def sub_model(annotation: Any) -> type[BaseModel] | None:
    """The section model a field's annotation holds (``LengthsConfig | None`` → ``LengthsConfig``),
    or ``None`` for a plain value."""
    for cand in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def check_key_path(key: str, where: str, value: Any = None) -> None:
    """Raise a :class:`ConfigError` naming ``where`` unless ``key`` is a dotted path of
    :class:`Scenario` (``workload.arrival.rate``; a section such as ``workload.lengths`` too)."""
    if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
        raise ConfigError(where, key, "a dotted scenario key such as workload.arrival.rate")
    model: type[BaseModel] | None = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        section = ".".join(parts[:i]) or "the top level"
        if model is None:
            raise ConfigError(f"{where} {key}", value, f"'{parts[i - 1]}' is a value, not a section")
        fields = {k: f for k, f in model.model_fields.items() if k != "base_dir"}
        if part not in fields:
            raise ConfigError(
                f"{where} {key}",
                value,
                f"unknown scenario key '{part}' in {section}; allowed there: {', '.join(fields)}",
            )
        model = sub_model(fields[part].annotation)


def file_fields() -> set[str]:
    """Names of every scenario field, at any depth, whose value names a file (:data:`NAMES_FILE`)."""
    out: set[str] = set()
    seen: set[type] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, f in model.model_fields.items():
            if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("names_file"):
                out.add(name)
            sub = sub_model(f.annotation)
            if sub is not None:
                walk(sub)

    walk(Scenario)
    return out


# --- loading --------------------------------------------------------------------------


def _section_at(parts: tuple) -> type[BaseModel] | None:
    """The section model at a dotted location of the schema (``()``: the scenario itself), or
    ``None`` where a part is no field or names a value."""
    model: type[BaseModel] | None = Scenario
    for part in parts:
        info = model.model_fields.get(part) if model is not None else None
        if info is None:
            return None
        model = sub_model(info.annotation)
    return model


def _allowed_keys(loc: tuple) -> list[str]:
    model = _section_at(loc[:-1])
    return list(model.model_fields) if model is not None else []


def _field_info(loc: tuple) -> Any:
    """The pydantic ``FieldInfo`` at a (dotted) location of the schema, or ``None``."""
    model = _section_at(loc[:-1]) if loc else None
    return model.model_fields.get(loc[-1]) if model is not None else None


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def range_text(info: Any) -> str | None:
    """The allowed range of a numeric field, e.g. ``an integer in [1, 10000000]`` (``None`` if it has none)."""
    from sim.strict import scalar_kinds

    lo = hi = None
    lo_open = hi_open = False
    for m in getattr(info, "metadata", ()):
        for attr, is_lo, is_open in (
            ("ge", True, False),
            ("gt", True, True),
            ("le", False, False),
            ("lt", False, True),
        ):
            v = getattr(m, attr, None)
            if v is not None:
                if is_lo:
                    lo, lo_open = v, is_open
                else:
                    hi, hi_open = v, is_open
    if lo is None or hi is None:
        return None
    kinds = scalar_kinds(info.annotation)
    what = "an integer" if int in kinds and float not in kinds else "a finite number"
    return f"{what} in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"


def key_ranges() -> dict[str, str]:
    """Every numeric scenario key (dotted) → its allowed range (:func:`range_text`), in schema order;
    ``docs/scenario.md`` lists the same table."""
    from sim.strict import scalar_kinds

    out: dict[str, str] = {}

    def walk(model: type[BaseModel], prefix: str, seen: tuple) -> None:
        for name, info in model.model_fields.items():
            if name == "base_dir":
                continue
            ann = info.annotation
            sub = sub_model(ann)
            if sub is not None:
                if sub not in seen:  # lengths.base is a lengths block again
                    walk(sub, f"{prefix}{name}.", (*seen, sub))
                continue
            kinds = scalar_kinds(ann)
            if kinds == {int, str}:  # allocator.reserve, allocator.long_threshold
                out[prefix + name] = "max_model_len, an integer in [1, workload.max_model_len], or pNN (0 < NN <= 100)"
            elif kinds & {int, float} and not kinds - {int, float}:
                text = range_text(info)
                if text is None and typing.get_origin(ann) is Literal:
                    text = "one of " + ", ".join(str(a) for a in typing.get_args(ann))
                out[prefix + name] = text if text is not None else "(no range)"

    walk(Scenario, "", (Scenario,))
    return out


#: pydantic error types about a number's value or type: the message names the field's range instead.
_RANGE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "finite_number",
    "int_parsing",
    "float_parsing",
    "int_type",
    "float_type",
    "int_from_float",
    "int_parsing_size",
}


def _error_from_pydantic(err: ValidationError) -> ConfigError:
    e = err.errors()[0]
    loc = tuple(p for p in e["loc"] if not isinstance(p, int))
    key = ".".join(str(p) for p in loc) or "scenario"
    if e["type"] == "extra_forbidden":
        keys = [k for k in _allowed_keys(loc) if k != "base_dir"]
        return ConfigError(key, e.get("input"), f"unknown key; allowed here: {', '.join(keys)}")
    field_error = (e.get("ctx") or {}).get("error")
    if isinstance(field_error, FieldError):
        field_key = f"{key}.{field_error.field}" if loc else field_error.field
        return ConfigError(field_key, field_error.value, field_error.allowed)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "string_too_short":
        msg = "a non-empty string"
    if e["type"] == "string_type":
        extra = getattr(_field_info(loc), "json_schema_extra", None)
        msg = "a file path (a non-empty string)" if isinstance(extra, dict) and extra.get("names_file") else "a string"
    if e["type"] in _RANGE_ERRORS:
        rng = range_text(_field_info(loc))
        if rng is not None:
            msg = rng
    return ConfigError(key, e.get("input"), msg)


def parse_override(item: str) -> tuple[str, Any]:
    """``a.b.c=value`` → (``a.b.c``, YAML-parsed value; text that is not YAML stays text)."""
    if "=" not in item:
        raise ConfigError("--set", item, "expected KEY=VALUE with KEY a dotted path such as workload.arrival.rate")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")) or key.count(".") >= MAX_NESTING:
        raise ConfigError("--set", item, "expected KEY=VALUE with KEY a dotted path such as workload.arrival.rate")
    value = load_yaml(raw, f"--set {key}", raw, syntax_error=raw) if raw.strip() else None
    return key, value


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys in a nested dict (copied), creating sections as needed."""
    if not isinstance(data, dict):
        raise ConfigError("scenario", type(data).__name__, "a YAML mapping of sections (model, gpu, workload, ...)")
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(key, value, f"'{part}' is a value, not a section")
            node = nxt
        node[parts[-1]] = value
    return out


_S = typing.TypeVar("_S", bound=BaseModel)


def grid_sections(base: _S, prefix: str, grid: typing.Mapping[str, typing.Sequence]) -> list[_S]:
    """The section ``base`` (the scenario keys under ``prefix``, e.g. ``"allocator."``) of every
    point of a Cartesian ``grid`` (dotted scenario keys → values) over it: only the axes under
    ``prefix`` matter. A point whose section is invalid is left out (it fails with its own error)."""
    import itertools

    axes = {k.removeprefix(prefix): list(v) for k, v in grid.items() if k.startswith(prefix)}
    data = base.model_dump()
    out: list[_S] = []
    for values in itertools.product(*axes.values()):
        try:
            out.append(type(base).model_validate(apply_overrides(data, dict(zip(axes, values)))))
        except (ValueError, TypeError):  # pydantic's ValidationError and ConfigError are ValueErrors
            continue
    return out


def scenario_from_dict(data: dict, base_dir: str | Path | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError("scenario", type(data).__name__, "a YAML mapping of sections (model, gpu, workload, ...)")
    if "base_dir" in data:
        # Where relative paths resolve is decided by where the file is, never by its content.
        raise ConfigError(
            "base_dir",
            data["base_dir"],
            "not a scenario key (relative paths resolve against the scenario file's folder and scenarios/)",
        )
    if data.get("kind") == VALIDATION_KIND:
        # Its keys (model: tiny-llama, engine: {...}) would otherwise be refused one by one.
        raise ConfigError("kind", VALIDATION_KIND, "not a scenario key (a validation spec runs with kvsim validate)")
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        raise _error_from_pydantic(err) from None
    if base_dir is not None:
        sc.base_dir = str(base_dir)
    sc.gpu.check_custom()
    if sc.model.hf_config is not None:
        from sim.hf_config import apply_to_scenario  # reads the file: only when one is named

        apply_to_scenario(sc)
    fit_max_model_len(sc)
    return sc


def model_context(sc: Scenario) -> int | None:
    """The longest sequence (tokens) the scenario's model serves, as vLLM derives its largest
    ``max_model_len`` from the model, or ``None`` where kvsim cannot tell. A catalog model's
    ``max_position``; a Hugging Face config's context as ``sim.hf_config`` reads it
    (:attr:`~sim.hf_config.HfModel.context`: ``max_position_embeddings``, or its architecture's
    transformers default where the file leaves it out, times a linear, dynamic or YaRN
    ``rope_scaling`` factor as vLLM multiplies it); ``None`` for explicit dims (``custom``) and a
    config that gives no length."""
    m = sc.model
    if m.hf_config is None:
        from sim.catalog import MODELS

        spec = MODELS.get(m.name or "")
        return spec.max_position if spec is not None else None
    from sim.hf_config import read_hf_config, resolve_hf_config

    return read_hf_config(resolve_hf_config(m.hf_config, sc.base_dir)).context


def fit_max_model_len(sc: Scenario) -> None:
    """``workload.max_model_len`` against the model's context (:func:`model_context`), as vLLM sets
    it: left unset, it is the smaller of the default and the context (set in place, so the resolved
    scenario says what runs); set above the context, a ConfigError naming it. vLLM's
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` override has no kvsim equivalent."""
    context = model_context(sc)
    wl = sc.workload
    if context is None or wl.max_model_len <= context:
        return
    if "max_model_len" in wl.model_fields_set:
        raise longer_than_context(sc, context)
    wl.max_model_len = context


def longer_than_context(sc: Scenario, context: int) -> ConfigError:
    """The error of a ``workload.max_model_len`` above the model's ``context``."""
    return ConfigError(
        "workload.max_model_len",
        sc.workload.max_model_len,
        f"at most {context}: the context of {sc.model.name or sc.model.hf_config} (max_position_embeddings, "
        "times any rope_scaling factor vLLM applies); "
        "vLLM refuses a longer max_model_len",
    )


def read_scenario_dict(path: str | Path) -> tuple[dict, Path]:
    """Raw YAML of a scenario file or a built-in scenario name."""
    p = Path(path)
    if not is_file(p):
        named = SCENARIO_DIR / f"{path}.yaml"
        if is_file(named):
            p = named
        else:
            raise ConfigError("scenario", str(path), f"a YAML file, or a built-in name ({', '.join(list_scenarios())})")
    data = load_yaml(read_text(p, "scenario", "scenario file"), "scenario", str(p))
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a YAML {type(data).__name__}"
        raise ConfigError(
            "scenario",
            str(p),
            f"a YAML mapping of sections (model, gpu, workload, ...); this file "
            f"holds {got} (write {{}} for every default)",
        )
    if data.get("kind") == VALIDATION_KIND:
        raise ConfigError(
            "scenario",
            str(path),
            f"a simulator scenario; this file is a validation spec (kind: {VALIDATION_KIND}): "
            f"run it with kvsim validate --scenario {path} (with --device cuda for a GPU spec; docs/validation.md)",
        )
    return data, p.parent


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    data, base = read_scenario_dict(path)
    return scenario_from_dict(apply_overrides(data, overrides or {}), base_dir=base)


def list_scenarios() -> list[str]:
    """Built-in simulator scenarios (files marked ``kind: validation`` are specs for ``kvsim validate``)."""
    out = []
    for p in sorted(SCENARIO_DIR.glob("*.yaml")):
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and data.get("kind") != VALIDATION_KIND:
            out.append(p.stem)
    return out
