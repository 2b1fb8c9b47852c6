"""The built-in allocator kinds: one registration each (see :mod:`.registry`).

Adding a kind is a module with the allocator class, one ``register`` call here, its name in
:data:`sim.config.ALLOCATOR_KINDS` and a section in docs/allocators.md ("Writing an
allocator"). Import order is listing order.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sim.allocators.base import Allocator
from sim.allocators.dynamic import DynamicAllocator
from sim.allocators.hybrid_reserve import HybridReserveAllocator
from sim.allocators.hybrid_tail import HybridTailAllocator
from sim.allocators.paged import PagedAllocator
from sim.allocators.prefix_cache import PrefixCachingPagedAllocator
from sim.allocators.registry import REGISTRY, Budget, register
from sim.allocators.sliding_window import SlidingWindowPagedAllocator
from sim.allocators.static import StaticAllocator
from sim.allocators.tiered import StaticFallbackAllocator
from sim.catalog import KVGroups
from sim.config import ALLOCATOR_KINDS, AllocatorConfig
from sim.errors import ConfigError

_BUILTIN = tuple(ALLOCATOR_KINDS)
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)$")


def parse_reserve(value, max_model_len: int, percentile_fn, key: str = "allocator.reserve") -> int:
    """Tokens for ``allocator.reserve`` (or ``long_threshold``): ``max_model_len``, an int, or ``pNN``."""
    allowed = (
        f"max_model_len ({max_model_len}), a token count in [1, {max_model_len}], "
        "or a percentile like p95 of total request length"
    )
    if value == "max_model_len":
        return max_model_len
    if isinstance(value, bool):
        raise ConfigError(key, value, allowed)
    if isinstance(value, int):
        if not 1 <= value <= max_model_len:
            raise ConfigError(key, value, allowed)
        return value
    m = _PCT.match(str(value).strip())
    if not m or not 0 < float(m.group(1)) <= 100:
        raise ConfigError(key, value, allowed)
    if percentile_fn is None:
        raise ConfigError(key, value, "a percentile needs the workload's length distribution")
    return max(1, min(max_model_len, percentile_fn(float(m.group(1)))))


def _check_buddy(a: AllocatorConfig, b: Budget, region: int, want: int) -> None:
    """A buddy arena of ``region`` tokens must have a block of ``want`` tokens."""
    if a.placement != "buddy":
        return
    largest = 1 << (region.bit_length() - 1)
    if want > largest:
        raise ConfigError(
            "allocator.placement",
            "buddy",
            f"a buddy arena of {region} tokens has blocks of at most {largest}; "
            f"{want} are needed for one request: use first_fit or best_fit",
        )


def _pow2(tokens: int) -> int:
    return 1 << (max(tokens, 1) - 1).bit_length()


def _fallback_tokens(a: AllocatorConfig, b: Budget) -> int:
    """Tokens of the paged fallback region of ``static`` with ``overflow: fallback`` (0 without)."""
    return int(b.capacity_tokens * a.fallback_fraction) if a.overflow == "fallback" else 0


def size_static(a: AllocatorConfig, b: Budget) -> Budget:
    reserve = parse_reserve(a.reserve, b.max_model_len, b.percentile)
    fallback = _fallback_tokens(a, b)
    arena = b.capacity_tokens - fallback
    g = _sliding_groups(b)
    if fallback and g is not None:
        raise ConfigError(
            "allocator.overflow",
            a.overflow,
            "reject or truncate for models with sliding-window layer "
            "groups (the paged fallback region holds one KV layout)",
        )
    # A sliding-window group reserves only the window (StaticAllocator): the slots a reservation asks for.
    slots = reserve if g is None else g.slots_held(reserve)
    if slots > arena:
        if arena < b.capacity_tokens:
            raise ConfigError(
                "allocator.fallback_fraction",
                a.fallback_fraction,
                f"a static arena that holds one reservation of {slots} tokens: at most "
                f"{1 - slots / b.capacity_tokens:.3g} of {b.capacity_tokens} tokens",
            )
        fit = b.capacity_tokens if g is None else g.tokens_fitting(b.capacity_tokens)
        raise ConfigError(
            "allocator.reserve", a.reserve, f"a reservation of at most {fit} tokens (one replica's KV capacity)"
        )
    if a.overflow == "fallback" and fallback < 2 * a.block_size:
        raise ConfigError(
            "allocator.fallback_fraction",
            a.fallback_fraction,
            f"a fallback region of at least two blocks of {a.block_size} tokens "
            f"({a.fallback_fraction} of {b.capacity_tokens} tokens is {fallback})",
        )
    _check_buddy(a, b, arena, _pow2(slots))
    return replace(b, reserve_tokens=reserve)


def size_dynamic(a: AllocatorConfig, b: Budget) -> Budget:
    if a.growth == "chunk" and a.chunk_tokens > b.max_model_len:
        raise ConfigError(
            "allocator.chunk_tokens", a.chunk_tokens, f"at most workload.max_model_len ({b.max_model_len})"
        )
    _check_buddy(a, b, b.capacity_tokens, b.needed_tokens)
    return b


def size_hybrid_tail(a: AllocatorConfig, b: Budget) -> Budget:
    max_len, cap = b.max_model_len, b.capacity_tokens
    static_tokens = int(cap * a.static_fraction)
    if static_tokens < max_len:
        raise ConfigError(
            "allocator.static_fraction",
            a.static_fraction,
            f"a static partition of at least one max_model_len request ({max_len} tokens); "
            f"{a.static_fraction} of {cap} tokens is {static_tokens}",
        )
    if cap - static_tokens < a.block_size:
        # The paged pool gets what the static partition leaves, in whole blocks: at least one.
        raise ConfigError(
            "allocator.static_fraction",
            a.static_fraction,
            f"a paged pool of at least one block of allocator.block_size {a.block_size} tokens; "
            f"{a.static_fraction} of {cap} tokens leaves {cap - static_tokens}",
        )
    long_threshold = parse_reserve(a.long_threshold, max_len, b.percentile, key="allocator.long_threshold")
    _check_buddy(a, b, static_tokens, _pow2(max_len))
    return replace(b, reserve_tokens=max_len, long_threshold_tokens=long_threshold)


def size_hybrid_reserve(a: AllocatorConfig, b: Budget) -> Budget:
    cap, needed = b.capacity_tokens, b.needed_tokens
    usable = min(1.0 - a.reserve_fraction, a.preempt_at_usage)
    if cap * usable < needed:
        raise ConfigError(
            "allocator.reserve_fraction",
            a.reserve_fraction,
            f"room for one max_model_len request outside the reserve and below preempt_at_usage "
            f"({int(cap * usable)} of {cap} tokens usable, {needed} needed)",
        )
    return b


def _check_block_size(a: AllocatorConfig, b: Budget) -> None:
    if a.block_size > b.capacity_tokens // 2:
        raise ConfigError(
            "allocator.block_size",
            a.block_size,
            f"at most {b.capacity_tokens // 2} tokens (half the KV capacity of one replica, "
            f"{b.capacity_tokens} tokens)",
        )


def _sliding_groups(b: Budget) -> KVGroups | None:
    """The budget's layer groups when some of them slide (the kind then holds KV per group)."""
    return b.groups if b.groups is not None and b.groups.sliding else None


def _reserve(b: Budget) -> int:
    assert b.reserve_tokens is not None, "the deployment resolves allocator.reserve for this kind"
    return b.reserve_tokens


def build_static(a: AllocatorConfig, b: Budget) -> Allocator:
    fallback = _fallback_tokens(a, b)
    arena = StaticAllocator(
        b.capacity_tokens - fallback,
        b.kv_bytes_per_token,
        _reserve(b),
        placement=a.placement,
        groups=_sliding_groups(b),
    )
    if not fallback:
        return arena
    return StaticFallbackAllocator(
        arena, PagedAllocator(fallback, b.kv_bytes_per_token, a.block_size, a.page_reuse), b.kv_bytes_per_token
    )


def build_dynamic(a: AllocatorConfig, b: Budget) -> Allocator:
    # chunk_tokens is read only with growth: chunk (only_with below says so).
    chunk = {"chunk_tokens": a.chunk_tokens} if a.growth == "chunk" else {}
    return DynamicAllocator(b.capacity_tokens, b.kv_bytes_per_token, a.growth, placement=a.placement, **chunk)


def build_paged(a: AllocatorConfig, b: Budget) -> Allocator:
    _check_block_size(a, b)
    cap, bpt = b.capacity_tokens, b.kv_bytes_per_token
    g = _sliding_groups(b)
    if a.prefix_caching.enabled:
        if b.sliding_window is not None or g is not None:
            raise ConfigError(
                "allocator.prefix_caching.enabled",
                True,
                "false for models with sliding-window layers (their blocks slide out of the window)",
            )
        return PrefixCachingPagedAllocator(cap, bpt, a.block_size, a.page_reuse, eviction=a.prefix_caching.eviction)
    if g is not None:
        assert g.window is not None
        return SlidingWindowPagedAllocator(
            cap, bpt, a.block_size, a.page_reuse, window=g.window, full_groups=g.full, window_groups=g.sliding
        )
    if b.sliding_window is not None:
        return SlidingWindowPagedAllocator(cap, bpt, a.block_size, a.page_reuse, window=b.sliding_window)
    return PagedAllocator(cap, bpt, a.block_size, a.page_reuse)


def build_hybrid_tail(a: AllocatorConfig, b: Budget) -> Allocator:
    _check_block_size(a, b)
    cap = b.capacity_tokens
    assert b.long_threshold_tokens is not None, "the deployment resolves allocator.long_threshold"
    return HybridTailAllocator(
        cap,
        b.kv_bytes_per_token,
        static_tokens=int(cap * a.static_fraction),
        reserve_tokens=_reserve(b),
        long_threshold_tokens=b.long_threshold_tokens,
        block_size=a.block_size,
        page_reuse=a.page_reuse,
        placement=a.placement,
    )


def build_hybrid_reserve(a: AllocatorConfig, b: Budget) -> Allocator:
    _check_block_size(a, b)
    return HybridReserveAllocator(
        b.capacity_tokens,
        b.kv_bytes_per_token,
        a.block_size,
        a.page_reuse,
        reserve_fraction=a.reserve_fraction,
        preempt_at_usage=a.preempt_at_usage,
        admit_when_free_above=a.admit_when_free_above,
    )


#: ``allocator.compaction.*``: the replica compacts a :class:`~sim.allocators.capabilities.Compactable`
#: allocator (static's arena, dynamic) by these, and only with ``enabled: true``.
_COMPACTION = (
    "compaction.enabled",
    "compaction.below_utilization",
    "compaction.above_fragmentation",
    "compaction.mode",
    "compaction.background_slowdown",
    "compaction.period_s",
)


def _compaction_only_with(**also: tuple) -> dict[str, dict[str, tuple]]:
    """``only_with`` of the compaction knobs, each also conditioned on ``also`` (key → values)."""
    enabled = {**also, "compaction.enabled": (True,)}
    out: dict[str, dict[str, tuple]] = {k: dict(enabled) for k in _COMPACTION[1:]}
    out["compaction.background_slowdown"]["compaction.mode"] = ("background",)
    if also:
        out["compaction.enabled"] = dict(also)
    return out


# static with overflow: fallback builds a paged fallback region (block_size, page_reuse,
# fallback_fraction); without it, the arena alone, which the replica may compact.
_STATIC_FALLBACK = {"overflow": ("fallback",)}
register(
    "static",
    build_static,
    size=size_static,
    knobs=("reserve", "overflow", "placement", "fallback_fraction", "block_size", "page_reuse", *_COMPACTION),
    only_with={
        "fallback_fraction": _STATIC_FALLBACK,
        "block_size": _STATIC_FALLBACK,
        "page_reuse": _STATIC_FALLBACK,
        **_compaction_only_with(overflow=("reject", "truncate")),
    },
    layer_groups=True,
    description="contiguous per-request reservation (max_model_len | tokens | pNN of total length) in an arena; "
    "overflow: fallback moves a sequence that outgrows it to a paged fallback region",
)
register(
    "dynamic",
    build_dynamic,
    size=size_dynamic,
    knobs=("growth", "chunk_tokens", "placement", *_COMPACTION),
    only_with={"chunk_tokens": {"growth": ("chunk",)}, **_compaction_only_with()},
    description="one contiguous extent per sequence grown in place or by realloc-and-copy, token by token or in chunks",
)
register(
    "paged",
    build_paged,
    knobs=("block_size", "page_reuse", "prefix_caching.enabled", "prefix_caching.eviction"),
    only_with={"prefix_caching.eviction": {"prefix_caching.enabled": (True,)}},
    description="PagedAttention block pool: blocks of block_size tokens from one free pool",
    paged_layout=True,
    layer_groups=True,
)
register(
    "hybrid_tail",
    build_hybrid_tail,
    size=size_hybrid_tail,
    # length_predictor, predictor_quantile: the scheduler predicts lengths for it (LengthHints).
    knobs=(
        "long_threshold",
        "static_fraction",
        "length_predictor",
        "predictor_quantile",
        "block_size",
        "page_reuse",
        "placement",
    ),
    only_with={"predictor_quantile": {"length_predictor": ("quantile",)}},
    description="static max_model_len reservations for predicted-long requests in a partition; paged pool "
    "for the rest (a request outgrowing the threshold moves to a slot)",
    paged_layout=True,
)
register(
    "hybrid_reserve",
    build_hybrid_reserve,
    size=size_hybrid_reserve,
    # stale_after_s: the replica drops stale requests for this kind (sim/engine/cluster.py).
    knobs=(
        "reserve_fraction",
        "preempt_at_usage",
        "admit_when_free_above",
        "stale_after_s",
        "block_size",
        "page_reuse",
    ),
    description="paged pool with an emergency reserve for running sequences, a preemption threshold and an "
    "admission breaker",
    paged_layout=True,
)

if tuple(REGISTRY) != _BUILTIN:
    raise RuntimeError(
        f"built-in allocator kinds {tuple(REGISTRY)} differ from sim.config.ALLOCATOR_KINDS {_BUILTIN}: "
        "register each listed kind here, in that order"
    )
