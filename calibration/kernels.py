"""Route 1 of ``kvsim calibrate``: time real torch kernels on this machine (``--device cpu|cuda``).

torch is imported here only, and lazily (:func:`import_torch`): the simulator never needs it.

What is timed, at exactly one model's kernel shapes (TP 1, ``--dtype`` bf16):

* **GEMMs** ``F.linear`` for QKV, O, gate+up, down and the LM head over a grid of token
  counts ``m``;
* **prefill attention** (causal) over (batch, prompt length) and **decode attention** (one query
  token per sequence) over (batch, KV length) on a *contiguous* cache and on a *paged* cache (a
  preallocated block pool plus random block tables), all by one attention backend
  (:mod:`calibration.attention_backends`, ``--kernels``: sdpa, flex, flashinfer, vllm), the one the
  reference engine runs. The profile's generation curve is the paged one at
  :data:`REFERENCE_BLOCK_SIZE`; the contiguous grid gives the measured ``layout.paged_overhead``
  and other block sizes ``paged_overhead_by_block_size``;
* **memory operations** the allocators charge: ``zero_()`` and ``copy_`` bandwidth and
  latency over a size grid, host↔device transfers (pinned host memory on CUDA; on CPU a
  memcpy between two host buffers, i.e. the copy measurement, stated as such), the
  bookkeeping of one block allocation (pop from a free list, extend a block-table row,
  write the row into the block-table tensor), and the elementwise kernels' bandwidth
  (``add_`` over activations);
* the **CPU side of a step** vs batch size: a Python loop building the batch metadata
  (input ids, positions, slot mapping, padded block tables) moved to the device, an argmax
  sampler over vocab-sized logits read back to the host, and the output bookkeeping.

Timing: warm-up calls, then ``repeats`` timed repeats of ``inner`` calls each (``inner``
chosen so a repeat lasts about ``target_repeat_s``), median of the per-call means; on CUDA
each repeat is bracketed by CUDA events and synchronised (:mod:`calibration.devices`); inputs rotate over several
distinct buffers (enough to exceed the last-level cache that can reasonably be flushed:
32 MiB on CPU, 128 MiB on CUDA) so a cached operand is not what is measured. CPU timings
use one thread by default (``torch.set_num_threads``), restored afterwards.

The measurements become ordinary :class:`calibration.tables.GemmTable` /
``AttentionTable`` rows and go through :mod:`calibration.fit` (parametric form + grid
correction, 80/20 held-out score) into an ordinary :class:`sim.cost.profile.Profile`. Raw rows
are written beside the profile as Parquet (``<out>.measurements.parquet``) and a plotly
fit report as HTML (``<out>.report.html``) when plotly is importable.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import platform
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from sim.catalog import ModelSpec
from sim.errors import ConfigError
from sim.cost.profile import Curve1D, Grid2D, Profile, per_gpu_heads, shape_keys

from . import attention_backends as AB
from . import fit as F
from .devices import Device, open_device
from .tables import AttentionTable, GemmTable

DEVICES = ("cpu", "cuda")
#: Decode-attention curve stored in the profile: the paged kernel at this block size.
REFERENCE_BLOCK_SIZE = 16
#: the ``kernel`` of the static layout's prefill rows (SDPA, timed when the backend is another one)
STATIC_PREFILL = "prefill_static"
#: Bytes of distinct operands cycled per measurement (about the flushable cache).
ROTATE_BYTES = {"cpu": 8 << 20, "cuda": 128 << 20}
MAX_ROTATIONS = 8
#: Memory-bound per-layer kernels charged as elementwise (same count as the tables route).
ELEMENTWISE_KERNELS = 5
METHOD = "torch kernel timing"

_TORCH_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}


def import_torch():
    """torch, or a ConfigError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ConfigError("calibrate.device", "torch", "torch installed for the --device route: "
                          "pip install torch==2.13.0 (CPU wheel) or a CUDA build") from None
    return torch


def check_device(device: str):
    """The ``torch.device`` for ``--device``, or a ConfigError naming what is wrong."""
    if device not in DEVICES:
        raise ConfigError("calibrate.device", device, f"one of {', '.join(DEVICES)}")
    torch = import_torch()
    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError("calibrate.device", device, f"a CUDA device (torch {torch.__version__}: {why}); "
                                                      "use --device cpu on this machine")
    return torch.device(device)


# --- plans ----------------------------------------------------------------------------------

def _pow2(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x <<= step
    return tuple(out)


def _halfsteps(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two and 1.5× powers of two in [lo, hi]."""
    s = set()
    for p in _pow2(1, hi):
        for v in (p, p * 3 // 2):
            if lo <= v <= hi:
                s.add(v)
    return tuple(sorted(s))


@dataclass(frozen=True)
class Plan:
    """Grids and timing effort of one calibration run."""

    gemm_m: tuple[int, ...]
    ctx_batch: tuple[int, ...]
    ctx_len: tuple[int, ...]
    ctx_max_tokens: int          # batch × prompt length measured at most
    gen_batch: tuple[int, ...]
    gen_len: tuple[int, ...]
    gen_max_kv_bytes: float      # batch × KV length × bytes per token (one layer) measured at most
    block_sizes: tuple[int, ...]  # paged block sizes whose overhead vs contiguous is measured
    overhead_batch: tuple[int, ...]
    mem_bytes: tuple[int, ...]
    ew_tokens: tuple[int, ...]
    repeats: int
    warmup: int
    target_repeat_s: float
    passes: int
    #: also time the reference engine's static-cache decode attention (``decode_static``: one SDPA per sequence)
    static_decode: bool = False

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def make_plan(device: str, model: ModelSpec, quick: bool) -> Plan:
    """Grids sized for the device; lengths stop at the model's ``max_position``."""
    maxpos = model.max_position
    if device == "cpu":
        if quick:
            return Plan(gemm_m=_pow2(1, 2048), ctx_batch=(1, 2, 4, 8), ctx_len=_pow2(16, min(2048, maxpos)),
                        ctx_max_tokens=4096, gen_batch=_pow2(1, 32), gen_len=_pow2(16, min(4096, maxpos)),
                        gen_max_kv_bytes=32 << 20, block_sizes=(8, 32), overhead_batch=_pow2(1, 256, 2),
                        mem_bytes=_pow2(1 << 12, 1 << 26, 2), ew_tokens=(1, 16, 256, 4096),
                        repeats=7, warmup=2, target_repeat_s=0.0005, passes=3)
        return Plan(gemm_m=_halfsteps(1, 4096), ctx_batch=_pow2(1, 16), ctx_len=_pow2(16, min(2048, maxpos)),
                    ctx_max_tokens=8192, gen_batch=_pow2(1, 64), gen_len=_pow2(16, min(8192, maxpos)),
                    gen_max_kv_bytes=64 << 20, block_sizes=(8, 32, 64), overhead_batch=_pow2(1, 512),
                    mem_bytes=_pow2(1 << 12, 1 << 27), ew_tokens=(1, 4, 16, 64, 256, 1024, 4096),
                    repeats=9, warmup=2, target_repeat_s=0.0005, passes=5)
    if quick:
        return Plan(gemm_m=_pow2(1, 16384), ctx_batch=(1, 4, 16, 64), ctx_len=_pow2(64, min(16384, maxpos), 2),
                    ctx_max_tokens=65536, gen_batch=_pow2(1, 256, 2), gen_len=_pow2(64, min(131072, maxpos), 2),
                    gen_max_kv_bytes=1 << 30, block_sizes=(32,), overhead_batch=_pow2(1, 256, 2),
                    mem_bytes=_pow2(1 << 14, 1 << 30, 2), ew_tokens=(1, 64, 4096, 16384),
                    repeats=7, warmup=3, target_repeat_s=0.002, passes=2)
    return Plan(gemm_m=_halfsteps(1, 32768), ctx_batch=_pow2(1, 128), ctx_len=_pow2(32, min(32768, maxpos)),
                ctx_max_tokens=262144, gen_batch=_pow2(1, 512), gen_len=_pow2(16, min(131072, maxpos)),
                gen_max_kv_bytes=2 << 30, block_sizes=(8, 32, 64, 128), overhead_batch=_pow2(1, 1024),
                mem_bytes=_pow2(1 << 12, 1 << 31), ew_tokens=(1, 16, 256, 4096, 16384, 65536),
                repeats=11, warmup=5, target_repeat_s=0.003, passes=3)


# --- timing ---------------------------------------------------------------------------------

#: A point's timed closures and the factor from seconds per call to the reported unit.
Setup = tuple  # (list[Callable[[], object]], float)
#: Elements of the pre-generated random pool operands are cut from.
POOL_ELEMS = 1 << 23
#: Timed work per point and pass above which repeats are cut (never below 3).
MAX_POINT_S = 0.15


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int
    inner: int
    buffers: int


class Bench:
    """Times torch kernels on one device; every method returns a :class:`Timing` (seconds per call).

    Build with :meth:`open` (imports torch, checks the device, sets the thread count);
    :meth:`close` restores the thread count.
    """

    def __init__(self, torch, device, dtype: str, *, repeats: int = 5, warmup: int = 2,
                 target_repeat_s: float = 0.002, threads: int | None = None, seed: int = 0,
                 ops: Device | None = None, kernels: "AB.AttentionBackend | None" = None):
        self.torch, self.device, self.dtype_name = torch, device, dtype
        self.dtype = getattr(torch, _TORCH_DTYPE[dtype])
        self.elem = torch.tensor([], dtype=self.dtype).element_size()
        #: the device side of timing (:mod:`calibration.devices`; a test may stand in a fake)
        self.ops = ops or open_device(torch, device)
        #: the attention kernels timed (:mod:`calibration.attention_backends`)
        self.kernels = kernels or AB.make("auto", torch, device, device_kind=self.ops.kind)
        self.repeats, self.warmup, self.target = int(repeats), int(warmup), float(target_repeat_s)
        self.rotate_bytes = ROTATE_BYTES[self.ops.kind]
        self._threads_before = torch.get_num_threads()
        self.threads = threads
        if device.type == "cpu":
            torch.set_num_threads(int(threads or 1))
            self.threads = torch.get_num_threads()
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.rng = random.Random(seed)
        self._pools: dict = {}
        #: CPU repeats timed with this clock (``time.perf_counter``; ``time.thread_time`` for the thread's
        #: CPU time, what ``kvsim validate``'s cpu clocks measure the engine with).
        self.timer = time.perf_counter
        #: optional host-speed normaliser (``kvsim validate``): ``tick()`` before each point (it may run
        #: a probe), ``factor_at(t)`` after all passes: the factor each sample taken at ``perf_counter`` t is
        #: multiplied by (reference speed / the host's speed then).
        self.speed = None

    @classmethod
    def open(cls, device: str, dtype: str = "bf16", *, ops: Device | None = None, kernels: str = "auto",
             registry: dict | None = None, **kw) -> "Bench":
        """A Bench on ``device`` (``ops``: a stand-in device, whose tensors live where it says and whose
        ``kind`` replaces ``device``) timing the ``kernels`` attention backend (``auto``: see
        :func:`calibration.attention_backends.select`; ``registry``: a stand-in set of backends)."""
        if dtype not in _TORCH_DTYPE:
            raise ConfigError("calibrate.dtype", dtype, f"one of {', '.join(_TORCH_DTYPE)} on the --device route "
                                                        "(fp8 kernels are not timed)")
        torch = import_torch()
        dev = ops.tensor_device if ops is not None else check_device(device)
        kind = ops.kind if ops is not None else dev.type
        backend = AB.make(kernels, torch, dev, device_kind=kind, registry=registry)
        why = backend.dtype_problem(getattr(torch, _TORCH_DTYPE[dtype]))
        if why:
            raise ConfigError("calibrate.kernels", backend.name, f"a backend that computes in {dtype} ({why})")
        return cls(torch, dev, dtype, ops=ops, kernels=backend, **kw)

    def close(self) -> None:
        self.torch.set_num_threads(self._threads_before)

    # -- helpers --
    def sync(self) -> None:
        self.ops.sync()

    def randn(self, *shape, dtype=None):
        """Normal random values: a clone of a random window of one pre-generated pool (fast), or fresh ones."""
        torch = self.torch
        dtype = dtype or self.dtype
        numel = math.prod(shape)
        pool = self._pools.get(dtype)
        if pool is None:
            pool = self._pools[dtype] = torch.randn(POOL_ELEMS, generator=self.gen, device=self.device, dtype=dtype)
        if numel > POOL_ELEMS // 2:
            return torch.randn(*shape, generator=self.gen, device=self.device, dtype=dtype)
        off = self.rng.randrange(0, POOL_ELEMS - numel + 1)
        return pool[off:off + numel].clone().view(*shape)

    def rotations(self, set_bytes: float) -> int:
        """Distinct operand sets to cycle so their total exceeds the flushable cache."""
        if set_bytes >= self.rotate_bytes:
            return 1
        return int(min(MAX_ROTATIONS, max(2, math.ceil(self.rotate_bytes / max(set_bytes, 1.0)))))

    def samples(self, calls: list[Callable[[], object]], repeats: int | None = None) -> tuple[list[float], int]:
        """Per-call seconds of ``repeats`` timed loops cycling ``calls`` (after warming every buffer), and the loop length."""
        n = len(calls)
        for i in range(max(self.warmup, n)):
            calls[i % n]()
        self.sync()
        t0 = time.perf_counter()
        calls[0]()
        self.sync()
        est = max(time.perf_counter() - t0, 1e-7)
        inner = int(max(1, min(2000, round(self.target / est))))
        repeats = int(repeats or self.repeats)
        # Long kernels: cap one point's timed work near MAX_POINT_S per pass (at least 3 repeats).
        repeats = int(max(3, min(repeats, MAX_POINT_S // (est * inner) or 3)))
        out = []
        for r in range(repeats):
            base = r * inner

            def loop(base=base):
                for j in range(inner):
                    calls[(base + j) % n]()
            out.append(self.ops.loop_seconds(loop, self.timer) / inner)
        return out, inner

    def measure(self, setups: list[Callable[[], "Setup"]], passes: int = 1, on_done=None) -> list[Timing]:
        """Time several points in ``passes`` interleaved passes; each point's value is the median
        of all its samples, so a slow episode of a shared machine touches one pass only.

        ``setups[i]()`` builds point i's buffers (rebuilt each pass, freed after it) and returns
        ``(calls, scale)``; ``scale`` converts seconds per call (e.g. per allocation event).
        """
        acc: list[list[float]] = [[] for _ in setups]
        stamps: list[list[float]] = [[] for _ in setups]
        info = [(1, 1, 1.0)] * len(setups)
        speed = self.speed
        for _ in range(max(1, passes)):
            for i, setup in enumerate(setups):
                if speed is not None:
                    speed.tick()
                calls, scale = setup()
                got, inner = self.samples(calls)
                acc[i] += [x * scale for x in got]
                stamps[i].append(time.perf_counter())
                info[i] = (inner, len(calls), scale)
                del calls
                if on_done is not None:
                    on_done(i)
        if speed is not None:  # every sample at the reference speed: x reference / the host's speed then
            speed.tick(force=True)
            for i, a in enumerate(acc):
                k = len(a) // max(len(stamps[i]), 1)
                acc[i] = [x * speed.factor_at(stamps[i][j // k]) for j, x in enumerate(a)]
        return [Timing(statistics.median(a), min(a), max(a), len(a), inf[0], inf[1]) for a, inf in zip(acc, info)]

    def time_one(self, kind: str, *args, passes: int = 1, **kw) -> Timing:
        """Convenience: ``bench.time_one("gemm", m, n, k, passes=3)``."""
        fn = getattr(self, f"{kind}_calls")
        return self.measure([lambda: fn(*args, **kw)], passes)[0]

    # -- kernels --
    def gemm_calls(self, m: int, n: int, k: int) -> Setup:
        """``F.linear(x[m,k], w[n,k])`` (an (m×k)·(k×n) GEMM)."""
        lin = self.torch.nn.functional.linear
        nb = self.rotations((m * k + n * k + m * n) * self.elem)
        sets = [(self.randn(m, k), self.randn(n, k)) for _ in range(nb)]
        return [lambda x=x, w=w: lin(x, w) for x, w in sets], 1.0

    def context_calls(self, batch: int, length: int, heads: int, kv_heads: int, head_dim: int,
                      kernels: "AB.AttentionBackend | None" = None) -> Setup:
        """Causal prefill attention of ``batch`` prompts of ``length`` tokens, by the attention backend
        (``kernels``, default the Bench's: :meth:`~calibration.attention_backends.AttentionBackend.prefill_calls`)."""
        be = kernels or self.kernels
        nb = self.rotations(batch * length * head_dim * (2 * heads + 2 * kv_heads) * self.elem)
        return be.prefill_calls(self.randn, self.rng.randrange(1 << 30), nb, batch, length, heads, kv_heads, head_dim,
                                dtype=self.dtype), 1.0

    def decode_calls(self, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
                     block_size: int | None = None) -> Setup:
        """One query token per sequence over ``kv_len`` cached tokens, by the attention backend.

        ``block_size=None``: a contiguous cache
        (:meth:`~calibration.attention_backends.AttentionBackend.decode_contiguous_calls`). Otherwise a
        paged cache: K and V pools ``[blocks, block_size, kv_heads, head_dim]`` whose blocks each
        sequence holds scattered (random block tables), one plan per operand set, as an engine plans a
        step once and runs it per layer (:meth:`~calibration.attention_backends.AttentionBackend.decode_paged_calls`).
        """
        kv_bytes = 2 * batch * kv_len * kv_heads * head_dim * self.elem
        nb = self.rotations(kv_bytes + batch * heads * head_dim * self.elem)
        be = self.kernels
        if block_size is None:
            return be.decode_contiguous_calls(self.randn, nb, batch, kv_len, heads, kv_heads, head_dim,
                                              dtype=self.dtype), 1.0
        return be.decode_paged_calls(self.randn, self.rng.randrange(1 << 30), nb, batch, kv_len, heads, kv_heads,
                                     head_dim, block_size, dtype=self.dtype), 1.0

    def reserve_paged(self, cells, heads: int, kv_heads: int, head_dim: int) -> None:
        """Before timing the paged points ``cells`` (``(batch, kv_len, block_size)``; prefill as block 16):
        let the backend size its pools for the largest (:meth:`decode_calls` / :meth:`context_calls` need)."""
        need: dict[int, int] = {}
        for b, L, bs in cells:
            nb = self.rotations(2 * b * L * kv_heads * head_dim * self.elem + b * heads * head_dim * self.elem)
            need[bs] = max(need.get(bs, 0), nb * b * -(-L // bs))
        for bs, n in need.items():
            self.kernels.reserve_pool(self.randn, n, bs, kv_heads, head_dim, self.dtype)

    def decode_static_calls(self, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int) -> Setup:
        """The reference engine's static-cache decode attention: one contiguous arena
        ``[slots, kv_heads, head_dim]`` with one reservation per sequence; each sequence's query
        attends its reservation's view (``chunk_attention``: one masked SDPA per sequence), the
        outputs concatenated (``calibration.engine.Engine.execute``, static layout)."""
        torch = self.torch
        from .engine import chunk_attention
        kv_bytes = 2 * batch * kv_len * kv_heads * head_dim * self.elem
        nb = self.rotations(kv_bytes + batch * heads * head_dim * self.elem)
        sets = []
        for _ in range(nb):
            k = self.randn(batch * kv_len, kv_heads, head_dim)
            v = self.randn(batch * kv_len, kv_heads, head_dim)
            q = self.randn(batch, heads, head_dim)
            sets.append((q, k, v))
        L = kv_len

        def call(q, k, v):
            return torch.cat([chunk_attention(q[i:i + 1], k[i * L:(i + 1) * L], v[i * L:(i + 1) * L], L - 1)
                              for i in range(batch)], 0)
        return [lambda q=q, k=k, v=v: call(q, k, v) for q, k, v in sets], 1.0

    def _elems(self, nbytes: int) -> int:
        return max(1, int(nbytes) // self.elem)

    def zero_fill_calls(self, nbytes: int) -> Setup:
        bufs = [self.torch.empty(self._elems(nbytes), dtype=self.dtype, device=self.device)
                for _ in range(self.rotations(nbytes))]
        return [b.zero_ for b in bufs], 1.0

    def copy_calls(self, nbytes: int) -> Setup:
        """Device-to-device ``dst.copy_(src)`` of ``nbytes`` (bytes copied, read once and written once)."""
        nb = self.rotations(2 * nbytes)
        pairs = [(self.torch.empty(self._elems(nbytes), dtype=self.dtype, device=self.device),
                  self.randn(self._elems(nbytes))) for _ in range(nb)]
        return [lambda d=d, s=s: d.copy_(s) for d, s in pairs], 1.0

    def host_transfer_calls(self, nbytes: int, direction: str) -> Setup:
        """CUDA: pinned host ↔ device ``copy_`` (``h2d`` or ``d2h``). CPU: a copy between two host buffers."""
        if not self.ops.pinned_host:
            return self.copy_calls(nbytes)
        torch = self.torch
        nb = self.rotations(nbytes)
        host = [torch.empty(self._elems(nbytes), dtype=self.dtype, pin_memory=True) for _ in range(nb)]
        dev = [torch.empty(self._elems(nbytes), dtype=self.dtype, device=self.device) for _ in range(nb)]
        if direction == "h2d":
            return [lambda d=d, h=h: d.copy_(h) for d, h in zip(dev, host)], 1.0
        return [lambda d=d, h=h: h.copy_(d) for d, h in zip(dev, host)], 1.0

    def elementwise_calls(self, tokens: int, hidden: int) -> Setup:
        """``x.add_(y)`` over ``tokens × hidden`` activations (a residual add: 3 streams)."""
        nb = self.rotations(3 * tokens * hidden * self.elem)
        pairs = [(self.randn(tokens, hidden), self.randn(tokens, hidden)) for _ in range(nb)]
        return [lambda x=x, y=y: x.add_(y) for x, y in pairs], 1.0

    def alloc_events_calls(self, events: int = 256, block_size: int = REFERENCE_BLOCK_SIZE,
                     blocks_per_row: int = 8) -> Setup:
        """Seconds per block allocation: pop a free block, extend the sequence's block-table row,
        write finished rows into the (host) block-table tensor. Timing per call of ``events``
        allocations; the result is divided by ``events``.
        """
        torch = self.torch
        rows = -(-events // blocks_per_row)
        table = torch.zeros(rows, blocks_per_row, dtype=torch.int32)
        free = deque(range(1 << 20))
        state = {"next": 1 << 20}

        def allocate():
            if len(free) < events:
                free.extend(range(state["next"], state["next"] + (1 << 20)))
                state["next"] += 1 << 20
            for r in range(rows):
                row = []
                for _ in range(blocks_per_row):
                    row.append(free.pop())
                table[r, :len(row)] = torch.tensor(row, dtype=torch.int32)

        return [allocate], 1.0 / (rows * blocks_per_row)

    def step_cpu_calls(self, batch: int, vocab: int, block_size: int = REFERENCE_BLOCK_SIZE,
                 max_blocks: int = 64) -> Setup:
        """Host-side work of one decode step for ``batch`` sequences.

        Schedule (walk the running sequences, grow a block when a block boundary is reached),
        prepare inputs (token ids, positions, slot mapping, padded block tables → device
        tensors), sample (argmax over ``[batch, vocab]`` logits, tokens back to the host),
        process outputs (append tokens, stop checks).
        """
        torch = self.torch
        rng = random.Random(batch)
        seqs = []
        for i in range(batch):
            length = rng.randrange(1, block_size * (max_blocks - 1))
            seqs.append({"tokens": [rng.randrange(vocab) for _ in range(4)], "len": length,
                         "blocks": [rng.randrange(1 << 20) for _ in range(length // block_size + 1)]})
        nb = self.rotations(batch * vocab * 4)
        logits = [self.randn(batch, vocab, dtype=torch.float32) for _ in range(nb)]
        free = deque(range(1 << 20))
        dev = self.device

        def step(lg):
            # schedule
            for s in seqs:
                if s["len"] % block_size == 0:
                    s["blocks"].append(free.pop() if free else 0)
            # prepare inputs
            ids, pos, slots, lens = [], [], [], []
            for s in seqs:
                p = s["len"]
                ids.append(s["tokens"][-1])
                pos.append(p)
                slots.append(s["blocks"][p // block_size] * block_size + p % block_size)
                lens.append(p + 1)
            width = max(len(s["blocks"]) for s in seqs)
            bt = [s["blocks"] + [0] * (width - len(s["blocks"])) for s in seqs]
            tensors = [torch.tensor(x, dtype=torch.long).to(dev, non_blocking=True) for x in (ids, pos, slots, lens)]
            tensors.append(torch.tensor(bt, dtype=torch.int32).to(dev, non_blocking=True))
            # sample
            nxt = lg.argmax(dim=-1).tolist()
            # process outputs (undo the growth so the state stays the same across calls)
            for s, tok in zip(seqs, nxt):
                s["tokens"].append(tok)
                s["tokens"].pop()
                if s["len"] % block_size == 0 and len(s["blocks"]) > s["len"] // block_size + 1:
                    free.append(s["blocks"].pop())
            return tensors

        return [lambda lg=lg: step(lg) for lg in logits], 1.0


# --- device description ---------------------------------------------------------------------

def describe_device(bench: Bench) -> dict:
    """The device's description for the profile's provenance (:meth:`calibration.devices.Device.describe`)."""
    return bench.ops.describe(bench.dtype_name, bench.threads)


# --- the run --------------------------------------------------------------------------------

@dataclass
class Measurements:
    """Raw timings, one dict per measured point (the Parquet sidecar's rows)."""

    rows: list[dict] = field(default_factory=list)

    def add(self, family: str, name: str, t: Timing, **coords) -> None:
        self.rows.append({"family": family, "kernel": name, **coords, "median_s": t.median_s, "min_s": t.min_s,
                          "max_s": t.max_s, "repeats": t.repeats, "inner": t.inner, "buffers": t.buffers})

    def select(self, family: str, **eq) -> list[dict]:
        return [r for r in self.rows if r["family"] == family and all(r.get(k) == v for k, v in eq.items())]

    def to_arrow(self):
        import pyarrow as pa
        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        return pa.table({k: [r.get(k) for r in self.rows] for k in keys})


def _gemm_shapes(model: ModelSpec, dtype: str) -> dict[str, tuple[int, int]]:
    keys = shape_keys(model, 1, dtype, dtype).gemms()
    return {proj: tuple(int(x) for x in key.split(":")[0].split("x")) for proj, key in keys.items()}


def run_measurements(bench: Bench, model: ModelSpec, plan: Plan, progress: bool = True) -> Measurements:
    """Time every point of ``plan`` at ``model``'s TP-1 shapes, in ``plan.passes`` interleaved passes."""
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    kv_tok_bytes = 2 * kvh * d * bench.elem
    be = bench.kernels
    # (label, setup, family, kernel, coordinates)
    jobs: list[tuple[str, Callable[[], Setup], str, str, dict]] = []
    for proj, (n, k) in _gemm_shapes(model, bench.dtype_name).items():
        for m in plan.gemm_m:
            jobs.append((f"GEMM {proj} m={m}", lambda m=m, n=n, k=k: bench.gemm_calls(m, n, k), "gemm", proj,
                         {"m": m, "n": n, "k": k}))
    for b in plan.ctx_batch:
        for s in plan.ctx_len:
            if b * s <= plan.ctx_max_tokens:
                jobs.append((f"prefill b={b} s={s}", lambda b=b, s=s: bench.context_calls(b, s, h, kvh, d),
                             "context_attention", be.prefill_kernel,
                             {"batch": b, "length": s, "heads": h, "kv_heads": kvh, "head_dim": d, "backend": be.name}))
    gen_cells = [(b, s) for b in plan.gen_batch for s in plan.gen_len if b * s * kv_tok_bytes <= plan.gen_max_kv_bytes]
    sub_b = {plan.gen_batch[len(plan.gen_batch) // 2], plan.gen_batch[-1]}
    sub_l = {plan.gen_len[len(plan.gen_len) // 2], plan.gen_len[-1]}
    other_bs = [x for x in plan.block_sizes if x != REFERENCE_BLOCK_SIZE and x not in skipped_block_sizes(be, plan)]
    for b, s in gen_cells:
        sizes = [None, REFERENCE_BLOCK_SIZE] + (other_bs if b in sub_b and s in sub_l else [])
        for bs in sizes:
            name = "decode_contiguous" if bs is None else "decode_paged"
            jobs.append((f"{name} b={b} L={s}" + (f" bs={bs}" if bs else ""),
                         lambda b=b, s=s, bs=bs: bench.decode_calls(b, s, h, kvh, d, bs), "generation_attention", name,
                         {"batch": b, "length": s, "heads": h, "kv_heads": kvh, "head_dim": d, "block_size": bs or 0,
                          "backend": be.name}))
    if plan.static_decode:
        # the reference engine's static (contiguous-arena) layout runs SDPA on every backend: its decode
        # kernel, and (other backends) its prefill, timed for the static profile (with_static_decode)
        for b, s in gen_cells:
            jobs.append((f"decode_static b={b} L={s}", lambda b=b, s=s: bench.decode_static_calls(b, s, h, kvh, d),
                         "generation_attention", "decode_static",
                         {"batch": b, "length": s, "heads": h, "kv_heads": kvh, "head_dim": d, "block_size": 0,
                          "backend": "sdpa"}))
        if be.name != "sdpa":
            sdpa = AB.SdpaBackend(bench.torch, bench.device)
            for b in plan.ctx_batch:
                for s in plan.ctx_len:
                    if b * s <= plan.ctx_max_tokens:
                        jobs.append((f"prefill_static b={b} s={s}",
                                     lambda b=b, s=s: bench.context_calls(b, s, h, kvh, d, kernels=sdpa),
                                     "context_attention", STATIC_PREFILL,
                                     {"batch": b, "length": s, "heads": h, "kv_heads": kvh, "head_dim": d,
                                      "backend": "sdpa"}))
    for nb in plan.mem_bytes:
        jobs.append((f"zero_ {nb} B", lambda nb=nb: bench.zero_fill_calls(nb), "memory", "zero_fill", {"nbytes": nb}))
        jobs.append((f"copy_ {nb} B", lambda nb=nb: bench.copy_calls(nb), "memory", "copy", {"nbytes": nb}))
        if bench.ops.pinned_host:
            for di in ("h2d", "d2h"):
                jobs.append((f"{di} {nb} B", lambda nb=nb, di=di: bench.host_transfer_calls(nb, di), "memory",
                             f"host_{di}", {"nbytes": nb}))
    for tok in plan.ew_tokens:
        jobs.append((f"add_ {tok} tokens", lambda t=tok: bench.elementwise_calls(t, model.hidden), "elementwise", "add_",
                     {"tokens": tok, "nbytes": 3 * tok * model.hidden * bench.elem}))
    jobs.append(("block allocation", lambda: bench.alloc_events_calls(), "alloc", "block_alloc", {"events": 1}))
    for b in plan.overhead_batch:
        jobs.append((f"CPU step b={b}", lambda b=b: bench.step_cpu_calls(b, model.vocab), "cpu_overhead", "step_cpu",
                     {"batch": b}))
    paged_cells = [(b, s, bs) for b, s in gen_cells for bs in [REFERENCE_BLOCK_SIZE, *other_bs]]
    paged_cells += [(b, s, 16) for b in plan.ctx_batch for s in plan.ctx_len if b * s <= plan.ctx_max_tokens]
    bench.reserve_paged(paged_cells, h, kvh, d)
    timings = _run_jobs(bench, jobs, plan.passes, progress)
    meas = Measurements()
    for (label, _, fam, kern, coords), t in zip(jobs, timings):
        meas.add(fam, kern, t, **coords)
    return meas


def skipped_block_sizes(backend: "AB.AttentionBackend", plan: Plan) -> dict[int, str]:
    """The plan's extra block sizes the backend's paged kernel cannot use, with the reason (the
    reference block size is never skipped: the profile's decode curve is measured at it)."""
    out = {}
    for bs in plan.block_sizes:
        why = backend.block_size_problem(bs)
        if why and bs != REFERENCE_BLOCK_SIZE:
            out[bs] = why
    return out


def _run_jobs(bench: Bench, jobs, passes: int, progress: bool) -> list[Timing]:
    setups = [j[1] for j in jobs]
    if not progress:
        return bench.measure(setups, passes)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("[bold]calibrate[/] {task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("", total=len(jobs) * passes)
        state = {"pass": 1}

        def done(i):
            if i == len(jobs) - 1:
                state["pass"] += 1
            bar.update(task, advance=1, description=f"pass {min(state['pass'], passes)}/{passes} "
                                                     f"{jobs[(i + 1) % len(jobs)][0]}")
        return bench.measure(setups, passes, on_done=done)


# --- fitting --------------------------------------------------------------------------------

def _gemm_table(meas: Measurements, dtype: str, version: str) -> GemmTable:
    rows = meas.select("gemm")
    return GemmTable(np.array([dtype] * len(rows)), *(np.array([r[c] for r in rows], dtype=np.int64) for c in "mnk"),
                     np.array([r["median_s"] for r in rows]), "device", "torch", version)


def _attention_table(meas: Measurements, kind: str, dtype: str, version: str, **eq) -> AttentionTable:
    fam = "context_attention" if kind == "context" else "generation_attention"
    rows = meas.select(fam, **eq)
    if kind == "context" and "kernel" not in eq:  # the backend's prefill; the static layout's has its own curve
        rows = [r for r in rows if r["kernel"] != STATIC_PREFILL]
    col = lambda c: np.array([r[c] for r in rows], dtype=np.int64)  # noqa: E731
    return AttentionTable(kind, col("batch"), col("length"), col("heads"), col("kv_heads"), col("head_dim"),
                          np.array([dtype] * len(rows)), np.array([dtype] * len(rows)),
                          np.array([r["median_s"] for r in rows]), "device", "torch", version)


def _linear_fit(x: np.ndarray, t: np.ndarray) -> tuple[float, float, dict]:
    """``t ≈ a + b·x`` minimising relative error; a, b ≥ 0."""
    A = np.column_stack([np.ones_like(x), x]) / t[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    a, b = float(coef[0]), float(coef[1])
    if a < 0 or b < 0:  # fall back to the non-negative one-term fit
        a = max(a, 0.0)
        b = max(float(np.median((t - a) / x)), 0.0)
    return a, b, F.error_summary(a + b * x, t)


def _mem_fit(meas: Measurements, kinds: tuple[str, ...]) -> dict:
    rows = [r for k in kinds for r in meas.select("memory", kernel=k)]
    x = np.array([r["nbytes"] for r in rows], dtype=float)
    t = np.array([r["median_s"] for r in rows])
    lat, inv_bw, q = _linear_fit(x, t)
    return {"latency_s": lat, "bandwidth_bytes_per_s": 1.0 / inv_bw if inv_bw > 0 else float("inf"),
            "fit_median_rel_err": round(q["median_rel_err"], 4), "fit_p95_rel_err": round(q["p95_rel_err"], 4), "n": q["n"]}


def _peaks(meas: Measurements, elem: float) -> tuple[float, float]:
    """Generous upper bounds for the fit's rates: 4× the best observed FLOP/s and bytes/s."""
    flops, bw = [1.0], [1.0]
    for r in meas.select("gemm"):
        flops.append(2.0 * r["m"] * r["n"] * r["k"] / r["median_s"])
        bw.append((r["m"] * r["k"] + r["n"] * r["k"] + r["m"] * r["n"]) * elem / r["median_s"])
    for r in meas.select("memory", kernel="copy"):
        bw.append(2.0 * r["nbytes"] / r["median_s"])
    for fam in ("context_attention", "generation_attention"):
        for r in meas.select(fam):
            bw.append(2.0 * r["batch"] * r["length"] * r["kv_heads"] * r["head_dim"] * elem / r["median_s"])
    return 4.0 * max(flops), 4.0 * max(bw)


def _heldout(kind: str, table, peak_fn, peak_bw: float, seed: int = 0) -> dict:
    test = F.holdout_mask(len(table), 0.2, seed)
    if test.sum() == 0 or (~test).sum() < 4:
        return {"median_rel_err": float("nan"), "p95_rel_err": float("nan"), "n": 0}
    return {k: (round(v, 5) if isinstance(v, float) else v)
            for k, v in F.heldout_evaluation(kind, table, peak_fn, peak_bw, test).items()}


def build_device_profile(meas: Measurements, model: ModelSpec, device_info: dict, plan: Plan, *,
                         name: str | None, dtype: str, elapsed_s: float, seed: int = 0,
                         key_dtype: str | None = None) -> tuple[Profile, dict]:
    """Fit the measurements into a Profile; also return the fits (for the report).

    ``key_dtype``: the dtype name the profile's curves are filed under (default ``dtype``).
    The simulator's dtype vocabulary has no fp32, so an fp32-timed profile for the fp32
    reference engine is filed under ``bf16`` and says so in ``provenance.compute_dtype``.
    """
    version = device_info["torch"]
    attn = device_info.get("attention") or {"name": "sdpa", "version": version, **AB.SdpaBackend.routes}
    device_info = {k: v for k, v in device_info.items() if k != "attention"}
    attn_version = f"{attn['name']} {attn['version']}"
    elem = F.elem_bytes(dtype)
    peak_flops, peak_bw = _peaks(meas, elem)
    peak_fn = lambda _dt: peak_flops  # noqa: E731
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    gt = _gemm_table(meas, dtype, version)
    ct = _attention_table(meas, "context", dtype, attn_version)
    pt = _attention_table(meas, "generation", dtype, attn_version, kernel="decode_paged", block_size=REFERENCE_BLOCK_SIZE)
    cont = _attention_table(meas, "generation", dtype, attn_version, kernel="decode_contiguous")
    fits = {"gemm": F.fit_gemm(gt, peak_fn, peak_bw), "context_attention": F.fit_context(ct, peak_fn, peak_bw),
            "generation_attention": F.fit_generation(pt, peak_fn, peak_bw),
            "generation_contiguous": F.fit_generation(cont, peak_fn, peak_bw)}
    quality = {}
    for kind, table in (("gemm", gt), ("context_attention", ct), ("generation_attention", pt)):
        quality[kind] = {"overall": _heldout(kind, table, peak_fn, peak_bw, seed), "groups": {}}
    quality["method"] = (f"random 20% of measured points held out (numpy seed {seed}), fit on the other 80%, "
                         "relative error |pred-meas|/meas; measured value = median of repeats")

    kd = key_dtype or dtype
    keys = shape_keys(model, 1, kd, kd)
    gemm = {}
    for proj, key in keys.gemms().items():
        n, k = (int(x) for x in key.split(":")[0].split("x"))
        m = np.array(sorted({r["m"] for r in meas.select("gemm", kernel=proj)}), dtype=float)
        t = F.predict_gemm(fits["gemm"], dtype, m, np.full_like(m, n), np.full_like(m, k))
        gemm[key] = Curve1D(m, t, {"table_dtype": dtype, "measured_shape": True, "projection": proj})

    def grid(fam_fit, table, predict, meta):
        return _fitted_grid(fam_fit, table, predict, meta, dtype, d, h, kvh)

    akey = keys.attention
    ctx = {akey: grid(fits["context_attention"], ct, F.predict_context,
                      {"group": f"{dtype}/{dtype}/{d}", "measured_shape": True, "backend": attn_version,
                       "kernel": attn.get("prefill", "")})}
    gen = {akey: grid(fits["generation_attention"], pt, F.predict_generation,
                      {"group": f"{dtype}/{d}", "measured_shape": True, "length_is": "KV tokens per sequence",
                       "backend": attn_version,
                       "kernel": f"paged, block {REFERENCE_BLOCK_SIZE}: {attn.get('decode_paged', '')}"})}
    # Paged overhead: measured paged / contiguous at the same (batch, length).
    contig = {(r["batch"], r["length"]): r["median_s"] for r in meas.select("generation_attention", kernel="decode_contiguous")}
    # Block-size dependence, every block size on the same sub-grid cells.
    sub = {(r["batch"], r["length"]) for r in meas.select("generation_attention", kernel="decode_paged")
           if r["block_size"] != REFERENCE_BLOCK_SIZE}
    by_bs = {}
    for bs in sorted({REFERENCE_BLOCK_SIZE, *plan.block_sizes}):
        ratios = [r["median_s"] / contig[(r["batch"], r["length"])]
                  for r in meas.select("generation_attention", kernel="decode_paged", block_size=bs)
                  if (r["batch"], r["length"]) in contig and (r["batch"], r["length"]) in sub]
        if ratios:
            by_bs[str(bs)] = round(float(np.median(ratios)) - 1.0, 4)
    ref_ratios = [r["median_s"] / contig[(r["batch"], r["length"])]
                  for r in meas.select("generation_attention", kernel="decode_paged", block_size=REFERENCE_BLOCK_SIZE)
                  if (r["batch"], r["length"]) in contig]
    paged_overhead = float(np.median(ref_ratios)) - 1.0
    layout = {"measured_paged": True, "measured_block_size": REFERENCE_BLOCK_SIZE,
              "paged_overhead": round(max(paged_overhead, -0.5), 4),
              "paged_overhead_source": "measured: median over the decode grid of paged / contiguous time - 1",
              "paged_overhead_spread": [round(float(np.percentile(ref_ratios, q)) - 1.0, 4) for q in (10, 90)],
              "paged_overhead_by_block_size": by_bs,
              "contiguous_model": "decode attention time / (1 + paged_overhead)",
              "block_size_dependence": "decode attention time x (1 + overhead(block size)) / (1 + paged_overhead), "
                                       "overhead interpolated in log block size, clamped at the measured ends",
              "measured_kernel": f"{attn_version}: {attn.get('decode_paged', '')}",
              "contiguous_kernel": f"{attn_version}: {attn.get('decode_contiguous', '')}"}
    if attn.get("skipped_block_sizes"):
        layout["skipped_block_sizes"] = attn["skipped_block_sizes"]

    zero, copy = _mem_fit(meas, ("zero_fill",)), _mem_fit(meas, ("copy",))
    pinned = bool(meas.select("memory", kernel="host_h2d"))  # host transfers timed with pinned memory (CUDA)
    host = _mem_fit(meas, ("host_h2d", "host_d2h")) if pinned else dict(copy)
    alloc = meas.select("alloc")[0]["median_s"]

    def size_curve(kinds):
        by = {}
        for k in kinds:
            for r in meas.select("memory", kernel=k):
                by.setdefault(r["nbytes"], []).append(r["median_s"])
        x = np.array(sorted(by), dtype=float)
        t = np.maximum.accumulate(np.array([float(np.mean(by[v])) for v in sorted(by)]))  # more bytes never faster
        return Curve1D(x, t, {"x_is": "bytes", "kernels": list(kinds)}).to_json()

    curves = {"zero_fill": size_curve(("zero_fill",)), "copy": size_curve(("copy",)),
              "host_transfer": size_curve(("host_h2d", "host_d2h") if pinned else ("copy",))}
    memory = {"latency_s": zero["latency_s"], "bandwidth_bytes_per_s": zero["bandwidth_bytes_per_s"],
              "zero_latency_s": zero["latency_s"], "zero_bandwidth_bytes_per_s": zero["bandwidth_bytes_per_s"],
              "copy_latency_s": copy["latency_s"], "copy_bandwidth_bytes_per_s": copy["bandwidth_bytes_per_s"],
              "host_latency_s": host["latency_s"], "host_bandwidth_bytes_per_s": host["bandwidth_bytes_per_s"],
              "alloc_event_s": alloc, "curves": curves,
              "fits": {"zero_fill": zero, "copy": copy, "host_transfer": host},
              "source": "measured: tensor.zero_() and dst.copy_(src) over a size grid; the cost model reads the "
                        "curves (seconds vs bytes, log-log, non-decreasing; caches make one latency + bandwidth line "
                        "inaccurate), the latency/bandwidth fits are summaries (copy bandwidth = bytes copied per second); "
                        + ("host transfer: pinned host <-> device copy_, both directions" if pinned
                           else "host transfer on CPU = memcpy between two host buffers (the copy measurement)")
                        + "; alloc_event_s: pop from a free list + extend a block-table row + write it into the "
                          "block-table tensor, per block"}
    ew_rows = meas.select("elementwise")
    x = np.array([r["nbytes"] for r in ew_rows], dtype=float)
    lat, inv_bw, q = _linear_fit(x, np.array([r["median_s"] for r in ew_rows]))
    elementwise = {"kernels_per_layer": ELEMENTWISE_KERNELS, "latency_s": lat, "bandwidth_bytes_per_s": 1.0 / inv_bw,
                   "fit_median_rel_err": round(q["median_rel_err"], 4),
                   "source": "measured: x.add_(y) over tokens x hidden activations, t = latency + bytes/bandwidth"}
    ov_rows = meas.select("cpu_overhead")
    xb = np.array([r["batch"] for r in ov_rows], dtype=float)
    a, b, q = _linear_fit(xb, np.array([r["median_s"] for r in ov_rows]))
    cpu_overhead = {"by_tp": {"1": {"intercept_s": a, "per_seq_s": b, "batch_range": [int(xb.min()), int(xb.max())],
                                    "fit_median_rel_err": round(q["median_rel_err"], 4),
                                    "fit_p95_rel_err": round(q["p95_rel_err"], 4)}},
                    "parts": ["schedule (block growth)", "prepare inputs (ids, positions, slot mapping, block tables "
                              "to device)", "argmax sampler over vocab-sized logits", "output processing"],
                    "source": "measured: a Python loop of a vLLM-like decode step (Bench.step_cpu), not a real engine",
                    "note": "host-side work per step, not overlapped with device work"}

    dev_name = device_info.get("name", device_info["kind"])
    params = {fam: {"/".join(map(str, k)): {a_: float(f"{v:.5g}") for a_, v in rf.as_dict().items()}
                    for k, (rf, _) in fits[fam].groups.items()}
              for fam in ("gemm", "context_attention", "generation_attention")}
    counts = {}
    for r in meas.rows:
        counts[r["family"]] = counts.get(r["family"], 0) + 1
    provenance = {
        "device": dev_name, "system": device_info["kind"],
        "backend": f"torch {version} (eager GEMMs and memory ops); attention: {attn_version}",
        "backend_versions": {"gemm": version, "context_attention": attn_version, "generation_attention": attn_version,
                             "nccl": None},
        "attention_backend": attn,
        "source": "kernels timed on this machine by kvsim calibrate --device",
        "source_tables": [], "date": _dt.date.today().isoformat(), "method": METHOD,
        "method_detail": "warm-up calls, then median over repeats of the mean per-call time of a timed loop "
                         + ("bracketed by CUDA events and synchronised" if device_info["kind"] == "cuda" else
                            f"(time.perf_counter, torch.set_num_threads({device_info.get('threads')}))")
                         + "; inputs cycled over distinct buffers to defeat cache reuse; fits as in the tables route "
                           "(calibration.fit: parametric smooth roofline x grid correction)",
        "device_info": device_info, "plan": plan.to_json(), "measured_points": counts,
        "elapsed_s": round(elapsed_s, 1), "parametric_fits": params, "clamped_points": {},
        "library_versions": {**_lib_versions(), "torch": version}, "notes": [
            "TP 1 only (no all-reduce measured)",
            f"the profile's decode curve is the paged kernel ({attn['name']}) at block 16; contiguous = / (1 + "
            "paged_overhead)"],
    }
    device = {"name": dev_name, "system": device_info["kind"], "hbm_bandwidth": copy["bandwidth_bytes_per_s"] * 2.0,
              "peak_bf16_flops": peak_flops / 4.0, "peak_fp8_flops": 0.0,
              "memory_bytes": device_info.get("memory_bytes", 0), "pcie_bandwidth": host["bandwidth_bytes_per_s"],
              "nvlink_bandwidth": 0.0, "note": "bandwidth and FLOP/s are the best observed, not datasheet peaks"}
    entry = {"tensor_parallel": 1, "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
             "kv_heads": model.kv_heads, "head_dim": model.head_dim, "intermediate": model.intermediate,
             "vocab": model.vocab, "gemm_shapes": {p: k.split(":")[0] for p, k in keys.gemms().items()},
             "attention_shape": akey.split(":")[0]}
    profile = Profile(name=name or f"{device_info['kind']}-{model.name}", device=device, provenance=provenance,
                      memory=memory, elementwise=elementwise, layout=layout, cpu_overhead=cpu_overhead, allreduce={},
                      gemm=gemm, context_attention=ctx, generation_attention=gen, models={f"{model.name}@tp1": entry},
                      fit_quality=quality, dtypes={"weight": [kd], "kv": [kd], "weight_tables": {kd: dtype},
                                                   "kv_tables": {kd: [[dtype, dtype, d], [dtype, d]]}})
    profile.provenance["compute_dtype"] = dtype
    if kd != dtype:
        profile.provenance["notes"].append(f"kernels timed in {dtype}; curves filed under {kd} (the simulator's dtype "
                                           f"names have no {dtype}); KV bytes in the simulator stay {kd}-sized")
    return profile, fits


def _lib_versions() -> dict:
    import pyarrow
    import scipy
    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "pyarrow": pyarrow.__version__}


# --- sidecar files --------------------------------------------------------------------------

def sidecar_paths(out: Path | str) -> tuple[Path, Path]:
    out = Path(out)
    stem = out.with_suffix("")
    return stem.with_name(stem.name + ".measurements.parquet"), stem.with_name(stem.name + ".report.html")


def write_report(path: Path, profile: Profile, meas: Measurements, fits: dict, model: ModelSpec) -> Path | None:
    """Measured points vs fitted curves, one panel per family. None when plotly is missing."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    dtype = profile.provenance.get("compute_dtype", profile.dtypes["weight"][0])
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    fig = make_subplots(rows=3, cols=2, subplot_titles=(
        "GEMMs: time vs tokens m", "prefill attention: time vs prompt length (per batch)",
        f"decode attention ({profile.provenance.get('attention_backend', {}).get('name', 'sdpa')}, paged, block 16): "
        "time vs KV length (per batch)", "memory ops: time vs bytes",
        "CPU step overhead vs batch", "decode: paged / contiguous"))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    for i, (key, curve) in enumerate(profile.gemm.items()):
        proj = curve.meta.get("projection", key)
        n, k = (int(x) for x in key.split(":")[0].split("x"))
        rows = meas.select("gemm", kernel=proj)
        c = colors[i % len(colors)]
        fig.add_trace(go.Scatter(x=[r["m"] for r in rows], y=[r["median_s"] for r in rows], mode="markers",
                                 marker={"color": c}, name=f"{proj} {n}x{k} measured", legendgroup=proj), 1, 1)
        mf = np.geomspace(curve.x[0], curve.x[-1], 80)
        fig.add_trace(go.Scatter(x=mf, y=F.predict_gemm(fits["gemm"], dtype, mf, n, k), mode="lines", line={"color": c},
                                 name=f"{proj} fit", legendgroup=proj, showlegend=False), 1, 1)
    for fam, (r_, c_), kernel in (("context_attention", (1, 2), None), ("generation_attention", (2, 1), "decode_paged")):
        sel = meas.select(fam) if kernel is None else meas.select(fam, kernel=kernel, block_size=REFERENCE_BLOCK_SIZE)
        for i, b in enumerate(sorted({r["batch"] for r in sel})):
            rows = sorted([r for r in sel if r["batch"] == b], key=lambda r: r["length"])
            c = colors[i % len(colors)]
            fig.add_trace(go.Scatter(x=[r["length"] for r in rows], y=[r["median_s"] for r in rows], mode="markers",
                                     marker={"color": c}, name=f"{fam.split('_')[0]} b={b}", legendgroup=f"{fam}{b}"), r_, c_)
            lf = np.geomspace(rows[0]["length"], rows[-1]["length"], 60)
            pred = (F.predict_context(fits[fam], dtype, dtype, d, b, lf, h, kvh) if fam == "context_attention"
                    else F.predict_generation(fits[fam], dtype, d, b, lf, h, kvh))
            fig.add_trace(go.Scatter(x=lf, y=pred, mode="lines", line={"color": c}, showlegend=False,
                                     legendgroup=f"{fam}{b}"), r_, c_)
    mem = profile.memory
    for i, (kern, lat, bw) in enumerate((("zero_fill", mem["zero_latency_s"], mem["zero_bandwidth_bytes_per_s"]),
                                         ("copy", mem["copy_latency_s"], mem["copy_bandwidth_bytes_per_s"]))):
        rows = meas.select("memory", kernel=kern)
        xs = np.array([r["nbytes"] for r in rows], dtype=float)
        c = colors[i]
        fig.add_trace(go.Scatter(x=xs, y=[r["median_s"] for r in rows], mode="markers", marker={"color": c},
                                 name=f"{kern} measured"), 2, 2)
        fig.add_trace(go.Scatter(x=xs, y=lat + xs / bw, mode="lines", line={"color": c}, name=f"{kern} fit"), 2, 2)
    rows = meas.select("cpu_overhead")
    xb = np.array([r["batch"] for r in rows], dtype=float)
    cpu = profile.cpu_overhead["by_tp"]["1"]
    fig.add_trace(go.Scatter(x=xb, y=[r["median_s"] for r in rows], mode="markers", name="CPU step measured"), 3, 1)
    fig.add_trace(go.Scatter(x=xb, y=cpu["intercept_s"] + cpu["per_seq_s"] * xb, mode="lines", name="CPU step fit"), 3, 1)
    contig = {(r["batch"], r["length"]): r["median_s"] for r in meas.select("generation_attention", kernel="decode_contiguous")}
    for i, bs in enumerate(sorted({r["block_size"] for r in meas.select("generation_attention", kernel="decode_paged")})):
        rows = [r for r in meas.select("generation_attention", kernel="decode_paged", block_size=bs)
                if (r["batch"], r["length"]) in contig]
        fig.add_trace(go.Scatter(x=[r["batch"] * r["length"] for r in rows],
                                 y=[r["median_s"] / contig[(r["batch"], r["length"])] for r in rows], mode="markers",
                                 marker={"color": colors[i % len(colors)]}, name=f"paged/contiguous block {bs}"), 3, 2)
    for (r_, c_) in ((1, 1), (1, 2), (2, 1), (2, 2), (3, 2)):
        fig.update_xaxes(type="log", row=r_, col=c_)
        if (r_, c_) != (3, 2):
            fig.update_yaxes(type="log", row=r_, col=c_)
    fig.update_yaxes(title_text="seconds")
    q = profile.fit_quality
    sub = ", ".join(f"{k} {v['overall']['median_rel_err']:.1%}/{v['overall']['p95_rel_err']:.1%}"
                    for k, v in q.items() if isinstance(v, dict) and "overall" in v)
    att = profile.provenance.get("attention_backend") or {}
    fig.update_layout(height=1300, title=f"kvsim calibrate: {profile.name} on {profile.device['name']} "
                                         f"(torch {profile.provenance['device_info']['torch']}; attention "
                                         f"{att.get('name', 'sdpa')} {att.get('version', '')}); held-out median/p95: {sub}")
    from .html_report import write_figure_html
    return write_figure_html(fig, path)


# --- entry point ----------------------------------------------------------------------------

@dataclass
class DeviceResult:
    profile: Profile
    measurements: Measurements
    fits: dict
    elapsed_s: float


def calibrate_device(device: str, model: ModelSpec, *, quick: bool = False, name: str | None = None,
                     dtype: str = "bf16", threads: int | None = None, progress: bool = True,
                     plan: Plan | None = None, key_dtype: str | None = None, cpu_time: bool = False,
                     speed=None, kernels: str = "auto", ops: Device | None = None,
                     registry: dict | None = None) -> DeviceResult:
    """Time ``model``'s kernels on ``device`` and fit a profile (see the module docstring).

    ``cpu_time`` (CPU only): time repeats in the thread's CPU time (``time.thread_time``) instead of
    wall time. ``speed``: a host-speed normaliser (:attr:`Bench.speed`; ``kvsim validate``'s
    :class:`calibration.validate.HostSpeed`) that puts every sample at its reference speed.
    ``kernels``: the attention backend (:data:`calibration.attention_backends.KERNELS`); ``ops`` and
    ``registry``: a stand-in device and set of backends (:meth:`Bench.open`).
    """
    t0 = time.perf_counter()
    plan = plan or make_plan(device, model, quick)
    meas, info = measure_device(device, model, plan, dtype=dtype, threads=threads, progress=progress,
                                cpu_time=cpu_time, speed=speed, kernels=kernels, ops=ops, registry=registry)
    elapsed = time.perf_counter() - t0
    profile, fits = build_device_profile(meas, model, info, plan, name=name, dtype=dtype, elapsed_s=elapsed,
                                         key_dtype=key_dtype)
    return DeviceResult(profile, meas, fits, elapsed)


def measure_device(device: str, model: ModelSpec, plan: Plan, *, dtype: str = "bf16", threads: int | None = None,
                   progress: bool = False, cpu_time: bool = False, speed=None, kernels: str = "auto",
                   ops: Device | None = None, registry: dict | None = None) -> tuple[Measurements, dict]:
    """Time every point of ``plan`` (no fitting): the measurements and the device's description
    (``attention``: the backend's :meth:`~calibration.attention_backends.AttentionBackend.describe`, the
    block sizes it skipped, its counters). Arguments as :func:`calibrate_device`."""
    if device not in DEVICES:
        raise ConfigError("calibrate.device", device, f"one of {', '.join(DEVICES)}")
    if dtype not in _TORCH_DTYPE:
        raise ConfigError("calibrate.dtype", dtype, f"one of {', '.join(_TORCH_DTYPE)} on the --device route")
    bench = Bench.open(device, dtype, threads=threads, kernels=kernels, ops=ops, registry=registry)
    try:
        bench.repeats, bench.warmup, bench.target = plan.repeats, plan.warmup, plan.target_repeat_s
        if cpu_time and device == "cpu":
            bench.timer = time.thread_time
        bench.speed = speed
        info = describe_device(bench)
        t0 = time.perf_counter()
        meas = run_measurements(bench, model, plan, progress)
        info["attention"] = {**bench.kernels.describe(), "prefill_kernel": bench.kernels.prefill_kernel,
                             "skipped_block_sizes": {str(k): v for k, v in skipped_block_sizes(bench.kernels, plan).items()},
                             "measure_s": round(time.perf_counter() - t0, 1), **bench.kernels.stats()}
    finally:
        bench.close()
    return meas, info


def pool_measurements(runs: list[Measurements]) -> Measurements:
    """One point per measured coordinate from several runs of the same plan: the median of the
    runs' medians (each run's value already robust to its slow samples; a run taken in a slow
    or oddly-loaded window is outvoted), the extreme min and max, the repeats summed. A point
    missing from some runs is pooled over the runs that have it."""
    stats = ("median_s", "min_s", "max_s", "repeats", "inner", "buffers", "runs")
    groups: dict[tuple, list[dict]] = {}  # in first-seen order
    for m in runs:
        for r in m.rows:
            key = tuple(sorted((k, v) for k, v in r.items() if k not in stats))
            groups.setdefault(key, []).append(r)
    out = Measurements()
    for rs in groups.values():
        row = {k: v for k, v in rs[0].items() if k not in stats}
        row.update(median_s=float(np.median([r["median_s"] for r in rs])), min_s=min(r["min_s"] for r in rs),
                   max_s=max(r["max_s"] for r in rs), repeats=sum(r["repeats"] for r in rs),
                   inner=rs[-1]["inner"], buffers=rs[-1]["buffers"], runs=sum(r.get("runs", 1) for r in rs))
        out.rows.append(row)
    return out


def write_outputs(result: DeviceResult, out: Path | str, model: ModelSpec, report: bool = True) -> dict[str, Path | None]:
    """Write the profile, the Parquet sidecar of raw timings and (with plotly) the HTML fit report."""
    import pyarrow.parquet as pq
    out = Path(out)
    path = result.profile.write(out)
    pq_path, html_path = sidecar_paths(out)
    pq.write_table(result.measurements.to_arrow(), pq_path, compression="zstd")
    written = {"profile": path, "measurements": pq_path, "report": None}
    if report:
        written["report"] = write_report(html_path, result.profile, result.measurements, result.fits, model)
    return written


# --- framework overhead of the reference engine, measured with its own loop -----------------------

#: Batch sizes (max_num_seqs) of the offline engine runs that measure its per-iteration overhead.
ENGINE_OVERHEAD_BATCHES = (1, 2, 4, 8, 16)
#: how the engine-overhead runs fill a batch of ``b`` (``measure_engine_overhead``'s ``mix``):
#: ``offline``: ``b`` requests at t = 0, ``output_tokens`` each (every prefill at the start, then
#: decode); ``queued``: ``b + max(1, b // 2)`` requests at t = 0 with outputs uniform in
#: ``output_range``, ``max_num_seqs = b``, so waiting requests are admitted as others finish and
#: their prefill chunks run beside ``b - 1`` long decodes, as in a loaded replay
OVERHEAD_MIXES = ("offline", "queued")


def kernels_only(profile: Profile) -> Profile:
    """A copy of ``profile`` whose CPU-side step overhead is zero (kernels, elementwise and allocation only)."""
    import copy
    p = copy.deepcopy(profile)
    by = p.cpu_overhead.setdefault("by_tp", {})
    for k in list(by) or ["1"]:
        by[k] = {**by.get(k, {}), "intercept_s": 0.0, "per_seq_s": 0.0, "batch_range": [1, 1 << 20],
                 "after_prefill_s": []}
    return p


def _fitted_grid(fam_fit, table, predict, meta: dict, dtype: str, d: int, h: int, kvh: int) -> Grid2D:
    """A fitted attention family on the (batch, length) grid of the table's measured coordinates."""
    b = np.unique(table.batch).astype(float)
    s = np.unique(table.length).astype(float)
    bb, ss = np.meshgrid(b, s, indexing="ij")
    t = predict(fam_fit, dtype, dtype, d, bb.ravel(), ss.ravel(), h, kvh) if predict is F.predict_context else \
        predict(fam_fit, dtype, d, bb.ravel(), ss.ravel(), h, kvh)
    measured = {(int(x), int(y)) for x, y in zip(table.batch, table.length)}
    return Grid2D(b, s, t.reshape(bb.shape), {**meta, "measured_cells": len(measured), "cells": int(bb.size)})


def with_static_decode(profile: Profile, meas: Measurements, model: ModelSpec) -> Profile:
    """``profile`` for the reference engine's *static* cache: its decode-attention grid is the
    measured ``decode_static`` kernel (one masked SDPA per sequence over its contiguous
    reservation, as ``Engine.execute`` runs it), and ``layout.paged_overhead`` 0, so the cost model's
    contiguous layout reads that grid as is (instead of the paged grid ÷ (1 + a median overhead),
    whose ratio to the static kernel varies with batch and length). Where the attention backend is not
    SDPA, the static layout's prefill (SDPA, :data:`STATIC_PREFILL` rows) replaces the context grid too:
    the static engine runs SDPA for both. Unchanged without those rows."""
    import copy
    rows = meas.select("generation_attention", kernel="decode_static")
    if not rows:
        return profile
    b = np.array(sorted({r["batch"] for r in rows}), dtype=float)
    L = np.array(sorted({r["length"] for r in rows}), dtype=float)
    by = {(r["batch"], r["length"]): r["median_s"] for r in rows}
    if len(by) != b.size * L.size:
        return profile
    t = np.array([[by[(int(x), int(y))] for y in L] for x in b])
    # more KV per sequence, or more sequences, is never faster (timing noise otherwise bends the grid)
    t = np.maximum.accumulate(np.maximum.accumulate(t, axis=0), axis=1)
    p = copy.deepcopy(profile)
    key = shape_keys(model, 1, p.dtypes["weight"][0], p.dtypes["weight"][0]).attention
    old = p.generation_attention[key]
    p.generation_attention = {**p.generation_attention,
                              key: Grid2D(b, L, t, {**old.meta, "kernel": "static: one masked SDPA per sequence over "
                                                    "its contiguous reservation (calibration.engine), measured medians",
                                                    "measured_cells": int(b.size * L.size), "cells": int(b.size * L.size),
                                                    "replaces": "paged grid / (1 + paged_overhead)"})}
    p.layout = {**p.layout, "paged_overhead": 0.0, "paged_overhead_by_block_size": {},
                "kernel_route_paged_overhead": p.layout.get("paged_overhead"),
                "contiguous_model": "the generation grid is the static-cache kernel itself (decode_static)"}
    if meas.select("context_attention", kernel=STATIC_PREFILL):
        dtype = p.provenance.get("compute_dtype", p.dtypes["weight"][0])
        h, kvh = per_gpu_heads(model, 1)
        ct = _attention_table(meas, "context", dtype, f"sdpa {p.provenance['device_info']['torch']}", kernel=STATIC_PREFILL)
        peak_flops, peak_bw = _peaks(meas, F.elem_bytes(dtype))
        fit = F.fit_context(ct, lambda _dt: peak_flops, peak_bw)
        old_ctx = p.context_attention[key]
        p.context_attention = {**p.context_attention, key: _fitted_grid(
            fit, ct, F.predict_context, {**old_ctx.meta, "backend": "sdpa", "kernel": AB.SdpaBackend.routes["prefill"],
                                         "replaces": f"the {old_ctx.meta.get('backend', '')} prefill grid"},
            dtype, model.head_dim, h, kvh)}
    return p


def kernel_cost(profile: Profile, model: ModelSpec, allocator: str, block_size: int):
    """The cost model of ``profile``'s kernels alone (CPU-side step overhead zeroed) for the
    reference engine's ``allocator`` layout: what the engine overhead is measured against."""
    from sim.catalog import GPUS
    from sim.cost.model import Layout
    from sim.cost.profile import ProfileCostModel
    dt = profile.dtypes["weight"][0]
    return ProfileCostModel(kernels_only(profile), model, GPUS["cpu"], weight_dtype=dt, kv_dtype=dt,
                            layout=Layout(paged=allocator == "paged", block_size=block_size))


def row_time_s(row: dict, clock: str) -> float:
    """An engine iteration row's time on ``clock``: thread CPU seconds for ``cpu``, else the
    measured seconds (wall, or the ``cpu_norm`` clock's normalised CPU time)."""
    return row["cpu_s"] if clock == "cpu" else row["measured_s"]


def _predict(cost, chunks, decode_seqs: int, decode_kv: int, alloc_events: int) -> float:
    from sim.cost.model import BatchShape
    shape = BatchShape([tuple(c) for c in chunks], decode_seqs, decode_kv)
    return cost.step_time_s(shape) + cost.alloc_time_s(alloc_events)


def engine_iteration_rows(result, cost) -> list[dict]:
    """One row per engine iteration: its batch shape (``chunks``: the prefill chunks as
    ``[new tokens, context]``), measured wall and thread-CPU seconds, and ``cost``'s prediction."""
    rows = []
    for i, it in enumerate(result.iterations):
        chunks = [list(c) for c in it["prefill_chunks"]]
        rows.append({"iteration": i, "seqs": it["decode_seqs"] + len(chunks),
                     "decode_seqs": it["decode_seqs"], "prefill_chunks": len(chunks),
                     "tokens": it["decode_seqs"] + it["prefill_tokens"], "decode_kv_tokens": it["decode_kv_tokens"],
                     "pure_decode": not chunks, "measured_s": it["end_s"] - it["start_s"],
                     "cpu_s": it["cpu_s"], "chunks": chunks, "alloc_events": it["alloc_events"],
                     "predicted_s": _predict(cost, chunks, it["decode_seqs"], it["decode_kv_tokens"],
                                             it["alloc_events"])})
        if "decode_kv_max" in it:  # the longest decoding sequence (the padded CUDA decode call pads to it)
            rows[-1]["decode_kv_max"] = it["decode_kv_max"]
        if "after_probe" in it:  # cpu_norm runs: the iteration right after a host-speed probe
            rows[-1]["after_probe"] = bool(it["after_probe"])
    return rows


def repredict(rows: list[dict], cost, clock: str) -> list[dict]:
    """``rows`` (engine overhead rows) with ``predicted_s`` and ``residual_s`` recomputed against
    ``cost`` (kernels only, :func:`kernel_cost`): how the overhead rounds are refitted on kernel
    curves re-timed after they ran. Rows without ``chunks`` (runs before it was stored) are
    returned unchanged."""
    out = []
    for r in rows:
        if "chunks" not in r:
            out.append(r)
            continue
        pred = _predict(cost, r["chunks"], r["decode_seqs"], r["decode_kv_tokens"], r["alloc_events"])
        out.append({**r, "predicted_s": pred,
                    "residual_s": row_time_s(r, clock) - pred})
    return out


def decode_since_prefill(rows: list[dict]) -> list[int]:
    """Per engine iteration row (in run order), how many pure-decode iterations have run since the
    last iteration with a prefill chunk, this one included (0 for an iteration with prefill; a run
    starts with one, as nothing is computed before its first prefill)."""
    out, k = [], 0
    for r in rows:
        k = k + 1 if r["pure_decode"] else 0
        out.append(k)
    return out


def measure_engine_overhead(profile: "Profile | dict[str, Profile]", model: ModelSpec, *, allocators=("paged",), block_size: int = 16,
                            dtype: str = "fp32", threads: int = 1, batches=ENGINE_OVERHEAD_BATCHES, passes: int = 3,
                            prompt_range=(16, 384), output_tokens: int = 24, max_num_batched_tokens: int = 256,
                            mixes=("offline",), output_range=(8, 48),
                            seed: int = 0, device: str = "cpu", clock: str = "wall",
                            between_runs=None, probes: dict | None = None,
                            probe_ref_s: dict | None = None, net=None, prefill_probes: dict | None = None,
                            prefill_probe_ref_s: dict | None = None, kernels: str = "auto") -> dict[str, dict]:
    """Per-iteration framework overhead of the reference engine (``calibration.engine``), per cache layout.

    The engine runs offline batches (``b`` requests at t = 0, ``max_num_seqs = b``, prompts
    uniform in ``prompt_range``, ``output_tokens`` each) through its own loop: scheduling,
    block tables, metadata tensors, the forward with its small ops (norms, RoPE, cache
    writes, masks, views), sampling and bookkeeping. Each iteration's time minus what the
    profile's kernel curves predict for the same batch shape (GEMMs, attention,
    elementwise, allocations; CPU overhead zeroed) is the overhead route 1's isolated
    kernels miss. It is fitted ``a + b·S + c·P`` (``S`` sequences, ``P`` prefill tokens) by
    :func:`_fit_overhead`: ``a + b·S`` on steady-state decode iterations, ``c`` = what an iteration
    with prefill leaves per prefill token (see there). The layouts' runs are interleaved
    (pass by pass, batch by batch) so a slow episode of a shared host hits all of them alike.
    ``mixes`` (:data:`OVERHEAD_MIXES`, each row tagged ``mix``): how each batch is filled;
    ``queued`` adds runs whose prefills join running decodes mid-stream (``output_range`` its outputs).

    ``clock="wall"``: iteration wall time (what latencies are made of; on a shared host it
    includes the time the engine thread was not running). ``clock="cpu"``: the engine
    thread's CPU time (``time.thread_time``; one torch thread, so every CPU kernel runs on
    it): the engine's own cost on a quiet host (not the step time on CUDA, which is async).
    ``between_runs``: called after each engine run (``kvsim validate`` times its host-speed
    probe there, so the probe's reference spans the measurement). ``clock="cpu_norm"`` with
    ``probes`` (``{allocator: SpeedProbe}``) and ``probe_ref_s`` (``{allocator: seconds}``): each run on
    the engine's ``cpu_norm`` clock (thread CPU time × reference ÷ median of the last probes, as a
    replay), so the residual is at the probe's reference speed; ``prefill_probes`` and
    ``prefill_probe_ref_s`` (same keys, optional): the engine's prefill probe as in a replay. ``net``: a
    :class:`~calibration.engine.Transformer` of ``model`` to reuse (else one is drawn with ``seed``).
    ``kernels``: the paged layout's attention backend (as the engine's ``EngineConfig.kernels``).
    Returns ``{allocator: fit}`` (each with its rows).
    """
    if clock not in ("cpu", "wall", "cpu_norm"):
        raise ValueError("clock: cpu, cpu_norm or wall")
    if clock == "cpu_norm" and (not probes or not probe_ref_s):
        raise ValueError("clock='cpu_norm' needs probes and probe_ref_s per allocator")
    if not mixes or any(m not in OVERHEAD_MIXES for m in mixes):
        raise ValueError(f"mixes: one or more of {', '.join(OVERHEAD_MIXES)}; got {mixes!r}")
    from .engine import Engine, EngineConfig, Transformer

    profiles = profile if isinstance(profile, dict) else {a: profile for a in allocators}
    costs = {a: kernel_cost(profiles[a], model, a, block_size) for a in allocators}
    net = net if net is not None else Transformer(model, dtype, device, seed)
    rng = random.Random(seed)
    rows: dict[str, list] = {a: [] for a in allocators}
    probe_log: dict[str, list] = {a: [] for a in allocators}
    t0 = time.perf_counter()
    for p, b, mix in itertools.product(range(passes), batches, mixes):
        if mix == "offline":
            trace = [(0.0, rng.randint(*prompt_range), output_tokens) for _ in range(b)]
            longest = prompt_range[1] + output_tokens
        else:
            trace = [(0.0, rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(b + max(1, b // 2))]
            longest = prompt_range[1] + output_range[1]
        for a in allocators:
            cfg = EngineConfig(model, num_blocks=b * -(-longest // block_size) + 1, block_size=block_size,
                               max_num_seqs=b, max_num_batched_tokens=max_num_batched_tokens, allocator=a,
                               reserve=longest, max_model_len=longest, dtype=dtype, threads=threads, seed=seed,
                               device=device, kernels=kernels)
            if clock == "cpu_norm":
                pre = ({"prefill_probe": prefill_probes[a], "prefill_probe_ref_s": prefill_probe_ref_s[a]}
                       if prefill_probes and prefill_probe_ref_s else {})
                res = Engine(cfg, model=net).run(trace, clock="cpu_norm", probe=probes[a],
                                                 probe_ref_s=probe_ref_s[a], **pre)
                probe_log[a] += res.info["speed_probes"]
            else:
                res = Engine(cfg, model=net).run(trace, clock="wall", lead_s=0.0)
            its = engine_iteration_rows(res, costs[a])
            for r, since in zip(its, decode_since_prefill(its)):
                if r["iteration"] == 0:
                    continue  # the first iteration of a run warms caches
                r["residual_s"] = row_time_s(r, clock) - r["predicted_s"]
                r.update(batch=b, pass_=p, run=f"{p}/{b}/{mix}", since_prefill=since, mix=mix)
                rows[a].append(r)
            if between_runs is not None:
                between_runs()
    elapsed = round(time.perf_counter() - t0, 2)
    meta = {"block_size": block_size, "dtype": dtype, "threads": threads, "clock": clock, "elapsed_s": elapsed,
            "passes": passes, "batches": list(batches), "prompt_range": list(prompt_range),
            "output_tokens": output_tokens, "mixes": list(mixes),
            **({"output_range": list(output_range)} if "queued" in mixes else {})}
    out = {a: {**_fit_overhead(rows[a], clock), "allocator": a, **meta} for a in allocators}
    for a in allocators:
        if probe_log[a]:
            out[a]["speed_probes"] = probe_log[a]
            out[a]["probe_ref_s"] = float(probe_ref_s[a])
    return out


#: decode iterations right after an iteration with a prefill chunk that run slower than the steady
#: state (cache and allocator state after a prefill's large activations). Measured on this 2-vCPU
#: host, one sequence, paged, 64 outputs, thread CPU time: the 1st to 5th decode iteration after the
#: prefill 2.87 / 2.93 / 2.63 / 2.59 / 2.44 ms, the 6th on 2.28 ms; in the validation replays the
#: first decode iterations after a mixed one ran 5–12 % above the model, the later ones 1–10 % below.
AFTER_PREFILL = 5


#: how the overhead fit summarises the residuals of a group of iterations (``_fit_overhead``)
FIT_CENTERS = ("trimmed", "median", "mean")


#: the fewest values a ``trimmed`` centre trims (5 % off each end of 20 is one value)
TRIM_MIN = 20


#: the fewest steady-state decode iterations at one sequence count for the overhead fit to measure
#: that count's departure from its line (``_fit_overhead``'s ``by_seqs``)
BY_SEQS_MIN = 20


def step_overhead_s(fit: dict, seqs) -> np.ndarray:
    """The overhead fit's seconds per iteration of ``seqs`` sequences before its per-prefill-token part:
    ``intercept_s + per_seq_s·S``, plus ``per_seq_delta_s`` interpolated between its measured counts
    (nothing beyond them), as ``sim.cost.profile.ProfileCostModel`` charges it."""
    S = np.asarray(seqs, dtype=np.float64)
    out = fit["intercept_s"] + fit["per_seq_s"] * S
    delta = fit.get("per_seq_delta_s") or {}
    xs, ys = delta.get("seqs") or [], delta.get("delta_s") or []
    if xs:
        inside = (S >= xs[0]) & (S <= xs[-1])
        out = out + np.where(inside, np.interp(S, xs, ys), 0.0)
    return out


def _untrimmed(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` between its 5th and 95th percentiles (a mask)."""
    lo, hi = np.percentile(x, [5, 95])
    return (x >= lo) & (x <= hi)


def _center(x: np.ndarray, how: str) -> float:
    """``trimmed``: the mean of the values between their 5th and 95th percentiles (the median of
    fewer than :data:`TRIM_MIN` values, too few to trim); ``median``; ``mean``."""
    if how == "median" or (how == "trimmed" and len(x) < TRIM_MIN):
        return float(np.median(x))
    if how == "mean":
        return float(np.mean(x))
    return float(np.mean(x[_untrimmed(x)]))


def _fit_overhead(rows: list[dict], clock: str, *, steady: bool = True, after_prefill: bool = True,
                  center: str = "trimmed", by_seqs: bool = True, mixed_decode: bool = True) -> dict:
    """Fit the engine's overhead ``a + b·S + c·P`` to its calibration rows (``residual_s`` = iteration
    time minus the kernel curves' prediction), and the after-prefill excess of decode iterations.

    * ``center``: how a group of residuals is summarised. ``trimmed`` (default): the mean of those
      between their 5th and 95th percentiles. A replay's busy time is a *sum* of iteration times, so
      the fit must price the mean iteration, and iteration times are skewed right (a median sits
      below the mean); the trim keeps a shared host's slow episodes out. ``median`` (the earlier
      fit) left the simulator 2.2 % fast on average; refitted on the same replays of
      eleven full runs, ``trimmed`` put 376 against 374 of 396 cells within 10 %, mean RMS error
      4.7 against 5.1 % (``mean``: 376, 4.8 %), and on two fresh runs 35 and 29 against 34 and 29
      of 36 (docs/validation.md, "The fit's centre").
    * ``a + b·S``: non-negative least squares on the centre of the residuals of **steady-state**
      pure-decode iterations per ``S`` (more than :data:`AFTER_PREFILL` decode iterations after the
      run's last iteration with a prefill chunk; all pure-decode rows where too few), weighted by the
      square root of their count ÷ the median iteration time at ``S`` (relative error, what latencies
      are compared in).
    * ``c`` per prefill token: what iterations with prefill leave after ``a + b·S``, summed over
      them ÷ their prefill tokens (``trimmed``: without the 5 % highest and lowest per token;
      ``median``: the median per token).
    * ``after_prefill_s`` (with ``steady`` and ``after_prefill``): for ``k`` = 1 … :data:`AFTER_PREFILL`,
      the centre of the excess over ``a + b·S`` of the pure-decode iterations ``k`` after the last
      iteration with prefill (never below 0; trailing zeros dropped). The simulator adds it to those decode
      iterations (``CostModel.after_prefill_s``), the engine's virtual clock too. Without it the
      steady-state fit prices them 5–15 % low; with it, on the same replays (six full runs), 204
      against 188 of 216 cells came within 10 % (docs/validation.md).
    * ``steady=False``: ``a + b·S`` from every pure-decode iteration (an earlier fit), which
      averages the after-prefill excess into ``a`` and ``b`` (so no ``after_prefill_s``).
    * ``by_seqs``: also each sequence count's departure from ``a + b·S`` (``per_seq_delta_s``: the centre
      of its steady-state residuals minus the line, at counts with at least :data:`BY_SEQS_MIN` of them),
      which the simulator interpolates between those counts; ``c`` and ``after_prefill_s`` are then
      measured against the line with its departures (:func:`step_overhead_s`).
    * ``mixed_decode``: the iterations with prefill are fitted ``c·P + g·D`` (``D`` decoding sequences in
      them; ``mixed_per_decode_s`` = ``g``), non-negative least squares weighted by ``1/P`` (which, with
      ``g`` = 0, is the sum ratio above), on the same rows the trim keeps: what a decoding sequence
      costs in an iteration with prefill beyond what it costs in a pure decode iteration.
    """
    from scipy.optimize import nnls
    if center not in FIT_CENTERS:
        raise ValueError(f"center: one of {', '.join(FIT_CENTERS)}; got {center!r}")
    S = np.array([r["seqs"] for r in rows], dtype=float)
    T = np.array([r["tokens"] for r in rows], dtype=float)
    R = np.array([r["residual_s"] for r in rows])
    xs = np.array(sorted(set(S.tolist())))
    med = np.array([np.median(R[S == x]) for x in xs])
    dec = np.array([r["pure_decode"] for r in rows])
    since = np.array([r.get("since_prefill", 1 << 30) for r in rows])
    meas_t = np.array([row_time_s(r, clock) for r in rows])
    late = dec & (since > AFTER_PREFILL)
    steady = steady and late.sum() >= 10  # else too few steady-state rows: every decode row
    sel = late if steady else (dec if dec.any() else np.ones(len(rows), dtype=bool))
    xd = np.array(sorted(set(S[sel].tolist())))
    md = np.array([_center(R[sel & (S == x)], center) for x in xd])
    w = np.array([math.sqrt(np.sum(sel & (S == x))) / np.median(meas_t[sel & (S == x)]) for x in xd])
    (a, b_), _ = nnls(np.column_stack([np.ones_like(xd), xd]) * w[:, None], md * w)
    line = {"intercept_s": float(a), "per_seq_s": float(b_)}
    if by_seqs:
        keep_x = [i for i, x in enumerate(xd) if np.sum(sel & (S == x)) >= BY_SEQS_MIN]
        line["per_seq_delta_s"] = {"seqs": [int(xd[i]) for i in keep_x],
                                   "delta_s": [float(md[i] - a - b_ * xd[i]) for i in keep_x]}
    base = step_overhead_s(line, S)
    mixed = ~dec & (T > S)
    D = np.array([r.get("decode_seqs", 0) for r in rows], dtype=float)
    c_, g_ = 0.0, 0.0
    if mixed.any():
        rr, pp = R[mixed] - base[mixed], T[mixed] - S[mixed]
        if center == "median":
            c_ = float(max(0.0, np.median(rr / pp)))
        else:  # what the mixed iterations leave in all, per prefill token (trimmed: per-token outliers out)
            trim = center == "trimmed" and len(rr) >= TRIM_MIN
            keep = _untrimmed(rr / pp) if trim else np.ones(len(rr), dtype=bool)
            if mixed_decode:
                wt = 1.0 / np.sqrt(pp[keep])
                (c_, g_), _ = nnls(np.column_stack([pp[keep], D[mixed][keep]]) * wt[:, None], rr[keep] * wt)
                c_, g_ = float(c_), float(g_)
            else:
                c_ = float(max(0.0, rr[keep].sum() / pp[keep].sum()))
    after_s: list[float] = []
    after_n: list[int] = []
    if steady and after_prefill:
        for k in range(1, AFTER_PREFILL + 1):
            m = dec & (since == k)
            after_n.append(int(m.sum()))
            after_s.append(float(max(0.0, _center(R[m] - base[m], center))) if m.sum() >= 5 else 0.0)
        after_s = [x if x >= 1e-7 else 0.0 for x in after_s]  # below 0.1 us: float noise, not excess
        while after_s and after_s[-1] == 0.0:
            after_s.pop()
    pred = base + c_ * (T - S) + g_ * np.where(mixed, D, 0.0)
    if after_s:  # the decode iterations' excess, as the simulator charges it
        pred = pred + np.array([after_s[int(k) - 1] if d and 1 <= k <= len(after_s) else 0.0 for d, k in zip(dec, since)])
    meas = meas_t
    kern = np.array([r["predicted_s"] for r in rows])
    wall = np.array([r["measured_s"] for r in rows])
    err = np.abs(kern + pred - meas) / meas
    return {**line, "per_token_s": c_, "mixed_per_decode_s": g_,
            "after_prefill_s": after_s, "after_prefill_samples": after_n,
            "steady_decode_iterations": int(sel.sum()),
            "batch_range": [int(xs.min()), int(xs.max())], "tokens_range": [int(T.min()), int(T.max())],
            "cpu_over_wall": round(float(np.sum([r["cpu_s"] for r in rows]) / wall.sum()), 4),
            "iterations": len(rows), "median_by_seqs": {str(int(x)): float(m) for x, m in zip(xs, med)},
            # steady pure decode per S: iterations, median measured, median predicted (kernels + this fit), seconds
            "decode_by_seqs": {str(int(x)): [int(np.sum(sel & (S == x))),
                                             float(np.median(meas_t[sel & (S == x)])),
                                             float(np.median((kern + base)[sel & (S == x)]))] for x in xd},
            "fit_median_rel_err": round(float(np.median(err)), 4),
            "fit_p90_rel_err": round(float(np.percentile(err, 90)), 4),
            "residual_share_median": round(float(np.median(pred / meas)), 4), "rows": rows}


def with_engine_overhead(profile: Profile, overhead: dict, model: ModelSpec) -> Profile:
    """``profile`` whose CPU-side step term is the reference engine's measured overhead (``measure_engine_overhead``).

    The per-prefill-token part ``c·P`` is charged through the profile's only per-token
    channel, the elementwise term (``layers × bytes per token / bandwidth``, every token
    computed): its bandwidth is lowered so that channel grows by exactly ``c`` per token, and
    ``cpu_overhead`` becomes ``a + (b − c)·S`` (a decode sequence is one token), so a step
    costs ``a + b·S + c·(T − S) = a + b·S + c·P`` on top of the kernels. The fit's
    ``after_prefill_s`` goes into ``cpu_overhead`` as is (see ``sim.cost.model.CostModel``).
    """
    import copy

    from sim.catalog import GPUS
    from sim.cost.profile import ProfileCostModel
    p = copy.deepcopy(profile)
    c = float(overhead.get("per_token_s", 0.0))
    if c > 0:
        kd = p.dtypes["weight"][0]
        cm = ProfileCostModel(p, model, GPUS["cpu"], weight_dtype=kd, kv_dtype=kd)
        old = cm._ew_per_token * model.layers  # seconds per token through the elementwise channel
        ew = dict(p.elementwise)
        ew["kernel_route_bandwidth_bytes_per_s"] = ew["bandwidth_bytes_per_s"]
        ew["bandwidth_bytes_per_s"] = float(ew["bandwidth_bytes_per_s"]) * old / (old + c)
        ew["engine_per_token_s"] = c
        ew["source"] = (ew.get("source", "") + "; bandwidth lowered to include the reference engine's measured "
                        f"per-token framework cost ({c * 1e6:.2f} us/token, measure_engine_overhead)")
        p.elementwise = ew
    kernel_route = p.cpu_overhead.get("by_tp", {}).get("1")
    p.cpu_overhead = {
        "by_tp": {"1": {"intercept_s": overhead["intercept_s"],
                        "per_seq_s": max(overhead["per_seq_s"] - float(overhead.get("per_token_s", 0.0)), 0.0),
                        "batch_range": overhead["batch_range"], "fit_median_rel_err": overhead["fit_median_rel_err"],
                        "fit_p90_rel_err": overhead["fit_p90_rel_err"],
                        **({"after_prefill_s": [float(x) for x in overhead["after_prefill_s"]]}
                           if overhead.get("after_prefill_s") else {}),
                        **({"per_seq_delta_s": overhead["per_seq_delta_s"]}
                           if (overhead.get("per_seq_delta_s") or {}).get("seqs") else {}),
                        **({"mixed_per_decode_s": float(overhead["mixed_per_decode_s"])}
                           if overhead.get("mixed_per_decode_s") else {})}},
        "parts": ["the reference engine's whole iteration beyond the profile's kernels: scheduling, block tables, "
                  "metadata tensors, norms/RoPE/cache writes/masks/views, sampling, bookkeeping"],
        "source": f"measured: calibration.engine offline runs ({overhead['allocator']} cache, block "
                  f"{overhead['block_size']}, {overhead['dtype']}, {overhead['threads']} thread(s)), iteration "
                  f"{ {'cpu': 'thread CPU', 'cpu_norm': 'thread CPU (x probe reference / host speed)'}.get(overhead.get('clock'), 'wall')} time "
                  "minus the kernel curves' prediction for the same batch shape, per sequence count, fitted a + b x "
                  "sequences plus each well-measured count's departure from that line (per_seq_delta_s; "
                  "kvsim.calibration.kernels.measure_engine_overhead)",
        "median_by_seqs": overhead["median_by_seqs"], "kernel_route_step_cpu": kernel_route,
        "note": "host-side and framework work per step, not overlapped with kernels (CPU: same thread)"}
    p.provenance = {**p.provenance, "engine_overhead": {k: v for k, v in overhead.items()
                                                        if k not in ("rows", "speed_probes")}}
    return p
