"""Which ``allocator.*`` keys a scenario's allocator reads, and refusing a sweep axis none of its
points reads (every value of it would give the same run).

What a kind reads is its registration (:mod:`.registry`): its ``knobs``, narrowed by its
``only_with`` (``static`` reads ``block_size`` only with ``overflow: fallback``), plus
:data:`~sim.allocators.registry.COMMON_KNOBS`, which every kind takes. Both ``kvsim sweep``
(:meth:`sim.analysis.sweep.SweepSpec.points`) and the explorer's sweeps
(:func:`sim.explorer.check_axes_read`) ask it through :func:`sim.analysis.sweep.check_sweep_axes`
before any point runs; the arrival kind's rule is :mod:`sim.workload.arrival_use`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sim.allocators.registry import COMMON_KNOBS, REGISTRY, AllocatorKind
from sim.config import AllocatorConfig, grid_sections
from sim.errors import ConfigError

_PREFIX = "allocator."


def _value(cfg: AllocatorConfig, key: str) -> Any:
    """``allocator.<key>`` of ``cfg`` (``key`` dotted into a section)."""
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _covered(knobs: Iterable[str], key: str) -> list[str]:
    """The knobs ``key`` sets: itself, or those of the section it names."""
    return [k for k in knobs if k == key or k.startswith(key + ".")]


def _holds(cfg: AllocatorConfig, when: Mapping[str, tuple]) -> bool:
    return all(_value(cfg, k) in values for k, values in when.items())


def reads(cfg: AllocatorConfig, key: str) -> bool:
    """Whether an allocator of ``cfg.kind`` set up from ``cfg`` reads ``allocator.<key>`` (dotted,
    without ``allocator.``; a section is read when one of its knobs is). A kind that is not
    registered reads everything (its points fail with their own error)."""
    if _covered(COMMON_KNOBS, key):
        return True
    entry = REGISTRY.get(cfg.kind)
    if entry is None:
        return True
    return any(_holds(cfg, entry.only_with.get(k, {})) for k in _covered(entry.knobs, key))


def points_reading(key: str, configs: Sequence[AllocatorConfig]) -> list[int]:
    """Indices of the points (their ``allocator`` sections) whose allocator reads ``key``
    (``allocator.``-prefixed or not)."""
    knob = key.removeprefix(_PREFIX)
    return [i for i, cfg in enumerate(configs) if reads(cfg, knob)]


def grid_configs(base: AllocatorConfig, grid: Mapping[str, Sequence]) -> list[AllocatorConfig]:
    """The ``allocator`` section of every point of a Cartesian ``grid`` (dotted scenario keys →
    values) over ``base``: only its ``allocator.*`` axes matter. A point whose section is invalid
    is left out (it fails with its own error)."""
    return grid_sections(base, _PREFIX, grid)


def _show(value: Any) -> str:
    """A value as a scenario file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _keys_text(knobs: Sequence[str]) -> str:
    """``allocator.{a, b, compaction.*}``: a section whose every key is listed is ``section.*``."""
    items: list[str] = []
    for k in knobs:
        section, _, _ = k.rpartition(".")
        if not section:
            items.append(k)
            continue
        fields = type(_value(AllocatorConfig(), section)).model_fields
        whole = all(f"{section}.{f}" in knobs for f in fields)
        item = f"{section}.*" if whole else k
        if item not in items:
            items.append(item)
    return _PREFIX + (items[0] if len(items) == 1 else "{" + ", ".join(items) + "}")


def _when_text(when: Mapping[str, tuple]) -> str:
    return " and ".join(f"{k}: {' or '.join(map(_show, vs))}" for k, vs in when.items())


def _kind_text(entry: AllocatorKind, knob: str) -> str:
    """``static reads allocator.{...} (block_size only with overflow: fallback)``: the conditions
    of the knobs ``knob`` sets."""
    groups: dict[str, list[str]] = {}
    for k in _covered(entry.knobs, knob):
        if k in entry.only_with:
            groups.setdefault(_when_text(entry.only_with[k]), []).append(k)
    only = "; ".join(f"{', '.join(ks)} only with {when}" for when, ks in groups.items())
    return f"{entry.kind} reads {_keys_text(entry.knobs)}" + (f" ({only})" if only else "")


def check_axes_read(axes: Mapping[str, Sequence], configs: Sequence[AllocatorConfig]) -> None:
    """Refuse an ``allocator.*`` axis of ``axes`` (dotted scenario key → its values) that the
    allocator of none of the points reads (``configs``: their ``allocator`` sections, the valid
    points only): every value of it would give the same run. ``allocator.kind`` and axes of
    other sections are not checked; without a valid point nothing is refused."""
    if not configs:
        return
    for key, values in axes.items():
        if not key.startswith(_PREFIX) or key == _PREFIX + "kind" or points_reading(key, configs):
            continue
        knob = key.removeprefix(_PREFIX)
        kinds = list(dict.fromkeys(cfg.kind for cfg in configs))
        # The settings that turn the knob off where a kind would read it under others (not those
        # the axis sets itself, as a swept section does).
        settings: dict[str, list[str]] = {}
        for cfg in configs:
            entry = REGISTRY[cfg.kind]  # an unregistered kind reads every key: not here
            for k in _covered(entry.knobs, knob):
                for cond, allowed in entry.only_with.get(k, {}).items():
                    value = _show(_value(cfg, cond))
                    if _covered([cond], knob) or _value(cfg, cond) in allowed:
                        continue
                    shown = settings.setdefault(cond, [])
                    if value not in shown:
                        shown.append(value)
        setting = " and ".join(f"{_PREFIX}{c}: {', '.join(vs)}" for c, vs in settings.items())
        who = f"allocator.kind {kinds[0]}" if len(kinds) == 1 else f"each of allocator.kind {', '.join(kinds)}"
        raise ConfigError(
            f"sweep axis {key}",
            list(values),
            "a key the allocator reads (otherwise its values all give the same run): "
            + who
            + (f" with {setting}" if setting else "")
            + " ignores it; "
            + "".join(f"{_kind_text(REGISTRY[k], knob)}; " for k in kinds)
            + f"every kind reads {_keys_text(COMMON_KNOBS)}",
        )


__all__ = ["check_axes_read", "grid_configs", "points_reading", "reads"]
