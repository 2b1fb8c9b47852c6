"""``kvsim validate``: the simulator against a real engine, on the same requests, config and device.

For each allocator (``paged``, ``static``) and each load of a validation spec
(``scenarios/validate-cpu.yaml``; format in ``docs/validation.md``):

1. **Profile**: route 1 of ``kvsim calibrate`` on this device at the engine's model shape
   and compute dtype (a narrow grid covering the spec's batch shapes), or a given profile;
   then the reference engine's own per-iteration framework overhead
   (:func:`calibration.kernels.measure_engine_overhead`, per cache layout) replaces the
   profile's CPU-step term. One profile file per allocator is written to the output folder.
   With ``engine.overhead_rounds: spread`` (default) the overhead runs are repeated as many times
   as there are cells, evenly among the replays, and once after the last, and the final profiles
   are fitted on every round pooled (:class:`OverheadRounds`); the arrival rates come from the
   up-front fit. With ``engine.kernel_rounds: spread`` (default) the kernel grid is timed again
   before every later round and the final kernel curves are fitted on every pass pooled
   (:class:`KernelRounds`), the overhead rows re-priced against them.
2. **Requests**: the spec's lengths and a Poisson arrival rate = ``utilization`` × the
   capacity the simulator estimates for that allocator (requests/s when all arrive at once),
   or an explicit ``rate``; written as a generic CSV trace ``arrival_s,prompt_tokens,output_tokens``.
3. **Engine** (:mod:`calibration.engine`) replays the trace on each of the spec's clocks:
   ``cpu_norm`` (thread CPU time normalised to calibration speed by :class:`HostSpeed`'s probe,
   compared with the profile as calibrated), ``cpu`` (thread CPU time), ``wall``.
4. **Simulator** (after every cell is replayed) replays the same CSV (``workload.arrival.kind:
   trace``) with the same scheduler and allocator knobs and a KV capacity of exactly
   ``num_blocks × block_size`` tokens (``gpu.activation_reserve_bytes`` set so), cost model = the
   final profile of step 1 (:func:`replay_cells`, then :func:`compare_cell`).
5. **Semantics check**: the engine again on a *virtual* clock driven by the same cost model
   (no compute): its schedule is then timing-independent and must equal the simulator's —
   peak blocks, preemptions and every request's admission / first-token / finish time.
6. ``validation.json`` (rows ``{load, allocator, metric, measured, simulated, rel_error}``,
   per-iteration diagnostics, device, profile, shape) and ``validation.html`` (plotly).

torch is imported only through :mod:`calibration.engine` and :mod:`calibration.kernels`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from sim.catalog import GPUS, get_model
from sim.config import scenario_from_dict
from sim.errors import ConfigError

METRICS = ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "e2e_p50", "e2e_p90", "e2e_p99",
           "throughput", "peak_kv_blocks", "preemptions")
#: GPU catalog entry whose memory arithmetic the simulator uses (capacity is forced to the engine's anyway).
SIM_GPU = {"cpu": "cpu", "cuda": "H200-SXM-141GB"}
KEY = "validate"

DEFAULT_SPEC = {
    "name": "validate", "description": "",
    "model": "tiny-llama",
    "engine": {"dtype": "fp32", "threads": 1, "seed": 0, "clocks": ["cpu_norm", "cpu", "wall"], "replays": 1,
               "overhead_rounds": "spread", "kernel_rounds": "spread", "replay_order": "interleaved",
               "prefill_probe": True, "overhead_mix": "offline", "kernels": "auto"},
    "kv": {"num_blocks": 256, "block_size": 16},
    "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
    "static_reserve": 480,
    "workload": {"num_requests": 100, "max_model_len": 480, "seed": 1,
                 "lengths": {"kind": "uniform", "prompt_min": 16, "prompt_max": 384, "output_min": 8, "output_max": 96}},
    "loads": [{"name": "light", "utilization": 0.3}, {"name": "medium", "utilization": 0.7},
              {"name": "saturating", "utilization": 1.6}],
    "allocators": ["paged", "static"],
    "host_speed": "probe",
    "quick": {"num_requests": 24, "loads": ["medium"], "allocators": ["paged", "static"]},
}
_ALLOWED = set(DEFAULT_SPEC) | {"kind"}  # kind: validation marks the file as a spec, not a scenario
#: ``quick``'s keys: the subset, and the engine options it may set for itself
QUICK_ENGINE_KEYS = {"replays", "overhead_mix"}
QUICK_KEYS = {"num_requests", "loads", "allocators"} | QUICK_ENGINE_KEYS
#: ``engine.overhead_rounds``: ``spread`` (default) adds one pass of the engine-overhead runs per cell,
#: evenly among the replays, and one after the last, pooled with the up-front passes
#: (:class:`OverheadRounds`); ``upfront``: the up-front passes only
OVERHEAD_ROUNDS = ("spread", "upfront")
#: ``engine.kernel_rounds``: ``spread`` (default, with ``overhead_rounds: spread`` and a calibrated
#: profile) times the kernel route's grid again, one pass, before every overhead round, and the final
#: profiles' kernel curves are fitted on every pass pooled (:class:`KernelRounds`); ``upfront``: the
#: up-front route only
KERNEL_ROUNDS = ("spread", "upfront")
#: ``engine.overhead_mix``: how the engine-overhead runs fill their batches
#: (:data:`calibration.kernels.OVERHEAD_MIXES`): ``offline`` (default), ``queued``, or ``both`` (each
#: round runs both, the fit pools them; ``calibration.validate_refit`` can then compare them on the
#: same replays)
OVERHEAD_MIX = {"offline": ("offline",), "queued": ("queued",), "both": ("offline", "queued")}
#: ``engine.replay_order``: ``interleaved`` (default) replays every cell once, then every cell again, ... (the
#: raw clocks in the last sweep); ``blocked``: all of one cell's replays, then the next cell's
REPLAY_ORDERS = ("interleaved", "blocked")
#: replay clocks of the engine (``engine.clocks``; the first is the table's), see docs/validation.md
REPLAY_CLOCKS = ("cpu_norm", "cpu", "wall")
CLOCK_MEANING = {
    "cpu_norm": "engine clock advanced by each iteration's thread CPU time x (host-speed probe's reference time at "
                "calibration / median of its last probes during the replay): the engine on a host running at "
                "calibration speed (host interference removed); simulated with the profile as calibrated",
    "cpu": "engine clock advanced by each iteration's thread CPU time (idle: jumps to the next arrival): the engine "
           "as it ran, without the time other jobs kept its thread off the CPU",
    "wall": "wall-clock replay, arrivals fed by a thread: the engine on this host as it is"}


# --- the spec ----------------------------------------------------------------------------------

def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "lengths":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_spec(path: str | Path, quick: bool = False, kernels: str | None = None) -> dict:
    """A validation spec (YAML) with defaults filled; ``quick`` applies its ``quick`` section, ``kernels``
    (``--kernels``) replaces ``engine.kernels``."""
    p = Path(path)
    if not p.is_file():
        from sim.config import SCENARIO_DIR
        cand = SCENARIO_DIR / f"{path}.yaml"
        if not cand.is_file():
            raise ConfigError(f"{KEY}.scenario", str(path), "a validation spec YAML file (e.g. scenarios/validate-cpu.yaml)")
        p = cand
    from sim.inputs import load_yaml, read_text
    raw = load_yaml(read_text(p, f"{KEY}.scenario", "validation spec"), f"{KEY}.scenario", str(p))
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{KEY}.scenario", str(p), "a YAML mapping")
    bad = sorted(set(raw) - _ALLOWED)
    if bad:
        raise ConfigError(f"{KEY}.{bad[0]}", raw[bad[0]], f"unknown key; allowed: {', '.join(sorted(_ALLOWED))}")
    spec = _merge(DEFAULT_SPEC, raw)
    get_model(spec["model"])
    for i, ld in enumerate(spec["loads"]):
        if "name" not in ld or (("utilization" in ld) == ("rate" in ld)):
            raise ConfigError(f"{KEY}.loads[{i}]", ld, "a mapping with name and exactly one of utilization, rate")
    for a in spec["allocators"]:
        if a not in ("paged", "static"):
            raise ConfigError(f"{KEY}.allocators", a, "paged or static")
    clocks = spec["engine"].get("clocks")
    if not isinstance(clocks, list) or not clocks or len(set(clocks)) != len(clocks) \
            or any(c not in REPLAY_CLOCKS for c in clocks):
        raise ConfigError(f"{KEY}.engine.clocks", clocks, f"a non-empty list of distinct {', '.join(REPLAY_CLOCKS)}")
    if not isinstance(spec["quick"], dict):
        raise ConfigError(f"{KEY}.quick", spec["quick"], f"a mapping of {', '.join(sorted(QUICK_KEYS))}")
    bad = sorted(set(spec["quick"]) - QUICK_KEYS)
    if bad:
        raise ConfigError(f"{KEY}.quick.{bad[0]}", spec["quick"][bad[0]], f"unknown key; allowed: {', '.join(sorted(QUICK_KEYS))}")
    where = {k: "engine." + k for k in spec["engine"]}
    if quick:  # the quick subset's own engine options (CI keeps its calibration short)
        for k in QUICK_ENGINE_KEYS & set(spec["quick"]):
            spec["engine"][k], where[k] = spec["quick"][k], "quick." + k
    n = spec["engine"].get("replays")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 20:
        raise ConfigError(f"{KEY}.{where['replays']}", n, "an integer from 1 to 20: engine replays on the table's clock")
    for key, choices, meaning in (("overhead_rounds", OVERHEAD_ROUNDS, "where the engine-overhead calibration runs"),
                                  ("kernel_rounds", KERNEL_ROUNDS, "where the kernel route is timed"),
                                  ("overhead_mix", OVERHEAD_MIX, "how the engine-overhead runs fill their batches"),
                                  ("replay_order", REPLAY_ORDERS, "the order of the cells' replays")):
        if spec["engine"].get(key) not in choices:
            raise ConfigError(f"{KEY}.{where.get(key, 'engine.' + key)}", spec["engine"].get(key),
                              f"one of {', '.join(choices)}: {meaning}")
    if kernels is not None:
        spec["engine"]["kernels"], where["kernels"] = kernels, "engine.kernels (--kernels)"
    from .attention_backends import KERNELS
    if spec["engine"].get("kernels") not in KERNELS:
        raise ConfigError(f"{KEY}.engine.kernels", spec["engine"].get("kernels"),
                          f"one of {', '.join(KERNELS)}: the paged engine's attention backend")
    if not isinstance(spec["engine"].get("prefill_probe"), bool):
        raise ConfigError(f"{KEY}.engine.prefill_probe", spec["engine"].get("prefill_probe"),
                          "true or false: a second host-speed probe for iterations with prefill (cpu_norm)")
    if quick:
        q = spec["quick"]
        spec["workload"]["num_requests"] = int(q.get("num_requests", spec["workload"]["num_requests"]))
        names = q.get("loads")
        if names:
            spec["loads"] = [ld for ld in spec["loads"] if ld["name"] in names]
        spec["allocators"] = list(q.get("allocators", spec["allocators"]))
    spec["source"] = str(p)
    return spec


# --- scenarios for the simulator -----------------------------------------------------------------

def capacity_tokens(spec: dict) -> int:
    return int(spec["kv"]["num_blocks"]) * int(spec["kv"]["block_size"])


def sim_scenario(spec: dict, allocator: str, *, trace_path: str | None = None, profile: str | None = None,
                 arrival: dict | None = None, num_requests: int | None = None, device: str = "cpu"):
    """The Scenario the simulator runs for ``spec``: same knobs, KV capacity = the engine's."""
    model = get_model(spec["model"])
    gpu = GPUS[SIM_GPU[device]]
    bpt = model.kv_bytes_per_token("bf16")
    act = int(gpu.memory_bytes * 0.9) - model.weight_bytes("bf16") - capacity_tokens(spec) * bpt
    w = spec["workload"]
    if arrival is None:
        arrival = {"kind": "trace", "path": str(trace_path), "format": "csv"}
    d = {
        "name": f"{spec['name']}-{allocator}", "seed": int(w.get("seed", 0)),
        "model": {"name": spec["model"]},
        "gpu": {"name": gpu.name, "gpu_memory_utilization": 0.9, "activation_reserve_bytes": act},
        "workload": {"num_requests": int(num_requests or w["num_requests"]), "max_model_len": int(w["max_model_len"]),
                     "arrival": arrival},
        "scheduler": {"max_num_seqs": int(spec["scheduler"]["max_num_seqs"]),
                      "max_num_batched_tokens": int(spec["scheduler"]["max_num_batched_tokens"])},
        "allocator": {"kind": allocator, "block_size": int(spec["kv"]["block_size"]),
                      "reserve": int(spec["static_reserve"])},
        "cost_model": {"profile": profile or "none"},
    }
    if arrival.get("kind") != "trace":
        d["workload"]["lengths"] = copy.deepcopy(w["lengths"])
    return scenario_from_dict(d)


def make_requests(spec: dict, rate: float, device: str = "cpu") -> np.ndarray:
    """``[n, 3]`` rows ``(arrival_s, prompt, output)``: the spec's lengths, Poisson arrivals at ``rate``, first at 0.

    ``device`` only picks the GPU entry whose memory must hold the model (an 8B shape does not fit the
    ``cpu`` entry); the requests do not depend on it."""
    from sim.workload.generator import build_workload
    sc = sim_scenario(spec, "paged", arrival={"kind": "poisson", "rate": float(rate)}, device=device)
    wl = build_workload(sc)
    t = wl.arrival_s - wl.arrival_s[0]
    return np.column_stack([t, wl.prompt_tokens, wl.output_tokens]).astype(np.float64)


def write_trace(rows: np.ndarray, path: Path) -> Path:
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for a, p, o in rows:
            f.write(f"{float(a)!r},{int(p)},{int(o)}\n")
    return path


def estimate_capacity(spec: dict, allocator: str, profile: str, out: Path, device: str = "cpu") -> float:
    """Requests/s the simulator sustains for ``allocator`` when every request arrives at once."""
    from sim.engine.cluster import simulate
    rows = make_requests(spec, 1.0, device)
    rows[:, 0] = 0.0
    path = write_trace(rows, out / f"capacity-{allocator}.csv")
    s = simulate(sim_scenario(spec, allocator, trace_path=str(path), profile=profile, device=device)).summary
    return float(s["completed"]) / float(s["makespan_s"])


# --- metrics ----------------------------------------------------------------------------------------

def latency_metrics(arrival, first, finish, prompt, generated) -> dict:
    """The summary's definitions: TTFT, TPOT = (finish − first)/(generated − 1), e2e; tokens/s over the makespan."""
    arrival, first, finish = (np.asarray(x, dtype=np.float64) for x in (arrival, first, finish))
    prompt, generated = np.asarray(prompt), np.asarray(generated)
    out = {}
    multi = generated > 1
    series = {"ttft": first - arrival, "tpot": (finish - first)[multi] / (generated[multi] - 1), "e2e": finish - arrival}
    for k, v in series.items():
        for q in (50, 90, 99):
            out[f"{k}_p{q}"] = float(np.percentile(v, q)) if v.size else None
    makespan = float(finish.max() - arrival.min())
    out["throughput"] = float((prompt.sum() + generated.sum()) / makespan)
    return out


def rel_error(measured, simulated) -> float | None:
    if measured is None or simulated is None:
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return float(abs(simulated - measured) / abs(measured))


def _engine_metrics(res) -> dict:
    ok = [r for r in res.requests if r["status"] == "completed"]
    m = latency_metrics([r["arrival_s"] for r in ok], [r["first_token_s"] for r in ok], [r["finish_s"] for r in ok],
                        [r["prompt_tokens"] for r in ok], [r["generated_tokens"] for r in ok])
    m["peak_kv_blocks"] = float(res.peak_blocks())
    m["preemptions"] = int(res.preemptions())
    return m


def _sim_metrics(result, block_size: int) -> dict:
    req = result.requests
    ok = np.asarray(req["status"].to_pylist()) == "completed"
    col = lambda c: req[c].to_numpy()[ok]  # noqa: E731
    m = latency_metrics(col("arrival_s"), col("first_token_s"), col("finish_s"), col("prompt_tokens"),
                        col("generated_tokens"))
    bpt = result.summary["kv_bytes_per_token"]
    ts = result.timeseries
    m["peak_kv_blocks"] = float(ts["kv_reserved_bytes"].to_numpy().max() / bpt / block_size) if ts.num_rows else 0.0
    m["preemptions"] = int(result.summary["preemptions"])
    return m


# --- profile --------------------------------------------------------------------------------------

def validation_plan(spec: dict, device: str):
    """A route-1 grid covering the spec's batch shapes only (seconds, not minutes)."""
    from .kernels import Plan, _pow2
    model = get_model(spec["model"])
    T = int(spec["scheduler"]["max_num_batched_tokens"])
    S = int(spec["scheduler"]["max_num_seqs"])
    L = min(int(spec["workload"]["max_model_len"]), model.max_position)
    top = 1 << max(1, (max(T, S) - 1).bit_length())
    ltop = 1 << max(5, (L - 1).bit_length())
    return Plan(gemm_m=_pow2(1, top), ctx_batch=(1, 2, 4), ctx_len=_pow2(16, min(ltop, model.max_position), 1),
                ctx_max_tokens=4 * top, gen_batch=_pow2(1, 1 << (S - 1).bit_length()),
                gen_len=_pow2(16, min(ltop, model.max_position)), gen_max_kv_bytes=256 << 20, block_sizes=(8, 32),
                overhead_batch=_pow2(1, 64, 2), mem_bytes=_pow2(1 << 12, 1 << 24, 4), ew_tokens=(1, 16, 256),
                repeats=5, warmup=2, target_repeat_s=0.0005, passes=2 if device == "cpu" else 1,
                static_decode="static" in spec["allocators"])


def prepare_profiles(spec: dict, device: str, out: Path, profile: str | None, engine_overhead: bool = True,
                     progress: bool = False, speed: "HostSpeed | None" = None,
                     net=None) -> tuple[dict[str, str], dict, "OverheadRounds | None"]:
    """Profile file per allocator (kernel curves + the engine's measured overhead for that layout),
    the calibration's description, and the overhead's :class:`OverheadRounds` (to add rounds to
    and refit; ``None`` without ``engine_overhead``).

    ``speed`` (the ``cpu_norm`` clock's :class:`HostSpeed`): the whole calibration is put at one
    reference host speed. Its probes run 10 times before the kernel route and then between the
    route's points (every :attr:`HostSpeed.every_s` of wall time); the **reference** is the median of
    those probes, and every kernel sample is multiplied by reference ÷ the median of the probes
    around it (:meth:`HostSpeed.factor_at`); kernels are timed in thread CPU time. The overhead runs
    then run on the engine's ``cpu_norm`` clock with that reference (the replay's normalisation),
    so kernel curves, overhead fit and the ``cpu_norm`` replays share one reference speed.
    The static profile's decode-attention grid is the engine's static kernel (``decode_static``).
    """
    from sim.cost.profile import load_profile

    model = get_model(spec["model"])
    eng = spec["engine"]
    info: dict = {}
    t0 = time.perf_counter()
    cpu_clock = device == "cpu" and eng["clocks"][0] in ("cpu", "cpu_norm")
    if speed is not None:
        speed.sample("before_calibration", 10)
    bases = {}
    kernels = None
    if profile is None:
        kernels = KernelRounds(spec, device, model, speed=speed, cpu_time=cpu_clock, progress=progress)
        bases = kernels.bases()
        base = bases[spec["allocators"][0]]
        info["calibrated"] = {"route": "kvsim calibrate --device (route 1), validation grid",
                              "elapsed_s": kernels.log[0]["elapsed_s"],
                              "points": sum(base.provenance["measured_points"].values()),
                              "timer": "thread CPU time" if cpu_clock else "wall time",
                              "normalised": speed is not None}
    else:
        base = load_profile(profile)
        info["loaded"] = profile
        cdt = base.provenance.get("compute_dtype", base.dtypes.get("weight", ["?"])[0])
        if cdt != eng["dtype"]:
            info["dtype_mismatch"] = f"profile kernels timed in {cdt}, engine computes in {eng['dtype']}"
        bases = {a: base for a in spec["allocators"]}
    if speed is not None:
        speed.freeze()
    rounds = None
    if engine_overhead:
        norm = speed is not None and cpu_clock
        kw = dict(allocators=tuple(spec["allocators"]), block_size=int(spec["kv"]["block_size"]), dtype=eng["dtype"],
                  threads=int(eng["threads"]), device=device, kernels=eng.get("kernels", "auto"),
                  clock=("cpu_norm" if norm else "cpu") if cpu_clock else "wall",
                  probe_ref_s={a: speed.reference(a) for a in spec["allocators"]} if norm else None,
                  prefill_probe_ref_s={a: speed.prefill_reference(a) for a in speed.prefill_probes}
                  if norm and speed.prefill_probes else None,
                  max_num_batched_tokens=int(spec["scheduler"]["max_num_batched_tokens"]),
                  batches=tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= int(spec["scheduler"]["max_num_seqs"])),
                  mixes=OVERHEAD_MIX[eng.get("overhead_mix", "offline")],
                  net=net)
        rounds = OverheadRounds(bases, model, kw, speed if norm else None,
                                between_runs=(lambda: speed.sample("engine_overhead", 1)) if speed and not norm else None,
                                kernels=kernels if eng.get("kernel_rounds", "spread") == "spread" else None)
        rounds.upfront()
        paths = rounds.write(out)
        info["engine_overhead"] = rounds.summary()
    else:
        paths = {}
        for alloc in spec["allocators"]:
            path = out / f"profile-{alloc}.json"
            bases[alloc].write(path)
            paths[alloc] = str(path)
    if speed is not None:
        speed.sample("after_calibration", 10)
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)
    info["name"] = base.name
    return paths, info, rounds


class KernelRounds:
    """Route 1's validation grid (:func:`validation_plan`), timed up front and again, one pass,
    before every overhead round (``engine.kernel_rounds: spread``); the kernel curves are fitted on
    every pass pooled (:func:`calibration.kernels.pool_measurements`: per point the median of the
    passes' medians).

    Why: one route is one ~6 s window, and its curves move by shape from window to window even
    normalised by the probe (this sandbox, five routes back to back in one process, kernels-only
    predictions in reference units: a one-sequence decode 0.95–1.14 of their mean, four sequences
    0.88–1.11, a 256-token prefill 0.86–1.06, each route off in its own pattern). The overhead
    fit ``a + b·S + c·P`` takes out a level, not a shape, so a run's cells that lean on one shape
    (light load: one or two sequences; saturating: full batches) inherited that window's error.
    Pooled over the run, as the overhead already is, the pattern averages out. Each later pass is
    put at the frozen reference by the probes around its own points (:meth:`HostSpeed.kernel_round`).
    """

    def __init__(self, spec: dict, device: str, model, *, speed: "HostSpeed | None", cpu_time: bool,
                 progress: bool = False):
        from .kernels import measure_device
        eng = spec["engine"]
        self.spec, self.device, self.model, self.speed = spec, device, model, speed
        self.allocators = tuple(spec["allocators"])
        self.plan = validation_plan(spec, device)
        self.name = f"{device}-{model.name}-{eng['dtype']}-validate"
        self.kw = dict(dtype=eng["dtype"], threads=int(eng["threads"]), cpu_time=cpu_time,
                       kernels=eng.get("kernels", "auto"))
        t = time.perf_counter()
        meas, self.info = measure_device(device, model, self.plan, progress=progress, speed=speed, **self.kw)
        if speed is not None:
            speed.freeze()
        self.runs = [meas]
        self.log = [{"label": "calibration", "passes": self.plan.passes, "elapsed_s": round(time.perf_counter() - t, 1)}]
        self._bases: dict | None = None

    def round(self, label: str) -> None:
        """One more pass of the grid, pooled into :meth:`bases`."""
        from dataclasses import replace

        from .kernels import measure_device
        t = time.perf_counter()
        with self.speed.kernel_round() if self.speed is not None else contextlib.nullcontext():
            meas, _ = measure_device(self.device, self.model, replace(self.plan, passes=1), speed=self.speed, **self.kw)
        self.runs.append(meas)
        self.log.append({"label": label, "passes": 1, "elapsed_s": round(time.perf_counter() - t, 1)})
        self._bases = None

    def passes(self) -> int:
        return sum(x["passes"] for x in self.log)

    def bases(self) -> dict:
        """Per allocator, the kernel profile fitted on every pass so far (``static``: its decode grid
        the engine's static kernel, :func:`calibration.kernels.with_static_decode`)."""
        from .kernels import build_device_profile, pool_measurements, with_static_decode
        if self._bases is None:
            meas = self.runs[0] if len(self.runs) == 1 else pool_measurements(self.runs)
            base, _ = build_device_profile(meas, self.model, self.info, self.plan, name=self.name,
                                           dtype=self.spec["engine"]["dtype"],
                                           elapsed_s=sum(x["elapsed_s"] for x in self.log), key_dtype="bf16")
            if len(self.runs) > 1:
                base.provenance["kernel_rounds"] = {"passes": self.passes(), "runs": len(self.runs),
                                                    "pooled": "per point, the median of the runs' medians"}
            self._bases = {a: with_static_decode(base, meas, self.model) if a == "static" else base
                           for a in self.allocators}
        return self._bases


class OverheadRounds:
    """The reference engine's per-iteration overhead (:func:`calibration.kernels.measure_engine_overhead`),
    measured in rounds spread over the whole validation and fitted on all of them pooled.

    :meth:`upfront` runs the calibration's passes (3) before any replay; with
    ``engine.overhead_rounds: spread`` ``validate`` adds one pass (:meth:`round`, both layouts
    interleaved, new prompts each time) per cell, evenly among the replays, and one after the last, and
    the final profiles (:meth:`write`) are fitted on every pass pooled. Why: on a shared host one
    pass's fit moves far between rounds a few seconds apart (this sandbox, one process, 8 rounds of
    one pass: the median one-sequence decode iteration 1.96–3.60 ms paged, 1.43–2.86 ms static, on
    the ``cpu_norm`` clock), so a calibration taken in one 12 s window sets every cell's level by
    that window's luck. Spread over the run, the overhead is measured under the same mix of host
    states as the replays, still only on offline batches of its own prompts: nothing here reads
    a replay. Capacities and arrival rates are set from the up-front fit (they must exist before
    the first replay).
    """

    #: passes of the offline batches before the first replay
    upfront_passes = 3

    def __init__(self, bases: dict, model, kw: dict, speed: "HostSpeed | None" = None, between_runs=None,
                 kernels: "KernelRounds | None" = None):
        self.bases, self.model, self.kw, self.speed, self.between_runs = bases, model, kw, speed, between_runs
        self.kernels = kernels
        self.rows: dict[str, list] = {a: [] for a in kw["allocators"]}
        self.log: list[dict] = []
        self.t0 = time.perf_counter()
        self._fits: dict[str, dict] | None = None  # the pooled fit, until the next round

    def _measure(self, label: str, passes: int) -> None:
        from .kernels import measure_engine_overhead
        k = len(self.log)
        if k > 0 and self.kernels is not None:  # the kernel grid again, right before this round
            self.kernels.round(label)
        phase = "engine_overhead" if k == 0 else "overhead_rounds"
        ovs = measure_engine_overhead(self.bases, self.model, passes=passes, seed=k,
                                      probes=self.speed.logged(phase) if self.speed is not None else None,
                                      prefill_probes=self.speed.logged(phase, prefill=True) if self.speed is not None
                                      else None,
                                      between_runs=self.between_runs, **self.kw)
        for a, ov in ovs.items():
            self.rows[a] += [dict(r, round=k) for r in ov["rows"]]
        ov = ovs[next(iter(ovs))]
        self.log.append({"round": k, "label": label, "passes": passes, "elapsed_s": ov["elapsed_s"],
                         "start_s": round(time.perf_counter() - self.t0 - ov["elapsed_s"], 2)})
        self._meta = {x: ov[x] for x in ("block_size", "dtype", "threads", "clock", "batches", "prompt_range",
                                        "output_tokens", "mixes", "output_range") if x in ov}
        self._fits = None

    def upfront(self) -> None:
        self._measure("calibration", self.upfront_passes)

    def round(self, label: str) -> None:
        """One more pass of the offline batches (both layouts), pooled into the fit."""
        self._measure(label, 1)

    def _rebase(self) -> None:
        """With kernel rounds: the kernel curves pooled over every pass so far, and every overhead
        row's prediction and residual recomputed against them (the rows stay as measured)."""
        from .kernels import kernel_cost, repredict
        if self.kernels is None or len(self.kernels.runs) < 2:
            return
        self.bases = self.kernels.bases()
        for a in self.rows:
            cost = kernel_cost(self.bases[a], self.model, a, int(self.kw["block_size"]))
            self.rows[a] = repredict(self.rows[a], cost, self._meta["clock"])

    def fits(self) -> dict[str, dict]:
        """Per allocator, :func:`calibration.kernels._fit_overhead` on every round's rows pooled
        (against the pooled kernel curves, with kernel rounds)."""
        from .kernels import _fit_overhead
        if self._fits is None:
            self._rebase()
            passes = sum(x["passes"] for x in self.log)
            elapsed = round(sum(x["elapsed_s"] for x in self.log), 2)
            self._fits = {a: {**_fit_overhead(rows, self._meta["clock"]), "allocator": a, **self._meta,
                              "passes": passes, "rounds": len(self.log), "elapsed_s": elapsed,
                              **({"kernel_passes": self.kernels.passes()} if self.kernels is not None else {}),
                              **({"probe_ref_s": float(self.kw["probe_ref_s"][a])} if self.kw.get("probe_ref_s")
                                 else {})}
                          for a, rows in self.rows.items()}
        return self._fits

    def write(self, out: Path) -> dict[str, str]:
        """``profile-<allocator>.json`` per allocator: its kernel profile + the pooled overhead fit."""
        from .kernels import with_engine_overhead
        fits = self.fits()
        paths = {}
        for a, fit in fits.items():
            path = out / f"profile-{a}.json"
            with_engine_overhead(self.bases[a], fit, self.model).write(path)
            paths[a] = str(path)
        return paths

    def level_by_round(self) -> list[dict]:
        """Each round's pure-decode iterations, measured ÷ (kernels + pooled fit) summed: how far the
        host's (normalised) speed in that round sat from the pooled level."""
        from .kernels import row_time_s, step_overhead_s
        fits = self.fits()
        out = []
        for x in self.log:
            row = {k: x[k] for k in ("round", "label", "passes", "start_s", "elapsed_s")}
            for a, rows in self.rows.items():
                f = fits[a]
                rs = [r for r in rows if r["round"] == x["round"] and r["pure_decode"]]
                meas = sum(row_time_s(r, self._meta["clock"]) for r in rs)
                pred = float(sum(r["predicted_s"] for r in rs) + step_overhead_s(f, [r["seqs"] for r in rs]).sum())
                row[a] = round(meas / pred, 4) if pred > 0 else None
            out.append(row)
        return out

    def summary(self) -> dict:
        fits = self.fits()
        return {a: {k: v for k, v in f.items() if k not in ("rows", "speed_probes")} for a, f in fits.items()}


class _LoggedProbe:
    """A :class:`SpeedProbe` whose every measurement is also recorded in a :class:`HostSpeed` series
    (``prefill``: the allocator's prefill probe and its series)."""

    def __init__(self, host: "HostSpeed", allocator: str, phase: str, prefill: bool = False):
        self.host, self.allocator, self.phase, self.prefill = host, allocator, phase, prefill
        self.probe = (host.prefill_probes if prefill else host.probes)[allocator]
        self.shape = self.probe.shape
        self.prefill_tokens = self.probe.prefill_tokens

    def measure(self, warm: bool = True) -> float:
        x = self.probe.measure(warm=warm)
        self.host.record(self.allocator, self.phase, x, prefill=self.prefill)
        return x


class HostSpeed:
    """The ``cpu_norm`` clock's host-speed probes (:class:`calibration.engine.SpeedProbe`, one per
    allocator, on that allocator's engine) and the reference speed of the whole calibration.

    **Reference**: per allocator, the median of the probes taken before the kernel route (10) and
    between its points (:meth:`tick`, every :attr:`every_s` of wall time, every allocator's probe
    each time), fixed by :meth:`freeze` when the route ends (without a kernel route, ``--profile``:
    the 10 probes before calibration). Every kernel sample is multiplied by :meth:`factor_at` its
    time (reference ÷ the median of the 3 probes around it, geometric mean over the allocators'
    probes), the overhead runs and the replays run on the engine's ``cpu_norm`` clock with the same
    reference (thread CPU time × reference ÷ median of the last 3 probes). ``prefill_probes``
    (``engine.prefill_probe``, one :data:`calibration.engine.PREFILL_PROBE_CHUNKS` probe per
    allocator) run right before every probe and have their own reference, taken alike; the engine
    then normalises an iteration with prefill by them in proportion to its prefill tokens
    (:func:`calibration.engine.prefill_weight`). The kernel samples keep the mixed probe's factor:
    the overhead rounds, on the engine's clock, absorb what that leaves. So every time in the
    profile and in a ``cpu_norm`` replay is a time on a host running at the reference speed, which
    is compared with the profile as calibrated (no before/after rescaling). Nothing here looks at
    replay iterations or predictions.
    """

    #: seconds of calibration work (wall) between two probe rounds in the kernel route
    every_s = 0.05

    def __init__(self, probes: dict, prefill_probes: dict | None = None):
        self.probes = probes
        self.prefill_probes = prefill_probes or {}
        self.t0 = time.perf_counter()
        self.series: dict[str, list] = {a: [] for a in probes}
        self.prefill_series: dict[str, list] = {a: [] for a in self.prefill_probes}
        self._ref: dict[str, float] | None = None
        self._ref_pre: dict[str, float] = {}
        self._last = -math.inf
        self._win: dict | None = None
        self._win_len = -1
        self._phase: str | None = "kernels"  # what tick() records under; None: tick() does nothing

    def record(self, allocator: str, phase: str, probe_s: float, prefill: bool = False) -> None:
        """One probe time of ``allocator``'s probe (``prefill``: its prefill probe), stamped with the
        phase and the seconds since start."""
        (self.prefill_series if prefill else self.series)[allocator].append(
            (phase, round(time.perf_counter() - self.t0, 4), probe_s))

    def sample(self, phase: str, n: int) -> None:
        for a, p in self.probes.items():
            pp = self.prefill_probes.get(a)
            for _ in range(n):
                if pp is not None:  # right before the probe, as in a cpu_norm run
                    self.record(a, phase, pp.measure(warm=False), prefill=True)
                self.record(a, phase, p.measure())

    def tick(self, force: bool = False) -> None:
        """A probe round between kernel points, at most every :attr:`every_s` (``force``: now);
        nothing after :meth:`freeze` outside :meth:`kernel_round`."""
        if self._phase is None:
            return
        if force or time.perf_counter() - self._last >= self.every_s:
            self.sample(self._phase, 1)
            self._last = time.perf_counter()

    def freeze(self) -> None:
        """Fix the reference: the median of every probe so far (before and during the kernel route)."""
        if self._ref is not None:
            return
        self._ref = {a: float(np.median([x[2] for x in ser])) for a, ser in self.series.items()}
        self._ref_pre = {a: float(np.median([x[2] for x in ser])) for a, ser in self.prefill_series.items()}
        self._phase = None

    @contextlib.contextmanager
    def kernel_round(self):
        """While open, :meth:`tick` probes again (phase ``kernel_rounds``), so a later pass of the
        kernel route is put at the frozen reference by the probes around its own points."""
        self.freeze()
        self._phase, self._last = "kernel_rounds", -math.inf
        try:
            yield self
        finally:
            self._phase = None

    def factor_at(self, t: float) -> float:
        """reference ÷ host speed at ``perf_counter`` time ``t``: per allocator the median of the probe
        before ``t`` and its two neighbours, the geometric mean over allocators (freezes the reference)."""
        import bisect
        self.freeze()
        n = sum(len(ser) for ser in self.series.values())
        if n != self._win_len:  # probes logged since (overhead runs, kernel rounds)
            self._win = {a: ([self.t0 + x[1] for x in ser], [x[2] for x in ser]) for a, ser in self.series.items()}
            self._win_len = n
        logs = []
        for a, (ts, xs) in self._win.items():
            i = max(bisect.bisect_right(ts, t) - 1, 0)
            w = xs[max(i - 1, 0):i + 2]
            logs.append(math.log(self._ref[a] / float(np.median(w))))
        return math.exp(sum(logs) / len(logs))

    def logged(self, phase: str, prefill: bool = False) -> dict:
        """Per allocator, its probe (``prefill``: its prefill probe, ``{}`` without) recording every
        measurement under ``phase`` (the overhead runs)."""
        return {a: _LoggedProbe(self, a, phase, prefill) for a in (self.prefill_probes if prefill else self.probes)}

    def reference_phase(self, allocator: str) -> str:
        phases = {x[0] for x in self.series[allocator]}
        return "before_calibration+kernels" if "kernels" in phases else "before_calibration"

    def reference(self, allocator: str) -> float:
        self.freeze()
        return self._ref[allocator]

    def prefill_reference(self, allocator: str) -> float | None:
        """The prefill probe's reference (taken like :meth:`reference`), ``None`` without one."""
        self.freeze()
        return self._ref_pre.get(allocator)

    def run_kwargs(self, allocator: str) -> dict:
        """``Engine.run`` arguments of a ``cpu_norm`` run on ``allocator``'s engine."""
        kw = {"probe": self.probes[allocator], "probe_ref_s": self.reference(allocator)}
        if allocator in self.prefill_probes:
            kw.update(prefill_probe=self.prefill_probes[allocator], prefill_probe_ref_s=self.prefill_reference(allocator))
        return kw

    def summary(self) -> dict:
        out = {}
        for a, ser in self.series.items():
            v = np.array([x[2] for x in ser])
            phases = list(dict.fromkeys(x[0] for x in ser))
            out[a] = {"reference_s": self.reference(a), "reference_phase": self.reference_phase(a),
                      "probes": len(v), "probe_s": _pcts(v),
                      "by_phase_median_s": {ph: float(np.median([x[2] for x in ser if x[0] == ph])) for ph in phases},
                      "by_phase_p10_p90_s": {ph: [float(np.percentile([x[2] for x in ser if x[0] == ph], q))
                                                  for q in (10, 90)] for ph in phases},
                      "shape": self.probes[a].shape, "series": [[ph, t, round(x, 7)] for ph, t, x in ser]}
            pser = self.prefill_series.get(a)
            if pser:
                out[a]["prefill_probe"] = {
                    "reference_s": self.prefill_reference(a), "shape": self.prefill_probes[a].shape,
                    "probe_s": _pcts(np.array([x[2] for x in pser])),
                    "by_phase_median_s": {ph: float(np.median([x[2] for x in pser if x[0] == ph]))
                                          for ph in dict.fromkeys(x[0] for x in pser)},
                    "series": [[ph, t, round(x, 7)] for ph, t, x in pser]}
        return out


def probe_diagnostics(res) -> dict:
    """The host speed over a ``cpu_norm`` replay: its probe series and what it cost."""
    pr = res.info.get("speed_probes", [])
    if not pr:
        return {}
    ps = np.array([p["probe_s"] for p in pr])
    sc = np.array([p["scale"] for p in pr])
    busy = sum(it["cpu_s"] for it in res.iterations)
    return {"reference_s": res.config["probe_ref_s"], "every_s": res.config["probe_every_s"],
            "window": res.config["probe_window"], "probes": len(pr), "probe_s": _pcts(ps), "scale": _pcts(sc),
            "probe_p90_over_p10": float(np.percentile(ps, 90) / np.percentile(ps, 10)),
            "probe_cpu_over_engine_cpu": float(ps.sum() / busy) if busy > 0 else None,
            "series": [[round(p["engine_s"], 5), round(p["wall_s"], 4), round(p["probe_s"], 7), round(p["scale"], 4)]
                       for p in pr],
            **({"prefill_reference_s": res.config["prefill_probe_ref_s"],
                "prefill_probe_s": _pcts(np.array([p["prefill_probe_s"] for p in pr])),
                "prefill_scale": _pcts(np.array([p["prefill_scale"] for p in pr])),
                "prefill_probe_cpu_over_engine_cpu": float(sum(p["prefill_probe_s"] for p in pr) / busy) if busy > 0
                else None,
                "prefill_series": [[round(p["prefill_probe_s"], 7), round(p["prefill_scale"], 4)] for p in pr]}
               if "prefill_probe_ref_s" in res.config else {})}


# --- runs ------------------------------------------------------------------------------------------

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
            t["per_seq_delta_s"] = {**t["per_seq_delta_s"], "delta_s": [float(x) * f for x in t["per_seq_delta_s"]["delta_s"]]}
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


def cell_sensitivity(spec: dict, allocator: str, trace: Path, profile_path: str, device: str = "cpu",
                     factors=SENSITIVITY_FACTORS, at_one: dict | None = None) -> dict:
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
    from sim.engine.cluster import simulate
    from sim.cost.profile import load_profile
    B = int(spec["kv"]["block_size"])
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
            per.append(_sim_metrics(simulate(sc), B))
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
    doc = json.loads((folder / "validation.json").read_text())
    cfg = doc.get("config") or {}
    spec = {**cfg, "name": doc.get("name", "validate"), "model": (doc.get("shape") or {}).get("model")}
    device = (doc.get("device") or {}).get("kind", "cpu")
    out = {}
    for key in doc.get("rates", {}):
        load, alloc = key.split("/")
        trace, prof = folder / f"trace-{load}-{alloc}.csv", folder / f"profile-{alloc}.json"
        if trace.is_file() and prof.is_file():
            out[(load, alloc)] = cell_sensitivity(spec, alloc, trace, str(prof), device)
    return out


def engine_config(spec: dict, allocator: str, device: str):
    from .engine import EngineConfig
    e = spec["engine"]
    return EngineConfig(get_model(spec["model"]), num_blocks=int(spec["kv"]["num_blocks"]),
                        block_size=int(spec["kv"]["block_size"]), max_num_seqs=int(spec["scheduler"]["max_num_seqs"]),
                        max_num_batched_tokens=int(spec["scheduler"]["max_num_batched_tokens"]), allocator=allocator,
                        reserve=int(spec["static_reserve"]), max_model_len=int(spec["workload"]["max_model_len"]),
                        dtype=e["dtype"], threads=int(e["threads"]), seed=int(e["seed"]), device=device,
                        kernels=e.get("kernels", "auto"))


def _pcts(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    if not x.size:
        return {}
    return {f"p{q}": float(np.percentile(x, q)) for q in (10, 50, 90, 99)}


def iteration_diagnostics(res, cost) -> dict:
    """Per-iteration time measured vs predicted by the cost model for the same batch shapes."""
    from .kernels import engine_iteration_rows
    rows = engine_iteration_rows(res, cost)
    out = {}
    for name, sel in (("all", lambda r: True), ("pure_decode", lambda r: r["pure_decode"]),
                      ("mixed", lambda r: not r["pure_decode"])):
        rs = [r for r in rows if sel(r)]
        if not rs:
            continue
        meas = np.array([r["measured_s"] for r in rs])
        pred = np.array([r["predicted_s"] for r in rs])
        cpu = np.array([r["cpu_s"] for r in rs])
        out[name] = {"iterations": len(rs), "measured_s": _pcts(meas), "predicted_s": _pcts(pred),
                     "signed_rel_error": _pcts((pred - meas) / meas),
                     "abs_rel_error_median": float(np.median(np.abs(pred - meas) / meas)),
                     "sum_predicted_over_measured": float(pred.sum() / meas.sum()),
                     "cpu_over_wall": _pcts(cpu / meas),
                     "sum_cpu_over_wall": float(cpu.sum() / meas.sum()),
                     "sum_predicted_over_cpu": float(pred.sum() / cpu.sum()) if cpu.sum() > 0 else None}
    # pure-decode iterations by how many decode iterations came since the last one with a prefill
    # chunk (1..AFTER_PREFILL, slower than the steady state, then the steady state the fit prices)
    from .kernels import AFTER_PREFILL, decode_since_prefill
    by_k: dict[str, list] = {}
    for r, k in zip(rows, decode_since_prefill(rows)):
        if r["pure_decode"]:
            key = str(k) if k <= AFTER_PREFILL else f">{AFTER_PREFILL}"
            by_k.setdefault(key, []).append((r["predicted_s"], r["measured_s"]))
    out["after_prefill"] = {key: {"iterations": len(v), "sum_predicted_over_measured":
                                  float(sum(p for p, _ in v) / sum(m for _, m in v))} for key, v in by_k.items()}
    # cpu_norm replays: iterations right after a host-speed probe against the others (the probe leaves
    # its own cache state behind; a large share of probed iterations where iterations are long)
    probed = [r for r in rows if "after_probe" in r]
    if probed:
        out["after_probe"] = {}
        for key, flag in (("after_probe", True), ("other", False)):
            v = [(r["predicted_s"], r["measured_s"]) for r in probed if r["after_probe"] == flag]
            if v:
                out["after_probe"][key] = {"iterations": len(v),
                                           "sum_predicted_over_measured": float(sum(p for p, _ in v) / sum(m for _, m in v))}
    busy = sum(it["end_s"] - it["start_s"] for it in res.iterations)
    lag = [r["enqueued_s"] - r["arrival_s"] for r in res.requests if r["enqueued_s"] >= 0]
    span = max((r["finish_s"] for r in res.requests), default=0.0)
    out["busy_s"] = busy
    out["makespan_s"] = span
    out["feeder_lag_s"] = _pcts(lag)
    out["rows"] = [{k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    return out


def semantics_check(spec: dict, allocator: str, device: str, rows: np.ndarray, sim_result, cost, net=None) -> dict:
    """Engine on a virtual clock driven by ``cost`` (no compute) vs the simulator: must be identical.

    ``net``: the validation's shared :class:`~calibration.engine.Transformer` (it is never run here;
    sharing it saves drawing a model's weights again, a real cost at an 8B shape)."""
    from .engine import Engine
    eng = Engine(engine_config(spec, allocator, device), model=net)
    res = eng.run([tuple(r) for r in rows], clock="virtual", cost=cost, compute=False)
    req = sim_result.requests
    sim_rows = {int(i): (a, f, e) for i, a, f, e in zip(req["id"].to_pylist(), req["admitted_s"].to_pylist(),
                                                         req["first_token_s"].to_pylist(), req["finish_s"].to_pylist())}
    diffs = [max(abs(r["admitted_s"] - sim_rows[r["id"]][0]), abs(r["first_token_s"] - sim_rows[r["id"]][1]),
                 abs(r["finish_s"] - sim_rows[r["id"]][2])) for r in res.requests]
    bpt = sim_result.summary["kv_bytes_per_token"]
    B = int(spec["kv"]["block_size"])
    sim_peak = float(sim_result.timeseries["kv_reserved_bytes"].to_numpy().max() / bpt / B)
    out = {"engine_peak_kv_blocks": float(res.peak_blocks()), "sim_peak_kv_blocks": sim_peak,
           "engine_preemptions": res.preemptions(), "sim_preemptions": int(sim_result.summary["preemptions"]),
           "engine_iterations": len(res.iterations), "sim_iterations": int(sim_result.summary["iterations"]),
           "max_abs_time_diff_s": float(max(diffs)) if diffs else 0.0}
    out["identical"] = bool(out["engine_peak_kv_blocks"] == sim_peak and out["engine_preemptions"] == out["sim_preemptions"]
                            and out["engine_iterations"] == out["sim_iterations"] and out["max_abs_time_diff_s"] < 1e-6)
    return out


PROBE_TRACE = [(0.0, 64, 24), (0.0, 200, 24), (0.0, 120, 24), (0.0, 32, 24)] * 3


@dataclass
class HostProbeRun:
    """A host-speed probe's engine run (:func:`host_probe_run`), priced later by :func:`host_probe`."""
    result: object
    cpu_share: float


def host_probe_run(engine, clock: str = "cpu") -> HostProbeRun:
    """Host speed now: a fixed offline batch through the engine on ``clock`` (``cpu``: thread CPU
    time per iteration; ``wall``: wall time, so the CPU share other jobs leave is in it).

    Taken right after calibration and before and after every raw-clock replay: a measured ÷
    predicted ratio (:func:`host_probe`) that moves between them is the shared host (other jobs'
    cache, memory-bandwidth and SMT pressure), not the model."""
    return HostProbeRun(engine.run(PROBE_TRACE, clock=clock, lead_s=0.0), cpu_share(0.2))


def host_probe(run: HostProbeRun, cost) -> dict:
    """A probe run's measured ÷ predicted busy time under the cost model ``cost``."""
    from .kernels import engine_iteration_rows
    rows = engine_iteration_rows(run.result, cost)
    meas = sum(r["measured_s"] for r in rows)
    pred = sum(r["predicted_s"] for r in rows)
    return {"measured_s": round(meas, 5), "predicted_s": round(pred, 5), "measured_over_predicted": round(meas / pred, 4),
            "cpu_share": run.cpu_share}


@dataclass
class Replayed:
    """One cell's engine side (:func:`new_cell`, :func:`replay_cells`): the trace and, per replay
    clock, every replay and (raw clocks) the host probes around them."""
    load: dict
    allocator: str
    rate: float
    rows: np.ndarray
    trace: Path
    results: dict[str, list]
    probes: dict[str, tuple[HostProbeRun, HostProbeRun]]


def new_cell(spec: dict, allocator: str, load: dict, rate: float, out: Path, device: str) -> Replayed:
    """One load × allocator cell before any replay: its requests and their CSV trace."""
    rows = make_requests(spec, rate, device)
    trace = write_trace(rows, out / f"trace-{load['name']}-{allocator}.csv")
    return Replayed(load, allocator, rate, rows, trace, {c: [] for c in spec["engine"]["clocks"]}, {})


def replay_once(spec: dict, cell: Replayed, clock: str, engine, speed: "HostSpeed | None" = None) -> None:
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


def replay_cells(spec: dict, cells: list[Replayed], engines: dict, speed: "HostSpeed | None" = None,
                 before=None, say=None) -> None:
    """Every cell's replays: the table's clock (the first) ``engine.replays`` times, each other clock once.

    ``engine.replay_order: interleaved`` (default) replays every cell once, then every cell again,
    and so on, the raw clocks in the last sweep; ``blocked`` runs all of one cell's replays before
    the next cell's. Why interleave: a shared host's speed drifts over minutes and the ``cpu_norm``
    probe removes it only partly, so consecutive replays share a level (this sandbox, runs S6–S10:
    the model's busy-time ratio within a cell's three blocked replays 1–3 % apart, between cells up
    to 12 %). Blocked, each cell's median carries its own minute's level; interleaved, each median
    draws on windows spread over the whole run, the same windows for every cell.
    ``before(k, cell)`` is called before the k-th replay of the table's clock (k from 0)."""
    clocks = spec["engine"]["clocks"]
    n = int(spec["engine"].get("replays", 1))
    if spec["engine"].get("replay_order", "interleaved") == "blocked":
        order = [(c, i) for c in cells for i in range(n)]
    else:
        order = [(c, i) for i in range(n) for c in cells]
    for k, (cell, i) in enumerate(order):
        if before is not None:
            before(k, cell)
        if say is not None:
            say(f"replay {k + 1}/{len(order)}: {cell.allocator} {cell.load['name']} ({i + 1} of {n}), "
                f"{cell.rate:.2f} req/s, {len(cell.rows)} requests")
        replay_once(spec, cell, clocks[0], engines[cell.allocator], speed)
        if i == n - 1:  # the raw clocks once, after the cell's last replay of the table's clock
            for clock in clocks[1:]:
                replay_once(spec, cell, clock, engines[cell.allocator], speed)


def compare_cell(spec: dict, cell: Replayed, profile_path: str, out: Path, device: str, net=None) -> Run:
    """The simulator on one replayed cell's trace and the comparison, clock by clock.

    ``host_speed: probe``: the raw clocks' simulator runs on the profile with every time scaled by
    the geometric mean of the probes just before and just after their replay (measured ÷ predicted
    busy time: a recalibration bracketing, never taken from, the replay). ``host_speed: fixed``: the
    profile as calibrated. ``cpu_norm`` is always compared with the profile as calibrated."""
    from sim.engine.cluster import simulate
    from sim.engine.deployment import Deployment
    from sim.cost.profile import load_profile
    allocator, load = cell.allocator, cell.load
    sc = sim_scenario(spec, allocator, trace_path=str(cell.trace), profile=profile_path, device=device)
    sim_raw = simulate(sc)
    B = int(spec["kv"]["block_size"])
    raw = _sim_metrics(sim_raw, B)
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
            if spec.get("host_speed", "probe") == "probe":
                f = round(math.sqrt(probe["measured_over_predicted"] * probe_after["measured_over_predicted"]), 4)
                path = out / f"profile-{allocator}-{load['name']}-{clock}.json"
                scale_profile(load_profile(profile_path), f).write(path)
                sc_c = sim_scenario(spec, allocator, trace_path=str(cell.trace), profile=str(path), device=device)
                sims[clock] = simulate(sc_c)
                cost_c = Deployment.from_scenario(sc_c).make_cost_model(sc_c)
            else:
                sims[clock], cost_c = sim_raw, cost
            simulated[clock] = _sim_metrics(sims[clock], B)
            diags[clock] = iteration_diagnostics(res, cost_c)
            diags[clock]["host_probe_before"] = probe
            diags[clock]["host_probe_after"] = probe_after
            diags[clock]["unscaled"] = {k: v for k, v in iteration_diagnostics(res, cost).items() if k in ("all",)}
        per = [_engine_metrics(r) for r in ress]
        measured[clock], results[clock] = median_metrics(per), res
        if len(ress) > 1:
            per_replay[clock], more[clock] = per, ress[1:]
            # the first replay's diagnostics are the clock's own, computed above
            diags[clock]["replays"] = [replay_summary(r, m, diags[clock] if i == 0 else iteration_diagnostics(r, cost_c))
                                       for i, (r, m) in enumerate(zip(ress, per))]
    return Run(load["name"], allocator, cell.rate, simulated, sims, measured, results, diags, raw,
               semantics_check(spec, allocator, device, cell.rows, sim_raw, cost, net=net), per_replay, more,
               cell_sensitivity(spec, allocator, cell.trace, profile_path, device, at_one=raw))


def median_metrics(per: list[dict]) -> dict:
    """Each metric's median over the engine's replays of one trace (one replay: its own values).

    The simulator is deterministic; the engine is not (a shared host's speed moves within a replay),
    so one replay's percentiles carry that noise, which queueing amplifies at medium load. The
    median over replays keeps one disturbed replay from setting the measurement."""
    out = {}
    for k in per[0]:
        vals = [m[k] for m in per]
        if any(v is None for v in vals):
            out[k] = None
            continue
        med = float(np.median(vals))
        out[k] = int(med) if all(isinstance(v, int) for v in vals) and med.is_integer() else med
    return out


def replay_spread(vals: list) -> float | None:
    """(max − min) ÷ median of one metric over the engine's replays: its run-to-run noise."""
    if len(vals) < 2 or any(v is None for v in vals):
        return None
    med = float(np.median(vals))
    if med == 0:
        return 0.0 if max(vals) == min(vals) else None
    return float((max(vals) - min(vals)) / abs(med))


def replay_summary(res, metrics: dict, diag: dict) -> dict:
    """One replay in brief: its metrics, the model's busy-time ratio (from its
    :func:`iteration_diagnostics` ``diag``), the host-speed probe's median."""
    sp = probe_diagnostics(res)
    return {"metrics": metrics, "sum_predicted_over_measured": diag.get("all", {}).get("sum_predicted_over_measured"),
            "iterations": len(res.iterations), "wall_s": round(res.info.get("wall_s", 0.0), 3),
            "probe_p50_s": sp.get("probe_s", {}).get("p50") if sp else None}


def cpu_share(seconds: float = 0.3) -> float:
    """Share of one core a busy Python loop gets now (thread CPU time / wall time): 1.0 on a quiet host."""
    t0, c0 = time.perf_counter(), time.thread_time()
    x = 0
    while time.perf_counter() - t0 < seconds:
        x += 1
    return round((time.thread_time() - c0) / (time.perf_counter() - t0), 3)


def host_load() -> dict:
    try:
        la = os.getloadavg()
    except OSError:
        la = (None, None, None)
    return {"loadavg_1m": la[0], "loadavg_5m": la[1], "cores": os.cpu_count(), "cpu_share": cpu_share()}


def check_clocks(spec: dict, device: str) -> None:
    """Thread CPU time times a CPU engine's kernels, not a GPU's (they run asynchronously on the
    device): on ``cuda`` only the ``wall`` clock measures the engine."""
    clocks = spec["engine"]["clocks"]
    bad = [c for c in clocks if c in ("cpu", "cpu_norm")]
    if device != "cpu" and bad:
        raise ConfigError(f"{KEY}.engine.clocks", clocks,
                          f"[wall] with --device {device}: {', '.join(bad)} time the engine's thread on the CPU, "
                          "not its kernels on the GPU")


def validate(spec: dict, *, device: str = "cpu", profile: str | None = None, out: Path | str = "runs/validate",
             engine_overhead: bool = True, progress=None) -> dict:
    """Run the whole validation (see the module docstring); returns the ``validation.json`` document."""
    from .attention_backends import select
    from .kernels import check_device
    check_clocks(spec, device)
    check_device(device)
    # one backend for calibration and every engine of the run (auto resolved here, once)
    spec = copy.deepcopy(spec)
    spec["engine"]["kernels"] = select(spec["engine"].get("kernels", "auto"), device, key=f"{KEY}.engine.kernels")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    load_before = host_load()
    from sim.engine.deployment import Deployment

    from .engine import PREFILL_PROBE_CHUNKS, PREFILL_PROBE_DECODE_KV, Engine, SpeedProbe, Transformer
    first = engine_config(spec, spec["allocators"][0], device)
    # one set of weights for every engine of the run (the allocators differ in KV layout only)
    net = Transformer(first.model, first.dtype, first.device, first.seed)
    engines = {a: Engine(engine_config(spec, a, device), model=net) for a in spec["allocators"]}
    speed = None
    if "cpu_norm" in spec["engine"]["clocks"]:
        speed = HostSpeed({a: SpeedProbe(engines[a].cfg, engines[a].net) for a in spec["allocators"]},
                          {a: SpeedProbe(engines[a].cfg, engines[a].net, decode_kv=PREFILL_PROBE_DECODE_KV,
                                         chunks=PREFILL_PROBE_CHUNKS) for a in spec["allocators"]}
                          if spec["engine"].get("prefill_probe", True) else None)
    say(f"profile: {'calibrating ' + device if profile is None else profile} + engine overhead")
    paths, pinfo, rounds = prepare_profiles(spec, device, out, profile, engine_overhead, speed=speed, net=net)
    spread = rounds is not None and spec["engine"].get("overhead_rounds", "spread") == "spread"
    probe_runs = {a: host_probe_run(engines[a], "cpu" if device == "cpu" else "wall")  # thread CPU time does not
                  for a in spec["allocators"]}                                       # time GPU work
    caps = {}
    cells: list[Replayed] = []
    for alloc in spec["allocators"]:
        caps[alloc] = estimate_capacity(spec, alloc, paths[alloc], out, device)
        for load in spec["loads"]:
            rate = float(load["rate"]) if "rate" in load else float(load["utilization"]) * caps[alloc]
            cells.append(new_cell(spec, alloc, load, rate, out, device))
    n_rep = int(spec["engine"].get("replays", 1))

    def before(k: int, cell: Replayed) -> None:
        # as many rounds as cells, evenly among the table clock's replays
        if spread and k % n_rep == 0:
            rounds.round(f"before replay {k + 1} ({cell.load['name']}/{cell.allocator})")

    replay_cells(spec, cells, engines, speed, before=before, say=say)
    if spread:
        rounds.round("after the last replay")
        upfront = {a: str(Path(pth).with_name(f"profile-{a}-upfront.json")) for a, pth in paths.items()}
        for a, pth in paths.items():
            os.replace(pth, upfront[a])
        paths = rounds.write(out)
        pinfo["engine_overhead_upfront"] = {"files": upfront, "fit": pinfo["engine_overhead"]}
        pinfo["engine_overhead"] = rounds.summary()
        pinfo["overhead_rounds"] = rounds.level_by_round()
        if rounds.kernels is not None:
            pinfo["kernel_rounds"] = rounds.kernels.log
        say(f"engine overhead refitted on {len(rounds.log)} rounds ({sum(x['passes'] for x in rounds.log)} passes)"
            + (f", kernel curves on {rounds.kernels.passes()} passes" if rounds.kernels is not None else ""))
    if rounds is not None:  # every overhead-run iteration (full precision: a refit reproduces the fit)
        (out / "overhead_rows.json").write_text(json.dumps(rounds.rows))
    probes = {}
    for alloc in spec["allocators"]:  # the host's speed right after calibration (see host_probe_run)
        sc = sim_scenario(spec, alloc, profile=paths[alloc], arrival={"kind": "poisson", "rate": 1.0}, device=device)
        probes[alloc] = host_probe(probe_runs[alloc], Deployment.from_scenario(sc).make_cost_model(sc))
    runs = [compare_cell(spec, c, paths[c.allocator], out, device, net=net) for c in cells]
    clocks = list(spec["engine"]["clocks"])
    rows, by_clock = [], {c: [] for c in clocks}
    for r in runs:
        for c in clocks:
            for m in METRICS:
                meas, sim_v, raw = r.measured[c].get(m), r.simulated[c].get(m), r.simulated_raw.get(m)
                row = {"load": r.load, "allocator": r.allocator, "metric": m, "measured": meas,
                       "simulated": sim_v, "rel_error": rel_error(meas, sim_v), "clock": c,
                       "simulated_unscaled": raw, "rel_error_unscaled": rel_error(meas, raw),
                       **sensitivity_fields(rel_error(meas, sim_v), r.sensitivity.get(m))}
                if c in r.replays:
                    vals = [x.get(m) for x in r.replays[c]]
                    row.update(measured_replays=vals, rel_error_replays=[rel_error(v, sim_v) for v in vals],
                               replay_spread=replay_spread(vals))
                by_clock[c].append(row)
    rows = by_clock[clocks[0]]
    model = get_model(spec["model"])
    doc = {
        "format": "kvsim-validation", "version": 1, "spec": spec["source"], "name": spec["name"],
        "device": {"kind": device, "host": platform.node(), "cpu": _cpu_name(), "threads": int(spec["engine"]["threads"]),
                   "dtype": spec["engine"]["dtype"], "torch": _torch_version(), "kernels": spec["engine"]["kernels"],
                   "attention": engines[spec["allocators"][0]].attention.describe()},
        "profile": {"files": paths, **pinfo},
        "shape": {"model": model.name, "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
                  "kv_heads": model.kv_heads, "head_dim": model.head_dim, "intermediate": model.intermediate,
                  "vocab": model.vocab},
        "config": {"kv": spec["kv"], "scheduler": spec["scheduler"], "static_reserve": spec["static_reserve"],
                   "workload": spec["workload"], "loads": spec["loads"], "engine": spec["engine"]},
        "capacity_requests_per_s": caps,
        "rates": {f"{r.load}/{r.allocator}": r.rate for r in runs},
        "clock": clocks[0],
        "replays": int(spec["engine"].get("replays", 1)),
        "host_speed": spec.get("host_speed", "probe"),
        "clock_meaning": {c: CLOCK_MEANING[c] for c in clocks},
        "rows": rows,
        "rows_by_clock": by_clock,
        "semantics": {f"{r.load}/{r.allocator}": r.semantics for r in runs},
        "diagnostics": {f"{r.load}/{r.allocator}": {c: {k: v for k, v in d.items() if k != "rows"}
                                                     for c, d in r.diagnostics.items()} for r in runs},
        "host_load": {"before": load_before, "after": host_load()},
        "host_probe_after_calibration": probes,
        "host_speed_reference": speed.summary() if speed is not None else None,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    doc["summary"] = error_summary(rows)
    (out / "validation.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    (out / "iterations.json").write_text(json.dumps({f"{r.load}/{r.allocator}/{c}": d["rows"]
                                                     for r in runs for c, d in r.diagnostics.items()}))
    write_html(out / "validation.html", runs, doc)
    return doc


#: the cells the fidelity target is stated on: p50 and p90 of TTFT, TPOT and e2e
TARGET_METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90")


def sensitivity_fields(err: float | None, sens: float | None) -> dict:
    """A row's ``sensitivity`` (:func:`cell_sensitivity`) and ``step_equivalent``: its relative error ÷
    its sensitivity, the uniform step-time error that would explain it (``None`` where the metric
    hardly answers step time, sensitivity below :data:`SENSITIVITY_MIN`)."""
    eq = None if err is None or sens is None or sens < SENSITIVITY_MIN else float(err / sens)
    return {"sensitivity": sens, "step_equivalent": eq}


#: below this sensitivity a metric is set by arrivals, not step time (throughput at light load):
#: its error says nothing about step time
SENSITIVITY_MIN = 0.5


def error_summary(rows: list[dict]) -> dict:
    """The table in a line: of the p50/p90 TTFT, TPOT and e2e cells, how many are within 10 % and 5 %,
    the median and the worst error, and (with replays) how many errors are below the cell's own
    replay spread, i.e. cannot be told from the engine's run-to-run noise by this run."""
    cells = [r for r in rows if r["metric"] in TARGET_METRICS and r["rel_error"] is not None]
    if not cells:
        return {"cells": 0}
    errs = np.array([r["rel_error"] for r in cells])
    worst = cells[int(np.argmax(errs))]
    out = {"cells": len(cells), "within_10pct": int((errs <= 0.10).sum()), "within_5pct": int((errs <= 0.05).sum()),
           "median_rel_error": float(np.median(errs)), "max_rel_error": float(errs.max()),
           "worst": f"{worst['load']}/{worst['allocator']} {worst['metric']}"}
    spread = [r for r in cells if r.get("replay_spread") is not None]
    if spread:
        out["below_replay_spread"] = sum(r["rel_error"] <= r["replay_spread"] for r in spread)
    eq = [r for r in cells if r.get("step_equivalent") is not None]
    if eq:
        top = max(eq, key=lambda r: r["step_equivalent"])
        out["max_step_equivalent"] = float(top["step_equivalent"])
        out["max_step_equivalent_cell"] = f"{top['load']}/{top['allocator']} {top['metric']}"
        worst_s = max(eq, key=lambda r: r["sensitivity"])
        out["max_sensitivity"] = float(worst_s["sensitivity"])
        out["max_sensitivity_cell"] = f"{worst_s['load']}/{worst_s['allocator']} {worst_s['metric']}"
    return out


def _cpu_name() -> str:
    from .devices import cpu_model_name
    return cpu_model_name()


def _torch_version() -> str:
    from .kernels import import_torch
    return import_torch().__version__


# --- report ----------------------------------------------------------------------------------------

def _cdf(x):
    x = np.sort(np.asarray(x, dtype=np.float64))
    return x, (np.arange(1, x.size + 1) / max(x.size, 1))


def write_html(path: Path, runs: list[Run], doc: dict) -> Path | None:
    """Measured vs simulated CDFs (TTFT, TPOT, e2e), KV blocks over time, per-iteration times, host speed."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    titles = []
    for r in runs:
        t = f"{r.load}/{r.allocator}"
        titles += [f"{t}: TTFT CDF", f"{t}: TPOT CDF", f"{t}: e2e CDF", f"{t}: KV blocks in use",
                   f"{t}: iteration time ({doc['clock']} clock)", f"{t}: host speed (cpu_norm probe)"]
    fig = make_subplots(rows=len(runs), cols=6, subplot_titles=titles, horizontal_spacing=0.035,
                        vertical_spacing=0.3 / max(len(runs), 1))
    sim_c = "#d62728"
    colors = {"cpu_norm": "#9467bd", "cpu": "#1f77b4", "wall": "#17becf"}
    for i, r in enumerate(runs, start=1):
        first = next(iter(r.sim))
        sim_r = r.sim[first]
        req = sim_r.requests
        okm = np.asarray(req["status"].to_pylist()) == "completed"
        a, f, e, g = (req[c].to_numpy()[okm] for c in ("arrival_s", "first_token_s", "finish_s", "generated_tokens"))
        s_vals = [f - a, ((e - f)[g > 1] / (g[g > 1] - 1)), e - a]
        for c, res in r.engine.items():
            for k, rr in enumerate([res] + list(r.engine_more.get(c, []))):
                ok = [q for q in rr.requests if q["status"] == "completed"]
                m_vals = ([q["first_token_s"] - q["arrival_s"] for q in ok],
                          [(q["finish_s"] - q["first_token_s"]) / (q["generated_tokens"] - 1) for q in ok
                           if q["generated_tokens"] > 1],
                          [q["finish_s"] - q["arrival_s"] for q in ok])
                for j, mv in enumerate(m_vals, start=1):
                    x, y = _cdf(mv)
                    # further replays of the same trace: thinner, so the run-to-run spread shows
                    fig.add_trace(go.Scatter(x=x, y=y, mode="lines",
                                             line={"color": colors.get(c, "#1f77b4"), "width": 2 if k == 0 else 1},
                                             opacity=1.0 if k == 0 else 0.5,
                                             name=f"measured (engine, {c} clock)" + (" replay 1" if k == 0 and
                                                                                     c in r.engine_more else ""),
                                             legendgroup=c, showlegend=(i == 1 and j == 1 and k == 0)), i, j)
            its = res.iterations
            fig.add_trace(go.Scatter(x=[it["end_s"] for it in its], y=[it["blocks_in_use"] for it in its], mode="lines",
                                     line={"color": colors.get(c, "#1f77b4"), "shape": "hv"}, showlegend=False), i, 4)
        for j, sv in enumerate(s_vals, start=1):
            x, y = _cdf(sv)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line={"color": sim_c, "dash": "dash"},
                                     name="simulated", legendgroup="s", showlegend=(i == 1 and j == 1)), i, j)
            fig.update_xaxes(title_text="s", row=i, col=j)
        ts = sim_r.timeseries
        bpt = sim_r.summary["kv_bytes_per_token"]
        B = int(doc["config"]["kv"]["block_size"])
        fig.add_trace(go.Scatter(x=ts["t_s"].to_numpy(), y=ts["kv_reserved_bytes"].to_numpy() / bpt / B, mode="lines",
                                 line={"color": sim_c, "dash": "dash", "shape": "hv"}, showlegend=False), i, 4)
        rows = r.diagnostics[next(iter(r.diagnostics))]["rows"]
        fig.add_trace(go.Scatter(x=[q["predicted_s"] * 1e3 for q in rows], y=[q["measured_s"] * 1e3 for q in rows],
                                 mode="markers", marker={"size": 3, "color": ["#2ca02c" if q["pure_decode"] else "#ff7f0e"
                                                                              for q in rows]},
                                 showlegend=False, text=[f"seqs {q['seqs']} tokens {q['tokens']}" for q in rows]), i, 5)
        hi = max([q["measured_s"] * 1e3 for q in rows] + [1.0])
        fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line={"color": "#999", "dash": "dot"},
                                 showlegend=False), i, 5)
        sp = r.diagnostics.get("cpu_norm", {}).get("speed_probes", {}).get("series", [])
        if sp:
            fig.add_trace(go.Scatter(x=[q[0] for q in sp], y=[q[3] for q in sp], mode="lines",
                                     line={"color": colors["cpu_norm"], "shape": "hv"}, showlegend=False,
                                     text=[f"probe {q[2] * 1e3:.2f} ms" for q in sp]), i, 6)
            fig.update_xaxes(title_text="engine t (s)", row=i, col=6)
            fig.update_yaxes(title_text="reference / probe", row=i, col=6)
        fig.update_xaxes(title_text="t (s)", row=i, col=4)
        fig.update_xaxes(title_text="predicted ms (green: pure decode)", row=i, col=5)
        fig.update_yaxes(title_text="measured ms", row=i, col=5)
    errs = {(row["load"], row["allocator"], row["metric"]): row["rel_error"] for row in doc["rows"]}
    p50 = [v for (l_, a_, m), v in errs.items() if m in ("tpot_p50", "e2e_p50", "ttft_p50") and v is not None]
    fig.update_layout(height=330 * len(runs), width=2200,
                      title=f"kvsim validate: {doc['name']} on {doc['device']['cpu'] if doc['device']['kind'] == 'cpu' else doc['device']['kind']}"
                            f" ({doc['shape']['model']}, {doc['device']['dtype']}); profile {doc['profile']['name']}; "
                            f"max |rel error| of p50 TTFT/TPOT/e2e: {max(p50) if p50 else float('nan'):.1%}")
    from .html_report import write_figure_html
    return write_figure_html(fig, path)


def format_table(doc: dict) -> list[list[str]]:
    """Rows for the CLI: load, allocator, metric, measured, simulated, rel error (and, with replays,
    the replay spread: (max − min) ÷ median of the engine's replays; then, where the run has it, the
    cell's sensitivity to step time, :func:`cell_sensitivity`)."""
    out = []
    sens = any("sensitivity" in r for r in doc["rows"])
    for r in doc["rows"]:
        def f(v):
            return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        row = [r["load"], r["allocator"], r["metric"], f(r["measured"]), f(r["simulated"]),
               "-" if r["rel_error"] is None else f"{r['rel_error']:.1%}"]
        if "replay_spread" in r:
            sp = r["replay_spread"]
            row.append("-" if sp is None else f"{sp:.1%}")
        if sens:
            row.append("-" if r.get("sensitivity") is None else f"{r['sensitivity']:.1f}")
        out.append(row)
    return out
