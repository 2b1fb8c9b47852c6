"""The reference engine's model: a random-weight decoder-only transformer of a catalog shape, its GEMMs
the shapes ``kvsim calibrate`` times."""

from __future__ import annotations

from sim.catalog import ModelSpec
from sim.errors import ConfigError

from .config import DTYPES, load_torch


class Transformer:
    """Random weights of ``model``'s shape; :meth:`forward` runs one batch through the KV cache."""

    def __init__(
        self, model: ModelSpec, dtype: str = "fp32", device: str = "cpu", seed: int = 0, rope_base: float = 10000.0
    ):
        if model.moe is not None:
            raise ConfigError(
                "model",
                model.name,
                "a dense model: the torch reference engine runs dense MLPs only (mixture-of-experts models "
                "are priced from the GPU profiles' fused-MoE kernel fits)",
            )
        torch = self.torch = load_torch()
        self.m = model
        self.dtype = getattr(torch, DTYPES[dtype])
        self.device = torch.device(device)
        # Drawn where they live: an 8B shape's 8e9 numbers take a minute on a CPU generator and a
        # fraction of a second on the GPU's (so the weights a seed gives depend on the engine's device).
        g = torch.Generator(device=self.device).manual_seed(seed)
        H, KVH, d, hid, inter = model.heads, model.kv_heads, model.head_dim, model.hidden, model.intermediate

        def randn(*shape):
            return torch.randn(*shape, generator=g, device=self.device)

        def w(*shape, std=0.02):
            return (randn(*shape) * std).to(self.dtype)

        def norm():
            return (1.0 + 0.1 * randn(hid)).to(self.dtype)

        self.embed = w(model.vocab, hid, std=1.0)
        self.layers = []
        for _ in range(model.layers):
            self.layers.append(
                {
                    "norm1": norm(),
                    "wqkv": w((H + 2 * KVH) * d, hid, std=hid**-0.5),
                    "wo": w(hid, H * d, std=(H * d) ** -0.5),
                    "norm2": norm(),
                    "wgu": w(2 * inter, hid, std=hid**-0.5),
                    "wdown": w(hid, inter, std=inter**-0.5),
                }
            )
        self.norm_f = norm()
        self.lm_head = w(model.vocab, hid, std=hid**-0.5)
        inv = 1.0 / (rope_base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = torch.arange(model.max_position, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).to(self.device, self.dtype)  # [pos, d]
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).to(self.device, self.dtype)
        self.scale = d**-0.5

    def rms(self, x, w, eps: float = 1e-6):
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(self, x, cos, sin):
        """x [T, heads, d]; cos/sin [T, 1, d]."""
        h = x.shape[-1] // 2
        rot = self.torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def forward(self, ids, pos, attend, write, sample_rows):
        """One batch. ``ids``/``pos`` [T]; ``write(layer, k, v)`` stores the new K/V;
        ``attend(layer, q) -> [T, H, d]`` attends (``q`` [T, H, d]); logits of ``sample_rows``."""
        torch = self.torch
        F = torch.nn.functional
        m = self.m
        H, KVH, d = m.heads, m.kv_heads, m.head_dim
        T = ids.shape[0]
        x = self.embed[ids]
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        for li, L in enumerate(self.layers):
            h = self.rms(x, L["norm1"])
            qkv = F.linear(h, L["wqkv"])
            q = qkv[:, : H * d].view(T, H, d)
            k = qkv[:, H * d : (H + KVH) * d].view(T, KVH, d)
            v = qkv[:, (H + KVH) * d :].view(T, KVH, d)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            write(li, k, v)
            o = attend(li, q)
            x = x + F.linear(o.reshape(T, H * d), L["wo"])
            h = self.rms(x, L["norm2"])
            gu = F.linear(h, L["wgu"])
            g, u = gu.chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, L["wdown"])
        h = self.rms(x[sample_rows], self.norm_f)
        return F.linear(h, self.lm_head)

    def reference_logits(self, tokens: list[int]):
        """No-cache forward of the whole sequence (causal SDPA); last-token logits [vocab]."""
        torch = self.torch
        F = torch.nn.functional
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(len(tokens), device=self.device)
        store = {}

        def write(li, k, v):
            store[li] = (k, v)

        def attend(li, q):
            k, v = store[li]
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0),
                is_causal=True,
                enable_gqa=True,
                scale=self.scale,
            )
            return o[0].transpose(0, 1)

        with torch.inference_mode():
            return self.forward(ids, pos, attend, write, torch.tensor([len(tokens) - 1], device=self.device))[0]
