"""Catalogs of model shapes and accelerators, and the KV-cache byte arithmetic.

Everything here is plain data plus plain functions: the numbers that turn a
model and a GPU into bytes per token and KV capacity per replica.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.errors import ConfigError

GiB = 1 << 30

#: Bytes per element of each supported dtype. int4 packs two elements a byte.
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer (encoder fields for encoder-decoder).

    ``params`` counts every weight; ``sliding_window`` caps the KV a sequence
    keeps (tokens), ``None`` for full attention.
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

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """Bytes of K and V for one token across all layers: 2 · layers · kv_heads · head_dim · dtype."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(kv_dtype, "model.kv_dtype"))

    def weight_bytes(self, weight_dtype: str) -> int:
        """Bytes of all weights at ``weight_dtype``."""
        return int(self.params * dtype_bytes(weight_dtype, "model.weight_dtype"))

    def kv_tokens_held(self, context_tokens: int) -> int:
        """Tokens whose K/V must stay resident for a sequence of this length."""
        if self.sliding_window is None:
            return context_tokens
        return min(context_tokens, self.sliding_window)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. Memory in bytes, bandwidths in bytes/s, compute in FLOP/s."""

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    peak_bf16_flops: float
    pcie_bandwidth: float
    nvlink_bandwidth: float = 0.0
    source: str = ""


def dtype_bytes(dtype: str, key: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(key, dtype, f"allowed: {', '.join(DTYPE_BYTES)}") from None


_HF = "Hugging Face config.json"
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 6.74e9, 32000, 4096, source=_HF),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 13.02e9, 32000, 4096, source=_HF),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 68.98e9, 32000, 4096, source=_HF),
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 8.03e9, 128256, 131072, source=_HF),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 70.55e9, 128256, 131072, source=_HF),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 7.24e9, 32000, 32768, sliding_window=4096, source=_HF + " (v0.1, sliding window 4096)"),
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 7.62e9, 152064, 32768, source=_HF),
        # T5-class encoder-decoder: 24 encoder + 24 decoder layers, d_model 2048, 32 heads of 64.
        ModelSpec("flan-t5-xl", 24, 2048, 32, 32, 64, 5120, 2.85e9, 32128, 4096, encoder_layers=24,
                  source=_HF + " (google/flan-t5-xl; layers = decoder layers)"),
        # Small shapes a CPU can run for the reference engine and CI.
        ModelSpec("tiny-llama", 4, 256, 8, 4, 32, 688, 4.2e6, 1024, 2048, source="synthetic test shape"),
    ]
}

_NV = "NVIDIA datasheet"
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec("H100-SXM-80GB", 80 * GiB, 3.35e12, 989e12, 64e9, 450e9, _NV + "; aiconfigurator system.yaml"),
        GpuSpec("H200-SXM-141GB", 141 * GiB, 4.8e12, 989e12, 64e9, 450e9, _NV + "; aiconfigurator system.yaml"),
        GpuSpec("A100-SXM-80GB", 80 * GiB, 2.039e12, 312e12, 32e9, 300e9, _NV + "; aiconfigurator system.yaml"),
        GpuSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, 32e9, 300e9, _NV),
        GpuSpec("L40S", 48 * GiB, 864e9, 362e12, 32e9, 0.0, _NV),
        GpuSpec("A10G", 24 * GiB, 600e9, 70e12, 32e9, 0.0, "AWS G5 documentation (dense bf16)"),
        GpuSpec("L4", 24 * GiB, 300e9, 121e12, 32e9, 0.0, _NV),
        # A generic host CPU, for the torch reference engine and the cpu-reference profile.
        GpuSpec("cpu", 16 * GiB, 20e9, 0.2e12, 20e9, 0.0, "rough figures for a 2-core x86 host"),
    ]
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError("model.name", name, f"allowed: {', '.join(MODELS)} (or give explicit dims)") from None


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ConfigError("gpu.name", name, f"allowed: {', '.join(GPUS)}") from None


def activation_reserve_bytes(model: ModelSpec, tensor_parallel: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Memory vLLM's profiling run would keep back for activations, per replica.

    A forward pass over ``max_num_batched_tokens`` holds a few hidden-sized and
    one intermediate-sized activation per token (bf16), the sampler holds fp32
    logits for every running sequence, and each GPU keeps ~1 GiB of CUDA
    context, graphs and NCCL buffers.
    """
    per_token = (4 * model.hidden + 2 * model.intermediate // tensor_parallel) * 2
    logits = max_num_seqs * model.vocab * 4
    return int(tensor_parallel * GiB + max_num_batched_tokens * per_token + logits)


def kv_capacity_bytes(model: ModelSpec, gpu: GpuSpec, tensor_parallel: int, gpu_memory_utilization: float,
                      weight_dtype: str, activation_reserve: int) -> int:
    """KV bytes available per replica: TP · memory · utilization − weights − activation reserve."""
    return int(tensor_parallel * gpu.memory_bytes * gpu_memory_utilization) - model.weight_bytes(weight_dtype) - activation_reserve


def with_overrides(model: ModelSpec, **dims) -> ModelSpec:
    return replace(model, **dims)
