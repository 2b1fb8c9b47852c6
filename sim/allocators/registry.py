"""Allocator kinds by name: what ``allocator.kind`` selects and how it is built.

A kind is registered once (:func:`register`) with

* ``build(cfg, budget)``: the allocator for one replica, from the scenario's ``allocator``
  section (:class:`sim.config.AllocatorConfig`) and the memory the deployment resolved
  (:class:`Budget`). It raises :class:`sim.errors.ConfigError` for knob values it cannot use;
* ``knobs``: the ``allocator.*`` keys it reads (dotted for nested sections, e.g.
  ``compaction.enabled``): its ``build`` and ``size``, and the engine around the allocator it
  builds (``compaction.*`` for a :class:`~sim.allocators.capabilities.Compactable` one,
  ``length_predictor`` for :class:`~sim.allocators.capabilities.LengthHints`). Their defaults are
  the config's (:func:`knob_defaults`), defined there once; ``kvsim list allocators``, the explorer
  and the planner list them;
* ``only_with`` (optional): knobs it reads only while other ``allocator.*`` keys have certain
  values, ``{knob: {key: (values...)}}`` (every key must hold one of its values): ``static``
  builds its paged fallback region (``block_size``…) only with ``overflow: fallback``. A sweep
  axis no point reads is refused (:mod:`sim.allocators.knob_use`);
* ``description``: one line on what it models;
* ``paged_layout``: attention reads a block table (the cost model prices the paged kernels);
* ``layer_groups``: it holds a model's KV per layer group (:class:`sim.catalog.KVGroups`): a
  sliding-window layer keeps only its window. The deployment then sizes the budget in slots
  (tokens of one group) and hands it the groups; a kind without it holds every layer at the
  sequence's whole length (an upper bound for models with sliding-window layers);
* ``size(cfg, budget)`` (optional): resolves the sizes the kind derives from its knobs (a
  reservation in tokens…) and rejects values that cannot fit, when the deployment is resolved —
  before anything runs, so a sweep refuses a bad point up front.

The built-in kinds are registered in :mod:`sim.allocators.kinds`, in the order of
:data:`sim.config.ALLOCATOR_KINDS`. A kind registered elsewhere (a plugin, a test) is added to
that list so scenarios naming it validate; :func:`unregister` removes it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.config import ALLOCATOR_KINDS, AllocatorConfig
from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.allocators.base import Allocator
    from sim.catalog import KVGroups


@dataclass(frozen=True)
class Budget:
    """What one replica's allocator may hold, from the deployment (``sim/engine/deployment.py``);
    a kind's ``size`` hook fills in the sizes it resolves from its knobs."""

    #: KV capacity of the replica, in token slots (tokens of one layer group where ``groups`` is set).
    capacity_tokens: int
    #: Bytes of one slot.
    kv_bytes_per_token: int
    #: ``workload.max_model_len``: the longest request (prompt + output), in tokens.
    max_model_len: int
    #: The attention window in tokens when every layer slides (``None``: some or all attend fully).
    sliding_window: int | None = None
    #: Slots one ``max_model_len`` request holds (more than its length for encoder-decoders).
    needed_tokens: int = 0
    #: ``q`` → the workload's ``q``-th percentile of total request length, in tokens (``None``
    #: where the workload is not known: a percentile knob is then refused).
    percentile: Callable[[float], int] | None = field(default=None, compare=False, repr=False)
    #: ``allocator.reserve`` resolved to tokens (static and hybrid_tail reservations).
    reserve_tokens: int | None = None
    #: ``allocator.long_threshold`` resolved to tokens (hybrid_tail).
    long_threshold_tokens: int | None = None
    #: The model's KV cache groups, for a kind registered with ``layer_groups`` (``None`` otherwise).
    groups: KVGroups | None = None


Builder = Callable[[AllocatorConfig, Budget], "Allocator"]
#: Resolves a kind's sizes (``dataclasses.replace`` of the budget) and rejects knob values that
#: cannot fit, with a :class:`sim.errors.ConfigError`, before any allocator is built.
Sizer = Callable[[AllocatorConfig, Budget], Budget]


def _as_is(cfg: AllocatorConfig, budget: Budget) -> Budget:
    return budget


@dataclass(frozen=True)
class AllocatorKind:
    """One registered ``allocator.kind``."""

    kind: str
    build: Builder
    knobs: tuple[str, ...]
    description: str
    paged_layout: bool = False
    size: Sizer = _as_is
    layer_groups: bool = False
    #: knob → {``allocator.*`` key: values}: the knob is read only while each key has one of its
    #: values (a knob not here is read whenever the kind is).
    only_with: Mapping[str, Mapping[str, tuple]] = field(default_factory=dict, compare=False)


#: kind → entry, in registration order.
REGISTRY: dict[str, AllocatorKind] = {}


def _default(key: str) -> Any:
    """The config default of ``allocator.<key>`` (``key`` may be dotted into a sub-section)."""
    node: Any = AllocatorConfig()
    for part in key.split("."):
        if not hasattr(node, part):
            raise KeyError(f"allocator.{key} is not a scenario key")
        node = getattr(node, part)
    return node


def register(
    kind: str,
    build: Builder,
    *,
    knobs: tuple[str, ...] | list[str],
    description: str,
    paged_layout: bool = False,
    size: Sizer | None = None,
    layer_groups: bool = False,
    only_with: Mapping[str, Mapping[str, tuple | list]] | None = None,
) -> AllocatorKind:
    """Make ``allocator.kind: <kind>`` build allocators with ``build`` (and resolve its sizes with
    ``size``). Every knob, and every key ``only_with`` names, must be an ``allocator.*`` key of the
    config; a knob in ``only_with`` must be one of ``knobs`` (checked here). A kind is registered
    once."""
    if kind in REGISTRY:
        raise ValueError(f"allocator kind {kind!r} is already registered")
    for k in knobs:
        _default(k)
    conditions: dict[str, dict[str, tuple]] = {}
    for knob, when in (only_with or {}).items():
        if knob not in knobs:
            raise KeyError(f"only_with: allocator.{knob} is not one of {kind}'s knobs")
        if not when:
            raise ValueError(f"only_with: allocator.{knob} needs at least one key and its values")
        for key, values in when.items():
            _default(key)
            if isinstance(values, str) or not values:
                raise ValueError(f"only_with: allocator.{knob}: the values of allocator.{key} must be a non-empty list")
        conditions[knob] = {key: tuple(values) for key, values in when.items()}
    entry = AllocatorKind(
        kind, build, tuple(knobs), description, paged_layout, size or _as_is, layer_groups, conditions
    )
    REGISTRY[kind] = entry
    if kind not in ALLOCATOR_KINDS:
        ALLOCATOR_KINDS.append(kind)
    return entry


def unregister(kind: str) -> None:
    """Forget a kind registered with :func:`register` (scenarios naming it no longer validate)."""
    del REGISTRY[kind]
    if kind in ALLOCATOR_KINDS:
        ALLOCATOR_KINDS.remove(kind)


def get(kind: str) -> AllocatorKind:
    entry = REGISTRY.get(kind)
    if entry is None:
        raise ConfigError("allocator.kind", kind, f"one of {', '.join(REGISTRY)}")
    return entry


def make_allocator(cfg: AllocatorConfig, budget: Budget) -> Allocator:
    """A new allocator of kind ``cfg.kind`` for one replica."""
    return get(cfg.kind).build(cfg, budget)


def knob_defaults(kind: str) -> dict[str, Any]:
    """``{knob: config default}`` of a kind, in its registration order."""
    return {k: _default(k) for k in get(kind).knobs}


#: Knobs every kind takes (preemption is the scheduler's, on any allocator).
COMMON_KNOBS: tuple[str, ...] = ("preemption.mode", "preemption.swap_capacity_bytes", "preemption.victim")


def common_knob_defaults() -> dict[str, Any]:
    return {k: _default(k) for k in COMMON_KNOBS}


class KindsView(Mapping[str, tuple[dict, str]]):
    """``kind -> (knob defaults, description)`` over the registry, as it is now (kinds
    registered later appear)."""

    def __getitem__(self, kind: str) -> tuple[dict, str]:
        if kind not in REGISTRY:
            raise KeyError(kind)
        return knob_defaults(kind), REGISTRY[kind].description

    def __iter__(self) -> Iterator[str]:
        return iter(list(REGISTRY))

    def __len__(self) -> int:
        return len(REGISTRY)
