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

The modules, in the order a run uses them:

* :mod:`~calibration.validate.spec`: the spec (:class:`ValidationSpec`), its defaults, allowed values and loading;
* :mod:`~calibration.validate.simulator`: the simulator's scenario, requests, traces and capacity;
* :mod:`~calibration.validate.host_speed`: the host-speed probes (``cpu_norm`` clock) and host load;
* :mod:`~calibration.validate.rounds`: the profiles (kernel and engine-overhead rounds, step 1);
* :mod:`~calibration.validate.replay`: the engine's replays and the comparison per cell (steps 3–5);
* :mod:`~calibration.validate.metrics`: what is compared, and the table in one line;
* :mod:`~calibration.validate.sensitivity`: each cell's sensitivity to step time;
* :mod:`~calibration.validate.report`: ``validation.html`` and the CLI's table;
* :mod:`~calibration.validate.run`: :func:`validate`, the whole run (step 6);
* :mod:`~calibration.validate.several_runs`: several runs of one spec read together (``kvsim validate-runs``);
* :mod:`~calibration.validate.refit`: a run's overhead fit refitted offline on its own replays
  (``python -m calibration.validate.refit``).

Callers import from this package; the names below are its interface.
"""

from __future__ import annotations

from .host_speed import (
    PROBE_TRACE,
    HostProbeRun,
    HostSpeed,
    cpu_share,
    host_load,
    host_probe,
    host_probe_run,
    probe_diagnostics,
)
from .metrics import METRICS, TARGET_METRICS, error_summary, latency_metrics, median_metrics, rel_error, replay_spread
from .replay import (
    Replayed,
    Run,
    compare_cell,
    engine_config,
    iteration_diagnostics,
    new_cell,
    replay_cells,
    replay_once,
    replay_summary,
    semantics_check,
)
from .report import format_table, write_html
from .rounds import KernelRounds, OverheadRounds, prepare_profiles, validation_plan
from .run import validate
from .sensitivity import (
    SENSITIVITY_FACTORS,
    SENSITIVITY_MIN,
    cell_sensitivity,
    run_sensitivity,
    scale_profile,
    sensitivity_fields,
)
from .simulator import SIM_GPU, capacity_tokens, estimate_capacity, make_requests, sim_scenario, write_trace
from .spec import (
    CLOCK_MEANING,
    DEFAULT_SPEC,
    KERNEL_ROUNDS,
    KEY,
    OVERHEAD_MIX,
    OVERHEAD_ROUNDS,
    QUICK_ENGINE_KEYS,
    QUICK_KEYS,
    REPLAY_CLOCKS,
    REPLAY_ORDERS,
    EngineSpec,
    KvSpec,
    LoadSpec,
    QuickSpec,
    SchedulerSpec,
    ValidationSpec,
    WorkloadSpec,
    check_clocks,
    load_spec,
)

__all__ = [
    "CLOCK_MEANING",
    "DEFAULT_SPEC",
    "KERNEL_ROUNDS",
    "KEY",
    "METRICS",
    "OVERHEAD_MIX",
    "OVERHEAD_ROUNDS",
    "PROBE_TRACE",
    "QUICK_ENGINE_KEYS",
    "QUICK_KEYS",
    "REPLAY_CLOCKS",
    "REPLAY_ORDERS",
    "SENSITIVITY_FACTORS",
    "SENSITIVITY_MIN",
    "SIM_GPU",
    "TARGET_METRICS",
    "EngineSpec",
    "HostProbeRun",
    "HostSpeed",
    "KernelRounds",
    "KvSpec",
    "LoadSpec",
    "OverheadRounds",
    "QuickSpec",
    "Replayed",
    "Run",
    "SchedulerSpec",
    "ValidationSpec",
    "WorkloadSpec",
    "capacity_tokens",
    "cell_sensitivity",
    "check_clocks",
    "compare_cell",
    "cpu_share",
    "engine_config",
    "error_summary",
    "estimate_capacity",
    "format_table",
    "host_load",
    "host_probe",
    "host_probe_run",
    "iteration_diagnostics",
    "latency_metrics",
    "load_spec",
    "make_requests",
    "median_metrics",
    "new_cell",
    "prepare_profiles",
    "probe_diagnostics",
    "rel_error",
    "replay_cells",
    "replay_once",
    "replay_spread",
    "replay_summary",
    "run_sensitivity",
    "scale_profile",
    "semantics_check",
    "sensitivity_fields",
    "sim_scenario",
    "validate",
    "validation_plan",
    "write_html",
    "write_trace",
]
