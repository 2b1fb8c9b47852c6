"""The fast ProfileCostModel (scalar paths, caches) prices every batch exactly as the plain
evaluation does.

``ReferenceProfileCostModel`` (``bench/costmodel_reference.py``) evaluates a profile's curves the
plain way (numpy on 1-element arrays, no per-argument caches). Both are built from the same
profile, model and layout, so any difference is the fast code's.
"""

import random
import zlib

import numpy as np
import pytest

from bench.costmodel_reference import ReferenceProfileCostModel, reference_curve, reference_grid
from sim.catalog import get_gpu, get_model
from sim.cost.model import BatchShape, Layout
from sim.cost.profile import load_profile
from sim.cost.profile_model import ProfileCostModel

REL = 1e-12


# --- comparisons ----------------------------------------------------------------------------

CASES = [  # (profile, model, gpu, tp, layout)
    ("h100-sxm", "llama-3.1-8b", "H100-SXM-80GB", 1, Layout(paged=True, block_size=16)),
    ("h100-sxm", "llama-3.1-8b", "H100-SXM-80GB", 1, Layout(paged=False)),
    ("a100-sxm", "llama-2-70b", "A100-SXM-80GB", 2, Layout(paged=True, block_size=16)),
    ("h200-sxm", "llama-3.1-70b", "H200-SXM-141GB", 8, Layout(paged=True, block_size=32)),
    ("cpu-reference", "tiny-llama", "cpu", 1, Layout(paged=True, block_size=16)),
]


def _pair(case):
    prof, model, gpu, tp, layout = case
    p = load_profile(prof)
    args = (p, get_model(model), get_gpu(gpu))
    kw = {"tensor_parallel": tp, "layout": layout}
    return ProfileCostModel(*args, **kw), ReferenceProfileCostModel(*args, **kw)


def _close(a, b):
    return abs(a - b) <= REL * max(abs(a), abs(b))


def _batch(rng: random.Random) -> BatchShape:
    """Random shapes, many of them beyond the measured grids (huge batches, KV, chunks)."""
    big = rng.random() < 0.1
    d = rng.choice([0, 0, 1, 2, rng.randint(1, 64), rng.randint(1, 512), rng.randint(500, 5000) if big else 3])
    per = rng.choice([1, rng.randint(1, 300), rng.randint(1, 20_000), rng.randint(10_000, 400_000) if big else 9])
    kv = d * per + (rng.randint(0, d) if d else 0)
    m = rng.choice([0, 0, 1, 1, 2, 3, rng.randint(1, 7), rng.randint(8, 24)])
    chunks = [
        (
            rng.choice([1, rng.randint(1, 512), rng.randint(1, 8192), rng.randint(8192, 70_000) if big else 17]),
            rng.choice([0, 0, rng.randint(0, 4096), rng.randint(0, 200_000) if big else 5]),
        )
        for _ in range(m)
    ]
    return BatchShape(prefill_chunks=chunks, decode_seqs=d, decode_kv_tokens=kv)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-tp{c[3]}-{'paged' if c[4].paged else 'contig'}")
def test_step_times_equal_the_old_evaluation(case):
    new, old = _pair(case)
    rng = random.Random(zlib.crc32((case[0] + case[1]).encode()))
    worst = 0.0
    for _ in range(1500):
        b = _batch(rng)
        # Repeat some shapes: cache hits must price (and count) exactly like misses.
        for _ in range(1 + (rng.random() < 0.3)):
            a, r = new.step_time_s(b), old.step_time_s(b)
            assert _close(a, r), (b, a, r)
            worst = max(worst, abs(a - r) / max(abs(r), 1e-300))
    assert new.out_of_range == old.out_of_range
    assert list(new.out_of_range) == list(old.out_of_range)  # first-seen order too
    assert worst <= REL


def _random_windows(seed: int, count: int = 800):
    """``(n, first KV total, k, kv array)`` of random decode windows, many beyond the grids."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.choice([1, 2, rng.integers(1, 64), rng.integers(1, 600), rng.integers(600, 6000)]))
        k = int(rng.choice([1, 2, 3, rng.integers(1, 17), rng.integers(17, 300)]))
        start = int(n * rng.choice([1, rng.integers(1, 4000), rng.integers(1, 300_000)]))
        yield n, start, k, start + n * np.arange(k, dtype=np.float64)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: f"{c[0]}-{c[1]}-tp{c[3]}")
def test_decode_windows_equal_the_old_evaluation(case):
    new, old = _pair(case)
    for n, _, _, kv in _random_windows(7):
        a, r = new.decode_times_s(n, kv), old.decode_times_s(n, kv)
        assert a.shape == r.shape and a.dtype == np.float64
        np.testing.assert_allclose(a, r, rtol=REL, atol=0)
    assert new.out_of_range == old.out_of_range
    assert new.decode_times_s(0, np.array([1.0, 2.0])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: f"{c[0]}-{c[1]}-tp{c[3]}")
def test_decode_window_lists_equal_the_old_evaluation(case):
    """The engine's list paths (``decode_times_list`` on KV totals, ``decode_window_times`` from
    the first one: ``Grid2D.at_many``, pow form inside a grid segment) price and count like the
    old array evaluation."""
    new, old = _pair(case)
    for n, start, k, kv in _random_windows(8):
        r = old.decode_times_s(n, kv)
        for a in (new.decode_times_list(n, kv.tolist()), new.decode_window_times(n, start, k)):
            assert isinstance(a, list) and len(a) == k
            np.testing.assert_allclose(a, r, rtol=REL, atol=0)
        old.decode_times_s(n, kv)  # the new model priced the window twice: count it twice here too
    assert new.out_of_range == old.out_of_range


def test_grid_at_many_matches_at_across_segments_and_edges():
    p = load_profile("h100-sxm")
    for g in [p.curve("generation_attention", k) for k in p.curve_keys("generation_attention")[:3]]:
        for b in [0.5, 1, 3, float(g.batch[-1]), float(g.batch[-1]) * 3]:
            ls = sorted(
                np.concatenate([g.length, g.length * 1.01, g.length * 0.999, [0.1, 1e-20, g.length[-1] * 5]]).tolist()
            )
            many, oor = g.at_many(b, ls)
            one = [g.at(b, x) for x in ls]
            assert all(_close(t, u) for t, (u, _) in zip(many, one))
            assert oor == sum(o for _, o in one)
            # Unsorted input re-brackets and still agrees.
            rev = g.at_many(b, ls[::-1])[0]
            assert all(_close(t, u) for t, u in zip(rev, many[::-1]))


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: f"{c[0]}-{c[1]}-tp{c[3]}")
def test_single_decode_equals_step_time_exactly(case):
    new, _ = _pair(case)
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.choice([1, rng.randint(1, 64), rng.randint(1, 1024), rng.randint(1000, 9000)])
        s = n * rng.choice([1, rng.randint(1, 5000), rng.randint(1, 400_000)]) + rng.randint(0, n)
        one = new.decode_times_s(n, np.array([s], dtype=np.float64))[0]
        assert one == new.step_time_s(BatchShape(decode_seqs=n, decode_kv_tokens=s))
        # Short (scalar) and long (vectorised) windows price an iteration alike.
        long = new.decode_times_s(n, np.full(40, float(s)))
        assert _close(long[17], one)


def test_memory_curves_equal_the_old_evaluation():
    new, old = _pair(CASES[4])  # the measured device profile carries memory size curves
    assert new._mem_curves, "cpu-reference has memory curves"
    for nbytes in [1, 100, 4096, 1 << 20, 3 << 27, 1 << 34, 1 << 40]:
        for f in ("copy_time_s", "zero_fill_time_s", "host_transfer_time_s"):
            assert _close(getattr(new, f)(nbytes), getattr(old, f)(nbytes))
    assert new.out_of_range == old.out_of_range


def test_curve_scalar_lookup_matches_arrays():
    p = load_profile("h100-sxm")
    rng = np.random.default_rng(3)
    for c in [p.curve("gemm", k) for k in p.curve_keys("gemm")[:6]] + list(p.allreduce.values()):
        xs = np.concatenate(
            [c.x, c.x * 1.0000001, c.x * 0.9999, rng.uniform(c.x[0] * 0.5, c.x[-1] * 2, 200), [1e-20, 0.0]]
        )
        for x in xs:
            t, oor = c.at(float(x))
            rt, roor = reference_curve(c, np.array([x]))
            assert _close(t, float(rt[0])) and oor == roor
    for g in [p.curve("generation_attention", k) for k in p.curve_keys("generation_attention")[:3]] + [
        p.curve("context_attention", k) for k in p.curve_keys("context_attention")[:3]
    ]:
        for b in [0.5, 1, 3, g.batch[-1], g.batch[-1] * 3]:
            ls = np.concatenate([g.length, g.length * 1.01, [0.1, g.length[-1] * 5]])
            for x in ls:
                t, oor = g.at(b, float(x))
                rt, roor = reference_grid(g, b, np.array([x]))
                assert _close(t, float(rt[0])) and oor == roor
