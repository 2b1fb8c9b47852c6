"""A scenario's hardware and model resolved into numbers: bytes per token, KV capacity, allocator, cost model."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from sim.allocators import make_allocator
from sim.allocators.base import Allocator
from sim.allocators.registry import Budget, get as allocator_kind
from sim.catalog import (
    BLOCK_FP8_REFUSED_BY,
    BUILTIN_PROFILE_FOR_GPU,
    CUSTOM_GPU,
    GiB,
    GpuSpec,
    KVGroups,
    ModelSpec,
    activation_reserve_bytes,
    check_block_fp8_shards,
    check_kv_heads,
    check_tensor_parallel,
    custom_gpu,
    find_gpu,
    get_gpu,
    get_model,
    kv_capacity_bytes,
)
from sim.config import GpuConfig, Scenario, SchedulerConfig, longer_than_context, model_context
from sim.cost.model import CostModel, Layout, RooflineCostModel, RooflineParams
from sim.engine_presets import EnginePreset, get_preset, on_gpu, read_terms_file
from sim.errors import ConfigError

#: Says why ``cost_model.profile: auto`` fell back to the roofline prior. Silent in library use
#: (``sim/__init__.py`` gives the ``kvsim`` logger a null handler); ``kvsim run`` prints it on stderr.
log = logging.getLogger("kvsim.cost_model")
#: Says when an allocator kind holds a model's sliding-window layers at full length (silent in library
#: use, on stderr from ``kvsim run``, like ``log``).
kv_log = logging.getLogger("kvsim.kv_cache")
#: Says when ``engine.terms_file`` holds no terms for the engine that runs (silent in library use).
engine_log = logging.getLogger("kvsim.engine")
_SAID: set[str] = set()

_DIMS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "params")


def model_spec(sc: Scenario) -> ModelSpec:
    """Catalog entry or Hugging Face config with any explicit dims applied, or a fully explicit shape."""
    m = sc.model
    given = {
        f.name: getattr(m, f.name)
        for f in fields(ModelSpec)
        if f.name != "name" and getattr(m, f.name, None) is not None
    }
    if m.hf_config is not None:
        from sim.hf_config import scenario_model

        return _checked_dims(scenario_model(sc), given)
    if m.name is None or m.name == "custom":
        missing = [d for d in _DIMS if d not in given]
        if missing:
            raise ConfigError(
                "model", "custom", f"explicit dims need all of {', '.join(_DIMS)}; missing {', '.join(missing)}"
            )
        return _checked_dims(ModelSpec(name="custom", **given), given)
    base = get_model(m.name)
    if given:
        return _checked_dims(
            ModelSpec(
                **{**{f.name: getattr(base, f.name) for f in fields(ModelSpec)}, **given, "name": base.name + "*"}
            ),
            given,
        )
    return base


def _checked_dims(spec: ModelSpec, given: dict) -> ModelSpec:
    """``spec`` (explicit dims applied) if its KV heads divide its query heads, as a config.json's
    must (:func:`check_kv_heads`), else a ConfigError naming ``model.kv_heads``."""
    if "heads" in given or "kv_heads" in given:
        check_kv_heads(spec.heads, spec.kv_heads, "model.kv_heads", spec.kv_heads, "model.heads")
    return spec


def _reported_token_bytes(model: ModelSpec, bpt: int, group_bpt: int) -> int:
    """Bytes of one token as a server reports its KV capacity (``gpu.kv_cache_tokens``): vLLM counts
    a token in every layer group, padding layers too, so a mixed model's token is ``groups x
    group_bpt`` (the same as ``bpt`` unless its last group is padded); ``bpt`` and ``group_bpt``
    already count the replicated heads."""
    n = model.kv_groups.count
    return bpt if n == 1 else n * group_bpt


def measured_elsewhere(profile, gpu_name: str, ref: str) -> str | None:
    """Why a profile a scenario names (``ref``: ``cost_model.profile``) prices another device than
    the scenario's GPU (``gpu_name``: a catalog name, ``cpu`` or ``custom``), or ``None``. Its kernel
    times are the device's it measured, while memory and engine terms come from ``gpu.name``: a CPU
    profile on an H100 runs H100 memory at CPU speed. A ``custom`` GPU takes any profile (the user
    describes the part); a built-in profile the catalog prices that GPU with (GB200 on the B200's
    tables) is its own."""
    device = getattr(profile, "device", None)
    if gpu_name == CUSTOM_GPU or not isinstance(device, dict):
        return None
    if BUILTIN_PROFILE_FOR_GPU.get(gpu_name) == ref:
        return None
    name = str(device.get("name") or "an unnamed device")
    on_cpu = device.get("system") == "cpu"
    if gpu_name == "cpu":
        same = on_cpu
    else:
        same = not on_cpu and find_gpu(name) == gpu_name
    if same:
        return None
    return (
        f"profile {ref} was measured on {name} ({'CPU' if on_cpu else 'GPU'}), not on gpu.name {gpu_name}: "
        "its kernel times are that device's, while memory and engine terms are the scenario's GPU's "
        "(set gpu.name to the device it measured, or calibrate this one: kvsim calibrate)"
    )


@dataclass(frozen=True)
class Deployment:
    """Per-replica memory arithmetic (bytes) for one scenario."""

    model: ModelSpec
    gpu: GpuSpec
    #: Bytes of one token's K and V on every layer.
    kv_bytes_per_token: int
    weight_bytes: int
    activation_reserve_bytes: int
    kv_capacity_bytes: int
    #: KV capacity in the allocator's slots: tokens, or tokens of one layer group where the allocator
    #: holds a model with sliding-window layers per group (``kv_groups``).
    kv_capacity_tokens: int
    reserve_tokens: int | None
    #: hybrid_tail: requests longer than this (tokens) go to the static partition.
    long_threshold_tokens: int | None = None
    #: What one replica's allocator may hold, sizes resolved by its kind (``make_allocator``).
    budget: Budget | None = None
    #: The serving engine's framework terms (``None``: ``engine.kind: reference``).
    engine: EnginePreset | None = None
    #: The scheduler it runs (the scenario's, after :func:`with_engine_defaults`).
    scheduler: SchedulerConfig | None = None
    #: The model's KV cache groups when the allocator holds KV per group and some layers slide
    #: (``None``: one slot per token on every layer).
    kv_groups: KVGroups | None = None
    #: Bytes of one token as ``gpu.kv_cache_tokens`` counts it (:func:`_reported_token_bytes`).
    reported_token_bytes: int = 0

    @classmethod
    def from_scenario(cls, sc: Scenario, total_length_percentile=None) -> Deployment:
        model = model_spec(sc)
        gpu = gpu_spec(sc.gpu)
        g = sc.gpu
        # vLLM refuses a tensor_parallel_size that does not split the heads (and KV heads) evenly.
        check_tensor_parallel(model, g.tensor_parallel)
        # vLLM and SGLang also refuse a block-scaled fp8 checkpoint whose shards do not hold whole
        # quantisation blocks: they have no scales for a partial block.
        serving = engine_kind(sc)
        block_rule = sc.model.weight_dtype == "fp8_block" and serving in BLOCK_FP8_REFUSED_BY
        if block_rule:
            check_block_fp8_shards(model, g.tensor_parallel, serving)
        max_len = sc.workload.max_model_len
        context = model_context(sc)
        if context is not None and max_len > context:
            # Scenarios read from YAML are fitted when loaded (sim.config.fit_max_model_len); this
            # catches one built or changed in code.
            raise longer_than_context(sc, context)
        engine = engine_preset(sc)
        unused = unused_terms_file(sc)
        if unused is not None and unused not in _SAID:
            _SAID.add(unused)  # once per process: a plan or sweep builds a deployment per candidate
            engine_log.warning("%s", unused)
        sched = sc.scheduler
        # Bytes a token's KV takes across the replica's GPUs, replicated heads counted (kv_replicas).
        copies = model.kv_replicas(g.tensor_parallel)
        bpt = model.kv_bytes_per_token(sc.model.kv_dtype) * copies
        group_bpt = model.kv_group_bytes_per_token(sc.model.kv_dtype) * copies
        act = g.activation_reserve_bytes
        if act is None:
            act = activation_reserve_bytes(model, g.tensor_parallel, sched.max_num_batched_tokens, sched.max_num_seqs)
        weights = model.weight_bytes(sc.model.weight_dtype)
        cap = kv_capacity_bytes(model, gpu, g.tensor_parallel, g.gpu_memory_utilization, sc.model.weight_dtype, act)
        reported_bpt = _reported_token_bytes(model, bpt, group_bpt)
        if cap <= 0:
            # The weights (and activations) must fit whether or not gpu.kv_cache_tokens pins the KV.
            # Suggest only what the scenario may change to: a degree vLLM accepts for this model, a
            # narrower dtype than 16-bit weights (NVFP4 needs Blackwell's FP4 units), a catalog GPU
            # with more memory.
            from sim.catalog import (
                DTYPE_BYTES,
                GPUS,
                TP_DEGREES,
                block_fp8_shard_problem,
                dtype_bytes,
                tensor_parallel_problem,
            )

            wider = [
                t
                for t in TP_DEGREES
                if t > g.tensor_parallel
                and tensor_parallel_problem(model, t) is None
                and not (block_rule and block_fp8_shard_problem(model, t))
            ]
            bigger = sorted(
                (s for s in GPUS.values() if s.memory_bytes > gpu.memory_bytes and s.name != "cpu"),
                key=lambda s: s.memory_bytes,
            )
            # Name the larger GPUs that hold the weights at this degree alone, when some do: one that
            # still leaves nothing is a remedy only together with another.
            alone = [s for s in bigger if g.gpu_memory_utilization * g.tensor_parallel * s.memory_bytes > weights + act]
            bigger = alone or bigger
            per = dtype_bytes(sc.model.weight_dtype, "model.weight_dtype")
            narrower = ["fp8"] if per >= 2 else []
            if gpu.peak_fp4_flops > 0 and per > DTYPE_BYTES["nvfp4"]:
                narrower.append("nvfp4")
            remedies = []
            if wider:
                shown = ", ".join(map(str, wider[:-1])) + (" or " if len(wider) > 1 else "") + str(wider[-1])
                remedies.append(f"gpu.tensor_parallel {shown}")
            if narrower:
                remedies.append(f"model.weight_dtype {' or '.join(narrower)}")
            if bigger:
                remedies.append(f"a GPU with more memory ({', '.join(s.name for s in bigger)})")
            limits = []
            if not wider:
                limits.append(
                    f"tensor_parallel {g.tensor_parallel} is the largest that splits {model.name}"
                    if g.tensor_parallel < TP_DEGREES[-1]
                    else f"tensor_parallel {g.tensor_parallel} is the largest allowed"
                )
            raise ConfigError(
                "gpu",
                f"{g.name} x TP{g.tensor_parallel}",
                f"KV capacity per replica is {cap / GiB:.1f} GiB: {g.gpu_memory_utilization} x "
                f"{g.tensor_parallel} x {gpu.memory_bytes / GiB:.1f} GiB minus weights {weights / GiB:.1f} GiB "
                f"({sc.model.weight_dtype}) and activations {act / GiB:.1f} GiB leaves nothing; "
                + ("; ".join(limits) + "; " if limits else "")
                + ("try " + ", or ".join(remedies) if remedies else "no larger GPU or degree is available")
                + (", or several together" if len(remedies) > 1 else ""),
            )
        if g.kv_cache_tokens is not None:
            cap = g.kv_cache_tokens * reported_bpt
            # A pinned capacity (what a server reported) may exceed the derived one, as a server's
            # activation reserve may be smaller than kvsim's; never the GPUs' memory less the weights.
            room = g.tensor_parallel * gpu.memory_bytes - weights
            if cap > room:
                raise ConfigError(
                    "gpu.kv_cache_tokens",
                    g.kv_cache_tokens,
                    f"at most {room // reported_bpt} tokens: {g.kv_cache_tokens} x {reported_bpt} B/token is "
                    f"{cap / GiB:.1f} GiB of KV, which with the weights' {weights / GiB:.1f} GiB exceeds the "
                    f"{g.tensor_parallel} x {gpu.memory_bytes / GiB:.1f} GiB of {g.name} memory",
                )
        kind = allocator_kind(sc.allocator.kind)
        groups = model.kv_groups if kind.layer_groups and model.sliding_layers else None
        if groups is None:
            if model.sliding_layers:
                kv_log.warning(
                    "allocator.kind %s holds every layer's KV at the whole sequence length, so %s's "
                    "sliding-window layers are counted in full (an upper bound; paged and static hold "
                    "KV per layer group)",
                    sc.allocator.kind,
                    model.name,
                )
            slot_bytes, cap_tokens, needed = bpt, cap // bpt, model.kv_tokens_held(max_len)
        else:
            # Slots are tokens of one layer group: every group draws same-sized blocks from one pool.
            slot_bytes = group_bpt
            cap_tokens, needed = cap // slot_bytes, groups.slots_held(max_len)
        if cap_tokens < needed:
            fit = cap_tokens if groups is None else groups.tokens_fitting(cap_tokens)
            pinned = g.kv_cache_tokens is not None
            raise ConfigError(
                "workload.max_model_len",
                max_len,
                f"at most {fit} tokens fit in the KV capacity of one replica "
                f"({cap / GiB:.2f} GiB at {bpt} B/token"
                + (f", pinned by gpu.kv_cache_tokens={g.kv_cache_tokens}" if pinned else "")
                + "); lower max_model_len or "
                + ("raise gpu.kv_cache_tokens" if pinned else "add memory"),
            )
        # The allocator kind resolves its own sizes (a reservation, a threshold) and refuses what cannot fit.
        budget = kind.size(
            sc.allocator,
            Budget(
                cap_tokens,
                slot_bytes,
                max_len,
                model.uniform_sliding_window,
                needed_tokens=needed,
                percentile=total_length_percentile,
                groups=groups,
            ),
        )
        return cls(
            model,
            gpu,
            bpt,
            weights,
            act,
            cap,
            cap_tokens,
            budget.reserve_tokens,
            budget.long_threshold_tokens,
            budget,
            engine,
            sched,
            groups,
            reported_bpt,
        )

    @property
    def kv_cache_tokens(self) -> int:
        """The KV capacity per replica in the tokens ``gpu.kv_cache_tokens`` counts (what a server
        reports; ``kv_capacity_tokens`` counts allocator slots, which differ for a mixed model)."""
        return self.kv_capacity_bytes // self.reported_token_bytes

    @property
    def kv_slot_bytes(self) -> int:
        """Bytes of one allocator slot (what ``kv_capacity_tokens`` counts)."""
        return self.budget.kv_bytes_per_token if self.budget is not None else self.kv_bytes_per_token

    def kv_layer_groups(self) -> dict | None:
        """``summary.json``'s ``kv_layer_groups`` for a model that mixes full-attention and
        sliding-window layers (``None`` otherwise): its groups, the bytes of one token in one group,
        and whether the allocator holds KV per group (else every layer at full length)."""
        if self.model.mixed_window is None:
            return None
        held = self.kv_groups is not None
        return {
            **self.model.kv_groups.describe(),
            "bytes_per_group_token": self.kv_slot_bytes if held else None,
            "held_per_group": held,
        }

    def make_allocator(self, sc: Scenario) -> Allocator:
        """A new allocator of ``allocator.kind`` for one replica (built by its registration)."""
        assert self.budget is not None, "a Deployment comes from from_scenario"
        return make_allocator(sc.allocator, self.budget)

    def make_cost_model(self, sc: Scenario) -> CostModel:
        layout = Layout(paged=allocator_kind(sc.allocator.kind).paged_layout, block_size=sc.allocator.block_size)
        c = sc.cost_model
        ref = c.profile if c.profile not in (None, "none") else None
        auto = ref == "auto"
        if auto:
            ref = BUILTIN_PROFILE_FOR_GPU.get(self.gpu.name)
            if ref is None:
                log.warning(
                    "cost model: no calibrated profile for GPU %s (built-in profiles cover %s); using the "
                    "roofline prior, reported as roofline-uncalibrated",
                    self.gpu.name,
                    ", ".join(g for g in BUILTIN_PROFILE_FOR_GPU if g != "cpu"),
                )
        if ref:
            from sim.cost.profile_model import build_profile_cost_model  # only when needed: keeps startup light

            try:
                cost = build_profile_cost_model(
                    ref,
                    self.model,
                    self.gpu,
                    tensor_parallel=sc.gpu.tensor_parallel,
                    weight_dtype=sc.model.weight_dtype,
                    kv_dtype=sc.model.kv_dtype,
                    layout=layout,
                    engine=self.engine,
                )
                if not auto:
                    other = measured_elsewhere(getattr(cost, "profile", None), self.gpu.name, str(ref))
                    if other is not None:
                        log.warning("cost model: %s", other)
                for note in cost.substitutions:
                    # Calibrated, but not on this model's own shape: said, as the fallbacks below are.
                    log.warning(
                        "cost model: profile %s on %s: %s; the run still counts as calibrated "
                        "(summary.json: cost_model_profile.substitutions)",
                        ref,
                        self.model.name,
                        note,
                    )
                return cost
            except ConfigError as exc:
                if not auto:
                    raise
                # auto: the GPU's profile does not cover this shape or dtype; fall back to the labelled prior.
                why = exc.allowed.split(f"; {ref} covers:")[0]  # the list of covered models is long
                lead = "a profile that measured the "
                if why.startswith(lead):
                    why = "no curve for the " + why[len(lead) :].split(" needed by ")[0]
                log.warning(
                    "cost model: profile %s does not cover %s (weights %s, KV %s, TP %d): %s; using the "
                    "roofline prior, reported as roofline-uncalibrated (kvsim profile show %s lists what it "
                    "covers)",
                    ref,
                    self.model.name,
                    sc.model.weight_dtype,
                    sc.model.kv_dtype,
                    sc.gpu.tensor_parallel,
                    why,
                    ref,
                )
        params = RooflineParams(
            compute_efficiency=c.compute_efficiency,
            memory_efficiency=c.memory_efficiency,
            step_overhead_s=c.step_overhead_s,
            per_seq_overhead_s=c.per_seq_overhead_s,
            paged_attention_overhead=c.paged_attention_overhead,
        )
        return RooflineCostModel(
            self.model,
            self.gpu,
            tensor_parallel=sc.gpu.tensor_parallel,
            weight_dtype=sc.model.weight_dtype,
            kv_dtype=sc.model.kv_dtype,
            layout=layout,
            params=params,
        )


def engine_kind(sc: Scenario) -> str:
    """The serving engine ``sc`` runs: ``engine.kind``, with ``auto`` resolved."""
    if sc.engine.kind != "auto":
        return sc.engine.kind
    # On the ``cpu`` device the only engine is kvsim's own torch engine, which its profiles measured.
    return "reference" if sc.gpu.name == "cpu" else AUTO_ENGINE


def engine_preset(sc: Scenario) -> EnginePreset | None:
    """The serving engine's terms for ``sc``: the preset of ``engine.kind`` with the scenario's
    ``engine.*`` overrides (``None`` for ``reference``)."""
    e = sc.engine
    kind = engine_kind(sc)
    preset = get_preset(kind)
    if preset is None:
        return None
    spec = gpu_spec(sc.gpu)
    preset = on_gpu(preset, spec.memory_bytes, spec.name, sc.gpu.tensor_parallel)
    overrides: dict = {}
    if e.terms_file:
        overrides.update(read_terms_file(sc.resolve_path(e.terms_file, "engine.terms_file")).get(kind, {}))
    overrides.update({k: getattr(e, k) for k in OVERRIDABLE if getattr(e, k) is not None})
    return preset.with_overrides(**overrides) if overrides else preset


def unused_terms_file(sc: Scenario) -> str | None:
    """One line saying that ``engine.terms_file`` holds no terms for the engine that runs (the
    preset's terms are used; ``reference`` takes none), naming the file and the engines it holds;
    ``None`` when it does, or names no file. Terms of other engines are not an error: one file may
    hold the fits of several (docs/calibration.md)."""
    if not sc.engine.terms_file:
        return None
    kind = engine_kind(sc)
    path = sc.resolve_path(sc.engine.terms_file, "engine.terms_file")
    held = sorted(read_terms_file(path))
    if kind in held:
        return None
    used = "kvsim's own engine takes no terms" if get_preset(kind) is None else f"the run uses {kind}'s preset terms"
    return (
        f"engine.terms_file {path} holds terms for {', '.join(held) or 'no engine'}, none for {kind}, "
        f"the engine that runs: {used} (engine.kind picks the engine)"
    )


#: What ``engine.kind: auto`` runs on a GPU (``reference`` on ``gpu.name: cpu``): vLLM's preset, fitted to
#: published serving benchmarks, so every answer (run, sweep, plan, guide) prices a real server.
AUTO_ENGINE = "vllm"

#: ``engine.*`` keys that override a preset's term of the same name.
OVERRIDABLE = (
    "host_s",
    "host_per_seq_s",
    "host_hidden",
    "eager_per_layer_s",
    "eager_host_per_layer_s",
    "frontend_s",
    "frontend_per_token_s",
    "stream_per_token_s",
    "graph_max_tokens",
    "elementwise_per_layer",
    "custom_allreduce_max_bytes",
    "fp8_quant_fused",
    "schedule_ahead",
    "first_token_lag",
    "client_spread_cycles",
    "client_cv",
    "completion_per_token_s",
)


def derived_kv_cache_tokens(sc: Scenario) -> int:
    """The KV capacity per replica kvsim derives for ``sc`` from the GPU's memory, in the tokens
    ``gpu.kv_cache_tokens`` counts (that field, when set, replaces the derivation). The engine's
    default scheduler sizes the activation reserve, as in a run."""
    from sim.workload.generator import build_workload, total_length_percentile

    sc = with_engine_defaults(sc)
    wl = build_workload(sc)
    return Deployment.from_scenario(sc, lambda q: total_length_percentile(wl, q)).kv_cache_tokens


def with_engine_defaults(sc: Scenario) -> Scenario:
    """``sc`` with ``engine.kind: auto`` resolved and the serving engine's defaults filled into the keys
    it leaves unset: the scheduler's limits and batching (``max_num_seqs``, ``max_num_batched_tokens``,
    ``chunked_prefill``, ``mixed_batches``, ``reserve_output``) and the clients' timing
    (``workload.arrival`` ``start_spread_cycles``, ``client_cv`` and ``completion_per_token_s``). Keys a
    scenario sets win.
    Idempotent: the result is what a run writes to ``scenario.yaml``, so rerunning it gives the same
    run, whatever ``auto`` means in a later version."""
    engine = engine_preset(sc)
    cfg = sc.scheduler
    given = cfg.model_fields_set
    sched: dict = {}
    if engine is not None:
        sched = {
            k: getattr(engine, k)
            for k in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "mixed_batches", "reserve_output")
            if k not in given
        }
    else:
        if cfg.mixed_batches is None:
            sched["mixed_batches"] = True
        if cfg.reserve_output is None:
            sched["reserve_output"] = False
    arr = sc.workload.arrival
    arrival: dict = {}
    if engine is not None:
        if arr.kind == "closed_loop" and "start_spread_cycles" not in arr.model_fields_set:
            arrival["start_spread_cycles"] = engine.client_spread_cycles
        if "client_cv" not in arr.model_fields_set:
            arrival["client_cv"] = engine.client_cv
        if arr.kind == "closed_loop" and "completion_per_token_s" not in arr.model_fields_set:
            arrival["completion_per_token_s"] = engine.completion_per_token_s
    kind = engine_kind(sc)
    if not sched and not arrival and kind == sc.engine.kind:
        return sc
    workload = sc.workload
    if arrival:
        workload = workload.model_copy(update={"arrival": arr.model_copy(update=arrival)})
    return sc.model_copy(
        update={
            "scheduler": cfg.model_copy(update=sched),
            "workload": workload,
            "engine": sc.engine.model_copy(update={"kind": kind}),
        }
    )


def gpu_spec(g: GpuConfig) -> GpuSpec:
    """The catalog entry of ``gpu.name``, or the figures of a ``custom`` card."""
    if g.name == CUSTOM_GPU:
        assert g.memory_gib and g.hbm_tbps and g.bf16_tflops and g.pcie_gbps  # the config validated them
        return custom_gpu(
            g.memory_gib,
            g.hbm_tbps,
            g.bf16_tflops,
            g.pcie_gbps,
            fp8_tflops=g.fp8_tflops or 0.0,
            nvlink_gbps=g.nvlink_gbps or 0.0,
            fp4_tflops=g.fp4_tflops or 0.0,
        )
    return get_gpu(g.name)
