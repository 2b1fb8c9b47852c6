"""A scenario's hardware and model resolved into numbers: bytes per token, KV capacity, allocator, cost model."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sim.allocators import make_allocator
from sim.allocators.base import Allocator
from sim.allocators.registry import Budget
from sim.allocators.registry import get as allocator_kind
from sim.catalog import GiB, GpuSpec, ModelSpec, activation_reserve_bytes, get_gpu, get_model, kv_capacity_bytes
from sim.config import Scenario
from sim.cost.model import CostModel, Layout, RooflineCostModel, RooflineParams
from sim.errors import ConfigError

#: The built-in calibrated profile used for each catalog GPU when ``cost_model.profile: auto``.
BUILTIN_PROFILE_FOR_GPU = {"H100-SXM-80GB": "h100-sxm", "H200-SXM-141GB": "h200-sxm", "A100-SXM-80GB": "a100-sxm",
                           "cpu": "cpu-reference"}

_DIMS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "params")


def model_spec(sc: Scenario) -> ModelSpec:
    """Catalog entry with any explicit dims applied, or a fully explicit shape."""
    m = sc.model
    given = {f.name: getattr(m, f.name) for f in fields(ModelSpec) if f.name != "name" and getattr(m, f.name, None) is not None}
    if m.name is None or m.name == "custom":
        missing = [d for d in _DIMS if d not in given]
        if missing:
            raise ConfigError("model", "custom", f"explicit dims need all of {', '.join(_DIMS)}; missing {', '.join(missing)}")
        return ModelSpec(name="custom", **given)
    base = get_model(m.name)
    if given:
        return ModelSpec(**{**{f.name: getattr(base, f.name) for f in fields(ModelSpec)}, **given, "name": base.name + "*"})
    return base


@dataclass(frozen=True)
class Deployment:
    """Per-replica memory arithmetic (bytes) for one scenario."""

    model: ModelSpec
    gpu: GpuSpec
    kv_bytes_per_token: int
    weight_bytes: int
    activation_reserve_bytes: int
    kv_capacity_bytes: int
    kv_capacity_tokens: int
    reserve_tokens: int | None
    #: hybrid_tail: requests longer than this (tokens) go to the static partition.
    long_threshold_tokens: int | None = None
    #: What one replica's allocator may hold, sizes resolved by its kind (``make_allocator``).
    budget: Budget | None = None

    @classmethod
    def from_scenario(cls, sc: Scenario, total_length_percentile=None) -> "Deployment":
        model = model_spec(sc)
        gpu = get_gpu(sc.gpu.name)
        g = sc.gpu
        bpt = model.kv_bytes_per_token(sc.model.kv_dtype)
        act = g.activation_reserve_bytes
        if act is None:
            act = activation_reserve_bytes(model, g.tensor_parallel, sc.scheduler.max_num_batched_tokens, sc.scheduler.max_num_seqs)
        weights = model.weight_bytes(sc.model.weight_dtype)
        cap = kv_capacity_bytes(model, gpu, g.tensor_parallel, g.gpu_memory_utilization, sc.model.weight_dtype, act)
        if cap <= 0:
            raise ConfigError("gpu", f"{g.name} x TP{g.tensor_parallel}",
                              f"KV capacity per replica is {cap / GiB:.1f} GiB: {g.gpu_memory_utilization} x "
                              f"{g.tensor_parallel} x {gpu.memory_bytes / GiB:.0f} GiB minus weights {weights / GiB:.1f} GiB "
                              f"and activations {act / GiB:.1f} GiB leaves nothing; raise tensor_parallel or pick a larger GPU")
        cap_tokens = cap // bpt
        max_len = sc.workload.max_model_len
        needed = model.kv_tokens_held(max_len)
        if cap_tokens < needed:
            raise ConfigError("workload.max_model_len", max_len,
                              f"at most {cap_tokens} tokens fit in the KV capacity of one replica "
                              f"({cap / GiB:.2f} GiB at {bpt} B/token); lower max_model_len or add memory")
        # The allocator kind resolves its own sizes (a reservation, a threshold) and refuses what cannot fit.
        budget = allocator_kind(sc.allocator.kind).size(sc.allocator, Budget(
            cap_tokens, bpt, max_len, model.sliding_window, needed_tokens=needed, percentile=total_length_percentile))
        return cls(model, gpu, bpt, weights, act, cap, cap_tokens, budget.reserve_tokens, budget.long_threshold_tokens,
                   budget)

    def make_allocator(self, sc: Scenario) -> Allocator:
        """A new allocator of ``allocator.kind`` for one replica (built by its registration)."""
        assert self.budget is not None, "a Deployment comes from from_scenario"
        return make_allocator(sc.allocator, self.budget)

    def make_cost_model(self, sc: Scenario) -> CostModel:
        layout = Layout(paged=allocator_kind(sc.allocator.kind).paged_layout, block_size=sc.allocator.block_size)
        c = sc.cost_model
        ref = c.profile if c.profile not in (None, "none") else None
        if ref == "auto":
            ref = BUILTIN_PROFILE_FOR_GPU.get(self.gpu.name)
            auto = True
        else:
            auto = False
        if ref:
            from sim.cost.profile import build_profile_cost_model  # only when needed: keeps startup light
            try:
                return build_profile_cost_model(ref, self.model, self.gpu, tensor_parallel=sc.gpu.tensor_parallel,
                                                weight_dtype=sc.model.weight_dtype, kv_dtype=sc.model.kv_dtype,
                                                layout=layout)
            except ConfigError:
                if not auto:
                    raise
                # auto: the GPU's profile does not cover this shape or dtype; fall back to the labelled prior.
        params = RooflineParams(compute_efficiency=c.compute_efficiency, memory_efficiency=c.memory_efficiency,
                                step_overhead_s=c.step_overhead_s, per_seq_overhead_s=c.per_seq_overhead_s,
                                paged_attention_overhead=c.paged_attention_overhead)
        return RooflineCostModel(self.model, self.gpu, tensor_parallel=sc.gpu.tensor_parallel,
                                 weight_dtype=sc.model.weight_dtype, kv_dtype=sc.model.kv_dtype, layout=layout, params=params)
