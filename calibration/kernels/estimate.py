"""How long a calibration run will take, said before it starts.

Each planned point carries the :class:`Work` of one call (floating-point operations, bytes moved,
host-side torch calls, the bytes of one operand set). A short probe (:func:`probe_rates`, well under
a second) measures this device's rates: a GEMM's FLOP/s, a causal attention's FLOP/s, a large copy's
bytes/s, the host cost of one small torch call and the fill rate of fresh random operands. One
call's seconds are the host cost plus the slower of compute and memory (a roofline over measured
rates); :func:`estimate_run` then does the arithmetic :meth:`~calibration.kernels.timing.Bench.samples`
does with it (warm-up over every rotated operand set, one estimating call, ``repeats`` repeats of
``inner`` calls, the :data:`~calibration.kernels.timing.MAX_POINT_S` cap), adds building the operand
sets, and sums over points and passes.

The estimate covers the timing, not the fit and the report written after it (seconds).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .plan import Plan
from .timing import MAX_POINT_S, POOL_ELEMS, rotations

#: Above this many minutes the estimate line is followed by a warning and ways to shorten the run.
LONG_RUN_MIN = 30.0
#: Host seconds per point and pass outside its kernel calls (building closures, bookkeeping, progress),
#: measured on tiny-llama ``--quick`` on a CPU, where the kernel calls themselves are short.
POINT_OVERHEAD_S = 2.5e-3


@dataclass(frozen=True)
class Work:
    """What one call of a planned point does.

    ``flops``: floating-point operations; ``nbytes``: bytes the kernel reads plus writes (the slower of
    compute and memory counts); ``ops``: small torch calls or Python steps the host issues besides
    (each :attr:`Rates.op_s`); ``compute``: which measured rate applies (``gemm``, ``prefill``,
    ``decode``, or ``""`` for none); ``kernels``: attention kernels launched (each
    :attr:`Rates.prefill_call_s` or :attr:`Rates.decode_call_s`); ``copy_bytes``: bytes moved by
    separate copies before the kernel (a gather); ``set_bytes``: bytes of one operand set (how many
    sets are rotated, and what building them costs); ``fresh``: an operand is too large for the random
    pool, so its values are generated anew (at :attr:`Rates.fill_bytes_per_s`), not copied out of it.
    """

    flops: float = 0.0
    nbytes: float = 0.0
    ops: int = 1
    compute: str = ""
    set_bytes: float = 0.0
    fresh: bool = False
    kernels: int = 0
    copy_bytes: float = 0.0

    @classmethod
    def gemm(cls, m: int, n: int, k: int, elem: int) -> Work:
        """``F.linear`` of an (m×k) activation by an (n×k) weight (``elem`` bytes an element)."""
        nbytes = float((m * k + n * k + m * n) * elem)
        return cls(2.0 * m * n * k, nbytes, 1, "gemm", nbytes, max(m * k, n * k) > POOL_ELEMS // 2)

    @classmethod
    def prefill(cls, batch: int, length: int, heads: int, kv_heads: int, head_dim: int, elem: int) -> Work:
        """Causal attention of ``batch`` prompts of ``length`` tokens (half the full QKᵀ and PV products)."""
        nbytes = float(batch * length * head_dim * (2 * heads + 2 * kv_heads) * elem)
        flops = 2.0 * batch * heads * length * length * head_dim
        fresh = batch * length * heads * head_dim > POOL_ELEMS // 2
        return cls(flops, nbytes, 0, "prefill", nbytes, fresh, kernels=1)

    @classmethod
    def decode(
        cls,
        batch: int,
        kv_len: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        elem: int,
        *,
        kernels: int = 1,
        ops: int = 0,
        gathered: bool = False,
    ) -> Work:
        """One query token per sequence over ``kv_len`` cached tokens, in ``kernels`` attention calls with
        ``ops`` small torch calls besides; ``gathered``: the KV is first copied out of the paged pool."""
        kv = 2.0 * batch * kv_len * kv_heads * head_dim * elem
        flops = 4.0 * batch * heads * kv_len * head_dim
        fresh = batch * kv_len * kv_heads * head_dim > POOL_ELEMS // 2
        set_bytes = kv + batch * heads * head_dim * elem
        return cls(flops, kv, ops, "decode", set_bytes, fresh, kernels, 2 * kv if gathered else 0.0)

    @classmethod
    def stream(cls, nbytes: float, set_bytes: float | None = None, fresh: bool = False) -> Work:
        """A memory-bound call moving ``nbytes`` (read plus written) over operand sets of ``set_bytes``
        (default ``nbytes``); ``fresh`` as in :class:`Work`."""
        return cls(0.0, float(nbytes), 1, "", float(nbytes if set_bytes is None else set_bytes), fresh)

    @classmethod
    def host(cls, ops: int, nbytes: float = 0.0) -> Work:
        """Host-side Python work worth ``ops`` small torch calls, touching ``nbytes``."""
        return cls(0.0, float(nbytes), ops, "", float(nbytes))


@dataclass(frozen=True)
class Rates:
    """A device's measured speeds (per second) and the host cost of one small torch call (seconds)."""

    gemm_flops_per_s: float
    bytes_per_s: float
    op_s: float
    fill_bytes_per_s: float
    #: causal prefill attention at the model's heads: FLOP/s, and seconds per kernel call besides
    prefill_flops_per_s: float
    prefill_call_s: float
    #: decode attention (one query token) at the model's heads: FLOP/s, and seconds per kernel call besides
    decode_flops_per_s: float
    decode_call_s: float

    def call_s(self, w: Work) -> float:
        """Seconds of one call of ``w``: host calls and kernel launches, any copy before the kernel, then
        the slower of its compute and its memory traffic."""
        rate, launch = {
            "gemm": (self.gemm_flops_per_s, 0.0),
            "prefill": (self.prefill_flops_per_s, self.prefill_call_s),
            "decode": (self.decode_flops_per_s, self.decode_call_s),
        }.get(w.compute, (0.0, 0.0))
        compute = w.flops / rate if rate else 0.0
        host = w.ops * self.op_s + w.kernels * launch
        return host + w.copy_bytes / self.bytes_per_s + max(compute, w.nbytes / self.bytes_per_s)


@dataclass(frozen=True)
class Estimate:
    """A run's planned size and expected timing seconds (``seconds``; fit and report not included)."""

    points: int
    passes: int
    seconds: float

    @property
    def long(self) -> bool:
        """Over :data:`LONG_RUN_MIN` minutes."""
        return self.seconds > LONG_RUN_MIN * 60

    def lines(self, *, device: str, quick: bool) -> list[str]:
        """The announcement: one line, and when the run is long a second saying how to shorten it."""
        out = [
            f"calibrate: {self.points} points × {self.passes} passes; estimated timing {format_duration(self.seconds)} "
            "(from a probe of this device's rates; the fit and report follow)"
        ]
        if self.long:
            ways = [] if quick else ["--quick (a coarser grid)"]
            if device == "cpu":
                ways.append("--threads N (CPU kernels run on 1 thread by default)")
            ways += ["a smaller model (its kernel shapes set each point's cost)", "--device cuda on a GPU host"]
            out.append(
                f"calibrate: warning: over {LONG_RUN_MIN:.0f} min; proceeding. To shorten it: " + "; ".join(ways)
            )
        return out


def format_duration(seconds: float) -> str:
    """``seconds`` as ``12 s``, ``7.5 min`` or ``3.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def point_s(w: Work, rates: Rates, plan: Plan, rotate_bytes: float) -> float:
    """Seconds one pass over one point takes: building its operand sets, then what
    :meth:`~calibration.kernels.timing.Bench.samples` runs (warm-up over every set, one estimating
    call, ``repeats`` repeats of ``inner`` calls, cut to keep a repeat series near ``MAX_POINT_S``)."""
    call = max(rates.call_s(w), 1e-7)
    sets = rotations(w.set_bytes, rotate_bytes)
    build = sets * w.set_bytes / (rates.fill_bytes_per_s if w.fresh else rates.bytes_per_s / 2)
    inner = int(max(1, min(2000, round(plan.target_repeat_s / call))))
    repeats = int(max(3, min(plan.repeats, MAX_POINT_S // (call * inner) or 3)))
    return POINT_OVERHEAD_S + build + (max(plan.warmup, sets) + 1 + repeats * inner) * call


def estimate_run(works: list[Work], plan: Plan, rates: Rates, rotate_bytes: float) -> Estimate:
    """The run's :class:`Estimate`: every point's :func:`point_s` times ``plan.passes``."""
    passes = max(1, plan.passes)
    return Estimate(len(works), passes, passes * sum(point_s(w, rates, plan, rotate_bytes) for w in works))


def probe_rates(bench, heads: int, kv_heads: int, head_dim: int) -> Rates:
    """This device's :class:`Rates` from a few short kernels (under a second on a CPU), attention at the
    model's ``heads``, ``kv_heads`` and ``head_dim`` through torch's SDPA.

    The probe's operands come from its own generator, so the points timed afterwards draw the same
    random operands and block tables as a run without it."""
    torch, dev, dtype = bench.torch, bench.device, bench.dtype
    F = torch.nn.functional
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    gqa = {"enable_gqa": True} if heads != kv_heads else {}

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=dtype)

    def best_s(fn, calls: int = 2) -> float:
        """Seconds per call of ``fn``: the fastest of three runs of ``calls`` calls, after one warm call."""
        fn()
        bench.sync()
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            bench.sync()
            best = min(best, (time.perf_counter() - t0) / calls)
        return max(best, 1e-9)

    def line(points: list[tuple[float, float]]) -> tuple[float, float]:
        """(work per second, seconds per call besides) through two (work, seconds) points."""
        (w1, t1), (w2, t2) = points
        rate = (w2 - w1) / (t2 - t1) if t2 > t1 else w2 / t2
        return rate, max(0.0, t1 - w1 / rate)

    def prefill(s: int) -> tuple[float, float]:
        q, k, v = randn(1, heads, s, head_dim), randn(1, kv_heads, s, head_dim), randn(1, kv_heads, s, head_dim)
        return 2.0 * heads * s * s * head_dim, best_s(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        )

    def decode(b: int, n: int) -> tuple[float, float]:
        q, k, v = randn(b, heads, 1, head_dim), randn(b, kv_heads, n, head_dim), randn(b, kv_heads, n, head_dim)
        return 4.0 * b * heads * n * head_dim, best_s(lambda: F.scaled_dot_product_attention(q, k, v, **gqa))

    small = randn(64)
    op_s = best_s(lambda: small.add_(1.0), 100)
    x, w = randn(256, 1024), randn(1024, 1024)
    gemm = best_s(lambda: F.linear(x, w))
    n = (32 << 20) // bench.elem
    src, dst = randn(n), torch.empty(n, dtype=dtype, device=dev)
    copy = best_s(lambda: dst.copy_(src))
    fill = best_s(lambda: randn(1 << 20))
    # sized by the model's heads so a large model's probe costs what a small one's does (about 2.7e8 FLOP)
    s_big = max(64, int(math.sqrt(2.7e8 / (2 * heads * head_dim))))
    n_big = max(256, (4 << 20) // (2 * kv_heads * head_dim * bench.elem))
    prefill_rate, prefill_call = line([prefill(s_big // 4), prefill(s_big)])
    decode_rate, decode_call = line([decode(1, n_big // 16), decode(4, n_big // 4)])
    return Rates(
        gemm_flops_per_s=2.0 * 256 * 1024 * 1024 / max(gemm - op_s, 1e-9),
        bytes_per_s=2.0 * n * bench.elem / max(copy - op_s, 1e-9),
        op_s=op_s,
        fill_bytes_per_s=(1 << 20) * bench.elem / max(fill - op_s, 1e-9),
        prefill_flops_per_s=prefill_rate,
        prefill_call_s=prefill_call,
        decode_flops_per_s=decode_rate,
        decode_call_s=decode_call,
    )
