"""Scheduler kinds by name: what ``scheduler.kind`` selects.

The built-in kinds are registered here, in the order of :data:`sim.config.SCHEDULER_KINDS`
(checked on import); :func:`register` adds a kind (and its name to that list), :func:`unregister`
removes it. A kind is a constructor taking the arguments of
:class:`sim.sched.interface.SchedulerFactory` and returning a
:class:`sim.sched.interface.Scheduler`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.config import SCHEDULER_KINDS, SchedulerConfig
from sim.errors import ConfigError
from sim.sched.continuous import ContinuousScheduler
from sim.sched.static_batch import StaticBatchScheduler

if TYPE_CHECKING:
    from sim.allocators.base import Allocator
    from sim.sched.interface import Scheduler, SchedulerFactory
    from sim.workload.predictor import LengthPredictor

#: kind → constructor, in registration order.
REGISTRY: dict[str, SchedulerFactory] = {}


def register(kind: str, factory: SchedulerFactory) -> None:
    """Make ``scheduler.kind: <kind>`` build schedulers with ``factory``. A kind is registered once."""
    if kind in REGISTRY:
        raise ValueError(f"scheduler kind {kind!r} is already registered")
    REGISTRY[kind] = factory
    if kind not in SCHEDULER_KINDS:
        SCHEDULER_KINDS.append(kind)


def unregister(kind: str) -> None:
    del REGISTRY[kind]
    if kind in SCHEDULER_KINDS:
        SCHEDULER_KINDS.remove(kind)


def make_scheduler(
    cfg: SchedulerConfig,
    allocator: Allocator,
    *,
    kv_cap: int | None,
    swap_capacity_bytes: int,
    hash_block_tokens: int,
    victim_policy: str,
    window_kv_cap: int | None = None,
    length_predictor: LengthPredictor | None = None,
) -> Scheduler:
    """A new scheduler of kind ``cfg.kind`` for one replica, over ``allocator`` (``length_predictor``:
    for allocators that route by predicted length)."""
    factory = REGISTRY.get(cfg.kind)
    if factory is None:
        raise ConfigError("scheduler.kind", cfg.kind, f"one of {', '.join(REGISTRY)}")
    return factory(
        cfg,
        allocator,
        kv_cap=kv_cap,
        window_kv_cap=window_kv_cap,
        swap_capacity_bytes=swap_capacity_bytes,
        hash_block_tokens=hash_block_tokens,
        victim_policy=victim_policy,
        length_predictor=length_predictor,
    )


_BUILTIN = tuple(SCHEDULER_KINDS)
register("continuous", ContinuousScheduler)
register("static_batch", StaticBatchScheduler)
if tuple(REGISTRY) != _BUILTIN:
    raise RuntimeError(f"built-in scheduler kinds {tuple(REGISTRY)} differ from sim.config.SCHEDULER_KINDS {_BUILTIN}")
