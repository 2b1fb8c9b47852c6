"""How strongly a cell's metrics answer a uniform error in step time (the simulator on the profile with
every time × f), and a row's error read through it: the step-time error that would explain it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .metrics import sim_metrics
from .simulator import sim_scenario
from .spec import ValidationSpec


def scale_profile(profile, f: float):
    """``profile`` with every time multiplied by ``f`` (curves, latencies, CPU terms; bandwidths divided)."""
    from sim.cost.profile import Profile

    doc = json.loads(json.dumps(profile.to_json()))
    for fam in ("gemm", "context_attention", "generation_attention", "allreduce"):
        for c in doc[fam].values():
            c["t_s"] = (np.asarray(c["t_s"], dtype=np.float64) * f).tolist()
    ew = doc["elementwise"]
    ew["latency_s"] = float(ew["latency_s"]) * f
    ew["bandwidth_bytes_per_s"] = float(ew["bandwidth_bytes_per_s"]) / f
    for t in doc["cpu_overhead"].get("by_tp", {}).values():
        t["intercept_s"] = float(t["intercept_s"]) * f
        t["per_seq_s"] = float(t["per_seq_s"]) * f
        t["after_prefill_s"] = [float(x) * f for x in t.get("after_prefill_s", [])]
        if "mixed_per_decode_s" in t:
            t["mixed_per_decode_s"] = float(t["mixed_per_decode_s"]) * f
        if t.get("per_seq_delta_s"):
            t["per_seq_delta_s"] = {
                **t["per_seq_delta_s"],
                "delta_s": [float(x) * f for x in t["per_seq_delta_s"]["delta_s"]],
            }
    m = doc["memory"]
    for k in list(m):
        if k.endswith("latency_s") or k == "alloc_event_s":
            m[k] = float(m[k]) * f
        elif k.endswith("bandwidth_bytes_per_s"):
            m[k] = float(m[k]) / f
    for c in m.get("curves", {}).values():
        c["t_s"] = [x * f for x in c["t_s"]]
    doc["provenance"]["host_speed_scale"] = f
    return Profile.from_json(doc, "scaled")


#: step-time factors :func:`cell_sensitivity` runs the simulator at (the profile's every time × f)
SENSITIVITY_FACTORS = (0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03)


def cell_sensitivity(
    spec: ValidationSpec,
    allocator: str,
    trace: Path,
    profile_path: str,
    device: str = "cpu",
    factors=SENSITIVITY_FACTORS,
    at_one: dict | None = None,
) -> dict:
    """How strongly each metric of one cell answers a uniform error in step time: the least-squares
    slope of ln(metric) on ln(f) over simulator runs on the profile with every time × ``f``.

    1 means the metric moves with step time (TPOT, or TTFT with no queue); well above 1, the
    metric sits on a queue near its knee, where a small calibration error (or the engine's own
    run-to-run jitter) is multiplied: at 7, a 1 % step-time error moves the metric by ~7 %. A
    cell's error divided by its sensitivity is the uniform step-time error that would explain it.
    Metrics that are zero or missing at any factor get ``None``. Seconds of simulator time per cell.
    ``at_one``: the cell's simulator metrics on the profile as is, where the caller has them (the run
    at f = 1 is then not repeated)."""
    import tempfile

    from sim.cost.profile import load_profile
    from sim.engine.cluster import simulate

    B = spec.kv.block_size
    base = load_profile(profile_path)
    per: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvsim-sens-") as tmp:
        for f in factors:
            if f == 1.0 and at_one is not None:
                per.append(at_one)
                continue
            path = Path(tmp) / f"profile-{f}.json"
            scale_profile(base, f).write(path)
            sc = sim_scenario(spec, allocator, trace_path=str(trace), profile=str(path), device=device)
            per.append(sim_metrics(simulate(sc), B))
    x = np.log(np.asarray(factors, dtype=np.float64))
    out: dict[str, float | None] = {}
    for m in per[0]:
        vals = [p.get(m) for p in per]
        if any(v is None or v <= 0 for v in vals):
            out[m] = None
            continue
        y = np.log(np.asarray(vals, dtype=np.float64))
        out[m] = float(np.polyfit(x, y, 1)[0])
    return out


def run_sensitivity(folder: str | Path) -> dict:
    """:func:`cell_sensitivity` for every cell of a finished run folder (for runs written before rows
    carried it): ``{(load, allocator): {metric: sensitivity}}`` from the run's own traces and final
    profiles. Cells whose trace or profile is missing are left out."""
    folder = Path(folder)
    from sim.inputs import load_json, read_text

    f = folder / "validation.json"
    doc = load_json(read_text(f, "validate.runs", "validation.json"), "validate.runs", str(f))  # bounded
    cfg = doc.get("config") or {}
    # what the simulator's side reads of the run's spec (its engine options may be another version's)
    keys = {k: cfg[k] for k in ("kv", "scheduler", "static_reserve", "workload") if k in cfg}
    spec = ValidationSpec.from_dict(
        {**keys, "name": doc.get("name", "validate"), "model": (doc.get("shape") or {}).get("model")}
    )
    device = (doc.get("device") or {}).get("kind", "cpu")
    out = {}
    for key in doc.get("rates", {}):
        load, alloc = key.split("/")
        trace, prof = folder / f"trace-{load}-{alloc}.csv", folder / f"profile-{alloc}.json"
        if trace.is_file() and prof.is_file():
            out[(load, alloc)] = cell_sensitivity(spec, alloc, trace, str(prof), device)
    return out


def sensitivity_fields(err: float | None, sens: float | None) -> dict:
    """A row's ``sensitivity`` (:func:`cell_sensitivity`) and ``step_equivalent``: its relative error ÷
    its sensitivity, the uniform step-time error that would explain it (``None`` where the metric
    hardly answers step time, sensitivity below :data:`SENSITIVITY_MIN`)."""
    eq = None if err is None or sens is None or sens < SENSITIVITY_MIN else float(err / sens)
    return {"sensitivity": sens, "step_equivalent": eq}


#: below this sensitivity a metric is set by arrivals, not step time (throughput at light load):
#: its error says nothing about step time
SENSITIVITY_MIN = 0.5
