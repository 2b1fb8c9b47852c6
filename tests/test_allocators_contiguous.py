"""Contiguous allocators: placement policies, dynamic growth, compaction (hypothesis).

The invariant suite of ``tests/test_allocators.py`` (used ≤ reserved ≤
capacity; every slot is free or owned by exactly one live sequence, checked by
walking the arena; release returns everything) for DynamicAllocator ×
{token, chunk} × {first_fit, best_fit, buddy} and StaticAllocator ×
{first_fit, best_fit, buddy}, with ``compact()`` as a random operation. Each
generated operation sequence runs on one dynamic and one static configuration
(both drawn), so the suite sees ``N_EXAMPLES`` sequences in all, about 1 700
per dynamic and 3 300 per static configuration: running all nine on every
sequence would take minutes on a loaded machine.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from allocator_checks import check_after_op, release_all
from sim.allocators import Grow
from sim.allocators.base import EXCEEDS_RESERVATION, INSUFFICIENT_FREE, NO_CONTIGUOUS_EXTENT
from sim.allocators.compaction import should_compact
from sim.allocators.dynamic import DynamicAllocator
from sim.allocators.paged import PagedAllocator
from sim.allocators.placement import PLACEMENTS, BuddyArena, make_arena
from sim.allocators.static import StaticAllocator

N_EXAMPLES = 10_000
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

OPS = ("admit", "grow", "grow", "release", "compact")


def _decode(codes: list[int]) -> list[tuple[str, int, int]]:
    """``(op, seq 0..7, tokens 1..300)`` from one integer each: a third of the draws of
    ``st.tuples`` (hypothesis's own cost dominates this suite); shrinks towards admit/0/1."""
    out = []
    for c in codes:
        c, t = divmod(c, 300)
        o, seq = divmod(c, 8)
        out.append((OPS[o], seq, t + 1))
    return out


ops = st.lists(st.integers(0, len(OPS) * 8 * 300 - 1), min_size=1, max_size=40).map(_decode)

DYNAMIC = [(g, p) for g in ("token", "chunk") for p in PLACEMENTS]


def _live_extents(a) -> list[tuple[int, int]]:
    if isinstance(a, DynamicAllocator):
        return [(a.extent[s], a.size[s]) for s in a.extent]
    return [(start, a.block) for start in a.extent.values()]


def _check_layout(a) -> None:
    """Live extents and free extents tile [0, capacity) exactly; buddy blocks are aligned powers of two."""
    arena = a.arena
    arena.check()
    live = _live_extents(a)
    spans = sorted(live + arena.free_extents())
    pos = 0
    for start, size in spans:
        assert start == pos, f"gap or overlap at {pos} (next span starts {start})"
        pos += size
    assert pos == a.capacity_tokens
    assert sum(n for _, n in live) == a.reserved_tokens()
    if isinstance(arena, BuddyArena):
        for start, size in live:
            assert size & (size - 1) == 0 and start % size == 0, f"block ({start}, {size}) not an aligned power of two"
        assert sorted(live) == arena.allocated_blocks(), "the arena's blocks are not the allocator's extents"
    if isinstance(a, DynamicAllocator):
        for s, n in a.size.items():
            assert a.used[s] <= n
            if not isinstance(arena, BuddyArena):
                assert n == a.extent_tokens(a.used[s]), "extent not the rounded size of what the sequence holds"


def _snapshot(a):
    ext = dict(a.extent)
    size = dict(getattr(a, "size", {}))
    w = a.work
    return ext, size, dict(a.used), a.arena.free_extents(), (w.events, w.copy_bytes)


def _compact_checked(a) -> None:
    before_used = dict(a.used)
    before_ext = dict(a.extent)
    bytes_before = a.work.copy_bytes
    moved = a.compact()
    assert a.used == before_used, "compaction changed what a sequence holds"
    assert set(a.extent) == set(before_ext)
    assert moved == sum(a.used[s] for s in a.extent if a.extent[s] != before_ext[s])
    assert a.work.copy_bytes - bytes_before == moved * a.bpt
    _check_layout(a)
    free = a.arena.free_extents()
    if isinstance(a.arena, BuddyArena):
        orders = [n for _, n in free]
        assert len(orders) == len(set(orders)), f"repacked buddy arena has two free blocks of one size: {free}"
    else:
        reserved = a.reserved_tokens()
        assert free == ([(reserved, a.capacity_tokens - reserved)] if reserved < a.capacity_tokens else [])
        assert a.largest_free_extent_tokens() == a.arena.free_total
        assert a.fragmentation() == 0.0


def _run(a, seq_ops) -> None:
    live: set[int] = set()
    for op, seq, tokens in seq_ops:
        if op == "admit" and seq not in live:
            snap = _snapshot(a)
            r = a.admit(seq, tokens)
            if r is Grow.OK:
                live.add(seq)
            else:
                assert _snapshot(a) == snap, "a refused admit changed state"
        elif op == "grow" and seq in live:
            before = a.used[seq]
            snap = _snapshot(a)
            r = a.grow(seq, before + tokens % 40)
            if r is not Grow.OK:
                assert _snapshot(a) == snap, "a refused grow changed state"
            elif isinstance(a, DynamicAllocator):
                events, copied = snap[4]
                if a.size[seq] == snap[1][seq]:  # within its extent: no work
                    assert (a.work.events, a.work.copy_bytes) == (events, copied)
                elif a.extent[seq] == snap[0][seq]:  # grown in place: one event
                    assert (a.work.events, a.work.copy_bytes) == (events + 1, copied)
                else:  # relocated: one event, the used tokens copied
                    assert (a.work.events, a.work.copy_bytes) == (events + 1, copied + before * a.bpt)
        elif op == "release" and seq in live:
            a.release(seq)
            live.discard(seq)
        elif op == "compact":
            _compact_checked(a)
        check_after_op(a, live, _check_layout)
    release_all(a, live)
    arena = a.arena
    if isinstance(arena, BuddyArena):
        # Every block merged back: the arena is its initial top-level blocks again.
        assert arena.free_extents() == arena.initial_blocks()
        assert a.largest_free_extent_tokens() == arena.max_extent
    else:
        assert a.largest_free_extent_tokens() == a.capacity_tokens


@settings(FAST, max_examples=N_EXAMPLES)
@given(
    ops,
    st.sampled_from(DYNAMIC),
    st.sampled_from(PLACEMENTS),
    st.integers(50, 3000),
    st.integers(1, 64),
    st.integers(1, 400),
)
def test_contiguous_invariants(seq_ops, dynamic, static_placement, capacity, chunk, reserve):
    """One dynamic and one static allocator (configurations drawn) on the same random operations."""
    growth, placement = dynamic
    _run(DynamicAllocator(capacity, 100, growth, chunk, placement), seq_ops)
    largest = make_arena(static_placement, capacity).max_extent
    _run(StaticAllocator(capacity, 100, min(reserve, largest), static_placement), seq_ops)


# --- placement policies ------------------------------------------------------------------


def test_first_fit_vs_best_fit():
    for placement, small in (("first_fit", 0), ("best_fit", 40)):
        a = make_arena(placement, 100)
        assert [a.allocate(n) for n in (30, 10, 10, 10, 40)] == [0, 30, 40, 50, 60]
        a.free(0, 30)
        a.free(40, 10)
        a.free(60, 40)
        assert a.free_extents() == [(0, 30), (40, 10), (60, 40)]
        assert a.allocate(8) == small  # first fit: the lowest hole; best fit: the 10-hole
        assert a.allocate(35) == 60
        assert a.allocate(101) is None


def test_best_fit_picks_smallest_lowest_on_ties():
    a = make_arena("best_fit", 100)
    starts = [a.allocate(10) for _ in range(10)]
    assert starts == list(range(0, 100, 10))
    for s in (10, 30, 60, 70):
        a.free(s, 10)  # holes: 10@10, 10@30, 20@60
    assert a.allocate(15) == 60  # the 20-hole, not a 10-hole
    assert a.allocate(10) == 10  # tie between 10@10 and 10@30: lowest address
    f = make_arena("first_fit", 100)
    for _ in range(10):
        f.allocate(10)
    for s in (10, 30, 60, 70):
        f.free(s, 10)
    assert f.allocate(5) == 10 and f.allocate(15) == 60


def test_try_extend():
    for placement in ("first_fit", "best_fit"):
        a = make_arena(placement, 100)
        x = a.allocate(10)
        y = a.allocate(10)
        assert not a.try_extend(x, 10, 11)  # y is in the way
        assert a.try_extend(y, 10, 90) and a.free_total == 0
        assert not a.try_extend(y, 90, 91)
        a.free(x, 10)
        a.free(y, 90)
        assert a.free_extents() == [(0, 100)]
    b = make_arena("buddy", 64)
    x = b.allocate(3)  # block 4 at 0
    y = b.allocate(4)  # block 4 at 4
    assert (x, y) == (0, 4)
    assert not b.try_extend(x, 3, 5)  # buddy 4@4 is taken
    assert not b.try_extend(y, 4, 8)  # 4 is not aligned to 8
    assert b.try_extend(y, 4, 4)
    b.free(y, 4)
    assert b.try_extend(x, 3, 20)  # 4 -> 32: buddies 4@4, 8@8, 16@16 all free
    assert b.free_extents() == [(32, 32)]
    b.free(x, 20)
    assert b.free_extents() == [(0, 64)]


def test_buddy_blocks_split_merge_and_report_internal_fragmentation():
    b = BuddyArena(1000)  # 512 + 256 + 128 + 64 + 32 + 8
    assert b.initial_blocks() == [(0, 512), (512, 256), (768, 128), (896, 64), (960, 32), (992, 8)]
    assert b.max_extent == 512 and b.free_total == 1000
    assert b.allocate(513) is None
    x = b.allocate(100)  # 128: the 128 top-level block, no split needed
    assert x == 768 and b.granted(100) == 128
    y = b.allocate(5)  # 8: the 8 top-level block
    assert y == 992
    z = b.allocate(9)  # 16: splits 32@960
    assert z == 960 and b.free_extents()[-1] == (976, 16)
    for s, n in ((x, 100), (y, 5), (z, 9)):
        b.free(s, n)
        b.check()
    assert b.free_extents() == b.initial_blocks()
    # Through a dynamic allocator: reserved counts whole blocks.
    d = DynamicAllocator(1024, 1, "token", placement="buddy")
    assert d.admit(0, 300) is Grow.OK and d.reserved_tokens() == 512 and d.used_total == 300
    assert d.grow(0, 512) is Grow.OK and d.work.events == 1  # inside its block: no event
    assert d.grow(0, 513) is Grow.OK and d.size[0] == 1024 and d.work.events == 2  # extended in place
    s = StaticAllocator(1024, 1, 300, placement="buddy")
    assert s.admit(0, 10) is Grow.OK and s.admit(1, 10) is Grow.OK
    assert s.reserved_tokens() == 1024 and s.admit(2, 1) is Grow.NO_SPACE
    with pytest.raises(ValueError):
        StaticAllocator(1000, 1, 600, placement="buddy")  # needs a 1024 block, largest is 512
    with pytest.raises(ValueError):
        make_arena("worst_fit", 10)


# --- dynamic growth ------------------------------------------------------------------------


def test_grow_in_place_relocate_refuse():
    a = DynamicAllocator(100, 2)
    assert a.admit(0, 10) is Grow.OK and a.admit(1, 10) is Grow.OK  # [0,10) [10,20)
    assert a.grow(1, 30) is Grow.OK and a.extent[1] == 10  # in place
    assert a.work.events == 3 and a.work.copy_bytes == 0
    assert a.grow(0, 40) is Grow.OK and a.extent[0] == 40  # relocated past seq 1
    assert a.work.events == 4 and a.work.copy_bytes == 10 * 2 and a.relocations == 1
    assert a.arena.free_extents() == [(0, 10), (80, 20)]
    # seq 1 [10,40) wants 55: neither in place (seq 0 at 40) nor elsewhere (largest 20);
    # free 30 + own 30 >= 55: stranded.
    snap = (dict(a.extent), dict(a.size), a.arena.free_extents())
    assert a.grow(1, 55) is Grow.NO_SPACE
    assert a.refusals[NO_CONTIGUOUS_EXTENT] == 1
    assert (dict(a.extent), dict(a.size), a.arena.free_extents()) == snap and a.used[1] == 30
    assert a.grow(1, 61) is Grow.NO_SPACE  # 30 + 30 < 61
    assert a.refusals[INSUFFICIENT_FREE] == 1
    assert a.admit(2, 101) is Grow.OVERFLOW and a.refusals[EXCEEDS_RESERVATION] == 1
    assert a.admit(2, 25) is Grow.NO_SPACE and a.refusals[NO_CONTIGUOUS_EXTENT] == 2
    assert a.compact() == 30 + 40  # both move down
    assert a.extent == {1: 0, 0: 30} and a.arena.free_extents() == [(70, 30)]
    assert a.work.copy_bytes == (10 + 70) * 2
    assert a.grow(0, 70) is Grow.OK and a.extent[0] == 30  # now in place


def test_chunked_growth_takes_chunk_times_fewer_events():
    events = {}
    for growth in ("token", "chunk"):
        a = DynamicAllocator(100_000, 1, growth, chunk_tokens=512)
        for s in range(4):
            assert a.admit(s, 1) is Grow.OK
        for t in range(2, 2001):
            for s in range(4):
                assert a.grow(s, t) is Grow.OK
        a.check_invariants()
        events[growth] = a.take_work().events
        assert a.reserved_tokens() == 4 * (2000 if growth == "token" else 2048)
    assert events["token"] == 4 * 2000
    assert events["chunk"] == 4 * 4  # 512, 1024, 1536, 2048
    assert events["token"] / events["chunk"] >= 100


# --- stranded memory: the article's mix -------------------------------------------------------


def test_first_fit_strands_memory_on_the_article_mix():
    """128 / 2 048 / 14 000-token sequences in a first-fit arena: after the short ones finish,
    more than 14 000 slots are free but no contiguous 14 000 exist; a paged pool would admit it,
    and compaction makes the extent."""
    cap = 32_768
    a = DynamicAllocator(cap, 1, "token", placement="first_fit")
    p = PagedAllocator(cap, 1, 16)
    seq = 0
    kinds = {}
    # Fill: 2048, 128, 2048, 128, ... (the mix's short and medium requests).
    while True:
        n = 2048 if seq % 2 == 0 else 128
        if a.admit(seq, n) is not Grow.OK:
            break
        assert p.admit(seq, n) is Grow.OK
        kinds[seq] = n
        seq += 1
    a.refusals.clear()
    # The 2048-token requests finish; the 128-token ones keep decoding.
    for s, n in kinds.items():
        if n == 2048:
            a.release(s)
            p.release(s)
    free = a.free_tokens()
    assert free >= 14_000 > a.largest_free_extent_tokens()
    assert a.admit(1000, 14_000) is Grow.NO_SPACE
    assert a.refusals[NO_CONTIGUOUS_EXTENT] == 1 and a.refusals[INSUFFICIENT_FREE] == 0
    assert a.stats().external_fragmentation > 0.5 and a.utilization() < 0.7 and a.should_compact()
    assert p.admit(1000, 14_000) is Grow.OK  # no contiguity needed
    moved = a.compact()
    assert moved == sum(n for n in kinds.values() if n == 128)  # every survivor slides down
    assert a.arena.free_extents() == [(a.reserved_tokens(), cap - a.reserved_tokens())]
    assert a.admit(1000, 14_000) is Grow.OK


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_churn_on_the_article_mix_counts_stranded_refusals(placement):
    """A deterministic churn of the mix: first fit strands memory (refusals that a pool of the same
    free slots would have granted); best fit and buddy also refuse some for contiguity."""
    rng = np.random.default_rng(7)
    a = DynamicAllocator(60_000, 1, "chunk", 512, placement=placement)
    live: list[int] = []
    for seq in range(3000):
        if live and rng.random() < 0.5:
            a.release(live.pop(int(rng.integers(len(live)))))
        n = int(rng.choice([128, 2048, 14_000], p=[0.5, 0.35, 0.15]))
        if a.admit(seq, n) is Grow.OK:
            live.append(seq)
        a.check_invariants()
    if placement == "first_fit":
        assert a.refusals[NO_CONTIGUOUS_EXTENT] > 0
    assert sum(a.refusals.values()) > 0


# --- decode windows -------------------------------------------------------------------------------


@settings(FAST, max_examples=300)
@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=12),
    st.sampled_from(DYNAMIC),
    st.integers(1, 64),
    st.integers(100, 4000),
    st.integers(1, 80),
    st.lists(st.integers(0, 11), max_size=4),
)
def test_dynamic_decode_window_equals_stepping(lengths, gp, chunk, capacity, max_steps, releases):
    growth, placement = gp

    def build():
        d = DynamicAllocator(capacity, 10, growth, chunk, placement)
        for i, n in enumerate(lengths):
            d.admit(i, n)
        for i in releases:  # holes, so that growth may relocate
            if i in d.extent:
                d.release(i)
        return d

    a, b = build(), build()
    seqs = sorted(a.extent)
    if not seqs:
        return
    tokens_now = np.array([a.used[s] for s in seqs], dtype=np.int64)
    a.take_work()
    b.take_work()
    plan = a.decode_plan(seqs, tokens_now, max_steps)
    assert plan.events is None
    # Step b one iteration at a time until an iteration needs allocator work or is refused.
    steps, reserved, used = 0, [], []
    for j in range(max_steps):
        if j > 0:
            ok = all([b.grow(s, int(t) + j) is Grow.OK for s, t in zip(seqs, tokens_now)])
            if b.take_work().any() or not ok:  # growth work or a refusal ends the window
                break
        steps += 1
        reserved.append(b.reserved_tokens())
        used.append(b.used_total)
    assert plan.steps == max(1, steps)
    assert list(plan.reserved_tokens) == reserved[: plan.steps]
    assert list(plan.used_tokens) == used[: plan.steps]
    a.advance_decode(seqs, tokens_now + plan.steps - 1)
    assert not a.take_work().any()
    c = build()
    c.take_work()
    for j in range(1, plan.steps):
        for s, t in zip(seqs, tokens_now):
            assert c.grow(s, int(t) + j) is Grow.OK
    assert not c.take_work().any()
    assert a.used == c.used and a.used_total == c.used_total and a.extent == c.extent and a.size == c.size
    a.check_invariants()


def test_should_compact_thresholds():
    assert should_compact(0.5, 0.6)
    assert not should_compact(0.8, 0.9)
    assert not should_compact(0.5, 0.4)
    a = DynamicAllocator(100, 1)
    assert a.fragmentation() == 0.0 and a.utilization() == 0.0
    a.admit(0, 100)
    assert a.fragmentation() == 0.0 and a.utilization() == 1.0


def test_static_compact_needs_per_sequence_records():
    a = StaticAllocator(100, 1, 30, placement="best_fit")
    for i in range(3):
        a.admit(i, 5 + i)
    a.release(0)
    assert a.compact() == 6 + 7 and sorted(a.extent.values()) == [0, 30]
    assert a.arena.free_extents() == [(60, 40)]
    a.cohort.join(1, 6, 0)
    with pytest.raises(AssertionError, match="cohort"):
        a.compact()
