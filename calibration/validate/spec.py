"""A validation spec (``kvsim validate --scenario``, format in ``docs/validation.md``): the typed
:class:`ValidationSpec` (its defaults and the choices each key allows), and loading it with one-line
errors naming key, value and what is allowed (:class:`sim.errors.ConfigError`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from sim.catalog import MODELS
from sim.errors import ConfigError

from ..attention_backends import KERNELS
from ..engine import DTYPES

KEY = "validate"

#: ``engine.overhead_rounds``: ``spread`` (default) adds one pass of the engine-overhead runs per cell,
#: evenly among the replays, and one after the last, pooled with the up-front passes
#: (:class:`OverheadRounds`); ``upfront``: the up-front passes only
Rounds = Literal["spread", "upfront"]
OVERHEAD_ROUNDS: tuple[str, ...] = get_args(Rounds)
#: ``engine.kernel_rounds``: ``spread`` (default, with ``overhead_rounds: spread`` and a calibrated
#: profile) times the kernel route's grid again, one pass, before every overhead round, and the final
#: profiles' kernel curves are fitted on every pass pooled (:class:`KernelRounds`); ``upfront``: the
#: up-front route only
KERNEL_ROUNDS = OVERHEAD_ROUNDS
#: ``engine.overhead_mix``: how the engine-overhead runs fill their batches
#: (:data:`calibration.kernels.OVERHEAD_MIXES`): ``offline`` (default), ``queued``, or ``both`` (each
#: round runs both, the fit pools them; ``calibration.validate.refit`` can then compare them on the
#: same replays)
OverheadMix = Literal["offline", "queued", "both"]
OVERHEAD_MIX = {"offline": ("offline",), "queued": ("queued",), "both": ("offline", "queued")}
#: ``engine.replay_order``: ``interleaved`` (default) replays every cell once, then every cell again, ... (the
#: raw clocks in the last sweep); ``blocked``: all of one cell's replays, then the next cell's
ReplayOrder = Literal["interleaved", "blocked"]
REPLAY_ORDERS: tuple[str, ...] = get_args(ReplayOrder)
#: ``host_speed``: ``probe`` rescales the raw clocks' profile by a host-speed probe, ``fixed`` does not
HostSpeedMode = Literal["probe", "fixed"]
HOST_SPEEDS: tuple[str, ...] = get_args(HostSpeedMode)
#: replay clocks of the engine (``engine.clocks``; the first is the table's), see docs/validation.md
Clock = Literal["cpu_norm", "cpu", "wall"]
REPLAY_CLOCKS: tuple[str, ...] = get_args(Clock)
#: the engine's KV layouts a validation compares
Allocator = Literal["paged", "static"]
ALLOCATORS: tuple[str, ...] = get_args(Allocator)
CLOCK_MEANING = {
    "cpu_norm": "engine clock advanced by each iteration's thread CPU time x (host-speed probe's reference time at "
    "calibration / median of its last probes during the replay): the engine on a host running at "
    "calibration speed (host interference removed); simulated with the profile as calibrated",
    "cpu": "engine clock advanced by each iteration's thread CPU time (idle: jumps to the next arrival): the engine "
    "as it ran, without the time other jobs kept its thread off the CPU",
    "wall": "wall-clock replay, arrivals fed by a thread: the engine on this host as it is",
}

assert set(OVERHEAD_MIX) == set(get_args(OverheadMix))


def _all_clocks() -> list[Clock]:
    return list(get_args(Clock))


def _all_allocators() -> list[Allocator]:
    return list(get_args(Allocator))


_GIVEN: Any = object()  # SpecError's value: the field's own input


class SpecError(ValueError):
    """Raised by a spec field's validator: ``allowed`` for ``value`` (the field's input unless given),
    at the field's key or ``sub`` below it (``[2].name``)."""

    def __init__(self, allowed: str, value: Any = _GIVEN, sub: str = ""):
        super().__init__(allowed)
        self.allowed, self.value, self.sub = allowed, value, sub


# --- the checks each key's validator runs before pydantic's own (one message per key) -----


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(test: Callable[[Any], bool], allowed: str) -> BeforeValidator:
    def run(v: Any) -> Any:
        if not test(v):
            raise ValueError(allowed)
        return v

    return BeforeValidator(run)


def _at_least(lo: int, what: str) -> BeforeValidator:
    return _check(lambda v: _is_int(v) and v >= lo, f"an integer >= {lo}: {what}")


def _positive(what: str) -> BeforeValidator:
    return _check(
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
        f"a finite number > 0: {what}",
    )


def _one_of(choices: Iterable[str], meaning: str = "") -> BeforeValidator:
    names = tuple(choices)
    return _check(
        lambda v: isinstance(v, str) and v in names, f"one of {', '.join(names)}" + (meaning and ": " + meaning)
    )


def _string(allowed: str = "a string") -> BeforeValidator:
    return _check(lambda v: isinstance(v, str), allowed)


def _allocators(v: Any) -> Any:
    # an empty list would reach the run as an IndexError or a run with nothing to compare
    if not isinstance(v, list) or not v or len(set(map(str, v))) != len(v):
        raise ValueError(f"a non-empty list of distinct {', '.join(ALLOCATORS)}")
    for a in v:
        if a not in ALLOCATORS:
            raise SpecError(" or ".join(ALLOCATORS), a)
    return v


def _clocks(v: Any) -> Any:
    if not isinstance(v, list) or not v or len(set(map(str, v))) != len(v) or any(c not in REPLAY_CLOCKS for c in v):
        raise ValueError(f"a non-empty list of distinct {', '.join(REPLAY_CLOCKS)}")
    return v


def _model(v: Any) -> Any:
    if not isinstance(v, str) or v not in MODELS:
        raise ValueError(f"a catalog model: {', '.join(MODELS)}")
    return v


class _Section(BaseModel):
    """A spec section: unknown keys refused, assignments checked as the loaded value was."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EngineSpec(_Section):
    """``engine``: the reference engine and how the validation calibrates and replays it."""

    dtype: Annotated[str, _one_of(DTYPES)] = "fp32"
    threads: Annotated[int, _at_least(1, "torch threads of the engine")] = 1
    seed: Annotated[int, _at_least(0, "seed of the engine's weights")] = 0
    clocks: Annotated[list[Clock], BeforeValidator(_clocks)] = Field(default_factory=_all_clocks)
    replays: Annotated[
        int,
        _check(lambda v: _is_int(v) and 1 <= v <= 20, "an integer from 1 to 20: engine replays on the table's clock"),
    ] = 1
    overhead_rounds: Annotated[Rounds, _one_of(OVERHEAD_ROUNDS, "where the engine-overhead calibration runs")] = (
        "spread"
    )
    kernel_rounds: Annotated[Rounds, _one_of(KERNEL_ROUNDS, "where the kernel route is timed")] = "spread"
    replay_order: Annotated[ReplayOrder, _one_of(REPLAY_ORDERS, "the order of the cells' replays")] = "interleaved"
    prefill_probe: Annotated[
        bool,
        _check(
            lambda v: isinstance(v, bool),
            "true or false: a second host-speed probe for iterations with prefill (cpu_norm)",
        ),
    ] = True
    overhead_mix: Annotated[OverheadMix, _one_of(OVERHEAD_MIX, "how the engine-overhead runs fill their batches")] = (
        "offline"
    )
    kernels: Annotated[str, _one_of(KERNELS, "the paged engine's attention backend")] = "auto"


class KvSpec(_Section):
    """``kv``: the engine's KV memory (paged pool, or ``num_blocks x block_size`` static slots)."""

    num_blocks: Annotated[int, _at_least(1, "KV blocks of the engine")] = 256
    block_size: Annotated[int, _at_least(1, "token slots per KV block")] = 16


class SchedulerSpec(_Section):
    max_num_seqs: Annotated[int, _at_least(1, "requests per batch")] = 16
    max_num_batched_tokens: Annotated[int, _at_least(1, "tokens per batch")] = 256


def _default_lengths() -> dict[str, Any]:
    return {"kind": "uniform", "prompt_min": 16, "prompt_max": 384, "output_min": 8, "output_max": 96}


class WorkloadSpec(_Section):
    num_requests: Annotated[int, _at_least(1, "requests per load")] = 100
    max_model_len: Annotated[int, _at_least(1, "the longest prompt + output a request may have")] = 480
    seed: Annotated[int, _at_least(0, "seed of the requests")] = 1
    #: any simulator lengths block (``workload.lengths`` of docs/scenario.md), checked by the simulator
    #: when the spec is loaded; given, it replaces the default whole
    lengths: Annotated[
        dict[str, Any], _check(lambda v: isinstance(v, dict), "a mapping: a simulator lengths block")
    ] = Field(default_factory=_default_lengths)


class LoadSpec(_Section):
    """One load: an arrival ``rate`` (requests/s) or a ``utilization`` of the estimated capacity."""

    name: Annotated[str, _check(lambda v: isinstance(v, str) and bool(v), "a non-empty name, distinct among the loads")]
    utilization: Annotated[int | float | None, _positive("the arrival rate as a fraction of capacity")] = None
    rate: Annotated[int | float | None, _positive("the arrival rate in requests/s")] = None

    @model_validator(mode="before")
    @classmethod
    def _one_rate(cls, v: Any) -> Any:
        if isinstance(v, LoadSpec):
            return v
        if not isinstance(v, dict) or "name" not in v or (("utilization" in v) == ("rate" in v)):
            raise ValueError("a mapping with name and exactly one of utilization, rate")
        return v

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}  # as written: name and its one rate

    def arrival_rate(self, capacity: float) -> float:
        """Requests/s: ``rate``, or ``utilization`` x ``capacity`` (requests/s the simulator sustains)."""
        if self.rate is not None:
            return float(self.rate)
        assert self.utilization is not None  # exactly one of the two (_one_rate)
        return float(self.utilization) * capacity


def _default_loads() -> list[LoadSpec]:
    return [
        LoadSpec(name="light", utilization=0.3),
        LoadSpec(name="medium", utilization=0.7),
        LoadSpec(name="saturating", utilization=1.6),
    ]


class QuickSpec(_Section):
    """``quick``: the ``--quick`` subset (CI), and the engine options it may set for itself."""

    num_requests: Annotated[int, _at_least(1, "requests of the --quick subset")] = 24
    #: load names; checked against ``loads`` where given, the default ``[medium]`` only when used
    loads: Annotated[
        list[str],
        _check(
            lambda v: isinstance(v, list) and bool(v) and all(isinstance(n, str) for n in v),
            "a non-empty list of load names",
        ),
    ] = Field(default_factory=lambda: ["medium"])
    allocators: Annotated[list[Allocator], BeforeValidator(_allocators)] = Field(default_factory=_all_allocators)
    #: ``engine.replays`` and ``engine.overhead_mix`` of the subset: checked as those keys (under
    #: ``quick.``) only with ``--quick`` (:meth:`ValidationSpec.quick_subset`), unset: the engine's
    replays: Any = None
    overhead_mix: Any = None


#: ``quick``'s keys: the subset, and the engine options it may set for itself
QUICK_ENGINE_KEYS = {"replays", "overhead_mix"}
QUICK_KEYS = set(QuickSpec.model_fields)


def _mapping(allowed: str) -> BeforeValidator:
    return _check(lambda v: isinstance(v, (dict, BaseModel)), allowed)


class ValidationSpec(_Section):
    """A ``kvsim validate`` spec (docs/validation.md), defaults filled. :func:`load_spec` reads one
    from YAML and checks what spans keys; :meth:`quick_subset` narrows it to its ``quick`` section."""

    #: marks the file as a validation spec, not a simulator scenario
    kind: Annotated[
        Literal["validation"] | None,
        _check(lambda v: v == "validation", "validation (or no kind): this file is a validation spec"),
    ] = None
    name: Annotated[str, _string()] = "validate"
    description: Annotated[str, _string()] = ""
    model: Annotated[str, BeforeValidator(_model)] = "tiny-llama"
    engine: Annotated[EngineSpec, _mapping("a mapping (docs/validation.md)")] = Field(default_factory=EngineSpec)
    kv: Annotated[KvSpec, _mapping("a mapping (docs/validation.md)")] = Field(default_factory=KvSpec)
    scheduler: Annotated[SchedulerSpec, _mapping("a mapping (docs/validation.md)")] = Field(
        default_factory=SchedulerSpec
    )
    static_reserve: Annotated[int, _at_least(1, "token slots reserved per request (static)")] = 480
    workload: Annotated[WorkloadSpec, _mapping("a mapping (docs/validation.md)")] = Field(default_factory=WorkloadSpec)
    loads: Annotated[
        list[LoadSpec],
        _check(lambda v: isinstance(v, list) and bool(v), "a non-empty list of {name, utilization or rate}"),
    ] = Field(default_factory=_default_loads)
    allocators: Annotated[list[Allocator], BeforeValidator(_allocators)] = Field(default_factory=_all_allocators)
    # replay.py tests == "probe": any other word would silently turn rescaling off
    host_speed: Annotated[HostSpeedMode, _one_of(HOST_SPEEDS)] = "probe"
    quick: Annotated[QuickSpec, _mapping(f"a mapping of {', '.join(sorted(QUICK_KEYS))}")] = Field(
        default_factory=QuickSpec
    )
    #: the file it was loaded from (set by :func:`load_spec`, not a key of the file)
    source: str | None = None

    @field_validator("loads")
    @classmethod
    def _distinct_names(cls, loads: list[LoadSpec]) -> list[LoadSpec]:
        seen: set[str] = set()
        for i, ld in enumerate(loads):
            if ld.name in seen:
                raise SpecError("a non-empty name, distinct among the loads", ld.name, f"[{i}].name")
            seen.add(ld.name)
        return loads

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValidationSpec:
        """``data`` (a spec's keys, the rest defaults) checked key by key; a bad value is a one-line
        :class:`ConfigError` naming its ``validate.`` key. What spans keys is :func:`load_spec`'s."""
        if "source" in data:  # not a key of the file
            raise ConfigError(f"{KEY}.source", data["source"], f"unknown key; allowed: {', '.join(_allowed(cls))}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as err:
            raise _config_error(err) from None

    def capacity_tokens(self) -> int:
        """The engine's KV capacity in tokens: ``kv.num_blocks x kv.block_size``."""
        return self.kv.num_blocks * self.kv.block_size

    def quick_subset(self) -> ValidationSpec:
        """A copy narrowed to ``quick``: its requests per load, loads and allocators, and its own
        engine options (``quick.replays``, ``quick.overhead_mix``, checked here under those keys)."""
        q = self.quick
        _check_quick_loads(self)
        over = {k: getattr(q, k) for k in sorted(QUICK_ENGINE_KEYS & q.model_fields_set)}
        try:
            engine = EngineSpec.model_validate({**self.engine.model_dump(), **over})
        except ValidationError as err:
            raise _config_error(err, ("quick",)) from None
        out = self.model_copy(deep=True)
        out.engine = engine
        out.workload.num_requests = q.num_requests
        out.loads = [ld for ld in out.loads if ld.name in q.loads]
        out.allocators = list(q.allocators)
        return out


#: the default spec as the nested dict a YAML file spells it
DEFAULT_SPEC: dict[str, Any] = ValidationSpec().model_dump(exclude_none=True)

_SECTIONS: dict[str, type[BaseModel]] = {
    "engine": EngineSpec,
    "kv": KvSpec,
    "scheduler": SchedulerSpec,
    "workload": WorkloadSpec,
    "loads": LoadSpec,
    "quick": QuickSpec,
}


def _allowed(model: type[BaseModel]) -> list[str]:
    return sorted(k for k in model.model_fields if k != "source")


def _config_error(err: ValidationError, prefix: tuple[str, ...] = ()) -> ConfigError:
    """The first error of ``err`` as one line: ``validate.<key>: got <value>; <what is allowed>``."""
    e = err.errors()[0]
    loc = (*prefix, *e["loc"])
    key = KEY + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    value = e.get("input")
    if e["type"] == "extra_forbidden":
        names = [p for p in loc[:-1] if isinstance(p, str)]
        model = _SECTIONS.get(names[0], ValidationSpec) if names else ValidationSpec
        return ConfigError(key, value, f"unknown key; allowed: {', '.join(_allowed(model))}")
    exc = (e.get("ctx") or {}).get("error")
    if isinstance(exc, SpecError):
        return ConfigError(key + exc.sub, value if exc.value is _GIVEN else exc.value, exc.allowed)
    return ConfigError(key, value, str(e["msg"]).removeprefix("Value error, "))


def load_spec(path: str | Path, quick: bool = False, kernels: str | None = None) -> ValidationSpec:
    """A validation spec (YAML) with defaults filled; ``quick`` narrows it to its ``quick`` section
    (:meth:`ValidationSpec.quick_subset`), ``kernels`` (``--kernels``) replaces ``engine.kernels``."""
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
    if kernels is not None and isinstance(raw.get("engine", {}), dict):
        raw = {**raw, "engine": {**raw.get("engine", {}), "kernels": kernels}}
    spec = ValidationSpec.from_dict(raw)
    if "loads" in spec.quick.model_fields_set:
        # checked with or without --quick: a CI-only typo should not wait for CI to surface (the default
        # quick.loads, [medium], only when it is used: a spec with other load names may never run --quick)
        _check_quick_loads(spec)
    _check_values(spec)
    if quick:
        spec = spec.quick_subset()
    _check_simulator(spec)
    spec.source = str(p)
    return spec


def _check_quick_loads(spec: ValidationSpec) -> None:
    names = [ld.name for ld in spec.loads]
    for n in spec.quick.loads:
        if n not in names:
            raise ConfigError(f"{KEY}.quick.loads", n, f"a name in loads: {', '.join(names)}")


def _check_values(spec: ValidationSpec) -> None:
    """What spans keys: the lengths, the static reserve and the KV capacity agree, so that a bad value
    is named by its spec key before calibration (the engine and the simulator would name their own
    keys, minutes later)."""
    w = spec.workload
    cap = spec.capacity_tokens()
    lengths = w.lengths
    longest = None
    if lengths.get("kind") == "uniform":
        pmax, omax = lengths.get("prompt_max"), lengths.get("output_max")
        if type(pmax) is int and type(omax) is int:  # not bool: the simulator refuses those itself
            longest = pmax + omax
    if longest is not None and w.max_model_len < longest:
        raise ConfigError(
            f"{KEY}.workload.max_model_len",
            w.max_model_len,
            f"at least workload.lengths prompt_max + output_max ({longest}): the longest request",
        )
    if longest is not None and spec.static_reserve < longest:
        # a shorter reserve never completes the longest request: capacity 0, arrival rate 0, minutes later
        raise ConfigError(
            f"{KEY}.static_reserve",
            spec.static_reserve,
            f"at least workload.lengths prompt_max + output_max ({longest}): the longest request",
        )
    if spec.static_reserve > min(w.max_model_len, cap):
        raise ConfigError(
            f"{KEY}.static_reserve",
            spec.static_reserve,
            f"at most workload.max_model_len ({w.max_model_len}) and the KV capacity kv.num_blocks x "
            f"kv.block_size ({cap})",
        )


#: simulator keys (:func:`calibration.validate.simulator.sim_scenario`) -> the spec keys they come from
_SIM_KEYS = {"allocator.reserve": "static_reserve", "allocator.block_size": "kv.block_size"}


def _check_simulator(spec: ValidationSpec) -> None:
    """Build the simulator's scenario now so what it refuses (lengths, scheduler bounds) is said before
    calibration, under the spec key it came from."""
    from .simulator import sim_scenario

    for alloc in spec.allocators:
        try:
            # the cuda entry holds any engine-sized model (the cpu one not an 8B); capacity is the spec's anyway
            sim_scenario(spec, alloc, arrival={"kind": "poisson", "rate": 1.0}, device="cuda")
        except ConfigError as exc:
            key = str(exc.key)
            raise ConfigError(f"{KEY}.{_SIM_KEYS.get(key, key)}", exc.value, exc.allowed) from None


def check_clocks(spec: ValidationSpec, device: str) -> None:
    """Thread CPU time times a CPU engine's kernels, not a GPU's (they run asynchronously on the
    device): on ``cuda`` only the ``wall`` clock measures the engine."""
    clocks = spec.engine.clocks
    bad = [c for c in clocks if c in ("cpu", "cpu_norm")]
    if device != "cpu" and bad:
        raise ConfigError(
            f"{KEY}.engine.clocks",
            clocks,
            f"[wall] with --device {device}: {', '.join(bad)} time the engine's thread on the CPU, "
            "not its kernels on the GPU",
        )
