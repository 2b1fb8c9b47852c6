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

The package, one module per part: configuration and clocks (:mod:`.config`), the model
(:mod:`.model`), attention over the two layouts (:mod:`.attention`), the KV memory managers
(:mod:`.kv_memory`), what is recorded (:mod:`.records`), the host-speed probe (:mod:`.speed_probe`)
and the engine's loop (:mod:`.batching`). Nothing here imports torch until an engine is built.
"""

from .attention import (
    DecodePlan,
    chunk_attention,
    contiguous_attention,
    decode_plan,
    padded_block_tables,
    paged_decode_attention,
)
from .batching import Engine
from .config import ALLOCATORS, CLOCKS, DTYPES, PROBE_EVERY_S, PROBE_WINDOW, EngineConfig
from .kv_memory import NO_SPACE, OK, OVERFLOW, BlockPool, StaticArena
from .model import Transformer
from .records import EngineRequest, EngineResult
from .speed_probe import (
    PREFILL_PROBE_CHUNKS,
    PREFILL_PROBE_DECODE_KV,
    PROBE_CHUNKS,
    PROBE_DECODE_KV,
    SpeedProbe,
    prefill_weight,
)

__all__ = [
    "ALLOCATORS",
    "CLOCKS",
    "DTYPES",
    "NO_SPACE",
    "OK",
    "OVERFLOW",
    "PREFILL_PROBE_CHUNKS",
    "PREFILL_PROBE_DECODE_KV",
    "PROBE_CHUNKS",
    "PROBE_DECODE_KV",
    "PROBE_EVERY_S",
    "PROBE_WINDOW",
    "BlockPool",
    "DecodePlan",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "EngineResult",
    "SpeedProbe",
    "StaticArena",
    "Transformer",
    "chunk_attention",
    "contiguous_attention",
    "decode_plan",
    "padded_block_tables",
    "paged_decode_attention",
    "prefill_weight",
]
