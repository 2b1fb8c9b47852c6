"""How one point is timed on a device: :class:`Bench` builds each kernel's timed closures and
times them (seconds per call, a :class:`Timing`).

torch is imported here only, and lazily (:func:`import_torch`): the simulator never needs it.

Timing: warm-up calls, then ``repeats`` timed repeats of ``inner`` calls each (``inner``
chosen so a repeat lasts about ``target_repeat_s``), median of the per-call means; on CUDA
each repeat is bracketed by CUDA events and synchronised (:mod:`calibration.devices`); inputs rotate over several
distinct buffers (enough to exceed the last-level cache that can reasonably be flushed:
32 MiB on CPU, 128 MiB on CUDA) so a cached operand is not what is measured. CPU timings
use one thread by default (``torch.set_num_threads``), restored afterwards.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.errors import ConfigError

from .. import attention_backends as AB
from ..devices import Device, open_device
from .plan import REFERENCE_BLOCK_SIZE

DEVICES = ("cpu", "cuda")
#: Bytes of distinct operands cycled per measurement (about the flushable cache).
ROTATE_BYTES = {"cpu": 8 << 20, "cuda": 128 << 20}
MAX_ROTATIONS = 8

#: The ``--dtype`` names the kernels are timed in, each with its torch dtype's attribute name.
TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def import_torch():
    """torch, or a ConfigError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "calibrate.device",
            "torch",
            "torch installed for the --device route: pip install torch==2.13.0 (CPU wheel) or a CUDA build",
        ) from None
    # torch prefers cuDNN's SDPA on Hopper, and cuDNN builds an execution plan for every new shape: the
    # reference engine's padded decode and prefill chunks change shape nearly every iteration, so they paid
    # that build again and again while the timed kernels (warmed on a fixed grid) did not. Flash and
    # memory-efficient SDPA run any shape with no per-shape build (python -m bench.engine_profile --cudnn-sdpa).
    torch.backends.cuda.enable_cudnn_sdp(False)
    return torch


def check_device(device: str, key: str = "calibrate.device"):
    """The ``torch.device`` for ``--device``, or a ConfigError naming what is wrong (under ``key``: the
    command whose --device it is)."""
    if device not in DEVICES:
        raise ConfigError(key, device, f"one of {', '.join(DEVICES)}")
    torch = import_torch()
    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(
            key,
            device,
            f"a CUDA device (torch {torch.__version__}: {why}); use --device cpu on this machine",
        )
    return torch.device(device)


#: A point's timed closures and the factor from seconds per call to the reported unit.
Setup = tuple  # (list[Callable[[], object]], float)
#: Elements of the pre-generated random pool operands are cut from.
POOL_ELEMS = 1 << 23
#: Timed work per point and pass above which repeats are cut (never below 3).
MAX_POINT_S = 0.15


def rotations(set_bytes: float, rotate_bytes: float) -> int:
    """Distinct operand sets of ``set_bytes`` each to cycle so their total exceeds ``rotate_bytes``
    (the flushable cache, bytes): 1 for a set at least that large, else 2 to :data:`MAX_ROTATIONS`."""
    if set_bytes >= rotate_bytes:
        return 1
    return int(min(MAX_ROTATIONS, max(2, math.ceil(rotate_bytes / max(set_bytes, 1.0)))))


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

    def __init__(
        self,
        torch,
        device,
        dtype: str,
        *,
        repeats: int = 5,
        warmup: int = 2,
        target_repeat_s: float = 0.002,
        threads: int | None = None,
        seed: int = 0,
        ops: Device | None = None,
        kernels: AB.AttentionBackend | None = None,
    ):
        self.torch, self.device, self.dtype_name = torch, device, dtype
        self.dtype = getattr(torch, TORCH_DTYPES[dtype])
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
    def open(
        cls,
        device: str,
        dtype: str = "bf16",
        *,
        ops: Device | None = None,
        kernels: str = "auto",
        registry: dict | None = None,
        **kw,
    ) -> Bench:
        """A Bench on ``device`` (``ops``: a stand-in device, whose tensors live where it says and whose
        ``kind`` replaces ``device``) timing the ``kernels`` attention backend (``auto``: see
        :func:`calibration.attention_backends.select`; ``registry``: a stand-in set of backends)."""
        if dtype not in TORCH_DTYPES:
            raise ConfigError(
                "calibrate.dtype",
                dtype,
                f"one of {', '.join(TORCH_DTYPES)} on the --device route (fp8 kernels are not timed)",
            )
        torch = import_torch()
        dev = ops.tensor_device if ops is not None else check_device(device)
        kind = ops.kind if ops is not None else dev.type
        backend = AB.make(kernels, torch, dev, device_kind=kind, registry=registry)
        why = backend.dtype_problem(getattr(torch, TORCH_DTYPES[dtype]))
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
        return pool[off : off + numel].clone().view(*shape)

    def rotations(self, set_bytes: float) -> int:
        """Distinct operand sets to cycle so their total exceeds the flushable cache (:func:`rotations`)."""
        return rotations(set_bytes, self.rotate_bytes)

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

    def measure(self, setups: list[Callable[[], Setup]], passes: int = 1, on_done=None) -> list[Timing]:
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
                # One stamp per sample: a pass's sample count follows its own estimate (``samples``
                # caps long kernels), so passes of one point need not be equally long.
                stamps[i] += [time.perf_counter()] * len(got)
                info[i] = (inner, len(calls), scale)
                del calls
                if on_done is not None:
                    on_done(i)
        if speed is not None:  # every sample at the reference speed: x reference / the host's speed then
            speed.tick(force=True)
            for i, a in enumerate(acc):
                acc[i] = [x * speed.factor_at(t) for x, t in zip(a, stamps[i])]
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

    def context_calls(
        self,
        batch: int,
        length: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        kernels: AB.AttentionBackend | None = None,
    ) -> Setup:
        """Causal prefill attention of ``batch`` prompts of ``length`` tokens, by the attention backend
        (``kernels``, default the Bench's: :meth:`~calibration.attention_backends.AttentionBackend.prefill_calls`)."""
        be = kernels or self.kernels
        nb = self.rotations(batch * length * head_dim * (2 * heads + 2 * kv_heads) * self.elem)
        return be.prefill_calls(
            self.randn, self.rng.randrange(1 << 30), nb, batch, length, heads, kv_heads, head_dim, dtype=self.dtype
        ), 1.0

    def decode_calls(
        self, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, block_size: int | None = None
    ) -> Setup:
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
            return be.decode_contiguous_calls(
                self.randn, nb, batch, kv_len, heads, kv_heads, head_dim, dtype=self.dtype
            ), 1.0
        return be.decode_paged_calls(
            self.randn,
            self.rng.randrange(1 << 30),
            nb,
            batch,
            kv_len,
            heads,
            kv_heads,
            head_dim,
            block_size,
            dtype=self.dtype,
        ), 1.0

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
        from ..engine import chunk_attention

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
            return torch.cat(
                [
                    chunk_attention(q[i : i + 1], k[i * L : (i + 1) * L], v[i * L : (i + 1) * L], L - 1)
                    for i in range(batch)
                ],
                0,
            )

        return [lambda q=q, k=k, v=v: call(q, k, v) for q, k, v in sets], 1.0

    def _elems(self, nbytes: int) -> int:
        return max(1, int(nbytes) // self.elem)

    def zero_fill_calls(self, nbytes: int) -> Setup:
        bufs = [
            self.torch.empty(self._elems(nbytes), dtype=self.dtype, device=self.device)
            for _ in range(self.rotations(nbytes))
        ]
        return [b.zero_ for b in bufs], 1.0

    def copy_calls(self, nbytes: int) -> Setup:
        """Device-to-device ``dst.copy_(src)`` of ``nbytes`` (bytes copied, read once and written once)."""
        nb = self.rotations(2 * nbytes)
        pairs = [
            (
                self.torch.empty(self._elems(nbytes), dtype=self.dtype, device=self.device),
                self.randn(self._elems(nbytes)),
            )
            for _ in range(nb)
        ]
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

    def alloc_events_calls(
        self, events: int = 256, block_size: int = REFERENCE_BLOCK_SIZE, blocks_per_row: int = 8
    ) -> Setup:
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
                table[r, : len(row)] = torch.tensor(row, dtype=torch.int32)

        return [allocate], 1.0 / (rows * blocks_per_row)

    def step_cpu_calls(
        self, batch: int, vocab: int, block_size: int = REFERENCE_BLOCK_SIZE, max_blocks: int = 64
    ) -> Setup:
        """Host-side work of one decode step for ``batch`` sequences.

        Schedule (walk the running sequences, grow a block when a block boundary is reached),
        prepare inputs (token ids, positions, slot mapping, padded block tables → device
        tensors), sample (argmax over ``[batch, vocab]`` logits, tokens back to the host),
        process outputs (append tokens, stop checks).
        """
        torch = self.torch
        rng = random.Random(batch)
        seqs = []
        for _ in range(batch):
            length = rng.randrange(1, block_size * (max_blocks - 1))
            seqs.append(
                {
                    "tokens": [rng.randrange(vocab) for _ in range(4)],
                    "len": length,
                    "blocks": [rng.randrange(1 << 20) for _ in range(length // block_size + 1)],
                }
            )
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


def describe_device(bench: Bench) -> dict:
    """The device's description for the profile's provenance (:meth:`calibration.devices.Device.describe`)."""
    return bench.ops.describe(bench.dtype_name, bench.threads)
