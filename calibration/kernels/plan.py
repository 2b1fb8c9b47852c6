"""What one ``kvsim calibrate --device`` run times: the grids of a :class:`Plan`, sized per device.

A plan fixes the GEMM token counts, the prefill (batch, prompt length) and decode (batch, KV
length) grids, the paged block sizes whose overhead against a contiguous cache is measured,
the memory-operation sizes and the timing effort (repeats, warm-up, passes).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog import ModelSpec

#: Decode-attention curve stored in the profile: the paged kernel at this block size.
REFERENCE_BLOCK_SIZE = 16
#: the ``kernel`` of the static layout's prefill rows (SDPA, timed when the backend is another one)
STATIC_PREFILL = "prefill_static"


def pow2_grid(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    """A timing grid's sizes: ``lo`` up to ``hi``, each point ``2**step`` times the one before."""
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x <<= step
    return tuple(out)


def _halfsteps(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two and 1.5× powers of two in [lo, hi]."""
    s = set()
    for p in pow2_grid(1, hi):
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
    ctx_max_tokens: int  # batch × prompt length measured at most
    gen_batch: tuple[int, ...]
    gen_len: tuple[int, ...]
    gen_max_kv_bytes: float  # batch × KV length × bytes per token (one layer) measured at most
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
            return Plan(
                gemm_m=pow2_grid(1, 2048),
                ctx_batch=(1, 2, 4, 8),
                ctx_len=pow2_grid(16, min(2048, maxpos)),
                ctx_max_tokens=4096,
                gen_batch=pow2_grid(1, 32),
                gen_len=pow2_grid(16, min(4096, maxpos)),
                gen_max_kv_bytes=32 << 20,
                block_sizes=(8, 32),
                overhead_batch=pow2_grid(1, 256, 2),
                mem_bytes=pow2_grid(1 << 12, 1 << 26, 2),
                ew_tokens=(1, 16, 256, 4096),
                repeats=7,
                warmup=2,
                target_repeat_s=0.0005,
                passes=3,
            )
        return Plan(
            gemm_m=_halfsteps(1, 4096),
            ctx_batch=pow2_grid(1, 16),
            ctx_len=pow2_grid(16, min(2048, maxpos)),
            ctx_max_tokens=8192,
            gen_batch=pow2_grid(1, 64),
            gen_len=pow2_grid(16, min(8192, maxpos)),
            gen_max_kv_bytes=64 << 20,
            block_sizes=(8, 32, 64),
            overhead_batch=pow2_grid(1, 512),
            mem_bytes=pow2_grid(1 << 12, 1 << 27),
            ew_tokens=(1, 4, 16, 64, 256, 1024, 4096),
            repeats=9,
            warmup=2,
            target_repeat_s=0.0005,
            passes=5,
        )
    if quick:
        return Plan(
            gemm_m=pow2_grid(1, 16384),
            ctx_batch=(1, 4, 16, 64),
            ctx_len=pow2_grid(64, min(16384, maxpos), 2),
            ctx_max_tokens=65536,
            gen_batch=pow2_grid(1, 256, 2),
            gen_len=pow2_grid(64, min(131072, maxpos), 2),
            gen_max_kv_bytes=1 << 30,
            block_sizes=(32,),
            overhead_batch=pow2_grid(1, 256, 2),
            mem_bytes=pow2_grid(1 << 14, 1 << 30, 2),
            ew_tokens=(1, 64, 4096, 16384),
            repeats=7,
            warmup=3,
            target_repeat_s=0.002,
            passes=2,
        )
    return Plan(
        gemm_m=_halfsteps(1, 32768),
        ctx_batch=pow2_grid(1, 128),
        ctx_len=pow2_grid(32, min(32768, maxpos)),
        ctx_max_tokens=262144,
        gen_batch=pow2_grid(1, 512),
        gen_len=pow2_grid(16, min(131072, maxpos)),
        gen_max_kv_bytes=2 << 30,
        block_sizes=(8, 32, 64, 128),
        overhead_batch=pow2_grid(1, 1024),
        mem_bytes=pow2_grid(1 << 12, 1 << 31),
        ew_tokens=(1, 16, 256, 4096, 16384, 65536),
        repeats=11,
        warmup=5,
        target_repeat_s=0.003,
        passes=3,
    )
