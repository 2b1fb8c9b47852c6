"""PrefixCachingPagedAllocator: invariants under random operations with shared prefixes
(hypothesis), sharing / capping / eviction cases built by hand, the decode cohort, and a
replay of the Mooncake conversation trace's admissions.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from allocator_checks import grow_one_at_a_time
from sim.allocators import Grow, PagedAllocator
from sim.allocators.prefix_cache import PrefixCachingPagedAllocator as PC

N_EXAMPLES = 10_000
TRACE = Path(__file__).resolve().parent.parent / "scenarios" / "traces" / "mooncake_conversation_trace.jsonl"


def _snapshot(a: PC):
    return (
        a.free_blocks,
        list(a._plain),
        dict(a._cache),
        list(a._ref),
        list(a._key),
        list(a._nhits),
        a._parked(),
        {s: list(t) for s, t in a.tables.items()},
        dict(a.used),
        a.used_total,
        a.hit_blocks,
        a.queried_blocks,
        a.evictions,
        a._fresh,
    )


def _ceil(x: int, y: int) -> int:
    return -(-x // y)


N_IDS = 8
OPS = ("prefix", "prefix", "prefix", "admit", "grow", "release", "release")
# Each operation is 6 bytes of one binary draw (hypothesis' own work dominates this test: one
# draw per sequence instead of one per field cuts it several times, and bytes still shrink well):
# op; seq (3 bits) + flags (bit 0 = admit only the first half of the prompt, as a chunked
# prefill does; bit 1 = hash only part of the prompt); tokens; N_IDS hash ids of 2 bits each,
# mapped to 1 only when both bits are set, so prompts share prefixes often.
ops = st.binary(min_size=6 * 6, max_size=6 * 30)


def _decode(data: bytes):
    for i in range(0, len(data) - 5, 6):
        op, sf, t0, t1, h0, h1 = data[i : i + 6]
        v = h0 << 8 | h1
        ids = tuple(int((v >> 2 * k) & 3 == 3) for k in range(N_IDS))
        yield OPS[op % len(OPS)], sf & 7, 1 + (t0 << 8 | t1) % 120, ids, (sf >> 3) & 3


@settings(max_examples=N_EXAMPLES, deadline=None)
@given(
    ops,
    st.integers(1, 16),
    st.sampled_from([1, 4, 8, 16, 24, 50]),
    st.integers(50, 500),
    st.sampled_from(["lru", "lfu"]),
    st.sampled_from(["generation", "zero"]),
)
def test_invariants(seq_ops, block, hbt, capacity, eviction, page_reuse):
    a = PC(max(capacity, block), 100, block, page_reuse, eviction)
    B = a.block_size
    live: dict[int, tuple] = {}  # seq -> (hashes, prompt) for the oracle
    registered: set = set()  # (hash chain, j) keys registered so far (exact while nothing was evicted)
    now = 0.0

    def keys(hashes, prompt, upto):
        limit = min(prompt, len(hashes) * hbt) // B
        return {(tuple(hashes[: _ceil((j + 1) * B, hbt)]), j) for j in range(min(upto // B, limit))}

    for op, seq, tokens, ids, flags in _decode(seq_ops):
        now += 1.0
        before = _snapshot(a) if op in ("prefix", "admit", "grow") else None
        if op == "prefix" and seq not in live:
            prompt = tokens
            n_ids = min(N_IDS, _ceil(prompt, hbt)) // (2 if flags & 2 else 1)
            hashes = ids[:n_ids]
            admit = max(1, prompt // 2) if flags & 1 else prompt
            predicted = a.cached_prefix_tokens(hashes, hbt, prompt)
            no_eviction_yet = a.evictions == 0
            limit = min(prompt, len(hashes) * hbt) // B
            cap = min(limit, (admit - 1) // B)
            r, cached = a.admit_prefix(seq, admit, hashes, hbt, now, prompt_tokens=prompt)
            if r is Grow.OK:
                assert cached % B == 0 and cached <= admit - 1
                assert cached == min(predicted, cap * B)
                if no_eviction_yet:
                    oracle = 0
                    while oracle < cap and (hashes[: _ceil((oracle + 1) * B, hbt)], oracle) in registered:
                        oracle += 1
                    assert cached == oracle * B, (cached, oracle)
                live[seq] = (hashes, prompt)
                registered |= keys(hashes, prompt, admit)
            else:
                assert r is Grow.NO_SPACE and cached == 0
                assert _snapshot(a) == before, "a refused admission changed state"
        elif op == "admit" and seq not in live:
            if a.admit(seq, tokens) is Grow.OK:
                live[seq] = ((), tokens)
            else:
                assert _snapshot(a) == before, "a refused admission changed state"
        elif op == "grow" and seq in live:
            t = a.used[seq] + tokens % 40
            if a.grow(seq, t) is Grow.OK:
                registered |= keys(*live[seq], t)
            else:
                assert _snapshot(a) == before, "a refused grow changed state"
        elif op == "release" and seq in live:
            a.release(seq)
            del live[seq]
        a.check_invariants()
        assert set(a.used) == set(a.tables) == set(live)
        st_ = a.stats()
        assert st_.used_bytes <= st_.reserved_bytes <= st_.capacity_bytes
        assert st_.reserved_bytes + st_.free_bytes == st_.capacity_bytes
        assert a.free_blocks >= a.cached_free_blocks >= 0
        assert 0 <= a.hit_blocks <= a.queried_blocks
    w = a.take_work()
    assert w.zero_ops == (w.events if page_reuse == "zero" else 0)  # every block taken from the pool, no hit
    for seq in list(live):
        a.release(seq)
    a.check_invariants()
    assert a.reserved_tokens() == 0 and a.used_total == 0 and a._dup == 0
    assert a.free_blocks == a.num_blocks and a.free_tokens() == a.capacity_tokens
    assert all(r == 0 for r in a._ref)


# --- hand-built cases ----------------------------------------------------------------


def test_two_requests_share_their_prefix():
    a = PC(1024, 1, 16)  # 64 blocks
    h = (1, 2, 3, 4)  # 4 × 64 tokens
    assert a.admit_prefix(0, 200, h, 64, 0.0) == (Grow.OK, 0)
    assert a.reserved_tokens() == 13 * 16 and a.take_work().events == 13
    assert a.cached_prefix_tokens(h, 64, 200) == 192
    assert a.admit_prefix(1, 200, h, 64, 1.0) == (Grow.OK, 192)  # 12 full blocks shared
    assert a.reserved_tokens() == 14 * 16  # only the unshared tail block is new
    assert a.take_work().events == 1  # hits take nothing from the free pool
    assert a.tables[0][:12] == a.tables[1][:12] and a.tables[0][12] != a.tables[1][12]
    assert a.used_total == 200 + 8 and a.stats().used_bytes <= a.stats().reserved_bytes  # shared tokens once
    assert (a.hit_blocks, a.queried_blocks, a.hit_tokens, a.queried_tokens) == (12, 24, 192, 384)
    assert a.hit_rate == 0.5
    # A different second hash id shares only the first 64 tokens (4 blocks).
    assert a.admit_prefix(2, 200, (1, 9, 3, 4), 64, 2.0) == (Grow.OK, 64)
    a.check_invariants()
    for s in (0, 1, 2):
        a.release(s)
    a.check_invariants()
    assert a.reserved_tokens() == 0 and a.free_blocks == a.num_blocks


def test_hit_leaves_one_token_to_compute():
    a = PC(1024, 1, 16)
    h = (7, 8, 9)  # 192 tokens = 12 full blocks, all cacheable
    assert a.admit_prefix(0, 192, h, 64, 0.0) == (Grow.OK, 0)
    a.release(0)
    a.take_work()
    assert a.cached_prefix_tokens(h, 64, 192) == 176
    assert a.admit_prefix(1, 192, h, 64, 1.0) == (Grow.OK, 176)  # 11 blocks: the last one is recomputed
    assert a.take_work().events == 1
    a.release(1)
    # A longer request with the same 192-token prefix gets all 12 blocks.
    assert a.admit_prefix(2, 250, h + (5,), 64, 2.0) == (Grow.OK, 192)
    a.check_invariants()


def test_cached_block_survives_release_and_hits_later():
    a = PC(1024, 1, 16)
    h = (1, 2, 3, 4)
    a.admit_prefix(0, 200, h, 64, 0.0)
    a.release(0)
    assert a.reserved_tokens() == 0 and a.free_tokens() == a.capacity_tokens
    assert a.cached_free_blocks == 12  # the 13th (partial) block has no key
    a.take_work()
    assert a.admit_prefix(1, 200, h, 64, 5.0) == (Grow.OK, 192)
    assert a.cached_free_blocks == 0 and a.take_work().events == 1
    assert a.reserved_tokens() == 13 * 16
    a.check_invariants()


def test_plain_admit_is_paged():
    a, p = PC(400, 1, 16), PagedAllocator(400, 1, 16)
    for s, n in enumerate([30, 100, 60]):
        assert a.admit(s, n) is p.admit(s, n)
    assert a.admit(9, 200) is p.admit(9, 200) is Grow.NO_SPACE
    assert a.grow(1, 130) is p.grow(1, 130)
    a.release(0)
    p.release(0)
    assert a.free_blocks == p.free_blocks and a.used_total == p.used_total and a.cached_free_blocks == 0
    assert a.queried_blocks == 0 and a.hit_rate == 0.0
    a.check_invariants()


def test_eviction_only_after_fresh_blocks_run_out():
    a = PC(32, 1, 4)  # 8 blocks of 4 tokens
    assert a.admit_prefix(0, 8, (1, 2), 4, 0.0) == (Grow.OK, 0)  # 2 blocks, both cacheable
    a.release(0)
    assert a.cached_free_blocks == 2
    assert a.admit(1, 24) is Grow.OK  # the 6 never-used blocks
    assert a.evictions == 0 and a.cached_free_blocks == 2
    assert a.admit(2, 4) is Grow.OK  # nothing plain left: evict one
    assert a.evictions == 1 and a.cached_free_blocks == 1
    # Released tail first, so the tail block (j = 1) was the least recently used: block 0 remains.
    assert a.cached_prefix_tokens((1, 2, 3), 4, 12) == 4
    a.release(1)  # 6 plain blocks back
    assert a.admit(3, 24) is Grow.OK and a.evictions == 1  # plain blocks are reused before evicting
    assert a.free_blocks == a.cached_free_blocks == 1
    assert a.admit(4, 8) is Grow.NO_SPACE and a.refusals["insufficient_free"] == 1
    assert a.admit(4, 4) is Grow.OK and a.evictions == 2 and a.cached_free_blocks == 0
    a.check_invariants()


@pytest.mark.parametrize("eviction,survivor", [("lru", "Y"), ("lfu", "X")])
def test_lru_and_lfu_evict_different_blocks(eviction, survivor):
    """X's block is hit twice, then Y's block is used once, later. Under pressure LRU evicts X
    (older), LFU evicts Y (fewer hits)."""
    a = PC(16, 1, 4, eviction=eviction)  # 4 blocks
    X, Y = (1, 100), (2, 100)  # 5-token prompts: one cacheable block each
    t = 0.0
    for s, h in enumerate([X, X, X, Y]):
        r, cached = a.admit_prefix(s, 5, h, 4, t)
        assert r is Grow.OK and cached == (4 if s in (1, 2) else 0)
        a.release(s)
        t += 1
    assert a.cached_free_blocks == 2 and a.free_blocks == 4
    x_block, y_block = a._cache[a._trie[(0, 1)] << 40], a._cache[a._trie[(0, 2)] << 40]
    assert a._nhits[x_block] == 2 and a._nhits[y_block] == 0
    assert a.admit(9, 12) is Grow.OK and a.evictions == 1  # 1 plain + 1 never used + 1 evicted
    kept = {"X": a.cached_prefix_tokens(X, 4, 5), "Y": a.cached_prefix_tokens(Y, 4, 5)}
    assert kept == {survivor: 4, ({"X", "Y"} - {survivor}).pop(): 0}
    assert (y_block if survivor == "X" else x_block) in a.tables[9]
    a.check_invariants()


def test_time_must_not_go_backwards():
    a = PC(64, 1, 4)
    a.admit_prefix(0, 5, (1,), 4, 3.0)
    with pytest.raises(ValueError):
        a.admit_prefix(1, 5, (1,), 4, 2.0)
    with pytest.raises(ValueError):
        PC(64, 1, 4, eviction="fifo")


def test_chunked_prefill_registers_blocks_as_they_are_allocated():
    a = PC(4096, 1, 16)
    h = tuple(range(8))  # 8 × 64 = 512 tokens
    assert a.admit_prefix(0, 100, h, 64, 0.0, prompt_tokens=500) == (Grow.OK, 0)
    assert a.cached_prefix_tokens(h, 64, 500) == 96  # 6 full blocks so far
    assert a.grow(0, 300) is Grow.OK
    assert a.cached_prefix_tokens(h, 64, 500) == 288
    assert a.grow(0, 500) is Grow.OK and a.grow(0, 600) is Grow.OK  # prompt done, then decode blocks
    assert a.cached_prefix_tokens(h, 64, 500) == 496  # 31 full prompt blocks; decode blocks never cached
    assert a.cached_prefix_tokens(h, 64) == 496  # default prompt: all 512 hashed tokens
    # A chunked admission of the same prompt: cached tokens + first chunk.
    c = a.cached_prefix_tokens(h, 64, 500)
    assert a.admit_prefix(1, c + 4, h, 64, 1.0, prompt_tokens=500) == (Grow.OK, c)
    a.check_invariants()


# --- decode cohort -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 120), st.integers(0, 1)), min_size=1, max_size=10),
    st.integers(1, 16),
    st.integers(100, 1500),
    st.integers(0, 40),
    st.integers(1, 100),
    st.sampled_from(["lru", "lfu"]),
    st.integers(0, 4),
)
def test_cohort_equals_per_sequence_growth(reqs, block, capacity, G, steps, eviction, n_released):
    """Granting k cohort iterations = growing each member by one token k times, evictions included."""
    a, b = PC(capacity, 10, block, eviction=eviction), PC(capacity, 10, block, eviction=eviction)
    seqs = []
    for i, (n, g) in enumerate(reqs):
        h = (g, i % 2, i)
        ra, ca = a.admit_prefix(i, n, h, 8, 0.0)
        rb, cb = b.admit_prefix(i, n, h, 8, 0.0)
        assert (ra, ca) == (rb, cb)
        if ra is Grow.OK:
            seqs.append(i)
    for s in seqs[:n_released]:  # leave cached-free blocks to evict
        a.release(s)
        b.release(s)
    seqs = seqs[n_released:]
    for s in seqs:
        a.cohort.join(s, a.used[s], G)
    a.check_invariants()
    k = a.cohort.grantable_steps(G, steps)
    ref_k, ref_reserved = grow_one_at_a_time(b, seqs, steps)
    assert k == ref_k
    if k:
        reserved, used, events = a.cohort.preview(G, k)
        assert list(reserved) == ref_reserved
        a.cohort.advance(G, k)
        a.check_invariants()
    assert a.free_blocks == b.free_blocks and a.used_total == b.used_total and a.evictions == b.evictions
    assert set(a._cache) == set(b._cache) and a.cached_free_blocks == b.cached_free_blocks
    assert a.take_work().events == b.take_work().events
    for s in seqs:
        assert a.cohort.leave(s, G + k) == b.used[s]
        assert len(a.tables[s]) == len(b.tables[s])
    assert not a.cohort.spare
    a.check_invariants()
    for s in seqs:
        a.release(s)
    a.check_invariants()
    assert a.reserved_tokens() == 0 and a.free_blocks == a.num_blocks


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=12),
    st.integers(1, 32),
    st.integers(100, 4000),
    st.integers(1, 80),
)
def test_decode_window_matches_paged(lengths, block, capacity, max_steps):
    a, p = PC(capacity, 10, block), PagedAllocator(capacity, 10, block)
    seqs = [i for i, n in enumerate(lengths) if a.admit(i, n) is Grow.OK and p.admit(i, n) is Grow.OK]
    if not seqs:
        return
    tokens_now = np.array([a.used[s] for s in seqs], dtype=np.int64)
    pa, pp = a.decode_plan(seqs, tokens_now, max_steps), p.decode_plan(seqs, tokens_now, max_steps)
    assert pa.steps == pp.steps and list(pa.reserved_tokens) == list(pp.reserved_tokens)
    assert list(pa.used_tokens) == list(pp.used_tokens) and list(pa.events) == list(pp.events)
    a.advance_decode(seqs, tokens_now + pa.steps - 1)
    p.advance_decode(seqs, tokens_now + pp.steps - 1)
    assert a.free_blocks == p.free_blocks and a.used_total == p.used_total
    a.check_invariants()


# --- the Mooncake conversation trace -----------------------------------------------


@pytest.fixture(scope="module")
def mooncake():
    return [json.loads(line) for line in TRACE.read_text().splitlines()]


def _replay(rows, capacity, block, eviction):
    a = PC(capacity, 1, block, eviction=eviction)
    for i, r in enumerate(rows):
        g, _ = a.admit_prefix(i, r["input_length"], r["hash_ids"], 512, r["timestamp"] / 1000)
        assert g is Grow.OK
        a.release(i)
    return a


def _ceiling(rows, block):
    """Hits possible with an unbounded cache: the leading hash ids seen before, in whole
    ``block``-token blocks of the prompt, leaving one token to compute."""
    seen, hit, queried = set(), 0, 0
    for r in rows:
        h, n = r["hash_ids"], r["input_length"]
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        limit = n // block
        queried += limit
        hit += min(limit, k * 512 // block, (n - 1) // block)
        seen.update(h)
    return hit, queried


def test_mooncake_hash_block_ceiling(mooncake):
    seen = set()
    repeats = total = 0
    for r in mooncake:
        repeats += sum(h in seen for h in r["hash_ids"])
        total += len(r["hash_ids"])
        seen.update(r["hash_ids"])
    assert len(mooncake) == 12_031 and round(repeats / total, 3) == 0.366


# Block size 128 keeps the replay of all 12,031 requests (145 M prompt tokens) to ~1 M blocks;
# at vLLM's 16 the same run takes ~15 s and ~1.5 GB (see the module docs for its numbers).
BLOCK = 128


def test_mooncake_unbounded_cache_reaches_the_ceiling(mooncake):
    a = _replay(mooncake, 10**9, BLOCK, "lru")
    hit, queried = _ceiling(mooncake, BLOCK)
    assert (a.hit_blocks, a.queried_blocks) == (hit, queried)  # every possible hit, nothing more
    assert a.evictions == 0
    # In whole blocks the rate is a little above the 36.6% of hash ids: the never-repeated
    # last hash block of a prompt is usually partial, so it weighs less in tokens.
    assert abs(a.hit_rate - 0.366) < 0.015
    assert a.hit_rate <= hit / queried


def test_mooncake_small_cache_lru_vs_lfu(mooncake):
    """An 8 M-token cache (5.5% of the trace's prompt tokens): LRU keeps the conversations in
    progress; LFU keeps the blocks that were hit most, long after their conversations ended,
    and evicts each new turn's blocks (0 hits) first. The block size barely matters here
    (LRU vs LFU: 26.8% vs 18.1% at 16, 27.0% vs 18.2% at 128, 27.7% vs 18.5% at 512), so the
    test uses 512 (hash-block granularity), the fastest."""
    rates = {ev: _replay(mooncake, 8_000_000, 512, ev).hit_rate for ev in ("lru", "lfu")}
    print("mooncake hit rate, 8 M-token cache, block 512:", rates)
    hit, queried = _ceiling(mooncake, 512)
    assert all(0 < r < hit / queried for r in rates.values())
    assert rates["lru"] > rates["lfu"] + 0.05
