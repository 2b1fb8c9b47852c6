"""The arrival rate at which a deployment saturates, from its cost model (no simulation).

The goodput search (:mod:`sim.analysis.planner`) starts here instead of bracketing blindly: an
SLO can only hold below the rate the deployment can serve at all. The estimate is the
steady state of continuous batching at full occupancy:

* **concurrency** B = min(``scheduler.max_num_seqs``, KV capacity ÷ footprint), the footprint
  being a static allocator's reservation per request, and otherwise the mean KV a request
  holds halfway through its decode (prompt + output/2 tokens);
* **decode**: one iteration of B sequences over B × (prompt + output/2) KV tokens yields B
  tokens, so a request's ``output`` tokens cost ``output × t_decode(B) / B`` seconds;
* **prefill**: the extra time of the iterations that carry a request's prompt, in chunks of at
  most ``max_num_batched_tokens``, on top of that decode batch;
* rate = replicas ÷ (prefill + decode seconds per request), requests/s.

Means are over the scenario's own length draws (requests longer than ``max_model_len`` are
refused, so they do not count). It ignores queueing, preemption and allocator work, so it is a
starting point, not an answer: the search verifies every rate it reports by simulation.

:func:`tail_room` counts how many of the longest requests fit at once in the memory that holds
them. Where only a few do (a small fallback region, a static partition of a few slots), a run is
decided by how often long requests coincide, which is rare and does not show in its first
requests: the planner then lets a run stop early only on a miss.
"""

from __future__ import annotations

import math

import numpy as np

from sim.config import Scenario
from sim.cost.model import BatchShape


def _sized(sc: Scenario):
    """``sc``'s workload and deployment (what both estimates read)."""
    from sim.engine.deployment import Deployment
    from sim.workload.generator import build_workload, total_length_percentile

    wl = build_workload(sc)
    return wl, Deployment.from_scenario(sc, lambda q: total_length_percentile(wl, q))


def load_limits(sc: Scenario) -> tuple[float, float]:
    """:func:`saturation_rate` and :func:`tail_room` of ``sc`` from one draw of its workload."""
    wl, dep = _sized(sc)
    return _saturation(sc, wl, dep), _tail_room(sc, wl, dep)


def saturation_rate(sc: Scenario) -> float:
    """Estimated saturation arrival rate of ``sc``'s deployment, requests/s (all replicas)."""
    return _saturation(sc, *_sized(sc))


def _saturation(sc: Scenario, wl, dep) -> float:
    cost = dep.make_cost_model(sc)
    sched = dep.scheduler or sc.scheduler
    keep = wl.prompt_tokens + wl.output_tokens <= sc.workload.max_model_len
    if not keep.any():
        return 0.0
    prompt = wl.prompt_tokens[keep].astype(np.float64)
    output = wl.output_tokens[keep].astype(np.float64)
    reserve = dep.reserve_tokens
    if reserve is not None and reserve > 0 and sc.allocator.kind == "static":
        output = np.minimum(output, np.maximum(reserve - prompt, 1.0))  # a ceiling truncates
    ctx = float(np.mean(prompt + output / 2.0))
    footprint = float(reserve) if reserve and sc.allocator.kind == "static" else ctx
    seqs = max(1, min(int(sched.max_num_seqs), int(dep.kv_capacity_tokens // max(footprint, 1.0))))
    t_decode = float(cost.decode_times_s(seqs, np.array([seqs * ctx], dtype=np.float64))[0])
    p_mean = float(np.mean(prompt))
    chunk = max(1, min(int(math.ceil(p_mean)), int(sched.max_num_batched_tokens) - seqs))
    n_chunks = math.ceil(p_mean / chunk)
    mixed = cost.mixed_step_time_s(BatchShape([(chunk, 0)], seqs, int(seqs * ctx)))
    t_prefill = n_chunks * max(mixed - t_decode, 0.0)
    per_request_s = t_prefill + float(np.mean(output)) * t_decode / seqs
    return sc.gpu.replicas / per_request_s if per_request_s > 0 else math.inf


def tail_room(sc: Scenario) -> float:
    """How many of the workload's longest requests fit at once in the memory that holds them
    (``inf`` when no request needs it): the paged fallback region of ``static`` with ``overflow:
    fallback`` for the requests longer than the reservation, the ``max_model_len`` slots of
    ``hybrid_tail``'s static partition, the reservations of other ``static`` allocators, and the
    whole KV capacity otherwise. "Longest" is the 99th percentile of total tokens of the lengths the
    workload is drawn from (:meth:`sim.workload.generator.Workload.reference_lengths`), among the
    requests the memory serves."""
    return _tail_room(sc, *_sized(sc))


def _tail_room(sc: Scenario, wl, dep) -> float:
    a, cap = sc.allocator, float(dep.kv_capacity_tokens)
    p, o = wl.reference_lengths()
    total = (p + o).astype(np.float64)
    total = total[total <= sc.workload.max_model_len]
    if a.kind == "hybrid_tail":
        return float(int(cap * a.static_fraction) // max(int(sc.workload.max_model_len), 1))
    reserve = dep.reserve_tokens
    if a.kind == "static" and reserve:
        if a.overflow != "fallback":
            return float((cap // reserve) if total.size else math.inf)
        total = total[total > reserve]
        cap = float(int(cap * a.fallback_fraction))
    if not total.size:
        return math.inf
    return cap / max(float(np.percentile(total, 99)), 1.0)
