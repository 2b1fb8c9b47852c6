"""Pricing multi-head latent attention (DeepSeek-V3, Kimi-K2): one layer's attention kernel, decoding
over the cached latent or prefilling with keys and values expanded per head.

Decode (the up-projections absorbed into the query and output)::

    latency_s + per_item_s · batch · heads + kv_tokens · latent · kv bytes / bandwidth
              + 2 · kv_tokens · heads · (latent + kv_lora_rank) / flops

where ``kv_tokens`` is the batch's total KV length: every sequence reads its latent once for all
heads. Prefill of ``batch`` fresh prompts of ``length`` tokens (causal)::

    latency_s + per_item_s · batch · heads + batch · length · heads · (2·qk + v) · 2 bytes / bandwidth
              + 2 · batch · heads · length (length + 1) / 2 · (qk + v) / flops

with ``qk = nope + rope`` and ``v`` the per-head widths. The four constants of each are fitted per
GPU, engine and KV dtype on the published MLA kernel tables (``calibration/mla_fit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog import MlaSpec


@dataclass(frozen=True)
class MlaKernelFit:
    """Constants of one MLA attention kernel (module docstring). Seconds, bytes/s, FLOP/s."""

    latency_s: float
    per_item_s: float
    bandwidth: float
    flops: float

    def to_json(self) -> dict:
        return {
            "latency_s": self.latency_s,
            "per_item_s": self.per_item_s,
            "bandwidth_bytes_per_s": self.bandwidth,
            "flops": self.flops,
        }

    @classmethod
    def from_json(cls, d: dict) -> MlaKernelFit:
        return cls(float(d["latency_s"]), float(d["per_item_s"]), float(d["bandwidth_bytes_per_s"]), float(d["flops"]))


def mla_decode_s(fit: MlaKernelFit, batch: float, kv_tokens: float, heads: int, mla: MlaSpec, kv_bytes: float) -> float:
    """Seconds of one layer's decode attention: ``batch`` sequences attending ``kv_tokens`` cached
    tokens in all, ``heads`` query heads on this GPU, ``kv_bytes`` bytes per cached value."""
    nbytes = kv_tokens * mla.latent_width * kv_bytes
    flop = 2.0 * kv_tokens * heads * (mla.latent_width + mla.kv_lora_rank)
    return fit.latency_s + fit.per_item_s * batch * heads + nbytes / fit.bandwidth + flop / fit.flops


def mla_prefill_s(fit: MlaKernelFit, batch: float, length: float, heads: int, mla: MlaSpec) -> float:
    """Seconds of one layer's prefill attention over ``batch`` fresh prompts of ``length`` tokens."""
    qk, v = mla.nope_dim + mla.rope_dim, mla.v_dim
    nbytes = batch * length * heads * (2 * qk + v) * 2.0
    flop = 2.0 * batch * heads * length * (length + 1) / 2.0 * (qk + v)
    return fit.latency_s + fit.per_item_s * batch * heads + nbytes / fit.bandwidth + flop / fit.flops
