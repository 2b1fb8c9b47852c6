"""A validation spec (``kvsim validate --scenario``, format in ``docs/validation.md``): its defaults,
the choices each key allows, and loading it with one-line errors naming key, value and what is allowed."""

from __future__ import annotations

import copy
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
    if quick:
        q = spec["quick"]
        spec["workload"]["num_requests"] = int(q.get("num_requests", spec["workload"]["num_requests"]))
        names = q.get("loads")
        if names:
            spec["loads"] = [ld for ld in spec["loads"] if ld["name"] in names]
        spec["allocators"] = list(q.get("allocators", spec["allocators"]))
    spec["source"] = str(p)
    return spec


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
