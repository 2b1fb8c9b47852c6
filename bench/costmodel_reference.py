"""The plain evaluation of a profile's curves that the fast ProfileCostModel is held to.

``sim/cost/profile_model.py`` prices through scalar curve lookups, per-argument caches and
``Grid2D.at_many``. :class:`ReferenceProfileCostModel` prices the same batches the plain way
(numpy on 1-element arrays, no per-argument caches): the curve lookups as functions of a curve's
data, the cost-model methods as a subclass that only swaps the evaluation. The fast model must
equal it within 1e-12 relative (``tests/test_profile_speed_equivalence.py``), and ``python -m bench
costmodel`` times it beside the fast model. A curve of a shape outside the measured ones
(``meta["outside_measured"]``) counts every query as out of range, here as in the fast model.

Change it only together with a pricing rule of ``ProfileCostModel``: it defines what the fast
paths must compute.
"""

from __future__ import annotations

import math

import numpy as np

from sim.cost.profile import Curve1D, Grid2D
from sim.cost.profile_model import ACT_BYTES, ProfileCostModel


def reference_curve(c: Curve1D, x):
    """The curve's times at the sizes ``x`` and how many of them lie outside its measured range."""
    x = np.maximum(np.asarray(x, dtype=np.float64), 1e-12)
    t = np.exp(np.interp(np.log(x), np.log(c.x), np.log(c.t_s)))
    above = x > c.x[-1] * (1 + 1e-9)
    below = x < c.x[0] * (1 - 1e-9)
    if above.any():
        t = np.where(above, c.t_s[-1] * x / c.x[-1], t)
    if "outside_measured" in c.meta:
        return t, int(x.size)
    return t, int(above.sum() + below.sum())


def _reference_row(g: Grid2D, batch):
    lb, lt = np.log(g.batch), np.log(g.t_s)
    b = max(float(batch), 1e-12)
    scale, oor = 1.0, int("outside_measured" in g.meta)
    if b > g.batch[-1]:
        scale, oor, b = b / g.batch[-1], 1, g.batch[-1]
    elif b < g.batch[0]:
        oor, b = 1, g.batch[0]
    lb1 = math.log(b)
    i = int(np.clip(np.searchsorted(lb, lb1) - 1, 0, len(lb) - 2))
    w = (lb1 - lb[i]) / (lb[i + 1] - lb[i])
    row = (1 - w) * lt[i] + w * lt[i + 1]
    return row, scale, oor


def reference_grid(g: Grid2D, batch, length):
    """The grid's times at ``batch`` and the lengths ``length``, and how many lookups lie outside it."""
    row, scale, oor_b = _reference_row(g, batch)
    length = np.maximum(np.asarray(length, dtype=np.float64), 1e-12)
    t = np.exp(np.interp(np.log(length), np.log(g.length), row))
    above = length > g.length[-1] * (1 + 1e-9)
    below = length < g.length[0] * (1 - 1e-9)
    if above.any():
        t = np.where(above, math.exp(row[-1]) * length / g.length[-1], t)
    oor = int(above.sum() + below.sum())
    if oor_b:
        oor = int(length.size)
    return t * scale, oor


class ReferenceProfileCostModel(ProfileCostModel):
    """ProfileCostModel with the plain evaluation: the same profile, model and layout, only the
    curve lookups swapped, so any difference in a price is the fast evaluation's."""

    def _gemms_s(self, tokens):
        total = 0.0
        for proj in ("qkv", "o", "gate_up", "down"):
            t, oor = reference_curve(self._gemm[proj], np.array([tokens]))
            self._count(f"gemm_{proj}", oor)
            total += float(t[0])
        return total

    def _allreduce_s(self, tokens):
        if self._allreduce is None:
            return 0.0
        t, oor = reference_curve(self._allreduce, np.array([tokens * self.model.hidden * ACT_BYTES]))
        self._count("allreduce", oor)
        return 2.0 * self.model.layers * float(t[0])

    def _cpu_s(self, seqs):
        lo, hi = self._cpu["batch_range"]
        self._count("cpu_overhead", int(seqs < lo or seqs > hi))
        return float(self._cpu["intercept_s"]) + float(self._cpu["per_seq_s"]) * seqs

    def _lm_head_s(self, seqs):
        t, oor = reference_curve(self._gemm["lm_head"], np.array([seqs]))
        self._count("gemm_lm_head", oor)
        return float(t[0])

    def _non_attention_s(self, tokens, seqs):
        per_layer = self._gemms_s(tokens) + self._ew_fixed + self._ew_per_token * tokens
        return self.model.layers * per_layer + self._allreduce_s(tokens) + self._lm_head_s(seqs) + self._cpu_s(seqs)

    def decode_times_s(self, num_seqs, kv_tokens):
        kv = np.asarray(kv_tokens, dtype=np.float64)
        n = int(num_seqs)
        if n <= 0:
            return np.zeros(kv.shape)
        base = self._base_cache.get(n)
        if base is None:
            base = self._non_attention_s(n, n)
            if len(self._base_cache) < 65536:
                self._base_cache[n] = base
        attn, oor = reference_grid(self._gen, n, kv / n)
        self._count("generation_attention", oor)
        return base + self.model.layers * self._attn_factor * attn

    def step_time_s(self, batch):
        if not batch.prefill_chunks:
            return float(
                self.decode_times_s(batch.decode_seqs, np.array([batch.decode_kv_tokens], dtype=np.float64))[0]
            )
        return self.mixed_step_time_s(batch)

    def mixed_step_time_s(self, batch):
        chunks = batch.prefill_chunks
        tokens = batch.num_tokens
        seqs = batch.decode_seqs + len(chunks)
        if tokens <= 0:
            return 0.0
        attn = 0.0
        if batch.decode_seqs > 0:
            t, oor = reference_grid(
                self._gen, batch.decode_seqs, np.array([batch.decode_kv_tokens / batch.decode_seqs])
            )
            self._count("generation_attention", oor)
            attn += self._attn_factor * float(t[0])
        if chunks:
            new = np.array([c for c, _ in chunks], dtype=np.float64)
            ctx = np.array([x for _, x in chunks], dtype=np.float64)
            l_eq = np.sqrt(np.mean(new * new + 2.0 * new * ctx))
            t, oor = reference_grid(self._ctx, len(chunks), np.array([max(l_eq, 1.0)]))
            self._count("context_attention", oor)
            g, oor2 = reference_grid(self._gen, len(chunks), np.array([float(np.mean(new + ctx))]))
            self._count("generation_attention", oor2)
            attn += max(float(t[0]), self._attn_factor * float(g[0]))
        return self._non_attention_s(tokens, seqs) + self.model.layers * attn

    def _memory_s(self, op, nbytes, latency_s, traffic_bytes, bandwidth):
        if nbytes <= 0:
            return 0.0
        if op not in self._mem_curves:
            return latency_s + traffic_bytes / bandwidth
        t, oor = reference_curve(self._mem_curves[op], np.array([float(nbytes)]))
        self._count(f"memory_{op}", oor)
        return float(t[0])
