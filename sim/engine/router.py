"""Which replica gets an arriving request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.allocators.capabilities import PrefixLookup

if TYPE_CHECKING:
    from sim.engine.replica import Replica


class Router:
    """``round_robin`` cycles; ``least_outstanding`` picks the fewest running + waiting (lowest index
    on ties); ``prefix_affinity`` (KV-cache-aware routing) picks the replica holding most of the
    request's prefix in its cache, falling back to least outstanding; ``length_split`` sends a
    prompt of at least ``split[0]`` tokens to the last ``split[1]`` replicas and any other to the
    rest, least outstanding within the pool."""

    def __init__(
        self, policy: str, replicas: list[Replica], hash_block_tokens: int = 512, split: tuple[int, int] = (0, 0)
    ):
        self.policy = policy
        self.replicas = replicas
        self.hash_block_tokens = hash_block_tokens
        self._next = 0
        #: ``length_split``: the prompt length (tokens) from which a request is long, and the index of
        #: the first replica of the long pool (the pools are ``[0, first)`` and ``[first, n)``).
        self.long_prompt_tokens = split[0]
        self.long_first = len(replicas) - split[1]
        #: Running + waiting requests per replica, kept by the replicas themselves (``Replica.loads``):
        #: reading them here costs one C call per arrival instead of a scan over every replica.
        self.loads = [r.outstanding() for r in replicas]
        for r in replicas:
            r.loads = self.loads
        #: Each replica's allocator as a prefix lookup (``None``: it caches no prefixes).
        self._lookups: list[PrefixLookup | None] = [
            r.alloc if isinstance(r.alloc, PrefixLookup) else None for r in replicas
        ]

    def pick(self, req=None) -> Replica:
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        if self.policy == "prefix_affinity" and req is not None and req.hashes:
            hits = [
                lk.cached_prefix_tokens(req.hashes, self.hash_block_tokens, req.prompt) if lk is not None else 0
                for lk in self._lookups
            ]
            best = max(hits)
            if best > 0:
                return min((r for r, h in zip(reps, hits) if h == best), key=lambda r: r.outstanding())
        if self.policy == "round_robin":
            r = reps[self._next]
            self._next = (self._next + 1) % len(reps)
            return r
        loads = self.loads  # lowest index on ties
        if self.policy == "length_split" and req is not None:
            lo, hi = (self.long_first, len(reps)) if req.prompt >= self.long_prompt_tokens else (0, self.long_first)
            pool = loads[lo:hi]
            return reps[lo + pool.index(min(pool))]
        return reps[loads.index(min(loads))]
