"""Fingerprints of every built-in scenario's results, to show a refactoring changed nothing.

    python -m bench.identity fingerprint OUT.json [--requests N]   # in the tree to fingerprint
    python -m bench.identity compare A.json B.json                 # exit 1 on any difference

For every scenario of ``kvsim list scenarios`` (at most ``--requests`` requests each, default
300), in both engine modes, plus variants of ``chat-api`` that switch on each allocator kind and
optional engine path (compaction, prefix caching, swap, priority victims, static batching, the
admission breaker, hybrid_tail's length predictors, static's fallback region, several replicas with prefix-affinity routing), it records
the SHA-256 of ``summary.json`` as ``kvsim run`` writes it and of the request and time-series
tables. Run it in the tree before a change and after, then compare: equal fingerprints mean
byte-identical results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

#: chat-api variants that reach the optional paths of the engine (name → overrides).
VARIANTS: dict[str, dict] = {
    "static-p90": {"allocator.kind": "static", "allocator.reserve": "p90"},
    "static-truncate": {"allocator.kind": "static", "allocator.reserve": "p50", "allocator.overflow": "truncate"},
    "dynamic-compaction-stall": {
        "allocator.kind": "dynamic",
        "allocator.growth": "token",
        "allocator.compaction.enabled": True,
        "allocator.compaction.period_s": 0.05,
        "allocator.compaction.below_utilization": 1.0,
        "allocator.compaction.above_fragmentation": 0.0,
        "workload.arrival.rate": 40,
    },
    "dynamic-compaction-background": {
        "allocator.kind": "dynamic",
        "allocator.compaction.enabled": True,
        "allocator.compaction.mode": "background",
        "allocator.compaction.period_s": 0.05,
        "allocator.compaction.below_utilization": 1.0,
        "allocator.compaction.above_fragmentation": 0.0,
        "workload.arrival.rate": 40,
    },
    "static-buddy": {"allocator.kind": "static", "allocator.placement": "buddy", "allocator.reserve": "p95"},
    "hybrid-tail": {"allocator.kind": "hybrid_tail", "allocator.long_threshold": "p80"},
    "hybrid-tail-oracle": {
        "allocator.kind": "hybrid_tail",
        "allocator.long_threshold": "p80",
        "allocator.length_predictor": "oracle",
    },
    "hybrid-tail-quantile": {
        "allocator.kind": "hybrid_tail",
        "allocator.long_threshold": "p80",
        "allocator.length_predictor": "quantile",
        "gpu.gpu_memory_utilization": 0.3,
        "workload.arrival.rate": 40,
    },
    "static-fallback": {
        "allocator.kind": "static",
        "allocator.reserve": "p80",
        "allocator.overflow": "fallback",
        "workload.arrival.rate": 40,
    },
    "hybrid-reserve-stale": {
        "allocator.kind": "hybrid_reserve",
        "allocator.stale_after_s": 2.0,
        "allocator.admit_when_free_above": 0.5,
        "workload.arrival.rate": 60,
        "gpu.gpu_memory_utilization": 0.3,
    },
    "paged-zero-swap": {
        "allocator.page_reuse": "zero",
        "allocator.preemption.mode": "swap",
        "allocator.preemption.swap_capacity_bytes": 2**30,
        "gpu.gpu_memory_utilization": 0.3,
        "workload.arrival.rate": 60,
    },
    "paged-priority-victim": {
        "allocator.preemption.victim": "lowest_priority",
        "workload.priority.high_fraction": 0.3,
        "gpu.gpu_memory_utilization": 0.3,
        "workload.arrival.rate": 60,
    },
    "prefix-affinity": {
        "allocator.prefix_caching.enabled": True,
        "workload.prefix.fraction": 0.6,
        "workload.prefix.groups": 3,
        "gpu.replicas": 3,
        "router": "prefix_affinity",
    },
    "sliding-window": {"model.sliding_window": 1024, "gpu.gpu_memory_utilization": 0.3, "workload.arrival.rate": 40},
    "hybrid-reserve": {
        "allocator.kind": "hybrid_reserve",
        "gpu.gpu_memory_utilization": 0.3,
        "workload.arrival.rate": 40,
    },
    "static-batch": {"scheduler.kind": "static_batch", "allocator.kind": "static"},
    "round-robin-sampled": {"gpu.replicas": 2, "router": "round_robin", "timeseries.every_s": 0.5},
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _table_sha(table) -> str:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table.combine_chunks())
    return _sha(sink.getvalue().to_pybytes())


def _cases(requests: int) -> list[tuple[str, str, dict]]:
    from sim.config import list_scenarios, read_scenario_dict

    cases = []
    for name in list_scenarios():
        data, _ = read_scenario_dict(name)
        n = (data.get("workload") or {}).get("num_requests", 1000)
        over: dict = {"workload.num_requests": min(requests, n) if n else requests}
        for mode in ("fast_forward", "step"):
            cases.append((f"{name}/{mode}", name, {**over, "engine.mode": mode}))
    for label, extra in VARIANTS.items():
        for mode in ("fast_forward", "step"):
            cases.append(
                (
                    f"chat-api+{label}/{mode}",
                    "chat-api",
                    {"workload.num_requests": requests, **extra, "engine.mode": mode},
                )
            )
    return cases


def fingerprint(out: Path, requests: int) -> dict:
    import sim
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    result: dict = {
        "sim": str(Path(sim.__file__).parent),
        "native": sim.NATIVE_STATE,
        "requests": requests,
        "cases": {},
    }
    for label, name, over in _cases(requests):
        res = simulate(load_scenario(name, over))
        summary = json.dumps(res.summary, indent=2, sort_keys=True) + "\n"  # as write_run writes it
        result["cases"][label] = {
            "summary": _sha(summary.encode()),
            "requests": _table_sha(res.requests),
            "timeseries": _table_sha(res.timeseries),
            "completed": res.summary["completed"],
            "iterations": res.summary["iterations"],
        }
        print(f"{label:60s} {result['cases'][label]['summary'][:16]}", flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def compare(a: Path, b: Path) -> int:
    A, B = json.loads(a.read_text()), json.loads(b.read_text())
    ca, cb = A["cases"], B["cases"]
    bad = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    print(
        f"{a} ({A['sim']}, {A['native']}) vs {b} ({B['sim']}, {B['native']}): "
        f"{len(set(ca) & set(cb))} cases in both, {len(bad)} differ"
    )
    for k in bad:
        print(f"  DIFFERS {k}: {ca.get(k)} vs {cb.get(k)}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.identity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fingerprint")
    f.add_argument("out", type=Path)
    f.add_argument("--requests", type=int, default=300)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "fingerprint":
        fingerprint(args.out, args.requests)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
