"""The engine's side of each cell and the comparison: replays in order (:func:`replay_cells`), then
the simulator on the same trace (:func:`compare_cell`) with per-iteration diagnostics and the
semantics check (the engine on the simulator's clock must schedule identically)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.catalog import get_model
from sim.errors import ConfigError

from .host_speed import HostProbeRun, host_probe, host_probe_run, probe_diagnostics
from .metrics import engine_metrics, median_metrics, percentiles, sim_metrics
from .sensitivity import cell_sensitivity, scale_profile
from .simulator import make_requests, sim_scenario, write_trace
from .spec import KEY, LoadSpec, ValidationSpec

if TYPE_CHECKING:
    from .host_speed import HostSpeed


@dataclass
class Run:
    load: str
    allocator: str
    rate: float
    #: per replay clock (``cpu``, ``wall``): simulator metrics and RunResult (profile rescaled by the host
    #: probe taken just before that replay, when ``host_speed: probe``), engine metrics, EngineResult, diagnostics
    simulated: dict
    sim: dict
    measured: dict
    engine: dict
    diagnostics: dict
    #: simulator on the calibrated profile as is
    simulated_raw: dict
    semantics: dict
    #: with ``engine.replays`` > 1, per clock: each replay's metrics (``measured`` holds their medians)
    replays: dict = field(default_factory=dict)
    #: and the EngineResults of the replays after the first (``engine`` holds the first)
    engine_more: dict = field(default_factory=dict)
    #: per metric, the simulator's d ln(metric) / d ln(step time) on this cell (:func:`cell_sensitivity`)
    sensitivity: dict = field(default_factory=dict)


def engine_config(spec: ValidationSpec, allocator: str, device: str):
    from ..engine import EngineConfig

    e = spec.engine
    return EngineConfig(
        get_model(spec.model),
        num_blocks=spec.kv.num_blocks,
        block_size=spec.kv.block_size,
        max_num_seqs=spec.scheduler.max_num_seqs,
        max_num_batched_tokens=spec.scheduler.max_num_batched_tokens,
        allocator=allocator,
        reserve=spec.static_reserve,
        max_model_len=spec.workload.max_model_len,
        dtype=e.dtype,
        threads=e.threads,
        seed=e.seed,
        device=device,
        kernels=e.kernels,
    )


def iteration_diagnostics(res, cost) -> dict:
    """Per-iteration time measured vs predicted by the cost model for the same batch shapes."""
    from ..kernels import engine_iteration_rows

    rows = engine_iteration_rows(res, cost)
    out: dict[str, Any] = {}
    for name, sel in (
        ("all", lambda r: True),
        ("pure_decode", lambda r: r["pure_decode"]),
        ("mixed", lambda r: not r["pure_decode"]),
    ):
        rs = [r for r in rows if sel(r)]
        if not rs:
            continue
        meas = np.array([r["measured_s"] for r in rs])
        pred = np.array([r["predicted_s"] for r in rs])
        cpu = np.array([r["cpu_s"] for r in rs])
        out[name] = {
            "iterations": len(rs),
            "measured_s": percentiles(meas),
            "predicted_s": percentiles(pred),
            "signed_rel_error": percentiles((pred - meas) / meas),
            "abs_rel_error_median": float(np.median(np.abs(pred - meas) / meas)),
            "sum_predicted_over_measured": float(pred.sum() / meas.sum()),
            "cpu_over_wall": percentiles(cpu / meas),
            "sum_cpu_over_wall": float(cpu.sum() / meas.sum()),
            "sum_predicted_over_cpu": float(pred.sum() / cpu.sum()) if cpu.sum() > 0 else None,
        }
    # pure-decode iterations by how many decode iterations came since the last one with a prefill
    # chunk (1..AFTER_PREFILL, slower than the steady state, then the steady state the fit prices)
    from ..kernels import AFTER_PREFILL, decode_since_prefill

    by_k: dict[str, list] = {}
    for r, k in zip(rows, decode_since_prefill(rows)):
        if r["pure_decode"]:
            key = str(k) if k <= AFTER_PREFILL else f">{AFTER_PREFILL}"
            by_k.setdefault(key, []).append((r["predicted_s"], r["measured_s"]))
    out["after_prefill"] = {
        key: {"iterations": len(v), "sum_predicted_over_measured": float(sum(p for p, _ in v) / sum(m for _, m in v))}
        for key, v in by_k.items()
    }
    # cpu_norm replays: iterations right after a host-speed probe against the others (the probe leaves
    # its own cache state behind; a large share of probed iterations where iterations are long)
    probed = [r for r in rows if "after_probe" in r]
    if probed:
        out["after_probe"] = {}
        for key, flag in (("after_probe", True), ("other", False)):
            v = [(r["predicted_s"], r["measured_s"]) for r in probed if r["after_probe"] == flag]
            if v:
                out["after_probe"][key] = {
                    "iterations": len(v),
                    "sum_predicted_over_measured": float(sum(p for p, _ in v) / sum(m for _, m in v)),
                }
    busy = sum(it["end_s"] - it["start_s"] for it in res.iterations)
    lag = [r["enqueued_s"] - r["arrival_s"] for r in res.requests if r["enqueued_s"] >= 0]
    span = max((r["finish_s"] for r in res.requests), default=0.0)
    out["busy_s"] = busy
    out["makespan_s"] = span
    out["feeder_lag_s"] = percentiles(lag)
    out["rows"] = [{k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    return out


def semantics_check(
    spec: ValidationSpec, allocator: str, device: str, rows: np.ndarray, sim_result, cost, net=None
) -> dict:
    """Engine on a virtual clock driven by ``cost`` (no compute) vs the simulator: must be identical.

    ``net``: the validation's shared :class:`~calibration.engine.Transformer` (it is never run here;
    sharing it saves drawing a model's weights again, a real cost at an 8B shape)."""
    from ..engine import Engine

    eng = Engine(engine_config(spec, allocator, device), model=net)
    res = eng.run([tuple(r) for r in rows], clock="virtual", cost=cost, compute=False)
    req = sim_result.requests
    sim_rows = {
        int(i): (a, f, e)
        for i, a, f, e in zip(
            req["id"].to_pylist(),
            req["admitted_s"].to_pylist(),
            req["first_token_s"].to_pylist(),
            req["finish_s"].to_pylist(),
        )
    }
    diffs = [
        max(
            abs(r["admitted_s"] - sim_rows[r["id"]][0]),
            abs(r["first_token_s"] - sim_rows[r["id"]][1]),
            abs(r["finish_s"] - sim_rows[r["id"]][2]),
        )
        for r in res.requests
    ]
    bpt = sim_result.summary["kv_bytes_per_token"]
    B = spec.kv.block_size
    sim_peak = float(sim_result.timeseries["kv_reserved_bytes"].to_numpy().max() / bpt / B)
    out = {
        "engine_peak_kv_blocks": float(res.peak_blocks()),
        "sim_peak_kv_blocks": sim_peak,
        "engine_preemptions": res.preemptions(),
        "sim_preemptions": int(sim_result.summary["preemptions"]),
        "engine_iterations": len(res.iterations),
        "sim_iterations": int(sim_result.summary["iterations"]),
        "max_abs_time_diff_s": float(max(diffs)) if diffs else 0.0,
    }
    out["identical"] = bool(
        out["engine_peak_kv_blocks"] == sim_peak
        and out["engine_preemptions"] == out["sim_preemptions"]
        and out["engine_iterations"] == out["sim_iterations"]
        and out["max_abs_time_diff_s"] < 1e-6
    )
    return out


@dataclass
class Replayed:
    """One cell's engine side (:func:`new_cell`, :func:`replay_cells`): the trace and, per replay
    clock, every replay and (raw clocks) the host probes around them."""

    load: LoadSpec
    allocator: str
    rate: float
    rows: np.ndarray
    trace: Path
    results: dict[str, list]
    probes: dict[str, tuple[HostProbeRun, HostProbeRun]]


def write_measured(out: Path, cells: list[Replayed]) -> Path:
    """``measured.json``: every cell's engine metrics (seconds, tokens/s, blocks), per clock and
    replay, written as soon as the replays end. The simulator's side, the overhead refit and the
    report follow; a run stopped among them (a lent GPU's time limit) keeps what the engine did."""
    doc = {
        "format": "kvsim-validate-measured",
        "cells": [
            {
                "load": c.load.name,
                "allocator": c.allocator,
                "rate_per_s": c.rate,
                "requests": len(c.rows),
                "trace": c.trace.name,
                "replays": {clock: [engine_metrics(r) for r in res] for clock, res in c.results.items()},
            }
            for c in cells
        ],
    }
    path = out / "measured.json"
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path


def new_cell(spec: ValidationSpec, allocator: str, load: LoadSpec, rate: float, out: Path, device: str) -> Replayed:
    """One load × allocator cell before any replay: its requests and their CSV trace."""
    rows = make_requests(spec, rate, device)
    trace = write_trace(rows, out / f"trace-{load.name}-{allocator}.csv")
    return Replayed(load, allocator, rate, rows, trace, {c: [] for c in spec.engine.clocks}, {})


def replay_once(spec: ValidationSpec, cell: Replayed, clock: str, engine, speed: HostSpeed | None = None) -> None:
    """The engine replays ``cell``'s trace once more on ``clock``; the result is appended to ``cell.results``.

    ``cpu_norm`` is normalised to calibration speed during the replay itself (``speed``'s probe);
    a raw clock gets a fixed batch (:func:`host_probe_run`) just before and just after its replay,
    for ``host_speed: probe`` (see :func:`compare_cell`; a raw clock is replayed once per cell).
    Nothing here needs the profile: the simulator side runs after every cell is replayed, on the
    final profile."""
    reqs = [tuple(r) for r in cell.rows]
    if clock == "cpu_norm":
        if speed is None:
            raise ConfigError(f"{KEY}.engine.clocks", clock, "cpu_norm with a HostSpeed reference (validate())")
        cell.results[clock].append(engine.run(reqs, clock=clock, max_wall_s=600, **speed.run_kwargs(cell.allocator)))
    else:
        before = host_probe_run(engine, clock)
        cell.results[clock].append(engine.run(reqs, clock=clock, max_wall_s=600))
        cell.probes[clock] = (before, host_probe_run(engine, clock))


def replay_cells(
    spec: ValidationSpec, cells: list[Replayed], engines: dict, speed: HostSpeed | None = None, before=None, say=None
) -> None:
    """Every cell's replays: the table's clock (the first) ``engine.replays`` times, each other clock once.

    ``engine.replay_order: interleaved`` (default) replays every cell once, then every cell again,
    and so on, the raw clocks in the last sweep; ``blocked`` runs all of one cell's replays before
    the next cell's. Why interleave: a shared host's speed drifts over minutes and the ``cpu_norm``
    probe removes it only partly, so consecutive replays share a level (this sandbox, runs S6–S10:
    the model's busy-time ratio within a cell's three blocked replays 1–3 % apart, between cells up
    to 12 %). Blocked, each cell's median carries its own minute's level; interleaved, each median
    draws on windows spread over the whole run, the same windows for every cell.
    ``before(k, cell)`` is called before the k-th replay of the table's clock (k from 0)."""
    clocks = spec.engine.clocks
    n = spec.engine.replays
    if spec.engine.replay_order == "blocked":
        order = [(c, i) for c in cells for i in range(n)]
    else:
        order = [(c, i) for i in range(n) for c in cells]
    for k, (cell, i) in enumerate(order):
        if before is not None:
            before(k, cell)
        if say is not None:
            say(
                f"replay {k + 1}/{len(order)}: {cell.allocator} {cell.load.name} ({i + 1} of {n}), "
                f"{cell.rate:.2f} req/s, {len(cell.rows)} requests"
            )
        replay_once(spec, cell, clocks[0], engines[cell.allocator], speed)
        if i == n - 1:  # the raw clocks once, after the cell's last replay of the table's clock
            for clock in clocks[1:]:
                replay_once(spec, cell, clock, engines[cell.allocator], speed)


def compare_cell(spec: ValidationSpec, cell: Replayed, profile_path: str, out: Path, device: str, net=None) -> Run:
    """The simulator on one replayed cell's trace and the comparison, clock by clock.

    ``host_speed: probe``: the raw clocks' simulator runs on the profile with every time scaled by
    the geometric mean of the probes just before and just after their replay (measured ÷ predicted
    busy time: a recalibration bracketing, never taken from, the replay). ``host_speed: fixed``: the
    profile as calibrated. ``cpu_norm`` is always compared with the profile as calibrated."""
    from sim.cost.profile import load_profile
    from sim.engine.cluster import simulate
    from sim.engine.deployment import Deployment

    allocator, load = cell.allocator, cell.load
    sc = sim_scenario(spec, allocator, trace_path=str(cell.trace), profile=profile_path, device=device)
    sim_raw = simulate(sc)
    B = spec.kv.block_size
    raw = sim_metrics(sim_raw, B)
    cost = Deployment.from_scenario(sc).make_cost_model(sc)
    simulated, sims, measured, results, diags = {}, {}, {}, {}, {}
    per_replay: dict[str, list[dict]] = {}
    more: dict[str, list] = {}
    for clock, ress in cell.results.items():
        res = ress[0]
        if clock == "cpu_norm":
            simulated[clock], sims[clock], cost_c = raw, sim_raw, cost
            diags[clock] = iteration_diagnostics(res, cost)
            diags[clock]["speed_probes"] = probe_diagnostics(res)
        else:
            probe, probe_after = (host_probe(x, cost) for x in cell.probes[clock])
            if spec.host_speed == "probe":
                f = round(math.sqrt(probe["measured_over_predicted"] * probe_after["measured_over_predicted"]), 4)
                path = out / f"profile-{allocator}-{load.name}-{clock}.json"
                scale_profile(load_profile(profile_path), f).write(path)
                sc_c = sim_scenario(spec, allocator, trace_path=str(cell.trace), profile=str(path), device=device)
                sims[clock] = simulate(sc_c)
                cost_c = Deployment.from_scenario(sc_c).make_cost_model(sc_c)
            else:
                sims[clock], cost_c = sim_raw, cost
            simulated[clock] = sim_metrics(sims[clock], B)
            diags[clock] = iteration_diagnostics(res, cost_c)
            diags[clock]["host_probe_before"] = probe
            diags[clock]["host_probe_after"] = probe_after
            diags[clock]["unscaled"] = {k: v for k, v in iteration_diagnostics(res, cost).items() if k in ("all",)}
        per = [engine_metrics(r) for r in ress]
        measured[clock], results[clock] = median_metrics(per), res
        if len(ress) > 1:
            per_replay[clock], more[clock] = per, ress[1:]
            # the first replay's diagnostics are the clock's own, computed above
            diags[clock]["replays"] = [
                replay_summary(r, m, diags[clock] if i == 0 else iteration_diagnostics(r, cost_c))
                for i, (r, m) in enumerate(zip(ress, per))
            ]
    return Run(
        load.name,
        allocator,
        cell.rate,
        simulated,
        sims,
        measured,
        results,
        diags,
        raw,
        semantics_check(spec, allocator, device, cell.rows, sim_raw, cost, net=net),
        per_replay,
        more,
        cell_sensitivity(spec, allocator, cell.trace, profile_path, device, at_one=raw),
    )


def replay_summary(res, metrics: dict, diag: dict) -> dict:
    """One replay in brief: its metrics, the model's busy-time ratio (from its
    :func:`iteration_diagnostics` ``diag``), the host-speed probe's median."""
    sp = probe_diagnostics(res)
    return {
        "metrics": metrics,
        "sum_predicted_over_measured": diag.get("all", {}).get("sum_predicted_over_measured"),
        "iterations": len(res.iterations),
        "wall_s": round(res.info.get("wall_s", 0.0), 3),
        "probe_p50_s": sp.get("probe_s", {}).get("p50") if sp else None,
    }
