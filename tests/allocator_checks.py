"""Checks shared by the allocator property tests (paged, contiguous, prefix caching)."""

from sim.allocators import Grow


def check_after_op(a, live: set[int], check_layout) -> None:
    """Invariants after any operation: accounting identities, live sequences, slot layout, stats."""
    a.check_invariants()
    assert set(a.used) == live
    check_layout(a)
    st_ = a.stats()
    assert st_.used_bytes <= st_.reserved_bytes <= st_.capacity_bytes
    assert st_.reserved_bytes + st_.free_bytes == st_.capacity_bytes


def release_all(a, live: set[int]) -> None:
    """Release every live sequence: the allocator must hold nothing afterwards."""
    for seq in list(live):
        a.release(seq)
    a.check_invariants()
    assert a.reserved_tokens() == 0 and a.used_total == 0


def grow_one_at_a_time(b, seqs: list[int], steps: int) -> tuple[int, list[int]]:
    """Reference for cohort growth on block pool ``b``: each iteration grows every sequence by one
    token, per sequence, and is granted only whole. Returns (iterations granted, reserved tokens
    after each)."""
    k, reserved = 0, []
    for _ in range(steps):
        need = sum(-(-(b.used[s] + 1) // b.block_size) - b._held_blocks(s) for s in seqs)
        if need > b.free_blocks:  # a partial iteration is not granted
            break
        for s in seqs:
            assert b.grow(s, b.used[s] + 1) is Grow.OK
        k += 1
        reserved.append(b.reserved_tokens())
    return k, reserved


def step_decode(b, seqs: list[int], tokens_now, max_steps: int) -> tuple[int, list[int], list[int], list[int]]:
    """Reference for ``decode_plan``: grow every sequence of ``b`` one token per iteration from
    ``tokens_now`` until a refusal or ``max_steps``. Returns (iterations granted, reserved and used
    slots during each, allocation events of each after the first)."""
    steps, reserved, used, events = 0, [], [], []
    for j in range(max_steps):
        if j > 0 and any(b.grow(s, int(t) + j) is not Grow.OK for s, t in zip(seqs, tokens_now)):
            break
        steps += 1
        reserved.append(b.reserved_tokens())
        used.append(b.used_total)
        events.append(b.take_work().events if j > 0 else 0)
    return steps, reserved, used, events
