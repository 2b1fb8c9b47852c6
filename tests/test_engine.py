"""End-to-end behaviour of the simulator."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import TINY_MIXED, tiny_scenario
from sim.config import load_scenario
from sim.engine.cluster import simulate
from sim.output.results import write_run


def _check_accounting(res, n):
    req = res.requests
    assert req.num_rows == n, "a request vanished"
    ids = sorted(req["id"].to_pylist())
    assert ids == list(range(n))
    for status, reason in zip(req["status"].to_pylist(), req["reason"].to_pylist()):
        assert status in ("completed", "rejected")
        if status == "rejected":
            assert reason, "rejected without a reason"
    ts = res.timeseries
    used = np.asarray(ts["kv_used_bytes"])
    reserved = np.asarray(ts["kv_reserved_bytes"])
    cap = np.asarray(ts["kv_capacity_bytes"])
    free = np.asarray(ts["kv_free_bytes"])
    assert (used <= reserved).all() and (reserved <= cap).all()
    assert (reserved + free == cap).all()


@pytest.mark.parametrize("kind", ["paged", "static"])
def test_every_request_ends_completed_or_rejected(kind):
    sc = tiny_scenario(
        **{
            "allocator.kind": kind,
            "allocator.reserve": "p60",
            "workload.lengths.output_max": 700,
            "workload.num_requests": 120,
        }
    )
    res = simulate(sc)
    _check_accounting(res, 120)
    s = res.summary
    assert s["completed"] + s["rejected"] == 120
    if kind == "static":
        assert s["rejected_by_reason"].get("exceeds_reservation", 0) > 0
    assert s["rejected_by_reason"].get("exceeds_max_model_len", 0) > 0  # 400 + 700 > 1024 for some


def test_truncate_policy_completes_overflowing_requests():
    sc = tiny_scenario(**{"allocator.kind": "static", "allocator.reserve": "p50", "allocator.overflow": "truncate"})
    res = simulate(sc)
    s = res.summary
    assert s["truncated"] > 0
    assert "exceeds_reservation" not in s["rejected_by_reason"]
    req = res.requests.to_pydict()
    for g, o, trunc, status in zip(req["generated_tokens"], req["output_tokens"], req["truncated"], req["status"]):
        if status == "completed":
            assert (g < o) == trunc


def test_same_seed_gives_byte_identical_summary(tmp_path):
    sc = load_scenario("chat-api", {"workload.num_requests": 300})
    a = write_run(simulate(sc), tmp_path / "a")
    b = write_run(simulate(sc), tmp_path / "b")
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    other = write_run(simulate(load_scenario("chat-api", {"workload.num_requests": 300, "seed": 2})), tmp_path / "c")
    assert (a / "summary.json").read_bytes() != (other / "summary.json").read_bytes()


def test_request_longer_than_max_model_len_is_rejected_with_reason():
    sc = tiny_scenario(
        **{
            "workload.lengths": {"kind": "fixed", "prompt_tokens": 1000, "output_tokens": 100},
            "workload.num_requests": 5,
        }
    )
    res = simulate(sc)
    assert res.summary["rejected_by_reason"] == {"exceeds_max_model_len": 5}


def test_paged_attention_finding_reproduces():
    """ShareGPT lengths, reservation at max_model_len: static holds 20–40% real tokens, paged ≥ 95%."""
    over = {
        "workload.num_requests": 600,
        "workload.max_model_len": 8192,
        "workload.arrival.rate": 4.0,
        "workload.lengths.path": "traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    }
    static = simulate(
        load_scenario("chat-api", {**over, "allocator.kind": "static", "allocator.reserve": "max_model_len"})
    )
    paged = simulate(load_scenario("chat-api", {**over, "allocator.kind": "paged", "allocator.block_size": 16}))
    u_static = static.summary["kv_token_utilization"]
    u_paged = paged.summary["kv_token_utilization"]
    assert 0.20 <= u_static <= 0.40, f"static kv_token_utilization {u_static:.3f}"
    assert u_paged >= 0.95, f"paged kv_token_utilization {u_paged:.3f}"


def test_closed_loop_keeps_concurrency():
    sc = tiny_scenario(
        **{
            "workload.arrival": {"kind": "closed_loop", "concurrency": 4, "think_time_s": 0.0},
            "workload.num_requests": 40,
        }
    )
    res = simulate(sc)
    _check_accounting(res, 40)
    running = np.asarray(res.timeseries["running"]) + np.asarray(res.timeseries["waiting"])
    assert running.max() <= 4


def test_gamma_and_trace_arrivals_run():
    g = simulate(tiny_scenario(**{"workload.arrival": {"kind": "gamma", "rate": 20.0, "cv": 3.0}}))
    _check_accounting(g, 60)
    sc = load_scenario(
        "chat-api",
        {
            "workload.arrival": {"kind": "trace", "path": "traces/AzureLLMInferenceTrace_code.csv", "time_scale": 0.5},
            "workload.lengths": None,
            "workload.num_requests": 200,
        },
    )
    res = simulate(sc)
    _check_accounting(res, 200)
    arr = np.asarray(res.requests["arrival_s"])
    assert arr.min() == 0.0 and arr.max() < 3600 * 0.5


def test_preemption_happens_under_memory_pressure_and_everything_finishes():
    sc = tiny_scenario(
        kv_tokens=1200,
        **{
            "workload.num_requests": 80,
            "workload.arrival.rate": 50.0,
            "workload.lengths.output_max": 500,
            "workload.lengths.prompt_max": 500,
        },
    )
    res = simulate(sc)
    assert res.summary["preemptions"] > 0
    _check_accounting(res, 80)
    assert res.summary["completed"] + res.summary["rejected"] == 80


# --- fast-forward equals per-iteration stepping ------------------------------------------


def _compare(a, b):
    ra, rb = a.requests.to_pydict(), b.requests.to_pydict()
    for col in ra:
        if col.endswith("_s"):
            x, y = np.asarray(ra[col], float), np.asarray(rb[col], float)
            assert np.allclose(x, y, rtol=1e-9, atol=1e-12), f"{col} differs: max {np.max(np.abs(x - y))}"
        else:
            assert ra[col] == rb[col], f"{col} differs"
    for key in (
        "completed",
        "rejected",
        "preemptions",
        "iterations",
        "rejected_by_reason",
        "allocator_refusals",
        "allocation_events",
        "zero_fill_bytes",
        "copy_bytes",
        "swaps_out",
        "swaps_in",
        "stranded_refusals",
    ):
        assert a.summary[key] == b.summary[key], key
    for key in ("kv_token_utilization", "kv_memory_utilization", "allocation_time_s", "admissions_paused_s"):
        assert a.summary[key] == pytest.approx(b.summary[key], rel=1e-9)
    # The time-average of external fragmentation: inside a window it moves as the pool's free
    # blocks shrink (hybrid_tail), as stepping sees it each iteration.
    assert a.summary["kv_external_fragmentation"] == pytest.approx(
        b.summary["kv_external_fragmentation"], rel=1e-9, abs=1e-12
    )
    # Moves between regions (hybrid_tail, static with a fallback) and the length predictor's confusion.
    for key in ("length_predictor", "fallback_entries", "fallback_moves", "fallback_copy_bytes", "fallback_evictions"):
        assert a.summary.get(key) == b.summary.get(key), key
    assert max(a.timeseries["kv_used_bytes"].to_pylist()) == max(b.timeseries["kv_used_bytes"].to_pylist())
    # The peak reservation: a sliding window's blocks slide out inside a fast-forward window, so its
    # end state can be below the peak that stepping records (the _max column keeps it).
    assert max(a.timeseries["kv_reserved_bytes_max"].to_pylist()) == max(
        b.timeseries["kv_reserved_bytes_max"].to_pylist()
    )
    if a.scenario.model.sliding_window is None and a.scenario.model.hf_config is None:
        assert max(a.timeseries["kv_reserved_bytes"].to_pylist()) == max(b.timeseries["kv_reserved_bytes"].to_pylist())


@settings(max_examples=150)
@given(
    kind=st.sampled_from(["paged", "static", "dynamic", "hybrid_tail", "hybrid_reserve"]),
    kv=st.integers(1100, 6000),
    rate=st.floats(2.0, 80.0),
    seed=st.integers(0, 10_000),
    chunked=st.booleans(),
    block=st.sampled_from([1, 8, 16, 32]),
    replicas=st.integers(1, 2),
    reserve=st.sampled_from(["max_model_len", "p80"]),
    closed=st.booleans(),
    budget=st.sampled_from([8, 256, 512]),
    reuse=st.sampled_from(["generation", "zero"]),
    swap=st.booleans(),
    growth=st.sampled_from(["token", "chunk"]),
    placement=st.sampled_from(["first_fit", "best_fit"]),
    victim=st.sampled_from(["lifo", "lowest_priority"]),
    mixed=st.booleans(),
    predictor=st.sampled_from(["oracle", "prompt", "quantile"]),
    overflow=st.sampled_from(["reject", "truncate", "fallback"]),
    ahead=st.booleans(),
    lag=st.sampled_from([0, 0, 1, 2]),
    cap=st.sampled_from([None, None, 1, 3]),
)
def test_fast_forward_equals_stepping(
    kind,
    kv,
    rate,
    seed,
    chunked,
    block,
    replicas,
    reserve,
    closed,
    budget,
    reuse,
    swap,
    growth,
    placement,
    victim,
    mixed,
    predictor,
    overflow,
    ahead,
    lag,
    cap,
):
    kv = max(kv, {"hybrid_tail": 2200, "hybrid_reserve": 1400}.get(kind, 0))  # room for one max-length request
    if mixed and overflow == "fallback":
        overflow = "truncate"  # the fallback region holds one KV layout: refused with layer groups (test_layer_groups)
    if overflow == "fallback":
        reserve = "p80"  # a max_model_len reservation never overflows (and leaves no room for the region)
    over = {
        "allocator.kind": kind,
        "allocator.block_size": block,
        "allocator.reserve": reserve,
        "seed": seed,
        "allocator.length_predictor": predictor,
        "allocator.overflow": overflow,
        "allocator.fallback_fraction": 0.3,
        "allocator.page_reuse": reuse,
        "allocator.preemption.mode": "swap" if swap else "recompute",
        "allocator.preemption.swap_capacity_bytes": 3000 * 2048,
        "allocator.growth": growth,
        "allocator.chunk_tokens": 64,
        "allocator.placement": placement,
        "allocator.static_fraction": 0.5,
        "allocator.long_threshold": "p80",
        "allocator.preemption.victim": victim,
        "workload.priority.high_fraction": 0.5,
        "workload.arrival.rate": rate,
        "scheduler.chunked_prefill": chunked,
        "gpu.replicas": replicas,
        "workload.num_requests": 40,
        "scheduler.max_num_batched_tokens": 512 if not chunked else budget,
    }
    if closed:
        over["workload.arrival"] = {"kind": "closed_loop", "concurrency": 6, "think_time_s": rate / 100}
    elif cap is not None:  # the client's cap: sends wait for requests to end, inside windows as between steps
        over["workload.arrival.max_concurrency"] = cap
    if ahead:  # batches formed one iteration ahead (an overlap scheduler): arrivals join one later
        over["engine.kind"] = "vllm"
        over["engine.schedule_ahead"] = True
    if lag:  # first tokens held: released at iteration ends inside windows as between steps
        over["engine.kind"] = "vllm"
        over["engine.first_token_lag"] = lag
    if mixed:  # sliding-window layers (window 64) beside full-attention ones: KV and attention per layer group
        over["model"] = {"hf_config": str(TINY_MIXED)}
    ff = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "fast_forward"}))
    step = simulate(tiny_scenario(kv_tokens=kv, **over, **{"engine.mode": "step"}))
    _compare(ff, step)


def _same_summary(a, b, path=""):
    """Equal summaries, floats to rounding (a window sums its iterations' times in another order)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            _same_summary(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


@pytest.mark.parametrize("overflow", ["reject", "truncate"])
def test_reservation_overflow_frees_memory_for_the_queue_at_once(overflow):
    """A static reservation outgrown inside a decode window is freed then: the waiting request is
    admitted at the next iteration, as stepping admits it, not at the window's end."""
    from sim.config import scenario_from_dict

    base = {
        "name": "overflow-frees",
        "model": {"name": "tiny-llama"},
        "gpu": {"name": "cpu", "kv_cache_tokens": 512},
        "workload": {
            "num_requests": 3,
            "max_model_len": 512,
            "arrival": {"kind": "closed_loop", "concurrency": 64},
            "lengths": {"kind": "lognormal", "prompt_median": 58.7, "output_sigma": 0.5},
        },
        "scheduler": {"mixed_batches": False},
        # The median of these three requests' lengths: one of them outgrows it while decoding.
        "allocator": {"kind": "static", "reserve": 253, "overflow": overflow},
    }
    runs = {}
    for mode in ("fast_forward", "step"):
        runs[mode] = simulate(scenario_from_dict({**base, "engine": {"mode": mode}}))
    ff, step = runs["fast_forward"].summary, runs["step"].summary
    if overflow == "reject":
        assert ff["rejected_by_reason"] == {"exceeds_reservation": 1}
    else:
        assert ff["truncated"] == 1
    # The mode's own bookkeeping aside (events, windows, cost-model calls), the summaries agree.
    skip = {"engine_mode", "sim_events", "windows", "cost_model_out_of_range"}
    _same_summary({k: v for k, v in ff.items() if k not in skip}, {k: v for k, v in step.items() if k not in skip})
    _compare(runs["fast_forward"], runs["step"])


def test_fast_forward_exercises_preemption_and_chunking():
    over = {
        "workload.num_requests": 80,
        "workload.arrival.rate": 50.0,
        "workload.lengths.output_max": 500,
        "workload.lengths.prompt_max": 500,
    }
    ff = simulate(tiny_scenario(kv_tokens=1200, **over))
    step = simulate(tiny_scenario(kv_tokens=1200, **over, **{"engine.mode": "step"}))
    assert ff.summary["preemptions"] > 0
    _compare(ff, step)
    assert ff.summary["sim_events"] < step.summary["sim_events"]


@pytest.mark.parametrize("mode", ["fast_forward", "step"])
def test_sliding_window_caps_paged_memory(mode):
    """mistral-7b (window 4096): a long sequence's blocks stop growing at the window."""
    over = {
        "model.name": "mistral-7b",
        "workload.max_model_len": 16384,
        "workload.num_requests": 6,
        "workload.lengths": {"kind": "fixed", "prompt_tokens": 6000, "output_tokens": 300},
        "workload.arrival.rate": 100.0,
        "engine.mode": mode,
    }
    res = simulate(load_scenario("chat-api", over))
    _check_accounting(res, 6)
    bpt = res.summary["kv_bytes_per_token"]
    peak_used = max(res.timeseries["kv_used_bytes"].to_pylist()) / bpt
    peak_reserved = max(res.timeseries["kv_reserved_bytes"].to_pylist()) / bpt
    assert peak_used <= 6 * 4096, peak_used
    assert peak_reserved <= 6 * (4096 + 2 * 16), peak_reserved
    full = simulate(load_scenario("chat-api", {**over, "model.name": "llama-3.1-8b"}))
    assert max(full.timeseries["kv_used_bytes"].to_pylist()) / bpt > 6 * 6000


def test_sliding_window_fast_forward_equals_stepping():
    over = {
        "model.name": "mistral-7b",
        "workload.max_model_len": 9000,
        "workload.num_requests": 30,
        "workload.lengths": {
            "kind": "uniform",
            "prompt_min": 100,
            "prompt_max": 6000,
            "output_min": 1,
            "output_max": 300,
        },
        "workload.arrival.rate": 50.0,
        "gpu.gpu_memory_utilization": 0.27,
    }
    ff = simulate(load_scenario("chat-api", over))
    step = simulate(load_scenario("chat-api", {**over, "engine.mode": "step"}))
    _compare(ff, step)


def test_mixed_layers_fast_forward_equals_stepping():
    """gpt-oss's layout (window 128 on half the layers) under memory pressure: preemptions, long prompts."""
    over = {
        "model": {"hf_config": str(TINY_MIXED.parent / "dense-gpt-oss-layout_config.json")},
        "workload.max_model_len": 9000,
        "workload.num_requests": 30,
        "gpu.kv_cache_tokens": 12_000,
        "workload.lengths": {
            "kind": "uniform",
            "prompt_min": 100,
            "prompt_max": 6000,
            "output_min": 1,
            "output_max": 300,
        },
        "workload.arrival.rate": 50.0,
    }
    ff = simulate(load_scenario("chat-api", over))
    step = simulate(load_scenario("chat-api", {**over, "engine.mode": "step"}))
    assert ff.summary["preemptions"] > 0
    _compare(ff, step)


def test_sampled_timeseries_keeps_peaks_and_streams_to_parquet(tmp_path):
    sc = load_scenario("chat-api", {"workload.num_requests": 400})
    full = simulate(sc)
    sampled = simulate(
        load_scenario("chat-api", {"workload.num_requests": 400, "timeseries.every_s": 2.0}), out_dir=tmp_path
    )
    assert (tmp_path / "requests.parquet").is_file() and (tmp_path / "timeseries.parquet").is_file()
    ts_full, ts = full.timeseries, sampled.timeseries
    assert ts.num_rows < ts_full.num_rows / 5
    assert max(ts["kv_used_bytes_max"].to_pylist()) == max(ts_full["kv_used_bytes"].to_pylist())
    assert max(ts["kv_reserved_bytes_max"].to_pylist()) == max(ts_full["kv_reserved_bytes"].to_pylist())
    assert max(ts["waiting_max"].to_pylist()) == max(ts_full["waiting"].to_pylist())
    assert sum(ts["iterations"].to_pylist()) == sum(ts_full["iterations"].to_pylist())
    # Requests streamed to disk equal the in-memory ones, and the summary does not depend on sampling.
    assert sampled.requests.equals(full.requests)
    assert {k: v for k, v in sampled.summary.items()} == full.summary


def test_prefill_apart_admits_a_prompt_only_when_all_of_it_fits():
    """SGLang-style prefill iterations (``mixed_batches: false``) under a KV pool that holds a prompt's
    first chunk but not the rest: admitting on the chunk alone preempted the request at its next chunk,
    readmitted it, and starved the decoders that would free memory, without end (70B on four L40S, six
    16K prompts, contiguous KV). Admitted only when the whole prompt fits, it waits for them instead."""
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.budget import RunBudget

    data, base = read_scenario_dict("long-context")
    over = {
        "engine.kind": "sglang",
        "gpu.name": "L40S",
        "workload.num_requests": 6,
        "workload.arrival.concurrency": 6,
    }
    sc = scenario_from_dict(apply_overrides(data, over), base_dir=base)
    assert sc.allocator.kind == "dynamic" and sc.scheduler.chunked_prefill
    res = simulate(sc, budget=RunBudget(None, 100_000, None, source="test"))
    assert res.summary["completed"] == 6
    _check_accounting(res, 6)


def _closed_loop_run(per_token_s=None, n=24):
    over = {
        "workload.arrival": {"kind": "closed_loop", "concurrency": 4},
        "workload.lengths": {"kind": "uniform", "prompt_min": 64, "prompt_max": 64, "output_min": 20, "output_max": 20},
        "workload.num_requests": n,
    }
    if per_token_s is not None:
        over["workload.arrival"]["completion_per_token_s"] = per_token_s
    return simulate(tiny_scenario(**over))


def _sends_after_completions(res, per_token_s):
    """What a serial reader of finished responses gives: the send time of every request after the
    first wave, from the finish times (each response waits for the ones finished before it)."""
    t = res.requests.to_pydict()
    order = sorted(range(len(t["id"])), key=lambda i: t["finish_s"][i])
    ready, out = 0.0, []
    for i in order:
        ready = max(t["finish_s"][i], ready) + per_token_s * t["output_tokens"][i]
        out.append(ready)
    return out


@pytest.mark.parametrize("per_token_s", [0.0, 2e-3])
def test_finished_responses_are_read_one_at_a_time_before_their_clients_send_again(per_token_s):
    res = _closed_loop_run(per_token_s)
    _check_accounting(res, 24)
    t = res.requests.to_pydict()
    later = sorted(a for i, a in zip(t["id"], t["arrival_s"]) if i >= 4)
    expect = _sends_after_completions(res, per_token_s)[: len(later)]
    assert later == pytest.approx(expect, abs=1e-9)
    if per_token_s:
        # The first wave finishes together; its clients send 40 ms apart, not together.
        assert np.diff(later[:4]) == pytest.approx([per_token_s * 20] * 3, abs=1e-9)


def test_completion_time_per_token_defaults_to_the_engine_and_the_scenario_wins():
    from sim.engine.deployment import with_engine_defaults

    sc = tiny_scenario(**{"workload.arrival": {"kind": "closed_loop", "concurrency": 4}, "engine.kind": "vllm"})
    assert with_engine_defaults(sc).workload.arrival.completion_per_token_s == 0.0
    sc = tiny_scenario(
        **{
            "workload.arrival": {"kind": "closed_loop", "concurrency": 4},
            "engine.kind": "vllm",
            "engine.completion_per_token_s": 1e-5,
        }
    )
    assert with_engine_defaults(sc).workload.arrival.completion_per_token_s == 1e-5
    sc = tiny_scenario(
        **{
            "workload.arrival": {"kind": "closed_loop", "concurrency": 4, "completion_per_token_s": 3e-5},
            "engine.kind": "vllm",
            "engine.completion_per_token_s": 1e-5,
        }
    )
    assert with_engine_defaults(sc).workload.arrival.completion_per_token_s == 3e-5
