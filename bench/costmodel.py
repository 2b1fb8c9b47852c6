"""Per-call time of the calibrated cost model against the roofline prior.

A run of chat-api records every batch shape the engine priced (mixed steps, decode windows);
those calls are then replayed, timed, through the calibrated profile model and the roofline
model of the same deployment. Replaying the same shapes side by side makes the ratio robust to
the machine's load.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .common import load_avg, table, write_json

SCENARIO = "chat-api"


def _recording(inner):
    """A copy of the calibrated model ``inner`` that keeps the arguments of the engine's pricing
    calls. A subclass, not a wrapper: the compiled engine (sim/native.py) accepts only CostModels."""
    from sim.cost.profile_model import ProfileCostModel

    class _Recording(ProfileCostModel):
        # Only the engine's calls: the model's own calls between these methods (a long window
        # priced through ``decode_times_s``) reach the overrides too, and are not recorded again.
        def _keep(self, call, method, *args):
            if self.depth == 0:
                self.calls.append(call)
            self.depth += 1
            try:
                return method(*args)
            finally:
                self.depth -= 1

        def step_time_s(self, batch):
            return self._keep(("step", batch), super().step_time_s, batch)

        def decode_times_s(self, n, kv):
            return self._keep(("decode", n, np.array(kv, dtype=np.float64)), super().decode_times_s, n, kv)

        def decode_times_list(self, n, kv):
            # The engine's cohort windows (lists; every CostModel has the method).
            return self._keep(
                ("decode_list", n, np.array(kv, dtype=np.float64), list(kv)), super().decode_times_list, n, kv
            )

        def take_back_out_of_range(self, reprice):
            # Not pricing: the engine recounts a cut window's diagnostics; its calls are not kept.
            self.depth += 1
            try:
                return super().take_back_out_of_range(reprice)
            finally:
                self.depth -= 1

        def decode_window_times(self, n, kv_first, k):
            # The engine's cohort windows without a sliding-window cap: KV from kv_first, n more each.
            kv = np.array([float(kv_first + n * j) for j in range(k)], dtype=np.float64)
            return self._keep(("window", n, kv, kv_first, k), super().decode_window_times, n, kv_first, k)

    rec = _Recording(inner.profile, inner.model, inner.gpu, tensor_parallel=inner.tp, layout=inner.layout)
    rec.calls, rec.depth = [], 0
    return rec


def _replay(cm, calls, repeats: int, lists: bool = True) -> float:
    """Best of ``repeats`` replays; ``lists=False`` prices windows through ``decode_times_s``
    (the reference evaluation's only window path)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c in calls:
            if c[0] == "step":
                cm.step_time_s(c[1])
            elif c[0] == "decode_list" and lists:
                cm.decode_times_list(c[1], c[3])
            elif c[0] == "window" and lists:
                cm.decode_window_times(c[1], c[3], c[4])
            else:
                cm.decode_times_s(c[1], c[2])
        best = min(best, time.perf_counter() - t0)
    return best


def _reference(sc, dep):
    """The plain evaluation of the same profile (:mod:`bench.costmodel_reference`), which the fast
    model must equal: the speed-up is measured against it."""
    from .costmodel_reference import ReferenceProfileCostModel

    cm = dep.make_cost_model(sc)
    return ReferenceProfileCostModel(cm.profile, cm.model, cm.gpu, tensor_parallel=cm.tp, layout=cm.layout)


def run(quick: bool, out: Path) -> dict:
    import sim.engine.deployment as dep_mod
    from sim.config import load_scenario
    from sim.engine.cluster import simulate

    n = 300 if quick else 2000
    sc = load_scenario(SCENARIO, {"workload.num_requests": n})
    recorders: list = []
    orig = dep_mod.Deployment.make_cost_model

    def make(self, scn):
        r = _recording(orig(self, scn))
        recorders.append(r)
        return r

    dep_mod.Deployment.make_cost_model = make
    try:
        priced = simulate(sc).summary["windows"]  # batch changes: each priced by one call
    finally:
        dep_mod.Deployment.make_cost_model = orig
    calls = recorders[0].calls
    dep = dep_mod.Deployment.from_scenario(sc, lambda q: 0)
    roofline = dep.make_cost_model(load_scenario(SCENARIO, {"workload.num_requests": n, "cost_model.profile": "none"}))
    profile_cm = dep.make_cost_model(sc)  # empty caches: the first replay pays them, later ones find them warm
    load0 = load_avg()
    repeats = 3 if quick else 5
    t_first = _replay(profile_cm, calls, 1)
    t_prof = _replay(profile_cm, calls, repeats)
    t_roof = _replay(roofline, calls, repeats)
    t_ref = _replay(_reference(sc, dep), calls, repeats, lists=False)
    mixed = sum(1 for c in calls if c[0] == "step" and c[1].prefill_chunks)
    decode_calls = [c for c in calls if c[0] in ("decode", "decode_list", "window")]
    k = [len(c[2]) for c in decode_calls]
    per_call = {
        "profile_us": 1e6 * t_prof / len(calls),
        "profile_first_pass_us": 1e6 * t_first / len(calls),
        "roofline_us": 1e6 * t_roof / len(calls),
    }
    table(
        f"cost model per engine call ({len(calls):,} calls of a {n:,}-request {SCENARIO} run; load {load0[:1]})",
        ["model", "total s", "µs per call", "vs roofline"],
        [
            [profile_cm.name + " (warm caches)", t_prof, per_call["profile_us"], t_prof / t_roof],
            [profile_cm.name + " (first pass)", t_first, per_call["profile_first_pass_us"], t_first / t_roof],
            ["roofline-uncalibrated", t_roof, per_call["roofline_us"], 1.0],
            [profile_cm.name + " (plain-evaluation reference)", t_ref, 1e6 * t_ref / len(calls), t_ref / t_roof],
        ],
    )
    data = {
        "bench": "costmodel",
        "quick": quick,
        "scenario": SCENARIO,
        "requests": n,
        "calls": len(calls),
        "engine_batch_changes": priced,
        "mixed_step_calls": mixed,
        "pure_decode_step_calls": sum(1 for c in calls if c[0] == "step") - mixed,
        "decode_window_calls": len(decode_calls),
        "decode_window_len_mean": float(np.mean(k)) if k else 0.0,
        "decode_window_len_max": int(max(k)) if k else 0,
        "seconds": {"profile_warm": t_prof, "profile_first_pass": t_first, "roofline": t_roof},
        "per_call": per_call,
        "profile_over_roofline": t_prof / t_roof,
        "load_avg": load0,
        "reference_s": t_ref,
        "speedup_over_reference": t_ref / t_prof,
    }
    write_json(out, "costmodel", data)
    return data
