"""The host-speed probe of the ``cpu_norm`` clock: a fixed reference iteration, timed every 50 ms of
engine CPU time, whose speed scales the engine's clock."""

from __future__ import annotations

import random
import time

from .config import EngineConfig
from .kv_memory import OK
from .model import Transformer
from .records import EngineRequest

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
        from .batching import Engine  # the probe is a small Engine; batching imports this module

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
