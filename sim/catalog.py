"""Catalogs of model shapes and accelerators, and the KV-cache byte arithmetic.

Everything here is plain data plus plain functions: the numbers that turn a
model and a GPU into bytes per token and KV capacity per replica.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sim.errors import ConfigError

GiB = 1 << 30

#: ``ModelSpec.layer_types`` values (the Hugging Face names).
FULL, SLIDING = "full_attention", "sliding_attention"

#: Bytes per element of each supported dtype. int4 packs two elements a byte.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    # NVFP4 (Blackwell): 4-bit values and one fp8 scale per 16 of them.
    "nvfp4": 0.5625,
    # MXFP4 (OCP microscaling; gpt-oss experts): 4-bit values and one 8-bit scale per 32 of them.
    "mxfp4": 0.53125,
    "int4": 0.5,
    # W4A16 (compressed-tensors pack-quantized; Kimi K2.5's routed experts): 4-bit integers and one
    # bf16 scale per group of 32.
    "w4a16": 0.5625,
}


@dataclass(frozen=True)
class MoeSpec:
    """The mixture-of-experts feed-forward of a model (``ModelSpec.moe``).

    ``moe_layers`` of the model's layers route each token to ``experts_per_token`` of ``experts``
    gated MLPs of width ``expert_intermediate`` (plus always-on shared experts of total width
    ``shared_intermediate``, 0 if none); the other layers keep the dense MLP of width
    ``ModelSpec.intermediate``. Tensor parallelism splits every expert's width, as vLLM, SGLang
    and TensorRT-LLM do without expert parallelism.
    """

    experts: int
    experts_per_token: int
    expert_intermediate: int
    moe_layers: int
    shared_intermediate: int = 0
    #: Dtype of the routed experts' weights when the checkpoint quantises them apart from the rest
    #: (gpt-oss: ``mxfp4`` experts, Kimi K2.5: ``w4a16`` experts; bf16 attention); ``None``: the
    #: model's weight dtype.
    expert_dtype: str | None = None

    def expert_params(self, hidden: int) -> float:
        """Weights of one routed expert (gate, up, down)."""
        return 3.0 * hidden * self.expert_intermediate

    def active_width(self) -> int:
        """MLP width one token runs through in a mixture layer: its routed experts and the shared ones."""
        return self.experts_per_token * self.expert_intermediate + self.shared_intermediate


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V3, Kimi-K2): every layer caches one latent vector of
    ``kv_lora_rank`` values and a shared RoPE key of ``rope_dim`` per token, whatever the head count;
    keys and values (``nope_dim + rope_dim`` and ``v_dim`` wide per head) are re-expanded from it.
    Queries go through a ``q_lora_rank`` bottleneck (0: none)."""

    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    q_lora_rank: int = 0

    @property
    def latent_width(self) -> int:
        """Values one token caches per layer."""
        return self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer (encoder fields for encoder-decoder).

    ``params`` counts every weight; ``sliding_window`` caps the KV a sequence
    keeps (tokens) on the layers that slide, ``None`` for full attention.
    ``layer_types`` names each layer's attention as Hugging Face configs do
    (``full_attention`` or ``sliding_attention``); empty means every layer is the
    same: sliding when ``sliding_window`` is set, full otherwise.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    params: float
    vocab: int = 32000
    max_position: int = 4096
    sliding_window: int | None = None
    #: Encoder layers of an encoder-decoder model (0: decoder-only). The KV arithmetic then
    #: counts, per decoder layer, a cross-attention cache over the input tokens (kept for the
    #: request's whole life) beside the growing self-attention cache over output tokens; both
    #: are 2 · kv_heads · head_dim values per token, so a request holds (input + output) tokens.
    encoder_layers: int = 0
    source: str = ""
    layer_types: tuple[str, ...] = ()
    #: RMSNorm on each query and key head before RoPE (Qwen3, Gemma 3): priced as two more
    #: memory-bound kernels per layer (docs/calibration.md, "Per-head QK norms").
    qk_norm: bool = False
    #: Mixture-of-experts feed-forward (``None``: every layer has the dense MLP).
    moe: MoeSpec | None = None
    #: Multi-head latent attention (``None``: K and V of ``kv_heads`` heads cached per layer).
    mla: MlaSpec | None = None
    #: The LM head shares the token-embedding matrix (``tie_word_embeddings``): one vocab × hidden
    #: matrix in ``params`` instead of two.
    tied_embeddings: bool = False
    #: Weights (a count, not bytes) a checkpoint quantised below 16 bits keeps in 16 bits besides its
    #: token embedding and LM head: the modules its quantisation excludes (ModelOpt's
    #: ``exclude_modules`` / ``ignore``: NVIDIA's NVFP4 DeepSeek-V3.1 keeps its attention projections in
    #: bf16). :meth:`weight_bytes` counts them at 2 bytes; GEMMs are still priced at the weight dtype.
    unquantized_params: float = 0.0
    #: ``(block_n, block_k)`` of a block-scaled fp8 checkpoint (``quantization_config.weight_block_size``):
    #: one scale per block of block_n output by block_k input values, so every tensor-parallel shard
    #: must hold whole blocks (:func:`block_fp8_shard_problem`). ``None``: not declared (``fp8_block``
    #: weights are then taken as :data:`FP8_BLOCK`).
    weight_block: tuple[int, int] | None = None

    @property
    def kv_width(self) -> int:
        """Values one token caches per layer: K and V of every KV head, or an MLA latent."""
        return self.mla.latent_width if self.mla is not None else 2 * self.kv_heads * self.head_dim

    @property
    def dense_layers(self) -> int:
        """Layers with the dense MLP of width ``intermediate`` (all of them without ``moe``)."""
        return self.layers - (self.moe.moe_layers if self.moe is not None else 0)

    @property
    def active_params(self) -> float:
        """Weights one token computes with: ``params`` less the routed experts it is not sent to."""
        if self.moe is None:
            return self.params
        idle = self.moe.experts - self.moe.experts_per_token
        return self.params - self.moe.moe_layers * idle * self.moe.expert_params(self.hidden)

    @property
    def mlp_width_per_token(self) -> float:
        """Mean MLP width a token runs through per layer (``intermediate`` for a dense model)."""
        if self.moe is None:
            return float(self.intermediate)
        return (self.dense_layers * self.intermediate + self.moe.moe_layers * self.moe.active_width()) / self.layers

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0

    @property
    def sliding_layers(self) -> int:
        """Layers whose attention (and KV) is limited to ``sliding_window`` tokens."""
        if self.sliding_window is None:
            return 0
        if not self.layer_types:
            return self.layers
        return sum(t == SLIDING for t in self.layer_types)

    @property
    def uniform_sliding_window(self) -> int | None:
        """The window when every layer slides, else ``None`` (see :attr:`mixed_window` for a model
        that mixes full and sliding layers)."""
        return self.sliding_window if self.sliding_layers == self.layers else None

    @property
    def mixed_window(self) -> int | None:
        """The window of the sliding layers of a model that mixes full-attention and sliding-window
        layers (gpt-oss, Gemma-2/3), else ``None``. Its KV is held per layer group
        (:attr:`kv_groups`) and its attention priced per layer type."""
        return self.sliding_window if 0 < self.sliding_layers < self.layers else None

    @property
    def kv_groups(self) -> KVGroups:
        """The layers in KV cache groups, as vLLM v1 forms them (:class:`KVGroups`)."""
        if self.mixed_window is None:
            window = self.uniform_sliding_window
            return KVGroups(self.layers, full=0 if window else 1, sliding=1 if window else 0, window=window)
        return kv_groups_of(self.layers - self.sliding_layers, self.sliding_layers, self.mixed_window)

    def kv_replicas(self, tensor_parallel: int) -> int:
        """Copies of each token's KV a replica of ``tensor_parallel`` GPUs keeps: vLLM, SGLang and
        TensorRT-LLM split the KV heads across the GPUs and replicate them when there are fewer heads
        than GPUs (4 KV heads on 8 GPUs: every head on two), so the replica holds
        ``tensor_parallel / kv_heads`` copies of every token then; an MLA latent serves every head,
        so each GPU keeps all of it (``tensor_parallel`` copies)."""
        if self.mla is not None:
            return tensor_parallel
        return max(1, tensor_parallel // self.kv_heads)

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """Bytes of K and V for one token across all layers: 2 · layers · kv_heads · head_dim · dtype
        (MLA: layers · (kv_lora_rank + rope_dim) · dtype)."""
        return int(self.layers * self.kv_width * dtype_bytes(kv_dtype, "model.kv_dtype"))

    def kv_group_bytes_per_token(self, kv_dtype: str) -> int:
        """Bytes of K and V for one token in one KV cache group (:attr:`kv_groups`):
        2 · layers per group · kv_heads · head_dim · dtype; :meth:`kv_bytes_per_token` when every
        layer attends alike (one group of all layers)."""
        return int(self.kv_groups.layers * self.kv_width * dtype_bytes(kv_dtype, "model.kv_dtype"))

    def kv_bytes_held(self, context_tokens: int, kv_dtype: str) -> int:
        """Bytes of KV a sequence of ``context_tokens`` tokens keeps resident, before block rounding:
        every full-attention group holds all its tokens, every sliding-window group the last
        ``window`` of them (padding layers of a group count, as vLLM allocates them)."""
        return self.kv_groups.slots_held(context_tokens) * self.kv_group_bytes_per_token(kv_dtype)

    @property
    def embedding_params(self) -> int:
        """Weights of the token embedding and the LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def weight_bytes(self, weight_dtype: str) -> int:
        """Bytes of all weights at ``weight_dtype`` (a MoE model's routed experts at their own
        ``moe.expert_dtype`` when the checkpoint sets one). A checkpoint quantized below 16 bits
        (fp8, NVFP4, int4) keeps its token embedding and LM head in 16 bits: vLLM's, SGLang's and
        TensorRT-LLM's fp8 and fp4 schemes quantize the linear layers only (ModelOpt's default
        excludes ``lm_head``; the embedding is a lookup, not a GEMM), and so does it the
        ``unquantized_params`` its quantisation excludes."""
        per = dtype_bytes(weight_dtype, "model.weight_dtype")
        experts = 0.0
        expert_bytes = 0.0
        if self.moe is not None and self.moe.expert_dtype is not None:
            experts = self.moe.moe_layers * self.moe.experts * self.moe.expert_params(self.hidden)
            expert_bytes = experts * dtype_bytes(self.moe.expert_dtype, "model.moe")
        embed = 0.0
        if quantized_head(weight_dtype):
            embed = min(float(self.embedding_params), self.params - experts)
            embed += min(self.unquantized_params, self.params - experts - embed)
        return int((self.params - experts - embed) * per + embed * 2 + expert_bytes)

    def kv_tokens_held(self, context_tokens: int) -> int:
        """Tokens whose K/V a sequence of this length keeps on every layer, as an allocator that holds
        all layers alike keeps it: the window when every layer slides, else the whole length (an
        upper bound for a mixed model; :meth:`kv_bytes_held` counts per layer group)."""
        window = self.uniform_sliding_window
        if window is None:
            return context_tokens
        return min(context_tokens, window)


@dataclass(frozen=True)
class KVGroups:
    """A model's layers in KV cache groups, as vLLM v1's hybrid KV cache manager forms them.

    Every group has the same number of layers (``layers``, padding included) and one block table:
    a group of full-attention layers holds every token of a sequence, a group of sliding-window
    layers only the last ``window`` tokens. All groups draw blocks of the same size from one pool,
    so a *slot* (one token in one group: ``layers`` layers' K and V) is the unit of KV memory, and
    a sequence of ``t`` tokens holds ``full · t + sliding · min(t, window)`` slots
    (:meth:`slots_held`, before block rounding). A model whose layers all attend alike is one
    group of all its layers, and a slot is a token.
    """

    #: Layers per group (vLLM's group size), padding layers included.
    layers: int
    #: Groups of full-attention layers.
    full: int
    #: Groups of sliding-window layers.
    sliding: int
    #: Tokens a sliding-window layer attends to and keeps (``None``: no sliding layers).
    window: int | None = None
    #: Layers added to fill the last group of a type (memory vLLM allocates and no layer uses).
    padding_layers: int = 0

    @property
    def count(self) -> int:
        """Groups in all (slots one token takes while it is inside every window)."""
        return self.full + self.sliding

    def slots_held(self, tokens: int) -> int:
        """Slots a sequence of ``tokens`` tokens holds (no block rounding)."""
        if not self.sliding:
            return self.full * tokens
        assert self.window is not None
        return self.full * tokens + self.sliding * min(tokens, self.window)

    def tokens_fitting(self, slots: int) -> int | None:
        """The longest sequence (tokens) whose :meth:`slots_held` fits in ``slots``; ``None``: any length."""
        if not self.sliding:
            return slots // self.full
        assert self.window is not None
        if slots < self.count * self.window:
            return slots // self.count
        return None if not self.full else (slots - self.sliding * self.window) // self.full

    def describe(self) -> dict:
        """The groups for ``summary.json`` (``kv_layer_groups``)."""
        return {
            "layers_per_group": self.layers,
            "full_attention_groups": self.full,
            "sliding_window_groups": self.sliding,
            "window_tokens": self.window,
            "padding_layers": self.padding_layers,
        }


def kv_groups_of(full_layers: int, sliding_layers: int, window: int) -> KVGroups:
    """Groups of a model with ``full_layers`` full-attention and ``sliding_layers`` sliding-window
    layers, by vLLM v1's rule (``_get_kv_cache_groups_uniform_page_size``): the group size is the
    smaller layer count, or the larger one when it is under 1.5 times the smaller (less padding);
    each type fills ``ceil(layers / size)`` groups, the last one padded."""
    lo, hi = min(full_layers, sliding_layers), max(full_layers, sliding_layers)
    size = hi if hi < 1.5 * lo else lo
    full, sliding = -(-full_layers // size), -(-sliding_layers // size)
    return KVGroups(size, full, sliding, window, (full + sliding) * size - full_layers - sliding_layers)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. Memory in bytes, bandwidths in bytes/s, compute in FLOP/s (dense).

    ``peak_fp8_flops`` is 0 on cards without FP8 tensor cores; ``nvlink_bandwidth`` is 0
    on cards that talk over PCIe only.
    """

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    peak_bf16_flops: float
    pcie_bandwidth: float
    nvlink_bandwidth: float = 0.0
    source: str = ""
    peak_fp8_flops: float = 0.0
    #: FP4 tensor cores (Blackwell); 0 without them.
    peak_fp4_flops: float = 0.0

    def peak_gemm_flops(self, weight_dtype: str) -> float:
        """Tensor-core peak for GEMMs on ``weight_dtype`` weights (:func:`tensor_core_peak`)."""
        return tensor_core_peak(weight_dtype, self.peak_bf16_flops, self.peak_fp8_flops, self.peak_fp4_flops)


def tensor_core_peak(dtype: str, bf16: float, fp8: float = 0.0, fp4: float = 0.0, int8: float = 0.0) -> float:
    """FLOP/s of the tensor cores a GEMM computed in ``dtype`` runs on, from a GPU's peaks (0: it has
    no such units): NVFP4 on FP4 units, else FP8; FP8, per-tensor or block-scaled, on FP8 units;
    SmoothQuant int8 on int8 units; anything else, weight-only formats included (they compute in
    bf16), and any format whose units the GPU lacks, at the bf16 rate."""
    if dtype == "nvfp4" and fp4 > 0:
        return fp4
    if dtype in ("nvfp4", "fp8", "fp8_block") and fp8 > 0:
        return fp8
    if dtype == "int8_sq" and int8 > 0:
        return int8
    return bf16


def dtype_bytes(dtype: str, key: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(key, dtype, f"allowed: {', '.join(DTYPE_BYTES)}") from None


def quantized_head(weight_dtype: str) -> bool:
    """Weights below 16 bits (fp8, NVFP4, int4): the checkpoint keeps its token embedding and LM head in
    16 bits (:meth:`ModelSpec.weight_bytes`), and the LM-head GEMM runs in bf16."""
    return dtype_bytes(weight_dtype, "model.weight_dtype") < 2


_HF = "Hugging Face config.json"
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 6.74e9, 32000, 4096, source=_HF),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 13.02e9, 32000, 4096, source=_HF),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 68.98e9, 32000, 4096, source=_HF),
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 8.03e9, 128256, 131072, source=_HF),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 70.55e9, 128256, 131072, source=_HF),
        ModelSpec(
            "mistral-7b",
            32,
            4096,
            32,
            8,
            128,
            14336,
            7.24e9,
            32000,
            32768,
            sliding_window=4096,
            source=_HF + " (v0.1, sliding window 4096)",
        ),
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 7.62e9, 152064, 32768, source=_HF),
        # Qwen3: 64 × 128-wide query heads on a 5120 hidden size (32B), so the attention and O
        # projections are heads · head_dim wide, not hidden; params counted from the shapes
        # (scenarios/models/Qwen--Qwen3-{8B,32B}_config.json, sim/hf_config.py).
        ModelSpec(
            "qwen3-8b",
            36,
            4096,
            32,
            8,
            128,
            12288,
            8.19e9,
            151936,
            40960,
            source=_HF + " (Qwen/Qwen3-8B)",
            qk_norm=True,
        ),
        ModelSpec(
            "qwen3-32b",
            64,
            5120,
            64,
            8,
            128,
            25600,
            32.76e9,
            151936,
            40960,
            source=_HF + " (Qwen/Qwen3-32B)",
            qk_norm=True,
        ),
        # T5-class encoder-decoder: 24 encoder + 24 decoder layers, d_model 2048, 32 heads of 64.
        ModelSpec(
            "flan-t5-xl",
            24,
            2048,
            32,
            32,
            64,
            5120,
            2.85e9,
            32128,
            4096,
            encoder_layers=24,
            source=_HF + " (google/flan-t5-xl; layers = decoder layers)",
        ),
        # Small shapes a CPU can run for the reference engine and CI.
        ModelSpec("tiny-llama", 4, 256, 8, 4, 32, 688, 4.2e6, 1024, 2048, source="synthetic test shape"),
    ]
}

_NV = "NVIDIA datasheet"
_AIC = "; aiconfigurator system.yaml"
MiB = 1 << 20
#: ``memory_bytes`` is what the card reports as its total memory (``nvidia-smi``'s memory.total,
#: the ``total`` of ``torch.cuda.mem_get_info`` that vLLM's ``gpu_memory_utilization`` multiplies),
#: not the datasheet's GB: the driver keeps some back. Cited reported figures:
#:   A100 80 GB 81920 MiB, A100 40 GB 40960 MiB, L40S 46068 MiB, L4 23034 MiB
#:     (nvidia-smi totals, https://github.com/modal-labs/modal-client/pull/2797);
#:   A10G 23028 MiB (nvidia-smi, https://github.com/NVIDIA/DCGM/issues/232).
#: The H100, H200 and B200 keep aiconfigurator's system.yaml figures (80, 141 and 180 GiB), which the
#: built-in profiles and the serving-benchmark accuracy in docs/calibration.md were measured with;
#: their cards report 81559, 143771 and 183359 MiB (modal-client#2797, TensorRT-LLM#9554 and #10278),
#: 0.4-0.6 % less, so kvsim's derived KV capacity on them is that much high. GB200, B300 and GB300
#: keep their listed GiB until a reported figure is cited.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec("H100-SXM-80GB", 80 * GiB, 3.35e12, 989e12, 64e9, 450e9, _NV + _AIC, peak_fp8_flops=1978e12),
        GpuSpec("H200-SXM-141GB", 141 * GiB, 4.8e12, 989e12, 64e9, 450e9, _NV + _AIC, peak_fp8_flops=1978e12),
        GpuSpec("A100-SXM-80GB", 81920 * MiB, 2.039e12, 312e12, 32e9, 300e9, _NV + _AIC),
        GpuSpec("A100-40GB", 40960 * MiB, 1.555e12, 312e12, 32e9, 300e9, _NV),
        # Blackwell: 180 GiB HBM3e at 7.7 TB/s, NVLink 5 (900 GB/s per direction), PCIe 6.0.
        GpuSpec(
            "B200-SXM-180GB",
            193273528320,
            7.7e12,
            2250e12,
            128e9,
            900e9,
            _NV + _AIC,
            peak_fp8_flops=4500e12,
            peak_fp4_flops=9000e12,
        ),
        # GB200 (NVL72): the B200's GPU at a higher power limit, 186 GB HBM3e (counted as 186 GiB: no
        # reported figure cited) at 8 TB/s; dense rates from the NVL72 datasheet's sparse totals (FP8 720,
        # FP4 1440 PFLOPS over 72 GPUs) halved.
        GpuSpec(
            "GB200-186GB",
            186 * GiB,
            8.0e12,
            2500e12,
            128e9,
            900e9,
            _NV + " (GB200 NVL72)",
            peak_fp8_flops=5000e12,
            peak_fp4_flops=10000e12,
        ),
        # Blackwell Ultra: the B200's bf16 and fp8 tensor rates and NVLink 5, 288 GB HBM3e (counted as
        # 288 GiB: no reported figure cited) at 8 TB/s, faster FP4 (HGX B300: 13.1 PFLOPS dense); PCIe 6.0.
        GpuSpec(
            "B300-SXM-288GB",
            288 * GiB,
            8.0e12,
            2250e12,
            256e9,
            900e9,
            _NV + " (HGX B300)",
            peak_fp8_flops=4500e12,
            peak_fp4_flops=13125e12,
        ),
        # GB300 (NVL72): Blackwell Ultra at the GB200's power limit; dense rates from the NVL72 totals
        # (FP8 360, FP4 1100 PFLOPS over 72 GPUs), bf16 as GB200's.
        GpuSpec(
            "GB300-288GB",
            288 * GiB,
            8.0e12,
            2500e12,
            256e9,
            900e9,
            _NV + " (GB300 NVL72)",
            peak_fp8_flops=5000e12,
            peak_fp4_flops=15000e12,
        ),
        # Ada, PCIe only (no NVLink: tensor-parallel all-reduces cross PCIe 4.0).
        GpuSpec("L40S", 46068 * MiB, 864e9, 362.05e12, 32e9, 0.0, _NV + _AIC, peak_fp8_flops=733e12),
        GpuSpec("A10G", 23028 * MiB, 600e9, 70e12, 32e9, 0.0, "AWS G5 documentation (dense bf16)"),
        GpuSpec("L4", 23034 * MiB, 300e9, 121e12, 32e9, 0.0, _NV, peak_fp8_flops=242.5e12),
        # A generic host CPU, for the torch reference engine and the cpu-reference profile.
        GpuSpec("cpu", 16 * GiB, 20e9, 0.2e12, 20e9, 0.0, "rough figures for a 2-core x86 host"),
    ]
}

#: ``gpu.name`` of a card described in the scenario itself (:func:`custom_gpu`).
CUSTOM_GPU = "custom"


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError("model.name", name, f"allowed: {', '.join(MODELS)} (or give explicit dims)") from None


#: Catalog GPUs by the start of their other spellings (lower-case letters and digits, ``nvidia``
#: dropped): ``H100``, ``h100_sxm``, ``NVIDIA H100 80GB HBM3`` (what ``nvidia-smi`` prints).
_GPU_PREFIXES = (
    ("h100", "H100-SXM-80GB"),
    ("h200", "H200-SXM-141GB"),
    ("b200", "B200-SXM-180GB"),
    ("gb200", "GB200-186GB"),
    ("b300", "B300-SXM-288GB"),
    ("gb300", "GB300-288GB"),
    ("l40s", "L40S"),
    ("a10g", "A10G"),
)


#: The memory sizes (GB, as a part's name states them) of each catalog GPU: a spelling that states
#: another size is another part (``H100 64GB HBM2e``, ``H100 SXM5 94GB``, ``A100-SXM-64GB``).
_GPU_NAMED_GB: dict[str, tuple[float, ...]] = {
    "H100-SXM-80GB": (80,),
    "H200-SXM-141GB": (141, 144),
    "A100-SXM-80GB": (80,),
    "A100-40GB": (40,),
    "B200-SXM-180GB": (180, 192),
    "GB200-186GB": (186, 192),
    "B300-SXM-288GB": (288,),
    "GB300-288GB": (288,),
    "L40S": (48,),
    "A10G": (24,),
    "L4": (24,),
}
#: A memory size in a GPU's name: ``80GB``, ``94 GB``, ``64GiB`` (not the ``GB`` of ``GB200``).
_NAMED_GB = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)\s*gi?b(?![a-z0-9])")


def _stated_gb(name: str) -> list[float]:
    """The memory sizes (GB) ``name`` states."""
    return [float(m) for m in _NAMED_GB.findall(str(name).lower())]


def memory_mismatch(name: str) -> str | None:
    """Why ``name`` is not the catalog part its spelling starts like: it states another memory size
    (``NVIDIA H100 64GB HBM2e`` is not the 80 GB H100 SXM), or ``None``."""
    part = _find_gpu_by_spelling(name)
    if part is None or part not in _GPU_NAMED_GB:
        return None
    sizes = _GPU_NAMED_GB[part]
    other = [g for g in _stated_gb(name) if g not in sizes]
    if not other:
        return None
    return (
        f"{str(name).strip()} states {other[0]:g} GB; {part} has {sizes[0]:g} GB: it is another part. Describe it "
        f"with gpu.name={CUSTOM_GPU} and its memory_gib, hbm_tbps, bf16_tflops, pcie_gbps, or run {part} with "
        "gpu.kv_cache_tokens set to the server's KV capacity"
    )


def find_gpu(name: str) -> str | None:
    """The catalog GPU that ``name`` spells, or ``None``.

    Accepts catalog names in any case and the common other spellings of the same parts (``H100``,
    ``h100_sxm``, ``NVIDIA H100 80GB HBM3``, ``A100-SXM4-80GB``, ``nvidia l4``). Other parts of a
    generation differ in memory, bandwidth or power and are not matched to these: H100 PCIe and
    NVL, H200 NVL, GH200, L40 (not L40S); an A100 of 40 GB is ``A100-40GB``, one of 80 GB or that
    names no size the 80 GB SXM part; a spelling that states another memory size than the part's
    (``H100 64GB HBM2e``, ``H100 SXM5 94GB``, ``A100-SXM-64GB``: :func:`memory_mismatch`) is none.
    """
    found = _find_gpu_by_spelling(name)
    if found is not None and memory_mismatch(name) is not None:
        return None
    return found


def _find_gpu_by_spelling(name: str) -> str | None:
    """:func:`find_gpu` without the memory-size check."""
    s = str(name).strip()
    if s in GPUS:
        return s
    for k in GPUS:
        if k.lower() == s.lower():
            return k
    key = "".join(ch for ch in s.lower().replace("nvidia", "") if ch.isalnum())
    if any(part in key for part in ("pcie", "nvl")):
        return None
    for prefix, gpu in _GPU_PREFIXES:
        if key.startswith(prefix):
            return gpu
    if key == "l4" or (key.startswith("l4") and not key[2:3].isdigit()):
        return "L4"
    if key.startswith("a100"):
        return "A100-40GB" if "40gb" in key else "A100-SXM-80GB"
    return None


def get_gpu(name: str) -> GpuSpec:
    """The catalog entry of ``name`` or of a spelling :func:`find_gpu` matches (ConfigError otherwise)."""
    found = find_gpu(name)
    if found is None:
        why = memory_mismatch(name)
        if why is not None:
            raise ConfigError("gpu.name", name, why)
        raise ConfigError(
            "gpu.name",
            name,
            f"allowed: {', '.join(GPUS)} (any case; H100, h100_sxm and nvidia-smi's names match too), "
            f"or {CUSTOM_GPU} with memory_gib, hbm_tbps, bf16_tflops, pcie_gbps "
            "(and fp8_tflops, fp4_tflops, nvlink_gbps)",
        )
    return GPUS[found]


def custom_gpu(
    memory_gib: float,
    hbm_tbps: float,
    bf16_tflops: float,
    pcie_gbps: float,
    fp8_tflops: float = 0.0,
    nvlink_gbps: float = 0.0,
    fp4_tflops: float = 0.0,
) -> GpuSpec:
    """A card with no catalog entry, from its datasheet figures (GiB, TB/s, dense TFLOP/s, GB/s)."""
    return GpuSpec(
        CUSTOM_GPU,
        int(memory_gib * GiB),
        hbm_tbps * 1e12,
        bf16_tflops * 1e12,
        pcie_gbps * 1e9,
        nvlink_gbps * 1e9,
        "scenario gpu section (user figures)",
        peak_fp8_flops=fp8_tflops * 1e12,
        peak_fp4_flops=fp4_tflops * 1e12,
    )


def check_kv_heads(heads: int, kv_heads: int, key: str, value: object, heads_name: str, kv_name: str = "") -> None:
    """ConfigError naming ``key`` and ``value`` unless ``kv_heads`` divides ``heads`` (and so is at
    most ``heads``): grouped-query attention gives each KV head an equal share of the query heads,
    and vLLM and transformers refuse another shape. One rule for a config.json's
    ``num_key_value_heads`` and an explicit ``model.kv_heads``; ``kv_name`` leads the message where
    ``key`` is not the KV heads' own (a config file)."""
    if kv_heads <= heads and heads % kv_heads == 0:
        return
    divisors = [str(d) for d in range(1, heads + 1) if heads % d == 0]
    listed = divisors[0] if len(divisors) == 1 else f"{', '.join(divisors[:-1])} or {divisors[-1]}"
    lead = f"{kv_name} ({kv_heads}) must be " if kv_name else ""
    raise ConfigError(key, value, f"{lead}a divisor of {heads_name} ({heads}): {listed}")


#: ``gpu.tensor_parallel`` values a scenario may give.
TP_DEGREES = (1, 2, 4, 8)


def tensor_parallel_problem(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM refuses to split ``model`` over ``tp`` GPUs, or ``None``: the attention heads must
    divide evenly (``ModelConfig.verify_with_parallel_config``), and the KV heads must divide by
    ``tp`` or ``tp`` by them (``QKVParallelLinear`` splits them, or replicates each a whole number
    of times); the dense MLP's width is split evenly too (``MergedColumnParallelLinear``; a mixture of
    experts' widths are checked where its kernels are priced, ``sim.cost.profile``)."""
    if model.heads % tp:
        return f"its {model.heads} attention heads do not split evenly over {tp} GPUs"
    if model.mla is None and model.kv_heads % tp and tp % model.kv_heads:
        return (
            f"its {model.kv_heads} KV heads neither split evenly over {tp} GPUs nor divide {tp} "
            "(each GPU holds a share of them, or a whole number of GPUs holds each)"
        )
    if model.dense_layers and model.intermediate % tp:
        return f"its MLP intermediate size {model.intermediate} does not split evenly over {tp} GPUs"
    return None


def check_tensor_parallel(model: ModelSpec, tp: int, key: str = "gpu.tensor_parallel") -> None:
    """ConfigError naming ``key``, ``tp`` and the degrees that do split ``model``
    (:func:`tensor_parallel_problem`), as vLLM refuses such a ``tensor_parallel_size``."""
    why = tensor_parallel_problem(model, tp)
    if why is None:
        return
    ok = [t for t in TP_DEGREES if tensor_parallel_problem(model, t) is None]
    raise ConfigError(
        key,
        tp,
        f"one of {', '.join(map(str, ok))} for {model.name} ({model.heads} attention heads, "
        f"{model.kv_heads} KV heads): {why}, which vLLM refuses",
    )


#: The ``weight_block_size`` block-scaled fp8 checkpoints (DeepSeek-V3, Qwen3 FP8) declare, assumed
#: for ``fp8_block`` weights whose checkpoint does not say.
FP8_BLOCK = (128, 128)


def _block_fp8_shards(model: ModelSpec, tp: int) -> list[tuple[str, int, int, str]]:
    """(weight, width, shard, block side) of every weight vLLM checks against its quantisation block
    once tensor parallelism splits it: a column-parallel shard's output rows (``block_n``, width / tp)
    and a row-parallel shard's input columns (``block_k``, width / tp). Merged column-parallel layers
    (``qkv_proj``, ``gate_up_proj``) are left out, as vLLM lets their partitions straddle a block
    (``_maybe_allow_fp8_block_shape_mismatch``); the row-parallel projection after each is not."""
    shards: list[tuple[str, int, int, str]] = []
    moe = model.moe
    if moe is not None and moe.expert_dtype in (None, "fp8_block"):
        # The fused-MoE fp8 method checks each expert's shard on both sides, merged or not.
        per = moe.expert_intermediate // tp
        shards.append(("routed experts' gate/up_proj", moe.expert_intermediate, per, "n"))
        shards.append(("routed experts' down_proj", moe.expert_intermediate, per, "k"))
        if moe.shared_intermediate:
            shards.append(("shared experts' down_proj", moe.shared_intermediate, moe.shared_intermediate // tp, "k"))
    if model.dense_layers:
        shards.append(("dense MLP's down_proj", model.intermediate, model.intermediate // tp, "k"))
    mla = model.mla
    if mla is not None:
        q = model.heads * (mla.nope_dim + mla.rope_dim)
        kv = model.heads * (mla.nope_dim + mla.v_dim)
        shards.append(("q_b_proj" if mla.q_lora_rank else "q_proj", q, q // tp, "n"))
        shards.append(("kv_b_proj", kv, kv // tp, "n"))
        shards.append(("o_proj", model.heads * mla.v_dim, model.heads * mla.v_dim // tp, "k"))
    else:
        width = model.heads * model.head_dim
        shards.append(("o_proj", width, width // tp, "k"))
    return shards


def block_fp8_shard_problem(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM (and SGLang) refuse to load ``model``'s block-scaled fp8 weights split over ``tp`` GPUs, or ``None``:
    a shard narrower than, or not a whole number of, quantisation blocks has no scales of its own
    (``validate_fp8_block_shape``; the fused-MoE ``Fp8MoEMethod.create_weights``)."""
    if tp == 1:
        return None
    block_n, block_k = model.weight_block or FP8_BLOCK
    for weight, width, shard, side in _block_fp8_shards(model, tp):
        block = block_n if side == "n" else block_k
        if shard % block:
            declared = "" if model.weight_block else ", assumed"
            return (
                f"its {weight} shard is {width}/{tp} = {shard} wide, not a multiple of the quantisation "
                f"block's block_{side} = {block} (weight_block_size [{block_n}, {block_k}]{declared})"
            )
    return None


#: The engines that refuse a block-scaled fp8 shard of partial blocks at model load, with the report.
#: TensorRT-LLM is left out: its kernel tables stop at the same shard widths, but no refusal was found.
BLOCK_FP8_REFUSED_BY = {
    "vllm": ("vLLM", "vllm-project/vllm#17569"),
    "sglang": ("SGLang", "sgl-project/sglang#26107"),
}


def check_block_fp8_shards(model: ModelSpec, tp: int, engine: str = "vllm", key: str = "gpu.tensor_parallel") -> None:
    """ConfigError naming ``key``, ``tp`` and the degrees whose shards hold whole blocks
    (:func:`block_fp8_shard_problem`), as ``engine`` (a key of :data:`BLOCK_FP8_REFUSED_BY`) refuses
    such a tensor-parallel degree for a block-scaled fp8 checkpoint."""
    why = block_fp8_shard_problem(model, tp)
    if why is None:
        return
    name, report = BLOCK_FP8_REFUSED_BY[engine]
    ok = [
        t for t in TP_DEGREES if tensor_parallel_problem(model, t) is None and block_fp8_shard_problem(model, t) is None
    ]
    raise ConfigError(
        key,
        tp,
        f"one of {', '.join(map(str, ok))} for {model.name} with block-scaled fp8 weights under {name}: {why}, "
        f"and {name} refuses to load a shard of partial blocks (a ValueError at model load, {report})",
    )


def activation_reserve_bytes(
    model: ModelSpec, tensor_parallel: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Memory vLLM's profiling run would keep back for activations, per replica.

    A forward pass over ``max_num_batched_tokens`` holds a few hidden-sized and
    one intermediate-sized activation per token (bf16), the sampler holds fp32
    logits for every running sequence, and each GPU keeps ~1 GiB of CUDA
    context, graphs and NCCL buffers.
    """
    per_token = (4 * model.hidden + 2 * int(model.mlp_width_per_token) // tensor_parallel) * 2
    logits = max_num_seqs * model.vocab * 4
    return int(tensor_parallel * GiB + max_num_batched_tokens * per_token + logits)


def kv_capacity_bytes(
    model: ModelSpec,
    gpu: GpuSpec,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    weight_dtype: str,
    activation_reserve: int,
) -> int:
    """KV bytes available per replica: TP · memory · utilization − weights − activation reserve."""
    return (
        int(tensor_parallel * gpu.memory_bytes * gpu_memory_utilization)
        - model.weight_bytes(weight_dtype)
        - activation_reserve
    )


def with_overrides(model: ModelSpec, **dims) -> ModelSpec:
    return replace(model, **dims)


#: The built-in calibrated profile used for each catalog GPU when ``cost_model.profile: auto``.
BUILTIN_PROFILE_FOR_GPU = {
    "H100-SXM-80GB": "h100-sxm",
    "H200-SXM-141GB": "h200-sxm",
    "A100-SXM-80GB": "a100-sxm",
    "B200-SXM-180GB": "b200-sxm",
    # The B200's own kernel tables: the same GPU, which GB200 runs at a higher power limit.
    "GB200-186GB": "b200-sxm",
    # Blackwell Ultra has the B200's bf16 and fp8 tensor rates: its kernels are priced on the B200's
    # tables (NVFP4 GEMMs, which it runs about 1.5x faster, too: the proxy is slow there).
    "B300-SXM-288GB": "b200-sxm",
    "GB300-288GB": "b200-sxm",
    "L40S": "l40s",
    "cpu": "cpu-reference",
}
