"""Python bytecodes and calls per request: a deterministic measure of the engine's cost.

This host's speed moves by ±25–40 % from minute to minute, so a 10 % change cannot be seen in
wall time without many interleaved runs. The interpreter's work can: ``sys.settrace`` with opcode
events counts every bytecode the run executes (the same count on every run of the same code and
scenario), per function. It slows the run ~50×, so it runs a few thousand requests. C-level work
(numpy, heap operations, SimPy's own C parts) is not counted; ``valgrind --tool=callgrind`` gives
machine instructions when that matters (docs/performance.md).
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from pathlib import Path

from .common import console, table, write_json

SCENARIOS = {"bench-1m": 10_000, "bench-saturated": 3_000}
TOP = 25


def count(scenario: str, requests: int) -> dict:
    """Bytecodes and Python calls per request of ``requests`` of ``scenario``, with the top functions."""
    from sim import native
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    if native.active():
        raise RuntimeError(
            "opcount counts the interpreted engine's bytecodes: run it with KVSIM_NATIVE=0 "
            "(python -m bench opcount does)"
        )
    sc = load_scenario(scenario, {"workload.num_requests": requests})
    # Untraced first: lazy imports and the process-wide caches (profiles, curve rows) fill here, so
    # the count is of the engine's steady state and the same on every call.
    simulate(sc)
    ops: Counter = Counter()
    calls: Counter = Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{Path(code.co_filename).name}:{code.co_name}"
        if event == "call":
            calls[key] += 1

        def local(frame, event, arg):
            if event == "opcode":
                ops[key] += 1
            return local

        return local

    # Collections run finalizers at moments that vary from run to run: none while counting.
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        res = simulate(sc)
    finally:
        sys.settrace(None)
        gc.enable()
    total = sum(ops.values())
    top = [
        {
            "function": k,
            "bytecodes_per_request": v / requests,
            "share": v / total,
            "calls_per_request": calls[k] / requests,
        }
        for k, v in ops.most_common(TOP)
    ]
    return {
        "scenario": scenario,
        "requests": requests,
        "bytecodes_per_request": total / requests,
        "calls_per_request": sum(calls.values()) / requests,
        "sim_events_per_request": res.summary["sim_events"] / requests,
        "top": top,
    }


def run(quick: bool, out: Path) -> dict:
    results = []
    for scenario, n in SCENARIOS.items():
        n = n // 5 if quick else n
        console.print(f"[dim]opcount: {n:,} requests of {scenario} under sys.settrace…[/]")
        r = count(scenario, n)
        results.append(r)
        table(
            f"{scenario}: {r['bytecodes_per_request']:,.0f} bytecodes, {r['calls_per_request']:.1f} calls, "
            f"{r['sim_events_per_request']:.2f} SimPy events per request",
            ["function", "bytecodes/req", "share", "calls/req"],
            [
                [t["function"], t["bytecodes_per_request"], f"{100 * t['share']:.1f}%", t["calls_per_request"]]
                for t in r["top"]
            ],
        )
    data = {"bench": "opcount", "quick": quick, "runs": results}
    write_json(out, "opcount", data)
    return data
