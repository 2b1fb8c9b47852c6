"""Plan at several tensor-parallel sizes and pick the one that needs the fewest GPUs.

How many GPUs a traffic needs depends on how each replica is split as much as on the allocator:
a model that barely fits one GPU leaves it little KV memory (few sequences at once), and a wider
split buys KV memory and faster steps for more GPUs per replica. ``kvsim plan --tp 1,2,4,8`` (or
``--tp auto``: the sizes from :data:`AUTO_SIZES` the model fits and divides into) runs one full plan
(:func:`sim.analysis.planner.plan`) per size, each with ``gpu.tensor_parallel`` set and every other
key as given, and compares their recommendations:

* with a target rate, the sizes whose recommended candidate needs the fewest GPUs, and among
  them the one that serves the most requests/s per GPU (goodput per replica ÷ size: the most
  headroom above the target on those GPUs);
* without one, the size that serves the most requests/s per GPU;

goodputs per GPU within the plan's tolerance tie, and a tie goes to the smaller size, whose
replicas are more numerous and each less exposed to one GPU's failure. A size the
deployment refuses (weights larger than the GPUs' memory, heads that do not divide) is listed with
the reason, as is one whose plan recommends nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.errors import ConfigError

#: Sizes ``--tp auto`` tries (those the model and GPU allow).
AUTO_SIZES = (1, 2, 4, 8)
#: What ``--tp`` takes.
TP_ALLOWED = "auto, or comma-separated tensor-parallel sizes such as 1,2,4,8 (integers from 1 to 64)"


def parse_tp(raw: str) -> list[int] | None:
    """``--tp`` as typed: ``None`` for ``auto`` (sizes the model allows), else the sizes in order."""
    text = raw.strip()
    if text == "auto":
        return None
    sizes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 64:
            raise ConfigError("--tp", raw, TP_ALLOWED)
        sizes.append(int(part))
    if not sizes:
        raise ConfigError("--tp", raw, TP_ALLOWED)
    return list(dict.fromkeys(sizes))


def _refusal(scenario: str, overrides: dict, tp: int) -> str | None:
    """Why a replica of ``tp`` GPUs cannot serve the scenario (``None`` when it can)."""
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.deployment import derived_kv_cache_tokens

    data, base_dir = read_scenario_dict(scenario)
    try:
        sc = scenario_from_dict(apply_overrides(data, {**overrides, "gpu.tensor_parallel": tp}), base_dir)
        derived_kv_cache_tokens(sc)
    except ConfigError as exc:
        return str(exc)
    return None


def _summary(tp: int, p: dict) -> dict:
    """One size's row: its recommendation and what it needs."""
    name = p["recommendation"]["candidate"]
    row: dict[str, Any] = {"tensor_parallel": tp, "status": "ok" if name else "none", "candidate": name}
    if name is None:
        row["reason"] = p["recommendation"]["text"]
        return row
    c = next(c for c in p["candidates"] if c["name"] == name)
    # The plan's goodput is that of its base replica count (gpu.replicas).
    per_replica = (c.get("goodput_est_rps") or c.get("goodput_rps") or 0.0) / p["replicas"]
    row.update(
        goodput_rps=per_replica,
        goodput_per_gpu_rps=per_replica / tp,
        replicas_needed=c.get("replicas_needed"),
        gpus_needed=c.get("gpus_needed"),
    )
    return row


def choose(rows: list[dict], target_rate: float | None, tol: float) -> int | None:
    """The size to use (module docstring), or ``None`` when no size recommends anything."""
    pool = [r for r in rows if r["status"] == "ok"]
    if not pool:
        return None
    if target_rate and any(r.get("gpus_needed") for r in pool):
        fewest = min(r["gpus_needed"] for r in pool if r.get("gpus_needed"))
        pool = [r for r in pool if r.get("gpus_needed") == fewest]
    best = max(r["goodput_per_gpu_rps"] for r in pool)
    return min(r["tensor_parallel"] for r in pool if r["goodput_per_gpu_rps"] >= best * (1 - tol))


def plan_tensor_parallel(
    scenario: str,
    sizes: list[int] | None,
    overrides: dict,
    run_plan: Callable[[dict], dict],
    target_rate: float | None,
    tol: float,
    on_size: Callable[[int, dict | None], None] | None = None,
) -> dict:
    """Plan ``scenario`` at each size (``None``: :data:`AUTO_SIZES`) with ``run_plan(overrides)``
    (a :func:`sim.analysis.planner.plan` call with the caller's other arguments) and pick one:
    ``{"sizes": rows, "chosen": tp or None, "plans": {tp: plan}}``. ``on_size(tp, plan)`` is called
    after each size (``plan`` ``None`` for a refused size)."""
    rows: list[dict] = []
    plans: dict[int, dict] = {}
    for tp in sizes or list(AUTO_SIZES):
        over = {**overrides, "gpu.tensor_parallel": tp}
        why = _refusal(scenario, overrides, tp)
        if why is not None:
            rows.append({"tensor_parallel": tp, "status": "refused", "reason": why})
            if on_size:
                on_size(tp, None)
            continue
        p = run_plan(over)
        plans[tp] = p
        rows.append(_summary(tp, p))
        if on_size:
            on_size(tp, p)
    if not plans:
        reasons = "; ".join(f"TP{r['tensor_parallel']}: {r['reason']}" for r in rows)
        raise ConfigError("--tp", ",".join(str(r["tensor_parallel"]) for r in rows), f"a size that fits ({reasons})")
    return {"sizes": rows, "chosen": choose(rows, target_rate, tol), "plans": plans}


def size_lines(search: dict, target_rate: float | None) -> list[str]:
    """One line per size, as the command prints them."""
    out = []
    for r in search["sizes"]:
        tp = r["tensor_parallel"]
        mark = " (chosen)" if tp == search["chosen"] else ""
        if r["status"] == "refused":
            out.append(f"TP{tp}: refused — {r['reason']}")
        elif r["status"] == "none":
            out.append(f"TP{tp}: no recommendation — {r['reason']}")
        else:
            need = (
                f"; {r['gpus_needed']} GPU(s) for {target_rate:g} req/s"
                if target_rate and r.get("gpus_needed")
                else (f"; cannot reach {target_rate:g} req/s" if target_rate else "")
            )
            per = r["goodput_per_gpu_rps"]
            out.append(
                f"TP{tp}{mark}: {r['candidate']}, goodput {r['goodput_rps']:.3g} req/s per replica "
                f"({per:.3g} per GPU){need}"
            )
    return out
