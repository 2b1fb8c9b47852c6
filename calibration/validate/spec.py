"""A validation spec (``kvsim validate --scenario``, format in ``docs/validation.md``): its defaults,
the choices each key allows, and loading it with one-line errors naming key, value and what is allowed."""

from __future__ import annotations

import copy
import math
from pathlib import Path

from sim.catalog import get_model
from sim.errors import ConfigError

KEY = "validate"

DEFAULT_SPEC = {
    "name": "validate",
    "description": "",
    "model": "tiny-llama",
    "engine": {
        "dtype": "fp32",
        "threads": 1,
        "seed": 0,
        "clocks": ["cpu_norm", "cpu", "wall"],
        "replays": 1,
        "overhead_rounds": "spread",
        "kernel_rounds": "spread",
        "replay_order": "interleaved",
        "prefill_probe": True,
        "overhead_mix": "offline",
        "kernels": "auto",
    },
    "kv": {"num_blocks": 256, "block_size": 16},
    "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
    "static_reserve": 480,
    "workload": {
        "num_requests": 100,
        "max_model_len": 480,
        "seed": 1,
        "lengths": {"kind": "uniform", "prompt_min": 16, "prompt_max": 384, "output_min": 8, "output_max": 96},
    },
    "loads": [
        {"name": "light", "utilization": 0.3},
        {"name": "medium", "utilization": 0.7},
        {"name": "saturating", "utilization": 1.6},
    ],
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
#: round runs both, the fit pools them; ``calibration.validate.refit`` can then compare them on the
#: same replays)
OVERHEAD_MIX = {"offline": ("offline",), "queued": ("queued",), "both": ("offline", "queued")}
#: ``engine.replay_order``: ``interleaved`` (default) replays every cell once, then every cell again, ... (the
#: raw clocks in the last sweep); ``blocked``: all of one cell's replays, then the next cell's
REPLAY_ORDERS = ("interleaved", "blocked")
#: ``host_speed``: ``probe`` rescales the raw clocks' profile by a host-speed probe, ``fixed`` does not
HOST_SPEEDS = ("probe", "fixed")
#: replay clocks of the engine (``engine.clocks``; the first is the table's), see docs/validation.md
REPLAY_CLOCKS = ("cpu_norm", "cpu", "wall")
CLOCK_MEANING = {
    "cpu_norm": "engine clock advanced by each iteration's thread CPU time x (host-speed probe's reference time at "
    "calibration / median of its last probes during the replay): the engine on a host running at "
    "calibration speed (host interference removed); simulated with the profile as calibrated",
    "cpu": "engine clock advanced by each iteration's thread CPU time (idle: jumps to the next arrival): the engine "
    "as it ran, without the time other jobs kept its thread off the CPU",
    "wall": "wall-clock replay, arrivals fed by a thread: the engine on this host as it is",
}


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
            raise ConfigError(
                f"{KEY}.scenario", str(path), "a validation spec YAML file (e.g. scenarios/validate-cpu.yaml)"
            )
        p = cand
    from sim.inputs import load_yaml, read_text

    raw = load_yaml(read_text(p, f"{KEY}.scenario", "validation spec"), f"{KEY}.scenario", str(p))
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{KEY}.scenario", str(p), "a YAML mapping")
    if not raw:
        # an empty file would otherwise run a full validation on the defaults, which nobody asked for
        raise ConfigError(
            f"{KEY}.scenario",
            str(p),
            "a non-empty validation spec (this file has no keys; the built-in one: --scenario validate-cpu)",
        )
    if "kind" in raw and raw["kind"] != "validation":
        raise ConfigError(f"{KEY}.kind", raw["kind"], "validation (or no kind): this file is a validation spec")
    bad = sorted(set(raw) - _ALLOWED)
    if bad:
        raise ConfigError(f"{KEY}.{bad[0]}", raw[bad[0]], f"unknown key; allowed: {', '.join(sorted(_ALLOWED))}")
    for k in ("engine", "kv", "scheduler", "workload"):
        if k in raw and not isinstance(raw[k], dict):
            raise ConfigError(f"{KEY}.{k}", raw[k], "a mapping (docs/validation.md)")
    spec = _merge(DEFAULT_SPEC, raw)
    get_model(spec["model"])
    _check_loads(spec)
    _check_allocators(spec["allocators"], f"{KEY}.allocators")
    clocks = spec["engine"].get("clocks")
    if (
        not isinstance(clocks, list)
        or not clocks
        or len(set(clocks)) != len(clocks)
        or any(c not in REPLAY_CLOCKS for c in clocks)
    ):
        raise ConfigError(f"{KEY}.engine.clocks", clocks, f"a non-empty list of distinct {', '.join(REPLAY_CLOCKS)}")
    if not isinstance(spec["quick"], dict):
        raise ConfigError(f"{KEY}.quick", spec["quick"], f"a mapping of {', '.join(sorted(QUICK_KEYS))}")
    bad = sorted(set(spec["quick"]) - QUICK_KEYS)
    if bad:
        raise ConfigError(
            f"{KEY}.quick.{bad[0]}", spec["quick"][bad[0]], f"unknown key; allowed: {', '.join(sorted(QUICK_KEYS))}"
        )
    where = {k: "engine." + k for k in spec["engine"]}
    if quick:  # the quick subset's own engine options (CI keeps its calibration short)
        for k in QUICK_ENGINE_KEYS & set(spec["quick"]):
            spec["engine"][k], where[k] = spec["quick"][k], "quick." + k
    n = spec["engine"].get("replays")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 20:
        raise ConfigError(
            f"{KEY}.{where['replays']}", n, "an integer from 1 to 20: engine replays on the table's clock"
        )
    for key, choices, meaning in (
        ("overhead_rounds", OVERHEAD_ROUNDS, "where the engine-overhead calibration runs"),
        ("kernel_rounds", KERNEL_ROUNDS, "where the kernel route is timed"),
        ("overhead_mix", OVERHEAD_MIX, "how the engine-overhead runs fill their batches"),
        ("replay_order", REPLAY_ORDERS, "the order of the cells' replays"),
    ):
        if spec["engine"].get(key) not in choices:
            raise ConfigError(
                f"{KEY}.{where.get(key, 'engine.' + key)}",
                spec["engine"].get(key),
                f"one of {', '.join(choices)}: {meaning}",
            )
    if kernels is not None:
        spec["engine"]["kernels"], where["kernels"] = kernels, "engine.kernels (--kernels)"
    from ..attention_backends import KERNELS

    if spec["engine"].get("kernels") not in KERNELS:
        raise ConfigError(
            f"{KEY}.engine.kernels",
            spec["engine"].get("kernels"),
            f"one of {', '.join(KERNELS)}: the paged engine's attention backend",
        )
    if not isinstance(spec["engine"].get("prefill_probe"), bool):
        raise ConfigError(
            f"{KEY}.engine.prefill_probe",
            spec["engine"].get("prefill_probe"),
            "true or false: a second host-speed probe for iterations with prefill (cpu_norm)",
        )
    _check_quick(spec, names_given=quick or "loads" in (raw.get("quick") or {}))
    _check_values(spec)
    if quick:
        q = spec["quick"]
        spec["workload"]["num_requests"] = int(q.get("num_requests", spec["workload"]["num_requests"]))
        names = q.get("loads")
        if names:
            spec["loads"] = [ld for ld in spec["loads"] if ld["name"] in names]
        spec["allocators"] = list(q.get("allocators", spec["allocators"]))
    _check_simulator(spec)
    spec["source"] = str(p)
    return spec


def _int(key: str, v: object, lo: int, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{KEY}.{key}", v, f"an integer >= {lo}: {what}")


def _positive(key: str, v: object, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{KEY}.{key}", v, f"a finite number > 0: {what}")


def _check_allocators(allocs: object, key: str) -> None:
    # an empty list would reach the run as an IndexError or a run with nothing to compare
    if not isinstance(allocs, list) or not allocs or len(set(map(str, allocs))) != len(allocs):
        raise ConfigError(key, allocs, "a non-empty list of distinct paged, static")
    for a in allocs:
        if a not in ("paged", "static"):
            raise ConfigError(key, a, "paged or static")


def _check_loads(spec: dict) -> None:
    loads = spec["loads"]
    if not isinstance(loads, list) or not loads:
        raise ConfigError(f"{KEY}.loads", loads, "a non-empty list of {name, utilization or rate}")
    seen = set()
    for i, ld in enumerate(loads):
        if not isinstance(ld, dict) or "name" not in ld or (("utilization" in ld) == ("rate" in ld)):
            raise ConfigError(f"{KEY}.loads[{i}]", ld, "a mapping with name and exactly one of utilization, rate")
        bad = sorted(set(ld) - {"name", "utilization", "rate"})
        if bad:
            raise ConfigError(f"{KEY}.loads[{i}].{bad[0]}", ld[bad[0]], "unknown key; allowed: name, rate, utilization")
        if not isinstance(ld["name"], str) or not ld["name"] or ld["name"] in seen:
            raise ConfigError(f"{KEY}.loads[{i}].name", ld["name"], "a non-empty name, distinct among the loads")
        seen.add(ld["name"])
        if "utilization" in ld:
            _positive(f"loads[{i}].utilization", ld["utilization"], "the arrival rate as a fraction of capacity")
        else:
            _positive(f"loads[{i}].rate", ld["rate"], "the arrival rate in requests/s")


def _check_quick(spec: dict, names_given: bool) -> None:
    # checked with or without --quick: a CI-only typo should not wait for CI to surface (the default
    # quick.loads, [medium], only when it is used: a spec with other load names may never run --quick)
    q = spec["quick"]
    if "num_requests" in q:
        _int("quick.num_requests", q["num_requests"], 1, "requests of the --quick subset")
    if "loads" in q and names_given:
        names = [ld["name"] for ld in spec["loads"]]
        if not isinstance(q["loads"], list) or not q["loads"]:
            raise ConfigError(f"{KEY}.quick.loads", q["loads"], f"a non-empty list of load names: {', '.join(names)}")
        for n in q["loads"]:
            if n not in names:
                raise ConfigError(f"{KEY}.quick.loads", n, f"a name in loads: {', '.join(names)}")
    if "allocators" in q:
        _check_allocators(q["allocators"], f"{KEY}.quick.allocators")


def _check_values(spec: dict) -> None:
    """Types and ranges of the keys the engine and simulator read, so that a bad value is named by its
    spec key before calibration (the engine and the simulator would name their own keys, minutes later)."""
    from ..engine import DTYPES

    e, w = spec["engine"], spec["workload"]
    for k in ("name", "description"):
        if not isinstance(spec[k], str):
            raise ConfigError(f"{KEY}.{k}", spec[k], "a string")
    if e.get("dtype") not in DTYPES:
        raise ConfigError(f"{KEY}.engine.dtype", e.get("dtype"), f"one of {', '.join(DTYPES)}")
    _int("engine.threads", e.get("threads"), 1, "torch threads of the engine")
    _int("engine.seed", e.get("seed"), 0, "seed of the engine's weights")
    for k in ("kv", "scheduler"):
        known = [str(x) for x in DEFAULT_SPEC[k]]  # type: ignore[attr-defined]
        bad = sorted(set(spec[k]) - set(known))
        if bad:
            raise ConfigError(f"{KEY}.{k}.{bad[0]}", spec[k][bad[0]], f"unknown key; allowed: {', '.join(known)}")
    _int("kv.num_blocks", spec["kv"]["num_blocks"], 1, "KV blocks of the engine")
    _int("kv.block_size", spec["kv"]["block_size"], 1, "token slots per KV block")
    _int("scheduler.max_num_seqs", spec["scheduler"]["max_num_seqs"], 1, "requests per batch")
    _int("scheduler.max_num_batched_tokens", spec["scheduler"]["max_num_batched_tokens"], 1, "tokens per batch")
    _int("workload.num_requests", w.get("num_requests"), 1, "requests per load")
    _int("workload.max_model_len", w.get("max_model_len"), 1, "the longest prompt + output a request may have")
    _int("workload.seed", w.get("seed"), 0, "seed of the requests")
    if spec["host_speed"] not in HOST_SPEEDS:
        # replay.py tests == "probe": any other word would silently turn rescaling off
        raise ConfigError(f"{KEY}.host_speed", spec["host_speed"], f"one of {', '.join(HOST_SPEEDS)}")
    _int("static_reserve", spec["static_reserve"], 1, "token slots reserved per request (static)")
    cap = spec["kv"]["num_blocks"] * spec["kv"]["block_size"]
    lengths = w.get("lengths")
    longest = None
    if isinstance(lengths, dict) and lengths.get("kind") == "uniform":
        pmax, omax = lengths.get("prompt_max"), lengths.get("output_max")
        if type(pmax) is int and type(omax) is int:  # not bool: the simulator refuses those itself
            longest = pmax + omax
    if longest is not None and w["max_model_len"] < longest:
        raise ConfigError(
            f"{KEY}.workload.max_model_len",
            w["max_model_len"],
            f"at least workload.lengths prompt_max + output_max ({longest}): the longest request",
        )
    if longest is not None and spec["static_reserve"] < longest:
        # a shorter reserve never completes the longest request: capacity 0, arrival rate 0, minutes later
        raise ConfigError(
            f"{KEY}.static_reserve",
            spec["static_reserve"],
            f"at least workload.lengths prompt_max + output_max ({longest}): the longest request",
        )
    if spec["static_reserve"] > min(w["max_model_len"], cap):
        raise ConfigError(
            f"{KEY}.static_reserve",
            spec["static_reserve"],
            f"at most workload.max_model_len ({w['max_model_len']}) and the KV capacity kv.num_blocks x "
            f"kv.block_size ({cap})",
        )


#: simulator keys (:func:`calibration.validate.simulator.sim_scenario`) -> the spec keys they come from
_SIM_KEYS = {"allocator.reserve": "static_reserve", "allocator.block_size": "kv.block_size"}


def _check_simulator(spec: dict) -> None:
    """Build the simulator's scenario now so what it refuses (lengths, scheduler bounds) is said before
    calibration, under the spec key it came from."""
    from .simulator import sim_scenario

    for alloc in spec["allocators"]:
        try:
            # the cuda entry holds any engine-sized model (the cpu one not an 8B); capacity is the spec's anyway
            sim_scenario(spec, alloc, arrival={"kind": "poisson", "rate": 1.0}, device="cuda")
        except ConfigError as exc:
            key = str(exc.key)
            raise ConfigError(f"{KEY}.{_SIM_KEYS.get(key, key)}", exc.value, exc.allowed) from None


def check_clocks(spec: dict, device: str) -> None:
    """Thread CPU time times a CPU engine's kernels, not a GPU's (they run asynchronously on the
    device): on ``cuda`` only the ``wall`` clock measures the engine."""
    clocks = spec["engine"]["clocks"]
    bad = [c for c in clocks if c in ("cpu", "cpu_norm")]
    if device != "cpu" and bad:
        raise ConfigError(
            f"{KEY}.engine.clocks",
            clocks,
            f"[wall] with --device {device}: {', '.join(bad)} time the engine's thread on the CPU, "
            "not its kernels on the GPU",
        )
