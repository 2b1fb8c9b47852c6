"""Which ``workload.arrival.*`` keys an arrival kind reads, and refusing a sweep axis on one that
the arrival kind of none of the sweep's points reads (every value of it would give the same run).

What a kind reads is :data:`sim.config.ARRIVAL_KEYS` (next to the arrival config), plus
:data:`~sim.config.ARRIVAL_COMMON_KEYS`, which every kind reads. The allocator's rule is
:mod:`sim.allocators.knob_use`; :func:`sim.analysis.sweep.check_sweep_axes` applies both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sim.config import ARRIVAL_COMMON_KEYS, ARRIVAL_KEYS, ArrivalConfig, grid_sections
from sim.errors import ConfigError

_ARRIVAL = "workload.arrival."


def grid_arrivals(base: ArrivalConfig, grid: Mapping[str, Sequence]) -> list[ArrivalConfig]:
    """The ``workload.arrival`` section of every point of a Cartesian ``grid`` (dotted scenario keys
    → values) over ``base``: only its ``workload.arrival.*`` axes matter. A point whose section is
    invalid is left out (it fails with its own error)."""
    return grid_sections(base, _ARRIVAL, grid)


def arrival_reads(kind: str, key: str) -> bool:
    """Whether arrivals of ``kind`` read ``workload.arrival.<key>`` (without the prefix). A kind
    that :data:`~sim.config.ARRIVAL_KEYS` does not list reads everything."""
    field = key.split(".", 1)[0]
    if field in ARRIVAL_COMMON_KEYS or kind not in ARRIVAL_KEYS:
        return True
    return field in ARRIVAL_KEYS[kind]


def _keys_text(keys: Sequence[str]) -> str:
    return _ARRIVAL + (keys[0] if len(keys) == 1 else "{" + ", ".join(keys) + "}")


def check_arrival_axes_read(axes: Mapping[str, Sequence], arrivals: Sequence[ArrivalConfig]) -> None:
    """Refuse a ``workload.arrival.*`` axis of ``axes`` that the arrival kind of none of the points
    reads (``arrivals``: their ``workload.arrival`` sections, the valid points only): every value
    of it would give the same run. ``workload.arrival.kind`` is not checked; without a valid point
    nothing is refused."""
    if not arrivals:
        return
    kinds = list(dict.fromkeys(a.kind for a in arrivals))
    for key, values in axes.items():
        if not key.startswith(_ARRIVAL) or key == _ARRIVAL + "kind":
            continue
        field = key.removeprefix(_ARRIVAL)
        if any(arrival_reads(k, field) for k in kinds):
            continue
        who = (
            f"workload.arrival.kind {kinds[0]}"
            if len(kinds) == 1
            else f"each of workload.arrival.kind {', '.join(kinds)}"
        )
        raise ConfigError(
            f"sweep axis {key}",
            list(values),
            "a key the arrival kind reads (otherwise its values all give the same run): "
            + who
            + " ignores it; "
            + "".join(f"{k} reads {_keys_text(ARRIVAL_KEYS[k])}; " for k in kinds)
            + f"every kind reads {_keys_text(ARRIVAL_COMMON_KEYS)}",
        )


__all__ = ["arrival_reads", "check_arrival_axes_read", "grid_arrivals"]
