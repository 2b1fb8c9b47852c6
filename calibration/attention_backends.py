"""Attention kernels behind one interface: what ``kvsim calibrate --device`` times and the reference
engine (:mod:`calibration.engine`) runs, so ``kvsim validate`` checks the kernels calibration measured.

Backends (``--kernels``; :data:`KERNELS`):

* ``sdpa`` — torch's ``scaled_dot_product_attention`` after a gather of the sequences' blocks
  (:func:`calibration.engine.paged_decode_attention`): on CPU one call per sequence over its own
  blocks, on CUDA one call over the batch padded to its longest with a length mask. No serving
  engine runs this on a GPU; it is the CPU default and the reference the others are tested against.
* ``flex`` — ``torch.nn.attention.flex_attention``, compiled (``torch.compile``, inductor: Triton on
  CUDA, C++ on CPU). The KV pool is one sequence ``[1, kv_heads, blocks × block_size, head_dim]``
  shared by every query; each sequence of the batch is a batch row whose ``BlockMask`` lists its
  own block-table entries as the KV blocks it reads (block-mask KV tile = the cache's block size),
  and a ``mask_mod`` maps a pool position back to (owner, logical position) for the partial last
  block and causality. This is the page-table indirection of vLLM's FlexAttention backend, with
  one query row per sequence instead of packed tokens (no KV read for another sequence's queries).
* ``flashinfer`` — ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` for decode and
  ``BatchPrefillWithPagedKVCacheWrapper`` (causal) for prefill chunks over the paged cache (``NHD``
  pools, ``plan`` once per batch, ``run`` per layer), as SGLang and vLLM's FlashInfer backend run them.
* ``vllm`` — vLLM's FlashAttention op ``vllm.vllm_flash_attn.flash_attn_varlen_func`` with a block
  table, the call of vLLM v1's FLASH_ATTN backend, when the ``vllm`` wheel is installed.

Contiguous decode (the ``paged_overhead`` denominator) runs each backend's kernel on a contiguous
cache: SDPA / flex over ``[batch, kv_heads, length, head_dim]``, FlashInfer's ragged-KV wrapper and
FlashAttention's varlen call without a block table (each sequence's KV one contiguous run).

Interface (:class:`AttentionBackend`): ``plan_paged`` builds a batch's metadata once (an engine
does this once per iteration), ``paged`` runs it (once per layer); ``decode_paged_calls``,
``decode_contiguous_calls`` and ``prefill_calls`` build random inputs and return the closures that
calibration times. :func:`select` resolves ``auto`` (CUDA: flashinfer > vllm > flex; CPU: sdpa)
against a registry that tests may replace with fakes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, ClassVar

from sim.errors import ConfigError

KERNELS = ("auto", "flex", "flashinfer", "vllm", "sdpa")
#: ``auto``: the first available backend, by device kind (what a deployment on that device would run)
AUTO_ORDER = {"cuda": ("flashinfer", "vllm", "flex"), "cpu": ("sdpa",)}
#: flex: one compiled kernel per distinct shape (batch and query length are rounded up to powers of two
#: so an engine compiles a few buckets); the defaults (8 recompiles per code object) would fall back to
#: eager after the eighth shape, timing an unfused kernel
FLEX_RECOMPILE_LIMIT = 512


@dataclass(frozen=True)
class PagedBatch:
    """One paged attention call: sequence ``i`` has ``new[i]`` query tokens at logical positions
    ``ctx[i] … ctx[i] + new[i] − 1`` and reads KV positions ``0 … ctx[i] + new[i] − 1`` (causal)
    through its block table ``tables[i]`` (physical block ids in logical order). A decode step is
    ``new = 1`` with ``ctx`` = the tokens cached before it."""

    tables: tuple[tuple[int, ...], ...]
    ctx: tuple[int, ...]
    new: tuple[int, ...]
    block_size: int

    @classmethod
    def of(cls, tables, ctx, new, block_size: int) -> PagedBatch:
        b = cls(
            tuple(tuple(int(x) for x in t) for t in tables),
            tuple(int(c) for c in ctx),
            tuple(int(n) for n in new),
            int(block_size),
        )
        if not (len(b.tables) == len(b.ctx) == len(b.new)) or not b.new:
            raise ValueError("PagedBatch: tables, ctx and new must have one entry per sequence (at least one)")
        for t, c, n in zip(b.tables, b.ctx, b.new):
            if n < 1 or c < 0 or c + n > len(t) * b.block_size:
                raise ValueError(
                    f"PagedBatch: {c} + {n} KV tokens do not fit a table of {len(t)} blocks of {b.block_size}"
                )
        return b

    @property
    def kv_lens(self) -> tuple[int, ...]:
        return tuple(c + n for c, n in zip(self.ctx, self.new))

    def blocks_used(self, i: int) -> tuple[int, ...]:
        """Sequence ``i``'s blocks that hold its KV (its table may be longer)."""
        return self.tables[i][: -(-(self.ctx[i] + self.new[i]) // self.block_size)]

    @property
    def decode(self) -> bool:
        return all(n == 1 for n in self.new)


def _bucket(n: int) -> int:
    """The power of two ≥ n (≥ 1)."""
    return 1 << max(0, int(n - 1).bit_length())


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, … up to the power of two ≥ n."""
    return [1 << k for k in range(_bucket(n).bit_length())]


class AttentionBackend:
    """One attention implementation. Construct through :func:`make` (or the class with a torch
    module and device); nothing heavy happens before the first call."""

    name: ClassVar[str] = ""
    #: the ``kernel`` of calibration's prefill rows
    prefill_kernel: ClassVar[str] = ""
    #: what each route runs (provenance and docs)
    routes: ClassVar[dict[str, str]] = {}

    def __init__(self, torch, device):
        self.torch = torch
        self.device = torch.device(device) if not hasattr(device, "type") else device

    # -- availability --
    @classmethod
    def unavailable(cls, device_kind: str) -> str | None:
        """Why this backend cannot run on ``device_kind`` here (``None``: it can)."""
        return None

    def block_size_problem(self, block_size: int) -> str | None:
        """Why this backend's paged kernel cannot use ``block_size`` (``None``: it can)."""
        return None

    def dtype_problem(self, dtype) -> str | None:
        """Why this backend cannot compute in torch ``dtype`` (``None``: it can)."""
        return None

    def version(self) -> str:
        return self.torch.__version__

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version(), **self.routes}

    def stats(self) -> dict:
        """Counters worth recording after a run (flex: compiled graphs)."""
        return {}

    # -- the engine's calls --
    def pool_blocks(self, num_blocks: int) -> int:
        """Blocks an engine allocates for a pool of ``num_blocks`` usable ones (flex rounds up: a compiled
        kernel is specialised to the pool's length, and engines of many sizes then share a few)."""
        return int(num_blocks)

    def warm_up(
        self, k_pool, v_pool, *, heads: int, kv_heads: int, head_dim: int, max_seqs: int, max_tokens: int, dtype=None
    ) -> int:
        """Run every batch shape an engine of ``max_seqs`` sequences and ``max_tokens`` tokens per step can
        form once, so compiling happens before anything is timed; returns the shapes run (0: nothing to
        compile)."""
        return 0

    def plan_paged(
        self,
        batch: PagedBatch,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        num_blocks: int,
        dtype=None,
        scale: float | None = None,
        slot: Any = None,
    ) -> Any:
        """The metadata of one paged call (built once, reused by every layer). ``slot``: plans kept
        alive at the same time need distinct slots (backends whose plan lives in a wrapper object)."""
        raise NotImplementedError

    def paged(self, plan, q, k_pool, v_pool, scale: float | None = None):
        """Attention of ``q`` ``[Σ new, heads, head_dim]`` (sequences in batch order) over the pools
        ``[num_blocks, block_size, kv_heads, head_dim]``; returns ``[Σ new, heads, head_dim]``."""
        raise NotImplementedError

    # -- calibration's closures (inputs built here, outside the timed calls) --
    def reserve_pool(self, randn, needed: int, block_size: int, kv_heads: int, head_dim: int, dtype=None) -> None:
        """Calibration is about to time paged calls needing up to ``needed`` blocks of ``block_size`` (flex:
        allocate its pool at that size now, so every point reuses one pool length; default: nothing)."""

    def _pool(self, randn, needed: int, block_size: int, kv_heads: int, head_dim: int, dtype):
        """K and V pools ``[blocks, block_size, kv_heads, head_dim]`` of at least ``needed`` blocks
        (default: new ones of exactly that size)."""
        return randn(needed, block_size, kv_heads, head_dim), randn(needed, block_size, kv_heads, head_dim)

    def decode_paged_calls(
        self,
        randn,
        seed: int,
        sets: int,
        batch: int,
        kv_len: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype=None,
    ) -> list[Callable[[], Any]]:
        """``sets`` decode batches of ``batch`` sequences of ``kv_len`` KV tokens each, scattered over one
        pool (random block tables), each with its own plan; one closure per set."""
        return self._paged_calls(
            randn, seed, sets, batch, kv_len, kv_len - 1, 1, heads, kv_heads, head_dim, block_size, dtype, "decode"
        )

    def decode_contiguous_calls(
        self, randn, sets: int, batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype=None
    ) -> list[Callable[[], Any]]:
        raise NotImplementedError

    def prefill_calls(
        self, randn, seed: int, sets: int, batch: int, length: int, heads: int, kv_heads: int, head_dim: int, dtype=None
    ) -> list[Callable[[], Any]]:
        """Causal prefill of ``batch`` fresh prompts of ``length`` tokens, as the engine runs a prompt
        (default: the paged call with ``ctx = 0`` over the prompts' blocks in a pool of 16-token blocks)."""
        return self._paged_calls(
            randn, seed, sets, batch, length, 0, length, heads, kv_heads, head_dim, 16, dtype, "prefill"
        )

    def _paged_calls(
        self, randn, seed, sets, batch, kv_len, ctx, new, heads, kv_heads, head_dim, block_size, dtype, kind
    ) -> list[Callable[[], Any]]:
        """``sets`` batches of ``batch`` sequences (``ctx`` cached + ``new`` query tokens, ``kv_len`` in all)
        scattered over one pool, each with its own plan; one closure per set."""
        torch = self.torch
        nblk = -(-kv_len // block_size)
        need = sets * batch * nblk
        kpool, vpool = self._pool(randn, need, block_size, kv_heads, head_dim, dtype)
        total = kpool.shape[0]
        perm = (
            torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:need].view(sets, batch, nblk).tolist()
        )
        out: list[Callable[[], Any]] = []
        for i in range(sets):
            b = PagedBatch.of(perm[i], [ctx] * batch, [new] * batch, block_size)
            plan = self.plan_paged(
                b, heads=heads, kv_heads=kv_heads, head_dim=head_dim, num_blocks=total, dtype=dtype, slot=(kind, i)
            )
            q = randn(batch * new, heads, head_dim)

            def call(q=q, plan=plan):  # timed per call: the same closure overhead the tables were measured with
                return self.paged(plan, q, kpool, vpool)

            out.append(call)
        return out


# --- sdpa: gather + torch SDPA (the CPU default, and the reference) -------------------------------


@dataclass
class _SdpaPlan:
    decode: Any = None  # calibration.engine.DecodePlan (CPU) or None
    tables: Any = None  # padded block tables (CUDA decode)
    lens: Any = None
    chunks: tuple = ()  # (block index tensor, ctx, new) per sequence (chunks)


class SdpaBackend(AttentionBackend):
    name = "sdpa"
    prefill_kernel = "sdpa_causal"
    routes = {
        "decode_paged": "gather of the sequences' blocks (index_select) + torch SDPA: on CPU one call per sequence "
        "over its own blocks, on CUDA one call over the batch padded to its longest with a length "
        "mask (calibration.engine.paged_decode_attention)",
        "decode_contiguous": "torch SDPA over a contiguous [batch, kv_heads, length, head_dim] cache",
        "prefill": "torch SDPA is_causal over [batch, heads, length, head_dim]; the engine's prefill chunks: a "
        "gather of the chunk's blocks + SDPA with a causal offset mask (calibration.engine.chunk_attention)",
    }

    def plan_paged(self, batch, *, heads, kv_heads, head_dim, num_blocks, dtype=None, scale=None, slot=None):
        from .engine import decode_plan, padded_block_tables

        torch, dev = self.torch, self.device
        if batch.decode:
            tables = [list(batch.blocks_used(i)) for i in range(len(batch.new))]
            dp = decode_plan(tables, list(batch.kv_lens), batch.block_size, dev)
            if dp is not None:
                return _SdpaPlan(decode=dp)
            return _SdpaPlan(
                tables=padded_block_tables(tables, dev), lens=torch.tensor(batch.kv_lens, dtype=torch.long, device=dev)
            )
        return _SdpaPlan(
            chunks=tuple(
                (torch.tensor(batch.blocks_used(i), dtype=torch.long, device=dev), c, n)
                for i, (c, n) in enumerate(zip(batch.ctx, batch.new))
            )
        )

    def paged(self, plan, q, k_pool, v_pool, scale=None):
        from .engine import chunk_attention, paged_decode_attention

        if not plan.chunks:
            return paged_decode_attention(q, k_pool, v_pool, plan.tables, plan.lens, scale, plan.decode)
        KVH, d = k_pool.shape[2:]
        out = self.torch.empty_like(q)
        off = 0
        for idx, c, n in plan.chunks:
            L = c + n
            k = k_pool.index_select(0, idx).view(-1, KVH, d)[:L]
            v = v_pool.index_select(0, idx).view(-1, KVH, d)[:L]
            out[off : off + n] = chunk_attention(q[off : off + n], k, v, c, scale)
            off += n
        return out

    def decode_contiguous_calls(self, randn, sets, batch, kv_len, heads, kv_heads, head_dim, dtype=None):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        kw = {"enable_gqa": True} if heads != kv_heads else {}
        out = []
        for _ in range(sets):
            q = randn(batch, heads, 1, head_dim)
            k, v = randn(batch, kv_heads, kv_len, head_dim), randn(batch, kv_heads, kv_len, head_dim)
            out.append(lambda q=q, k=k, v=v: sdpa(q, k, v, **kw))
        return out

    def prefill_calls(self, randn, seed, sets, batch, length, heads, kv_heads, head_dim, dtype=None):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        kw = {"enable_gqa": True} if heads != kv_heads else {}
        out = []
        for _ in range(sets):
            q = randn(batch, heads, length, head_dim)
            k, v = randn(batch, kv_heads, length, head_dim), randn(batch, kv_heads, length, head_dim)
            out.append(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, **kw))
        return out


# --- flex: torch FlexAttention through a block mask over the block tables -------------------------

_FLEX_COMPILED: dict = {}
#: flex: query tokens per batch row. A sequence's queries are cut into rows of at most this many, each
#: row reading its own causal prefix of the sequence's blocks (vLLM's FlexAttention backend tiles queries
#: by 16 too); so a call's shape is (rows, tile) with both rounded up to powers of two, and a handful of
#: compiled kernels serve every batch an engine or a calibration grid forms
FLEX_QUERY_TILE = 16


def flex_q_block(qlen: int, group: int) -> int:
    """The BlockMask's query block for rows of ``qlen`` queries with ``group`` query heads per KV head.
    Inductor's flex decoding kernel (what queries of up to a tile run) packs a row's queries of one KV
    head's group into one tile of ``BLOCK_M = next power of two >= qlen x group`` (at least 16) and
    takes only configs whose query block is a multiple of it: a tile of 16 queries with 4 heads per
    KV head (Llama-3.1-8B) has no config under a 16-row block and fails to compile on CUDA. One row
    is one block either way, so a larger block changes no mask."""
    need = max(1, qlen * group)
    return max(16, qlen, 1 << (need - 1).bit_length())


@dataclass
class _FlexPlan:
    block_mask: Any
    rows: int  # batch rows of the call (query tiles, rounded up to a power of two)
    qlen: int  # query rows per batch row (the longest tile, rounded up to a power of two)
    q_index: Any  # each packed query token's place in [rows × qlen] (None: one token per row, rows = tokens)


class FlexBackend(AttentionBackend):
    name = "flex"
    prefill_kernel = "flex_paged_prefill"
    routes = {
        "decode_paged": "torch.nn.attention.flex_attention (torch.compile) over the whole KV pool as one sequence; "
        "each query tile (up to 16 tokens of one sequence) a batch row whose BlockMask kv_indices are "
        "its sequence's block-table entries (KV tile = the cache's block size), full blocks unmasked, "
        "a mask_mod mapping pool positions to (owner, logical position) in the partial ones",
        "decode_contiguous": "flex_attention (torch.compile), no mask, over a contiguous [batch, kv_heads, length, "
        "head_dim] cache",
        "prefill": "the paged flex call with causal mask over the prompts' blocks, 16-token query tiles (what the "
        "engine runs for prefill chunks)",
    }

    def __init__(self, torch, device, compile: bool = True):
        super().__init__(torch, device)
        self.compile = bool(compile)
        self._pools: dict = {}
        if self.compile:
            cfg = torch._dynamo.config
            for key in (
                "recompile_limit",
                "cache_size_limit",
                "accumulated_recompile_limit",
                "accumulated_cache_size_limit",
            ):
                if hasattr(cfg, key) and getattr(cfg, key) < FLEX_RECOMPILE_LIMIT:
                    setattr(cfg, key, FLEX_RECOMPILE_LIMIT)

    @classmethod
    def unavailable(cls, device_kind):
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError as exc:
            return f"torch.nn.attention.flex_attention is missing ({exc})"
        return None

    def block_size_problem(self, block_size):
        if self.device.type == "cuda" and block_size % 16:
            return "flex_attention's Triton kernels on CUDA tile KV blocks in multiples of 16 tokens"
        return None

    def describe(self):
        return {**super().describe(), "compiled": self.compile, "query_tile": FLEX_QUERY_TILE}

    def stats(self):
        try:
            from torch._dynamo.utils import counters

            return {"compiled_graphs": int(counters["stats"]["unique_graphs"])}
        except Exception:  # counters are private API
            return {}

    def _flex(self, dynamic: bool):
        from torch.nn.attention.flex_attention import flex_attention

        if not self.compile:
            return flex_attention
        key = bool(dynamic)
        if key not in _FLEX_COMPILED:
            _FLEX_COMPILED[key] = self.torch.compile(flex_attention, dynamic=key)
        return _FLEX_COMPILED[key]

    def pool_blocks(self, num_blocks):
        return _bucket(num_blocks)

    def warm_up(self, k_pool, v_pool, *, heads, kv_heads, head_dim, max_seqs, max_tokens, dtype=None):
        if not self.compile:
            return 0
        B, N = k_pool.shape[1], k_pool.shape[0]
        tile = FLEX_QUERY_TILE
        shapes = [(r, 1) for r in pow2_upto(max_seqs)]
        shapes += [(r, tile) for r in pow2_upto(-(-max_tokens // tile) + max_seqs)]
        for rows, new in shapes:
            nblk = -(-new // B)
            batch = PagedBatch.of(
                [[(i * nblk + j) % N for j in range(nblk)] for i in range(rows)], [0] * rows, [new] * rows, B
            )
            plan = self.plan_paged(batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim, num_blocks=N, dtype=dtype)
            q = k_pool.new_zeros(rows * new, heads, head_dim)
            self.paged(plan, q, k_pool, v_pool)
        return len(shapes)

    def reserve_pool(self, randn, needed, block_size, kv_heads, head_dim, dtype=None):
        self._pool(randn, needed, block_size, kv_heads, head_dim, dtype)

    def _pool(self, randn, needed, block_size, kv_heads, head_dim, dtype):
        # the pool's length is a compiled kernel's static shape: one pool per block size, grown by doubling
        # and reused by every point (its contents are random either way)
        key = (block_size, kv_heads, head_dim, dtype)
        have = self._pools.get(key)
        if have is None or have[0].shape[0] < needed:
            n = _bucket(max(needed, have[0].shape[0] if have else 1))
            self._pools[key] = have = (
                randn(n, block_size, kv_heads, head_dim),
                randn(n, block_size, kv_heads, head_dim),
            )
        return have

    def plan_paged(self, batch, *, heads, kv_heads, head_dim, num_blocks, dtype=None, scale=None, slot=None):
        from torch.nn.attention.flex_attention import BlockMask

        torch, dev = self.torch, self.device
        B, N, tile = batch.block_size, int(num_blocks), FLEX_QUERY_TILE
        # batch rows: (sequence, tokens cached before the row's first query, the row's queries)
        row_seq, row_ctx, row_new, q_index = [], [], [], []
        for i, (c, n) in enumerate(zip(batch.ctx, batch.new)):
            for j in range(0, n, tile):
                row_seq.append(i)
                row_ctx.append(c + j)
                row_new.append(min(tile, n - j))
        # one query per row (decode) or a full tile: two query lengths, so few compiled shapes
        rows, qlen = _bucket(len(row_seq)), (1 if batch.decode else tile)
        for r, m in enumerate(row_new):
            q_index.extend(range(r * qlen, r * qlen + m))
        used = [batch.blocks_used(i) for i in range(len(batch.new))]
        width = max(len(u) for u in used)
        seq_tbl = torch.zeros(len(used), width, dtype=torch.int32)
        for i, u in enumerate(used):
            seq_tbl[i, : len(u)] = torch.tensor(u, dtype=torch.int32)
        tbl = torch.zeros(rows, width, dtype=torch.int32)
        tbl[: len(row_seq)] = seq_tbl[torch.tensor(row_seq, dtype=torch.long)]
        ctx = torch.zeros(rows, dtype=torch.int32)
        ctx[: len(row_seq)] = torch.tensor(row_ctx, dtype=torch.int32)
        new = torch.zeros(rows, dtype=torch.int32)
        new[: len(row_seq)] = torch.tensor(row_new, dtype=torch.int32)
        seq = torch.full((rows,), -2, dtype=torch.int32)
        seq[: len(row_seq)] = torch.tensor(row_seq, dtype=torch.int32)
        # blocks a row reads: up to its last query's causal horizon; those wholly at or before its first
        # query's position are full (no mask_mod), the rest partial
        kv_num = torch.where(new > 0, (ctx + new + B - 1) // B, 0)
        full = torch.where(new > 0, torch.minimum((ctx + 1) // B, kv_num), 0)
        # the CPU kernel requires kv_indices to span the whole KV length (pool blocks); the Triton one reads
        # only the first kv_num_blocks entries of a row
        wd = max(N, width) if dev.type == "cpu" else width
        full_idx = torch.zeros(rows, wd, dtype=torch.int32)
        full_idx[:, :width] = tbl
        src = (full[:, None].long() + torch.arange(wd)[None, :]).clamp(max=width - 1)
        part_idx = torch.gather(tbl, 1, src)
        flat = torch.tensor([b for u in used for b in u], dtype=torch.long)
        owner = torch.full((N,), -1, dtype=torch.int32)
        logical = torch.zeros(N, dtype=torch.int32)
        owner[flat] = torch.tensor([i for i, u in enumerate(used) for _ in u], dtype=torch.int32)
        logical[flat] = torch.tensor([j for u in used for j in range(len(u))], dtype=torch.int32)
        owner, logical, ctx_d, seq_d = owner.to(dev), logical.to(dev), ctx.to(dev), seq.to(dev)

        def mask_mod(b, h, q_idx, kv_idx):
            blk = kv_idx // B
            return (owner[blk] == seq_d[b]) & (logical[blk] * B + kv_idx % B <= ctx_d[b] + q_idx)

        kw = (
            {"compute_q_blocks": False}
            if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters
            else {}
        )
        i32 = torch.int32
        shape = (rows, 1, 1)
        bm = BlockMask.from_kv_blocks(
            (kv_num - full).view(shape).to(dev, i32),
            part_idx.view(*shape, wd).to(dev, i32),
            full.view(shape).to(dev, i32),
            full_idx.view(*shape, wd).to(dev, i32),
            BLOCK_SIZE=(flex_q_block(qlen, heads // kv_heads), B),
            mask_mod=mask_mod,
            seq_lengths=(qlen, N * B),
            **kw,
        )
        fast = qlen == 1 and rows == len(q_index)
        return _FlexPlan(bm, rows, qlen, None if fast else torch.tensor(q_index, dtype=torch.long, device=dev))

    def paged(self, plan, q, k_pool, v_pool, scale=None):
        N, B, KVH, d = k_pool.shape
        H = q.shape[1]
        if plan.q_index is None:
            qq = q.unsqueeze(2)  # [rows, H, 1, d]
        else:
            qq = q.new_zeros(plan.rows * plan.qlen, H, d).index_copy_(0, plan.q_index, q)
            qq = qq.view(plan.rows, plan.qlen, H, d).transpose(1, 2)
        k = k_pool.view(1, N * B, KVH, d).transpose(1, 2)
        v = v_pool.view(1, N * B, KVH, d).transpose(1, 2)
        o = self._flex(False)(qq, k, v, block_mask=plan.block_mask, scale=scale, enable_gqa=H != KVH)
        if plan.q_index is None:
            return o.squeeze(2)
        return o.transpose(1, 2).reshape(plan.rows * plan.qlen, H, d).index_select(0, plan.q_index)

    def decode_contiguous_calls(self, randn, sets, batch, kv_len, heads, kv_heads, head_dim, dtype=None):
        # CPU: one dynamic-shape kernel for every (batch, length); CUDA: static shapes, so the batch dimension
        # stays static and inductor may pick its split-KV decoding kernel
        fn = self._flex(self.device.type == "cpu")
        gqa = heads != kv_heads
        out = []
        for _ in range(sets):
            q = randn(batch, heads, 1, head_dim)
            k, v = randn(batch, kv_heads, kv_len, head_dim), randn(batch, kv_heads, kv_len, head_dim)
            out.append(lambda q=q, k=k, v=v: fn(q, k, v, enable_gqa=gqa))
        return out


def _cuda_module(device_kind: str, what: str, package: str, module: str, install: str):
    """``(module, None)``, or ``(None, why not)``: CUDA only, the package installed, the module importable."""
    if device_kind != "cuda":
        return None, f"{what} run on CUDA only"
    if importlib.util.find_spec(package) is None:
        return None, f"the {package} package is not installed ({install})"
    try:
        return importlib.import_module(module), None
    except Exception as exc:  # a broken install (missing CUDA libraries, ABI mismatch) says why
        return None, f"import {module} failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


# --- flashinfer -----------------------------------------------------------------------------------

#: FlashInfer's float workspace (split-KV partial results); one per backend object, shared by its wrappers
FLASHINFER_WORKSPACE_BYTES = 256 << 20


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    prefill_kernel = "flashinfer_paged_prefill"
    routes = {
        "decode_paged": "flashinfer.BatchDecodeWithPagedKVCacheWrapper (NHD pages, plan once per batch, run per layer)",
        "decode_contiguous": "flashinfer.BatchPrefillWithRaggedKVCacheWrapper, one query per sequence over its "
        "contiguous KV (FlashInfer has no batch decode over a non-paged cache)",
        "prefill": "flashinfer.BatchPrefillWithPagedKVCacheWrapper, causal, over the prompts' pages",
    }

    def __init__(self, torch, device):
        super().__init__(torch, device)
        self._fi = None
        self._ws = None
        self._wrappers: dict = {}

    @classmethod
    def unavailable(cls, device_kind):
        fi, why = _cuda_module(
            device_kind, "FlashInfer's kernels", "flashinfer", "flashinfer", "pip install flashinfer-python"
        )
        if why:
            return why
        if not hasattr(fi, "BatchDecodeWithPagedKVCacheWrapper") or not hasattr(
            fi.BatchDecodeWithPagedKVCacheWrapper, "plan"
        ):
            return f"flashinfer {getattr(fi, '__version__', '?')} has no BatchDecodeWithPagedKVCacheWrapper.plan (0.2 or newer needed)"
        return None

    def dtype_problem(self, dtype):
        t = self.torch
        return None if dtype in (t.float16, t.bfloat16) else "FlashInfer computes in fp16 or bf16"

    @property
    def fi(self):
        if self._fi is None:
            self._fi = importlib.import_module("flashinfer")
        return self._fi

    def version(self):
        return str(getattr(self.fi, "__version__", "?"))

    def _wrapper(self, kind: str, slot):
        key = (kind, slot)
        w = self._wrappers.get(key)
        if w is None:
            if self._ws is None:
                self._ws = self.torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=self.torch.uint8, device=self.device)
            cls = getattr(
                self.fi,
                {
                    "decode": "BatchDecodeWithPagedKVCacheWrapper",
                    "prefill": "BatchPrefillWithPagedKVCacheWrapper",
                    "ragged": "BatchPrefillWithRaggedKVCacheWrapper",
                }[kind],
            )
            w = self._wrappers[key] = cls(self._ws, "NHD")
        return w

    def _indptr(self, counts):
        t = self.torch
        return t.tensor([0] + list(accumulate(counts)), dtype=t.int32, device=self.device)

    def plan_paged(self, batch, *, heads, kv_heads, head_dim, num_blocks, dtype=None, scale=None, slot=None):
        t = self.torch
        S, B = len(batch.new), batch.block_size
        used = [batch.blocks_used(i) for i in range(S)]
        indptr = self._indptr([len(u) for u in used])
        indices = t.tensor([b for u in used for b in u], dtype=t.int32, device=self.device)
        last = t.tensor([L - (len(u) - 1) * B for L, u in zip(batch.kv_lens, used)], dtype=t.int32, device=self.device)
        dtype = dtype or t.bfloat16
        scale = scale if scale is not None else head_dim**-0.5
        if batch.decode:
            w = self._wrapper("decode", slot)
            w.plan(
                indptr,
                indices,
                last,
                heads,
                kv_heads,
                head_dim,
                B,
                q_data_type=dtype,
                kv_data_type=dtype,
                sm_scale=scale,
            )
        else:
            w = self._wrapper("prefill", slot)
            w.plan(
                self._indptr(batch.new),
                indptr,
                indices,
                last,
                heads,
                kv_heads,
                head_dim,
                B,
                causal=True,
                sm_scale=scale,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
        return w

    def paged(self, plan, q, k_pool, v_pool, scale=None):
        return plan.run(q, (k_pool, v_pool))

    def decode_contiguous_calls(self, randn, sets, batch, kv_len, heads, kv_heads, head_dim, dtype=None):
        dtype = dtype or self.torch.bfloat16
        out = []
        for i in range(sets):
            w = self._wrapper("ragged", ("contiguous", i))
            w.plan(
                self._indptr([1] * batch),
                self._indptr([kv_len] * batch),
                heads,
                kv_heads,
                head_dim,
                causal=False,
                sm_scale=head_dim**-0.5,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
            q = randn(batch, heads, head_dim)
            k, v = randn(batch * kv_len, kv_heads, head_dim), randn(batch * kv_len, kv_heads, head_dim)
            out.append(lambda w=w, q=q, k=k, v=v: w.run(q, k, v))
        return out


# --- vllm: FlashAttention's varlen call with a block table -----------------------------------------


class VllmBackend(AttentionBackend):
    name = "vllm"
    prefill_kernel = "vllm_flash_attn_paged_prefill"
    routes = {
        "decode_paged": "vllm.vllm_flash_attn.flash_attn_varlen_func with block_table and seqused_k (vLLM v1's "
        "FLASH_ATTN backend call; decode and prefill in one varlen call)",
        "decode_contiguous": "flash_attn_varlen_func without a block table, cu_seqlens_k over contiguous KV",
        "prefill": "flash_attn_varlen_func, causal, with a block table over the prompts' blocks",
    }

    def __init__(self, torch, device):
        super().__init__(torch, device)
        self._fn = None
        self._extra: dict = {}

    @classmethod
    def unavailable(cls, device_kind):
        mod, why = _cuda_module(device_kind, "vLLM's attention ops", "vllm", "vllm.vllm_flash_attn", "pip install vllm")
        if why:
            return why
        return None if hasattr(mod, "flash_attn_varlen_func") else "vllm.vllm_flash_attn has no flash_attn_varlen_func"

    def block_size_problem(self, block_size):
        if block_size % 16:
            return "FlashAttention's paged KV needs block sizes that are multiples of 16"
        return None

    def dtype_problem(self, dtype):
        t = self.torch
        return None if dtype in (t.float16, t.bfloat16) else "FlashAttention computes in fp16 or bf16"

    def version(self):
        return str(getattr(importlib.import_module("vllm"), "__version__", "?"))

    @property
    def fn(self):
        if self._fn is None:
            self._fn = importlib.import_module("vllm.vllm_flash_attn").flash_attn_varlen_func
            try:  # the FlashAttention version vLLM would pick on this GPU (2 or 3)
                from vllm.attention.utils.fa_utils import get_flash_attn_version

                v = get_flash_attn_version()
                if v is not None and "fa_version" in inspect.signature(self._fn).parameters:
                    self._extra = {"fa_version": v}
            except Exception:
                self._extra = {}
        return self._fn

    def describe(self):
        d = super().describe()
        _ = self.fn
        if self._extra:
            d["fa_version"] = self._extra["fa_version"]
        return d

    def plan_paged(self, batch, *, heads, kv_heads, head_dim, num_blocks, dtype=None, scale=None, slot=None):
        t, dev = self.torch, self.device
        used = [batch.blocks_used(i) for i in range(len(batch.new))]
        width = max(len(u) for u in used)
        bt = t.zeros(len(used), width, dtype=t.int32)
        for i, u in enumerate(used):
            bt[i, : len(u)] = t.tensor(u, dtype=t.int32)
        cu_q = t.tensor([0] + list(accumulate(batch.new)), dtype=t.int32, device=dev)
        return {
            "cu_seqlens_q": cu_q,
            "max_seqlen_q": max(batch.new),
            "seqused_k": t.tensor(batch.kv_lens, dtype=t.int32, device=dev),
            "max_seqlen_k": max(batch.kv_lens),
            "block_table": bt.to(dev),
            "softmax_scale": scale if scale is not None else head_dim**-0.5,
        }

    def paged(self, plan, q, k_pool, v_pool, scale=None):
        kw = dict(plan)
        if scale is not None:
            kw["softmax_scale"] = scale
        return self.fn(q=q, k=k_pool, v=v_pool, causal=True, **kw, **self._extra)

    def decode_contiguous_calls(self, randn, sets, batch, kv_len, heads, kv_heads, head_dim, dtype=None):
        t, dev = self.torch, self.device
        cu_q = t.arange(batch + 1, dtype=t.int32, device=dev)
        cu_k = cu_q * kv_len
        fn = self.fn
        out = []
        for _ in range(sets):
            q = randn(batch, heads, head_dim)
            k, v = randn(batch * kv_len, kv_heads, head_dim), randn(batch * kv_len, kv_heads, head_dim)
            out.append(
                lambda q=q, k=k, v=v: fn(
                    q=q,
                    k=k,
                    v=v,
                    cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k,
                    max_seqlen_q=1,
                    max_seqlen_k=kv_len,
                    softmax_scale=head_dim**-0.5,
                    causal=True,
                    **self._extra,
                )
            )
        return out


# --- selection ------------------------------------------------------------------------------------

BACKENDS: dict[str, type[AttentionBackend]] = {
    "sdpa": SdpaBackend,
    "flex": FlexBackend,
    "flashinfer": FlashInferBackend,
    "vllm": VllmBackend,
}


def availability(device_kind: str, registry: dict | None = None) -> dict[str, str | None]:
    """Per backend: ``None`` when it can run on ``device_kind`` here, else why not."""
    reg = BACKENDS if registry is None else registry
    return {name: cls.unavailable(device_kind) for name, cls in reg.items()}


def select(kernels: str, device_kind: str, registry: dict | None = None, key: str = "calibrate.kernels") -> str:
    """The backend name ``kernels`` stands for on ``device_kind`` (``auto``: the first available in
    :data:`AUTO_ORDER`), or a ConfigError naming ``key``, the value and what is available here."""
    reg = BACKENDS if registry is None else registry
    if kernels not in KERNELS:
        raise ConfigError(key, kernels, f"one of {', '.join(KERNELS)}")
    if kernels != "auto":
        why = reg[kernels].unavailable(device_kind)
        if why is not None:
            ok = [n for n, w in availability(device_kind, reg).items() if w is None]
            raise ConfigError(
                key,
                kernels,
                f"a backend that runs on {device_kind} here ({kernels}: {why}); available: {', '.join(ok) or 'none'}",
            )
        return kernels
    for name in AUTO_ORDER.get(device_kind, ()):
        if name in reg and reg[name].unavailable(device_kind) is None:
            return name
    why = "; ".join(f"{n}: {reg[n].unavailable(device_kind)}" for n in AUTO_ORDER.get(device_kind, ()) if n in reg)
    raise ConfigError(key, kernels, f"an available attention backend on {device_kind} ({why})")


_SHARED: dict = {}


def make(
    kernels: str,
    torch,
    device,
    *,
    device_kind: str | None = None,
    registry: dict | None = None,
    key: str = "calibrate.kernels",
    **options,
) -> AttentionBackend:
    """The backend object for ``kernels`` on ``device`` (``device_kind`` defaults to the device's type;
    a stand-in device may claim another). One object per (backend, device, options), shared: engines of
    one validation reuse a compiled kernel or a FlashInfer workspace instead of building their own."""
    reg = BACKENDS if registry is None else registry
    dev = torch.device(device) if not hasattr(device, "type") else device
    kind = device_kind or dev.type
    name = select(kernels, kind, reg, key)
    cache_key = (id(reg.get(name)), name, str(dev), tuple(sorted(options.items())))
    if cache_key not in _SHARED:
        _SHARED[cache_key] = reg[name](torch, dev, **options)
    return _SHARED[cache_key]
