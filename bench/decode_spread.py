"""Does the reference engine's paged decode kernel cost follow the KV it reads, or the spread of lengths?

The cost model prices decode attention by the sequence count and the total KV tokens. A kernel that
pads sequences to a longest one costs more for a batch of mixed lengths than for the same total at
one length, and the simulator cannot see that. Three CPU layouts of the same paged cache, side by
side in one thread (interleaved rounds, each the fastest of a few calls, the median over rounds):

* ``padded``: one ``index_select`` + SDPA over the batch padded to its longest (the engine's CUDA
  path, and an earlier CPU path);
* ``groups of 8``: sorted by length, cut into groups of at most 8 sequences and 4096 padded tokens,
  each padded to its own longest (the previous CPU kernel);
* ``per sequence``: one gather of every sequence's own blocks, one SDPA per sequence over its slice
  (:func:`calibration.engine.decode_plan`, the CPU kernel now).

Batches: 16 and 8 sequences of 204 tokens, and the same counts at lengths drawn uniformly from
20–385 tokens (what ``validate-cpu.yaml``'s saturating load decodes) with the same total. The cost
model prices each spread batch exactly as its uniform one; per layout it prints µs per call (one
layer) and the ``spread ÷ uniform`` ratio: near 1 means the kernel costs what the cost model prices.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from .common import load_avg, table

LAYOUTS = ("padded", "groups of 8", "per sequence")


def _groups(lens: list[int], block_size: int, seqs: int = 8, tokens: int = 4096) -> list[tuple[list[int], int]]:
    out, cur, nb = [], [], 0
    for i in sorted(range(len(lens)), key=lambda i: lens[i]):
        need = -(-lens[i] // block_size)
        if cur and (len(cur) + 1 > seqs or (len(cur) + 1) * need * block_size > tokens):
            out.append((cur, nb))
            cur = []
        cur.append(i)
        nb = need
    out.append((cur, nb))
    return out


def _spread(rng: random.Random, n: int, mean: int, lo: int = 20, hi: int = 385) -> list[int]:
    """``n`` lengths drawn uniformly from ``lo``-``hi`` whose total is exactly ``n * mean``: the same
    sequence count and KV tokens as ``n`` sequences of ``mean``, which the cost model prices alike."""
    while True:
        lens = [rng.randint(lo, hi) for _ in range(n)]
        lens[-1] += n * mean - sum(lens)
        if lo <= lens[-1] <= hi:
            return lens


def run(quick: bool, out: Path, rounds: int | None = None) -> dict:
    import torch

    from calibration.engine import decode_plan, padded_block_tables, paged_decode_attention
    from sim.catalog import MODELS

    torch.set_num_threads(1)
    m = MODELS["tiny-llama"]
    B, KVH, H, d = 16, m.kv_heads, m.heads, m.head_dim
    rounds = int(rounds) if rounds is not None else 3 if quick else 8
    rng = random.Random(7)
    batches = {"16 x 204": [204] * 16, "8 x 204": [204] * 8}
    for i in range(2 if quick else 4):
        batches[f"16 spread #{i + 1}"] = _spread(rng, 16, 204)
    for i in range(1 if quick else 2):
        batches[f"8 spread #{i + 1}"] = _spread(rng, 8, 204)
    nblocks = sum(-(-L // B) for L in batches["16 x 204"]) * 3
    g = torch.Generator().manual_seed(0)
    kp, vp = torch.randn(nblocks, B, KVH, d, generator=g), torch.randn(nblocks, B, KVH, d, generator=g)

    def setups(lens):
        perm = torch.randperm(nblocks, generator=g).tolist()
        tables, at = [], 0
        for L in lens:
            n = -(-L // B)
            tables.append(perm[at : at + n])
            at += n
        bt = padded_block_tables(tables)
        sl = torch.tensor(lens)
        q = torch.randn(len(lens), H, d, generator=g)
        gr = [(torch.tensor(ix), nb) for ix, nb in _groups(lens, B)]
        plan = decode_plan(tables, lens, B)  # built once, as the engine builds it once per iteration

        def grouped():
            o = torch.empty_like(q)
            for ix, nb in gr:
                o[ix] = paged_decode_attention(q[ix], kp, vp, bt[ix, :nb], sl[ix])
            return o

        return {
            "padded": lambda: paged_decode_attention(q, kp, vp, bt, sl),
            "groups of 8": grouped,
            "per sequence": lambda: paged_decode_attention(q, kp, vp, None, None, None, plan),
        }

    la0 = load_avg()
    times = {(b, lay): [] for b in batches for lay in LAYOUTS}
    agree = 0.0  # the layouts compute the same attention: the timing is of the same work
    with torch.inference_mode():
        for lens in batches.values():
            outs = [f() for f in setups(lens).values()]
            agree = max(agree, max(float((o - outs[0]).abs().max() / outs[0].abs().max()) for o in outs[1:]))
        for _ in range(rounds):
            for b, lens in batches.items():
                fns = setups(lens)
                for lay in LAYOUTS:
                    best = float("inf")
                    for _ in range(8):
                        c0 = time.thread_time()
                        fns[lay]()
                        best = min(best, time.thread_time() - c0)
                    times[(b, lay)].append(best)
    res = {}
    rows = []
    for b, lens in batches.items():
        res[b] = {"lengths": lens, "kv_tokens": sum(lens)}
        for lay in LAYOUTS:
            t = statistics.median(times[(b, lay)])
            res[b][lay] = {"us": t * 1e6, "ns_per_token": t * 1e9 / sum(lens)}
        rows.append([b, sum(lens), max(lens)] + [res[b][lay]["us"] for lay in LAYOUTS])
    ratios = {}
    for n in (16, 8):
        uni = res[f"{n} x 204"]
        spread = [k for k in batches if k.startswith(f"{n} spread")]
        ratios[n] = {lay: statistics.mean(res[k][lay]["us"] for k in spread) / uni[lay]["us"] for lay in LAYOUTS}
        rows.append([f"{n} seqs: spread / uniform", "", ""] + [ratios[n][lay] for lay in LAYOUTS])
    table(
        f"paged decode attention, one layer, µs per call at equal sequences and KV tokens ({rounds} rounds; "
        f"load average {la0} -> {load_avg()})",
        ["batch", "KV tokens", "longest"] + list(LAYOUTS),
        rows,
    )
    return {
        "rounds": rounds,
        "batches": res,
        "spread_over_uniform": ratios,
        "max_rel_diff": agree,
        "load_avg": [la0, load_avg()],
    }
