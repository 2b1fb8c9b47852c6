"""The unmeasured constants a plan's recommendation rests on, and where it would flip.

A calibrated profile measures kernels; a few figures that decide between allocation strategies
are not measured by its tables and come from the literature or a guess:

* the **paged-attention overhead** — how much slower decode attention over a block table is than
  over a contiguous cache (``layout.paged_overhead`` of a tables-built profile, whose tables were
  measured on a paged cache, so contiguous layouts are priced ``1/(1 + overhead)`` of them; the
  roofline prior's ``cost_model.paged_attention_overhead`` prices paged layouts ``1 + overhead``
  times contiguous);
* the **allocation-event cost** — seconds of allocator bookkeeping per block or extent grabbed
  (``memory.alloc_event_s``);
* the **KV capacity** — tokens one replica's KV cache holds, derived from the GPU's memory (its
  share ``gpu.gpu_memory_utilization`` less the weights and an activation reserve) unless the
  scenario sets what the server logged (``gpu.kv_cache_tokens``): servers hold less than the
  derivation where it leaves out their CUDA graphs and buffers (docs/calibration.md, "KV capacity").

Profiles that measured a figure (``kvsim calibrate --device``: the source starts with
``measured``) are not listed, nor a KV capacity the scenario sets. For each listed constant the
plan gives its value and source, and the **break-even**: the value at which the recommendation
would change, in each direction up to the end of a plausible range (:data:`RANGES`,
:data:`KV_SHARES`): if the recommendation changes at the range's end,
steps of doubling size away from the nominal value find the first value where it does, and
bisection between that value and the step before locates the flip. At each value
tried, the candidates whose runs depend on the constant are re-planned exactly as the plan
searched them (the guided search from the saturation estimate of the changed cost model, so a
full plan with the constant at that value finds the same goodputs; with a target rate, the
replica search starts from the nominal count) and the same rules pick a recommendation
(:func:`sim.analysis.recommend.recommend`; operating-point facts, which only break ties, are kept
from the nominal plan).

Pruning, from monotonicity (a faster kernel or a cheaper allocator event never lowers a
candidate's goodput): a direction that only slows candidates the recommended one does not share
cannot flip it, and is reported without simulation; after the range's end, only the candidates
that beat the recommended one there are re-planned during the bisection.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import scenario_from_dict

#: Bisection steps per direction, after stepping out from the nominal value to the first flip:
#: the flip is located to 1/2^steps of the last step.
STEPS = 4
#: Searched span per constant: (lowest, highest) value, and whether to bisect in log space above zero.
RANGES = {"paged_overhead": (0.0, 1.0, False), "alloc_event_s": (0.0, 1e-4, True)}
#: The KV capacity's span, as shares of the derived one: the H100 servers of the shipped benchmark
#: file held 7-12 % (TensorRT-LLM, vLLM) and about half (SGLang) less than kvsim derives for them;
#: a server given more of the memory (``--gpu-memory-utilization 0.95``) holds a little more.
KV_SHARES = (0.5, 1.1)
MEASURE_HINT = {
    "paged_overhead": "measure it with `kvsim calibrate --device cuda` on your GPU (times paged and contiguous "
    "decode attention; docs/calibration.md)",
    "alloc_event_s": "measure it with `kvsim calibrate --device cuda` on your GPU (times the block allocator's "
    "bookkeeping; docs/calibration.md)",
    "kv_capacity": "read it off your server's log (vLLM: 'GPU KV cache size: N tokens', SGLang: "
    "max_total_num_tokens) and set gpu.kv_cache_tokens",
}
#: Where a derived KV capacity comes from, as plans say it.
KV_SOURCE = (
    "derived from memory: tensor_parallel x memory x gpu_memory_utilization - weights - activation reserve; "
    "the H100 servers of the shipped benchmark file held 7-12 % less (docs/calibration.md, KV capacity)"
)


@dataclass
class Constant:
    """One unmeasured figure of the plan's cost model or deployment."""

    #: ``paged_overhead``, ``alloc_event_s`` or ``kv_capacity``.
    kind: str
    #: Where it lives: ``layout.paged_overhead`` (profile), ``cost_model.paged_attention_overhead``
    #: (roofline scenario key), ``memory.alloc_event_s`` (profile), ``gpu.kv_cache_tokens`` (scenario key).
    key: str
    value: float
    source: str
    #: The profile file to copy with the constant changed (None for a scenario key).
    profile_path: str | None
    #: Whether raising the value slows paged layouts (roofline) or contiguous ones get faster (profile).
    favours: str

    def describe(self, v: float) -> str:
        if self.kind == "paged_overhead":
            return f"{v * 100:.2g} %"
        if self.kind == "kv_capacity":
            return f"{round(v):,} tokens"
        return f"{v * 1e6:.3g} µs"

    def span(self) -> tuple[float, float, bool]:
        """(lowest, highest) value searched, and whether in log space (:data:`RANGES`, :data:`KV_SHARES`)."""
        if self.kind == "kv_capacity":
            return (round(KV_SHARES[0] * self.value), round(KV_SHARES[1] * self.value), False)
        return RANGES[self.kind]


def _kv_capacity(sc) -> Constant | None:
    """The derived KV capacity of ``sc`` as a constant (``None`` where the scenario sets it), in the
    tokens ``gpu.kv_cache_tokens`` counts."""
    if sc.gpu.kv_cache_tokens is not None:
        return None
    from sim.engine.deployment import derived_kv_cache_tokens

    return Constant("kv_capacity", "gpu.kv_cache_tokens", float(derived_kv_cache_tokens(sc)), KV_SOURCE, None, "")


def _profile_path(sc) -> str | None:
    """The profile file a scenario's cost model reads, or None for the roofline prior."""
    from sim.cost.profile import PROFILE_DIR
    from sim.engine.deployment import BUILTIN_PROFILE_FOR_GPU, Deployment, gpu_spec

    ref = sc.cost_model.profile
    if ref in (None, "none"):
        return None
    if ref == "auto":
        ref = BUILTIN_PROFILE_FOR_GPU.get(gpu_spec(sc.gpu).name)
        if ref is None:
            return None
    from sim.workload.generator import build_workload, total_length_percentile

    wl = build_workload(sc)
    cost = Deployment.from_scenario(sc, lambda q: total_length_percentile(wl, q)).make_cost_model(sc)
    if not cost.calibrated:
        return None  # auto fell back to the roofline prior
    path = Path(ref)
    return str(path if path.is_file() else PROFILE_DIR / f"{ref}.json")


def constants(sc) -> list[Constant]:
    """The unmeasured constants of ``sc``'s cost model and deployment (module docstring)."""
    kv = _kv_capacity(sc)
    return _cost_constants(sc) + ([kv] if kv is not None else [])


def _cost_constants(sc) -> list[Constant]:
    path = _profile_path(sc)
    if path is None:
        c = sc.cost_model
        return [
            Constant(
                "paged_overhead",
                "cost_model.paged_attention_overhead",
                float(c.paged_attention_overhead),
                "roofline prior default: the vLLM paper (SOSP 2023) section 7.1, PagedAttention kernel "
                "20-26 % slower than a contiguous-cache kernel"
                if c.paged_attention_overhead == 0.2
                else "set in the scenario",
                None,
                "contiguous",
            )
        ]
    doc = _profile_doc(path)
    out = []
    lay, mem = doc.get("layout", {}), doc.get("memory", {})
    src = str(lay.get("paged_overhead_source", ""))
    if "paged_overhead" in lay and not src.startswith("measured") and not lay.get("paged_overhead_by_block_size"):
        out.append(
            Constant("paged_overhead", "layout.paged_overhead", float(lay["paged_overhead"]), src, path, "contiguous")
        )
    msrc = str(mem.get("source", ""))
    if "alloc_event_s" in mem and "alloc_event_s is an assumption" in msrc:
        out.append(
            Constant(
                "alloc_event_s",
                "memory.alloc_event_s",
                float(mem["alloc_event_s"]),
                "assumption (no published measurement): " + msrc.split("; ")[-1],
                path,
                "fewer events",
            )
        )
    return out


def _profile_doc(path: str | Path) -> dict:
    """A profile's JSON, read bounded (size, UTF-8, nesting: sim/inputs.py)."""
    from sim.inputs import load_json, read_text

    return load_json(read_text(path, "cost_model.profile", "profile JSON file"), "cost_model.profile", str(path))


class _Variants:
    """Scenario overrides that set a constant to a value (profile copies in a temporary folder)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvsim-plan-"))
        self._docs: dict[str, dict] = {}
        self._n = 0

    def overrides(self, c: Constant, v: float) -> dict:
        if c.profile_path is None:
            return {c.key: round(v) if c.kind == "kv_capacity" else v}
        doc = self._docs.get(c.profile_path)
        if doc is None:
            doc = self._docs[c.profile_path] = _profile_doc(c.profile_path)
        section, field = c.key.split(".")
        changed = {**doc, section: {**doc[section], field: v}}
        self._n += 1
        path = self.dir / f"{Path(c.profile_path).stem}-{self._n}.json"
        path.write_text(json.dumps(changed, separators=(",", ":")))
        return {"cost_model.profile": str(path)}

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _affected(c: Constant, cand: dict) -> bool:
    """Whether a candidate's runs depend on the constant."""
    from sim.allocators.registry import get as allocator_kind

    if c.kind == "alloc_event_s":
        return bool((cand.get("operating_point") or {}).get("allocation_time_s"))
    if c.kind == "kv_capacity":
        return True  # every candidate's allocator holds its KV in it
    paged = allocator_kind(cand["overrides"].get("allocator.kind", "paged")).paged_layout
    # A profile prices contiguous layouts from its paged tables; the roofline prices paged ones.
    return not paged if c.profile_path is not None else paged


def _helps(c: Constant, up: bool) -> bool:
    """Whether moving the constant up (or down) makes the affected candidates faster."""
    if c.kind == "alloc_event_s":
        return not up
    if c.kind == "kv_capacity":
        return up
    return up if c.profile_path is not None else not up


def _short(c: Constant) -> str:
    """The constant with its value and where its source is (the full source is in plan.json)."""
    first = c.source.split(";")[0].split(":")[0]
    return f"{c.key} = {c.describe(c.value)} ({first})"


def listed(sc, p: dict) -> list[dict]:
    """The constants with their values and sources, break-evens not searched (``kvsim plan --break-even``)."""
    return [_listed_one(c, p) for c in constants(sc)]


def _listed_one(c: Constant, p: dict) -> dict:
    best = (p.get("recommendation") or {}).get("candidate")
    affected = sorted(x["name"] for x in p.get("candidates", []) if x.get("status") == "ok" and _affected(c, x))
    text = f"{_short(c)}; it changes {', '.join(affected) or 'no candidate'}" + (
        f" — whether {best} stays the recommendation if it differs: kvsim plan --break-even"
        if best and affected
        else ""
    )
    return {
        "kind": c.kind,
        "key": c.key,
        "value": c.value,
        "source": c.source,
        "profile": c.profile_path,
        "affects": affected,
        "measure": MEASURE_HINT[c.kind],
        "directions": None,
        "text": text,
    }


def break_evens(p: dict, common: dict, pool, kinds: list[str] | None = None) -> list[dict]:
    """For each unmeasured constant of the plan's cost model (of ``kinds`` only, when given): its
    value, source and break-even in each direction (module docstring). ``common`` is the plan's
    task fields, ``pool`` its workers."""
    base = scenario_from_dict(common["base"], common["base_dir"])
    variants = _Variants()
    try:
        return [
            _one(c, p, common, pool, variants) if kinds is None or c.kind in kinds else _listed_one(c, p)
            for c in constants(base)
        ]
    finally:
        variants.close()


def _one(c: Constant, p: dict, common: dict, pool, variants: _Variants) -> dict:
    from sim.analysis.recommend import recommend

    best = p["recommendation"]["candidate"]
    cands = {x["name"]: x for x in p["candidates"] if x["status"] == "ok"}
    affected = sorted(n for n, x in cands.items() if _affected(c, x))
    lo_end, hi_end, log_scale = c.span()
    out: dict[str, Any] = {
        "kind": c.kind,
        "key": c.key,
        "value": c.value,
        "source": c.source,
        "profile": c.profile_path,
        "affects": affected,
        "measure": MEASURE_HINT[c.kind],
        "directions": [],
        "runs": {"simulations": 0, "quick_simulations": 0, "simulated_requests": 0, "cpu_s": 0.0},
    }
    for up in (False, True):
        end = hi_end if up else lo_end
        if (up and end <= c.value) or (not up and end >= c.value):
            continue
        d: dict[str, Any] = {"direction": "up" if up else "down", "end": end, "flip": None, "winner": None}
        out["directions"].append(d)
        helps = _helps(c, up)
        if best not in affected and not helps:
            d["note"] = f"{best} does not depend on it and the others only get slower"
            continue
        if not affected:
            d["note"] = "no candidate depends on it"
            continue
        # Re-planned at each value: the recommended candidate if it depends on the constant, and the
        # affected candidates that could overtake it (an upper bound never can).
        moving = [n for n in affected if n != best and not cands[n].get("upper_bound")]
        if best in affected:
            moving.append(best)

        def decide(v: float, names: list[str]) -> tuple[str | None, dict[str, dict]]:
            tasks = [_task(cands[n], common, variants.overrides(c, v)) for n in names]
            fresh = {t["name"]: r for t, r in pool.map_unordered(_light, tasks)}
            for r in fresh.values():
                for k in out["runs"]:
                    out["runs"][k] += r.get(k, 0)
            cand_list = [_patched(x, fresh.get(n)) for n, x in cands.items()]
            return recommend({**p, "candidates": cand_list})["candidate"], fresh

        winner, fresh = decide(end, moving)
        if winner == best:
            d["note"] = f"{best} stays the recommendation {'up' if up else 'down'} to {c.describe(end)}"
            continue
        # Keep only candidates that beat the recommended one at the end of the range.
        keep = [
            n
            for n in moving
            if n == best
            or recommend(
                {**p, "candidates": [_patched(cands[best], fresh.get(best)), _patched(cands[n], fresh.get(n))]}
            )["candidate"]
            == n
        ]
        moving = keep or moving
        # The nearest flip: step away from the nominal value (doubling steps), then bisect.
        a, b, b_winner = c.value, end, winner
        for v in _steps(c, up, end):
            w, _f = decide(v, moving)
            if w != best:
                b, b_winner = v, w
                break
            a = v
        for _ in range(STEPS):
            mid = math.sqrt(a * b) if log_scale and a > 0 and b > 0 else (a + b) / 2
            w, _f = decide(mid, moving)
            if w == best:
                a = mid
            else:
                b, b_winner = mid, w
        d.update(
            flip=math.sqrt(a * b) if log_scale and a > 0 and b > 0 else (a + b) / 2,
            bracket=sorted([a, b]),
            winner=b_winner,
        )
    out["text"] = _sentence(c, best, out)
    return out


def _steps(c: Constant, up: bool, end: float) -> list[float]:
    """Values tried from the nominal one towards ``end`` (excluded): steps doubling from 1 point
    (overhead), a factor 2 (event cost), or 5 % down and 2.5 % up (KV capacity)."""
    out: list[float] = []
    k = 0
    while True:
        if c.kind == "paged_overhead":
            v = c.value + (0.01 if up else -0.01) * 2**k
        elif c.kind == "kv_capacity":
            v = c.value * (1 + (0.025 if up else -0.05) * 2**k)
        else:
            v = c.value * 2.0 ** ((k + 1) if up else -(k + 1))
            if not up and v < c.value / 64:
                v = end
        if (up and v >= end) or (not up and v <= end):
            return out
        out.append(v)
        k += 1


def _task(cand: dict, common: dict, extra: dict) -> dict:
    from sim.analysis.planner import CANDIDATES

    return {
        **common,
        "name": cand["name"],
        "overrides": cand["overrides"],
        "strategy": CANDIDATES.get(cand["name"], {}).get("strategy", ""),
        "extra_overrides": extra,
        "hint_replicas": cand.get("replicas_needed"),
        "seeds": 1,
        "operating_point": False,
        "search": "guided",
        "upper_bound": bool(cand.get("upper_bound")),
    }


def _light(task: dict) -> dict:
    from sim.analysis.planner import plan_candidate

    return plan_candidate(task)


def _patched(nominal: dict, fresh: dict | None) -> dict:
    """The nominal candidate with its goodput and GPU count re-measured (operating point kept)."""
    if fresh is None:
        return nominal
    if fresh.get("status") != "ok":
        return {
            **nominal,
            "status": fresh.get("status", "failed"),
            "goodput_rps": 0.0,
            "goodput_est_rps": 0.0,
            "goodput_per_gpu_rps": 0.0,
        }
    keys = ("goodput_rps", "goodput_est_rps", "goodput_per_gpu_rps", "replicas_needed", "gpus_needed", "search_status")
    return {**nominal, **{k: fresh[k] for k in keys if k in fresh}, "goodput_mean_rps": None}


def _sentence(c: Constant, best: str, out: dict) -> str:
    label = {
        "paged_overhead": "paged decode attention is slower than contiguous by",
        "alloc_event_s": "an allocation event costs",
        "kv_capacity": "the KV cache holds",
    }[c.kind]
    parts = []
    for d in out["directions"]:
        if d["flip"] is None:
            continue
        rel = "≥" if d["direction"] == "up" else "≤"
        other = "≤" if d["direction"] == "up" else "≥"
        parts.append(
            f"{best} stays the recommendation only while {label} {other} {c.describe(d['flip'])}; "
            f"at {rel} {c.describe(d['flip'])} {d['winner']} takes over"
        )
    where = _short(c)
    if not parts:
        lo, hi, _ = c.span()
        return f"{where}: no flip of the recommendation between {c.describe(lo)} and {c.describe(hi)}."
    return f"{where}: " + "; ".join(parts) + f" — {out['measure']}."
