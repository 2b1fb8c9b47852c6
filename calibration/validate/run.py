"""One whole validation run (:func:`validate`, the steps in :mod:`calibration.validate`), written as
``validation.json``, ``iterations.json`` and ``validation.html``."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from sim.catalog import get_model

from .host_speed import HostSpeed, host_load, host_probe, host_probe_run
from .metrics import METRICS, error_summary, rel_error, replay_spread
from .replay import Replayed, compare_cell, engine_config, new_cell, replay_cells, write_measured
from .report import write_html
from .rounds import prepare_profiles
from .sensitivity import sensitivity_fields
from .simulator import estimate_capacity, sim_scenario
from .spec import CLOCK_MEANING, KEY, ValidationSpec, check_clocks


def validate(
    spec: ValidationSpec,
    *,
    device: str = "cpu",
    profile: str | None = None,
    out: Path | str = "runs/validate",
    engine_overhead: bool = True,
    progress=None,
) -> dict:
    """Run the whole validation (see :mod:`calibration.validate`); returns the ``validation.json`` document."""
    from ..attention_backends import select
    from ..kernels import check_device

    check_clocks(spec, device)
    check_device(device, key=f"{KEY}.device")
    # one backend for calibration and every engine of the run (auto resolved here, once)
    spec = spec.model_copy(deep=True)
    spec.engine.kernels = select(spec.engine.kernels, device, key=f"{KEY}.engine.kernels")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    load_before = host_load()
    from sim.engine.deployment import Deployment

    from ..engine import PREFILL_PROBE_CHUNKS, PREFILL_PROBE_DECODE_KV, Engine, SpeedProbe, Transformer

    first = engine_config(spec, spec.allocators[0], device)
    # one set of weights for every engine of the run (the allocators differ in KV layout only)
    net = Transformer(first.model, first.dtype, first.device, first.seed)
    engines = {a: Engine(engine_config(spec, a, device), model=net) for a in spec.allocators}
    speed = None
    if "cpu_norm" in spec.engine.clocks:
        speed = HostSpeed(
            {a: SpeedProbe(engines[a].cfg, engines[a].net) for a in spec.allocators},
            {
                a: SpeedProbe(
                    engines[a].cfg, engines[a].net, decode_kv=PREFILL_PROBE_DECODE_KV, chunks=PREFILL_PROBE_CHUNKS
                )
                for a in spec.allocators
            }
            if spec.engine.prefill_probe
            else None,
        )
    say(f"profile: {'calibrating ' + device if profile is None else profile} + engine overhead")
    paths, pinfo, rounds = prepare_profiles(spec, device, out, profile, engine_overhead, speed=speed, net=net)
    # the overhead rounds spread between replays (None: all of them up front, or none)
    spread = rounds if rounds is not None and spec.engine.overhead_rounds == "spread" else None
    probe_runs = {
        a: host_probe_run(engines[a], "cpu" if device == "cpu" else "wall")  # thread CPU time does not
        for a in spec.allocators
    }  # time GPU work
    caps = {}
    cells: list[Replayed] = []
    for alloc in spec.allocators:
        caps[alloc] = estimate_capacity(spec, alloc, paths[alloc], out, device)
        for load in spec.loads:
            cells.append(new_cell(spec, alloc, load, load.arrival_rate(caps[alloc]), out, device))
    n_rep = spec.engine.replays

    def before(k: int, cell: Replayed) -> None:
        # as many rounds as cells, evenly among the table clock's replays
        if spread is not None and k % n_rep == 0:
            spread.round(f"before replay {k + 1} ({cell.load.name}/{cell.allocator})")

    replay_cells(spec, cells, engines, speed, before=before, say=say)
    say(f"engine side written to {write_measured(out, cells)}")
    if spread is not None:
        spread.round("after the last replay")
        upfront = {a: str(Path(pth).with_name(f"profile-{a}-upfront.json")) for a, pth in paths.items()}
        for a, pth in paths.items():
            os.replace(pth, upfront[a])
        paths = spread.write(out)
        pinfo["engine_overhead_upfront"] = {"files": upfront, "fit": pinfo["engine_overhead"]}
        pinfo["engine_overhead"] = spread.summary()
        pinfo["overhead_rounds"] = spread.level_by_round()
        if spread.kernels is not None:
            pinfo["kernel_rounds"] = spread.kernels.log
        say(
            f"engine overhead refitted on {len(spread.log)} rounds ({sum(x['passes'] for x in spread.log)} passes)"
            + (f", kernel curves on {spread.kernels.passes()} passes" if spread.kernels is not None else "")
        )
    if rounds is not None:  # every overhead-run iteration (full precision: a refit reproduces the fit)
        (out / "overhead_rows.json").write_text(json.dumps(rounds.rows))
    probes = {}
    for alloc in spec.allocators:  # the host's speed right after calibration (see host_probe_run)
        sc = sim_scenario(spec, alloc, profile=paths[alloc], arrival={"kind": "poisson", "rate": 1.0}, device=device)
        probes[alloc] = host_probe(probe_runs[alloc], Deployment.from_scenario(sc).make_cost_model(sc))
    runs = [compare_cell(spec, c, paths[c.allocator], out, device, net=net) for c in cells]
    clocks = list(spec.engine.clocks)
    by_clock: dict[str, list[dict]] = {c: [] for c in clocks}
    for r in runs:
        for c in clocks:
            for m in METRICS:
                meas, sim_v, raw = r.measured[c].get(m), r.simulated[c].get(m), r.simulated_raw.get(m)
                row = {
                    "load": r.load,
                    "allocator": r.allocator,
                    "metric": m,
                    "measured": meas,
                    "simulated": sim_v,
                    "rel_error": rel_error(meas, sim_v),
                    "clock": c,
                    "simulated_unscaled": raw,
                    "rel_error_unscaled": rel_error(meas, raw),
                    **sensitivity_fields(rel_error(meas, sim_v), r.sensitivity.get(m)),
                }
                if c in r.replays:
                    vals = [x.get(m) for x in r.replays[c]]
                    row.update(
                        measured_replays=vals,
                        rel_error_replays=[rel_error(v, sim_v) for v in vals],
                        replay_spread=replay_spread(vals),
                    )
                by_clock[c].append(row)
    rows = by_clock[clocks[0]]
    model = get_model(spec.model)
    doc = {
        "format": "kvsim-validation",
        "version": 1,
        "spec": spec.source,
        "name": spec.name,
        "device": {
            "kind": device,
            "host": platform.node(),
            "cpu": _cpu_name(),
            "threads": spec.engine.threads,
            "dtype": spec.engine.dtype,
            "torch": _torch_version(),
            "kernels": spec.engine.kernels,
            "attention": engines[spec.allocators[0]].attention.describe(),
        },
        "profile": {"files": paths, **pinfo},
        "shape": {
            "model": model.name,
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "kv_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "intermediate": model.intermediate,
            "vocab": model.vocab,
        },
        "config": {
            "kv": spec.kv.model_dump(),
            "scheduler": spec.scheduler.model_dump(),
            "static_reserve": spec.static_reserve,
            "workload": spec.workload.model_dump(),
            "loads": [ld.model_dump() for ld in spec.loads],
            "engine": spec.engine.model_dump(),
        },
        "capacity_requests_per_s": caps,
        "rates": {f"{r.load}/{r.allocator}": r.rate for r in runs},
        "clock": clocks[0],
        "replays": spec.engine.replays,
        "host_speed": spec.host_speed,
        "clock_meaning": {c: CLOCK_MEANING[c] for c in clocks},
        "rows": rows,
        "rows_by_clock": by_clock,
        "semantics": {f"{r.load}/{r.allocator}": r.semantics for r in runs},
        "diagnostics": {
            f"{r.load}/{r.allocator}": {
                c: {k: v for k, v in d.items() if k != "rows"} for c, d in r.diagnostics.items()
            }
            for r in runs
        },
        "host_load": {"before": load_before, "after": host_load()},
        "host_probe_after_calibration": probes,
        "host_speed_reference": speed.summary() if speed is not None else None,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    doc["summary"] = error_summary(rows)
    (out / "validation.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    (out / "iterations.json").write_text(
        json.dumps({f"{r.load}/{r.allocator}/{c}": d["rows"] for r in runs for c, d in r.diagnostics.items()})
    )
    write_html(out / "validation.html", runs, doc)
    return doc


def _cpu_name() -> str:
    from ..devices import cpu_model_name

    return cpu_model_name()


def _torch_version() -> str:
    from ..kernels import import_torch

    return import_torch().__version__
