"""Step time from a batch's shape.

The engine only ever asks a :class:`CostModel` two questions: how long does
this (possibly mixed) batch take, and how long do ``k`` consecutive pure
decode iterations take (vectorised, for fast-forward). Allocators' memory work
is charged through the same object. A calibrated profile (``calibration``)
implements the same interface; :class:`RooflineCostModel` is the prior used
when no profile exists, and says so in every output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from mypy_extensions import mypyc_attr

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes
from sim.cost.moe import experts_woken


@dataclass(slots=True, init=False)
class BatchShape:
    """What one iteration computes.

    ``prefill_chunks`` holds ``(new_tokens, context_tokens)`` per sequence in
    prefill, context being the tokens already in its KV cache before the
    chunk. ``decode_kv_tokens`` is the sum over decoding sequences of the KV
    length each attends over (its new token included). For a model that mixes
    full-attention and sliding-window layers (``ModelSpec.mixed_window``),
    ``decode_window_kv_tokens`` is the same sum on its sliding-window layers
    (each sequence's length capped at the window); 0 when not given, and the cost
    model then prices those layers at the full lengths (an upper bound).
    """

    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_seqs: int = 0
    decode_kv_tokens: int = 0
    decode_window_kv_tokens: int = 0

    # An explicit __init__ (``init=False``): the compiled build (sim/native.py) runs it natively, a
    # generated dataclass __init__ would stay interpreted. Same parameters as the fields.
    def __init__(
        self,
        prefill_chunks: list[tuple[int, int]] | None = None,
        decode_seqs: int = 0,
        decode_kv_tokens: int = 0,
        decode_window_kv_tokens: int = 0,
    ):
        self.prefill_chunks = [] if prefill_chunks is None else prefill_chunks
        self.decode_seqs = decode_seqs
        self.decode_kv_tokens = decode_kv_tokens
        self.decode_window_kv_tokens = decode_window_kv_tokens

    @property
    def num_tokens(self) -> int:
        return self.decode_seqs + sum(c for c, _ in self.prefill_chunks)


@dataclass(frozen=True)
class Layout:
    """How the KV cache is laid out, which decides the attention kernel."""

    paged: bool
    block_size: int = 16


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class CostModel(ABC):
    """Seconds for each thing the simulator charges. All methods are pure."""

    #: Name written to outputs: a profile name or ``roofline-uncalibrated``.
    name: str
    calibrated: bool

    def __init__(self) -> None:
        #: Queries outside the measured range, by curve; reported in summary.json.
        self.out_of_range: dict[str, int] = {}
        #: Seconds added to the k-th pure decode iteration after an iteration with prefill
        #: (``after_prefill_s[k - 1]``; empty: none). A replica state, not a batch shape: the
        #: replica counts the decode iterations and adds these itself (``sim/engine/replica.py``), so
        #: the pricing methods stay pure. Measured on CPU engines, where the first decode
        #: iterations after a prefill's large activations run slower (calibration/kernels/engine_overhead.py).
        self.after_prefill_s: list[float] = []
        #: What priced the model in place of a measurement of its own shape while the run still counts
        #: as calibrated (a profile's attention at another head_dim: ``ProfileCostModel``), one line each.
        self.substitutions: list[str] = []

    @abstractmethod
    def decode_times_s(
        self, num_seqs: int, kv_tokens: np.ndarray, window_kv_tokens: np.ndarray | None = None
    ) -> np.ndarray:
        """Per-iteration seconds of pure decode steps of ``num_seqs`` sequences.

        ``kv_tokens[j]`` is the total KV length attended in iteration ``j``;
        ``window_kv_tokens[j]`` the same on a mixed model's sliding-window layers
        (``BatchShape.decode_window_kv_tokens``; ``None``: priced at ``kv_tokens``).
        Must equal :meth:`step_time_s` on the same single-iteration shape.
        """

    def decode_times_list(self, num_seqs: int, kv_tokens: list[float]) -> list[float]:
        """:meth:`decode_times_s` on a list, returning a list (the engine's short windows
        avoid numpy's per-call overhead; implementations may override with a scalar path)."""
        return self.decode_times_s(num_seqs, np.array(kv_tokens, dtype=np.float64)).tolist()

    def decode_window_times(self, num_seqs: int, kv_first: int, k: int) -> list[float]:
        """Seconds of ``k`` pure decode iterations of ``num_seqs`` sequences attending
        ``kv_first`` KV tokens in the first and ``num_seqs`` more in each next one (a cohort
        window without a sliding-window cap)."""
        if k > 16:
            # A long window's KV ramp as an array: the same integers (exact in float64), no list.
            return self.decode_times_s(num_seqs, np.arange(k, dtype=np.float64) * num_seqs + kv_first).tolist()
        return self.decode_times_list(num_seqs, [float(kv_first + num_seqs * j) for j in range(k)])

    def take_back_out_of_range(self, reprice: Callable[[], object]) -> None:
        """Take back the :attr:`out_of_range` counts of iterations priced but not run (a decode
        window cut short), as per-iteration stepping never prices them: ``reprice()`` prices those
        iterations again, and what it adds is taken off twice (once for the window, once now).
        What a model counts once per shape it already counted is not added again, nor taken."""
        before = dict(self.out_of_range)
        reprice()
        oor = self.out_of_range
        for curve, c in list(oor.items()):
            left = 2 * before.get(curve, 0) - c
            if left > 0:
                oor[curve] = left
            else:
                del oor[curve]

    @abstractmethod
    def mixed_step_time_s(self, batch: BatchShape) -> float:
        """Seconds for an iteration that contains at least one prefill chunk."""

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds for one iteration of ``batch``."""
        if not batch.prefill_chunks:
            kv = np.array([batch.decode_kv_tokens], dtype=np.float64)
            if batch.decode_window_kv_tokens:
                return float(
                    self.decode_times_s(
                        batch.decode_seqs, kv, np.array([batch.decode_window_kv_tokens], dtype=np.float64)
                    )[0]
                )
            return float(self.decode_times_s(batch.decode_seqs, kv)[0])
        return self.mixed_step_time_s(batch)

    @abstractmethod
    def copy_time_s(self, nbytes: float) -> float:
        """Device-to-device copy (realloc, compaction)."""

    @abstractmethod
    def zero_fill_time_s(self, nbytes: float) -> float:
        """memset of reused memory."""

    @abstractmethod
    def host_transfer_time_s(self, nbytes: float) -> float:
        """Host↔device transfer (swap)."""

    @abstractmethod
    def alloc_time_s(self, events: int) -> float:
        """Allocator bookkeeping for ``events`` page or extent allocations."""

    def step_parts(self, batch: BatchShape) -> dict[str, float]:
        """What one iteration of ``batch`` spends its :meth:`step_time_s` on, seconds by part
        (:data:`sim.cost.breakdown.PARTS`; the parts sum to the step time up to rounding). A
        diagnostic path, apart from the priced one: it counts no out-of-range queries. A model that
        cannot tell its parts apart returns the whole as ``unsplit``."""
        return {"unsplit": self.step_time_s(batch)}

    def describe(self) -> dict:
        return {"name": self.name, "calibrated": self.calibrated}

    def profile_provenance(self) -> dict | None:
        """The calibrated profile behind this model, ``{"name", "date", "source"}`` (for
        ``summary.json``); None for a model with no profile (the roofline prior)."""
        return None


@dataclass(frozen=True)
class RooflineParams:
    """Efficiencies and fixed costs of the roofline prior (uncalibrated guesses)."""

    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    #: Kernel launches and framework overhead per iteration, seconds.
    step_overhead_s: float = 2.0e-3
    #: CPU scheduling/sampling per sequence in the batch, seconds.
    per_seq_overhead_s: float = 10e-6
    #: PagedAttention kernels measured 20–26% slower than contiguous (vLLM §7.1).
    paged_attention_overhead: float = 0.2
    alloc_event_s: float = 2e-6
    allreduce_latency_s: float = 10e-6


class RooflineCostModel(CostModel):
    """max(FLOPs/peak, bytes/bandwidth) per kernel family, plus fixed overheads.

    GEMMs read the weights once per iteration (of a mixture-of-experts model, the experts the
    iteration's tokens wake) and do 2·active params FLOPs per token, at the
    GPU's fp8 peak for fp8 weights where it has FP8 tensor cores, else its bf16 peak;
    attention reads every attended KV token once and does 4·heads·head_dim
    FLOPs per (query, key) pair per layer (bf16 peak; multi-head latent attention: 2·heads·(2·latent
    − rope) decoding over the cached latent, 2·heads·(qk + v head widths) in prefill); the sliding-window layers of a
    mixed model attend at most their window. Tensor parallelism divides both
    and adds two all-reduces per layer over NVLink (PCIe on cards without it).
    """

    name = "roofline-uncalibrated"
    calibrated = False

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        tensor_parallel: int = 1,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        layout: Layout = Layout(paged=True),
        params: RooflineParams = RooflineParams(),
    ):
        super().__init__()
        self.model, self.gpu, self.tp, self.layout, self.p = model, gpu, tensor_parallel, layout, params
        self._flops = gpu.peak_bf16_flops * tensor_parallel * params.compute_efficiency
        self._gemm_flops = gpu.peak_gemm_flops(weight_dtype) * tensor_parallel * params.compute_efficiency
        self._bw = gpu.hbm_bandwidth * tensor_parallel * params.memory_efficiency
        self._weight_bytes = model.weight_bytes(weight_dtype)
        # Every GPU reads its own copy of replicated KV heads (ModelSpec.kv_replicas).
        copies = model.kv_replicas(tensor_parallel)
        self._kv_bpt = model.kv_bytes_per_token(kv_dtype) * copies
        embed = model.vocab * model.hidden
        active = model.active_params
        self._linear_flops_per_token = 2.0 * max(active - 2 * embed, active * 0.5)
        #: A mixture-of-experts model reads only the experts an iteration's tokens wake:
        #: ``_weight_bytes`` is then every other weight, ``_expert_bytes`` one routed expert's
        #: weights over its MoE layers (``sim/cost/moe.py``: the woken experts of uniform random routing).
        self._expert_bytes = 0.0
        self._experts, self._top_k = 0, 0
        if model.moe is not None:
            wb = dtype_bytes(model.moe.expert_dtype or weight_dtype, "model.weight_dtype")
            self._expert_bytes = model.moe.moe_layers * model.moe.expert_params(model.hidden) * wb
            self._experts, self._top_k = model.moe.experts, model.moe.experts_per_token
            self._weight_bytes = int(model.weight_bytes(weight_dtype) - self._experts * self._expert_bytes)
        self._lm_head_flops_per_seq = 2.0 * embed
        self._attn_flops_per_pair = 4.0 * model.layers * model.heads * model.head_dim
        # A mixed model: its full-attention layers take the terms above, its sliding-window layers
        # these, at lengths capped at the window.
        self._window = model.mixed_window
        self._w_kv_bpt = 0.0
        self._w_flops_per_pair = 0.0
        if self._window is not None:
            per_layer = model.kv_bytes_per_token(kv_dtype) * copies / model.layers
            full = model.layers - model.sliding_layers
            self._kv_bpt = int(per_layer * full)
            self._attn_flops_per_pair = 4.0 * full * model.heads * model.head_dim
            self._w_kv_bpt = per_layer * model.sliding_layers
            self._w_flops_per_pair = 4.0 * model.sliding_layers * model.heads * model.head_dim
        self._prefill_flops_per_pair = self._attn_flops_per_pair
        if model.mla is not None:
            # MLA: decode attends the cached latent with the up-projections absorbed (QK over the latent
            # and RoPE key, PV over the latent); prefill expands keys and values per head.
            a = model.mla
            self._attn_flops_per_pair = 2.0 * model.layers * model.heads * (a.latent_width + a.kv_lora_rank)
            self._prefill_flops_per_pair = 2.0 * model.layers * model.heads * (a.nope_dim + a.rope_dim + a.v_dim)
        self._act_bytes_per_token = model.hidden * dtype_bytes(weight_dtype, "model.weight_dtype")
        self._paged_factor = 1.0 + (params.paged_attention_overhead if layout.paged else 0.0)

    def _linear_s(self, tokens: float, seqs: float) -> float:
        flops = tokens * self._linear_flops_per_token + seqs * self._lm_head_flops_per_seq
        nbytes = float(self._weight_bytes)
        if self._experts:
            nbytes += experts_woken(tokens, self._experts, self._top_k) * self._expert_bytes
        return max(flops / self._gemm_flops, nbytes / self._bw)

    def _allreduce_s(self, tokens: float) -> float:
        if self.tp == 1:
            return 0.0
        nbytes = tokens * self._act_bytes_per_token * 2 * (self.tp - 1) / self.tp
        bw = self.gpu.nvlink_bandwidth or self.gpu.pcie_bandwidth
        return 2 * self.model.layers * (self.p.allreduce_latency_s + nbytes / bw)

    def _fixed_s(self, seqs: float) -> float:
        return self.p.step_overhead_s + self.p.per_seq_overhead_s * seqs

    def decode_times_s(
        self, num_seqs: int, kv_tokens: np.ndarray, window_kv_tokens: np.ndarray | None = None
    ) -> np.ndarray:
        kv = np.asarray(kv_tokens, dtype=np.float64)
        base = self._linear_s(num_seqs, num_seqs) + self._allreduce_s(num_seqs) + self._fixed_s(num_seqs)
        attn = (
            np.maximum(kv * self._attn_flops_per_pair / self._flops, kv * self._kv_bpt / self._bw) * self._paged_factor
        )
        if self._window is not None:
            kvw = kv if window_kv_tokens is None else np.asarray(window_kv_tokens, dtype=np.float64)
            attn = (
                attn
                + np.maximum(kvw * self._w_flops_per_pair / self._flops, kvw * self._w_kv_bpt / self._bw)
                * self._paged_factor
            )
        return base + attn

    def mixed_step_time_s(self, batch: BatchShape) -> float:
        seqs = batch.decode_seqs + len(batch.prefill_chunks)
        tokens = batch.num_tokens
        pairs = float(batch.decode_kv_tokens)
        kv_read = float(batch.decode_kv_tokens)
        for new, ctx in batch.prefill_chunks:
            pairs += new * ctx + new * (new + 1) / 2
            kv_read += ctx + new
        flops = pairs * self._attn_flops_per_pair
        if self._prefill_flops_per_pair != self._attn_flops_per_pair:
            decode = float(batch.decode_kv_tokens)
            flops = decode * self._attn_flops_per_pair + (pairs - decode) * self._prefill_flops_per_pair
        attn = max(flops / self._flops, kv_read * self._kv_bpt / self._bw)
        if self._window is not None:
            w = self._window
            pairs = float(batch.decode_window_kv_tokens or batch.decode_kv_tokens)
            kv_read = pairs
            for new, ctx in batch.prefill_chunks:
                ctx = min(ctx, w)
                pairs += new * ctx + new * (new + 1) / 2
                kv_read += ctx + new
            attn += max(pairs * self._w_flops_per_pair / self._flops, kv_read * self._w_kv_bpt / self._bw)
        return (
            self._linear_s(tokens, seqs) + self._allreduce_s(tokens) + self._fixed_s(seqs) + attn * self._paged_factor
        )

    def step_parts(self, batch: BatchShape) -> dict[str, float]:
        if not batch.prefill_chunks and batch.decode_seqs <= 0:
            return {}
        if batch.prefill_chunks:
            seqs = float(batch.decode_seqs + len(batch.prefill_chunks))
            tokens = float(batch.num_tokens)
            whole = self.mixed_step_time_s(batch)
        else:
            seqs = tokens = float(batch.decode_seqs)
            whole = self.step_time_s(batch)
        linear, allreduce, host = self._linear_s(tokens, seqs), self._allreduce_s(tokens), self._fixed_s(seqs)
        # Attention is what is left, as a contiguous cache would run it and what the layout adds.
        attn = (whole - linear - allreduce - host) / self._paged_factor
        return {
            "linear": linear,
            "attention": attn,
            "attention_layout": whole - linear - allreduce - host - attn,
            "allreduce": allreduce,
            "host": host,
        }

    def copy_time_s(self, nbytes: float) -> float:
        return 2.0 * nbytes / self._bw  # read + write

    def zero_fill_time_s(self, nbytes: float) -> float:
        return nbytes / self._bw

    def host_transfer_time_s(self, nbytes: float) -> float:
        return nbytes / self.gpu.pcie_bandwidth

    def alloc_time_s(self, events: int) -> float:
        return events * self.p.alloc_event_s
