"""Attention over the two cache layouts: paged decode with one plan per iteration, a prefill chunk
over its own blocks, and a static reservation read as a view (module functions: tests call them
directly)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodePlan:
    """How :func:`paged_decode_attention` reads a CPU decode batch: every decoding sequence's own
    blocks, concatenated in table order (``blocks``, int64 on the device), and each sequence's first
    token in that gathered run and its KV length (``spans``). Built once per iteration (the engine)
    or per timed setup (route 1) and reused by every layer."""

    blocks: object
    spans: tuple[tuple[int, int], ...]


def decode_plan(tables: list[list[int]], seq_lens: list[int], block_size: int, device="cpu") -> DecodePlan | None:
    """The CPU decode batch's :class:`DecodePlan`, or ``None`` (CUDA, or no sequence): one SDPA call
    over the batch padded to its longest.

    Why per sequence on CPU: one gather + SDPA pads every sequence to the batch's longest, and
    length-sorted groups (the previous CPU kernel) still pad each group to its own longest, so
    the kernel's time followed the spread of lengths, not the total KV the cost model prices it by.
    ``python -m bench decode-spread`` on the 2-vCPU AMD EPYC host (one thread): lengths drawn from
    20-385 against the same count and total at one length cost 1.45x in one padded call, 1.21x in
    groups of 8 and 1.05x per sequence (16 sequences; 8 sequences: 1.56x, 1.53x, 1.01x;
    docs/validation.md, "The paged decode kernel"). Per sequence costs 34-60 % more at one length there.
    A paged kernel reads each sequence's own blocks, and so does this one: one ``index_select`` of
    all the batch's blocks (padding only inside each sequence's last block), then one SDPA per
    sequence over its slice. CUDA keeps the one padded call: a launch per sequence would cost more
    than the padding.
    """
    if str(device).startswith("cuda") or not seq_lens:
        return None
    import torch

    spans, at = [], 0
    for t, L in zip(tables, seq_lens):
        if not 0 < L <= len(t) * block_size:
            raise ValueError(f"seq_lens: {L} KV tokens do not fit a table of {len(t)} blocks of {block_size}")
        spans.append((at, int(L)))
        at += len(t) * block_size
    blocks = torch.tensor([b for t in tables for b in t], dtype=torch.long, device=device)
    return DecodePlan(blocks, tuple(spans))


def padded_block_tables(tables: list[list[int]], device="cpu"):
    """``[len(tables), longest]`` int64 block tables, each padded with block 0 past its own blocks (the
    length mask keeps the padding out): the input of the one padded :func:`paged_decode_attention` call."""
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


def paged_decode_attention(q, k_pool, v_pool, block_tables, seq_lens, scale=None, plan: DecodePlan | None = None):
    """One query token per sequence over a paged cache.

    q [D, H, d]; pools [num_blocks, B, KVH, d]; block_tables [D, max_blocks] (int64, padded);
    seq_lens [D] (KV tokens incl. the new one). Returns [D, H, d]. ``plan``: from
    :func:`decode_plan` (the CPU kernel: one gather of the sequences' own blocks, one SDPA per
    sequence over its slice; ``block_tables`` and ``seq_lens`` unused); ``None``: one call over the
    whole batch padded to its longest (CUDA).
    """
    import torch

    F = torch.nn.functional
    if plan is not None:
        KVH, d = k_pool.shape[2:]
        k = k_pool.index_select(0, plan.blocks).view(-1, KVH, d)
        v = v_pool.index_select(0, plan.blocks).view(-1, KVH, d)
        out = torch.empty_like(q)
        for i, (s, L) in enumerate(plan.spans):
            # one query over all L keys: no mask needed
            out[i] = F.scaled_dot_product_attention(
                q[i : i + 1].transpose(0, 1).unsqueeze(0),
                k[s : s + L].transpose(0, 1).unsqueeze(0),
                v[s : s + L].transpose(0, 1).unsqueeze(0),
                enable_gqa=True,
                scale=scale,
            )[0, :, 0]
        return out
    D, nblk = block_tables.shape
    B, KVH, d = k_pool.shape[1:]
    Lmax = nblk * B
    flat = block_tables.reshape(-1)
    # index_select on dim 0 gathers whole blocks (about 3x faster than pool[table] on CPU)
    k = k_pool.index_select(0, flat).view(D, Lmax, KVH, d).transpose(1, 2)
    v = v_pool.index_select(0, flat).view(D, Lmax, KVH, d).transpose(1, 2)
    mask = (torch.arange(Lmax, device=q.device)[None, :] < seq_lens[:, None]).view(D, 1, 1, Lmax)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True, scale=scale)
    return o.squeeze(2)


def chunk_attention(q, k, v, ctx: int, scale=None):
    """``n`` new tokens after ``ctx`` cached ones: q [n, H, d]; k, v [ctx + n, KVH, d] (views). Returns [n, H, d]."""
    import torch

    n = q.shape[0]
    qq, kk, vv = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    F = torch.nn.functional
    if ctx == 0:
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True, scale=scale)
    else:
        L = ctx + n
        mask = torch.arange(L, device=q.device)[None, :] <= (ctx + torch.arange(n, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True, scale=scale)
    return o[0].transpose(0, 1)


def contiguous_attention(q, k_list, v_list, scale=None):
    """Reference: one query token per sequence over its own contiguous K/V ([L_i, KVH, d]); [D, H, d]."""
    import torch

    outs = [
        chunk_attention(q[i : i + 1], k_list[i], v_list[i], k_list[i].shape[0] - 1, scale) for i in range(q.shape[0])
    ]
    return torch.cat(outs, 0)
