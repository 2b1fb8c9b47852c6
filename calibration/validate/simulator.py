"""The simulator's side of a validation cell: the scenario with the engine's knobs and exactly its KV
capacity, the cell's requests and their CSV trace, and the capacity that sets the arrival rates."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from sim.catalog import GPUS, get_model
from sim.config import scenario_from_dict

from .spec import ValidationSpec

#: GPU catalog entry whose memory arithmetic the simulator uses (capacity is forced to the engine's anyway).
SIM_GPU = {"cpu": "cpu", "cuda": "H200-SXM-141GB"}


def capacity_tokens(spec: ValidationSpec) -> int:
    return spec.capacity_tokens()


def sim_scenario(
    spec: ValidationSpec,
    allocator: str,
    *,
    trace_path: str | None = None,
    profile: str | None = None,
    arrival: dict | None = None,
    num_requests: int | None = None,
    device: str = "cpu",
):
    """The Scenario the simulator runs for ``spec``: same knobs, KV capacity = the engine's."""
    model = get_model(spec.model)
    gpu = GPUS[SIM_GPU[device]]
    bpt = model.kv_bytes_per_token("bf16")
    act = int(gpu.memory_bytes * 0.9) - model.weight_bytes("bf16") - capacity_tokens(spec) * bpt
    w = spec.workload
    if arrival is None:
        arrival = {"kind": "trace", "path": str(trace_path), "format": "csv"}
    d: dict[str, Any] = {
        "name": f"{spec.name}-{allocator}",
        "seed": w.seed,
        "model": {"name": spec.model},
        "gpu": {"name": gpu.name, "gpu_memory_utilization": 0.9, "activation_reserve_bytes": act},
        "workload": {
            "num_requests": int(num_requests or w.num_requests),
            "max_model_len": w.max_model_len,
            "arrival": arrival,
        },
        "scheduler": {
            "max_num_seqs": spec.scheduler.max_num_seqs,
            "max_num_batched_tokens": spec.scheduler.max_num_batched_tokens,
        },
        "allocator": {
            "kind": allocator,
            "block_size": spec.kv.block_size,
            "reserve": spec.static_reserve,
        },
        "cost_model": {"profile": profile or "none"},
        # The subject is kvsim's own torch engine: the profile's measured CPU overhead and kernels as
        # they are, no serving-engine preset (whose host time, front end and scheduler defaults model
        # a vLLM/SGLang/TensorRT-LLM server, not the engine this validation replays).
        "engine": {"kind": "reference"},
    }
    if arrival.get("kind") != "trace":
        d["workload"]["lengths"] = copy.deepcopy(w.lengths)
    return scenario_from_dict(d)


def make_requests(spec: ValidationSpec, rate: float, device: str = "cpu") -> np.ndarray:
    """``[n, 3]`` rows ``(arrival_s, prompt, output)``: the spec's lengths, Poisson arrivals at ``rate``, first at 0.

    ``device`` only picks the GPU entry whose memory must hold the model (an 8B shape does not fit the
    ``cpu`` entry); the requests do not depend on it."""
    from sim.workload.generator import build_workload

    sc = sim_scenario(spec, "paged", arrival={"kind": "poisson", "rate": float(rate)}, device=device)
    wl = build_workload(sc)
    assert wl.arrival_s is not None  # open-loop (Poisson) arrivals
    t = wl.arrival_s - wl.arrival_s[0]
    return np.column_stack([t, wl.prompt_tokens, wl.output_tokens]).astype(np.float64)


def write_trace(rows: np.ndarray, path: Path) -> Path:
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for a, p, o in rows:
            f.write(f"{float(a)!r},{int(p)},{int(o)}\n")
    return path


def estimate_capacity(spec: ValidationSpec, allocator: str, profile: str, out: Path, device: str = "cpu") -> float:
    """Requests/s the simulator sustains for ``allocator`` when every request arrives at once."""
    from sim.engine.cluster import simulate

    rows = make_requests(spec, 1.0, device)
    rows[:, 0] = 0.0
    path = write_trace(rows, out / f"capacity-{allocator}.csv")
    s = simulate(sim_scenario(spec, allocator, trace_path=str(path), profile=profile, device=device)).summary
    return float(s["completed"]) / float(s["makespan_s"])
