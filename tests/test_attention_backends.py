"""Attention backends (calibration/attention_backends.py): every backend that runs here equals contiguous
attention on paged caches (decode and prefill chunks, several block sizes, grouped-query heads), the
reference engine gives the same tokens on each, and ``--kernels`` resolves and fails as documented.

FlashInfer and vLLM run on CUDA only; their argument building (page indptr / indices / last-page
lengths, cumulative query lengths, block tables, seqused_k) is checked against stand-in modules that
compute what those libraries document their calls to compute.
"""

from __future__ import annotations

import types
import warnings

import pytest

torch = pytest.importorskip("torch")

from calibration import attention_backends as AB  # noqa: E402
from calibration.engine import Engine, EngineConfig, Transformer, chunk_attention  # noqa: E402
from sim.catalog import MODELS  # noqa: E402
from sim.errors import ConfigError  # noqa: E402

TINY = MODELS["tiny-llama"]
warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def cpu_backends() -> list[str]:
    """The backends that run on this machine's CPU."""
    return [n for n, why in AB.availability("cpu").items() if why is None]


def backend(name: str):
    # flex eagerly: the same mask_mod and block mask, no compile (the compiled kernel has its own test)
    return AB.FlexBackend(torch, torch.device("cpu"), compile=False) if name == "flex" else AB.make(name, torch, "cpu")


def random_batch(g, block_size, num_blocks, ctx, new, kv_heads=4, head_dim=32, heads=8, spare=1, dtype=torch.float32):
    """Pools with each sequence's blocks scattered, its queries, and the reference: contiguous attention."""
    kp = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    vp = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, at = [], 0
    for c, n in zip(ctx, new):
        m = -(-(c + n) // block_size) + spare  # tables may hold more blocks than the KV needs
        tables.append(perm[at : at + m])
        at += m
    q = torch.randn(sum(new), heads, head_dim, generator=g).to(dtype)
    refs, off = [], 0
    for t, c, n in zip(tables, ctx, new):
        k = kp[t].reshape(-1, kv_heads, head_dim)[: c + n].float()
        v = vp[t].reshape(-1, kv_heads, head_dim)[: c + n].float()
        refs.append(chunk_attention(q[off : off + n].float(), k, v, c))
        off += n
    return kp, vp, q, AB.PagedBatch.of(tables, ctx, new, block_size), torch.cat(refs)


CASES = {  # block size, pool blocks, tokens cached before, query tokens per sequence
    "decode": (16, 64, [0, 16, 39, 99, 2], [1, 1, 1, 1, 1]),
    "decode, block 8": (8, 96, [3, 60, 7, 1, 2, 8, 0], [1, 1, 1, 1, 1, 1, 1]),
    "chunks": (16, 64, [0, 20, 5], [30, 1, 50]),
    "chunks, block 32": (32, 32, [0, 33], [70, 16]),
    "mixed": (8, 128, [3, 0, 60, 7, 1, 2], [1, 40, 1, 1, 9, 1]),
}


@pytest.mark.parametrize("name", cpu_backends())
@pytest.mark.parametrize("case", list(CASES))
def test_paged_equals_contiguous(name, case):
    """Every backend that runs here: paged attention (block tables over a shared pool) equals attention
    over each sequence's contiguous K/V, for decode steps, prefill chunks after cached tokens and both."""
    g = torch.Generator().manual_seed(hash(case) % 1000)
    bs, nblocks, ctx, new = CASES[case]
    kp, vp, q, batch, ref = random_batch(g, bs, nblocks, ctx, new)
    be = backend(name)
    plan = be.plan_paged(batch, heads=8, kv_heads=4, head_dim=32, num_blocks=nblocks)
    assert rel(be.paged(plan, q, kp, vp), ref) < 1e-5


def test_flex_compiled_equals_contiguous_bf16():
    """The compiled FlexAttention kernel (inductor's C++ template on CPU) on a bf16 paged cache: decode
    and chunks in one call equal contiguous attention to bf16 precision; a second batch of the same
    bucketed shape reuses the compiled kernel."""
    be = AB.FlexBackend(torch, torch.device("cpu"), compile=True)
    g = torch.Generator().manual_seed(7)
    bs, nblocks, ctx, new = CASES["mixed"]
    kp, vp, q, batch, ref = random_batch(g, bs, nblocks, ctx, new, dtype=torch.bfloat16)
    plan = be.plan_paged(batch, heads=8, kv_heads=4, head_dim=32, num_blocks=nblocks)
    assert rel(be.paged(plan, q, kp, vp), ref) < 2e-2
    before = be.stats().get("compiled_graphs")
    kp, vp, q, batch, ref = random_batch(g, bs, nblocks, [5, 9, 0, 70, 3], [1, 33, 2, 1, 1], dtype=torch.bfloat16)
    plan = be.plan_paged(batch, heads=8, kv_heads=4, head_dim=32, num_blocks=nblocks)
    assert rel(be.paged(plan, q, kp, vp), ref) < 2e-2
    assert be.stats().get("compiled_graphs") == before


@pytest.mark.parametrize("name", cpu_backends())
def test_calibration_closures_compute_attention(name):
    """The closures calibration times compute attention: contiguous decode and prefill of each backend
    give outputs of the right shape, finite."""
    be = backend(name)
    g = torch.Generator().manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    for calls in (
        be.decode_contiguous_calls(randn, 2, 3, 40, 8, 4, 32),
        be.decode_paged_calls(randn, 0, 2, 3, 40, 8, 4, 32, 16),
        be.prefill_calls(randn, 0, 2, 2, 24, 8, 4, 32),
    ):
        assert len(calls) == 2
        for c in calls:
            o = c()
            assert torch.isfinite(o).all() and o.shape[-1] == 32


@pytest.mark.parametrize("name", [n for n in cpu_backends() if n != "sdpa"])
def test_engine_tokens_same_on_every_backend(name):
    """The reference engine's paged layout on each backend: mixed batches with chunked prefill and a
    preemption give every request the tokens the sdpa engine gives (the same greedy decode)."""
    from sim.catalog import GPUS
    from sim.cost.model import RooflineCostModel

    torch.set_num_threads(1)
    net = Transformer(TINY, "fp32", "cpu", seed=0)
    cfg = EngineConfig(
        TINY,
        num_blocks=11,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=48,
        allocator="paged",
        max_model_len=160,
        seed=3,
    )
    trace = [(0.0, 70, 9), (0.001, 33, 12), (0.002, 90, 6), (0.02, 5, 10), (0.03, 60, 8)]
    cost = RooflineCostModel(TINY, GPUS["cpu"])
    ref = Engine(cfg, model=net, attention=backend("sdpa")).run(trace, clock="virtual", cost=cost)
    got = Engine(cfg, model=net, attention=backend(name)).run(trace, clock="virtual", cost=cost)
    assert ref.preemptions() > 0
    assert [r["output_ids"] for r in got.requests] == [r["output_ids"] for r in ref.requests]


# --- selection and errors ---------------------------------------------------------------------------


def test_auto_on_cpu_is_sdpa_and_flex_runs_here():
    assert AB.select("auto", "cpu") == "sdpa"
    assert {"sdpa", "flex"} <= set(cpu_backends())
    why = AB.availability("cpu")
    assert "CUDA" in why["flashinfer"] and "CUDA" in why["vllm"]


def _fake(name, *, available=True, version="0.0-fake", bad_block=None):
    def unavailable(cls, kind):
        return None if available else f"{name} is not installed"

    def block_size_problem(self, bs):
        return "too small" if bad_block and bs == bad_block else None

    return type(
        f"Fake{name}",
        (AB.SdpaBackend,),
        {
            "name": name,
            "unavailable": classmethod(unavailable),
            "version": lambda self: version,
            "block_size_problem": block_size_problem,
        },
    )


def test_auto_order_on_cuda():
    """auto on CUDA: flashinfer, else vllm, else flex; an explicit unavailable choice names why and what is."""
    reg = {"sdpa": AB.SdpaBackend, "flex": _fake("flex"), "flashinfer": _fake("flashinfer"), "vllm": _fake("vllm")}
    assert AB.select("auto", "cuda", reg) == "flashinfer"
    reg["flashinfer"] = _fake("flashinfer", available=False)
    assert AB.select("auto", "cuda", reg) == "vllm"
    reg["vllm"] = _fake("vllm", available=False)
    assert AB.select("auto", "cuda", reg) == "flex"
    with pytest.raises(ConfigError) as e:
        AB.select("vllm", "cuda", reg)
    assert "calibrate.kernels" in str(e.value) and "vllm is not installed" in str(e.value) and "flex" in str(e.value)


def test_unknown_and_unavailable_kernels():
    with pytest.raises(ConfigError, match="calibrate.kernels.*triton.*auto, flex, flashinfer, vllm, sdpa"):
        AB.select("triton", "cpu")
    with pytest.raises(ConfigError, match="flashinfer.*CUDA only.*available: sdpa, flex"):
        AB.select("flashinfer", "cpu")


def test_block_size_limits():
    cuda = torch.device("cuda")
    assert AB.FlexBackend(torch, cuda, compile=False).block_size_problem(8)
    assert AB.FlexBackend(torch, cuda, compile=False).block_size_problem(16) is None
    assert AB.FlexBackend(torch, torch.device("cpu"), compile=False).block_size_problem(8) is None
    assert (
        AB.VllmBackend(torch, cuda).block_size_problem(8) and AB.VllmBackend(torch, cuda).block_size_problem(32) is None
    )
    assert AB.FlashInferBackend(torch, cuda).dtype_problem(torch.float32)


def test_paged_batch_checks():
    with pytest.raises(ValueError, match="40 \\+ 1 KV tokens do not fit a table of 2 blocks of 16"):
        AB.PagedBatch.of([[1, 2]], [40], [1], 16)
    b = AB.PagedBatch.of([[4, 5, 6]], [17], [2], 16)
    assert b.kv_lens == (19,) and b.blocks_used(0) == (4, 5)


def test_engine_rejects_a_block_size_its_backend_cannot_use():
    reg = {"sdpa": _fake("sdpa", bad_block=8)}
    cfg = EngineConfig(TINY, num_blocks=8, block_size=8, kernels="sdpa")
    with pytest.raises(ConfigError, match="engine.kernels.*block 8.*too small"):
        Engine(cfg, attention=AB.make("sdpa", torch, "cpu", registry=reg))


# --- FlashInfer and vLLM argument building, against stand-ins of their documented calls ------------


def _reference_pages(q, k_cache, v_cache, pages, kv_len, causal_queries: int, scale):
    """Attention of ``q`` [n, H, d] over the first ``kv_len`` tokens of ``pages`` (NHD pages)."""
    kvh, d = k_cache.shape[2:]
    k = k_cache[pages].reshape(-1, kvh, d)[:kv_len]
    v = v_cache[pages].reshape(-1, kvh, d)[:kv_len]
    return chunk_attention(q, k, v, kv_len - causal_queries, scale)


class _FakeFlashInferDecode:
    """BatchDecodeWithPagedKVCacheWrapper as documented: request b reads pages
    ``indices[indptr[b]:indptr[b+1]]``, all of them full but the last, which holds ``last_page_len``."""

    def __init__(self, workspace, layout):
        assert layout == "NHD"

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
        self.p = (indptr.tolist(), indices.tolist(), last_page_len.tolist(), page_size, kw)
        assert all(1 <= x <= page_size for x in self.p[2])

    def run(self, q, kv):
        indptr, indices, last, ps, kw = self.p
        out = []
        for b in range(len(indptr) - 1):
            pages = indices[indptr[b] : indptr[b + 1]]
            out.append(
                _reference_pages(q[b : b + 1], kv[0], kv[1], pages, (len(pages) - 1) * ps + last[b], 1, kw["sm_scale"])
            )
        return torch.cat(out)


class _FakeFlashInferPrefill(_FakeFlashInferDecode):
    """BatchPrefillWithPagedKVCacheWrapper: request b's queries ``q[qo_indptr[b]:qo_indptr[b+1]]``, causal
    aligned to the end of its KV."""

    def plan(self, qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
        assert kw["causal"] is True
        super().plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw)
        self.qo = qo_indptr.tolist()

    def run(self, q, kv):
        indptr, indices, last, ps, kw = self.p
        out = []
        for b in range(len(indptr) - 1):
            pages = indices[indptr[b] : indptr[b + 1]]
            n = self.qo[b + 1] - self.qo[b]
            out.append(
                _reference_pages(
                    q[self.qo[b] : self.qo[b + 1]],
                    kv[0],
                    kv[1],
                    pages,
                    (len(pages) - 1) * ps + last[b],
                    n,
                    kw["sm_scale"],
                )
            )
        return torch.cat(out)


def _fake_flash_attn_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    seqused_k=None,
    cu_seqlens_k=None,
    block_table=None,
):
    """FlashAttention's varlen call as vLLM documents it: request b's queries ``q[cu_q[b]:cu_q[b+1]]``;
    with a block table its KV is ``seqused_k[b]`` tokens through ``block_table[b]`` in the
    ``[blocks, block_size, kv_heads, d]`` caches, else ``k[cu_k[b]:cu_k[b+1]]``; causal bottom-right."""
    assert causal and max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    cq = cu_seqlens_q.tolist()
    out = []
    for b in range(len(cq) - 1):
        n = cq[b + 1] - cq[b]
        if block_table is not None:
            L = int(seqused_k[b])
            assert L <= max_seqlen_k
            pages = block_table[b, : -(-L // k.shape[1])].tolist()
            out.append(_reference_pages(q[cq[b] : cq[b + 1]], k, v, pages, L, n, softmax_scale))
        else:
            ck = cu_seqlens_k.tolist()
            out.append(
                chunk_attention(
                    q[cq[b] : cq[b + 1]],
                    k[ck[b] : ck[b + 1]],
                    v[ck[b] : ck[b + 1]],
                    ck[b + 1] - ck[b] - n,
                    softmax_scale,
                )
            )
    return torch.cat(out)


@pytest.mark.parametrize("case", ["decode", "chunks, block 32", "decode, block 8"])
def test_flashinfer_arguments(case):
    """FlashInfer's plan gets page indptr, indices and last-page lengths that read each sequence's own KV."""
    be = AB.FlashInferBackend(torch, torch.device("cpu"))
    be._fi = types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=_FakeFlashInferDecode,
        BatchPrefillWithPagedKVCacheWrapper=_FakeFlashInferPrefill,
        __version__="fake",
    )
    bs, nblocks, ctx, new = CASES[case]
    kp, vp, q, batch, ref = random_batch(torch.Generator().manual_seed(5), bs, nblocks, ctx, new)
    plan = be.plan_paged(batch, heads=8, kv_heads=4, head_dim=32, num_blocks=nblocks, dtype=torch.float32)
    assert rel(be.paged(plan, q, kp, vp), ref) < 1e-5


@pytest.mark.parametrize("case", ["decode", "chunks", "mixed"])
def test_vllm_arguments(case):
    """vLLM's varlen FlashAttention call gets cumulative query lengths, seqused_k and a block table that
    read each sequence's own KV (decode and chunks in one call); the contiguous call reads cu_seqlens_k."""
    be = AB.VllmBackend(torch, torch.device("cpu"))
    be._fn = _fake_flash_attn_varlen
    bs, nblocks, ctx, new = CASES[case]
    kp, vp, q, batch, ref = random_batch(torch.Generator().manual_seed(6), bs, nblocks, ctx, new)
    plan = be.plan_paged(batch, heads=8, kv_heads=4, head_dim=32, num_blocks=nblocks)
    assert rel(be.paged(plan, q, kp, vp), ref) < 1e-5
    g = torch.Generator().manual_seed(1)
    calls = be.decode_contiguous_calls(lambda *s: torch.randn(*s, generator=g), 1, 3, 20, 8, 4, 32)
    assert calls[0]().shape == (3, 8, 32)


def test_engine_chunks_follow_decode_rows():
    """The engine hands a backend its decode rows and its chunks' rows as two paged calls whose queries
    are the batch's first D rows and the rest (the order execute() lays tokens out in)."""
    seen = []

    class Recording(AB.SdpaBackend):
        def paged(self, plan, q, k_pool, v_pool, scale=None):
            seen.append(("chunks" if plan.chunks else "decode", q.shape[0]))
            return super().paged(plan, q, k_pool, v_pool, scale)

    net = Transformer(TINY, "fp32", "cpu", seed=0)
    cfg = EngineConfig(TINY, num_blocks=40, block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    eng = Engine(cfg, model=net, attention=Recording(torch, torch.device("cpu")))
    from sim.catalog import GPUS
    from sim.cost.model import RooflineCostModel

    eng.run([(0.0, 20, 3), (0.0, 90, 2)], clock="virtual", cost=RooflineCostModel(TINY, GPUS["cpu"]))
    layers = TINY.layers
    assert ("chunks", 64) in seen and ("decode", 1) in seen
    # the second iteration: the first request's decode row, then the other prompt's last 46 tokens
    assert seen.count(("chunks", 46)) == layers and seen.count(("decode", 1)) >= layers


def test_engine_warms_its_backend_up_once_before_timing():
    """A compiling backend runs every shape an engine can form before the engine's first timed
    iteration, once per engine, with the engine's limits; flex's shapes: one query per row for
    decode rows (1 … max_num_seqs) and 16-token tiles for chunk rows."""
    calls = []

    class Counting(AB.SdpaBackend):
        def warm_up(self, k_pool, v_pool, **kw):
            calls.append(kw)
            return 7

    net = Transformer(TINY, "fp32", "cpu", seed=0)
    cfg = EngineConfig(TINY, num_blocks=40, block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    eng = Engine(cfg, model=net, attention=Counting(torch, torch.device("cpu")))
    from sim.catalog import GPUS
    from sim.cost.model import RooflineCostModel

    for _ in range(2):
        eng.run([(0.0, 20, 2)], clock="virtual", cost=RooflineCostModel(TINY, GPUS["cpu"]))
    assert len(calls) == 1 and calls[0]["max_seqs"] == 4 and calls[0]["max_tokens"] == 64
    # flex rounds an engine's pool up to a power of two (the allocator hands out num_blocks only)
    flex = AB.FlexBackend(torch, torch.device("cpu"), compile=False)
    assert flex.pool_blocks(40) == 64 and AB.SdpaBackend(torch, torch.device("cpu")).pool_blocks(40) == 40
    assert Engine(cfg, model=net, attention=flex).k_cache[0].shape[0] == 64
    assert AB.pow2_upto(4) == [1, 2, 4] and AB.pow2_upto(64 // 16 + 4) == [1, 2, 4, 8]


@pytest.mark.parametrize("heads, kv_heads", [(8, 4), (32, 8), (64, 8), (32, 32)])
@pytest.mark.parametrize("case", ["decode", "mixed"])
def test_flex_query_block_fits_inductors_decoding_tile(heads, kv_heads, case):
    """Inductor's flex decoding kernel (torch/_inductor/kernel/flex/flex_decoding.py) packs a row's
    ``qlen`` queries of one KV head's ``G`` query heads into a tile of BLOCK_M = max(16, next power of
    two >= qlen x G) rows and keeps only configs whose BlockMask query block is a multiple of it: with
    a 16-row block, Llama-3.1-8B's 16-query prefill tiles (G = 4) found no config and failed to compile
    on an H200. The plan's query block is such a multiple, and the paged result is unchanged."""
    g = torch.Generator().manual_seed(3)
    bs, nblocks, ctx, new = CASES[case]
    kp, vp, q, batch, ref = random_batch(g, bs, nblocks, ctx, new, kv_heads=kv_heads, heads=heads, head_dim=16)
    be = backend("flex")
    plan = be.plan_paged(batch, heads=heads, kv_heads=kv_heads, head_dim=16, num_blocks=nblocks)
    qlen, group = plan.qlen, heads // kv_heads
    block_m = max(16, 1 << (qlen * group - 1).bit_length())
    assert plan.block_mask.BLOCK_SIZE[0] % block_m == 0
    assert rel(be.paged(plan, q, kp, vp), ref) < 1e-5
