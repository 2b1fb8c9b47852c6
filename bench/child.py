"""One measured run in a fresh interpreter: ``python -m bench.child SCENARIO '{"key": value}'``.

Prints one JSON line: simulate wall/CPU seconds, peak RSS (this process), headline metrics.
Outputs stream to a temporary run directory, as ``kvsim run`` does, so memory is the engine's.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time

from .common import load_avg


def main() -> None:
    scenario, overrides = sys.argv[1], json.loads(sys.argv[2])
    from sim import NATIVE_STATE
    from sim.config import load_scenario
    from sim.engine.cluster import simulate
    from sim.output.results import write_run

    sc = load_scenario(scenario, overrides)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load0 = load_avg()
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        w0, c0 = time.perf_counter(), time.process_time()
        res = simulate(sc, out_dir=tmp)
        sim_s = time.perf_counter() - w0
        write_run(res, tmp)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s = res.summary
    print(
        json.dumps(
            {
                "scenario": scenario,
                "native": NATIVE_STATE,
                "overrides": overrides,
                "wall_s": wall,
                "cpu_s": cpu,
                "simulate_wall_s": sim_s,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_after_import_mb": rss0,
                "load_avg_before": load0,
                "load_avg_after": load_avg(),
                "requests": s["requests"],
                "completed": s["completed"],
                "rejected": s["rejected"],
                "preemptions": s["preemptions"],
                "sim_events": s["sim_events"],
                "windows": s["windows"],
                "iterations": s["iterations"],
                "makespan_s": s["makespan_s"],
                "cost_model": s["cost_model"],
                "ttft_s": s["ttft_s"],
                "tpot_s": s["tpot_s"],
                "busy_fraction": s["busy_fraction"],
            }
        )
    )


if __name__ == "__main__":
    main()
