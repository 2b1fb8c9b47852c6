"""A block pool with automatic prefix caching (vLLM-style), with real block identities.

Requests carry their prefix identity as ``hashes``: one id per ``hash_block_tokens``
tokens of the prompt (512 for the Mooncake trace), equal ids meaning equal
content given an equal prefix. Paged block ``j`` (tokens ``[jB, (j+1)B)``) of a
prompt is *cacheable* when it is full and lies entirely within the hashed part
of the prompt (``(j+1)·B ≤ min(prompt, len(hashes)·hash_block_tokens)``); its key
is the chain of hash ids covering tokens ``[0, (j+1)·B)`` together with ``j``, so
equal keys ⇔ equal token prefix. Chains are interned in a trie (``(parent,
hash id) → node``), so keys are exact: no hash collisions.

Every block is in exactly one state:

* **owned**: ``ref ≥ 1``, listed in the block tables of ``ref`` live sequences
  (a cache hit adds a holder instead of a copy);
* **cached-free** (evictable): ``ref == 0`` but it still holds a cached prefix
  under its key; it counts as free capacity, a later request with that prefix
  takes it back for free, and it is evicted (key dropped) only when no plain
  free block is left;
* **plain free**: no key; reused first.

Eviction order among cached-free blocks: ``lru`` = least recently touched first
(a block is touched when its last holder releases it; a sequence releases its
blocks tail first, so the tail of a prompt, least likely to be shared, goes
first, as in vLLM); ``lfu`` = fewest hits since the block got its key, ties by
LRU. Evicting a block in the middle of a cached chain makes the blocks after it
unreachable until they are evicted in turn (as in vLLM).

Approximations, stated:

* A block is registered under its key when it is *allocated* for a full
  prompt block (at admission, or by a later ``grow`` of a chunked prefill),
  not when its K/V has been computed: a request admitted in the same
  iteration as, or while, another request prefills the same prefix already
  hits it.
* Blocks holding generated tokens are never cached (``hashes`` only cover
  the prompt), so a request preempted by recompute finds its prompt, not its
  output, when it comes back.
* When the key of a newly allocated block is already cached (the block the
  one-token cap gave up, or blocks past a hole in a chain) the existing entry
  is kept and the new block stays uncached.

Accounting. ``used[seq]`` is the tokens ``seq`` holds; shared blocks are
counted once in ``used_total`` (a shared block is always full, so
``used_total = Σ used − B·Σ(ref − 1)``), which keeps ``used ≤ reserved``.
``reserved`` = blocks owned by live sequences × B (a shared block once); free =
plain free + cached-free blocks. Hits and misses are counted in blocks and
tokens over every cacheable block of every admitted prompt (a refused
admission counts nothing); a block found in the cache but given up by the
one-token cap is a miss.

Decode growth goes through :class:`PrefixCachingCohort` (a :class:`PagedCohort`
whose bulk ``advance`` takes real blocks: plain free first, then evictions in
policy order, parked in a spare list that members draw from when they leave).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from itertools import chain

import numpy as np

from sim.allocators.base import INSUFFICIENT_FREE, Grow
from sim.allocators.cohort import Cohort
from sim.allocators.paged import PagedAllocator, PagedCohort

EVICTIONS = ("lru", "lfu")

# A block key is ``node * _K + j``: trie node of the hash chain, block index (exact while j < 2**40).
_K = 1 << 40


class PrefixCachingPagedAllocator(PagedAllocator):
    def __init__(
        self,
        capacity_tokens: int,
        kv_bytes_per_token: int,
        block_size: int = 16,
        page_reuse: str = "generation",
        eviction: str = "lru",
    ):
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, not {eviction!r}")
        super().__init__(capacity_tokens, kv_bytes_per_token, block_size, page_reuse)
        # Block counts per sequence are replaced by real block tables; the base class's dict stays
        # empty (a compiled base class cannot lose the attribute; check_invariants holds it empty).
        self.blocks.clear()
        self.eviction = eviction
        #: seq -> its block ids, in token order (cohort members keep theirs).
        self.tables: dict[int, list[int]] = {}
        # Per-block state for blocks [0, _fresh); blocks [_fresh, num_blocks) were never handed out.
        self._ref: list[int] = []
        self._key: list[int | None] = []
        self._nhits: list[int] = []
        self._fresh = 0
        #: Plain free blocks (no key), reused first.
        self._plain: list[int] = []
        #: key -> block holding that prefix (owned or cached-free).
        self._cache: dict[int, int] = {}
        #: (parent node, hash id) -> node; node 0 is the empty prefix.
        self._trie: dict[tuple[int, Hashable], int] = {}
        self._nodes = 1
        # Cached-free blocks. LRU: one queue in order of last touch. LFU: one such queue per hit
        # count (so ties go by LRU), the smallest non-empty count cached in _lfu_min (None = unknown).
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._lfu: dict[int, OrderedDict[int, None]] = {}
        self._lfu_min: int | None = None
        self._lfu_n = 0
        #: Simulated time of the latest admission. Times never decrease, so the order in which
        #: blocks are last touched (released by their last holder) is their LRU order.
        self.now = 0.0
        #: seq -> [bases, hash_block_tokens, cacheable blocks, next block to register] while a
        #: chunked prompt still has cacheable blocks to allocate.
        self._pending: dict[int, list] = {}
        #: B · Σ (ref − 1) over owned blocks: tokens in Σ used counted more than once.
        self._dup = 0
        # Counters.
        self.hit_blocks = 0
        self.queried_blocks = 0
        self.evictions = 0
        self.cohort = PrefixCachingCohort(self)

    # --- counters ------------------------------------------------------------------
    @property
    def hit_tokens(self) -> int:
        return self.hit_blocks * self.block_size

    @property
    def queried_tokens(self) -> int:
        return self.queried_blocks * self.block_size

    @property
    def hit_rate(self) -> float:
        """Hit blocks ÷ cacheable blocks queried (0 before any query)."""
        return self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0

    @property
    def cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (evictable)."""
        return len(self._lru) if self.eviction == "lru" else self._lfu_n

    # --- the cached-free pool ------------------------------------------------------
    def _park_all(self, blocks: list[int]) -> None:
        """``blocks`` (ref just reached 0, keyed), oldest first, become cached-free."""
        if self.eviction == "lru":
            self._lru.update(dict.fromkeys(blocks))
            return
        buckets, nhits = self._lfu, self._nhits
        for b in blocks:
            c = nhits[b]
            bucket = buckets.get(c)
            if bucket is None:
                bucket = buckets[c] = OrderedDict()
                if self._lfu_min is not None and c < self._lfu_min:
                    self._lfu_min = c
            bucket[b] = None
        self._lfu_n += len(blocks)

    def _unpark(self, b: int) -> None:
        """A hit takes cached-free ``b`` back."""
        if self.eviction == "lru":
            del self._lru[b]
            return
        c = self._nhits[b]
        bucket = self._lfu[c]
        del bucket[b]
        if not bucket:
            del self._lfu[c]
            if c == self._lfu_min:
                self._lfu_min = None
        self._lfu_n -= 1

    def _victim(self) -> int:
        if self.eviction == "lru":
            return self._lru.popitem(last=False)[0]
        buckets = self._lfu
        c = self._lfu_min
        if c is None or c not in buckets:
            c = self._lfu_min = min(buckets)
        bucket = buckets[c]
        b = bucket.popitem(last=False)[0]
        if not bucket:
            del buckets[c]
            self._lfu_min = None
        self._lfu_n -= 1
        return b

    def _parked(self) -> list[int]:
        """Cached-free blocks in eviction order (for checks and tests)."""
        if self.eviction == "lru":
            return list(self._lru)
        return [b for c in sorted(self._lfu) for b in self._lfu[c]]

    def _take(self, n: int) -> list[int]:
        """``n`` blocks out of the free pool (plain free, never used, then evicted), ref 1, work recorded."""
        if n <= 0:
            return []
        assert n <= self.free_blocks, "took more blocks than are free"
        ref = self._ref
        plain = self._plain
        k = min(n, len(plain))
        out = plain[len(plain) - k :]
        del plain[len(plain) - k :]
        for b in out:
            ref[b] = 1
        r = n - k
        if r:
            f = min(r, self.num_blocks - self._fresh)
            if f:
                s = self._fresh
                out.extend(range(s, s + f))
                ref.extend([1] * f)
                self._key.extend([None] * f)
                self._nhits.extend([0] * f)
                self._fresh = s + f
                r -= f
            if r:
                key, nhits, cache = self._key, self._nhits, self._cache
                for _ in range(r):
                    b = self._victim()
                    old = key[b]
                    assert old is not None  # a victim is a cached-free block, which has a key
                    del cache[old]
                    key[b] = None
                    nhits[b] = 0
                    ref[b] = 1
                    out.append(b)
                self.evictions += r
        self.free_blocks -= n
        self._took(n)
        return out

    # --- prefix keys ----------------------------------------------------------------
    def _lookup(self, hashes: Sequence[Hashable], hbt: int, cap: int) -> list[int]:
        """The cached blocks of the longest cached run from block 0, at most ``cap``. Read-only."""
        hits: list[int] = []
        B = self.block_size
        trie, cache = self._trie, self._cache
        node, j, m = 0, 0, 0
        while j < cap:
            child = trie.get((node, hashes[m]))
            if child is None:
                break
            node = child
            base = node * _K
            hi = min(cap, ((m + 1) * hbt) // B)  # blocks ending inside hash block m
            while j < hi:
                b = cache.get(base + j)
                if b is None:
                    return hits
                hits.append(b)
                j += 1
            m += 1
        return hits

    def _bases(self, hashes: Sequence[Hashable], hbt: int, blocks: int) -> list[int]:
        """Key bases (trie node × _K) of the hash blocks covering the first ``blocks`` paged blocks; interns the chain."""
        trie = self._trie
        out = []
        node = 0
        for m in range(-(-(blocks * self.block_size) // hbt)):
            k = (node, hashes[m])
            child = trie.get(k)
            if child is None:
                child = trie[k] = self._nodes
                self._nodes += 1
            node = child
            out.append(node * _K)
        return out

    def _register(self, seq: int, table: list[int], p: list, tokens: int) -> None:
        """Give the full, cacheable blocks of ``seq`` below ``tokens`` their keys."""
        bases, hbt, limit, nxt = p
        B = self.block_size
        hi = min(tokens // B, limit)
        cache, key = self._cache, self._key
        j = nxt
        while j < hi:
            m = ((j + 1) * B - 1) // hbt  # the hash block block j ends in
            end = min(hi, ((m + 1) * hbt) // B)
            base = bases[m]
            new = {k: b for k, b in zip(range(base + j, base + end), table[j:end]) if k not in cache}
            cache.update(new)
            for k, b in new.items():
                key[b] = k
            j = end
        if hi >= limit:
            self._pending.pop(seq, None)
        else:
            p[3] = max(nxt, hi)
            self._pending[seq] = p

    def _limit(self, hashes: Sequence[Hashable], hbt: int, prompt: int) -> int:
        """Cacheable blocks of a prompt: full and inside its hashed part."""
        if hbt <= 0:
            raise ValueError("hash_block_tokens must be positive")
        return min(prompt, len(hashes) * hbt) // self.block_size

    def cached_prefix_tokens(
        self,
        hashes: Sequence[Hashable],
        hash_block_tokens: int,
        prompt_tokens: int | None = None,
        *,
        tokens: int | None = None,
    ) -> int:
        """Prompt tokens a request with these hashes would find cached now (read-only).

        ``prompt_tokens`` defaults to ``len(hashes) · hash_block_tokens``; ``tokens``
        (default the prompt) are all the tokens the request will hold once admitted,
        prompt and generated ones for a preempted request that is recomputed. The hit
        leaves at least one of ``tokens`` to compute, as :meth:`admit_prefix` does with
        the same ``tokens``: a resumed request whose prompt is a whole number of blocks
        may reuse all of them, since its last generated token is the one computed.
        """
        prompt = len(hashes) * hash_block_tokens if prompt_tokens is None else prompt_tokens
        held = prompt if tokens is None else tokens
        cap = min(self._limit(hashes, hash_block_tokens, prompt), max(0, (held - 1) // self.block_size))
        return len(self._lookup(hashes, hash_block_tokens, cap)) * self.block_size

    def blocks_before_evicting(
        self, hashes: Sequence[Hashable], hash_block_tokens: int, prompt_tokens: int, tokens: int, within: int
    ) -> tuple[int, int] | None:
        """Blocks :meth:`_take` hands out before it evicts a cached-free block of the prefix a
        request with these hashes finds cached now, with the tokens it finds cached
        (:meth:`cached_prefix_tokens` with the same arguments): that prefix stays cached while no
        more blocks are taken and is cut short by the next one. ``None`` when none of its blocks is
        cached-free, or more than ``within`` blocks would be handed out first (the scan of the
        eviction order stops there). Read-only."""
        # Plain free blocks and never-used ones go first, then cached-free ones in eviction order.
        i = len(self._plain) + self.num_blocks - self._fresh
        if i > within:
            return None
        cap = min(self._limit(hashes, hash_block_tokens, prompt_tokens), max(0, (tokens - 1) // self.block_size))
        hits = self._lookup(hashes, hash_block_tokens, cap)
        ref = self._ref
        parked = {b for b in hits if ref[b] == 0}
        if not parked:
            return None
        if self.eviction == "lru":
            order: Iterable[int] = self._lru
        else:
            order = chain.from_iterable(self._lfu[c] for c in sorted(self._lfu))
        for b in order:
            if b in parked:
                return len(hits) * self.block_size, i
            i += 1
            if i > within:
                return None
        raise AssertionError("a cached-free block of the prefix is not in the eviction order")

    # --- the interface ----------------------------------------------------------------
    def admit_prefix(
        self,
        seq: int,
        tokens: int,
        hashes: Sequence[Hashable],
        hash_block_tokens: int,
        now: float | None = None,
        *,
        prompt_tokens: int | None = None,
    ) -> tuple[Grow, int]:
        """Admit ``seq`` holding ``tokens`` slots, sharing the longest cached run of its prefix.

        ``hashes`` identify the prompt's ``hash_block_tokens``-token blocks;
        ``prompt_tokens`` (default ``tokens``) is the prompt length: pass it when
        ``tokens`` is only a first prefill chunk (or more than the prompt, when a
        preempted request comes back), so that the rest of the prompt's blocks are
        registered as later ``grow`` calls allocate them. The hit is capped so that
        at least one of the ``tokens`` remains to compute. Returns ``(Grow.OK,
        cached_tokens)`` (a multiple of the block size) or ``(Grow.NO_SPACE, 0)``
        with nothing changed. ``now`` (simulated seconds, optional) must not decrease:
        LRU orders cached-free blocks by when they were last touched, i.e. by release order.
        """
        assert seq not in self.tables, f"seq {seq} admitted twice"
        if now is not None:
            if now < self.now:
                raise ValueError(f"time went backwards: {now} < {self.now}")
            self.now = now
        B = self.block_size
        prompt = tokens if prompt_tokens is None else prompt_tokens
        limit = self._limit(hashes, hash_block_tokens, prompt) if len(hashes) else 0
        cap = min(limit, max(0, (tokens - 1) // B))
        hits = self._lookup(hashes, hash_block_tokens, cap) if cap else []
        ref = self._ref
        revived = sum(1 for b in hits if ref[b] == 0)
        new = -(-tokens // B) - len(hits)
        if new > self.free_blocks - revived:
            self.refusals[INSUFFICIENT_FREE] += 1
            return Grow.NO_SPACE, 0
        nhits = self._nhits
        shared = 0
        for b in hits:
            if ref[b] == 0:
                self._unpark(b)
            else:
                shared += 1
            ref[b] += 1
            nhits[b] += 1
        self.free_blocks -= revived
        hit = len(hits)
        table = hits + self._take(new)
        self.tables[seq] = table
        self._set_used(seq, tokens)
        if shared:
            self._dup += shared * B
            self.used_total -= shared * B
        self.hit_blocks += hit
        self.queried_blocks += limit
        if limit > hit:
            bases = self._bases(hashes, hash_block_tokens, limit)
            self._register(seq, table, [bases, hash_block_tokens, limit, hit], tokens)
        return Grow.OK, hit * B

    def admit(self, seq: int, tokens: int) -> Grow:
        """Admit without a prefix identity: nothing shared, nothing cached (plain paging)."""
        return self.admit_prefix(seq, tokens, (), 1)[0]

    def grow(self, seq: int, tokens: int) -> Grow:
        table = self.tables[seq]
        extra = -(-tokens // self.block_size) - len(table)
        if extra > 0:
            if extra > self.free_blocks:
                self.refusals[INSUFFICIENT_FREE] += 1
                return Grow.NO_SPACE
            table.extend(self._take(extra))
        p = self._pending.get(seq)
        if p is not None:
            self._register(seq, table, p, tokens)
        if tokens > self.used[seq]:
            self._set_used(seq, tokens)
        return Grow.OK

    def release(self, seq: int) -> None:
        self.releases += 1
        table = self.tables.pop(seq)
        self._pending.pop(seq, None)
        ref, key, plain = self._ref, self._key, self._plain
        park: list[int] = []
        shared = 0
        for b in reversed(table):  # tail first: the least shareable blocks become the oldest
            r = ref[b] - 1
            ref[b] = r
            if r > 0:
                shared += 1
            elif r == 0:
                if key[b] is None:
                    plain.append(b)
                else:
                    park.append(b)
            else:
                raise AssertionError(f"block {b} ref count below zero")
        freed = len(table) - shared
        if park:
            self._park_all(park)
        self.free_blocks += freed
        self._drop_used(seq)
        if shared:
            self._dup -= shared * self.block_size
            self.used_total += shared * self.block_size

    def _held_blocks(self, seq: int) -> int:
        return len(self.tables[seq])

    def advance_decode(self, seqs: list[int], tokens_after: np.ndarray) -> None:
        for s, t in zip(seqs, tokens_after.tolist()):
            r = self.grow(s, t)
            assert r is Grow.OK, "decode window overdrew the block pool"

    # --- checks -------------------------------------------------------------------------
    def check_invariants(self) -> None:
        assert not self.blocks, "block counts belong to the block tables here"
        B = self.block_size
        reserved = self.reserved_tokens()
        assert 0 <= self.used_total <= reserved <= self.capacity_tokens, (
            self.used_total,
            reserved,
            self.capacity_tokens,
        )
        tables = self.tables.values()
        assert sum(map(len, map(set, tables))) == sum(map(len, tables)), "a sequence holds a block twice"
        used = self.used
        assert all(len(self.tables[s]) == -(-t // B) for s, t in used.items()), "blocks held ≠ blocks needed"
        owners = Counter(chain.from_iterable(tables))
        cohort = self.cohort
        assert isinstance(cohort, PrefixCachingCohort)
        owners.update(cohort.spare)
        n = self._fresh
        ref, key = self._ref, self._key
        assert len(ref) == len(key) == len(self._nhits) == n <= self.num_blocks
        assert not ref or min(ref) >= 0, "a ref count below zero"
        owned = {b: r for b, r in enumerate(ref) if r}
        assert owners == owned, "ref counts differ from the number of block tables holding each block"
        order = self._parked()
        parked = set(order)
        assert len(order) == len(parked) == self.cached_free_blocks
        if self.eviction == "lfu":
            assert all(self._nhits[b] == c for c, q in self._lfu.items() for b in q) and all(self._lfu.values())
            assert self._lfu_min is None or self._lfu_min == min(self._lfu)
        plain = set(self._plain)
        assert len(plain) == len(self._plain), "a block is in the plain free list twice"
        # Every block handed out is exactly one of owned, cached-free, plain free.
        assert len(owned) + len(parked) + len(plain) == n == len(parked | plain | owned.keys())
        keyed = {k: b for b, k in enumerate(key) if k is not None}
        assert keyed == self._cache and len(keyed) == n - key.count(None), "the cache map and the blocks' keys disagree"
        assert all(key[b] is not None for b in parked), "a cached-free block has no key"
        assert all(key[b] is None for b in plain), "a plain free block has a key"
        dup = (sum(ref) - len(owned)) * B
        assert self.free_blocks == len(plain) + len(parked) + (self.num_blocks - n)
        assert reserved == (n - len(plain) - len(parked)) * B
        assert dup == self._dup
        if cohort.n == 0:
            assert self.used_total == sum(self.used.values()) - dup
        assert set(self._pending) <= set(self.tables)
        assert self.largest_free_extent_tokens() <= self.capacity_tokens - reserved


class PrefixCachingCohort(PagedCohort):
    """:class:`PagedCohort` over real blocks. ``advance`` takes its ``n`` new blocks at once
    (plain free, then evictions in policy order) into ``spare``; a leaving member draws the
    blocks its tokens need from there (decode blocks are private and uncached, so which
    member gets which block does not matter). Members keep their block tables."""

    pool: PrefixCachingPagedAllocator

    def __init__(self, pool: PrefixCachingPagedAllocator):
        super().__init__(pool)
        #: Blocks taken for members and not yet handed to one: Σ over members of
        #: ceil(tokens / B) − len(table).
        self.spare: list[int] = []

    def _join(self, seq: int, held_tokens: int, a: int) -> None:
        pool = self.pool
        assert len(pool.tables[seq]) == -(-held_tokens // self.B) and pool.used[seq] == held_tokens
        del pool.used[seq]  # used_total keeps counting it; the block table stays
        self.cnt[a % self.B] += 1

    def _leave(self, seq: int, a: int, tokens: int) -> None:
        self.cnt[a % self.B] -= 1
        pool = self.pool
        table = pool.tables[seq]
        k = -(-tokens // self.B) - len(table)
        if k > 0:
            spare = self.spare
            assert k <= len(spare), "cohort member left with blocks it never took"
            table.extend(spare[len(spare) - k :])
            del spare[len(spare) - k :]
        pool.used[seq] = tokens

    # The block pool's one-step shortcut would bypass the block tables ``advance`` keeps.
    advance_one = Cohort.advance_one

    def advance(self, G: int, steps: int) -> None:
        if steps <= 0:
            return
        new = self._blocks_for(G, steps)
        pool = self.pool
        assert new <= pool.free_blocks, "cohort advanced past the free pool"
        self.spare.extend(pool._take(new))
        pool.used_total += len(self.a) * steps
