"""The cost model priced from a calibrated profile (:mod:`sim.cost.profile`): a model's shapes on
one GPU count (:func:`shape_keys`), each iteration's GEMMs, attention, all-reduces, elementwise
kernels and host time from the profile's curves and the serving engine's terms, and
:func:`build_profile_cost_model`, the engine's entry point for ``cost_model.profile``. This module
must not import torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from sim.catalog import TP_DEGREES, GpuSpec, ModelSpec, check_tensor_parallel, quantized_head
from sim.cost.kernel_model import elem_bytes
from sim.cost.mla import mla_decode_s, mla_prefill_s
from sim.cost.model import BatchShape, CostModel, Layout
from sim.cost.moe import MoeKernelFit, moe_layer_s, moe_shape_key
from sim.cost.profile import (
    KEY,
    Curve1D,
    Grid2D,
    Profile,
    ProfileProvenance,
    _interp1,
    _is_number,
    _profile_path,
    _shared_profile,
    _slopes,
    attention_key,
    gemm_key,
    profile_provenance_of,
)
from sim.engine_presets import EnginePreset
from sim.errors import ConfigError

#: Activations cross the tensor-parallel all-reduce in bf16.
ACT_BYTES = 2.0

_DTYPE_ALIAS = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}

#: Decode windows up to this many iterations are priced one scalar query at a time (faster
#: than numpy's fixed overhead); longer ones vectorised. Both give the same floats (see ``at``).
_SHORT = 16


@dataclass(frozen=True)
class ShapeKeys:
    """Curve keys one model shape needs at one TP degree and dtype pair."""

    qkv: str
    o: str
    gate_up: str
    down: str
    lm_head: str
    attention: str

    def gemms(self) -> dict[str, str]:
        return {"qkv": self.qkv, "o": self.o, "gate_up": self.gate_up, "down": self.down, "lm_head": self.lm_head}


def per_gpu_heads(model: ModelSpec, tp: int) -> tuple[int, int]:
    """Query and KV heads one GPU holds; KV heads are replicated when fewer than ``tp``. A ``tp`` that
    does not split the model as vLLM requires is a ConfigError naming ``gpu.tensor_parallel``
    (:func:`sim.catalog.check_tensor_parallel`)."""
    if tp < 1:
        raise ConfigError("gpu.tensor_parallel", tp, f"one of {', '.join(map(str, TP_DEGREES))}")
    check_tensor_parallel(model, tp)
    return model.heads // tp, max(1, model.kv_heads // tp)


#: vLLM pads the vocabulary to a multiple of this before splitting it over the GPUs
#: (``VocabParallelEmbedding`` and ``ParallelLMHead``: ``pad_vocab_size`` with
#: ``DEFAULT_VOCAB_PADDING_SIZE``), so the LM head's GEMM on each GPU is ``padded_vocab / tp`` wide.
VOCAB_PADDING = 64


def padded_vocab(vocab: int) -> int:
    """``vocab`` rounded up to a multiple of :data:`VOCAB_PADDING` (32002 -> 32064)."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def shape_keys(model: ModelSpec, tp: int, gemm_dtype: str, kv_dtype: str, head_dtype: str | None = None) -> ShapeKeys:
    """Column-parallel QKV and gate/up (n split), row-parallel O and down (k split), vocab-parallel LM head
    over the padded vocabulary (:func:`padded_vocab`; at ``head_dtype``, else ``gemm_dtype``: quantized
    checkpoints keep it in 16 bits)."""
    h, kvh = per_gpu_heads(model, tp)
    d = model.head_dim
    if model.mla is not None:
        # MLA: the query up-projection (from the q_lora_rank bottleneck, or from hidden) and the output
        # projection from the per-head value width; the down-projections are priced apart.
        a = model.mla
        qkv = gemm_key(h * (a.nope_dim + a.rope_dim), a.q_lora_rank or model.hidden, gemm_dtype)
        o = gemm_key(model.hidden, h * a.v_dim, gemm_dtype)
    else:
        qkv = gemm_key((h + 2 * kvh) * d, model.hidden, gemm_dtype)
        o = gemm_key(model.hidden, h * d, gemm_dtype)
    return ShapeKeys(
        qkv=qkv,
        o=o,
        gate_up=gemm_key(2 * model.intermediate // tp, model.hidden, gemm_dtype),
        down=gemm_key(model.hidden, model.intermediate // tp, gemm_dtype),
        lm_head=gemm_key(padded_vocab(model.vocab) // tp, model.hidden, head_dtype or gemm_dtype),
        attention=attention_key(h, kvh, d, kv_dtype),
    )


def attention_layout_factor(profile_layout: dict, layout: Layout) -> float:
    """Multiplier on the profile's (paged, measured block size) decode-attention curve for ``layout``.

    Contiguous: ``1 / (1 + paged_overhead)``. Paged: 1, unless the profile measured the
    overhead at several block sizes (``paged_overhead_by_block_size``, device profiles):
    then ``(1 + overhead(block size)) / (1 + overhead(measured block size))``, the overhead
    interpolated linearly in log block size and clamped at the measured ends.
    """
    if not layout.paged:
        return 1.0 / (1.0 + float(profile_layout["paged_overhead"]))
    by_bs = profile_layout.get("paged_overhead_by_block_size") or {}
    ref = profile_layout.get("measured_block_size")
    if len(by_bs) < 2 or ref is None or str(ref) not in by_bs:
        return 1.0
    bs = np.array(sorted(int(k) for k in by_bs), dtype=np.float64)
    ov = np.array([float(by_bs[str(int(b))]) for b in bs])
    at = float(np.interp(math.log(max(layout.block_size, 1)), np.log(bs), ov))
    return (1.0 + at) / (1.0 + float(by_bs[str(ref)]))


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed outside the compiled modules
class ProfileCostModel(CostModel):
    """Step time from a profile's curves.

    One iteration costs::

        layers × (GEMMs(qkv, o, gate_up, down at T tokens) + attention + elementwise(T))
        + 2 × layers × all-reduce(T × hidden × 2 bytes)      (TP > 1)
        + lm_head GEMM(sequences) + CPU overhead(sequences)

    with T the tokens computed this iteration. Decode attention is the generation
    curve at (sequences, mean KV length) — on a mixed model's sliding-window layers at
    the mean of each sequence's length capped at the window; a contiguous layout divides it by
    ``1 + layout.paged_overhead`` (the tables were measured paged). Prefill chunks use
    the context curve at the FLOP-equivalent length ``sqrt(new² + 2·new·context)``
    (root-mean-square over chunks), and never less than reading their KV once (a mixed
    model's sliding-window layers with each chunk's context capped at the window).
    """

    calibrated = True

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        tensor_parallel: int = 1,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        layout: Layout = Layout(paged=True),
        engine: EnginePreset | None = None,
        source: str | None = None,
        kind: str | None = None,
    ):
        super().__init__()
        self.profile, self.model, self.gpu, self.tp, self.layout = profile, model, gpu, int(tensor_parallel), layout
        self.name = profile.name
        #: The profile as the user named it (``cost_model.profile``: a built-in name or a file path), which
        #: errors quote; the profile's own name where it was not loaded by reference.
        self.source: str = profile.name if source is None else str(source)
        #: Which profile file priced this model, hashed from the bytes its profile was parsed from
        #: (``kind``: ``builtin`` or ``file``, as ``source`` named it); None for a profile built in memory.
        self.provenance: ProfileProvenance | None = profile_provenance_of(
            profile, kind, source if kind == "file" else None
        )
        #: The serving engine's framework terms (``None``: the profile's own measured overhead, as is).
        self.engine = engine
        #: Which MLA attention fits price a multi-head latent attention model, for ``describe``.
        self._mla_info: dict[str, Any] = {}
        #: Layers whose attention spans each sequence's whole KV, as a plain attribute (read on every
        #: priced iteration): every layer, less the sliding-window layers of a model that mixes both.
        self._layers: int = model.layers - (model.sliding_layers if model.mixed_window is not None else 0)
        #: Those sliding-window layers, and their window (0: none); see ``_window_attention_s``.
        self._window_layers: int = model.layers - self._layers
        self._window: int = model.mixed_window or 0
        wd, kd = self._dtype(weight_dtype, "weight"), self._dtype(kv_dtype, "kv")
        # fp8 and fp4 checkpoints keep the LM head in 16 bits, so it runs as a bf16 GEMM where the
        # profile prices bf16.
        head = "bf16" if quantized_head(wd) and "bf16" in profile.dtypes.get("weight", []) else None
        self.keys = shape_keys(model, self.tp, wd, kd, head)
        #: The engine's own kernel tables when the profile carries them, else the profile's defaults.
        self.kernels: str | None = engine.kernels if engine is not None and engine.kernels in profile.kernels else None
        backend = self.kernels
        self._gemm: dict[str, Curve1D] = {
            proj: self._gemm_curve(key, f"GEMM {proj}") for proj, key in self.keys.gemms().items()
        }
        #: Per-token GEMMs besides the four of ``_gemm_tok`` (MLA's replicated query and KV down-projections).
        self._gemm_extra: list[tuple[str, Curve1D]] = []
        if model.mla is not None:
            self._gen, self._ctx = self._mla_grids(model, wd, kd)
        else:
            ctx, gen = profile.attention_grids(self.keys.attention, (backend, backend))
            self._gen = self._need(gen, self.keys.attention, "generation attention", "generation_attention")
            self._ctx = self._need(ctx, self.keys.attention, "context attention", "context_attention")
        #: What priced this model in place of a measurement of its own shape that the run still counts
        #: as calibrated: a head_dim the attention tables did not time, priced on the nearest one's fit
        #: (``kvsim run`` prints each on stderr; ``summary.json`` records them under ``cost_model_profile``).
        self.substitutions = _substitutions(self._ctx, self._gen)
        self._allreduce: Curve1D | None = None
        if self.tp > 1:
            if str(self.tp) not in profile.allreduce:
                raise ConfigError(
                    KEY,
                    self.source,
                    f"tensor_parallel in {{1, {', '.join(sorted(profile.allreduce))}}} "
                    f"(all-reduce measured for those GPU counts); got {self.tp}",
                )
            self._allreduce = profile.allreduce[str(self.tp)]
        #: The engine's own all-reduce for messages up to ``_custom_max`` bytes (the faster of it and NCCL).
        self._custom_ar: Curve1D | None = None
        self._custom_max: float = 0.0
        if engine is not None and self.tp > 1 and engine.custom_allreduce_max_bytes > 0:
            self._custom_ar = profile.custom_allreduce.get(engine.kernels or engine.name, {}).get(str(self.tp))
            self._custom_max = float(engine.custom_allreduce_max_bytes)
        #: Iterations above ``_graph_max`` tokens (or mixed ones, unless ``_graph_mixed``) run eagerly and
        #: pay ``_eager_s`` of launch gaps; without an engine every iteration is priced as measured.
        self._graph_max: float = float(engine.graph_max_tokens) if engine is not None else math.inf
        self._graph_mixed: bool = engine.graph_mixed if engine is not None else True
        self._eager_s: float = model.layers * engine.eager_per_layer_s if engine is not None else 0.0
        #: The host's time to launch an eager iteration's kernels, layer by layer. The GPU runs them as
        #: they come, so an eager iteration lasts at least its host time plus this (``_floor_s``).
        self._eager_host: float = model.layers * engine.eager_host_per_layer_s if engine is not None else 0.0
        self._cpu: dict[str, Any]
        #: Share of the host time hidden behind the GPU; an iteration is never shorter than its host time.
        self._hidden: float = engine.host_hidden if engine is not None else 0.0
        if engine is not None:
            # The engine's host time replaces the profile's measured CPU overhead.
            self._cpu = {"intercept_s": engine.host_s, "per_seq_s": engine.host_per_seq_s, "batch_range": [0, 1 << 40]}
        else:
            cpu = profile.cpu_overhead["by_tp"]
            tps = sorted(int(t) for t in cpu)
            self._cpu = cpu[str(max([t for t in tps if t <= self.tp] or tps[:1]))]
        after = self._cpu.get("after_prefill_s", [])
        if not isinstance(after, list) or not all(_is_number(x) and 0 <= x < 1 for x in after):
            raise ConfigError(
                KEY,
                self.source,
                "cpu_overhead.by_tp.*.after_prefill_s: a list of seconds in [0, 1) "
                f"(added to the k-th decode iteration after a prefill); got {after!r}",
            )
        self.after_prefill_s = [float(x) for x in after]
        delta = self._cpu.get("per_seq_delta_s")
        self._delta_x: list[float] = []
        self._delta_y: list[float] = []
        self._delta_slopes: list[float] = []
        if delta is not None:
            xs, ys = (delta.get("seqs"), delta.get("delta_s")) if isinstance(delta, dict) else (None, None)
            if (
                not isinstance(xs, list)
                or not isinstance(ys, list)
                or len(xs) != len(ys)
                or not xs
                or not all(_is_number(v) for v in xs + ys)
                or any(b <= a for a, b in zip(xs, xs[1:]))
                or xs[0] < 1
                or any(abs(y) >= 1 for y in ys)
            ):
                raise ConfigError(
                    KEY,
                    self.source,
                    "cpu_overhead.by_tp.*.per_seq_delta_s: {seqs: increasing sequence "
                    "counts >= 1, delta_s: seconds in (-1, 1), one per count}; "
                    f"got {delta!r}",
                )
            self._delta_x, self._delta_y = [float(v) for v in xs], [float(v) for v in ys]
            self._delta_slopes = _slopes(self._delta_x, self._delta_y)
        g = self._cpu.get("mixed_per_decode_s", 0.0)
        if not _is_number(g) or not 0 <= g < 1:
            raise ConfigError(
                KEY,
                self.source,
                "cpu_overhead.by_tp.*.mixed_per_decode_s: seconds in [0, 1) per "
                f"decoding sequence in an iteration with prefill; got {g!r}",
            )
        #: What a decoding sequence costs in an iteration with a prefill chunk beyond its cost in a
        #: pure decode iteration (measured on CPU engines; 0 unless the profile has it), seconds.
        self._mixed_decode_s: float = float(g)
        self._attn_factor: float = attention_layout_factor(profile.layout, layout)
        ew = profile.elementwise
        h, kvh = per_gpu_heads(model, self.tp)
        # A QK-norm model (Qwen3) normalises each query and key head: two more kernels that read and
        # write q and k once more. Priced unfused: without them Qwen3-32B decode came out faster
        # than measured on all three engines, the more so the more GPUs (a fixed per-layer cost
        # weighs more in a shorter step), and the Llama groups did not (docs/calibration.md).
        qk_kernels = 2 if model.qk_norm else 0
        # Bytes each token moves through the per-layer memory-bound kernels (2 norms, RoPE on q/k,
        # the QK norms' second pass over q/k, SiLU·mul, 2 residual adds), bf16 activations.
        qk_passes = 2 if model.qk_norm else 1
        per_tok = ACT_BYTES * (
            2 * 2 * model.hidden
            + qk_passes * 2 * (h + kvh) * model.head_dim
            + 3 * model.mlp_width_per_token / self.tp
            + 2 * 3 * model.hidden
        )
        ew_kernels = engine.elementwise_per_layer if engine is not None else ew["kernels_per_layer"]
        self._ew_fixed: float = float(ew_kernels + qk_kernels) * float(ew["latency_s"])
        self._ew_per_token: float = per_tok / float(ew["bandwidth_bytes_per_s"])
        self._base_cache: dict[int, float] = {}
        self._chunk_cache: dict[object, tuple[float, tuple]] = {}
        self._tok_cache: dict[float, tuple[float, tuple]] = {}
        self._seq_cache: dict[float, tuple[float, float, tuple]] = {}
        self._gemm_tok: list[tuple[str, Curve1D]] = [
            (proj, self._gemm[proj]) for proj in ("qkv", "o", "gate_up", "down")
        ]
        #: Seconds taken off each fp8 GEMM: the input quantization its table timed and the engine fuses
        #: away; never below the time to read the GEMM's weights once (``_gemm_floor``).
        self._gemm_less: float = 0.0
        self._gemm_floor: list[float] = [0.0, 0.0, 0.0, 0.0]
        if engine is not None and engine.fp8_quant_fused and wd in ("fp8", "fp8_block", "nvfp4"):
            # NVFP4 layers are timed with their input quantized to fp4 in a kernel of their own too.
            self._gemm_less = profile.fp8_gemm_excess_s(backend, wd)
            bw = float(profile.device["hbm_bandwidth"])
            per_weight = elem_bytes(wd)
            shapes = [self.keys.gemms()[proj].split(":")[0].split("x") for proj, _ in self._gemm_tok]
            self._gemm_floor = [int(n) * int(k) * per_weight / bw for n, k in shapes]
        #: Mixture-of-experts layers (0: a dense model) and how they are priced (``_moe_layer_s``).
        self._moe_layers: int = 0
        self._dense_layers: int = model.layers
        self._moe_fit: MoeKernelFit | None = None
        #: The table's measured curve when it timed this exact shape (``None``: the fitted form).
        self._moe_curve: Curve1D | None = None
        #: Which fused-MoE fit prices the experts and its held-out error, for ``describe``.
        self._moe_info: dict[str, Any] = {}
        self._moe_extra: list[tuple[str, Curve1D]] = []
        self._moe_shape: tuple[int, int, int, float, float] = (0, 0, 0, 0.0, 0.0)
        if model.moe is not None:
            self._init_moe(model, wd)
        mem = profile.memory
        self._mem_lat, self._mem_bw = float(mem["latency_s"]), float(mem["bandwidth_bytes_per_s"])
        self._host_lat, self._host_bw = float(mem["host_latency_s"]), float(mem["host_bandwidth_bytes_per_s"])
        self._alloc_s = float(mem["alloc_event_s"])
        # Measured device profiles carry size curves (seconds vs bytes) per operation.
        self._mem_curves = {k: Curve1D.from_json(v) for k, v in mem.get("curves", {}).items()}

    @property
    def elementwise_per_token_s(self) -> float:
        """Seconds each token adds per layer through the memory-bound elementwise kernels (norms,
        RoPE, SiLU·mul, residual adds): the bytes it moves over the profile's elementwise bandwidth."""
        return self._ew_per_token

    def _mla_grids(self, model: ModelSpec, wd: str, kd: str) -> tuple[Grid2D, Grid2D]:
        """Decode and prefill attention grids of a multi-head latent attention model: the fitted MLA
        kernels (``sim/cost/mla.py``) plus, per decoding sequence, the absorbed per-head up-projections
        (bf16 batched GEMMs) and, per prefilled token, the KV up-projection; and the replicated query
        and KV down-projections as per-token GEMMs (``_gemm_extra``)."""
        mla = model.mla
        assert mla is not None
        h = model.heads // self.tp
        fits = {}
        for kind in ("generation", "context"):
            found = self.profile.mla_fit(self.kernels, kind, kd)
            if found is None:
                have = sorted(
                    {f"{b}:{k}:{d}" for b, ks in self.profile.mla.items() for k, ds in ks.items() for d in ds}
                )
                raise ConfigError(
                    KEY,
                    self.source,
                    f"a profile with a multi-head latent attention ({kind}) kernel fit for a {kd} KV cache "
                    f"(model {model.name!r}); {self.source} has {', '.join(have) or 'none (no MLA kernel tables for this GPU)'}",
                )
            fits[kind] = found
        self._mla_info = {k: {"backend": b, "kv_dtype": d} for k, (b, d, _) in fits.items()}

        curve = self._gemm_curve
        if mla.q_lora_rank:
            self._gemm_extra.append(("gemm_q_down", curve(gemm_key(mla.q_lora_rank, model.hidden, wd), "GEMM q down")))
        self._gemm_extra.append(("gemm_kv_down", curve(gemm_key(mla.latent_width, model.hidden, wd), "GEMM kv down")))
        uk = curve(gemm_key(h * mla.kv_lora_rank, mla.nope_dim, "bf16"), "absorbed K up")
        uv = curve(gemm_key(h * mla.v_dim, mla.kv_lora_rank, "bf16"), "absorbed V up")
        kv_up = curve(gemm_key(h * (mla.nope_dim + mla.v_dim), mla.kv_lora_rank, wd), "GEMM kv up")
        kv_bytes = elem_bytes(kd)
        batch = np.exp2(np.arange(0.0, 10.01, 0.5))
        length = np.exp2(np.arange(0.0, 17.01, 0.5))
        gen_fit, ctx_fit = fits["generation"][2], fits["context"][2]
        gen = np.array(
            [
                [mla_decode_s(gen_fit, b, b * n, h, mla, kv_bytes) + uk.at(b)[0] + uv.at(b)[0] for n in length]
                for b in batch
            ]
        )
        ctx = np.array([[mla_prefill_s(ctx_fit, b, n, h, mla) + kv_up.at(b * n)[0] for n in length] for b in batch])
        meta = {"kernel": "multi-head latent attention (fitted)", "length_is": "KV tokens per sequence"}
        return (
            Grid2D(batch, length, gen, {**meta, "backend": fits["generation"][0]}),
            Grid2D(batch, length, ctx, {**meta, "backend": fits["context"][0], "length_is": "prompt tokens"}),
        )

    def _init_moe(self, model: ModelSpec, wd: str) -> None:
        """The fused-expert kernel fit, the router GEMM and the shared experts' GEMMs of a MoE model."""
        moe = model.moe
        assert moe is not None
        if moe.expert_intermediate % self.tp or moe.shared_intermediate % self.tp:
            ok = [t for t in TP_DEGREES if not (moe.expert_intermediate % t or moe.shared_intermediate % t)]
            raise ConfigError(
                "gpu.tensor_parallel",
                self.tp,
                f"one of {', '.join(map(str, ok))}: a divisor of {model.name}'s expert width "
                f"{moe.expert_intermediate}"
                + (f" and shared-expert width {moe.shared_intermediate}" if moe.shared_intermediate else ""),
            )
        expert_dtype = moe.expert_dtype or wd
        found = self.profile.moe_fit(self.kernels, expert_dtype)
        if found is None:
            have = sorted({f"{b}:{d}" for b, ds in self.profile.moe.items() for d in ds})
            raise ConfigError(
                KEY,
                self.source,
                f"a profile with a fused mixture-of-experts kernel fit for {expert_dtype} experts (model {model.name!r} "
                f"routes each token to {moe.experts_per_token} of {moe.experts} experts); "
                f"{self.source} has {', '.join(have) or 'none (no MoE kernel tables for this GPU)'}",
            )
        self._moe_fit = found[2]
        entry = self.profile.moe[found[0]][found[1]]
        # A shape the table measured is priced on its own measured curve, others on the fitted form.
        shape = (entry.get("shapes") or {}).get(
            moe_shape_key(model.hidden, moe.expert_intermediate, moe.experts_per_token, moe.experts, self.tp)
        )
        if shape is not None:
            self._moe_curve = Curve1D.from_json(shape)
        self._moe_info = {
            "backend": found[0],
            "weight_dtype": found[1],
            "measured_shape": shape is not None,
            **{k: entry[k] for k in ("kernel", "heldout_median", "heldout_p90") if k in entry},
        }
        self._moe_layers = moe.moe_layers
        self._dense_layers = model.dense_layers
        self._moe_shape = (
            moe.experts,
            moe.experts_per_token,
            model.hidden,
            moe.expert_intermediate / self.tp,
            elem_bytes(found[1]),
        )
        # The router is a small bf16 GEMM (experts x hidden) every engine keeps unquantised.
        extra = [("gemm_router", gemm_key(moe.experts, model.hidden, "bf16"))]
        if moe.shared_intermediate:
            si = moe.shared_intermediate // self.tp
            extra += [
                ("gemm_shared_gate_up", gemm_key(2 * si, model.hidden, wd)),
                ("gemm_shared_down", gemm_key(model.hidden, si, wd)),
            ]
        self._moe_extra = [(name, self._gemm_curve(key, name)) for name, key in extra]

    def _moe_layer_s(self, tokens: float, counts: list) -> float:
        """One MoE layer's feed-forward at ``tokens``: fused experts, router and shared experts."""
        fit = self._moe_fit
        assert fit is not None
        e, k, h, w, wb = self._moe_shape
        if self._moe_curve is not None:
            total, oor = self._moe_curve.at(tokens)
            if oor:
                counts.append(("moe", oor))
        else:
            total = moe_layer_s(fit, tokens, e, k, h, w, wb)
        return total + self._curves_s(self._moe_extra, tokens, counts)

    def _curves_s(self, curves: list[tuple[str, Curve1D]], tokens: float, counts: list) -> float:
        """Seconds of these per-token GEMM curves at ``tokens``, their out-of-range counts appended to ``counts``."""
        total = 0.0
        for name, curve in curves:
            t, oor = curve.at(tokens)
            if oor:
                counts.append((name, oor))
            total += t
        return total

    # -- helpers --
    def _gemm_curve(self, key: str, what: str) -> Curve1D:
        """The GEMM curve of ``key`` on the engine's kernels (the profile's defaults where it has none)."""
        return self._need(self.profile.gemm_curve(key, self.kernels), key, what)

    def _dtype(self, dtype: str, which: str) -> str:
        canon = _DTYPE_ALIAS.get(dtype)
        have = self.profile.dtypes.get(which, [])
        if canon == "fp8_block" and which == "weight" and "fp8" in have and self.profile.kernels:
            return canon  # priced on a block-fp8 table where the kernels have one, else on fp8 (gemm_curve)
        if canon is None or canon not in have:
            raise ConfigError(
                f"model.{which}_dtype",
                dtype,
                f"profile {self.source} has {which} dtypes {', '.join(have)} (fp16 runs on the bf16 curves)",
            )
        return canon

    def _need(self, curve, key: str, what: str, family: str = "gemm"):
        if curve is not None:
            return curve
        p = self.profile
        if p.kernels:
            how = f"fitted kernel families, none of which prices this {family} shape and dtype"
        else:
            # The models whose shapes the file bakes curves for (its ``models`` may list more).
            gemms = {k.split(":")[0] for k in p.gemm}
            attn = {k.split(":")[0] for k in p.context_attention} & {k.split(":")[0] for k in p.generation_attention}
            covered = [
                m
                for m, e in sorted(p.models.items())
                if isinstance(e, dict)
                and set(dict(e.get("gemm_shapes") or {}).values()) <= gemms
                and e.get("attention_shape") in attn
            ]
            how = f"no fitted kernel families, and curves for: {', '.join(covered) or 'no listed model'}"
        raise ConfigError(
            KEY,
            self.source,
            f"a profile that measured the {what} shape {key} needed by model {self.model.name!r} at "
            f"tensor_parallel={self.tp}; {self.source} has {how}",
        )

    def _count(self, curve: str, n: int) -> None:
        if n:
            self.out_of_range[curve] = self.out_of_range.get(curve, 0) + n

    def _replay(self, counts: tuple) -> None:
        oor = self.out_of_range
        for curve, n in counts:
            oor[curve] = oor.get(curve, 0) + n

    # Each piece below is a pure function of its (integer) arguments, so it is computed once per
    # distinct argument and cached with the out-of-range counts it made; a hit replays the counts,
    # so ``out_of_range`` is exactly what evaluating it again would have counted.
    def _tokens_part(self, tokens: float) -> tuple[float, tuple]:
        """``layers × (GEMMs + elementwise) + all-reduces`` at ``tokens``, and its out-of-range counts."""
        hit = self._tok_cache.get(tokens)
        if hit is not None:
            return hit
        counts: list = []
        total, mlp = self._gemm_sums(tokens, counts)
        per_layer = total + self._ew_fixed + self._ew_per_token * tokens
        val = self.model.layers * per_layer
        if self._moe_layers:
            # A mixture-of-experts model: the dense MLP on its dense layers only, the experts on the rest.
            val = val + self._dense_layers * mlp + self._moe_layers * self._moe_layer_s(tokens, counts)
        if self._allreduce is not None:
            val = val + 2.0 * self.model.layers * self._allreduce_s(tokens, counts)
        out = (val, tuple(counts))
        if len(self._tok_cache) < 65536:
            self._tok_cache[tokens] = out
        return out

    def _gemm_sums(self, tokens: float, counts: list) -> tuple[float, float]:
        """One layer's per-token GEMM seconds at ``tokens`` (the engine's fused input quantization
        taken off), the MLP's apart on a mixture-of-experts model: ``(the rest, the dense MLP)``;
        out-of-range counts appended to ``counts``."""
        total = 0.0
        mlp = 0.0
        less = self._gemm_less
        for j, (proj, curve) in enumerate(self._gemm_tok):
            t, oor = curve.at(tokens)
            if oor:
                counts.append((f"gemm_{proj}", oor))
            if less:
                floor = self._gemm_floor[j]
                t = t - less if t - less > floor else floor
            if j >= 2 and self._moe_layers:
                mlp += t
            else:
                total += t
        if self._gemm_extra:
            total += self._curves_s(self._gemm_extra, tokens, counts)
        return total, mlp

    def _allreduce_s(self, tokens: float, counts: list) -> float:
        """One tensor-parallel all-reduce of ``tokens`` tokens' activations: NCCL's, or the engine's
        own where it is faster for a message that small; out-of-range counts appended to ``counts``."""
        assert self._allreduce is not None
        nbytes = tokens * self.model.hidden * ACT_BYTES
        t, oor = self._allreduce.at(nbytes)
        if self._custom_ar is not None and nbytes <= self._custom_max:
            t = min(t, self._custom_ar.at(nbytes)[0])
        if oor:
            counts.append(("allreduce", oor))
        return t

    def _seqs_part(self, seqs: float) -> tuple[float, float, tuple]:
        """LM head and CPU overhead at ``seqs`` sequences, and their out-of-range counts."""
        hit = self._seq_cache.get(seqs)
        if hit is not None:
            return hit
        counts = []
        lm, oor = self._gemm["lm_head"].at(seqs)
        if oor:
            counts.append(("gemm_lm_head", oor))
        lo, hi = self._cpu["batch_range"]
        if seqs < lo or seqs > hi:
            counts.append(("cpu_overhead", 1))
        cpu = float(self._cpu["intercept_s"]) + float(self._cpu["per_seq_s"]) * seqs
        if self._hidden:
            cpu *= 1.0 - self._hidden  # the exposed part; the whole is the iteration's floor (_host_floor)
        dx = self._delta_x
        if dx and dx[0] <= seqs <= dx[-1]:
            # The measured step overhead's departure from the line at this count (interpolated
            # between measured counts; the line alone beyond them).
            cpu += _interp1(seqs, dx, self._delta_y, self._delta_slopes)
        out = (lm, cpu, tuple(counts))
        if len(self._seq_cache) < 65536:
            self._seq_cache[seqs] = out
        return out

    def _non_attention_s(self, tokens: float, seqs: float) -> float:
        a, ca = self._tokens_part(tokens)
        lm, cpu, cs = self._seqs_part(seqs)
        if ca:
            self._replay(ca)
        if cs:
            self._replay(cs)
        return a + lm + cpu

    def _floor_s(self, seqs: float, eager: bool) -> float:
        """The least an iteration over ``seqs`` sequences can take, set by the host (0: none): its
        whole host time where part of it is hidden behind the GPU, and that plus the launches of
        an eager iteration's kernels, which the GPU cannot outrun."""
        if eager and self._eager_host:
            return self._host_floor(seqs) + self._eager_host
        return self._host_floor(seqs) if self._hidden else 0.0

    def _host_floor(self, seqs: float) -> float:
        """The whole host time of an iteration over ``seqs`` sequences (its lower bound when part of it
        is hidden behind the GPU)."""
        return float(self._cpu["intercept_s"]) + float(self._cpu["per_seq_s"]) * seqs

    def _decode_base(self, n: int) -> float:
        # Counted on first use of ``n`` only (the historical semantics of this cache).
        base = self._base_cache.get(n)
        if base is None:
            base = self._non_attention_s(n, n) + (self._eager_s if n > self._graph_max else 0.0)
            if len(self._base_cache) < 65536:
                self._base_cache[n] = base
        return base

    # -- CostModel API --
    def decode_times_s(
        self, num_seqs: int, kv_tokens: np.ndarray, window_kv_tokens: np.ndarray | None = None
    ) -> np.ndarray:
        kv = np.asarray(kv_tokens, dtype=np.float64)
        n = int(num_seqs)
        if n <= 0:
            return np.zeros(kv.shape)
        base = self._decode_base(n)
        coef = self._layers * self._attn_factor
        if kv.ndim == 1 and kv.size <= _SHORT:
            # Short windows (most of them): one scalar query per iteration beats numpy's overhead.
            at = self._gen.at
            out, oor = [], 0
            for v in kv.tolist():
                t, o = at(n, v / n)
                oor += o
                out.append(base + coef * t)
            self._count("generation_attention", oor)
            times = np.array(out, dtype=np.float64)
        else:
            attn, oor = self._gen(n, kv / n)
            self._count("generation_attention", oor)
            times = base + coef * attn
        if self._window_layers:
            times = times + self._window_attention_s(n, kv if window_kv_tokens is None else window_kv_tokens)
        lo = self._floor_s(n, n > self._graph_max)
        if lo:
            return np.maximum(times, lo)
        return times

    def _window_attention_s(self, n: int, window_kv_tokens: np.ndarray) -> np.ndarray:
        """Decode attention seconds of a mixed model's sliding-window layers, ``n`` sequences
        attending ``window_kv_tokens[j]`` tokens in all (each capped at the window) in iteration ``j``."""
        kvw = np.asarray(window_kv_tokens, dtype=np.float64)
        attn, oor = self._gen(n, kvw / n)
        self._count("generation_attention", oor)
        return self._window_layers * self._attn_factor * attn

    def decode_times_list(self, num_seqs: int, kv_tokens: list[float]) -> list[float]:
        n = int(num_seqs)
        if n <= 0 or len(kv_tokens) > _SHORT or self._window_layers:
            return self.decode_times_s(n, np.array(kv_tokens, dtype=np.float64)).tolist()
        return self._decode_at_lengths(n, [v / n for v in kv_tokens])

    def decode_window_times(self, num_seqs: int, kv_first: int, k: int) -> list[float]:
        n = int(num_seqs)
        if n <= 0 or k > _SHORT or self._window_layers:
            return super().decode_window_times(n, kv_first, k)
        return self._decode_at_lengths(n, [(kv_first + n * j) / n for j in range(k)])

    def _decode_at_lengths(self, n: int, lengths: list[float]) -> list[float]:
        """Short decode windows of ``n`` sequences at these mean KV lengths, one value at a time
        (the same floats as the array path, within the ulps of ``at_many``'s pow form)."""
        base = self._decode_base(n)
        coef = self._layers * self._attn_factor
        if len(lengths) == 1:  # a third of all windows: one iteration before the next arrival
            t, oor = self._gen.at(n, lengths[0])
            out = [base + coef * t]
        else:
            out, oor = self._gen.at_many(n, lengths, base, coef)
        if oor:
            self._count("generation_attention", oor)
        lo = self._floor_s(n, n > self._graph_max)
        if lo:
            out = [v if v > lo else lo for v in out]
        return out

    def gemm_s(self, proj: str, tokens: int) -> tuple[float, bool]:
        """Seconds of one layer's ``proj`` GEMM (``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``) on
        ``tokens`` rows as its curve prices it, before any engine term, and whether ``tokens`` lies
        outside the curve's measured grid."""
        t, out = self._gemm[proj].at(tokens)
        return t, bool(out)

    def step_time_s(self, batch: BatchShape) -> float:
        if batch.prefill_chunks:
            return self.mixed_step_time_s(batch)
        n = int(batch.decode_seqs)
        if n <= 0:
            return 0.0
        # Exactly decode_times_s(n, [kv])[0]: the same scalar expression.
        base = self._decode_base(n)
        t, oor = self._gen.at(n, float(batch.decode_kv_tokens) / n)
        self._count("generation_attention", oor)
        v = base + self._layers * self._attn_factor * t
        if self._window_layers:
            v += self._window_step_s(batch)
        lo = self._floor_s(n, n > self._graph_max)
        return v if v > lo else lo

    def mixed_step_time_s(self, batch: BatchShape) -> float:
        chunks = batch.prefill_chunks
        d = batch.decode_seqs
        m = len(chunks)
        tokens = d + (chunks[0][0] if m == 1 else sum(c for c, _ in chunks))
        if tokens <= 0:
            return 0.0
        attn = 0.0
        if d > 0:
            t, oor = self._gen.at(d, batch.decode_kv_tokens / d)
            if oor:
                self._count("generation_attention", oor)
            attn += self._attn_factor * t
        if chunks:
            attn += self._chunks_attention(chunks[0] if m == 1 else tuple(chunks), chunks)
        is_eager = not self._graph_mixed or tokens > self._graph_max
        eager = self._eager_s if is_eager else 0.0
        v = self._non_attention_s(tokens, d + m) + self._layers * attn + self._mixed_decode_s * d + eager
        if self._window_layers:
            v += self._window_step_s(batch)
        lo = self._floor_s(d + m, is_eager)
        return v if v > lo else lo

    def step_parts(self, batch: BatchShape) -> dict[str, float]:
        # A second path beside the priced one (which caches sums, not parts); the property test in
        # tests/test_step_breakdown.py holds the two equal. The counts it makes are put back.
        saved = dict(self.out_of_range)
        try:
            return self._parts(batch)
        finally:
            self.out_of_range.clear()
            self.out_of_range.update(saved)

    def _parts(self, batch: BatchShape) -> dict[str, float]:
        chunks = batch.prefill_chunks
        d = int(batch.decode_seqs)
        m = len(chunks)
        tokens = d + sum(c for c, _ in chunks)
        if tokens <= 0 or (not chunks and d <= 0):
            return {}
        seqs = d + m
        parts = dict.fromkeys(
            ("linear", "lm_head", "attention", "attention_layout", "allreduce", "elementwise", "host", "launch"), 0.0
        )
        self._token_parts(float(tokens), parts)
        lm, cpu, _ = self._seqs_part(float(seqs))
        parts["lm_head"], parts["host"] = lm, cpu + self._mixed_decode_s * d if chunks else cpu
        f = self._attn_factor
        # Attention as a contiguous cache runs it; the layout's part is what this run's layout adds
        # (the paged indirection; 0 for a contiguous one).
        contiguous = attention_layout_factor(self.profile.layout, Layout(paged=False))
        for layers, window in ((self._layers, 0), (self._window_layers, self._window)):
            if not layers:
                continue
            if d > 0:
                kv = (batch.decode_window_kv_tokens or batch.decode_kv_tokens) if window else batch.decode_kv_tokens
                t = self._gen.at(d, kv / d)[0]
                parts["attention"] += layers * contiguous * t
                parts["attention_layout"] += layers * (f * t - contiguous * t)
            if chunks:
                capped = [(c, min(x, window)) for c, x in chunks] if window else list(chunks)
                plain, laid = self._chunk_parts(capped, contiguous)
                parts["attention"] += layers * plain
                parts["attention_layout"] += layers * (laid - plain)
        eager = (not self._graph_mixed or tokens > self._graph_max) if chunks else d > self._graph_max
        parts["launch"] = self._eager_s if eager else 0.0
        gpu = sum(parts.values())
        lo = self._floor_s(seqs, eager)
        parts["host_bound"] = lo - gpu if lo > gpu else 0.0
        return parts

    def _token_parts(self, tokens: float, parts: dict[str, float]) -> None:
        """``linear``, ``elementwise`` and ``allreduce`` of :meth:`_tokens_part` at ``tokens``, apart."""
        counts: list = []
        total, mlp = self._gemm_sums(tokens, counts)
        linear = self.model.layers * total
        if self._moe_layers:
            linear += self._dense_layers * mlp + self._moe_layers * self._moe_layer_s(tokens, counts)
        parts["linear"] = linear
        parts["elementwise"] = self.model.layers * (self._ew_fixed + self._ew_per_token * tokens)
        if self._allreduce is not None:
            parts["allreduce"] = 2.0 * self.model.layers * self._allreduce_s(tokens, counts)

    def _chunk_parts(self, chunks: list[tuple[int, int]], contiguous: float) -> tuple[float, float]:
        """Per-layer attention seconds of prefill chunks as a contiguous cache would run them (the
        decode kernel's share at the ``contiguous`` factor), and as :meth:`_chunks_attention` prices
        them on this layout."""
        t, g = self._chunk_terms(chunks, [])
        return max(t, contiguous * g), max(t, self._attn_factor * g)

    def _window_step_s(self, batch: BatchShape) -> float:
        """Attention seconds of a mixed model's sliding-window layers in one iteration: decodes at
        ``batch.decode_window_kv_tokens`` (the full lengths when not given), prefill chunks with their
        contexts capped at the window."""
        attn = 0.0
        d = batch.decode_seqs
        if d > 0:
            kvw = batch.decode_window_kv_tokens or batch.decode_kv_tokens
            t, oor = self._gen.at(d, kvw / d)
            if oor:
                self._count("generation_attention", oor)
            attn += self._attn_factor * t
        chunks = batch.prefill_chunks
        if chunks:
            w = self._window
            capped = [(c, x if x < w else w) for c, x in chunks]
            attn += self._chunks_attention(capped[0] if len(capped) == 1 else tuple(capped), capped)
        return self._window_layers * attn

    def _chunks_attention(self, key, chunks: list[tuple[int, int]]) -> float:
        """Per-layer attention seconds of prefill chunks ``(new, context)``; a pure function of the
        chunks, cached with the out-of-range counts it made (replayed on a hit, as above)."""
        hit = self._chunk_cache.get(key)
        if hit is not None:
            if hit[1]:
                self._replay(hit[1])
            return hit[0]
        counts: list = []
        t, g = self._chunk_terms(chunks, counts)
        out = (max(t, self._attn_factor * g), tuple(counts))
        if counts:
            self._replay(out[1])
        if len(self._chunk_cache) < 65536:
            self._chunk_cache[key] = out
        return out[0]

    def _chunk_terms(self, chunks: list[tuple[int, int]], counts: list) -> tuple[float, float]:
        """Per-layer seconds of prefill chunks ``(new, context)``: the context-attention kernel's, and
        the decode kernel's read of their whole KV (on the profile's paged layout), which
        :meth:`_chunks_attention` weighs against each other; out-of-range counts appended to ``counts``."""
        m = len(chunks)
        if m < 8:
            # numpy sums fewer than 8 values left to right: the same floats as np.mean below.
            sq, tot = 0.0, 0.0
            for c, x in chunks:
                fc = float(c)
                sq += fc * fc + 2.0 * fc * float(x)
                tot += fc + float(x)
            l_eq = math.sqrt(sq / m)
            mean_len = tot / m
        else:
            new = np.array([c for c, _ in chunks], dtype=np.float64)
            ctx = np.array([x for _, x in chunks], dtype=np.float64)
            # FLOP-preserving equivalent: a fresh prompt of length L has L²/2 causal pairs;
            # a chunk of `new` tokens after `ctx` has new·ctx + new²/2.
            l_eq = float(np.sqrt(np.mean(new * new + 2.0 * new * ctx)))
            mean_len = float(np.mean(new + ctx))
        t, oor = self._ctx.at(m, max(l_eq, 1.0))
        if oor:
            counts.append(("context_attention", oor))
        # A chunk also reads its whole KV once, which the decode kernel's curve prices.
        g, oor2 = self._gen.at(m, mean_len)
        if oor2:
            counts.append(("generation_attention", oor2))
        return t, g

    def _memory_s(self, op: str, nbytes: float, latency_s: float, traffic_bytes: float, bandwidth: float) -> float:
        """A memory operation of ``nbytes``: the profile's measured size curve for ``op`` where it has
        one, else ``latency_s + traffic_bytes / bandwidth``."""
        if nbytes <= 0:
            return 0.0
        curve = self._mem_curves.get(op)
        if curve is None:
            return latency_s + traffic_bytes / bandwidth
        t, oor = curve.at(float(nbytes))
        self._count(f"memory_{op}", oor)
        return t

    def copy_time_s(self, nbytes: float) -> float:
        return self._memory_s("copy", nbytes, self._mem_lat, 2.0 * nbytes, self._mem_bw)  # read + write

    def zero_fill_time_s(self, nbytes: float) -> float:
        return self._memory_s("zero_fill", nbytes, self._mem_lat, nbytes, self._mem_bw)

    def host_transfer_time_s(self, nbytes: float) -> float:
        return self._memory_s("host_transfer", nbytes, self._host_lat, nbytes, self._host_bw)

    def alloc_time_s(self, events: int) -> float:
        return max(int(events), 0) * self._alloc_s

    def profile_provenance(self) -> dict | None:
        pv = self.provenance
        out: dict[str, Any]
        if pv is not None:
            out = {
                "kind": pv.kind,
                "path": pv.path,
                "name": pv.name,
                "device": pv.device,
                "date": pv.date,
                "method": pv.method,
                "source": pv.source,
                "sha256": pv.sha256,
            }
        else:  # a profile built in memory: what it says of itself
            p = self.profile.provenance
            out = {"name": self.profile.name, "date": p.get("date"), "source": p.get("source")}
        if self.substitutions:
            out["substitutions"] = list(self.substitutions)
        return out

    def describe(self) -> dict:
        return {
            "name": self.name,
            "calibrated": True,
            "device": self.profile.device.get("name"),
            "engine": self.engine.name if self.engine is not None else "reference",
            "kernels": self.kernels or "profile default",
            "tensor_parallel": self.tp,
            "curves": {"attention": self.keys.attention, **self.keys.gemms()},
            "layout": {"paged": self.layout.paged, "block_size": self.layout.block_size},
            "out_of_range": dict(self.out_of_range),
            **({"moe_kernel": self._moe_info} if self._moe_info else {}),
            **({"mla_kernel": self._mla_info} if self._mla_info else {}),
            **({"substitutions": list(self.substitutions)} if self.substitutions else {}),
        }


#: The note :meth:`Profile.attention_grids` leaves on a grid derived at another head_dim than the model's.
_HEAD_DIM_NOTE = re.compile(r"head_dim (\d+) priced on the head_dim (\d+) fit")


def _substitutions(ctx: Grid2D, gen: Grid2D) -> list[str]:
    """One line per head_dim substitution in the context and decode attention grids (one line for
    both where they are the same): ``attention at head_dim 256 priced on the head_dim 128 fit``."""
    found: dict[tuple[str, str], list[str]] = {}
    for kind, grid in (("context", ctx), ("decode", gen)):
        m = _HEAD_DIM_NOTE.search(str(grid.meta.get("outside_measured") or ""))
        if m is not None:
            found.setdefault((m.group(1), m.group(2)), []).append(kind)
    return [
        f"{' and '.join(kinds)} attention at head_dim {d} priced on the head_dim {fit} fit "
        "(no attention kernel of that head_dim measured)"
        for (d, fit), kinds in found.items()
    ]


def build_profile_cost_model(
    profile_ref: str,
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tensor_parallel: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    layout: Layout = Layout(paged=True),
    engine: EnginePreset | None = None,
) -> CostModel:
    """The engine's entry point for ``cost_model.profile``: a built-in name or a JSON path.

    The profile is read once per process and file version (a cost model only reads it; the curves
    it derives are shared): a sweep or a benchmark fit runs many scenarios on one profile. The cost
    model's ``provenance`` hashes the bytes that load parsed."""
    path, kind = _profile_path(profile_ref)
    return ProfileCostModel(
        _shared_profile(path),
        model,
        gpu,
        tensor_parallel=tensor_parallel,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        layout=layout,
        engine=engine,
        source=str(profile_ref),
        kind=kind,
    )
