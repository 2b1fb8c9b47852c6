"""A small but real continuous-batching inference engine in torch: the reference for ``kvsim validate``.

* **Model**: a random-weight decoder-only transformer of a catalog shape (``ModelSpec``):
  token embedding, per layer RMSNorm → fused QKV GEMM → rotary position embedding (RoPE,
  rotate-half) → grouped-query attention → O GEMM → residual → RMSNorm → fused gate+up GEMM
  → SiLU·up → down GEMM → residual; final RMSNorm and LM head; greedy (argmax) sampling for
  exactly each request's output length (no EOS). GEMM shapes are the ones route 1 of
  ``kvsim calibrate`` times (QKV ``(h+2·kv_h)·d × hidden``, gate+up ``2·intermediate × hidden``).
* **KV cache**, two families, both preallocated once:

  - ``paged``: per layer a K and a V tensor ``[num_blocks, block_size, kv_heads, head_dim]``,
    a free-block list and a block table per request. New K/V are scattered into their
    slots (``block_table[p // B] · B + p % B``); attention over them is the configured backend's
    (``EngineConfig.kernels``, :mod:`calibration.attention_backends`: the kernels route 1 times),
    planned once per iteration for the decode rows and once for the prefill chunks. The default on
    CPU, ``sdpa``, gathers the decoding sequences' own blocks with one ``index_select`` and runs one
    SDPA per sequence over its slice (:func:`decode_plan`; on CUDA one SDPA over the batch padded
    to its longest, with a length mask); a prefill chunk gathers its own blocks.
  - ``static``: per layer one contiguous K and V tensor ``[capacity, kv_heads, head_dim]``;
    each admitted request reserves ``reserve`` contiguous slots, first fit. Attention reads
    the reservation as a view (no gather), one SDPA per sequence.

* **Scheduler**: the simulator's ``continuous`` scheduler rule for rule (``sim/sched/continuous.py``):
  running requests first in admission order, each asking for its remaining tokens capped by
  the token budget (chunked prefill); a failed grow preempts the most recently admitted
  running request by recompute (its memory freed, back to the head of the queue) until the
  grow succeeds or the request itself was the victim; then, only if nothing was preempted,
  FCFS admission while ``max_num_seqs``, the budget and memory allow, the first refusal
  stopping admission. A sequence that has computed ``c`` tokens and computes ``n`` more holds
  slots for ``c + n``; a request's last sampled token is never computed.
* **Replay**: :meth:`Engine.run` replays a trace in wall-clock time: a feeder thread puts
  each request in a queue at its arrival time, the engine loop drains the queue at
  iteration boundaries. ``clock="virtual"`` instead advances a virtual clock by a cost
  model's step time (arrivals seen when the virtual clock passes them): the schedule is then
  timing-independent and must equal the simulator's exactly. ``clock="cpu"`` advances the
  engine's clock by each iteration's thread CPU time; ``clock="cpu_norm"`` by that times a
  host-speed factor from a fixed reference iteration (:class:`SpeedProbe`) run every 50 ms of
  engine CPU time: the engine as on a host running at the probe's reference speed.

Records per request (arrival, enqueue, admission, first token, finish, preemptions) and per
iteration (start/end, thread CPU time, prefill chunks ``(new, context)``, decode sequences
and their KV tokens, blocks in use, block allocations, preemptions).

float32 on CPU by default, ``torch.inference_mode()``, ``torch.set_num_threads(threads)``
(default 1, the thread count route 1 calibrates with).
"""

from __future__ import annotations

import bisect
import queue
import random
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sim.catalog import ModelSpec
from sim.errors import ConfigError

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
#: Engine.run clocks; ``cpu_norm`` is ``cpu`` normalised by a host-speed probe (:class:`SpeedProbe`).
CLOCKS = ("wall", "cpu", "cpu_norm", "virtual")
#: cpu_norm: probe every this many seconds of engine thread CPU time, scale by the median of the last
#: PROBE_WINDOW probes (chosen by measurement, docs/validation.md: 25-50 ms track the host's speed
#: changes, which last ~0.5 s and more; the probe's 2 x ~8 ms then cost ~30 % extra run time, not charged).
PROBE_EVERY_S = 0.05
PROBE_WINDOW = 3
ALLOCATORS = ("paged", "static")
NO_SPACE, OVERFLOW, OK = "no_space", "overflow", "ok"


def _torch():
    from .kernels import import_torch

    return import_torch()


@dataclass
class EngineConfig:
    model: ModelSpec
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    allocator: str = "paged"
    #: static: slots reserved per request (``None``: ``max_model_len``).
    reserve: int | None = None
    max_model_len: int = 1024
    chunked_prefill: bool = True
    dtype: str = "fp32"
    threads: int = 1
    seed: int = 0
    device: str = "cpu"
    #: attention backend of the paged layout (:data:`calibration.attention_backends.KERNELS`; ``auto``: CPU
    #: sdpa, CUDA the first installed of flashinfer, vllm, flex). The static layout runs SDPA on every one.
    kernels: str = "auto"

    def __post_init__(self):
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator {self.allocator!r}: one of {ALLOCATORS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: one of {tuple(DTYPES)}")
        if self.allocator == "static" and self.reserve is None:
            self.reserve = self.max_model_len

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


# --- the model ------------------------------------------------------------------------------


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
        torch = self.torch = _torch()
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


# --- attention over the two cache layouts (module functions: tests call them directly) -------


@dataclass(frozen=True)
class DecodePlan:
    """How :func:`paged_decode_attention` reads a CPU decode batch: every decoding sequence's own
    blocks, concatenated in table order (``blocks``, int64 on the device), and each sequence's first
    token in that gathered run and its KV length (``spans``). Built once per iteration (the engine)
    or per timed setup (route 1) and reused by every layer."""

    blocks: object
    spans: tuple[tuple[int, int], ...]


def decode_plan(tables: list[list[int]], seq_lens: list[int], block_size: int, device="cpu") -> DecodePlan | None:
    """The CPU decode batch's :class:`DecodePlan`, or ``None`` (CUDA, or no sequence): one SDPA call
    over the batch padded to its longest.

    Why per sequence on CPU: one gather + SDPA pads every sequence to the batch's longest, and
    length-sorted groups (the previous CPU kernel) still pad each group to its own longest, so
    the kernel's time followed the spread of lengths, not the total KV the cost model prices it by.
    ``python -m bench decode-spread`` on the 2-vCPU AMD EPYC host (one thread): lengths drawn from
    20-385 against the same count and total at one length cost 1.45x in one padded call, 1.21x in
    groups of 8 and 1.05x per sequence (16 sequences; 8 sequences: 1.56x, 1.53x, 1.01x;
    docs/validation.md, "The paged decode kernel"). Per sequence costs 34-60 % more at one length there.
    A paged kernel reads each sequence's own blocks, and so does this one: one ``index_select`` of
    all the batch's blocks (padding only inside each sequence's last block), then one SDPA per
    sequence over its slice. CUDA keeps the one padded call: a launch per sequence would cost more
    than the padding.
    """
    if str(device).startswith("cuda") or not seq_lens:
        return None
    import torch

    spans, at = [], 0
    for t, L in zip(tables, seq_lens):
        if not 0 < L <= len(t) * block_size:
            raise ValueError(f"seq_lens: {L} KV tokens do not fit a table of {len(t)} blocks of {block_size}")
        spans.append((at, int(L)))
        at += len(t) * block_size
    blocks = torch.tensor([b for t in tables for b in t], dtype=torch.long, device=device)
    return DecodePlan(blocks, tuple(spans))


def padded_block_tables(tables: list[list[int]], device="cpu"):
    """``[len(tables), longest]`` int64 block tables, each padded with block 0 past its own blocks (the
    length mask keeps the padding out): the input of the one padded :func:`paged_decode_attention` call."""
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


def paged_decode_attention(q, k_pool, v_pool, block_tables, seq_lens, scale=None, plan: DecodePlan | None = None):
    """One query token per sequence over a paged cache.

    q [D, H, d]; pools [num_blocks, B, KVH, d]; block_tables [D, max_blocks] (int64, padded);
    seq_lens [D] (KV tokens incl. the new one). Returns [D, H, d]. ``plan``: from
    :func:`decode_plan` (the CPU kernel: one gather of the sequences' own blocks, one SDPA per
    sequence over its slice; ``block_tables`` and ``seq_lens`` unused); ``None``: one call over the
    whole batch padded to its longest (CUDA).
    """
    import torch

    F = torch.nn.functional
    if plan is not None:
        KVH, d = k_pool.shape[2:]
        k = k_pool.index_select(0, plan.blocks).view(-1, KVH, d)
        v = v_pool.index_select(0, plan.blocks).view(-1, KVH, d)
        out = torch.empty_like(q)
        for i, (s, L) in enumerate(plan.spans):
            # one query over all L keys: no mask needed
            out[i] = F.scaled_dot_product_attention(
                q[i : i + 1].transpose(0, 1).unsqueeze(0),
                k[s : s + L].transpose(0, 1).unsqueeze(0),
                v[s : s + L].transpose(0, 1).unsqueeze(0),
                enable_gqa=True,
                scale=scale,
            )[0, :, 0]
        return out
    D, nblk = block_tables.shape
    B, KVH, d = k_pool.shape[1:]
    Lmax = nblk * B
    flat = block_tables.reshape(-1)
    # index_select on dim 0 gathers whole blocks (about 3x faster than pool[table] on CPU)
    k = k_pool.index_select(0, flat).view(D, Lmax, KVH, d).transpose(1, 2)
    v = v_pool.index_select(0, flat).view(D, Lmax, KVH, d).transpose(1, 2)
    mask = (torch.arange(Lmax, device=q.device)[None, :] < seq_lens[:, None]).view(D, 1, 1, Lmax)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True, scale=scale)
    return o.squeeze(2)


def chunk_attention(q, k, v, ctx: int, scale=None):
    """``n`` new tokens after ``ctx`` cached ones: q [n, H, d]; k, v [ctx + n, KVH, d] (views). Returns [n, H, d]."""
    import torch

    n = q.shape[0]
    qq, kk, vv = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    F = torch.nn.functional
    if ctx == 0:
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True, scale=scale)
    else:
        L = ctx + n
        mask = torch.arange(L, device=q.device)[None, :] <= (ctx + torch.arange(n, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True, scale=scale)
    return o[0].transpose(0, 1)


def contiguous_attention(q, k_list, v_list, scale=None):
    """Reference: one query token per sequence over its own contiguous K/V ([L_i, KVH, d]); [D, H, d]."""
    import torch

    outs = [
        chunk_attention(q[i : i + 1], k_list[i], v_list[i], k_list[i].shape[0] - 1, scale) for i in range(q.shape[0])
    ]
    return torch.cat(outs, 0)


# --- KV memory managers -----------------------------------------------------------------------


class BlockPool:
    """Free-block list + block tables (``paged``)."""

    paged = True

    def __init__(self, num_blocks: int, block_size: int):
        self.B = block_size
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.tables: dict[int, list[int]] = {}
        self.events = 0

    def _take(self, table: list[int], tokens: int) -> str:
        need = -(-tokens // self.B) - len(table)
        if need > len(self.free):
            return NO_SPACE
        for _ in range(need):
            table.append(self.free.pop())
        self.events += max(need, 0)
        return OK

    def admit(self, rid: int, tokens: int) -> str:
        table: list[int] = []
        r = self._take(table, tokens)
        if r == OK:
            self.tables[rid] = table
        return r

    def grow(self, rid: int, tokens: int) -> str:
        return self._take(self.tables[rid], tokens)

    def release(self, rid: int) -> None:
        self.free.extend(reversed(self.tables.pop(rid)))

    def slot(self, rid: int, p: int) -> int:
        return self.tables[rid][p // self.B] * self.B + p % self.B

    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free)

    def reserved_tokens(self) -> int:
        return self.blocks_in_use() * self.B


class StaticArena:
    """``reserve`` contiguous slots per request in one arena, first fit (``static``)."""

    paged = False

    def __init__(self, capacity: int, reserve: int, block_size: int):
        if not 0 < reserve <= capacity:
            raise ValueError(f"reserve {reserve} must be in (0, {capacity}]")
        self.cap, self.R, self.B = capacity, reserve, block_size
        self.starts, self.sizes = [0], [capacity]  # free extents, sorted by start
        self.owner: dict[int, int] = {}
        self.events = 0

    def admit(self, rid: int, tokens: int) -> str:
        if tokens > self.R:
            return OVERFLOW
        for i, s in enumerate(self.sizes):
            if s >= self.R:
                start = self.starts[i]
                if s == self.R:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += self.R
                    self.sizes[i] -= self.R
                self.owner[rid] = start
                self.events += 1
                return OK
        return NO_SPACE

    def grow(self, rid: int, tokens: int) -> str:
        return OVERFLOW if tokens > self.R else OK

    def release(self, rid: int) -> None:
        start, size = self.owner.pop(rid), self.R
        i = bisect.bisect_left(self.starts, start)
        left = i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start
        right = i < len(self.starts) and self.starts[i] == start + size
        if left and right:
            self.sizes[i - 1] += size + self.sizes[i]
            del self.starts[i], self.sizes[i]
        elif left:
            self.sizes[i - 1] += size
        elif right:
            self.starts[i] = start
            self.sizes[i] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)

    def slot(self, rid: int, p: int) -> int:
        return self.owner[rid] + p

    def reserved_tokens(self) -> int:
        return len(self.owner) * self.R

    def blocks_in_use(self) -> float:
        """Reserved slots in block units (what a paged pool of the same memory would count)."""
        return self.reserved_tokens() / self.B


# --- requests and records -----------------------------------------------------------------------


class EngineRequest:
    __slots__ = (
        "id",
        "prompt",
        "output",
        "arrival",
        "tokens",
        "computed",
        "generated",
        "admitted",
        "first_token",
        "finish",
        "preemptions",
        "enqueued",
        "status",
        "seq_no",
    )

    def __init__(self, rid: int, arrival: float, prompt_ids: list[int], output: int):
        self.id, self.arrival, self.output = rid, float(arrival), int(output)
        self.prompt = len(prompt_ids)
        self.tokens = list(prompt_ids)
        self.computed = self.generated = self.preemptions = 0
        self.admitted = self.first_token = self.finish = self.enqueued = -1.0
        self.status = ""
        self.seq_no = -1


@dataclass
class EngineResult:
    requests: list[dict]
    iterations: list[dict]
    config: dict
    info: dict = field(default_factory=dict)

    def peak_blocks(self) -> float:
        return max((it["blocks_in_use"] for it in self.iterations), default=0)

    def preemptions(self) -> int:
        return sum(it["preempted"] for it in self.iterations)


# --- host-speed probe ---------------------------------------------------------------------------

#: The probe's fixed batch: decode sequences (KV tokens each, incl. the new one) and prefill chunks
#: ``(new tokens, context)``: one mixed iteration of the kind a replay runs (see docs/validation.md).
PROBE_DECODE_KV = (64, 96, 128, 160, 192, 224, 256, 288)
PROBE_CHUNKS = ((32, 64),)
#: The prefill probe's fixed batch (``cpu_norm`` with ``prefill_probe``): one 128-token chunk, no decode.
#: Why a second probe: on this 2-vCPU host the speed switches between two levels, and a prefill's
#: GEMM-bound work changes less between them than the decode-heavy probe does (150 s, one process,
#: 1058 rounds: slow ÷ fast level 1.50 for the probe, 1.53 one-sequence decode, 1.48 eight-sequence
#: decode, 1.40 a 256-token prefill and a 128-token chunk over 256 context), so one probe's factor
#: puts a prefill measured in the fast level 7 % above the same prefill measured in the slow one.
#: ``python -m bench host-modes`` measures this on any host.
PREFILL_PROBE_DECODE_KV: tuple[int, ...] = ()
PREFILL_PROBE_CHUNKS = ((128, 0),)


def prefill_weight(prefill_tokens: int, probe_tokens: int, prefill_probe_tokens: int) -> float:
    """How much of an iteration's speed factor comes from the prefill probe (0 to 1): linear in the
    iteration's prefill tokens between the two probes' own (the mixed probe's chunk: 0, the prefill
    probe's: 1), 0 for a pure decode iteration."""
    if prefill_tokens <= probe_tokens:
        return 0.0
    span = prefill_probe_tokens - probe_tokens
    return 1.0 if span <= 0 else min(1.0, (prefill_tokens - probe_tokens) / span)


class SpeedProbe:
    """A fixed reference iteration through the engine's own code: host speed, measured.

    A separate small :class:`Engine` (same model object, same cache layout, its own KV memory)
    holds a fixed state: ``decode_kv`` sequences at one decode step each and ``chunks`` prefill
    chunks ``(new, context)``. :meth:`measure` runs that one mixed iteration (``Engine.execute``:
    metadata tensors, every layer's GEMMs, attention over the layout, cache writes, norms, RoPE,
    sampling) and returns its thread CPU time. The state is never advanced (the same slots are
    rewritten), so every call does the same work: the only thing that varies is the host's speed
    for this thread (other processes' SMT / cache / memory-bandwidth pressure shows in thread CPU
    time too) and timer noise.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        net: Transformer,
        decode_kv=PROBE_DECODE_KV,
        chunks=PROBE_CHUNKS,
        seed: int = 1234,
        warmup: int = 3,
    ):
        longest = max([kv for kv in decode_kv] + [n + c for n, c in chunks] + [1])
        B = cfg.block_size
        per = -(-longest // B) * B
        n = len(decode_kv) + len(chunks)
        self.cfg = EngineConfig(
            cfg.model,
            num_blocks=n * per // B + 1,
            block_size=B,
            max_num_seqs=max(n, 1),
            max_num_batched_tokens=max(cfg.max_num_batched_tokens, len(decode_kv) + sum(c[0] for c in chunks)),
            allocator=cfg.allocator,
            reserve=per,
            max_model_len=per,
            dtype=cfg.dtype,
            threads=cfg.threads,
            seed=seed,
            device=cfg.device,
            kernels=cfg.kernels,
        )
        self.engine = Engine(self.cfg, model=net)
        rng = random.Random(seed)
        vocab = cfg.model.vocab
        self.items = []
        mem = self.engine.mem
        for i, kv in enumerate(decode_kv):
            r = EngineRequest(i, 0.0, [rng.randrange(vocab) for _ in range(kv)], 2)
            r.computed, r.generated = kv - 1, 1
            assert mem.admit(r.id, kv) == OK
            self.items.append((r, 1))
        for j, (new, ctx) in enumerate(chunks):
            r = EngineRequest(len(decode_kv) + j, 0.0, [rng.randrange(vocab) for _ in range(ctx + new + 1)], 2)
            r.computed = ctx
            assert mem.admit(r.id, ctx + new) == OK
            self.items.append((r, new))
        self.shape = {
            "decode_kv": list(decode_kv),
            "prefill_chunks": [list(c) for c in chunks],
            "allocator": cfg.allocator,
        }
        #: prefill tokens of the fixed iteration (for :func:`prefill_weight`)
        self.prefill_tokens = sum(n for n, _ in chunks)
        for _ in range(warmup):
            self.measure()

    def measure(self, warm: bool = True) -> float:
        """Thread CPU seconds of one run of the fixed iteration; ``warm``: right after an untimed run of
        it (measured: a single run after a large engine iteration is ~8-10 % slower than after itself,
        which would read the engine's own recent work as host slowness)."""
        torch = self.engine.torch
        with torch.inference_mode():
            if warm:
                self.engine.execute(self.items)
            c0 = time.thread_time()
            self.engine.execute(self.items)
            return time.thread_time() - c0

    def series(self, n: int) -> list[float]:
        return [self.measure() for _ in range(n)]


# --- the engine ----------------------------------------------------------------------------------


class Engine:
    def __init__(self, cfg: EngineConfig, model: Transformer | None = None, attention=None):
        """``attention``: an :class:`~calibration.attention_backends.AttentionBackend` to use instead of
        the one ``cfg.kernels`` names (tests: eager flex, a stand-in)."""
        torch = self.torch = _torch()
        self.cfg = cfg
        if cfg.device == "cpu":
            torch.set_num_threads(int(cfg.threads))
        self.net = model or Transformer(cfg.model, cfg.dtype, cfg.device, cfg.seed)
        m = cfg.model
        KVH, d = m.kv_heads, m.head_dim
        dt, dev = self.net.dtype, self.net.device
        from sim.errors import ConfigError

        from .attention_backends import make

        #: the paged layout's attention kernels (what ``kvsim calibrate --kernels`` times)
        self.attention = attention or make(cfg.kernels, torch, dev, key="engine.kernels")
        shape: tuple[int, ...]
        if cfg.allocator == "paged":  # blocks past num_blocks (flex rounds the pool up) are never handed out
            shape = (self.attention.pool_blocks(cfg.num_blocks), cfg.block_size, KVH, d)
        else:
            shape = (cfg.capacity_tokens, KVH, d)
        self.k_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(m.layers)]
        self.v_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(m.layers)]
        self._warm = False
        if cfg.allocator == "paged":
            why = self.attention.block_size_problem(cfg.block_size) or self.attention.dtype_problem(dt)
            if why:
                raise ConfigError(
                    "engine.kernels",
                    self.attention.name,
                    f"a backend that runs block {cfg.block_size} in {cfg.dtype} ({why})",
                )
        self.reset()

    def warm_up(self) -> int:
        """Run the paged layout's attention once on every batch shape this engine can form (a compiled
        backend compiles them now, not inside a timed iteration); once per engine. Returns the shapes run."""
        if self._warm or self.cfg.allocator != "paged" or not self.cfg.model.layers:
            return 0
        self._warm = True
        m, cfg = self.cfg.model, self.cfg
        with self.torch.inference_mode():
            return self.attention.warm_up(
                self.k_cache[0],
                self.v_cache[0],
                heads=m.heads,
                kv_heads=m.kv_heads,
                head_dim=m.head_dim,
                max_seqs=cfg.max_num_seqs,
                max_tokens=cfg.max_num_batched_tokens,
                dtype=self.net.dtype,
            )

    def reset(self) -> None:
        cfg = self.cfg
        self.mem: BlockPool | StaticArena
        if cfg.allocator == "paged":
            self.mem = BlockPool(cfg.num_blocks, cfg.block_size)
        else:
            assert cfg.reserve is not None  # EngineConfig sets it for static
            self.mem = StaticArena(cfg.capacity_tokens, int(cfg.reserve), cfg.block_size)
        self.running: list[EngineRequest] = []
        self.waiting: deque[EngineRequest] = deque()
        self._admissions = 0

    # -- scheduling: sim/sched/continuous.py, rule for rule --
    def _preempt_last(self) -> EngineRequest:
        victim = self.running.pop()
        self.mem.release(victim.id)
        victim.computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self):
        cfg, mem, running = self.cfg, self.mem, self.running
        budget = cfg.max_num_batched_tokens
        items: list[tuple[EngineRequest, int]] = []
        ended: list[EngineRequest] = []
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            need = len(req.tokens) - req.computed
            if need > budget:
                if not cfg.chunked_prefill:
                    i += 1
                    continue
                need = budget
            r = mem.grow(req.id, req.computed + need)
            while r == NO_SPACE:
                victim = self._preempt_last()
                preempted += 1
                if victim is req:
                    break
                r = mem.grow(req.id, req.computed + need)
            if r == NO_SPACE:
                break
            if r == OVERFLOW:
                running.pop(i)
                mem.release(req.id)
                req.status = "rejected"
                ended.append(req)
                continue
            items.append((req, need))
            budget -= need
            i += 1
        admitted = []
        if preempted == 0:
            waiting = self.waiting
            while waiting and len(running) < cfg.max_num_seqs and budget > 0:
                req = waiting[0]
                need = len(req.tokens)
                if need > budget:
                    if not cfg.chunked_prefill:
                        break
                    need = budget
                r = mem.admit(req.id, need)
                if r == NO_SPACE:
                    break
                waiting.popleft()
                if r == OVERFLOW:
                    req.status = "rejected"
                    ended.append(req)
                    continue
                running.append(req)
                req.seq_no = self._admissions
                self._admissions += 1
                admitted.append(req)
                items.append((req, need))
                budget -= need
        return items, preempted, admitted, ended

    # -- one forward over the scheduled items --
    def execute(self, items: list[tuple[EngineRequest, int]]) -> list[int]:
        """Run the model on ``items``; returns the sampled token of each item that completes its
        sequence (in item order), and -1 for chunks that do not."""
        torch = self.torch
        mem, net = self.mem, self.net
        dev = net.device
        dec = [(r, n) for r, n in items if n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0]
        dec_ids = {id(r) for r, _ in dec}
        pre = [(r, n) for r, n in items if id(r) not in dec_ids]
        ids, pos, slots = [], [], []
        for r, _ in dec:
            p = r.computed
            ids.append(r.tokens[p])
            pos.append(p)
            slots.append(mem.slot(r.id, p))
        chunk_meta = []
        for r, n in pre:
            c = r.computed
            chunk_meta.append((len(ids), n, c, r))
            ids.extend(r.tokens[c : c + n])
            pos.extend(range(c, c + n))
            slots.extend(mem.slot(r.id, p) for p in range(c, c + n))
        T = len(ids)
        D = len(dec)
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.long, device=dev)
        scale = net.scale
        m = self.cfg.model
        KVH, d, H = m.kv_heads, m.head_dim, m.heads
        paged = mem.paged
        chunk_idx: list[int] = []
        if paged:  # each batch's metadata once, for every layer (decode rows first, then the chunks' rows)
            assert isinstance(mem, BlockPool)
            from .attention_backends import PagedBatch

            att = self.attention
            shape = {
                "heads": H,
                "kv_heads": KVH,
                "head_dim": d,
                "num_blocks": self.k_cache[0].shape[0],
                "dtype": net.dtype,
            }
            dplan = (
                att.plan_paged(
                    PagedBatch.of([mem.tables[r.id] for r, _ in dec], [r.computed for r, _ in dec], [1] * D, mem.B),
                    slot="decode",
                    **shape,
                )
                if D
                else None
            )
            cplan = (
                att.plan_paged(
                    PagedBatch.of(
                        [mem.tables[r.id] for *_, r in chunk_meta],
                        [c for _, _, c, _ in chunk_meta],
                        [n for _, n, _, _ in chunk_meta],
                        mem.B,
                    ),
                    slot="prefill",
                    **shape,
                )
                if chunk_meta
                else None
            )
        else:
            assert isinstance(mem, StaticArena)
            if D:
                dec_span = [(mem.owner[r.id], r.computed + 1) for r, _ in dec]
            chunk_idx = [mem.owner[r.id] for *_, r in chunk_meta]
        kc, vc = self.k_cache, self.v_cache

        def write(li, k, v):
            if paged:
                kc[li].view(-1, KVH, d).index_copy_(0, slots_t, k)
                vc[li].view(-1, KVH, d).index_copy_(0, slots_t, v)
            else:
                kc[li].index_copy_(0, slots_t, k)
                vc[li].index_copy_(0, slots_t, v)

        def attend(li, q):
            if paged:
                if not chunk_meta:  # pure decode
                    return att.paged(dplan, q, kc[li], vc[li], scale)
                out = torch.empty(T, H, d, dtype=q.dtype, device=dev)
                if D:
                    out[:D] = att.paged(dplan, q[:D], kc[li], vc[li], scale)
                out[D:] = att.paged(cplan, q[D:], kc[li], vc[li], scale)  # the chunks' rows follow the decode rows
                return out
            if not chunk_meta:  # pure decode
                return torch.cat(
                    [
                        chunk_attention(q[i : i + 1], kc[li][s : s + L], vc[li][s : s + L], L - 1, scale)
                        for i, (s, L) in enumerate(dec_span)
                    ],
                    0,
                )
            out = torch.empty(T, H, d, dtype=q.dtype, device=dev)
            for i, (s, L) in enumerate(dec_span if D else []):
                out[i : i + 1] = chunk_attention(q[i : i + 1], kc[li][s : s + L], vc[li][s : s + L], L - 1, scale)
            for (off, n, c, _), idx in zip(chunk_meta, chunk_idx):
                L = c + n
                out[off : off + n] = chunk_attention(
                    q[off : off + n], kc[li][idx : idx + L], vc[li][idx : idx + L], c, scale
                )
            return out

        rows, owners = [], []
        for i, (r, _) in enumerate(dec):
            rows.append(i)
            owners.append(r)
        for off, n, c, r in chunk_meta:
            if c + n == len(r.tokens):
                rows.append(off + n - 1)
                owners.append(r)
        logits = net.forward(ids_t, pos_t, attend, write, torch.tensor(rows, dtype=torch.long, device=dev))
        toks = logits.argmax(-1).tolist() if rows else []
        by_req = {id(r): t for r, t in zip(owners, toks)}
        self.last_logits = logits
        return [by_req.get(id(r), -1) for r, _ in items]

    # -- the loop --
    def run(
        self,
        trace,
        *,
        clock: str = "wall",
        cost=None,
        compute: bool = True,
        lead_s: float = 0.05,
        seed: int | None = None,
        max_wall_s: float | None = None,
        probe: SpeedProbe | None = None,
        probe_ref_s: float | None = None,
        probe_every_s: float = PROBE_EVERY_S,
        probe_window: int = PROBE_WINDOW,
        prefill_probe: SpeedProbe | None = None,
        prefill_probe_ref_s: float | None = None,
    ) -> EngineResult:
        """Replay ``trace`` (rows ``(arrival_s, prompt_tokens, output_tokens)``).

        ``clock="wall"``: real time, arrivals fed by a thread at their times. ``clock="cpu"``: the
        engine's own clock, advanced by each iteration's thread CPU time (the real computation,
        timed without the time a shared host kept the thread off the CPU) and jumping to the
        next arrival when idle; arrivals are seen at iteration boundaries. ``clock="virtual"``:
        time advances by ``cost.step_time_s`` per iteration (a sim ``CostModel``, plus its
        allocation charge and its ``after_prefill_s`` as the simulator's replica adds it), arrivals
        are seen when the virtual clock passes them; ``compute=False`` then skips the forward (scheduling and memory only, sampled tokens 0).
        ``clock="cpu_norm"``: the ``cpu`` clock normalised to a reference host speed: every
        ``probe_every_s`` of engine thread CPU time (and ``probe_window`` times before the first
        iteration) ``probe`` (a :class:`SpeedProbe`) runs its fixed iteration; each iteration then
        advances the clock by its thread CPU time × ``probe_ref_s`` ÷ the median of the last
        ``probe_window`` probe times. Probe time is not charged to the clock; the probe series is
        in ``info["speed_probes"]`` and each iteration's factor in its ``speed_scale``. With
        ``prefill_probe`` (a :class:`SpeedProbe` of :data:`PREFILL_PROBE_CHUNKS`, reference
        ``prefill_probe_ref_s``) it runs right before every probe (untimed warm run and all, so the
        engine's next iteration follows the probe as without it) and an iteration's factor is
        ``f ** (1 − w) · f_prefill ** w``, ``w`` = :func:`prefill_weight` of its prefill tokens: a
        prefill is normalised by how prefills, not decodes, slowed.
        """
        torch = self.torch
        if clock not in CLOCKS:
            raise ValueError(f"clock: one of {', '.join(CLOCKS)}")
        if clock == "virtual" and cost is None:
            raise ValueError("clock='virtual' needs a cost model")
        after_s = list(getattr(cost, "after_prefill_s", [])) if clock == "virtual" else []
        after_k = [len(after_s)]  # decode iterations since the last prefill (past the list: none yet)
        norm = clock == "cpu_norm"
        if norm and (probe is None or not probe_ref_s or probe_ref_s <= 0):
            raise ValueError("clock='cpu_norm' needs a SpeedProbe and its reference time probe_ref_s > 0")
        dual = norm and prefill_probe is not None
        if dual and (not prefill_probe_ref_s or prefill_probe_ref_s <= 0):
            raise ValueError("prefill_probe needs its reference time prefill_probe_ref_s > 0")
        cpu_clock = clock in ("cpu", "cpu_norm")
        if compute:
            self.warm_up()
        self.reset()
        rng = random.Random(self.cfg.seed if seed is None else seed)
        vocab = self.cfg.model.vocab
        reqs = [
            EngineRequest(i, a, [rng.randrange(vocab) for _ in range(int(p))], int(o))
            for i, (a, p, o) in enumerate(trace)
        ]
        order = sorted(reqs, key=lambda r: (r.arrival, r.id))
        n_total = len(reqs)
        iters: list[dict] = []
        done = 0
        running, waiting = self.running, self.waiting
        q: queue.SimpleQueue = queue.SimpleQueue()
        feeder = None
        if clock == "wall":
            t0 = time.perf_counter() + lead_s

            def feed():
                for r in order:
                    while True:
                        dt = t0 + r.arrival - time.perf_counter()
                        if dt <= 0:
                            break
                        time.sleep(dt)
                    r.enqueued = time.perf_counter() - t0
                    q.put(r)

            feeder = threading.Thread(target=feed, name="kvsim-feeder", daemon=True)
            feeder.start()
            now = lambda: time.perf_counter() - t0  # noqa: E731
        else:
            vt = [0.0]
            nxt = [0]
            now = lambda: vt[0]  # noqa: E731

        def drain(block: bool) -> None:
            if clock != "wall":
                if block and nxt[0] < n_total and order[nxt[0]].arrival > vt[0]:
                    vt[0] = order[nxt[0]].arrival
                while nxt[0] < n_total and order[nxt[0]].arrival <= vt[0]:
                    r = order[nxt[0]]
                    r.enqueued = r.arrival
                    waiting.append(r)
                    nxt[0] += 1
                return
            if block:
                waiting.append(q.get())
            while True:
                try:
                    waiting.append(q.get_nowait())
                except queue.Empty:
                    return

        wall0 = time.perf_counter()
        scale = scale_pre = 1.0
        probes: list[dict] = []
        window = max(int(probe_window), 1)
        hist: deque[float] = deque(maxlen=window)
        hist_pre: deque[float] = deque(maxlen=window)
        since = [0.0]  # engine thread CPU seconds since the last probe

        def take_probe() -> tuple[float, float]:
            assert probe is not None and probe_ref_s is not None  # checked above for cpu_norm
            q = 0.0
            if dual:
                assert prefill_probe is not None and prefill_probe_ref_s is not None
                # before the probe, so the engine's next iteration still follows the probe alone (right
                # after a prefill probe a decode iteration runs ~18 % slower); the prefill probe itself
                # hardly depends on what ran before it (within 4 %: docs/validation.md)
                q = prefill_probe.measure(warm=False)
                hist_pre.append(q)
            p = probe.measure()
            hist.append(p)
            since[0] = 0.0
            f = float(probe_ref_s) / statistics.median(hist)
            row = {"engine_s": now(), "wall_s": time.perf_counter() - wall0, "probe_s": p, "scale": f}
            f_pre = f
            if dual:
                assert prefill_probe_ref_s is not None
                f_pre = float(prefill_probe_ref_s) / statistics.median(hist_pre)
                row.update(prefill_probe_s=q, prefill_scale=f_pre)
            probes.append(row)
            return f, f_pre

        # whether the next iteration follows a probe (its caches hold the probe's, not the engine's, state)
        probed = False
        if norm:
            for _ in range(window):
                scale, scale_pre = take_probe()
            probed = True
        with torch.inference_mode():
            while done < n_total:
                drain(False)
                if not running and not waiting:
                    drain(True)
                    continue
                if max_wall_s is not None and time.perf_counter() - wall0 > max_wall_s:
                    raise TimeoutError(f"engine run exceeded {max_wall_s} s")
                if norm and since[0] >= probe_every_s:
                    scale, scale_pre = take_probe()
                    probed = True
                ts = now()
                c0 = time.thread_time()
                ev0 = self.mem.events
                items, preempted, admitted, ended = self.schedule()
                for r in admitted:
                    if r.admitted < 0:
                        r.admitted = ts
                blocks = self.mem.blocks_in_use()
                reserved = self.mem.reserved_tokens()
                chunks = [
                    (n, r.computed)
                    for r, n in items
                    if not (n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0)
                ]
                dec_lens = [
                    r.computed + 1 for r, n in items if n == 1 and r.computed + 1 == len(r.tokens) and r.generated > 0
                ]  # the decoding sequences' KV lengths
                dseqs, dkv = len(dec_lens), sum(dec_lens)
                dmax = max(dec_lens, default=0)  # the longest (what the padded CUDA decode call pads to)
                events = self.mem.events - ev0
                ptoks = sum(n for n, _ in chunks)
                it_scale = scale
                if dual and scale_pre != scale:
                    assert probe is not None and prefill_probe is not None
                    w = prefill_weight(ptoks, probe.prefill_tokens, prefill_probe.prefill_tokens)
                    it_scale = scale ** (1.0 - w) * scale_pre**w
                if items:
                    if compute:
                        toks = self.execute(items)
                    else:
                        toks = [0] * len(items)
                else:
                    toks = []
                if clock == "virtual":
                    from sim.cost.model import BatchShape

                    if items:
                        vt[0] += cost.step_time_s(BatchShape(list(chunks), dseqs, dkv)) + cost.alloc_time_s(events)
                        # the cost model's after-prefill excess, counted as the simulator's replica does
                        if chunks:
                            after_k[0] = 0
                        elif dseqs and after_k[0] < len(after_s):
                            vt[0] += after_s[after_k[0]]
                            after_k[0] += 1
                te = now() if not cpu_clock else ts + (time.thread_time() - c0) * it_scale
                finished = 0
                for (r, n), tok in zip(items, toks):
                    r.computed += n
                    if r.computed == len(r.tokens):
                        r.tokens.append(int(tok))
                        r.generated += 1
                        if r.first_token < 0:
                            r.first_token = te
                        if r.generated >= r.output:
                            r.status = "completed"
                            r.finish = te
                            finished += 1
                for r in ended:
                    r.finish = te
                    finished += 1
                if finished:
                    keep = []
                    for r in running:
                        if r.status == "completed":
                            self.mem.release(r.id)
                        else:
                            keep.append(r)
                    running[:] = keep
                    done += finished
                c1 = time.thread_time()
                if cpu_clock:
                    vt[0] = ts + (c1 - c0) * it_scale
                    since[0] += c1 - c0
                te2 = now()
                if items or preempted:
                    iters.append(
                        {
                            "start_s": ts,
                            "end_s": te2,
                            "cpu_s": c1 - c0,
                            "prefill_chunks": chunks,
                            "prefill_tokens": ptoks,
                            "decode_seqs": dseqs,
                            "decode_kv_tokens": dkv,
                            "decode_kv_max": dmax,
                            "blocks_in_use": blocks,
                            "reserved_tokens": reserved,
                            "alloc_events": events,
                            "preempted": preempted,
                            "admitted": len(admitted),
                            "running": len(running),
                            "waiting": len(waiting),
                        }
                    )
                    if norm:
                        iters[-1]["speed_scale"] = it_scale
                        iters[-1]["after_probe"] = probed
                        probed = False
                    if clock == "virtual":
                        iters[-1]["end_s"] = te
        if feeder is not None:
            feeder.join(timeout=1.0)
        rows = [
            {
                "id": r.id,
                "status": r.status or "incomplete",
                "arrival_s": r.arrival,
                "enqueued_s": r.enqueued,
                "admitted_s": r.admitted,
                "first_token_s": r.first_token,
                "finish_s": r.finish,
                "prompt_tokens": r.prompt,
                "output_tokens": r.output,
                "generated_tokens": r.generated,
                "preemptions": r.preemptions,
                "output_ids": r.tokens[r.prompt :],
            }
            for r in reqs
        ]
        c = self.cfg
        conf = {
            "model": c.model.name,
            "allocator": c.allocator,
            "num_blocks": c.num_blocks,
            "block_size": c.block_size,
            "reserve": c.reserve,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "dtype": c.dtype,
            "threads": torch.get_num_threads(),
            "device": c.device,
            "clock": clock,
            "kernels": self.attention.name,
        }
        info: dict[str, Any] = {"wall_s": time.perf_counter() - wall0}
        if norm:
            assert probe is not None and probe_ref_s is not None
            conf.update(
                probe_ref_s=float(probe_ref_s),
                probe_every_s=float(probe_every_s),
                probe_window=window,
                probe_shape=probe.shape,
            )
            if dual:
                assert prefill_probe is not None and prefill_probe_ref_s is not None
                conf.update(prefill_probe_ref_s=float(prefill_probe_ref_s), prefill_probe_shape=prefill_probe.shape)
            info["speed_probes"] = probes
        return EngineResult(rows, iters, conf, info)
