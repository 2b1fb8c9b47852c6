"""The reference engine (calibration/engine.py) is a correct engine, and the simulator's
scheduler + allocators reproduce its schedule exactly when both run on the same clock."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibration.engine import (  # noqa: E402
    Engine,
    EngineConfig,
    EngineRequest,
    Transformer,
    chunk_attention,
    contiguous_attention,
    decode_plan,
    padded_block_tables,
    paged_decode_attention,
)
from calibration.validate import load_spec, make_requests, semantics_check, sim_scenario, write_trace  # noqa: E402
from sim.catalog import MODELS  # noqa: E402
from sim.engine.cluster import simulate  # noqa: E402
from sim.engine.deployment import Deployment  # noqa: E402

TINY = MODELS["tiny-llama"]


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def net():
    torch.set_num_threads(1)
    return Transformer(TINY, "fp32", "cpu", seed=0)


def test_decode_plan_reads_each_sequence_own_blocks():
    """On CPU a decode batch is read as one run of every sequence's own blocks, in table order, each
    sequence a span (first token, length) of it; CUDA, or no sequence, is one padded call (None); a
    length beyond its table is refused with the numbers."""
    assert decode_plan([[3, 1]], [20], 16, "cuda") is None and decode_plan([], [], 16) is None
    plan = decode_plan([[7, 2, 5], [0], [4, 6]], [40, 1, 17], 16)
    assert plan.blocks.tolist() == [7, 2, 5, 0, 4, 6]
    assert plan.spans == ((0, 40), (48, 1), (64, 17))
    with pytest.raises(ValueError, match="33 KV tokens do not fit a table of 2 blocks of 16"):
        decode_plan([[1, 2]], [33], 16)


def test_paged_attention_equals_contiguous():
    g = torch.Generator().manual_seed(0)
    B, KVH, d, H, nblocks = 16, 4, 32, 8, 64
    kp, vp = torch.randn(nblocks, B, KVH, d, generator=g), torch.randn(nblocks, B, KVH, d, generator=g)
    lens = [1, 17, 40, 100, 3]
    perm = torch.randperm(nblocks, generator=g).tolist()
    tables, ks, vs, at = [], [], [], 0
    for L in lens:
        n = -(-L // B)
        t = perm[at : at + n]
        at += n
        tables.append(t)
        ks.append(kp[t].reshape(-1, KVH, d)[:L].clone())  # the sequence's K as one contiguous tensor
        vs.append(vp[t].reshape(-1, KVH, d)[:L].clone())
    bt = padded_block_tables(tables)
    q = torch.randn(len(lens), H, d, generator=g)
    got = paged_decode_attention(q, kp, vp, bt, torch.tensor(lens))
    ref = contiguous_attention(q, ks, vs)
    assert rel(got, ref) < 1e-5
    # the CPU kernel: one gather of the sequences' own blocks, one SDPA per sequence: the same output
    plan = decode_plan(tables, lens, B)
    assert rel(paged_decode_attention(q, kp, vp, None, None, None, plan), ref) < 1e-5
    # and against plain math (softmax(q·k/sqrt(d))·v, GQA by repeating KV heads)
    for i in range(len(lens)):
        k, v = ks[i].repeat_interleave(H // KVH, 1), vs[i].repeat_interleave(H // KVH, 1)
        s = torch.einsum("hd,lhd->hl", q[i], k) / d**0.5
        o = torch.einsum("hl,lhd->hd", s.softmax(-1), v)
        assert rel(got[i], o) < 1e-5
    # every attention backend that runs here (calibration/attention_backends.py; flex eagerly, the
    # compiled kernel is tests/test_attention_backends.py's): the same paged call, the same output
    from calibration import attention_backends as AB

    batch = AB.PagedBatch.of(tables, [L - 1 for L in lens], [1] * len(lens), B)
    for name, why in AB.availability("cpu").items():
        if why is not None:
            continue
        be = (
            AB.FlexBackend(torch, torch.device("cpu"), compile=False) if name == "flex" else AB.make(name, torch, "cpu")
        )
        plan_ = be.plan_paged(batch, heads=H, kv_heads=KVH, head_dim=d, num_blocks=nblocks)
        assert rel(be.paged(plan_, q, kp, vp), ref) < 1e-5, name


def test_chunk_attention_with_context_equals_full_causal():
    g = torch.Generator().manual_seed(1)
    L, ctx, H, KVH, d = 70, 50, 8, 4, 32
    q, k, v = (
        torch.randn(L, H, d, generator=g),
        torch.randn(L, KVH, d, generator=g),
        torch.randn(L, KVH, d, generator=g),
    )
    full = chunk_attention(q, k, v, 0)
    part = chunk_attention(q[ctx:], k, v, ctx)
    assert rel(part, full[ctx:]) < 1e-5


def _prefill_logits(eng: Engine, prompt: list[int]):
    eng.reset()
    r = EngineRequest(0, 0.0, prompt, 4)
    eng.waiting.append(r)
    with torch.inference_mode():
        while r.computed < r.prompt:
            items, *_ = eng.schedule()
            eng.execute(items)
            for q, n in items:
                q.computed += n
    return eng.last_logits[0]


@pytest.mark.parametrize("allocator", ["paged", "static"])
def test_cached_forward_equals_no_cache_forward(net, allocator):
    # 150-token prompt in chunks of 64 (three iterations through the cache), block size 16
    cfg = EngineConfig(
        TINY,
        num_blocks=32,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        allocator=allocator,
        reserve=300,
        max_model_len=300,
    )
    eng = Engine(cfg, model=net)
    prompt = [random.Random(5).randrange(TINY.vocab) for _ in range(150)]
    got = _prefill_logits(eng, prompt)
    ref = net.reference_logits(prompt)
    assert rel(got, ref) < 1e-5


def _greedy(net, prompt, n):
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(net.reference_logits(seq).argmax())
        out.append(t)
        seq.append(t)
    return out


@pytest.mark.parametrize("allocator,num_blocks", [("paged", 64), ("paged", 9), ("static", 40)])
def test_batched_greedy_outputs_equal_reference(net, allocator, num_blocks):
    """Mixed batches (chunks + decodes), and with 9 blocks recompute preemptions: every request's
    tokens equal a no-cache greedy decode of its prompt."""
    from sim.catalog import GPUS
    from sim.cost.model import RooflineCostModel

    cfg = EngineConfig(
        TINY,
        num_blocks=num_blocks,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=48,
        allocator=allocator,
        reserve=160,
        max_model_len=160,
        seed=3,
    )
    eng = Engine(cfg, model=net)
    trace = [(0.0, 70, 9), (0.001, 33, 12), (0.002, 90, 6), (0.02, 5, 10), (0.03, 60, 8)]
    res = eng.run(trace, clock="virtual", cost=RooflineCostModel(TINY, GPUS["cpu"]))
    rng = random.Random(cfg.seed)
    prompts = [[rng.randrange(TINY.vocab) for _ in range(p)] for _, p, _ in trace]
    for row, prompt, (_, _, o) in zip(res.requests, prompts, trace):
        assert row["status"] == "completed" and row["generated_tokens"] == o
        assert row["output_ids"] == _greedy(net, prompt, o)
    if num_blocks == 14:
        assert res.preemptions() > 0


def test_wall_clock_run_records_iterations(net):
    cfg = EngineConfig(TINY, num_blocks=40, block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    # both at t = 0: with the second at 10 ms a fast moment of the host finished the first before it came (no overlap)
    res = Engine(cfg, model=net).run([(0.0, 40, 5), (0.0, 20, 3)], clock="wall", lead_s=0.0)
    assert all(r["status"] == "completed" for r in res.requests)
    for r in res.requests:
        assert r["arrival_s"] <= r["enqueued_s"] <= r["admitted_s"] < r["first_token_s"] <= r["finish_s"]
    its = res.iterations
    assert all(a["end_s"] <= b["start_s"] + 1e-9 for a, b in zip(its, its[1:]))
    assert sum(it["prefill_tokens"] for it in its) == 60
    assert res.peak_blocks() == 3 + 2  # ceil(44/16) + ceil(22/16): prompt + output - 1 slots at the end


@pytest.mark.parametrize("allocator", ["paged", "static"])
def test_cpu_norm_clock_scales_thread_time_by_the_probe(net, allocator):
    """cpu_norm: same tokens as any clock; each iteration lasts its thread CPU time x the probe's
    reference / median of the last probes (recorded), probes every ``probe_every_s`` of engine CPU."""
    from calibration.engine import SpeedProbe
    from sim.catalog import GPUS
    from sim.cost.model import RooflineCostModel

    cfg = EngineConfig(
        TINY,
        num_blocks=64,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        allocator=allocator,
        reserve=80,
        max_model_len=80,
    )
    eng = Engine(cfg, model=net)
    probe = SpeedProbe(cfg, net)
    assert probe.engine.mem is not eng.mem and probe.engine.k_cache[0] is not eng.k_cache[0]
    trace = [(0.0, 40, 6), (0.001, 20, 4), (0.002, 33, 5)]
    ref = eng.run(trace, clock="virtual", cost=RooflineCostModel(TINY, GPUS["cpu"]))
    res = eng.run(
        trace, clock="cpu_norm", probe=probe, probe_ref_s=2 * probe.measure(), probe_every_s=0.0, probe_window=3
    )
    assert [r["output_ids"] for r in res.requests] == [r["output_ids"] for r in ref.requests]
    probes = res.info["speed_probes"]
    assert len(probes) == 3 + len(res.iterations)  # 3 before the first iteration, then one per iteration
    for it in res.iterations:
        assert it["end_s"] - it["start_s"] == pytest.approx(it["cpu_s"] * it["speed_scale"], rel=1e-9, abs=1e-12)
        assert 0.5 < it["speed_scale"] < 8  # about 2 (reference = 2 x one probe)
    assert all(
        p["scale"]
        == pytest.approx(res.config["probe_ref_s"] / np.median([q["probe_s"] for q in probes[max(0, i - 2) : i + 1]]))
        for i, p in enumerate(probes)
    )
    assert all(it["after_probe"] for it in res.iterations)  # a probe before every iteration
    # probes only before the first iteration: only it follows one, as recorded and in the diagnostics rows
    once = eng.run(trace, clock="cpu_norm", probe=probe, probe_ref_s=2 * probe.measure(), probe_every_s=1e6)
    assert [it["after_probe"] for it in once.iterations] == [True] + [False] * (len(once.iterations) - 1)
    from calibration.kernels import engine_iteration_rows

    rows = engine_iteration_rows(once, RooflineCostModel(TINY, GPUS["cpu"]))
    assert [r["after_probe"] for r in rows] == [it["after_probe"] for it in once.iterations]
    assert "after_probe" not in engine_iteration_rows(ref, RooflineCostModel(TINY, GPUS["cpu"]))[0]
    with pytest.raises(ValueError, match="cpu_norm"):
        eng.run(trace, clock="cpu_norm")


def test_cpu_norm_prefill_probe(net):
    """With a prefill probe the factor of an iteration with prefill moves from the probe's toward the
    prefill probe's in proportion to its prefill tokens (prefill_weight); a decode iteration keeps
    the probe's. Each prefill probe runs right after a probe, with its own reference."""
    from calibration.engine import SpeedProbe, prefill_weight

    assert prefill_weight(0, 32, 128) == 0.0 and prefill_weight(32, 32, 128) == 0.0
    assert prefill_weight(80, 32, 128) == pytest.approx(0.5) and prefill_weight(256, 32, 128) == 1.0
    assert prefill_weight(40, 32, 32) == 1.0
    cfg = EngineConfig(
        TINY,
        num_blocks=64,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        allocator="paged",
        reserve=80,
        max_model_len=80,
    )
    eng = Engine(cfg, model=net)
    probe = SpeedProbe(cfg, net, chunks=((8, 16),))
    pre = SpeedProbe(cfg, net, decode_kv=(), chunks=((40, 0),))
    assert (probe.prefill_tokens, pre.prefill_tokens) == (8, 40)
    trace = [(0.0, 40, 6), (0.001, 20, 4), (0.002, 33, 5)]
    # references far apart so the two factors differ by ~4x whatever the host does
    res = eng.run(
        trace,
        clock="cpu_norm",
        probe=probe,
        probe_ref_s=probe.measure(),
        probe_every_s=0.0,
        prefill_probe=pre,
        prefill_probe_ref_s=4 * pre.measure(warm=False),
    )
    probes = res.info["speed_probes"]
    assert len(probes) == 3 + len(res.iterations) and all("prefill_scale" in p for p in probes)
    assert res.config["prefill_probe_shape"]["prefill_chunks"] == [[40, 0]]
    seen_prefill = seen_decode = False
    for it, p in zip(res.iterations, probes[3:]):  # the factors in force during each iteration
        w = prefill_weight(it["prefill_tokens"], 8, 40)
        assert it["speed_scale"] == pytest.approx(p["scale"] ** (1 - w) * p["prefill_scale"] ** w, rel=1e-9)
        seen_prefill |= w == 1.0 and it["speed_scale"] == pytest.approx(p["prefill_scale"])
        seen_decode |= not it["prefill_chunks"] and it["speed_scale"] == p["scale"]
    assert seen_prefill and seen_decode
    with pytest.raises(ValueError, match="prefill_probe_ref_s"):
        eng.run(trace, clock="cpu_norm", probe=probe, probe_ref_s=1.0, prefill_probe=pre)


def test_repredict_prices_stored_shapes_like_engine_iteration_rows(net):
    """An overhead row keeps its batch shape (prefill chunks with context, decode KV, allocation
    events), so re-pricing it against other kernel curves gives exactly what pricing the engine's
    iterations with them gives; rows stored without a shape are left alone."""
    from calibration.kernels import engine_iteration_rows, kernel_cost, repredict
    from calibration.validate import scale_profile
    from sim.cost.profile import load_profile

    prof = load_profile("cpu-reference")
    cfg = EngineConfig(
        TINY,
        num_blocks=64,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=48,
        allocator="paged",
        reserve=160,
        max_model_len=160,
    )
    res = Engine(cfg, model=net).run([(0.0, 70, 5), (0.0, 30, 8), (0.0, 100, 3)], clock="cpu", lead_s=0.0)
    a, b = kernel_cost(prof, TINY, "paged", 16), kernel_cost(scale_profile(prof, 1.7), TINY, "paged", 16)
    rows = engine_iteration_rows(res, a)
    assert any(len(r["chunks"]) > 1 or any(c[1] > 0 for c in r["chunks"]) for r in rows)  # chunked, with context
    want = engine_iteration_rows(res, b)
    got = repredict(rows, b, "cpu")
    assert [r["predicted_s"] for r in got] == [r["predicted_s"] for r in want]
    assert all(r["residual_s"] == r["cpu_s"] - r["predicted_s"] for r in got)
    assert all(x["predicted_s"] != y["predicted_s"] for x, y in zip(got, rows))
    assert [r["predicted_s"] for r in repredict(rows, a, "cpu")] == [r["predicted_s"] for r in rows]
    old = {k: v for k, v in rows[0].items() if k != "chunks"}
    assert repredict([old], b, "cpu_norm") == [old]


# --- the simulator reproduces the engine's schedule exactly (same clock) ------------------------------


def _spec(**over):
    spec = load_spec("scenarios/validate-cpu.yaml")
    for k, v in over.items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                setattr(getattr(spec, k), kk, vv)
        else:
            setattr(spec, k, v)
    return spec


def _semantics_case(tmp_path, allocator, rate, num_blocks, num_requests, output_max):
    """A spec (prompts 8-300, outputs 1-output_max, static reserve 400), its requests and their trace."""
    spec = _spec(
        kv={"num_blocks": num_blocks},
        workload={"num_requests": num_requests},
        static_reserve=400,
        allocators=[allocator],
    )
    spec.workload.max_model_len = 400
    spec.workload.lengths = {
        "kind": "uniform",
        "prompt_min": 8,
        "prompt_max": 300,
        "output_min": 1,
        "output_max": output_max,
    }
    rows = make_requests(spec, rate)
    return spec, rows, write_trace(rows, tmp_path / "t.csv")


@pytest.mark.parametrize("allocator", ["paged", "static"])
@pytest.mark.parametrize("rate,num_blocks", [(2.0, 256), (8.0, 256), (40.0, 256), (40.0, 60), (1e6, 80)])
def test_simulator_schedule_identical_to_engine(tmp_path, allocator, rate, num_blocks):
    """Engine on a virtual clock driven by the simulator's cost model (no compute): peak blocks,
    preemptions, iteration count and every request's admission / first token / finish are equal."""
    spec, rows, path = _semantics_case(tmp_path, allocator, rate, num_blocks, 60, 90)
    sc = sim_scenario(spec, allocator, trace_path=str(path), profile="none")
    sim = simulate(sc)
    cost = Deployment.from_scenario(sc).make_cost_model(sc)
    sem = semantics_check(spec, allocator, "cpu", rows, sim, cost)
    assert sem["identical"], sem
    if allocator == "paged" and num_blocks <= 80:
        assert sem["sim_preemptions"] > 0  # the check covers recompute preemption


@pytest.mark.parametrize("allocator", ["paged", "static"])
@pytest.mark.parametrize("rate,num_blocks", [(4.0, 256), (40.0, 256), (40.0, 60)])
def test_after_prefill_excess_same_in_engine_and_simulator(tmp_path, allocator, rate, num_blocks):
    """A profile with after_prefill_s (and per-count departures from its step-overhead line,
    per_seq_delta_s, and a per-decode cost in mixed iterations, mixed_per_decode_s): the simulator adds it to the first decode iterations after each prefill
    (fast-forward windows, cohort and stepping alike) and the engine's virtual clock does the same,
    so their schedules stay identical; and it is charged (the run is longer than without it)."""
    from sim.config import scenario_from_dict
    from sim.cost.profile import load_profile

    prof = load_profile("cpu-reference")
    plain_path = prof.write(tmp_path / "plain.json")
    prof.cpu_overhead = {
        **prof.cpu_overhead,
        "by_tp": {
            k: {
                **v,
                "after_prefill_s": [4e-3, 2e-3, 1e-3],
                "per_seq_delta_s": {"seqs": [1, 3, 6], "delta_s": [3e-4, -2e-4, 5e-4]},
                "mixed_per_decode_s": 2e-4,
            }
            for k, v in prof.cpu_overhead["by_tp"].items()
        },
    }
    after_path = prof.write(tmp_path / "after.json")
    spec, rows, path = _semantics_case(tmp_path, allocator, rate, num_blocks, 40, 60)
    runs = {}
    for name, prof_path in (("plain", plain_path), ("after", after_path)):
        sc = sim_scenario(spec, allocator, trace_path=str(path), profile=str(prof_path))
        runs[name] = sim = simulate(sc)
        cost = Deployment.from_scenario(sc).make_cost_model(sc)
        assert cost.after_prefill_s == ([4e-3, 2e-3, 1e-3] if name == "after" else [])
        sem = semantics_check(spec, allocator, "cpu", rows, sim, cost)
        assert sem["identical"], (name, sem)
        # stepping every iteration prices the same excess as the fast-forward windows
        step = simulate(scenario_from_dict({**sc.model_dump(), "engine": {**sc.engine.model_dump(), "mode": "step"}}))
        ff_req = sorted((r["id"], r["finish_s"]) for r in sim.requests.to_pylist())
        st_req = sorted((r["id"], r["finish_s"]) for r in step.requests.to_pylist())
        assert [r[0] for r in ff_req] == [r[0] for r in st_req]
        np.testing.assert_allclose([r[1] for r in ff_req], [r[1] for r in st_req], rtol=1e-9, atol=1e-12)
    ends = {k: max(r["finish_s"] for r in v.requests.to_pylist()) for k, v in runs.items()}
    assert ends["after"] > ends["plain"]


def test_static_mode_is_contiguous_first_fit():
    from calibration.engine import StaticArena

    a = StaticArena(100, 30, 16)
    assert [a.admit(i, 10) for i in range(4)] == ["ok", "ok", "ok", "no_space"]
    assert [a.owner[i] for i in range(3)] == [0, 30, 60]
    a.release(1)
    assert a.admit(5, 31) == "overflow" and a.admit(5, 30) == "ok" and a.owner[5] == 30
    assert a.grow(5, 31) == "overflow" and a.grow(5, 30) == "ok"
    assert a.reserved_tokens() == 90 and a.blocks_in_use() == 90 / 16
    np.testing.assert_equal(a.starts, [90])
