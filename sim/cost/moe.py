"""Pricing a mixture-of-experts feed-forward: which experts a batch wakes, and what the fused
expert kernel then moves and computes.

One fused MoE layer (router top-k, token permutation, the grouped gate/up and down GEMMs of every
expert that received a token, un-permutation) over ``tokens`` tokens costs::

    latency_s + per_expert_s · woken + woken · expert weight bytes / bandwidth
              + 2 · tokens · top_k · 3 · hidden · width / flops

with ``woken = experts · (1 − (1 − top_k / experts) ** tokens)`` experts, the number uniform
random routing wakes on average, and ``width`` the expert width on one GPU (tensor parallelism
splits every expert). The four constants are fitted per GPU, engine and weight dtype on measured
fused-MoE kernel tables timed under skewed (power-law) routing, as real traffic routes
(``calibration/moe_fit.py``); the roofline prior reads the woken experts' weights at the GPU's
bandwidth.
Router GEMM and shared experts are priced as the dense GEMMs they are, by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeKernelFit:
    """Constants of one fused MoE kernel (see the module docstring). Seconds, bytes/s, FLOP/s."""

    latency_s: float
    per_expert_s: float
    bandwidth: float
    flops: float

    def to_json(self) -> dict:
        return {
            "latency_s": self.latency_s,
            "per_expert_s": self.per_expert_s,
            "bandwidth_bytes_per_s": self.bandwidth,
            "flops": self.flops,
        }

    @classmethod
    def from_json(cls, d: dict) -> MoeKernelFit:
        return cls(
            float(d["latency_s"]), float(d["per_expert_s"]), float(d["bandwidth_bytes_per_s"]), float(d["flops"])
        )


def moe_shape_key(hidden: int, width: int, top_k: int, experts: int, tensor_parallel: int) -> str:
    """Key of a measured MoE layer shape in a profile's ``moe.<backend>.<dtype>.shapes`` (``width``:
    one expert's whole intermediate size; ``tensor_parallel``: the GPUs it is split over)."""
    return f"{hidden}/{width}/{top_k}of{experts}/tp{tensor_parallel}"


def experts_woken(tokens: float, experts: int, top_k: int) -> float:
    """Experts that receive at least one of ``tokens`` tokens routed to ``top_k`` each: the mean under
    uniform random routing. At 8–16 tokens of a 128-expert, top-8 model this is 0.6–0.8 of
    ``tokens · top_k``, as the published power-law-routed tables time it against balanced routing."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def moe_layer_s(
    fit: MoeKernelFit, tokens: float, experts: int, top_k: int, hidden: int, width: float, weight_bytes: float
) -> float:
    """Seconds of one fused MoE layer over ``tokens`` tokens; ``width`` is one expert's intermediate size
    on one GPU, ``weight_bytes`` bytes per weight element. 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    woken = experts_woken(tokens, experts, top_k)
    nbytes = woken * 3.0 * hidden * width * weight_bytes
    flop = 2.0 * tokens * top_k * 3.0 * hidden * width
    return fit.latency_s + fit.per_expert_s * woken + nbytes / fit.bandwidth + flop / fit.flops
