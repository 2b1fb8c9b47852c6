"""The shared host's speed during a validation: the ``cpu_norm`` clock's probes and reference
(:class:`HostSpeed`), the fixed batches bracketing a raw-clock replay (:func:`host_probe_run`), and
the host's load."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .metrics import percentiles


class _LoggedProbe:
    """A :class:`SpeedProbe` whose every measurement is also recorded in a :class:`HostSpeed` series
    (``prefill``: the allocator's prefill probe and its series)."""

    def __init__(self, host: HostSpeed, allocator: str, phase: str, prefill: bool = False):
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
            (phase, round(time.perf_counter() - self.t0, 4), probe_s)
        )

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

    def freeze(self) -> dict[str, float]:
        """Fix the reference: the median of every probe so far (before and during the kernel route).
        Returns it (seconds per allocator)."""
        if self._ref is not None:
            return self._ref
        self._ref = {a: float(np.median([x[2] for x in ser])) for a, ser in self.series.items()}
        self._ref_pre = {a: float(np.median([x[2] for x in ser])) for a, ser in self.prefill_series.items()}
        self._phase = None
        return self._ref

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

        ref = self.freeze()
        n = sum(len(ser) for ser in self.series.values())
        win = self._win
        if win is None or n != self._win_len:  # probes logged since (overhead runs, kernel rounds)
            win = self._win = {
                a: ([self.t0 + x[1] for x in ser], [x[2] for x in ser]) for a, ser in self.series.items()
            }
            self._win_len = n
        logs = []
        for a, (ts, xs) in win.items():
            i = max(bisect.bisect_right(ts, t) - 1, 0)
            w = xs[max(i - 1, 0) : i + 2]
            logs.append(math.log(ref[a] / float(np.median(w))))
        return math.exp(sum(logs) / len(logs))

    def logged(self, phase: str, prefill: bool = False) -> dict:
        """Per allocator, its probe (``prefill``: its prefill probe, ``{}`` without) recording every
        measurement under ``phase`` (the overhead runs)."""
        return {a: _LoggedProbe(self, a, phase, prefill) for a in (self.prefill_probes if prefill else self.probes)}

    def reference_phase(self, allocator: str) -> str:
        phases = {x[0] for x in self.series[allocator]}
        return "before_calibration+kernels" if "kernels" in phases else "before_calibration"

    def reference(self, allocator: str) -> float:
        return self.freeze()[allocator]

    def prefill_reference(self, allocator: str) -> float | None:
        """The prefill probe's reference (taken like :meth:`reference`), ``None`` without one."""
        self.freeze()
        return self._ref_pre.get(allocator)

    def run_kwargs(self, allocator: str) -> dict:
        """``Engine.run`` arguments of a ``cpu_norm`` run on ``allocator``'s engine."""
        kw = {"probe": self.probes[allocator], "probe_ref_s": self.reference(allocator)}
        if allocator in self.prefill_probes:
            kw.update(
                prefill_probe=self.prefill_probes[allocator], prefill_probe_ref_s=self.prefill_reference(allocator)
            )
        return kw

    def summary(self) -> dict:
        out = {}
        for a, ser in self.series.items():
            v = np.array([x[2] for x in ser])
            phases = list(dict.fromkeys(x[0] for x in ser))
            out[a] = {
                "reference_s": self.reference(a),
                "reference_phase": self.reference_phase(a),
                "probes": len(v),
                "probe_s": percentiles(v),
                "by_phase_median_s": {ph: float(np.median([x[2] for x in ser if x[0] == ph])) for ph in phases},
                "by_phase_p10_p90_s": {
                    ph: [float(np.percentile([x[2] for x in ser if x[0] == ph], q)) for q in (10, 90)] for ph in phases
                },
                "shape": self.probes[a].shape,
                "series": [[ph, t, round(x, 7)] for ph, t, x in ser],
            }
            pser = self.prefill_series.get(a)
            if pser:
                out[a]["prefill_probe"] = {
                    "reference_s": self.prefill_reference(a),
                    "shape": self.prefill_probes[a].shape,
                    "probe_s": percentiles(np.array([x[2] for x in pser])),
                    "by_phase_median_s": {
                        ph: float(np.median([x[2] for x in pser if x[0] == ph]))
                        for ph in dict.fromkeys(x[0] for x in pser)
                    },
                    "series": [[ph, t, round(x, 7)] for ph, t, x in pser],
                }
        return out


def probe_diagnostics(res) -> dict:
    """The host speed over a ``cpu_norm`` replay: its probe series and what it cost."""
    pr = res.info.get("speed_probes", [])
    if not pr:
        return {}
    ps = np.array([p["probe_s"] for p in pr])
    sc = np.array([p["scale"] for p in pr])
    busy = sum(it["cpu_s"] for it in res.iterations)
    return {
        "reference_s": res.config["probe_ref_s"],
        "every_s": res.config["probe_every_s"],
        "window": res.config["probe_window"],
        "probes": len(pr),
        "probe_s": percentiles(ps),
        "scale": percentiles(sc),
        "probe_p90_over_p10": float(np.percentile(ps, 90) / np.percentile(ps, 10)),
        "probe_cpu_over_engine_cpu": float(ps.sum() / busy) if busy > 0 else None,
        "series": [
            [round(p["engine_s"], 5), round(p["wall_s"], 4), round(p["probe_s"], 7), round(p["scale"], 4)] for p in pr
        ],
        **(
            {
                "prefill_reference_s": res.config["prefill_probe_ref_s"],
                "prefill_probe_s": percentiles(np.array([p["prefill_probe_s"] for p in pr])),
                "prefill_scale": percentiles(np.array([p["prefill_scale"] for p in pr])),
                "prefill_probe_cpu_over_engine_cpu": float(sum(p["prefill_probe_s"] for p in pr) / busy)
                if busy > 0
                else None,
                "prefill_series": [[round(p["prefill_probe_s"], 7), round(p["prefill_scale"], 4)] for p in pr],
            }
            if "prefill_probe_ref_s" in res.config
            else {}
        ),
    }


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
    from ..kernels import engine_iteration_rows

    rows = engine_iteration_rows(run.result, cost)
    meas = sum(r["measured_s"] for r in rows)
    pred = sum(r["predicted_s"] for r in rows)
    return {
        "measured_s": round(meas, 5),
        "predicted_s": round(pred, 5),
        "measured_over_predicted": round(meas / pred, 4),
        "cpu_share": run.cpu_share,
    }


def cpu_share(seconds: float = 0.3) -> float:
    """Share of one core a busy Python loop gets now (thread CPU time / wall time): 1.0 on a quiet host."""
    t0, c0 = time.perf_counter(), time.thread_time()
    x = 0
    while time.perf_counter() - t0 < seconds:
        x += 1
    return round((time.thread_time() - c0) / (time.perf_counter() - t0), 3)


def host_load() -> dict:
    la: tuple[float, float, float] | tuple[None, None, None]
    try:
        la = os.getloadavg()
    except OSError:
        la = (None, None, None)
    return {"loadavg_1m": la[0], "loadavg_5m": la[1], "cores": os.cpu_count(), "cpu_share": cpu_share()}
