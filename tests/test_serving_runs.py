"""Benchmark rows as closed-loop kvsim runs: the server settings a row or aiconfigurator's generator
gives, the clients, the scenario of a row, its simulation and the scores.

Rows are tiny (a few clients, short prompts, a few requests per client) so the file runs in
seconds; the accuracy on the shipped training file is measured by ``kvsim validate --serving-bench
builtin --logo``, not here.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from _serving_helpers import FIXED, GOOD, HEADER, TINY, kvsim, row
from calibration.served_by import AIC_BUDGET_EXTRA, aiconfigurator_run, aiconfigurator_server
from calibration.serving_bench import (
    GPU_IDS,
    TRAINING_FILE,
    read_bench,
    read_csv,
)
from calibration.serving_fit import (
    builtin_terms,
    evaluate,
)
from calibration.serving_runs import Clients, RowResult, row_scenario, score, simulate_row
from calibration.serving_selection import (
    CLIENT_MODES,
    check_rows,
    clients_rows,
    served_by_line,
    served_by_rows,
    variant_lines,
)
from sim.config import APART_SPREAD_CYCLES, scenario_from_dict
from sim.engine.cluster import simulate
from sim.engine.deployment import engine_preset, with_engine_defaults
from sim.engine_presets import ENGINE_BLOCK_SIZE, PRESETS, default_kv
from sim.errors import ConfigError

# --- rows as scenarios -----------------------------------------------------------------------


def test_server_settings_columns_are_read_and_checked(tmp_path):
    p = tmp_path / "bench.csv"
    cols = "max_num_seqs,max_num_batched_tokens,mixed_batches,cuda_graph_max_batch,requests"
    p.write_text(f"{HEADER},{cols}\n{GOOD},2,2178,yes,2,20\n{GOOD},,,,,\n")
    a, b = read_csv(p)
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.mixed_batches, a.cuda_graph_max_batch, a.requests) == (
        2,
        2178,
        True,
        2,
        20,
    )
    assert (b.max_num_seqs, b.max_num_batched_tokens, b.mixed_batches, b.cuda_graph_max_batch, b.requests) == (
        None,
        None,
        None,
        None,
        None,
    )
    p.write_text(f"{HEADER},mixed_batches\n{GOOD},sometimes\n")
    with pytest.raises(ConfigError, match=r"bench\.csv: row 2, mixed_batches: got 'sometimes'; true or false"):
        read_csv(p)
    # A server that formed its batches ahead (an overlap scheduler) is simulated so.
    p.write_text(f"{HEADER},schedule_ahead\n{GOOD},true\n{GOOD},\n")
    ahead, default = read_csv(p)
    assert (ahead.schedule_ahead, default.schedule_ahead) == (True, None)
    assert engine_preset(scenario_from_dict(row_scenario(ahead))).schedule_ahead is True
    assert engine_preset(scenario_from_dict(row_scenario(default))).schedule_ahead is False
    p.write_text(f"{HEADER},schedule_ahead\n{GOOD},maybe\n")
    with pytest.raises(ConfigError, match=r"row 2, schedule_ahead: got 'maybe'; true or false"):
        read_csv(p)
    p.write_text(f"{HEADER},requests\n{GOOD},2.5\n")
    with pytest.raises(ConfigError, match=r"row 2, requests: got '2\.5'; an integer"):
        read_csv(p)
    # TensorRT-LLM does not split a prompt over iterations: a budget no larger than the prompt never runs it.
    trt = GOOD.replace(",vllm,", ",trtllm,")
    p.write_text(f"{HEADER},max_num_batched_tokens\n{trt},128\n")
    with pytest.raises(ConfigError, match=r"row 2, max_num_batched_tokens: got '128'; more than the prompt"):
        read_csv(p)


def test_start_spread_column_is_read_checked_and_spreads_that_rows_clients(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},start_spread_cycles\n{GOOD},1\n{GOOD},\n{GOOD},0.25\n")
    a, b, c = read_csv(p)
    assert (a.start_spread_cycles, b.start_spread_cycles, c.start_spread_cycles) == (1.0, None, 0.25)
    arrival = [scenario_from_dict(row_scenario(r, TINY)).workload.arrival for r in (a, b)]
    # The row's spread wins over the clients'; a row without one keeps theirs (together).
    assert [x.start_spread_cycles for x in arrival] == [1.0, TINY.start_spread_cycles]
    for bad in ("-1", "x", "101", "nan"):
        p.write_text(f"{HEADER},start_spread_cycles\n{GOOD},\n{GOOD},{bad}\n")
        with pytest.raises(ConfigError, match=rf"bench\.csv: row 3, start_spread_cycles: got '{bad}'; request cycles"):
            read_csv(p)
    # Four clients with long prompts that start together keep waiting for each other's prefills;
    # started a request cycle apart they rarely meet: TTFT falls towards one prompt alone.
    r = row(engine="trtllm", isl=4096, osl=256, concurrency=4)
    together, spread, alone = evaluate(
        [r, replace(r, start_spread_cycles=1.0), replace(r, concurrency=1)], builtin_terms(), FIXED
    )
    assert spread.ttft_ms < 0.7 * together.ttft_ms
    assert spread.ttft_ms < 1.3 * alone.ttft_ms
    assert abs(spread.tpot_ms / together.tpot_ms - 1) < 0.3


def test_aiconfigurator_server_settings():
    r = row(engine="trtllm", isl=4096, concurrency=8)
    s = aiconfigurator_server(r)
    # One prompt beside the decodes on TensorRT-LLM and vLLM (as their runs behave); SGLang's
    # prefill budget as the generator writes it.
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.cuda_graph_max_batch, s.mixed_batches) == (8, 8 + 4096, 8, None)
    assert aiconfigurator_server(replace(r, engine="vllm")).max_num_batched_tokens == 8 + 4096
    assert aiconfigurator_server(replace(r, engine="sglang")).max_num_batched_tokens == 8 + 4096 + AIC_BUDGET_EXTRA
    # vLLM's batches are formed ahead (async scheduling); the others keep their preset's, and a row's own wins.
    assert [aiconfigurator_server(replace(r, engine=e)).schedule_ahead for e in ("vllm", "sglang", "trtllm")] == [
        True,
        None,
        None,
    ]
    assert aiconfigurator_server(replace(r, engine="vllm", schedule_ahead=False)).schedule_ahead is False
    # A row's own settings win.
    assert aiconfigurator_server(replace(r, max_num_seqs=4, max_num_batched_tokens=9000)).max_num_batched_tokens == 9000
    assert aiconfigurator_server(replace(r, max_num_seqs=4)).max_num_seqs == 4
    # SGLang's mixed chunks: from 0.5.6, whose template passes --enable-mixed-chunk.
    sgl = row(engine="sglang")
    assert [aiconfigurator_server(replace(sgl, engine_version=v)).mixed_batches for v in ("0.5.1.post1", "", "x")] == [
        None,
        None,
        None,
    ]
    assert [aiconfigurator_server(replace(sgl, engine_version=v)).mixed_batches for v in ("0.5.6.post2", "0.5.8")] == [
        True,
        True,
    ]


def test_served_by_auto_reads_aiconfigurator_run_ids_and_serves_only_those_rows():
    ids = {
        "x_h100_sxm_vllm_agg_128x16_c3_tp1_epnone_1": True,
        "qwen3_32b_h100_sxm_vllm_agg_128x16_c_tp1_0_epnone_4": True,  # the collector left the concurrency out
        "x_agg_128x16_c4_tp1_epnone_1": False,  # another run's concurrency
        "x_agg_128x32_c3_tp1_epnone_1": False,  # another run's output length
        "x_agg_128x16_c3_tp12_epnone_1": False,  # tp12 is not tp1
        "run-17": False,
        "": False,
    }
    rows = [row(concurrency=3, source=s) for s in ids]
    assert [aiconfigurator_run(r) for r in rows] == list(ids.values())
    auto = served_by_rows(rows, "auto")
    assert [r.max_num_seqs for r in auto] == [3 if v else None for v in ids.values()]
    assert [r.max_num_batched_tokens for r in auto][:3] == [3 + 128, 3 + 128, None]
    assert served_by_rows(rows, "defaults") == rows
    assert all(r.max_num_seqs == 3 for r in served_by_rows(rows, "aiconfigurator"))
    with pytest.raises(ConfigError, match=r"--served-by: got 'dynamo'; one of auto, aiconfigurator, defaults"):
        served_by_rows(rows, "dynamo")
    # Every run of the shipped file names its collector run: auto serves the whole file as aiconfigurator.
    shipped = read_bench(TRAINING_FILE)
    assert served_by_rows(shipped, "auto") == served_by_rows(shipped, "aiconfigurator")
    assert served_by_line(str(TRAINING_FILE), shipped, "auto") == []
    (line,) = served_by_line("mine.csv", rows, "auto")
    assert line.startswith("2 of 7 rows of mine.csv name aiconfigurator-core collector runs")
    assert served_by_line("mine.csv", rows, "defaults") == [] and served_by_line("mine.csv", rows[2:], "auto") == []


def test_a_variant_id_says_which_config_brings_its_weights(tmp_path):
    # An untagged Kimi-K2.6 has no config of its own: its rows run NVIDIA's NVFP4 re-release, which the
    # row does not show; validate and calibrate say so once per id. Ids that ship say nothing.
    (tmp_path / "k.csv").write_text(
        f"{HEADER}\nmoonshotai/Kimi-K2.6,b200_sxm,trtllm,8,1024,1024,16,300,20\n{GOOD}\n"
        "moonshotai/Kimi-K2.6,b200_sxm,trtllm,8,1024,1024,32,400,25\n"
    )
    rows = read_bench(tmp_path / "k.csv")
    assert [r.weights for r in rows] == ["nvfp4", "bf16", "nvfp4"]
    (line,) = variant_lines(rows)
    assert line.startswith(
        "moonshotai/Kimi-K2.6: no config of it ships; simulated with the shape of nvidia/Kimi-K2.6-NVFP4"
    )
    assert "its nvfp4 weights (where a row leaves its weights column empty" in line and "KV" not in line
    assert variant_lines(read_bench(TRAINING_FILE)) == []
    r = kvsim("validate", "--serving-bench", "k.csv", "--requests-per-client", "1", "--out", "v", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " ".join((r.stdout + r.stderr).split()).count("no config of it ships") == 1


def test_cli_validate_serves_a_copied_aiconfigurator_file_as_its_generator_did(tmp_path):
    # A run of the shipped file, copied elsewhere: still read as aiconfigurator served it (a token budget of
    # 8 + 4096 and at most 8 requests running, where vLLM's defaults are 8192 and 1024).
    lines = TRAINING_FILE.read_text().splitlines()
    picked = [ln for ln in lines[1:] if "h100_sxm_vllm_agg_4096x128_c8_tp2_" in ln]
    assert len(picked) == 1, "the shipped file has one such Qwen3-32B / vLLM run"
    (tmp_path / "copy.csv").write_text("\n".join([lines[0], *picked]) + "\n")
    args = ("validate", "--serving-bench", "copy.csv", "--requests-per-client", "2")
    r = kvsim(*args, "--out", "auto", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 of 1 rows of copy.csv name aiconfigurator-core collector runs" in " ".join((r.stdout + r.stderr).split())
    auto = json.loads((tmp_path / "auto" / "serving_validation.json").read_text())
    assert auto["served_by"] == "auto" and auto["aiconfigurator_served_rows"] == 1
    assert auto["results"][0]["max_num_seqs"] == 8 and auto["results"][0]["max_num_batched_tokens"] == 8 + 4096
    r = kvsim(*args, "--served-by", "defaults", "--out", "own", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "collector runs" not in r.stdout + r.stderr
    own = json.loads((tmp_path / "own" / "serving_validation.json").read_text())
    assert own["aiconfigurator_served_rows"] == 0 and own["results"][0]["max_num_seqs"] is None
    # The deployment moves the simulated first token (1,064 ms on vLLM's defaults, 911 ms as served).
    assert abs(own["results"][0]["sim_ttft_ms"] / auto["results"][0]["sim_ttft_ms"] - 1) > 0.05


def test_row_server_settings_reach_the_scenario_and_bound_every_iteration():
    # One 4096-token prompt per iteration: the budget (c + isl) cannot hold two beside the decodes.
    r = aiconfigurator_server(row(engine="trtllm", gpu="h200_sxm", isl=4096, osl=8, concurrency=4, requests=12))
    together = Clients(client_cv=0.0)  # every client's first request reaches the server at once
    raw = row_scenario(r, together)
    sc = with_engine_defaults(scenario_from_dict(raw))
    assert sc.workload.num_requests == 12  # the benchmark's own count, not clients x requests_per_client
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (4, 4 + 4096)
    assert engine_preset(sc).graph_max_tokens == 4
    res = simulate(sc)
    ts = res.timeseries.to_pydict()
    assert max(ts["batch_tokens"]) <= 4 + 4096
    assert max(ts["running"]) <= 4
    # With TensorRT-LLM's default budget (8192) two prompts share the first iteration.
    wide = simulate(scenario_from_dict(row_scenario(replace(r, max_num_batched_tokens=None), together)))
    assert max(wide.timeseries.to_pydict()["batch_tokens"]) > 4 + 4096
    sgl = aiconfigurator_server(row(engine="sglang", engine_version="0.5.6.post2"))
    assert with_engine_defaults(scenario_from_dict(row_scenario(sgl, Clients()))).scheduler.mixed_batches is True


def test_default_clients_count_every_request_as_the_benchmark_does():
    r = row(concurrency=3, isl=256, osl=8)
    assert (Clients().requests_per_client, Clients().warmup) == (10, 0)
    sc = scenario_from_dict(row_scenario(r, Clients()))
    assert sc.workload.num_requests == 30
    res = simulate(sc)
    t = res.requests.to_pydict()
    ttft = [f - a for f, a in zip(t["first_token_s"], t["arrival_s"])]
    got = simulate_row(r, Clients())
    # The mean is over all 30, the first (cold, all clients arriving together) included.
    assert got.ttft_ms == pytest.approx(1e3 * sum(ttft) / len(ttft))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_row_is_a_closed_loop_on_its_engine_preset(engine):
    r = row(engine=engine, gpu="h200_sxm", tp=2, isl=300, osl=20, concurrency=5, weights="fp8")
    sc = with_engine_defaults(scenario_from_dict(row_scenario(r, TINY)))
    arr, lengths = sc.workload.arrival, sc.workload.lengths
    assert (arr.kind, arr.concurrency) == ("closed_loop", 5)
    assert (lengths.kind, lengths.prompt_tokens, lengths.output_tokens) == ("fixed", 300, 20)
    assert sc.workload.num_requests == 5 * (TINY.requests_per_client + TINY.warmup)
    assert (sc.gpu.name, sc.gpu.tensor_parallel) == (GPU_IDS["h200_sxm"], 2)
    # fp8 weights: TensorRT-LLM follows the FP8 checkpoint's KV quantisation, vLLM and SGLang keep bf16.
    kv = {"trtllm": "fp8"}.get(engine, "bf16")
    assert (sc.model.name, sc.model.weight_dtype, sc.model.kv_dtype) == ("llama-3.1-8b", "fp8", kv)
    assert (sc.allocator.kind, sc.allocator.block_size) == ("paged", ENGINE_BLOCK_SIZE[engine])
    preset = PRESETS[engine]
    assert sc.engine.kind == engine
    assert engine_preset(sc) == preset
    s = sc.scheduler
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill, s.mixed_batches, s.reserve_output) == (
        preset.max_num_seqs,
        preset.max_num_batched_tokens,
        preset.chunked_prefill,
        preset.mixed_batches,
        preset.reserve_output,
    )
    # Benchmark clients start together whatever the preset's scenario default; their jitter is the preset's.
    assert (arr.start_spread_cycles, arr.client_cv) == (0.0, preset.client_cv)
    own = with_engine_defaults(scenario_from_dict(row_scenario(r, replace(TINY, start_spread_cycles=None))))
    assert own.workload.arrival.start_spread_cycles == preset.client_spread_cycles
    # Terms given for the row replace the preset's.
    sc2 = scenario_from_dict(row_scenario(r, TINY, engine={"host_s": 4e-3, "frontend_s": 0.03}))
    assert (engine_preset(sc2).host_s, engine_preset(sc2).frontend_s) == (4e-3, 0.03)


@pytest.mark.parametrize(
    "gpu,tp,vllm,sglang",
    [
        # (GPU, tensor parallelism, vLLM's (token budget, sequences), SGLang's (chunk, graph batch))
        ("H100-SXM-80GB", 1, (8192, 1024), (8192, 160)),
        ("H200-SXM-141GB", 4, (8192, 1024), (8192, 160)),
        ("A100-SXM-80GB", 1, (2048, 256), (8192, 160)),
        ("L40S", 1, (2048, 256), (4096, 32)),
        ("L40S", 4, (2048, 256), (4096, 160)),
        ("A10G", 2, (2048, 256), (2048, 24)),
        ("B200-SXM-180GB", 2, (8192, 1024), (16384, 512)),
    ],
)
def test_server_defaults_follow_the_gpu_as_the_engines_pick_them(gpu, tp, vllm, sglang):
    """vLLM and SGLang size their defaults by the GPU's memory (vLLM also by name: every A100 gets
    the small ones); TensorRT-LLM's server does not. A scenario's own keys still win."""

    def of(kind: str, **sched):
        data = {
            "gpu": {"name": gpu, "tensor_parallel": tp},
            "engine": {"kind": kind},
            "model": {"name": "llama-3.1-8b"},
        }
        if sched:
            data["scheduler"] = sched
        sc = scenario_from_dict(data)
        return with_engine_defaults(sc).scheduler, engine_preset(sc)

    s, _ = of("vllm")
    assert (s.max_num_batched_tokens, s.max_num_seqs) == vllm
    s, p = of("sglang")
    assert (s.max_num_batched_tokens, p.graph_max_tokens) == sglang
    s, p = of("trtllm")
    assert (s.max_num_batched_tokens, s.max_num_seqs, p.graph_max_tokens) == (8192, 2048, 128)
    s, _ = of("vllm", max_num_batched_tokens=4096, max_num_seqs=64)
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (4096, 64)


def test_row_scenario_details():
    # TensorRT-LLM does not chunk prompts: the token budget is raised to hold one beside every
    # running decode, also when the prompt alone is exactly the default budget.
    sc = scenario_from_dict(row_scenario(row(engine="trtllm", isl=10000, osl=4), TINY))
    assert sc.scheduler.max_num_batched_tokens >= 10000
    sc = scenario_from_dict(row_scenario(row(engine="trtllm", isl=8192, osl=4, concurrency=4), TINY))
    assert sc.scheduler.max_num_batched_tokens == 8192 + 4
    # An engine that chunks prompts keeps its budget.
    sc = with_engine_defaults(scenario_from_dict(row_scenario(row(engine="vllm", isl=8192, concurrency=4), TINY)))
    assert sc.scheduler.max_num_batched_tokens == PRESETS["vllm"].max_num_batched_tokens
    # The KV cache's dtype: the row's when given, else the engine's default for its weights.
    assert default_kv("trtllm", "fp8") == "fp8" and default_kv("trtllm", "bf16") == "bf16"
    assert default_kv("vllm", "fp8") == default_kv("sglang", "fp8_block") == default_kv("vllm", "nvfp4") == "bf16"
    assert default_kv("trtllm", "nvfp4") == "fp8"  # ModelOpt NVFP4 checkpoints quantise the KV cache too
    # no FP8 KV cache without FP8 tensor cores: an fp8 checkpoint on an A100 keeps a bf16 cache there,
    # which the A100's profile prices (it has no fp8-KV attention tables)
    assert (
        default_kv("trtllm", "fp8", "A100-SXM-80GB") == "bf16" and default_kv("trtllm", "fp8", "H100-SXM-80GB") == "fp8"
    )
    a100 = row(engine="trtllm", weights="fp8", gpu="a100_sxm")
    assert scenario_from_dict(row_scenario(a100, TINY)).model.kv_dtype == "bf16"
    assert simulate_row(a100, TINY).calibrated
    kv = scenario_from_dict(row_scenario(row(engine="trtllm", weights="fp8", kv="bf16"), TINY)).model.kv_dtype
    assert kv == "bf16"
    assert scenario_from_dict(row_scenario(row(engine="vllm", kv="fp8"), TINY)).model.kv_dtype == "fp8"
    # fp16 weights are priced as the 16-bit weights they are, not as fp8.
    assert scenario_from_dict(row_scenario(row(weights="fp16"), TINY)).model.weight_dtype == "bf16"
    # A shipped Hugging Face config is used as such.
    sc = scenario_from_dict(row_scenario(row(model="Qwen/Qwen3-32B", gpu="h100_sxm", tp=2), TINY))
    assert sc.model.hf_config == "Qwen/Qwen3-32B"
    # The client timing given for the run replaces the preset's.
    sc = scenario_from_dict(row_scenario(row(), Clients(start_spread_cycles=0.4, client_cv=0.2)))
    assert (sc.workload.arrival.start_spread_cycles, sc.workload.arrival.client_cv) == (0.4, 0.2)


def test_simulate_row_means_after_the_warm_up_and_is_deterministic():
    r = row(concurrency=3, isl=256, osl=24)
    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.5, client_cv=0.3)
    a, b = simulate_row(r, clients), simulate_row(r, clients)
    assert a.error is None and a.calibrated
    assert (a.ttft_ms, a.tpot_ms) == (b.ttft_ms, b.tpot_ms)
    # The means are those of the requests after each client's warm-up, from the run's own table.
    res = simulate(scenario_from_dict(row_scenario(r, clients)))
    t = res.requests.to_pydict()
    keep = [i for i, rid in enumerate(t["id"]) if rid >= 3 * clients.warmup]
    assert len(keep) == 3 * clients.requests_per_client
    ttft = sum(t["first_token_s"][i] - t["arrival_s"][i] for i in keep) / len(keep) * 1e3
    tpot = (
        sum((t["finish_s"][i] - t["first_token_s"][i]) / (t["generated_tokens"][i] - 1) for i in keep) / len(keep) * 1e3
    )
    assert a.ttft_ms == pytest.approx(ttft, rel=1e-12) and a.tpot_ms == pytest.approx(tpot, rel=1e-12)
    # Engine terms reach the simulation: more host time per iteration, slower tokens.
    base = simulate_row(r, clients, engine={"host_s": 1e-3, "host_hidden": 0.0})
    slow = simulate_row(r, clients, engine={"host_s": 5e-3, "host_hidden": 0.0})
    assert slow.tpot_ms > base.tpot_ms + 3.0
    # A front-end cost is paid before the first token.
    fe = simulate_row(r, clients, engine={"frontend_s": 0.05})
    assert fe.ttft_ms > a.ttft_ms + 40.0


def test_a_row_that_cannot_be_simulated_is_a_result_not_a_crash():
    res = simulate_row(row(model="acme/NoSuchModel-7B"), TINY)
    assert res.ttft_ms is None and "acme/NoSuchModel-7B" in res.error
    sc = score([res, simulate_row(row(), TINY)])
    assert sc["overall"]["failed"] == 1 and sc["overall"]["ttft"]["n"] == 1


def test_score_statistics():
    rows = [row(ttft_ms=10.0, tpot_ms=10.0), row(ttft_ms=10.0, tpot_ms=10.0, engine="sglang")]
    sc = score([RowResult(rows[0], 10.5, 8.0), RowResult(rows[1], 15.0, 10.0)])
    o = sc["overall"]
    assert o["ttft"]["median_abs"] == pytest.approx(0.275) and o["ttft"]["within_10"] == 0.5
    assert o["tpot"]["bias"] == pytest.approx(-0.1) and o["tpot"]["within_20"] == 1.0
    assert set(sc["groups"]) == {rows[0].group, rows[1].group}
    assert "overall_unflagged" not in sc


def test_score_gives_an_overall_without_the_groups_set_aside():
    good = [row(ttft_ms=10.0, tpot_ms=10.0, concurrency=c) for c in (2, 4, 8)]
    bad = [row(ttft_ms=10.0, tpot_ms=10.0, engine="sglang", concurrency=c) for c in (2, 4)]
    res = [RowResult(r, 11.0, 9.0) for r in good] + [RowResult(r, 40.0, 30.0) for r in bad]
    sc = score(res, set_aside=[bad[0].group, "a/group/not/in/the/file"])
    o, u = sc["overall"], sc["overall_unflagged"]
    assert o["rows"] == 5 and o["ttft"]["median_abs"] == pytest.approx(0.1)
    assert u["rows"] == 3 and u["set_aside"] == [bad[0].group]
    assert u["ttft"]["median_abs"] == pytest.approx(0.1) and u["tpot"]["bias"] == pytest.approx(-0.1)
    assert u["ttft"]["p90_abs"] == pytest.approx(0.1) and o["ttft"]["p90_abs"] > 1.0
    # Nothing left without them, or nothing to set aside: no second figure.
    assert "overall_unflagged" not in score(res[3:], set_aside=[bad[0].group])
    assert "overall_unflagged" not in score(res, set_aside=["a/group/not/in/the/file"])


def test_clients_meet_as_their_harness_lets_them():
    # auto: an aiconfigurator-core collector run (named in source_id, or the whole file with
    # --served-by aiconfigurator) starts its clients together; any other run starts them apart; a
    # row's own start_spread_cycles is kept whatever the mode.
    aic, mine, own = row(source=AIC_ID), row(), row(start_spread_cycles=0.3)
    spreads = lambda rows: [r.start_spread_cycles for r in rows]  # noqa: E731
    assert spreads(clients_rows([aic, mine, own], "auto", "auto")) == [0.0, APART_SPREAD_CYCLES, 0.3]
    assert spreads(clients_rows([aic, mine, own], "auto", "aiconfigurator")) == [0.0, 0.0, 0.3]
    assert spreads(clients_rows([aic, mine, own], "auto", "defaults")) == [APART_SPREAD_CYCLES] * 2 + [0.3]
    assert spreads(clients_rows([aic, mine, own], "together", "auto")) == [0.0, 0.0, 0.3]
    assert spreads(clients_rows([aic, mine, own], "apart", "auto")) == [APART_SPREAD_CYCLES] * 2 + [0.3]
    with pytest.raises(ConfigError, match="--clients: got 'drift'; one of " + ", ".join(CLIENT_MODES)):
        clients_rows([mine], "drift", "auto")
    # The shipped file's runs are all its collector's: every one starts together.
    assert all(r.start_spread_cycles == 0.0 for r in check_rows(read_bench(TRAINING_FILE), None, ()).rows)


def test_fixed_length_clients_in_step_stay_in_prefill_waves_at_an_engines_default_budget():
    # Why a harness kvsim has not seen starts apart: at vLLM's default token budget a whole wave of
    # 1024-token prompts fits an iteration or two, and clients that start in step meet there every
    # cycle, jitter or none; started apart they do not (Llama-3.1-8B fp8, H100, 16 clients).
    base = row(engine="vllm", weights="fp8", isl=1024, osl=256, concurrency=16)
    together, apart = evaluate(
        clients_rows([base], "together", "auto") + clients_rows([base], "apart", "auto"),
        builtin_terms(),
        Clients(requests_per_client=4),
    )
    jittered = evaluate(
        clients_rows([base], "together", "auto"), builtin_terms(), Clients(requests_per_client=4, client_cv=3.0)
    )[0]
    assert together.ttft_ms > 2.5 * apart.ttft_ms and jittered.ttft_ms > 2.5 * apart.ttft_ms, (
        together.ttft_ms,
        jittered.ttft_ms,
        apart.ttft_ms,
    )


AIC_ID = "meta_llama_llama_3_1_8b_instruct_h100_sxm_vllm_agg_128x16_c2_tp1_epnone_1"
