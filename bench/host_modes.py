"""How the host's speed changes move each kind of engine iteration, against the ``cpu_norm`` probe.

The reference engine's fixed iterations (:class:`calibration.engine.SpeedProbe`) run in rotation
for a while in one thread: the mixed probe the ``cpu_norm`` clock uses, the prefill probe, a
256-token prefill, a 128-token chunk over 256 context, and 1- and 8-sequence decodes. Rounds are
split by the mixed probe's time into its fastest and slowest third; per iteration kind it prints
the slow ÷ fast ratio of medians and its time ÷ the probe's in each third. A kind whose ratio
differs from the probe's is normalised wrongly by the probe alone (its ``/probe`` columns differ):
why ``kvsim validate`` has a prefill probe (docs/validation.md, "The host's two speeds").
Side by side in one thread, so it holds on a shared host; on a quiet, steady host there is no
slow third to speak of (``slow ÷ fast`` of the probe near 1) and nothing to learn.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from calibration.engine import PREFILL_PROBE_CHUNKS, PREFILL_PROBE_DECODE_KV, PROBE_CHUNKS, PROBE_DECODE_KV

from .common import load_avg, table

KINDS = {  # name: (decode KV tokens per sequence, prefill chunks (new, context))
    "probe": (PROBE_DECODE_KV, PROBE_CHUNKS),  # the cpu_norm clock's mixed probe
    "prefill probe": (PREFILL_PROBE_DECODE_KV, PREFILL_PROBE_CHUNKS),
    "prefill 256": ((), ((256, 0),)),
    "chunk 128 + 256 ctx": ((), ((128, 256),)),
    "decode 1": ((200,), ()),
    "decode 8": ((200,) * 8, ()),
}


def run(quick: bool, out: Path, seconds: float | None = None, min_rounds: int = 3) -> dict:
    """Rotate the iteration kinds for ``seconds`` (default 150, ``quick``: 20), and for at least
    ``min_rounds`` rounds however slow the host (the fast and slow thirds need three), and tabulate them."""
    from calibration.engine import Engine, SpeedProbe
    from calibration.validate import engine_config, load_spec

    spec = load_spec("scenarios/validate-cpu.yaml")
    eng = Engine(engine_config(spec, "paged", "cpu"))
    probes = {name: SpeedProbe(eng.cfg, eng.net, decode_kv=kv, chunks=chunks) for name, (kv, chunks) in KINDS.items()}
    seconds = float(seconds) if seconds is not None else 20.0 if quick else 150.0
    la0 = load_avg()
    rounds = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(rounds) < min_rounds:
        rounds.append({name: p.measure() for name, p in probes.items()})
    P = np.array([r["probe"] for r in rounds])
    fast, slow = P <= np.percentile(P, 100 / 3), P >= np.percentile(P, 200 / 3)
    rows, res = [], {}
    for name in probes:
        X = np.array([r[name] for r in rounds])
        ratio = float(np.median(X[slow]) / np.median(X[fast]))
        q = X / P
        res[name] = {
            "fast_ms": float(np.median(X[fast]) * 1e3),
            "slow_ms": float(np.median(X[slow]) * 1e3),
            "slow_over_fast": ratio,
            "over_probe_fast": float(np.median(q[fast])),
            "over_probe_slow": float(np.median(q[slow])),
        }
        rows.append(
            [
                name,
                res[name]["fast_ms"],
                res[name]["slow_ms"],
                ratio,
                res[name]["over_probe_fast"],
                res[name]["over_probe_slow"],
            ]
        )
    table(
        f"host modes: {len(rounds)} rounds in {seconds:.0f} s (load average {la0} -> {load_avg()})",
        ["iteration", "fast ms", "slow ms", "slow / fast", "/probe fast", "/probe slow"],
        rows,
    )
    return {"rounds": len(rounds), "seconds": seconds, "kinds": res, "load_avg": [la0, load_avg()]}
