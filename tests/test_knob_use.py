"""What each allocator kind reads (sim/allocators/knob_use.py): the registry's ``knobs`` and
``only_with`` against what the kind's ``size`` and ``build`` actually read from the ``allocator``
section, plus what the engine reads around the allocator it builds."""

from __future__ import annotations

import itertools
import typing
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel

from sim.allocators import knob_use, registry
from sim.allocators.capabilities import Compactable, LengthHints
from sim.config import AllocatorConfig, apply_overrides
from sim.errors import ConfigError


class _Recorder:
    """Stands in for an ``AllocatorConfig`` (or one of its sections) and records every key read
    (dotted for sections)."""

    def __init__(self, obj: BaseModel, seen: set[str], prefix: str = "") -> None:
        self._obj, self._seen, self._prefix = obj, seen, prefix

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        key = self._prefix + name
        if isinstance(value, BaseModel):
            return _Recorder(value, self._seen, key + ".")
        self._seen.add(key)
        return value


def _switches() -> dict[str, list]:
    """Every ``allocator.*`` key that takes one of a few values (a Literal or a bool), with them:
    the settings a knob could be read under."""
    out: dict[str, list] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            elif ann is bool:
                out[prefix + name] = [False, True]
            elif typing.get_origin(ann) is typing.Literal and name != "kind":
                out[prefix + name] = list(typing.get_args(ann))

    walk(AllocatorConfig, "")
    return out


def _variants(kind: str) -> list[AllocatorConfig]:
    """``kind`` at its defaults, and with every one or two switches set to each of their values
    (the registry's conditions are at most two settings away from the defaults)."""
    switches = _switches()
    base = AllocatorConfig(kind=kind).model_dump()
    seen: dict[str, AllocatorConfig] = {}
    for pair in itertools.combinations(switches, 2):
        for values in itertools.product(*(switches[k] for k in pair)):
            cfg = AllocatorConfig.model_validate(apply_overrides(base, dict(zip(pair, values))))
            seen.setdefault(cfg.model_dump_json(), cfg)
    return list(seen.values())


BUDGET = registry.Budget(
    capacity_tokens=1 << 16,
    kv_bytes_per_token=128,
    max_model_len=2048,
    needed_tokens=2048,
    percentile=lambda q: 1024,
)


def _engine_reads(kind: str, cfg: AllocatorConfig, alloc: object) -> set[str]:
    """What ``sim/engine/cluster.py`` and ``replica.py`` read from ``allocator`` around an allocator,
    beside ``preemption.*`` (every kind's). ``overflow`` is also read by the replica when an
    allocator overflows a sequence part-way, which only static's reservation does (its size and
    build read it)."""
    out: set[str] = set()
    if isinstance(alloc, Compactable):  # the replica compacts it with compaction.enabled
        out.add("compaction.enabled")
        if cfg.compaction.enabled:
            out |= {
                "compaction.below_utilization",
                "compaction.above_fragmentation",
                "compaction.mode",
                "compaction.period_s",
            }
            if cfg.compaction.mode == "background":
                out.add("compaction.background_slowdown")
    if isinstance(alloc, LengthHints):  # cluster.length_predictor
        out.add("length_predictor")
        if cfg.length_predictor == "quantile":
            out.add("predictor_quantile")
    if kind == "hybrid_reserve":  # Replica(stale_after_s=...) for this kind only
        out.add("stale_after_s")
    return out


def _read_by(kind: str, cfg: AllocatorConfig) -> set[str]:
    """The ``allocator.*`` keys one replica's allocator of ``kind`` reads, set up from ``cfg``."""
    entry = registry.REGISTRY[kind]
    seen: set[str] = set()
    rec: Any = _Recorder(cfg, seen)
    alloc = entry.build(rec, entry.size(rec, BUDGET))
    return (seen | _engine_reads(kind, cfg, alloc)) - {"kind"}


@pytest.mark.parametrize("kind", ["static", "dynamic", "paged", "hybrid_tail", "hybrid_reserve"])
def test_each_kind_lists_exactly_the_keys_it_reads(kind):
    entry = registry.REGISTRY[kind]
    common = set(registry.COMMON_KNOBS)
    ever: set[str] = set()
    for cfg in _variants(kind):
        read = _read_by(kind, cfg)
        ever |= read
        assert not read & common, "preemption.* is every kind's (COMMON_KNOBS), read by the engine"
        # What the registry says is read here (knobs, narrowed by only_with) is what is read.
        said = {k for k in entry.knobs if knob_use.reads(cfg, k)}
        default = AllocatorConfig().model_dump()
        changed = {k: v for k, v in cfg.model_dump().items() if v != default[k]}
        assert said == read, (
            f"{kind} with {changed}: listed but not read {sorted(said - read)}, read but not listed {sorted(read - said)}"
        )
    assert set(entry.knobs) == ever, f"{kind}: knobs never read {sorted(set(entry.knobs) - ever)}"


def test_the_check_can_fail(monkeypatch):
    """A kind that forgets a knob it reads, or lists one it does not, is caught."""
    paged = registry.REGISTRY["paged"]
    cfg = AllocatorConfig(kind="paged", prefix_caching={"enabled": True})
    monkeypatch.setitem(registry.REGISTRY, "paged", replace(paged, knobs=("block_size", "growth"), only_with={}))
    said = {k for k in registry.REGISTRY["paged"].knobs if knob_use.reads(cfg, k)}
    read = _read_by("paged", cfg)
    assert read - said == {"page_reuse", "prefix_caching.enabled", "prefix_caching.eviction"}
    assert said - read == {"growth"}


def test_reads_follows_only_with_point_by_point():
    static = AllocatorConfig(kind="static")
    assert not knob_use.reads(static, "block_size") and not knob_use.reads(static, "page_reuse")
    assert knob_use.reads(static.model_copy(update={"overflow": "fallback"}), "block_size")
    assert knob_use.reads(static, "compaction")  # a section: one of its knobs is read
    assert knob_use.reads(static, "preemption.mode")  # every kind's
    configs = knob_use.grid_configs(static, {"allocator.overflow": ["reject", "fallback"], "workload.x": [1, 2]})
    assert [c.overflow for c in configs] == ["reject", "fallback"]
    assert knob_use.points_reading("allocator.fallback_fraction", configs) == [1]


def test_register_checks_only_with():
    build = registry.REGISTRY["paged"].build
    with pytest.raises(KeyError, match="not one of toy's knobs"):
        registry.register("toy", build, knobs=(), only_with={"block_size": {"overflow": ("fallback",)}}, description="")
    with pytest.raises(KeyError, match="allocator.no_such_key"):
        registry.register(
            "toy", build, knobs=("block_size",), only_with={"block_size": {"no_such_key": (1,)}}, description=""
        )
    with pytest.raises(ValueError, match="non-empty list"):
        registry.register(
            "toy", build, knobs=("block_size",), only_with={"block_size": {"overflow": "fallback"}}, description=""
        )
    assert "toy" not in registry.REGISTRY


def test_an_axis_no_point_reads_is_refused_with_the_settings_that_turn_it_off():
    dynamic = AllocatorConfig(kind="dynamic")
    grid = {"allocator.compaction.period_s": [0.1, 1.0]}
    with pytest.raises(ConfigError) as e:
        knob_use.check_axes_read(grid, knob_use.grid_configs(dynamic, grid))
    msg = str(e.value)
    assert msg.startswith("sweep axis allocator.compaction.period_s: got [0.1, 1.0]; a key the allocator reads"), msg
    assert "allocator.kind dynamic with allocator.compaction.enabled: false ignores it" in msg, msg
    assert "(compaction.period_s only with compaction.enabled: true)" in msg, msg
    # Swept together with what turns it on, or over no valid point: not refused.
    grid = {"allocator.compaction.enabled": [True], **grid}
    knob_use.check_axes_read(grid, knob_use.grid_configs(dynamic, grid))
    knob_use.check_axes_read({"allocator.block_size": [16, 32]}, [])
