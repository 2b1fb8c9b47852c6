"""Serving benchmarks: reading them, rows as closed-loop scenarios, fitting engine terms back,
leave-one-group-out, and ``kvsim calibrate --from-serving-bench`` / ``kvsim validate --serving-bench``.

Rows are tiny (a few clients, short prompts, a few requests per client) so the whole file runs in
seconds; the accuracy on the shipped training file is measured by ``kvsim validate --serving-bench
builtin --logo``, not here.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from calibration.served_by import AIC_BUDGET_EXTRA, aiconfigurator_run, aiconfigurator_server
from calibration.serving_bench import (
    GPU_IDS,
    TRAINING_FILE,
    BenchRow,
    normalize_gpu,
    read_bench,
    read_csv,
    resolve_model,
)
from calibration.serving_evidence import (
    APART_MAX_PER_PREFILL,
    BUSY_LIMIT,
    CACHE_BLOCK_TOKENS,
    SPLIT_MIN_ROWS,
    SPLIT_MIN_SPREAD,
    TTFT_LINE_MIN_ROWS,
    cache_flagged,
    clients_apart,
    completion_gap_ratios,
    faster_than_kernels,
    gpu_shares,
    hold_back_flagged,
    implied_gpu_busy,
    kv_capacity_evidence,
    kv_from_runs,
    least_cached_share,
    prompt_costs,
    runs_faster_than_kernels,
    spread_flagged,
    tp_scaling,
    tpot_error_split,
    ttft_follows_completions,
    ttft_vs_prefill,
)
from calibration.serving_fit import (
    EngineTerms,
    builtin_terms,
    evaluate,
    fit,
    fit_each_group,
    leave_one_group_out,
    objective,
    prior_penalty,
    term_sensitivity,
)
from calibration.serving_notes import fast_run_warnings, few_runs_lines, kernel_warnings, kv_warnings
from calibration.serving_runs import Clients, RowResult, row_scenario, score, simulate_row
from calibration.serving_selection import (
    CLIENT_MODES,
    check_rows,
    clients_rows,
    selected_rows,
    served_by_line,
    served_by_rows,
    variant_lines,
)
from sim.config import APART_SPREAD_CYCLES, scenario_from_dict
from sim.engine.cluster import simulate
from sim.engine.deployment import engine_preset, with_engine_defaults
from sim.engine_presets import ENGINE_BLOCK_SIZE, FITTED_TERMS, PRESETS, default_kv, read_terms_file
from sim.errors import ConfigError
from sim.hf_config import MODELS_DIR
from sim.model_ids import model_key

REPO = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HEADER = "model,gpu,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms"
GOOD = f"{LLAMA},h100_sxm,vllm,1,128,16,2,20.5,7.25"
#: Few requests per client after one warm-up request: enough for stable means on fixed lengths.
TINY = Clients(requests_per_client=3, warmup=1)
#: The fitting tests' clients: no per-request spread (whatever a preset's default), so the terms alone decide.
FIXED = Clients(requests_per_client=3, warmup=1, client_cv=0.0)
#: Where the fitting tests start, whatever the presets' fitted values are (these were theirs before any fit).
START = {
    "host_s": 1e-3,
    "host_per_seq_s": 10e-6,
    "host_hidden": 0.0,
    "frontend_s": 5e-3,
    "client_cv": 0.0,
    "stream_per_token_s": 0.0,
}


def row(**kw) -> BenchRow:
    d = dict(
        model=LLAMA, gpu="h100_sxm", engine="vllm", tp=1, isl=128, osl=16, concurrency=2, ttft_ms=20.0, tpot_ms=7.0
    )
    d.update(kw)
    return BenchRow(**d)


def measured(rows: list[BenchRow], terms: EngineTerms, clients: Clients = FIXED) -> list[BenchRow]:
    """``rows`` with kvsim's own TTFT and TPOT under ``terms`` as their "measurements"."""
    sims = evaluate(rows, terms, clients)
    assert all(s.error is None for s in sims), [s.error for s in sims]
    return [replace(r, ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms) for r, s in zip(rows, sims)]


def with_terms(**engines: dict) -> EngineTerms:
    """:data:`START` for every engine, with ``engines``' terms changed."""
    assert set(START) == set(FITTED_TERMS)
    t = EngineTerms({e: dict(START) for e in PRESETS})
    for e, v in engines.items():
        t.engines[e].update(v)
    return t


# --- reading ---------------------------------------------------------------------------------


def test_csv_rows_read_with_optional_columns(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(
        f"{HEADER},weights,kv,engine_version,source_id\n{GOOD},fp8,FP8,0.12.0,run-a\n"
        "Qwen/Qwen3-32B,h200_sxm,SGLang,2,1024,128,16,840.8,16.5,,,,\n"
    )
    a, b = read_csv(p)
    assert a == BenchRow(
        model=LLAMA,
        gpu="h100_sxm",
        engine="vllm",
        tp=1,
        isl=128,
        osl=16,
        concurrency=2,
        ttft_ms=20.5,
        tpot_ms=7.25,
        weights="fp8",
        kv="fp8",
        engine_version="0.12.0",
        source="run-a",
    )
    # Engine names are case-insensitive; a blank weights cell is bf16, a blank kv cell the engine's
    # default; a row without an id is named by its line.
    assert (b.engine, b.weights, b.kv, b.tp, b.source) == ("sglang", "bf16", "", 2, "row 3")
    assert b.group == "Qwen/Qwen3-32B/h200_sxm/sglang"


def test_csv_kv_cache_tokens_pins_the_servers_kv_capacity(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},kv_cache_tokens\n{GOOD},\n{GOOD},452000\n")
    a, b = read_csv(p)
    assert (a.kv_cache_tokens, b.kv_cache_tokens) == (None, 452000)
    assert "kv_cache_tokens" not in scenario_from_dict(row_scenario(a)).gpu.model_fields_set
    assert scenario_from_dict(row_scenario(b)).gpu.kv_cache_tokens == 452000
    for bad, allowed in (("0", "an integer in"), ("1e3.5", "an integer in"), ("100", "at least isl + osl = 144")):
        p.write_text(f"{HEADER},kv_cache_tokens\n{GOOD},\n{GOOD},{bad}\n")
        with pytest.raises(
            ConfigError, match=rf"bench\.csv: row 3, kv_cache_tokens: got '{re.escape(bad)}'; {re.escape(allowed)}"
        ):
            read_csv(p)
    # Eight clients of 576 tokens each: a server that holds two at once makes the others wait.
    r = row(isl=512, osl=64, concurrency=8)
    free, two = evaluate([r, replace(r, kv_cache_tokens=2 * 576 + 48)], builtin_terms(), FIXED)
    assert free.error is None and two.error is None
    assert two.ttft_ms > 5 * free.ttft_ms and two.tpot_ms < free.tpot_ms


def test_csv_cached_prompt_tokens_serves_that_much_of_every_prompt_from_the_prefix_cache(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},cached_prompt_tokens\n{GOOD},\n{GOOD},96\n{GOOD},0\n")
    a, b, c = read_csv(p)
    assert (a.cached_prompt_tokens, b.cached_prompt_tokens, c.cached_prompt_tokens) == (None, 96, None)
    sc = scenario_from_dict(row_scenario(b))
    # The run's prompts keep their isl tokens: 96 shared by all, 32 their own.
    assert (sc.workload.lengths.prompt_tokens, sc.workload.prefix.prefix_tokens, sc.workload.prefix.fraction) == (
        32,
        96,
        1.0,
    )
    assert (
        sc.allocator.prefix_caching.enabled and not scenario_from_dict(row_scenario(a)).allocator.prefix_caching.enabled
    )
    for bad, allowed in (("-1", "an integer in [0,"), ("128", "an integer in [0, 127]"), ("x", "an integer in")):
        p.write_text(f"{HEADER},cached_prompt_tokens\n{GOOD},\n{GOOD},{bad}\n")
        with pytest.raises(
            ConfigError, match=rf"bench\.csv: row 3, cached_prompt_tokens: got '{re.escape(bad)}'; {re.escape(allowed)}"
        ):
            read_csv(p)


def test_runs_faster_than_their_kernels_get_the_least_cached_share_that_makes_them_possible():
    # A benchmark whose prompts share their first three quarters, served from the prefix cache, and a
    # file that does not say so: its runs need more GPU than the wall time at full prefills.
    rows = [row(isl=isl, osl=32, concurrency=8) for isl in (1024, 2048)]
    plain = evaluate(rows, builtin_terms(), FIXED)
    truth = measured([replace(r, cached_prompt_tokens=3 * r.isl // 4) for r in rows], builtin_terms())
    assert all(t.ttft_ms < 0.6 * p.ttft_ms for t, p in zip(truth, plain))
    file = [replace(r, cached_prompt_tokens=None) for r in truth]
    shares = gpu_shares(file)
    fast = faster_than_kernels(file)
    assert list(fast) == [file[0].group]
    share = least_cached_share(file, shares, fast)
    # A lower bound: the server is not computing all the time.
    assert list(share) == [file[0].group] and 0.3 < share[file[0].group] <= 0.75
    assert least_cached_share(file, shares, {}) == {}
    other = row(engine="sglang")  # not flagged: left alone
    own = replace(file[0], isl=4096, cached_prompt_tokens=100)  # says its own: kept
    got, cached = cache_flagged([*file, other, own], share)
    assert cached == [file[0].group]
    s = share[file[0].group]
    assert [r.cached_prompt_tokens for r in got] == [
        *(int(s * r.isl) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS for r in file),
        None,
        100,
    ]
    # Simulated so, the runs come closer to what they measured (not all the way: the share is a
    # lower bound, below the three quarters they were made with).
    err = lambda res: sum(abs(x.ttft_err) for x in res)  # noqa: E731
    assert err(evaluate(got[:2], builtin_terms(), FIXED)) < 0.6 * err(evaluate(file, builtin_terms(), FIXED))
    # The shipped file's one such group needs at least about 80 % of its prompts cached.
    shipped = [aiconfigurator_server(r) for r in read_bench(TRAINING_FILE) if "FP8" in r.model]
    sh = gpu_shares(shipped)
    assert (
        0.7
        < least_cached_share(shipped, sh, faster_than_kernels(shipped, busy=implied_gpu_busy(shipped, shares=sh)))[
            shipped[0].group
        ]
        < 0.9
    )


BAD_ROWS = [  # (the second data row's cells that replace the good ones, the column named, the value quoted)
    ({"isl": "abc"}, "isl", "'abc'"),
    ({"osl": "-16"}, "osl", "'-16'"),
    ({"isl": "1.5"}, "isl", "'1.5'"),
    ({"concurrency": "0"}, "concurrency", "'0'"),
    ({"tp": "3"}, "tp", "'3'"),
    ({"ttft_ms": "-20"}, "ttft_ms", "'-20'"),
    ({"tpot_ms": "nan"}, "tpot_ms", "'nan'"),
    ({"tpot_ms": "fast"}, "tpot_ms", "'fast'"),
    ({"engine": "tgi"}, "engine", "'tgi'"),
    ({"kv": "int4"}, "kv", "'int4'"),
    ({"gpu": "a999"}, "gpu", "'a999'"),
    ({"model": "acme/NoSuchModel-7B"}, "model", "'acme/NoSuchModel-7B'"),
]


@pytest.mark.parametrize("cells,column,quoted", BAD_ROWS, ids=[c for _, c, _ in BAD_ROWS])
def test_bad_csv_value_names_file_row_column_and_value(tmp_path, cells, column, quoted):
    cols = HEADER.split(",") + ["kv"]
    values = dict(zip(cols, GOOD.split(",") + [""]))
    values.update(cells)
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},kv\n{GOOD},\n" + ",".join(values[c] for c in cols) + "\n")
    with pytest.raises(ConfigError) as ei:
        read_bench(p)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}: row 3, {column}: got {quoted};"), msg


def test_csv_missing_column_and_empty_file(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(HEADER.replace(",tpot_ms", "") + "\n" + GOOD.rsplit(",", 1)[0] + "\n")
    with pytest.raises(ConfigError, match=r"bench\.csv: header: .*missing tpot_ms"):
        read_bench(p)
    p.write_text(HEADER + "\n")
    with pytest.raises(ConfigError, match="at least one benchmark row"):
        read_bench(p)
    # A CR LF file with a column appended after each CR: one error, not every row split in two.
    p.write_bytes((HEADER + "\r,requests\r\n" + GOOD + "\r,40\r\n").encode())
    with pytest.raises(ConfigError, match=r"bench\.csv: line 1: .*a carriage return inside the line"):
        read_bench(p)
    for ending in ("\r\n", "\r"):  # either alone reads
        p.write_bytes((HEADER + ending + GOOD + ending).encode())
        assert len(read_bench(p)) == 1
    # A spreadsheet's "CSV UTF-8" export begins with a byte-order mark: the first column is still "model".
    plain = tmp_path / "plain.csv"
    plain.write_text(HEADER + "\n" + GOOD + "\n")
    p.write_bytes(b"\xef\xbb\xbf" + (HEADER + "\r\n" + GOOD + "\r\n").encode())
    assert read_bench(p)[0] == replace(read_bench(plain)[0], source=read_bench(p)[0].source)
    p.write_bytes(b"\xff\xfe\x00" + HEADER.encode())
    with pytest.raises(ConfigError, match="readable UTF-8 CSV"):
        read_bench(p)
    with pytest.raises(ConfigError, match="a CSV file, a vllm bench serve JSON file, or a folder"):
        read_bench(tmp_path / "missing.csv")


def test_model_column_may_name_a_config_json_beside_the_file(tmp_path):
    shutil.copy(REPO / "scenarios/models/meta-llama--Meta-Llama-3.1-8B_config.json", tmp_path / "config.json")
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER}\n" + GOOD.replace(LLAMA, "config.json") + "\n")
    (r,) = read_bench(p)
    assert r.model == str((tmp_path / "config.json").resolve())
    res = simulate_row(r, TINY)
    assert res.error is None and res.ttft_ms > 0


@pytest.mark.parametrize(
    "ident,shape",
    [
        ("meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B"),
        ("nvidia/Llama-3.1-405B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-405B"),
        ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
        ("nvidia/Llama-3.3-70B-Instruct-FP4", "meta-llama/Meta-Llama-3.1-70B"),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "meta-llama/Meta-Llama-3.1-8B"),
        ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
        ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
        # tags inside the name, dated re-releases, releases of one architecture under another name
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507-FP8", "Qwen/Qwen3-235B-A22B-FP8"),  # its quantization kept
        ("RedHatAI/Qwen3-32B-FP8-dynamic", "Qwen/Qwen3-32B"),  # another fp8 format: the shape alone
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3"),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1"),
        # V3's architecture and block fp8, not NVIDIA's NVFP4 re-release (the only V3.1 config shipped)
        ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3"),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-ai/DeepSeek-V3"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"),
        ("mistralai/Mistral-Small-24B-Instruct-2501", "mistralai/Mistral-Small-24B-Base-2501"),
        ("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B"),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "meta-llama/Meta-Llama-3.1-70B"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "Qwen/Qwen2.5-32B"),
        ("nvidia/Llama-3.1-Nemotron-70B-Instruct-HF", "meta-llama/Meta-Llama-3.1-70B"),
    ],
)
def test_model_ids_resolve_to_the_shape_they_name(tmp_path, ident, shape):
    """Variants of a shape kvsim has (another organisation, -Instruct, -FP8, a retrained release)
    are simulated with that shape; the row keeps the file's id, so its group is the file's."""
    assert model_key(ident) == model_key(shape)
    assert resolve_model(ident) == resolve_model(shape)
    p = tmp_path / "ids.csv"
    p.write_text(f"{HEADER}\n" + GOOD.replace(LLAMA, ident) + "\n")
    (r,) = read_csv(p)
    assert r.model == ident and r.group.startswith(ident + "/")
    assert (
        scenario_from_dict(row_scenario(r, TINY)).model
        == scenario_from_dict(row_scenario(replace(r, model=shape), TINY)).model
    )


def test_an_unquantized_id_does_not_take_a_quantized_re_release_s_format(tmp_path):
    # DeepSeek-V3.1's only shipped config is NVIDIA's NVFP4 checkpoint; the id itself is V3's block fp8.
    p = tmp_path / "ids.csv"
    rows = [
        GOOD.replace(LLAMA, i).replace(",1,128,", ",8,128,")
        for i in ("deepseek-ai/DeepSeek-V3.1", "nvidia/DeepSeek-V3.1-NVFP4")
    ]
    p.write_text(f"{HEADER}\n" + "\n".join(rows) + "\n")
    plain, nvfp4 = read_csv(p)
    assert (plain.weights, nvfp4.weights) == ("fp8_block", "nvfp4")
    assert resolve_model("nvidia/DeepSeek-V3.1-NVFP4") == {"name": None, "hf_config": "nvidia/DeepSeek-V3.1-NVFP4"}


def test_a_local_config_wins_over_a_same_shape_guess(tmp_path, monkeypatch):
    """A folder named like a variant of a known shape holds its own config: that file is read, not the
    base model's shape (a fine-tune may change the shape); the benchmark reader makes the path absolute,
    ``kvsim compare`` writes it as given. Unknown ids and paths are ``None``."""
    from sim.model_ids import section_of

    d = tmp_path / "acme" / "Llama-3.1-8B-Instruct"
    d.mkdir(parents=True)
    (d / "config.json").write_text((MODELS_DIR / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert section_of("acme/Llama-3.1-8B-Instruct") == {"name": None, "hf_config": "acme/Llama-3.1-8B-Instruct"}
    assert section_of("acme/Llama-3.1-8B-Instruct", absolute=True)["hf_config"] == str((d / "config.json").resolve())
    assert resolve_model("acme/Llama-3.1-8B-Instruct") == {
        "name": None,
        "hf_config": str((d / "config.json").resolve()),
    }
    # without the folder, the same id is the catalog shape it names
    monkeypatch.chdir(tmp_path / "acme")
    assert section_of("acme/Llama-3.1-8B-Instruct") == section_of("meta-llama/Meta-Llama-3.1-8B")
    assert section_of("acme/Llama-3.1-8B-AWQ") is None


@pytest.mark.parametrize(
    "ident",
    [
        "Qwen/Qwen3-8B-Coder",
        "acme/Llama-3.1-8B-AWQ",
        "mistralai/Mistral-7B-Instruct-v0.2",
        "deepseek-ai/DeepSeek-V3.2",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "google/gemma-2-9b-it",
    ],
)
def test_models_of_another_shape_are_not_guessed(ident):
    with pytest.raises(ConfigError, match="a model kvsim has the shape of: .*llama-3.1-405b"):
        resolve_model(ident)


@pytest.mark.parametrize(
    "name,gpu",
    [
        ("h100_sxm", "h100_sxm"),
        ("H100", "h100_sxm"),
        ("h100-sxm5-80gb", "h100_sxm"),
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("H200", "h200_sxm"),
        ("NVIDIA B200", "b200_sxm"),
        ("NVIDIA GB200", "gb200_sxm"),
        ("gb200_sxm", "gb200_sxm"),
        ("NVIDIA B300 SXM6 AC", "b300_sxm"),
        ("GB300", "gb300_sxm"),
        ("A100-SXM4-80GB", "a100_sxm"),
        ("a100-40gb", "A100-40GB"),
        ("L40S", "L40S"),
        ("l40s-48gb", "l40s"),
        ("H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("H200 NVL", None),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("GH200", None),
        ("L40", None),
    ],
)
def test_gpu_names_as_tools_write_them(name, gpu):
    assert normalize_gpu(name) == gpu


def test_engine_and_dtype_spellings(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(
        f"{HEADER},weights,kv\n"
        + GOOD.replace(",vllm,", ",TensorRT-LLM,")
        + ",bfloat16,float8\n"
        + GOOD.replace(",vllm,", ",trt_llm,")
        + ",fp8-block,\n"
    )
    a, b = read_csv(p)
    assert (a.engine, a.weights, a.kv) == ("trtllm", "bf16", "fp8")
    assert (b.engine, b.weights, b.kv) == ("trtllm", "fp8_block", "")
    p.write_text(f"{HEADER},weights\n" + GOOD + ",FP8_Static\n" + GOOD + ",fp8_e4m3fn\n")
    assert [r.weights for r in read_csv(p)] == ["fp8", "fp8"]
    p.write_text(f"{HEADER},weights\n" + GOOD.replace("h100_sxm", "B200") + ",FP4\n")
    (c,) = read_csv(p)
    assert (c.gpu, c.weights) == ("b200_sxm", "nvfp4")
    res = simulate_row(c, TINY)
    assert res.error is None and res.calibrated


def test_mxfp4_weights_for_a_checkpoint_with_mxfp4_experts(tmp_path):
    """``weights: mxfp4`` (or aiconfigurator's ``w4a16_mxfp4``) names gpt-oss's checkpoint as published:
    its experts MXFP4 from its config, everything else bf16; the same row of a model without MXFP4
    experts is refused with the field, the value and what is allowed."""
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},weights\n" + GOOD.replace(LLAMA, "openai/gpt-oss-20b") + ",w4a16_mxfp4\n")
    (r,) = read_csv(p)
    assert r.weights == "mxfp4"
    sc = scenario_from_dict(row_scenario(r, TINY))
    assert sc.model.weight_dtype == "bf16" and sc.model.hf_config == "openai/gpt-oss-20b"
    as_bf16 = scenario_from_dict(row_scenario(replace(r, weights="bf16"), TINY))
    assert sc.model == as_bf16.model
    res = simulate_row(r, TINY)
    assert res.error is None and res.ttft_ms > 0
    p.write_text(f"{HEADER},weights\n" + GOOD + ",mxfp4\n")
    with pytest.raises(
        ConfigError, match=r"row 2, weights: got 'mxfp4'.*only for a checkpoint whose config declares MXFP4"
    ):
        read_csv(p)


def test_w4a16_experts_of_kimi_k2_5_are_read_from_its_checkpoint_and_priced(tmp_path):
    """Kimi K2.5 publishes 4-bit integer routed experts beside 16-bit attention (compressed-tensors,
    its text tower's quantization_config): a row without weights takes them, ``w4a16`` names them,
    and another model's row naming them is refused."""
    p = tmp_path / "bench.csv"
    kimi = GOOD.replace(LLAMA, "moonshotai/Kimi-K2.5").replace(",1,128,", ",8,128,").replace("h100_sxm", "h200_sxm")
    p.write_text(f"{HEADER},weights\n{kimi},\n{kimi},w4a16\n")
    unset, named = read_csv(p)
    assert unset.weights == named.weights == "w4a16"
    sc = scenario_from_dict(row_scenario(named, TINY))
    assert sc.model.weight_dtype == "bf16" and sc.model.hf_config == "moonshotai/Kimi-K2.5"
    res = simulate_row(named, TINY)
    assert res.error is None and res.calibrated and res.tpot_ms > 0
    p.write_text(f"{HEADER},weights\n" + GOOD.replace(LLAMA, "openai/gpt-oss-20b") + ",w4a16\n")
    with pytest.raises(ConfigError, match=r"row 2, weights: got 'w4a16'.*declares W4A16 routed experts \(Kimi K2.5\)"):
        read_csv(p)


def test_engine_filter_reads_the_same_spellings(tmp_path):
    from calibration.serving_report import validate_serving_bench

    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER}\n{GOOD}\n" + GOOD.replace(",vllm,", ",trtllm,") + "\n")
    doc = validate_serving_bench(str(p), engine="TensorRT-LLM", requests_per_client=2)
    assert [r["engine"] for r in doc["results"]] == ["trtllm"]


def test_rows_kvsim_cannot_simulate_are_said_and_the_others_kept(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(
        f"{HEADER}\n{GOOD}\n"
        + GOOD.replace(LLAMA, "acme/NoSuchModel-7B")
        + "\n"
        + GOOD.replace("h100_sxm", "h100_pcie")
        + "\n"
        + GOOD.replace(",128,", ",abc,")
        + "\n"
        + GOOD.replace(",2,20.5", ",3,20.5")
        + "\n"
    )
    problems: list[str] = []
    rows = read_bench(p, problems)
    assert [r.concurrency for r in rows] == [2, 3]
    assert [m.split(":")[1].strip() for m in problems] == ["row 3, model", "row 4, gpu", "row 5, isl"]
    assert all(m.startswith(f"{p}: row ") and "\n" not in m for m in problems)
    # Without a list to say them in, the first one is the error (as for a library caller).
    with pytest.raises(ConfigError, match=r"row 3, model: got 'acme/NoSuchModel-7B'"):
        read_bench(p)
    # A file with no row left is an error naming the first problem.
    p.write_text(f"{HEADER}\n" + GOOD.replace("h100_sxm", "h100_pcie") + "\n" + GOOD.replace(LLAMA, "acme/X") + "\n")
    with pytest.raises(ConfigError, match=r"2 rows, none that kvsim can simulate.*row 2, gpu: got 'h100_pcie'.*1 more"):
        read_bench(p, [])


def test_a_bad_result_file_in_a_folder_is_said_and_the_others_read(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(vllm_result()))
    (tmp_path / "b.json").write_text(json.dumps(vllm_result(max_concurrency=None)))
    problems: list[str] = []
    (r,) = read_bench(tmp_path, problems, gpu="h100_sxm", tp=1)
    assert r.concurrency == 4 and len(problems) == 1 and "b.json: result, max_concurrency" in problems[0]
    # What the command line must give every file stays an error.
    with pytest.raises(ConfigError, match="^--gpu: got None; the GPU a.json ran on"):
        read_bench(tmp_path, [])
    with pytest.raises(ConfigError, match="^--tp: got None; the tensor-parallel degree a.json ran at: 1, 2, 4 or 8"):
        read_bench(tmp_path, [], gpu="h100")


def vllm_result(**kw) -> dict:
    """The fields of a ``vllm bench serve --save-result`` file the reader uses (and a few it ignores)."""
    doc = {
        "date": "20250101-000000",
        "backend": "vllm",
        "model_id": LLAMA,
        "tokenizer_id": LLAMA,
        "num_prompts": 40,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 12.5,
        "completed": 40,
        "total_input_tokens": 40 * 512 + 7,
        "total_output_tokens": 40 * 64 - 3,
        "request_throughput": 3.2,
        "mean_ttft_ms": 61.5,
        "median_ttft_ms": 60.0,
        "mean_tpot_ms": 8.25,
        "median_tpot_ms": 8.2,
        "mean_itl_ms": 8.3,
    }
    doc.update(kw)
    return doc


def test_vllm_result_json_is_a_closed_loop_row(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps(vllm_result()))
    (r,) = read_bench(p, gpu="h200_sxm", tp=2, weights="fp8")
    assert r == BenchRow(
        model=LLAMA,
        gpu="h200_sxm",
        engine="vllm",
        tp=2,
        isl=512,
        osl=64,
        concurrency=4,
        ttft_ms=61.5,
        tpot_ms=8.25,
        weights="fp8",
        engine_version="",  # the result's backend names its client and engine, not a version
        source="run.json",
        requests=40,  # vllm bench serve counts every request it sent: the run is simulated with as many
    )
    with pytest.raises(ConfigError, match="^--gpu: got None"):
        read_bench(p)
    # The KV dtype is not in the file either: given, it is the row's; left out, the engine's default.
    (r,) = read_bench(p, gpu="h200_sxm", tp=2, weights="fp8", kv="fp8")
    assert r.kv == "fp8"
    with pytest.raises(ConfigError, match=r"run\.json: result, kv: got 'int4'"):
        read_bench(p, gpu="h200_sxm", tp=2, kv="int4")
    p.write_text(json.dumps(vllm_result(max_concurrency=None)))
    with pytest.raises(ConfigError, match=r"run\.json: result, max_concurrency: got None; a closed-loop run"):
        read_bench(p, gpu="h100_sxm", tp=1)
    p.write_text(json.dumps({k: v for k, v in vllm_result().items() if k != "mean_tpot_ms"}))
    with pytest.raises(ConfigError, match=r"run\.json: result, mean_tpot_ms: got None"):
        read_bench(p, gpu="h100_sxm", tp=1)
    p.write_text(json.dumps(vllm_result(model_id="acme/NoSuchModel-7B")))
    with pytest.raises(ConfigError, match=r"run\.json: result, model: got 'acme/NoSuchModel-7B'"):
        read_bench(p, gpu="h100_sxm", tp=1)
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a JSON object"):
        read_bench(p, gpu="h100_sxm", tp=1)


def test_folder_of_results_reads_every_json_and_csv_in_name_order(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps(vllm_result(max_concurrency=8)))
    (tmp_path / "a.json").write_text(json.dumps(vllm_result(max_concurrency=2)))
    (tmp_path / "c.csv").write_text(f"{HEADER}\n{GOOD}\n")
    (tmp_path / "notes.txt").write_text("not a result")
    rows = read_bench(tmp_path, gpu="h100_sxm", tp=1)
    assert [(r.source, r.concurrency) for r in rows] == [("a.json", 2), ("b.json", 8), ("row 2", 2)]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="a folder holding .csv or .json"):
        read_bench(empty)


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


def test_completion_gap_ratio_halves_with_the_output_unless_requests_wait_for_a_completion():
    # A TTFT set by prefill and queueing does not depend on the output: TTFT / (cycle / c) = 1 at
    # every output length only if each request waits for another to finish.
    a = row(ttft_ms=100.0, tpot_ms=10.0, osl=101, concurrency=10)  # cycle 1100 ms: 110 ms between completions
    b = replace(a, osl=201, ttft_ms=100.0)
    c = replace(a, osl=201, ttft_ms=210.0, concurrency=64)  # above max_concurrency: left out
    got = completion_gap_ratios([a, b, c])
    assert got == {(a.group, 10, 101): pytest.approx(100 / 110), (a.group, 10, 201): pytest.approx(100 / 210)}
    # The shipped file: Llama-3.1-8B / TensorRT-LLM at c = 8 stays above 1 at every output length, while
    # Qwen3-32B on the same engine version falls as the output doubles (docs/calibration.md).
    r = completion_gap_ratios(read_bench(TRAINING_FILE))
    llama = [r[("meta-llama/Llama-3.1-8B-Instruct/h100_sxm/trtllm", 8, osl)] for osl in (128, 256, 512)]
    qwen = [r[("Qwen/Qwen3-32B/h100_sxm/trtllm", 8, osl)] for osl in (128, 256, 512)]
    assert min(llama) > 1.1 and llama[2] > 0.65 * llama[0]
    assert qwen[1] < 0.7 * qwen[0] and qwen[2] < 0.7 * qwen[1]
    # Flagged: that group alone, at the concurrencies where it happens.
    assert ttft_follows_completions(read_bench(TRAINING_FILE)) == {
        "meta-llama/Llama-3.1-8B-Instruct/h100_sxm/trtllm": [8, 16, 32]
    }


def test_ttft_that_waits_for_a_completion_is_flagged_and_kvsim_own_runs_are_not():
    def waiting(osl: int, c: int = 8) -> BenchRow:
        # TTFT = one completion gap: solve ttft = (ttft + (osl - 1) * tpot) / c.
        tpot = 5.0
        return row(osl=osl, concurrency=c, tpot_ms=tpot, ttft_ms=(osl - 1) * tpot / (c - 1))

    assert ttft_follows_completions([waiting(128), waiting(512)]) == {waiting(128).group: [8]}
    assert ttft_follows_completions([waiting(128), waiting(200)]) == {}  # outputs too close to tell
    assert ttft_follows_completions([waiting(128, c=64), waiting(512, c=64)]) == {}  # above 32 clients
    # A server's own TTFT (prefill and queueing, here kvsim's) does not grow with the output.
    sims = measured([row(osl=osl, concurrency=8, isl=512) for osl in (16, 64)], builtin_terms())
    assert ttft_follows_completions(sims) == {}


def test_csv_max_num_seqs_column_caps_the_server_and_a_bad_one_names_its_row(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(f"{HEADER},max_num_seqs\n{GOOD},1\n{GOOD},\n")
    a, b = read_csv(p)
    assert (a.max_num_seqs, b.max_num_seqs) == (1, None)
    assert row_scenario(a)["scheduler"]["max_num_seqs"] == 1
    assert "max_num_seqs" not in row_scenario(b).get("scheduler", {})
    p.write_text(f"{HEADER},max_num_seqs\n{GOOD},1\n{GOOD},0\n")
    with pytest.raises(ConfigError) as ei:
        read_csv(p)
    assert str(ei.value).startswith(f"{p}: row 3, max_num_seqs: got '0';"), str(ei.value)


def test_one_request_held_back_gives_the_ttft_that_follows_completions():
    # kvsim's own runs with one request fewer running than clients: each request waits for another
    # to finish, so TTFT follows the completion gap and the runs are flagged (without the cap they
    # are not: test above); hold_back_flagged gives exactly such runs that cap.
    rows = [row(osl=osl, concurrency=8, isl=512, max_num_seqs=7) for osl in (32, 128)]
    sims = measured(rows, builtin_terms())
    free = measured([replace(r, max_num_seqs=None) for r in rows], builtin_terms())
    assert sims[1].ttft_ms > 2 * free[1].ttft_ms
    assert 0.9 < completion_gap_ratios(sims)[(rows[0].group, 8, 128)] < 1.3
    assert ttft_follows_completions(sims) == {rows[0].group: [8]}
    assert ttft_follows_completions(free) == {}
    unmarked = [replace(s, max_num_seqs=None) for s in sims]
    other = row(engine="sglang", osl=16, concurrency=8)  # not flagged: left alone
    kept = replace(unmarked[0], osl=64, max_num_seqs=3)  # sets its own cap: kept
    got, held = hold_back_flagged([*unmarked, other, kept])
    assert [r.max_num_seqs for r in got] == [7, 7, None, 3]
    assert held == {rows[0].group: [8]}
    assert [replace(r, max_num_seqs=None) for r in got[:2]] == unmarked


def apart_runs(spread: float | None) -> list[BenchRow]:
    """Four TensorRT-LLM runs at 4 clients, prompts of 512 to 4096 tokens, with kvsim's own TTFT and
    TPOT (clients starting together, or ``spread`` request cycles apart) as the measurements, and no
    spread recorded: what a file from such a benchmark holds."""
    rows = [
        row(engine="trtllm", isl=isl, osl=128, concurrency=4, start_spread_cycles=spread)
        for isl in (512, 1024, 2048, 4096)
    ]
    return [replace(r, start_spread_cycles=None) for r in measured(rows, builtin_terms(), TINY)]


AIC_ID = "meta_llama_llama_3_1_8b_instruct_h100_sxm_vllm_agg_128x16_c2_tp1_epnone_1"


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


def test_clients_that_did_not_start_together_are_flagged_and_spread_on_request():
    # Clients starting together wait for one another's prompts: TTFT grows by about 2 prefills per
    # prefill at 4 clients; spread a request cycle apart, by about one. Only the second is flagged.
    together, apart = apart_runs(None), apart_runs(1.0)
    assert clients_apart(together, dict(zip(together, gpu_shares(together)))) == {}
    ((g, found),) = clients_apart(apart, dict(zip(apart, gpu_shares(apart)))).items()
    assert g == apart[0].group and found["concurrency"] == 4 and 0.8 < found["per_prefill"] < APART_MAX_PER_PREFILL
    other = row(engine="sglang")  # not flagged: left alone
    own = replace(apart[0], isl=256, start_spread_cycles=0.3)  # gives its own spread: kept
    got, spread = spread_flagged([*apart, other, own], {g: found})
    assert [r.start_spread_cycles for r in got] == [APART_SPREAD_CYCLES] * 4 + [None, 0.3]
    assert spread == [g]
    # Simulated spread, the flagged runs come back to what they measured (the spread they were made
    # with): their longer prompts no longer wait for one another.
    plain, spread_sims = evaluate(apart, builtin_terms(), TINY), evaluate(got[:4], builtin_terms(), TINY)
    assert all(s.ttft_ms < 0.9 * p.ttft_ms for s, p in zip(spread_sims[2:], plain[2:]))
    err = lambda res: sum(abs(x.ttft_err) for x in res)  # noqa: E731
    assert err(spread_sims) < 0.5 * err(plain)


def test_runs_faster_than_their_kernels_are_flagged_and_kvsim_own_runs_are_not():
    # kvsim's own runs (host time included) keep the GPU busy at most all the time.
    rows = [row(isl=isl, osl=osl, concurrency=c) for isl, osl, c in [(512, 32, 8), (1024, 64, 16), (256, 16, 2)]]
    sims = measured(rows, builtin_terms())
    busy = implied_gpu_busy(sims)
    assert all(0 < b <= 1.0 for b in busy), busy
    assert faster_than_kernels(sims) == {}
    # Twice the measured throughput (both times halved) needs about twice the GPU.
    fast = [replace(r, ttft_ms=r.ttft_ms / 2, tpot_ms=r.tpot_ms / 2) for r in sims]
    assert implied_gpu_busy(fast) == pytest.approx([2 * b for b in busy], rel=1e-9)
    flagged = faster_than_kernels(fast + [replace(r, engine="sglang") for r in sims])
    assert list(flagged) == [fast[0].group] and flagged[fast[0].group] > 1.25
    # A row the profile cannot price has no figure, and no group.
    assert implied_gpu_busy([row(tp=16)]) == [None]
    # The shipped file: only Llama-3.1-8B-FP8 / H200 / vLLM, at about twice what its kernels allow.
    shipped = faster_than_kernels(read_bench(TRAINING_FILE))
    assert (
        list(shipped) == ["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"]
        and 1.6 < shipped["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"] < 2.2
    )


def test_single_runs_faster_than_their_kernels_are_named_where_their_group_is_not_flagged():
    rows = [row(isl=isl, osl=osl, concurrency=c) for isl, osl, c in [(512, 32, 8), (1024, 64, 16), (256, 16, 2)]]
    sims = measured(rows, builtin_terms())
    # One run of three at a third of its times: the group's median stays possible, that run is not.
    odd = replace(sims[1], ttft_ms=sims[1].ttft_ms / 3, tpot_ms=sims[1].tpot_ms / 3)
    file = [sims[0], odd, sims[2]]
    busy = implied_gpu_busy(file)
    assert busy[1] > BUSY_LIMIT and max(busy[0], busy[2]) <= 1.0
    fast = faster_than_kernels(file, busy=busy)
    assert fast == {}
    runs = runs_faster_than_kernels(file, busy, fast)
    assert runs == {
        odd.group: [{"isl": 1024, "osl": 64, "concurrency": 16, "tp": 1, "implied_gpu_busy": round(busy[1], 3)}]
    }
    # A group flagged as a whole is said once, as a group, not run by run.
    assert runs_faster_than_kernels(file, busy, {odd.group: 2.0}) == {}
    (line,) = fast_run_warnings(runs)
    assert line.startswith(f"{odd.group}: 1 of its runs needs the GPU computing more than {BUSY_LIMIT}x")
    assert f"1024/64 c16 tp1 {busy[1]:.3f}x" in line
    assert "2 of its runs need the GPU" in fast_run_warnings({odd.group: runs[odd.group] * 2})[0]


def test_the_shipped_file_names_its_4000_token_runs_of_newer_engines_as_faster_than_their_kernels():
    checked = check_rows(served_by_rows(read_bench(TRAINING_FILE), "auto"), None, ())
    named = {(g, x["isl"], x["osl"], x["tp"]) for g, xs in checked.fast_runs.items() for x in xs}
    qwen = "Qwen/Qwen3-32B/h100_sxm"
    # TensorRT-LLM 1.2 and vLLM 0.12 runs of 4000-token prompts, 1.3 to 2.4 times what the GPUs can
    # compute; the other runs of their groups (TensorRT-LLM 1.0) are possible.
    assert {(f"{qwen}/trtllm", 4000, 1000, tp) for tp in (1, 2, 4, 8)} | {
        (f"{qwen}/vllm", 4000, 1000, tp) for tp in (1, 2)
    } <= named
    assert len(named) <= 8 and all(g.startswith(qwen) for g, *_ in named)
    # The group faster than its kernels as a whole is named once, as a group.
    assert list(checked.fast) == ["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"]
    assert not any("FP8" in g for g in checked.fast_runs)


def test_gpu_shares_split_the_busy_time_and_prefills_take_more_of_it_with_shorter_outputs():
    rows = measured([row(isl=512, osl=osl, concurrency=8) for osl in (8, 64)], builtin_terms())
    shares = gpu_shares(rows)
    assert [p + d for p, d in shares] == pytest.approx(implied_gpu_busy(rows), rel=1e-12)
    assert implied_gpu_busy(rows, shares=shares) == implied_gpu_busy(rows)
    (p8, d8), (p64, d64) = shares
    assert p8 > p64 > 0 and d64 > d8 > 0
    assert gpu_shares([row(tp=16)]) == [None]


def test_a_prompt_is_priced_as_its_engine_batches_it():
    """vLLM and TensorRT-LLM run a prompt beside the other clients' decodes: it costs what it adds
    to their iteration. SGLang runs it apart: its own iteration. Both when the row leaves the
    batching to the engine's defaults."""
    rows = [row(engine=e, isl=1024, concurrency=8) for e in ("vllm", "trtllm", "sglang")]
    alone = [row(engine=e, isl=1024, concurrency=1) for e in ("vllm", "trtllm", "sglang")]
    assert all(r.mixed_batches is None for r in rows)
    priced = [c[1] for c in prompt_costs(rows)]
    priced_alone = [c[1] for c in prompt_costs(alone)]
    assert priced[0] < priced_alone[0] and priced[1] < priced_alone[1]
    assert priced[2] == pytest.approx(priced_alone[2], rel=1e-9)
    # gpu_shares prices the prompt the same way (without the host): its prefill share over the
    # row's prompt rate is that price.
    (share, _), (share_alone, _) = gpu_shares([rows[1], alone[1]])
    assert share / (8 / (rows[1].cycle_ms / 1e3)) < share_alone / (1 / (alone[1].cycle_ms / 1e3))


def test_rows_of_one_deployment_are_priced_with_their_own_server_settings():
    """Rows that differ only in their CUDA-graph sizes or batching are priced each with its own: a
    128-sequence decode replays a graph where the server captures 128 and runs eagerly where it
    captures 8, and prompts mix with decodes only where the row says so."""
    few = row(engine="trtllm", isl=512, concurrency=8, cuda_graph_max_batch=8)
    many = replace(few, concurrency=128, cuda_graph_max_batch=128)
    assert gpu_shares([few, many])[1] == gpu_shares([many])[0]
    assert prompt_costs([few, many])[1] == prompt_costs([many])[0]
    apart = row(engine="sglang", isl=512, concurrency=8)
    mixed = replace(apart, mixed_batches=True)
    assert gpu_shares([apart, mixed])[1] == gpu_shares([mixed])[0] != gpu_shares([apart])[0]


def test_prompt_costs_show_a_floor_on_iterations_with_a_prompt():
    """kvsim's own runs with every eager iteration floored at 1 ms per layer, one prompt per
    iteration (a token budget of one prompt beside the decodes): a short prompt's measured cost
    rises well above its price, a long one's (above the floor anyway) hardly moves."""
    rows = [
        row(engine="trtllm", tp=2, isl=isl, osl=64, concurrency=c, max_num_batched_tokens=isl + c)
        for isl, c in [(1024, 8), (8192, 4)]
    ]
    floored = prompt_costs(measured(rows, with_terms(trtllm={"eager_host_per_layer_s": 1e-3})))
    plain = prompt_costs(measured(rows, with_terms()))
    (short_f, short_price), (long_f, long_price) = floored
    (short_p, _), (long_p, _) = plain
    assert [p for _, p in plain] == [short_price, long_price]  # the price is the preset's, not the run's
    assert short_f > short_p + 0.01 and short_f > 2 * short_price
    assert long_f == pytest.approx(long_p, rel=0.1) and long_price > 32 * 1e-3


def split_case(a: float, b: float, tp: int, n: int, lo: float = 0.0, hi: float = 0.8):
    """``n`` results of one TP whose TPOT errors lie on ``a + b × prefill share``, shares from lo to hi."""
    out, shares = [], {}
    for i in range(n):
        r = row(tp=tp, isl=128 + i, concurrency=2 + i)
        x = lo + (hi - lo) * i / max(n - 1, 1)
        shares[r] = (x, 1.0 - x)
        out.append(RowResult(r, ttft_ms=r.ttft_ms, tpot_ms=r.tpot_ms * (1.0 + a + b * x)))
    return out, shares


def test_tpot_error_split_recovers_the_decode_error_and_the_prefill_slope():
    res, shares = [], {}
    for a, b, tp, n in [(0.10, -0.5, 1, 8), (-0.12, 0.0, 8, 8), (0.3, 1.0, 4, SPLIT_MIN_ROWS - 1)]:
        r, s = split_case(a, b, tp, n)
        res += r
        shares.update(s)
    # A row the profile could not price, and one that did not simulate, are left out.
    res.append(RowResult(row(tp=2, isl=999), 20.0, 7.0))
    res.append(RowResult(row(tp=1, isl=998), None, None, error="no"))
    shares[res[-1].row] = (0.5, 0.5)
    split = tpot_error_split(res, shares)
    ((g, fit_all),) = split.items()
    assert g == row().group
    by = fit_all["by_tp"]
    assert list(by) == ["1", "8"]  # TP4 has too few rows
    assert by["1"]["decode"] == pytest.approx(0.10, abs=1e-4) and by["1"]["per_prefill"] == pytest.approx(
        -0.5, abs=1e-4
    )
    assert by["8"]["decode"] == pytest.approx(-0.12, abs=1e-4) and by["8"]["per_prefill"] == pytest.approx(0, abs=1e-4)
    assert by["1"]["rows"] == 8 and by["1"]["prefill_share"] == [0.0, 0.8]
    assert fit_all["rows"] == 8 + 8 + SPLIT_MIN_ROWS - 1
    # Shares that barely differ tell nothing about prefills: no line.
    narrow, sh = split_case(0.0, 1.0, 1, 10, lo=0.3, hi=0.3 + SPLIT_MIN_SPREAD / 2)
    assert tpot_error_split(narrow, sh) == {}


def test_tpot_error_split_table_lists_each_group_then_its_gpu_counts():
    from calibration.serving_tables import SPLIT_HEADER, split_rows

    res, shares = split_case(0.10, -0.5, 1, 8)
    r8, s8 = split_case(-0.12, 0.25, 8, 8)
    rows = split_rows(tpot_error_split(res + r8, {**shares, **s8}))
    assert [len(r) for r in rows] == [len(SPLIT_HEADER)] * 3
    assert rows[0][:2] == [row().group, "all"] and rows[0][2] == "16"
    assert rows[1] == ["", "1", "8", "0.00-0.80", "+10.0%", "-0.50"]
    assert rows[2] == ["", "8", "8", "0.00-0.80", "-12.0%", "+0.25"]


def test_host_time_the_simulator_lacks_shows_as_a_decode_error_that_prefills_dilute(tmp_path):
    # "Measured": kvsim with 4 ms of host time per iteration; predicted with 1 ms (START). Every
    # iteration is short by the same 3 ms, a larger part of a decode iteration than of a prefill's.
    rows = measured(
        [
            row(isl=isl, osl=osl, concurrency=c)
            for isl, osl, c in [(512, 8, 8), (512, 64, 8), (256, 16, 4), (1024, 128, 16), (1024, 8, 16), (128, 256, 2)]
        ],
        with_terms(vllm={"host_s": 4e-3}),
    )
    preds = evaluate(rows, with_terms(), FIXED)
    split = tpot_error_split(preds, dict(zip(rows, gpu_shares(rows))))
    fit_all = split[rows[0].group]
    assert fit_all["rows"] == 6 and fit_all["prefill_share"][1] - fit_all["prefill_share"][0] > SPLIT_MIN_SPREAD
    assert fit_all["decode"] < -0.2 and fit_all["per_prefill"] > 0.1, fit_all
    # The HTML report plots each row's error against its share, with the group's line.
    from calibration.serving_html import write_html

    shares = dict(zip(rows, gpu_shares(rows)))
    doc = {
        "rows": len(rows),
        "protocol": "test",
        "score": score(preds),
        "tpot_error_split": split,
        "results": [{**p.to_json(), "prefill_share": shares[p.row][0]} for p in preds],
    }
    html = write_html(doc, tmp_path / "v.html").read_text()
    assert "TPOT error (%) against prefill share" in html
    line = f"{fit_all['decode']:+.1%} with no prefill, {fit_all['per_prefill']:+.2f} per prefill share"
    assert line in html and html.count("with no prefill") == 1  # one group, one line
    # With the host time it was measured with, nothing is left to split.
    same = tpot_error_split(evaluate(rows, with_terms(vllm={"host_s": 4e-3}), FIXED), dict(zip(rows, gpu_shares(rows))))
    assert abs(same[rows[0].group]["decode"]) < 1e-6 and abs(same[rows[0].group]["per_prefill"]) < 1e-6


def ttft_case(points: list[tuple[float, float, float | None]], concurrency: int = 8, **kw):
    """Results at one concurrency: per point, one prompt's prefill (ms, through its share), the
    measured TTFT and the simulated one (``None``: the row did not simulate)."""
    out, shares = [], {}
    for i, (prefill, ttft, sim) in enumerate(points):
        r = row(isl=128 + i, concurrency=concurrency, ttft_ms=ttft, **kw)
        shares[r] = (prefill * concurrency / r.cycle_ms, 0.5)
        out.append(RowResult(r, ttft_ms=sim, tpot_ms=None if sim is None else r.tpot_ms))
    return out, shares


def test_ttft_vs_prefill_fits_the_lowest_concurrency_measured_and_simulated():
    # Measured: no front end, 4 prefills' wait; simulated: a 100 ms front end and one prefill.
    xs = [20.0, 40.0, 80.0, 160.0, 240.0]
    res, shares = ttft_case([(x, 4.0 * x, 100.0 + x) for x in xs])
    # Runs at a higher concurrency do not count, nor does the row the profile could not price.
    hi, sh_hi = ttft_case([(x, 50 * x, 50 * x) for x in xs], concurrency=32)
    lost = RowResult(row(isl=999, concurrency=8, ttft_ms=1e6), 1e6, 7.0)
    lines = ttft_vs_prefill(res + hi + [lost], {**shares, **sh_hi, lost.row: None})
    ((g, f),) = lines.items()
    assert g == row().group and f["concurrency"] == 8 and f["runs"] == 5 and f["prefill_ms"] == [20.0, 240.0]
    assert f["measured"]["intercept_ms"] == pytest.approx(0.0, abs=0.05) and f["measured"]["per_prefill"] == 4.0
    assert f["simulated"]["intercept_ms"] == pytest.approx(100.0, abs=0.05) and f["simulated"]["per_prefill"] == 1.0
    # Too few simulated runs: no simulated line, the measured one stays.
    part, sh = ttft_case([(x, 4.0 * x, None if x > 40 else x) for x in xs])
    assert ttft_vs_prefill(part, sh)[g]["simulated"] is None
    # Too few runs, or prefills too alike to tell a slope from an intercept: no line.
    few, sh = ttft_case([(x, 4.0 * x, x) for x in xs[: TTFT_LINE_MIN_ROWS - 1]])
    assert ttft_vs_prefill(few, sh) == {}
    alike, sh = ttft_case([(100.0 + i, 400.0 + i, 100.0) for i in range(6)])
    assert ttft_vs_prefill(alike, sh) == {}


def test_ttft_vs_prefill_table_row():
    from calibration.serving_tables import TTFT_LINE_HEADER, ttft_line_rows

    res, shares = ttft_case([(x, 110.0 + 5.0 * x, 150.0 + 1.5 * x) for x in (10.0, 20.0, 50.0, 100.0)])
    rows = ttft_line_rows(ttft_vs_prefill(res, shares))
    assert rows == [[row().group, "8", "4", "10-100", "110 ms + 5.00 x prefill", "150 ms + 1.50 x prefill"]]
    assert len(rows[0]) == len(TTFT_LINE_HEADER)


def scaling_case(tpot_by_tp: dict[int, float], sim_by_tp: dict[int, float | None], **kw) -> list[RowResult]:
    """One run per tensor-parallel size: measured TPOT ``tpot_by_tp[tp]``, simulated ``sim_by_tp[tp]``."""
    return [
        RowResult(row(tp=tp, tpot_ms=m, **kw), ttft_ms=20.0 if sim_by_tp[tp] else None, tpot_ms=sim_by_tp[tp])
        for tp, m in tpot_by_tp.items()
    ]


def test_tp_scaling_pairs_each_gpu_count_with_the_next_and_takes_medians_over_lengths():
    res = []
    # Three prompt lengths at c = 8 on 1, 2 and 4 GPUs: measured gains 1 -> 2 of 1.5, 1.8, 2.0.
    for isl, m2 in [(128, 10 / 1.5), (256, 10 / 1.8), (512, 10 / 2.0)]:
        res += scaling_case({1: 10.0, 2: m2, 4: m2 / 1.2}, {1: 9.0, 2: 6.0, 4: 4.0}, isl=isl, concurrency=8)
    # Run on 1 and 4 GPUs only: nothing to compare with the next size (2), so no pair.
    res += scaling_case({1: 10.0, 4: 2.0}, {1: 9.0, 4: 1.0}, isl=1024, concurrency=8)
    # At c = 16 the 4-GPU run failed to simulate: only 1 -> 2.
    res += scaling_case({1: 12.0, 2: 8.0, 4: 5.0}, {1: 12.0, 2: 6.0, 4: None}, concurrency=16)
    ((g, pts),) = tp_scaling(res).items()
    assert g == row().group
    assert pts == [
        {"tp": [1, 2], "concurrency": 8, "runs": 3, "measured": 1.8, "simulated": 1.5},
        {"tp": [1, 2], "concurrency": 16, "runs": 1, "measured": 1.5, "simulated": 2.0},
        {"tp": [2, 4], "concurrency": 8, "runs": 3, "measured": 1.2, "simulated": 1.5},
    ]
    # Groups are kept apart: another engine's runs make a group of their own.
    other = scaling_case({4: 8.0, 8: 8.0}, {4: 8.0, 8: 5.0}, engine="trtllm")
    both = tp_scaling(res + other)
    assert both[row(engine="trtllm").group] == [
        {"tp": [4, 8], "concurrency": 2, "runs": 1, "measured": 1.0, "simulated": 1.6}
    ]
    assert both[g] == pts
    # A size whose runs all failed to simulate still sits between its neighbours: no 1 -> 4 pair.
    gap = scaling_case({1: 10.0, 2: 6.0, 4: 4.0}, {1: 9.0, 2: None, 4: 4.0}, engine="sglang")
    assert row(engine="sglang").group not in tp_scaling(gap)


def test_tp_scaling_table_shows_each_groups_largest_pair_of_gpu_counts():
    from calibration.serving_tables import SCALING_HEADER, scaling_rows

    res = scaling_case({1: 10.0, 2: 5.0, 4: 4.0}, {1: 10.0, 2: 6.0, 4: 4.0}, concurrency=8)
    res += scaling_case({1: 12.0, 2: 8.0, 4: 8.0}, {1: 12.0, 2: 6.0, 4: 4.0}, concurrency=32)
    rows = scaling_rows(tp_scaling(res))
    assert [len(r) for r in rows] == [len(SCALING_HEADER)] * 2
    assert rows == [[row().group, "2 -> 4", "8", "1", "1.25x", "1.50x"], ["", "2 -> 4", "32", "1", "1.00x", "1.50x"]]


# --- fitting ---------------------------------------------------------------------------------

#: Rows of two engines (each fitted on its own rows): concurrency and lengths vary so host time per
#: iteration (TPOT) and the front end (TTFT) are told apart.
FIT_ROWS = [
    row(engine=e, tp=tp, isl=isl, osl=osl, concurrency=c)
    for e in ("vllm", "trtllm")
    for tp, isl, osl, c in [(1, 256, 32, 2), (1, 512, 16, 8), (2, 128, 32, 4), (1, 1024, 16, 16)]
]
KNOWN = {"vllm": {"host_s": 3e-3, "frontend_s": 20e-3}, "trtllm": {"host_s": 0.4e-3, "frontend_s": 12e-3}}


def test_fit_recovers_known_terms():
    rows = measured(FIT_ROWS, with_terms(**KNOWN))
    start = with_terms()
    start_loss = objective(evaluate(rows, start, FIXED))
    assert start_loss > 0.2  # the start is far from the terms the rows were made with
    got = fit(rows, start, FIXED, terms=("host_s", "frontend_s"), max_evals=60)
    assert got.loss < 0.01 and got.loss == pytest.approx(objective(evaluate(rows, got, FIXED)))
    assert got.groups == sorted({r.group for r in rows})
    for e, known in KNOWN.items():
        for k, v in known.items():
            assert got.engines[e][k] == pytest.approx(v, rel=0.02), (e, k)
        # Terms not fitted stay where they started.
        assert got.engines[e]["host_per_seq_s"] == start.engines[e]["host_per_seq_s"]
    for res in evaluate(rows, got, FIXED):
        assert abs(res.ttft_err) < 0.02 and abs(res.tpot_err) < 0.02, res.row


def test_term_sensitivity_tells_the_terms_the_rows_pin_from_those_they_do_not():
    rows = measured(FIT_ROWS[:4], with_terms(vllm=KNOWN["vllm"]))
    truth = with_terms(vllm=KNOWN["vllm"])
    sens = term_sensitivity(rows, truth, FIXED)
    assert set(sens) == {"vllm"} and sens["vllm"]["objective"] < 1e-6  # the rows were made with these terms
    got = sens["vllm"]["terms"]
    assert list(got) == list(FITTED_TERMS)
    # Host time sets TPOT and the front end TTFT: halving or doubling either costs points of error.
    for name in ("host_s", "frontend_s", "host_hidden"):
        assert got[name]["pinned"] and max(p["objective_change"] for p in got[name]["probes"]) > 0.02, name
    assert [p["value"] for p in got["host_s"]["probes"]] == [1.5e-3, 6e-3]
    # What the printed notes say of the probes is what they are.
    from calibration.serving_fit import SENSITIVITY_FACTOR, SENSITIVITY_SHARE_STEP
    from calibration.serving_notes import PROBED

    assert SENSITIVITY_FACTOR == 2 and PROBED == f"halved and doubled, a share by {SENSITIVITY_SHARE_STEP:g}"
    # The clients' jitter is the benchmark's (FIXED sets it), and the token stream never binds at a few
    # thousand tokens/s: these rows say nothing of either (both at 0: probed at the unfitted start).
    for name in ("client_cv", "stream_per_token_s"):
        assert not got[name]["pinned"] and len(got[name]["probes"]) == 1, name
        assert abs(got[name]["probes"][0]["objective_change"]) < 0.005, name
    assert not any(t["short_of_minimum"] for t in got.values())
    # Terms a fit left short of the minimum: a probe finds a lower objective.
    short = term_sensitivity(rows, with_terms(vllm={**KNOWN["vllm"], "host_s": 1.5e-3}), FIXED)["vllm"]["terms"]
    assert short["host_s"]["short_of_minimum"]
    assert min(p["objective_change"] for p in short["host_s"]["probes"]) < -0.02


def test_fit_leaves_a_share_term_that_starts_at_zero():
    """A share that starts at its bound (the clients' spread at 0, as the presets had it before any fit)
    must be able to leave it: a step of 0.3 in logit space from there changes nothing simulated."""
    rows = [
        row(tp=tp, isl=isl, osl=32, concurrency=c)
        for tp, isl, c in [(1, 1024, 8), (1, 512, 16), (2, 2048, 8), (1, 1024, 32)]
    ]
    # The spread the terms give (not the benchmark rows' start together), fitted from 0 when asked for.
    clients = Clients(requests_per_client=4, warmup=1, client_cv=0.0, start_spread_cycles=None)
    rows = measured(rows, with_terms(vllm={"client_spread_cycles": 0.5}), clients)
    at_zero = with_terms(vllm={"client_spread_cycles": 0.0})
    start_loss = objective(evaluate(rows, at_zero, clients))
    got = fit(rows, at_zero, clients, terms=("client_spread_cycles",), max_evals=30)
    assert start_loss > 0.3 and got.loss < 0.05
    assert got.engines["vllm"]["client_spread_cycles"] == pytest.approx(0.5, abs=0.05)


def test_fit_leaves_no_spread_of_the_front_end():
    """The front end's coefficient of variation starts at 0 in the presets; the fit must move it
    (to where the rows were made) rather than step around 0 in log space."""
    rows = [
        row(tp=tp, isl=isl, osl=16, concurrency=c)
        for tp, isl, c in [(1, 1024, 16), (1, 512, 32), (2, 2048, 16), (1, 1024, 32)]
    ]
    clients = Clients(requests_per_client=4, warmup=1, start_spread_cycles=None)  # spread and cv from the terms
    made = {"client_spread_cycles": 0.5, "frontend_s": 0.05}
    rows = measured(rows, with_terms(vllm={**made, "client_cv": 1.0}), clients)
    start = with_terms(vllm=made)
    start_loss = objective(evaluate(rows, start, clients))
    got = fit(rows, start, clients, terms=("client_cv",), max_evals=20)
    assert start_loss > 0.05 and got.loss < start_loss / 3, (start_loss, got.loss)
    assert got.engines["vllm"]["client_cv"] > 0.3


def test_fit_moves_the_per_token_completion_time_off_zero():
    """The presets hold ``completion_per_token_s`` at 0, below its log scale's floor: the fit's first
    step must still reach a value that moves TTFT, and the fit then comes near the one the rows
    were made with."""
    rows = [row(isl=isl, osl=256, concurrency=c) for isl, c in [(512, 4), (1024, 8), (256, 8)]]
    rows = measured(rows, with_terms(vllm={"completion_per_token_s": 40e-6}), FIXED)
    start = with_terms(vllm={"completion_per_token_s": 0.0})
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("completion_per_token_s",), max_evals=20)
    assert start_loss > 0.05 and got.loss < start_loss / 5, (start_loss, got.loss)
    assert got.engines["vllm"]["completion_per_token_s"] == pytest.approx(40e-6, rel=0.25)


def test_fit_finds_the_token_stream_from_no_stream():
    """Rows whose engine outpaces a 1 ms-per-token stream (TTFT queued behind it, output capped
    at 1 k tokens/s), fitted from no stream: the fit starts the stream where it binds (50 us), and
    comes back to the one the rows were made with."""
    rows = [row(isl=isl, osl=64, concurrency=c) for isl, c in [(128, 16), (256, 32), (512, 24), (128, 4)]]
    rows = measured(rows, with_terms(vllm={"stream_per_token_s": 1e-3}), FIXED)
    start = with_terms()
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("stream_per_token_s",), max_evals=25)
    assert start_loss > 0.2 and got.loss < 0.01, (start_loss, got.loss)
    assert got.engines["vllm"]["stream_per_token_s"] == pytest.approx(1e-3, rel=0.02)


def test_fit_finds_the_eager_launch_floor_from_none():
    """TensorRT-LLM runs every iteration with a prompt eagerly. Rows made with 1 ms per layer of
    launches (a 32-layer model's prompt iterations floored at 32 ms, above their GPU time on two
    GPUs), fitted from none: the fit starts the term where it binds and comes back to 1 ms."""
    rows = [
        row(engine="trtllm", tp=tp, isl=isl, osl=16, concurrency=c)
        for tp, isl, c in [(2, 256, 4), (2, 512, 8), (1, 128, 8), (2, 1024, 2)]
    ]
    rows = measured(rows, with_terms(trtllm={"eager_host_per_layer_s": 1e-3}), FIXED)
    start = with_terms(trtllm={"eager_host_per_layer_s": 0.0})
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("eager_host_per_layer_s",), max_evals=25)
    assert start_loss > 0.1 and got.loss < 0.01, (start_loss, got.loss)
    assert got.engines["trtllm"]["eager_host_per_layer_s"] == pytest.approx(1e-3, rel=0.05)


def test_fit_starts_from_the_best_spread_and_front_end_pair():
    """A large front end with clients spread over a whole cycle and a small one with clients in
    lock-step can give similar TTFTs; from a start at lock-step and 5 ms the fit must reach the pair
    the rows were made with."""
    rows = [
        row(tp=tp, isl=isl, osl=32, concurrency=c)
        for tp, isl, c in [(1, 1024, 8), (1, 512, 16), (2, 2048, 8), (1, 1024, 32), (1, 256, 4)]
    ]
    clients = Clients(requests_per_client=4, warmup=1, client_cv=0.0, start_spread_cycles=None)
    made = {"client_spread_cycles": 0.95, "frontend_s": 0.1}
    rows = measured(rows, with_terms(vllm=made), clients)
    at_zero = with_terms(vllm={"client_spread_cycles": 0.0})
    got = fit(rows, at_zero, clients, terms=("frontend_s", "client_spread_cycles"), max_evals=30)
    assert got.loss < 0.05
    assert got.engines["vllm"]["frontend_s"] == pytest.approx(0.1, rel=0.1)


def test_fit_with_a_prior_keeps_what_the_rows_leave_free_at_the_prior():
    """Rows far below any token stream's ceiling pin the host time, not the stream: fitted with a
    prior, the host time still comes back to the one the rows were made with, and the stream, which
    the rows leave free, goes to the prior's instead of staying where the fit started."""
    rows = [row(isl=isl, osl=32, concurrency=c) for isl, c in [(256, 2), (512, 8), (128, 4)]]
    rows = measured(rows, with_terms(vllm={"host_s": 3e-3}), FIXED)
    start = with_terms(vllm={"stream_per_token_s": 30e-6})
    prior = EngineTerms({"vllm": {"host_s": 1e-3, "stream_per_token_s": 7e-6}})
    keys = ("host_s", "stream_per_token_s")
    free = fit(rows, start, FIXED, terms=keys, max_evals=40)
    pulled = fit(rows, start, FIXED, terms=keys, max_evals=40, prior=prior)
    assert free.engines["vllm"]["stream_per_token_s"] > 20e-6  # nothing moved it
    # within the simplex's tolerance (a pull of 0.04 % of error is below it)
    assert pulled.engines["vllm"]["stream_per_token_s"] == pytest.approx(7e-6, rel=0.3)
    for got in (free, pulled):
        assert got.engines["vllm"]["host_s"] == pytest.approx(3e-3, rel=0.1)
    # The reported loss holds the pull; a term a factor of 2 from the prior costs what pins a term.
    assert pulled.loss >= prior_penalty(pulled.engines["vllm"], prior.engines["vllm"])
    assert prior_penalty({"host_s": 2e-3}, {"host_s": 1e-3}) == pytest.approx(0.005)
    # Probing the pulled fit: each probe says how the pull changes, and a probe towards the rows' own
    # optimum that the pull outweighs does not count as the fit stopping short.
    sens = term_sensitivity(rows, pulled, FIXED, prior=prior)["vllm"]["terms"]
    stream = sens["stream_per_token_s"]
    assert all("pull_change" in p for p in stream["probes"]) and not stream["pinned"]
    assert max(p["pull_change"] for p in stream["probes"]) > 0.004 and not stream["short_of_minimum"]
    assert sens["host_s"]["pinned"]


def test_fit_rejects_no_rows():
    with pytest.raises(ConfigError, match="at least one benchmark row"):
        fit([])


def test_leave_one_group_out():
    # The clients' start spread is pinned at 0 here: a fitted spread is never exactly 0 (a share in
    # (0, 1)), and the smallest spread already breaks the lock-step the rows were made with.
    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    known = with_terms(vllm={"host_s": 4e-3, "frontend_s": 25e-3})
    qwen = measured(
        [row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]],
        known,
        clients,
    )
    llama = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]], known, clients)
    sgl = [row(engine="sglang", isl=256, osl=16, concurrency=4)]
    rows = qwen + llama + sgl
    start = with_terms()
    res = leave_one_group_out(rows, start=start, clients=clients, fit_clients=clients, max_evals=60)
    groups = sorted({r.group for r in rows})
    assert sorted(res.folds) == groups
    assert sorted(map(repr, (p.row for p in res.predictions))) == sorted(map(repr, rows))  # each row once
    assert all(p.error is None for p in res.predictions)
    # SGLang has one group: its terms are the ones shared by the other engines' groups, fitted on
    # them (here every other row was made with the known vLLM terms, so those come back).
    sgl_fold = res.folds[sgl[0].group]
    assert set(sgl_fold.engines) == {"sglang"} and sgl_fold.groups == sorted({r.group for r in qwen + llama})
    assert sgl_fold.engines["sglang"]["host_s"] == pytest.approx(4e-3, rel=0.1)
    assert sgl_fold.engines["sglang"]["frontend_s"] == pytest.approx(25e-3, rel=0.1)
    # Each vLLM group is predicted by terms fitted on the other one alone (all five terms), which come
    # back to the ones the rows were made with.
    for held in (qwen, llama):
        other = llama if held is qwen else qwen
        fold = res.folds[held[0].group]
        assert set(fold.engines) == {"vllm"} and fold.groups == [other[0].group]
        assert fold.loss < 0.05 < 0.4 < objective(evaluate(other, start, clients))
        assert fold.engines["vllm"]["host_s"] == pytest.approx(4e-3, rel=0.1)
        assert fold.engines["vllm"]["frontend_s"] == pytest.approx(25e-3, rel=0.1)
        again = evaluate(held, fold, clients)
        mine = [p for p in res.predictions if p.row.group == held[0].group]
        assert [(p.ttft_ms, p.tpot_ms) for p in mine] == [(a.ttft_ms, a.tpot_ms) for a in again]
    # A group excluded from training leaves the other vLLM group only the other engines' groups to fit on ...
    res2 = leave_one_group_out(rows, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,))
    assert res2.folds[llama[0].group].groups == [sgl[0].group]
    # ... and nothing at all without them: the starting terms.
    res3 = leave_one_group_out(
        qwen + llama, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,)
    )
    assert res3.folds[llama[0].group].engines == {"vllm": start.engines["vllm"]}


def test_leave_one_group_out_pulls_each_fold_towards_terms_shared_by_its_training_groups(monkeypatch):
    import calibration.serving_fit as serving_fit

    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    made = {"host_s": 4e-3, "frontend_s": 25e-3}
    known = with_terms(vllm=made, sglang=made)
    qwen = measured(
        [
            row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c)
            for isl, c in [(256, 2), (512, 8), (128, 4)]
        ],
        known,
        clients,
    )
    llama = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]], known, clients)
    sgl = measured([row(engine="sglang", isl=isl, osl=16, concurrency=4) for isl in (256, 128, 512)], known, clients)
    rows = qwen + llama + sgl
    priors: dict[str, list[BenchRow]] = {}
    real = serving_fit.fit_shared

    def spy(train, engine, *a, **k):
        priors[engine + str(len(priors))] = train
        return real(train, engine, *a, **k)

    monkeypatch.setattr(serving_fit, "fit_shared", spy)
    res = leave_one_group_out(
        rows, start=with_terms(), clients=clients, max_evals=60, pooled_prior=True, log=lambda m: None
    )
    # Each vLLM fold's prior is fitted on every third run of each other group (its engine's and the
    # others'); SGLang, with no other group, is fitted on all of them, shared, as without the prior.
    got = sorted(sorted(map(repr, t)) for t in priors.values())
    thirds = lambda *gs: sorted(repr(r) for g in gs for r in g[::3])  # noqa: E731
    assert got == sorted([thirds(llama, sgl), thirds(qwen, sgl), sorted(map(repr, qwen + llama))])
    # Every run was made with the same terms, so pulled or not each fold fits its training group and
    # predicts the held-out one.
    for held in (qwen, llama):
        other = llama if held is qwen else qwen
        fold = res.folds[held[0].group]
        assert fold.groups == [other[0].group]
        assert objective(evaluate(other, fold, clients)) < 0.05
        assert objective([p for p in res.predictions if p.row.group == held[0].group]) < 0.1


def test_leave_one_group_out_blind_trains_on_treated_runs_and_predicts_the_files_own(monkeypatch):
    # ``predict``: each fold fits on the treated runs of the other groups and predicts the held-out
    # group from its runs as the file gives them, so no prediction reads its own measured times.
    import calibration.serving_fit as serving_fit

    raw = [row(isl=isl, concurrency=8) for isl in (256, 512)] + [
        row(model="Qwen/Qwen3-32B", tp=2, isl=isl, concurrency=8) for isl in (256, 512)
    ]
    treated, _ = hold_back_flagged(raw, {r.group: [8] for r in raw})
    assert [r.max_num_seqs for r in treated] == [7] * 4
    trained, predicted = {}, {}

    def fake_fit(train, start, *a, **k):
        trained[next(r.group for r in raw if r.group not in {t.group for t in train})] = train
        return EngineTerms(dict(start.engines), loss=0.0, evals=1)

    def fake_evaluate(rows, terms, *a, **k):
        predicted[rows[0].group] = rows
        return [RowResult(r, None, None) for r in rows]

    monkeypatch.setattr(serving_fit, "fit", fake_fit)
    monkeypatch.setattr(serving_fit, "evaluate", fake_evaluate)
    res = leave_one_group_out(treated, start=with_terms(), predict=raw)
    for g in {r.group for r in raw}:
        assert trained[g] == [t for t in treated if t.group != g]
        assert predicted[g] == [r for r in raw if r.group == g]
    assert [p.row for p in res.predictions] == sorted(raw, key=lambda r: r.group)
    leave_one_group_out(treated, start=with_terms())  # without it, the treated runs predicted
    assert all(r.max_num_seqs == 7 for rs in predicted.values() for r in rs)
    with pytest.raises(ValueError, match="line up"):
        leave_one_group_out(treated, start=with_terms(), predict=raw[:3])


def test_fit_each_group_recovers_each_groups_own_terms():
    # Two groups of one engine made with different host times: leave-one-group-out can only give
    # each the other's, each group's own fit gives it its own.
    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    qwen = measured(
        [row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]],
        with_terms(vllm={"host_s": 6e-3}),
        clients,
    )
    llama = measured(
        [row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]],
        with_terms(vllm={"host_s": 2e-3}),
        clients,
    )
    start = with_terms()
    res = fit_each_group(qwen + llama, start=start, clients=clients, max_evals=60)
    assert sorted(res.folds) == sorted({qwen[0].group, llama[0].group})
    assert sorted(map(repr, (p.row for p in res.predictions))) == sorted(map(repr, qwen + llama))
    for held, host in ((qwen, 6e-3), (llama, 2e-3)):
        fold = res.folds[held[0].group]
        assert fold.groups == [held[0].group] and fold.loss < 0.05
        assert fold.engines["vllm"]["host_s"] == pytest.approx(host, rel=0.1)
        mine = [p for p in res.predictions if p.row.group == held[0].group]
        assert [(p.ttft_ms, p.tpot_ms) for p in mine] == [(a.ttft_ms, a.tpot_ms) for a in evaluate(held, fold, clients)]
    # The other group's terms miss this one: what the two protocols, side by side, tell apart.
    assert objective(evaluate(qwen, res.folds[llama[0].group], clients)) > 0.1
    # A group excluded is not fitted: it keeps the starting terms.
    kept = fit_each_group(
        qwen + llama, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,)
    )
    assert kept.folds[qwen[0].group].engines == {"vllm": start.engines["vllm"]}


def test_fit_does_not_train_on_excluded_groups():
    known = with_terms(vllm={"host_s": 3e-3})
    good = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]], known)
    # A group of the same engine whose "measurements" are 3x slow: trained on, it would pull host_s up.
    bad = [replace(r, model="Qwen/Qwen3-32B", tp=2, tpot_ms=r.tpot_ms * 3) for r in good]
    got = fit(good + bad, with_terms(), FIXED, terms=("host_s",), max_evals=40, exclude=(bad[0].group,))
    assert got.groups == [good[0].group]
    assert got.engines["vllm"]["host_s"] == pytest.approx(3e-3, rel=0.05)
    # An engine whose every group is excluded keeps its starting terms.
    sgl = [row(engine="sglang")]
    got2 = fit(good + sgl, with_terms(), FIXED, terms=("host_s",), max_evals=5, exclude=(sgl[0].group,))
    assert got2.engines["sglang"] == with_terms().engines["sglang"]


def test_parallel_evaluation_matches_serial():
    rows = FIT_ROWS[:4]
    a = evaluate(rows, builtin_terms(), TINY)
    b = evaluate(rows, builtin_terms(), TINY, workers=2)
    assert all(r.error is None for r in a)
    assert [(r.ttft_ms, r.tpot_ms) for r in a] == [(r.ttft_ms, r.tpot_ms) for r in b]


# --- terms files -----------------------------------------------------------------------------


def test_terms_file_round_trip_and_errors(tmp_path):
    t = with_terms(vllm={"host_s": 2.5e-3})
    p = t.write(tmp_path / "t.json")
    terms = read_terms_file(p)
    assert set(terms) == set(PRESETS) and terms["vllm"]["host_s"] == 2.5e-3
    assert set(terms["vllm"]) == set(FITTED_TERMS)
    sc = scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p)}})
    assert engine_preset(sc).host_s == 2.5e-3
    # engine.* keys win over the file.
    sc = scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p), "host_s": 1e-4}})
    assert engine_preset(sc).host_s == 1e-4
    bad = tmp_path / "bad.json"
    for doc, where in [
        ({"format": "other", "engines": {}}, "engine.terms_file"),
        ({"format": "kvsim-engine-terms", "engines": {"tgi": {}}}, "engines.tgi"),
        ({"format": "kvsim-engine-terms", "engines": {"vllm": {"host_s": -1}}}, "engines.vllm.host_s"),
        ({"format": "kvsim-engine-terms", "engines": {"vllm": {"warp": 1}}}, "engines.vllm.warp"),
    ]:
        bad.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            read_terms_file(bad)


def test_a_terms_file_is_validated_once_per_content(tmp_path):
    """A deployment asks for the terms more than once (its preset, its engine defaults, the
    unused-terms check): the file is parsed once, and an edit is read, never a stale copy."""
    from sim.engine.deployment import Deployment, with_engine_defaults
    from sim.engine_presets import _parse_terms

    p = with_terms(vllm={"host_s": 2.5e-3}).write(tmp_path / "t.json")
    sc = with_engine_defaults(scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p)}}))
    _parse_terms.cache_clear()
    Deployment.from_scenario(sc)
    info = _parse_terms.cache_info()
    assert info.misses == 1 and info.hits >= 1, info
    with_terms(vllm={"host_s": 3.5e-3}).write(p)
    assert engine_preset(sc).host_s == 3.5e-3
    # Callers get their own dicts: changing one does not change the next read.
    read_terms_file(p)["vllm"]["host_s"] = 1.0
    assert read_terms_file(p)["vllm"]["host_s"] == 3.5e-3


def test_terms_file_refuses_a_key_given_twice(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"format": "kvsim-engine-terms", "engines": {"vllm": {"host_s": 0.001, "host_s": 0.002}}}')
    with pytest.raises(ConfigError) as e:
        read_terms_file(p)
    msg = str(e.value)
    assert msg.startswith("engine.terms_file: ") and "'host_s' is given twice" in msg and "\n" not in msg, msg


def test_a_terms_file_without_the_running_engine_says_so(tmp_path, caplog):
    from sim.engine.deployment import Deployment

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"format": "kvsim-engine-terms", "engines": {"sglang": {"host_s": 0.002}}}))

    def warnings(engine: dict) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvsim"):
            Deployment.from_scenario(scenario_from_dict({"engine": {**engine, "terms_file": str(p)}}))
        return [r.getMessage() for r in caplog.records]

    (line,) = warnings({"kind": "vllm"})
    assert str(p) in line and "sglang" in line and "vllm" in line and "\n" not in line, line
    (line,) = warnings({"kind": "reference"})
    assert str(p) in line and "sglang" in line and "reference" in line, line
    assert warnings({"kind": "sglang"}) == []


# --- command line ----------------------------------------------------------------------------


def kvsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=180
    )


TINY_CSV = (
    f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,2,16.0,7.5\n{LLAMA},h100_sxm,vllm,1,256,16,4,25.0,8.0\n"
    f"Qwen/Qwen3-32B,h100_sxm,vllm,2,128,16,2,30.0,12.0\n{LLAMA},h100_sxm,sglang,1,128,16,2,18.0,7.0\n"
)


def test_calibrate_with_prior_hands_its_starting_terms_to_the_fit_as_prior(tmp_path, monkeypatch):
    import calibration.serving_report as report

    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    seen = []
    real = report.fit

    def spy(rows, start, *a, **k):
        seen.append((start, k.get("prior")))
        return real(rows, start, *a, **k)

    monkeypatch.setattr(report, "fit", spy)
    for prior in (False, True):
        report.calibrate_from_serving_bench(
            str(tmp_path / "tiny.csv"), tmp_path / f"t{prior}.json", max_evals=3, sensitivity=False, prior=prior
        )
    (start0, none), (start1, pulled) = seen
    assert none is None and pulled is start1 and start1.engines == builtin_terms().engines
    assert set(read_terms_file(tmp_path / "tTrue.json")) == {"sglang", "vllm"}


def test_cli_calibrate_writes_terms_a_scenario_runs_with(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    r = kvsim("calibrate", "--from-serving-bench", "tiny.csv", "--out", "t.json", "--max-evals", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote t.json" in r.stdout
    terms = read_terms_file(tmp_path / "t.json")
    assert set(terms) == {"sglang", "vllm"} and all(set(v) == set(FITTED_TERMS) for v in terms.values())
    doc = json.loads((tmp_path / "t.json").read_text())
    # Each engine's fit evaluates at least its first simplex (six points for five terms).
    assert doc["evals"] >= 12 and doc["fitted_on"] == "tiny.csv" and len(doc["groups"]) == 3
    # How firmly the rows pin each term, in the file and on the screen.
    assert set(doc["sensitivity"]) == {"sglang", "vllm"}
    assert all(set(d["terms"]) == set(FITTED_TERMS) for d in doc["sensitivity"].values())
    assert "  sglang: objective" in r.stdout and "  vllm: objective" in r.stdout
    assert sum(" -> " in line and "pinned" in line for line in r.stdout.splitlines()) == 2 * len(FITTED_TERMS)
    (tmp_path / "sc.yaml").write_text(
        "name: fitted\nmodel: {name: llama-3.1-8b}\ngpu: {name: H100-SXM-80GB}\n"
        "workload: {num_requests: 12, max_model_len: 512, arrival: {kind: closed_loop, concurrency: 3},\n"
        "           lengths: {kind: fixed, prompt_tokens: 128, output_tokens: 8}}\n"
        "engine: {kind: vllm, terms_file: t.json}\n"
    )
    r = kvsim("run", "sc.yaml", "-q", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 12
    # The run used the file's vLLM terms: the same scenario with them written as engine.* keys runs the same.
    import yaml

    data = yaml.safe_load((tmp_path / "sc.yaml").read_text())
    data["engine"] = {"kind": "vllm", **terms["vllm"]}
    assert terms["vllm"] != {k: getattr(PRESETS["vllm"], k) for k in FITTED_TERMS}  # the fit moved them
    same = simulate(scenario_from_dict(data)).summary
    assert same["makespan_s"] == summary["makespan_s"]


def test_cli_validate_writes_json_and_offline_html(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    assert doc["rows"] == 4 and len(doc["results"]) == 4 and doc["requests_per_client"] == 2
    assert all(x["error"] is None and x["sim_ttft_ms"] > 0 and x["sim_tpot_ms"] > 0 for x in doc["results"])
    assert len(doc["score"]["groups"]) == 3 and doc["score"]["overall"]["tpot"]["n"] == 4
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    # plotly.js inline, no script from the network (tests/test_offline_reports.py opens it with the network cut).
    assert "Plotly.newPlot" in html and len(html) > 1_000_000 and not re.search(r"<script[^>]*src=[\"']?https?:", html)
    assert "ALL" in r.stdout
    assert doc["ttft_follows_completions"] == {} and doc["faster_than_kernels"] == {} and "note:" not in r.stdout
    assert all(0 < x["implied_gpu_busy"] < 1.25 for x in doc["results"])
    # No run was measured at two GPU counts: nothing to say about what more GPUs buy.
    assert doc["tp_scaling"] == {} and "what more GPUs buy" not in r.stdout
    # Nor, with 1-2 runs per group, about what sets TTFT at the lowest concurrency.
    assert doc["ttft_vs_prefill"] == {} and "what sets TTFT" not in r.stdout


def test_cli_validate_own_fit_fits_each_group_on_itself(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    args = ["--requests-per-client", "2", "--max-evals", "3"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--own-fit", *args, "--out", "own", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "own" / "serving_validation.json").read_text())
    assert doc["protocol"].startswith("own fit") and "own fit" in r.stdout
    assert sorted(doc["folds"]) == sorted(doc["score"]["groups"]) and len(doc["folds"]) == 3
    assert all(x["error"] is None for x in doc["results"]) and "group " in r.stderr


def test_cli_validate_logo_names_the_terms_each_folds_training_runs_leave_unpinned(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    args = ["--requests-per-client", "2", "--max-evals", "3", "--logo", "--sensitivity"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args, "--out", "logo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "logo" / "serving_validation.json").read_text())
    sens = doc["fold_sensitivity"]
    # The two vLLM groups were each fitted on the other; SGLang's one group on shared terms, not probed.
    assert sorted(sens) == sorted(g for g in doc["folds"] if g.endswith("/vllm")) and len(sens) == 2
    said = " ".join(r.stdout.split())
    for g, engines in sens.items():
        assert set(engines) == {"vllm"} and set(engines["vllm"]["terms"]) == set(FITTED_TERMS)
        loose = [t for t, v in engines["vllm"]["terms"].items() if not v["pinned"]]
        line = f"the runs {g}'s terms were fitted on do not pin {', '.join(loose)}"
        assert (line in said) == bool(loose), (g, loose)
    # It probes fits: without --logo or --own-fit there is none, and it says so.
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--sensitivity", "--out", "none", cwd=tmp_path)
    assert r.returncode == 2 and "--sensitivity" in r.stderr and "with --logo or --own-fit" in r.stderr
    # --blind keeps the treatments out of held-out predictions: there are none without --logo.
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--own-fit", "--blind", "--out", "none", cwd=tmp_path)
    assert r.returncode == 2 and "--blind" in r.stderr and "with --logo" in r.stderr
    # Without --sensitivity nothing is probed.
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args[:-1], "--out", "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plain = json.loads((tmp_path / "plain" / "serving_validation.json").read_text())
    assert plain["fold_sensitivity"] == {} and "do not pin" not in r.stdout
    # Each fold is pulled towards terms shared by its training groups, unless told not to.
    assert "each fit pulled towards terms shared by every training group" in plain["protocol"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args[:-1], "--no-prior", "--out", "free", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    free = json.loads((tmp_path / "free" / "serving_validation.json").read_text())
    assert "pulled" not in free["protocol"] and free["protocol"] in plain["protocol"]
    # The terms each fold was pulled towards are kept: the two vLLM folds' (SGLang's one group has no other).
    assert sorted(plain["fold_priors"]) == sorted(g for g in plain["folds"] if g.endswith("/vllm"))
    assert all(set(t) == {"vllm"} for t in plain["fold_priors"].values()) and free["fold_priors"] == {}


def test_unpinned_warnings_name_loose_terms_and_fits_stopped_short():
    from calibration.serving_notes import unpinned_warnings

    def term(pinned, short=False):
        return {"value": 1.0, "probes": [], "pinned": pinned, "short_of_minimum": short}

    sens = {
        "g1": {"vllm": {"objective": 0.1, "terms": {"host_s": term(True), "stream_per_token_s": term(False)}}},
        "g2": {"vllm": {"objective": 0.1, "terms": {"host_s": term(True, short=True), "frontend_s": term(True)}}},
    }
    logo = unpinned_warnings(sens, logo=True)
    assert len(logo) == 2
    assert logo[0].startswith("the runs g1's terms were fitted on do not pin stream_per_token_s (")
    assert logo[0].endswith("so those terms say least about g1")
    assert logo[1].startswith("the fit behind g2's terms stopped short of its minimum in host_s (")
    own = unpinned_warnings(sens, logo=False)
    assert own[0].startswith("g1's own runs do not pin stream_per_token_s") and "say least" not in own[0]
    assert own[1].startswith("g2's own fit stopped short of its minimum in host_s (")
    assert unpinned_warnings({}, logo=True) == []


def test_cli_validate_and_calibrate_go_on_past_rows_they_cannot_simulate(tmp_path):
    bad = f"acme/NoSuchModel-7B,h100_sxm,vllm,1,128,16,2,16.0,7.5\n{LLAMA},H100 PCIe,vllm,1,128,16,2,16.0,7.5\n"
    (tmp_path / "mixed.csv").write_text(TINY_CSV + bad)
    r = kvsim("validate", "--serving-bench", "mixed.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    assert doc["rows"] == 4 and all(x["error"] is None for x in doc["results"])
    assert [m.split(": ", 2)[1] for m in doc["skipped_rows"]] == ["row 6, model", "row 7, gpu"]
    said = " ".join(r.stderr.split())
    assert (
        "2 rows left out, not simulated" in said and "got 'acme/NoSuchModel-7B'" in said and "got 'H100 PCIe'" in said
    )
    assert "2 rows of the file left out" in r.stdout
    assert "2 rows of the file left out" in (tmp_path / "val" / "serving_validation.html").read_text()
    r = kvsim(
        "calibrate",
        "--from-serving-bench",
        "mixed.csv",
        "--out",
        "t.json",
        "--max-evals",
        "8",
        "--no-sensitivity",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "calibrate warning 2 rows left out, not simulated" in said and "row 7, gpu: got 'H100 PCIe'" in said
    assert len(json.loads((tmp_path / "t.json").read_text())["groups"]) == 3
    # Nothing left to simulate: one line naming the first problem, exit status 2.
    (tmp_path / "bad.csv").write_text(f"{HEADER}\n{bad}")
    r = kvsim("validate", "--serving-bench", "bad.csv", "--out", "val2", cwd=tmp_path)
    assert r.returncode == 2 and "none that kvsim can simulate" in r.stderr and "row 2, model" in r.stderr


def test_cli_validate_says_which_runs_no_calibrated_profile_priced(tmp_path):
    # No built-in profile has NVFP4 kernels on Hopper or any kernels for the A10G: the roofline prior
    # prices those runs, and the report says so instead of mixing them silently with the others.
    (tmp_path / "r.csv").write_text(
        f"{HEADER},weights\n{GOOD},bf16\n" + GOOD + ",nvfp4\n" + GOOD.replace("h100_sxm", "A10G") + ",bf16\n"
    )
    r = kvsim("validate", "--serving-bench", "r.csv", "--requests-per-client", "2", "--out", "v", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "v" / "serving_validation.json").read_text())
    assert [x["cost_model_calibrated"] for x in doc["results"]] == [True, False, False]
    assert doc["roofline_priced"] == {f"{LLAMA}/h100_sxm/vllm": 1, f"{LLAMA}/A10G/vllm": 1}
    said = " ".join(r.stdout.split())
    assert f"note: {LLAMA}/A10G/vllm: 1 run priced by the roofline prior" in said
    assert "1 runs priced by the roofline prior" in (tmp_path / "v" / "serving_validation.html").read_text()


def test_cli_validate_compares_what_more_gpus_buy_measured_and_simulated(tmp_path):
    (tmp_path / "tp.csv").write_text(
        f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,4,16.0,7.5\n{LLAMA},h100_sxm,vllm,2,128,16,4,12.0,5.0\n"
    )
    r = kvsim("validate", "--serving-bench", "tp.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    sim = {x["tp"]: x["sim_tpot_ms"] for x in doc["results"]}
    assert sim[1] > sim[2] > 0
    assert doc["tp_scaling"] == {
        f"{LLAMA}/h100_sxm/vllm": [
            {"tp": [1, 2], "concurrency": 4, "runs": 1, "measured": 1.5, "simulated": round(sim[1] / sim[2], 3)}
        ]
    }
    assert "what more GPUs buy" in r.stdout and "1.50x" in r.stdout
    # The HTML report draws the pair against concurrency, measured and simulated.
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    assert "what more GPUs buy" in html
    assert all(f"vllm: TP 1 to 2, {k}" in html for k in ("measured", "simulated"))  # plotly escapes the slashes


def csv_lines(rows: list[BenchRow]) -> str:
    """``rows`` as lines of a benchmark CSV with the :data:`HEADER` columns."""
    return "".join(
        f"{r.model},{r.gpu},{r.engine},{r.tp},{r.isl},{r.osl},{r.concurrency},{r.ttft_ms:.3f},{r.tpot_ms:.4f}\n"
        for r in rows
    )


def validate_then_calibrate(tmp_path, csv: str, *calibrate_args: str):
    """``kvsim validate`` and then ``kvsim calibrate`` on one CSV: (validate's stdout, its JSON, its
    HTML, calibrate's stderr), each run checked to exit 0."""
    (tmp_path / "runs.csv").write_text(f"{HEADER}\n{csv}")
    r = kvsim("validate", "--serving-bench", "runs.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    c = kvsim(
        "calibrate",
        "--from-serving-bench",
        "runs.csv",
        "--out",
        "t.json",
        "--max-evals",
        "3",
        "--no-sensitivity",
        *calibrate_args,
        cwd=tmp_path,
    )
    assert c.returncode == 0, c.stderr
    # Asked for none, the terms file holds no sensitivity and calibrate prints none.
    assert json.loads((tmp_path / "t.json").read_text())["sensitivity"] == {} and " -> " not in c.stdout
    return " ".join(r.stdout.split()), doc, html, " ".join(c.stderr.split())


def validate_with(tmp_path, *flags: str):
    """``kvsim validate`` again on :func:`validate_then_calibrate`'s CSV with ``flags``: (its stdout on
    one line, its JSON, its HTML), the run checked to exit 0."""
    out = "_".join(f.strip("-") for f in flags)
    r = kvsim(
        "validate", "--serving-bench", "runs.csv", "--requests-per-client", "2", *flags, "--out", out, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / out / "serving_validation.json").read_text())
    return " ".join(r.stdout.split()), doc, (tmp_path / out / "serving_validation.html").read_text()


def test_cli_names_single_runs_faster_than_their_kernels(tmp_path):
    # One run at a hundredth of what the other two take: possible runs beside one no GPU computes.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path,
        f"{LLAMA},h100_sxm,vllm,1,1024,64,16,2.0,0.5\n{LLAMA},h100_sxm,vllm,1,1024,64,32,3000.0,100.0\n"
        f"{LLAMA},h100_sxm,vllm,1,512,64,8,2000.0,80.0\n",
    )
    g = f"{LLAMA}/h100_sxm/vllm"
    assert doc["faster_than_kernels"] == {} and list(doc["fast_runs"]) == [g]
    (run,) = doc["fast_runs"][g]
    assert (run["isl"], run["osl"], run["concurrency"], run["tp"]) == (1024, 64, 16, 1) and run[
        "implied_gpu_busy"
    ] > 1.25
    assert f"note: {g}: 1 of its runs needs the GPU computing more than 1.25x" in stdout and "1024/64 c16 tp1" in stdout
    assert "1 run faster than the kernels" in html
    assert "calibrate warning" in warned and "1 of its runs needs the GPU" in warned


def test_cli_says_which_groups_are_faster_than_their_kernels(tmp_path):
    # One group's runs whose decoding kvsim prices about as measured, but whose prompts never cost a
    # prefill: no GPU computes that fast, unless the prefix cache served most of every prompt.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path,
        f"{LLAMA},h100_sxm,vllm,1,1024,64,16,2.0,7.5\n{LLAMA},h100_sxm,vllm,1,1024,64,32,3.0,9.0\n",
        "--exclude-group",
        "suspect",
        "--cache-flagged",
    )
    assert f"note: {LLAMA}/h100_sxm/vllm: its measured throughput needs the GPU computing" in stdout
    assert list(doc["faster_than_kernels"]) == [f"{LLAMA}/h100_sxm/vllm"]
    assert all(x["implied_gpu_busy"] > 1.25 for x in doc["results"])
    assert "faster than its kernels: GPU busy" in html and "c 16 tp 1, GPU busy" in html
    assert "calibrate warning" in warned and "kernel prices" in warned and "simulated so (--cache-flagged)" in warned
    # Excluded from training: the only group, so the engine keeps its starting terms.
    terms = json.loads((tmp_path / "t.json").read_text())
    assert terms["groups"] == []
    # How much of every prompt the cache must have served, said, and simulated on request.
    g = f"{LLAMA}/h100_sxm/vllm"
    share = doc["least_cached_share"][g]
    assert 0 < share < 1 and doc["cached"] == []
    assert f"at least {share:.0%} of every prompt from the prefix cache makes them possible" in stdout
    assert "(--cache-flagged simulates that)" in stdout
    cached_out, cached, cached_html = validate_with(tmp_path, "--cache-flagged")
    assert cached["cached"] == [g] and "simulated so (--cache-flagged)" in cached_out
    assert f"simulated with {share:.0%} of each prompt cached" in cached_html
    before = {x["concurrency"]: x["sim_ttft_ms"] for x in doc["results"]}
    assert all(x["sim_ttft_ms"] < before[x["concurrency"]] for x in cached["results"])
    # Runs whose decoding alone is faster than the kernels: no share of cached prompt explains them.
    (line,) = kernel_warnings({g: 10.0}, {g: 1.0}, [])
    assert "not even every prompt from the prefix cache makes them possible: their decoding alone needs more" in line
    assert "at least" not in line and "--cache-flagged simulates" not in line
    (line,) = kernel_warnings({g: 10.0}, {g: 1.0}, [g])
    assert "simulated with all but one prompt token cached, --cache-flagged" in line


def test_cli_says_which_groups_ttft_waits_for_completions(tmp_path):
    # Two runs of one group whose TTFT is one completion gap (request cycle / 4) at both output lengths.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path, f"{LLAMA},h100_sxm,vllm,1,128,16,4,25.0,5.0\n{LLAMA},h100_sxm,vllm,1,128,64,4,105.0,5.0\n"
    )
    assert f"note: {LLAMA}/h100_sxm/vllm: at concurrency 4" in stdout
    assert doc["ttft_follows_completions"] == {f"{LLAMA}/h100_sxm/vllm": [4]}
    assert "TTFT follows completions at c 4" in html
    assert "calibrate warning" in warned and "wait for another one to finish" in warned
    assert "--hold-back-flagged simulates one request waiting" in warned and doc["held_back"] == {}
    # Held back: both runs simulated with 3 of the 4 requests running, said in the note and the JSON.
    said, held, held_html = validate_with(tmp_path, "--hold-back-flagged")
    assert held["held_back"] == {f"{LLAMA}/h100_sxm/vllm": [4]}
    assert [x["max_num_seqs"] for x in held["results"]] == [3, 3]
    assert [x["max_num_seqs"] for x in doc["results"]] == [None, None]
    assert all(h["sim_ttft_ms"] > d["sim_ttft_ms"] for h, d in zip(held["results"], doc["results"]))
    assert "simulated with concurrency - 1 requests running" in said
    assert "simulated with c - 1 running at c 4" in held_html
    assert "simulated with c - 1" not in html


def test_cli_says_which_groups_clients_did_not_start_together(tmp_path):
    # The file names no aiconfigurator-core run: its clients are simulated apart from the start, and
    # the note says so rather than offering the treatment.
    stdout, doc, html, warned = validate_then_calibrate(tmp_path, csv_lines(apart_runs(1.0)))
    g = f"{LLAMA}/h100_sxm/trtllm"
    assert f"note: {g}: at concurrency 4 its TTFT grows by" in stdout
    assert list(doc["clients_apart"]) == [g] and doc["spread"] == [] and doc["clients_apart"][g]["simulated_apart"]
    assert [x["start_spread_cycles"] for x in doc["results"]] == [APART_SPREAD_CYCLES] * 4
    assert "simulated with their starts spread over a request cycle (--clients)" in stdout
    assert "clients not started together" in html and "clients simulated apart" in html
    assert (
        "calibrate warning" in warned and "(--clients)" in warned and "4 of 4 rows of runs.csv: clients apart" in warned
    )
    # In step (--clients together), the note offers --spread-flagged, which spreads them again.
    said, together, together_html = validate_with(tmp_path, "--clients", "together")
    assert "--spread-flagged spreads them" in said and not together["clients_apart"][g]["simulated_apart"]
    assert "clients simulated apart" not in together_html
    assert [x["start_spread_cycles"] for x in together["results"]] == [0.0] * 4
    said, spread, spread_html = validate_with(tmp_path, "--clients", "together", "--spread-flagged")
    assert spread["spread"] == [g]
    assert [x["start_spread_cycles"] for x in spread["results"]] == [APART_SPREAD_CYCLES] * 4
    assert "simulated with their starts spread over a request cycle (--spread-flagged)" in said
    assert "simulated with their starts spread" in spread_html and "clients simulated apart" not in spread_html


def test_cli_json_results_take_their_weights_and_kv_cache_from_the_command_line(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(vllm_result()))
    args = ["--gpu", "h100_sxm", "--tp", "1", "--requests-per-client", "2"]
    r = kvsim(
        "validate", "--serving-bench", "run.json", *args, "--weights", "fp8", "--kv", "fp8", "--out", "v", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    (res,) = json.loads((tmp_path / "v" / "serving_validation.json").read_text())["results"]
    assert (res["weights"], res["kv"], res["error"]) == ("fp8", "fp8", None)
    r = kvsim("validate", "--serving-bench", "run.json", *args, "--kv", "int4", "--out", "w", cwd=tmp_path)
    assert r.returncode == 2 and "kv: got 'int4'" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # The KV capacity the server logged: two of the four 576-token clients fit, the others wait.
    r = kvsim("validate", "--serving-bench", "run.json", *args, "--kv-cache-tokens", "1200", "--out", "k", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (pinned,) = json.loads((tmp_path / "k" / "serving_validation.json").read_text())["results"]
    (free,) = json.loads((tmp_path / "v" / "serving_validation.json").read_text())["results"]
    assert pinned["kv_cache_tokens"] == 1200 and free["kv_cache_tokens"] is None
    assert pinned["sim_ttft_ms"] > 3 * free["sim_ttft_ms"]
    for cmd in (["validate", "--serving-bench"], ["calibrate", "--from-serving-bench"]):
        r = kvsim(
            *cmd, "run.json", "--gpu", "h100_sxm", "--tp", "1", "--kv-cache-tokens", "100", "--out", "x", cwd=tmp_path
        )
        assert r.returncode == 2 and "kv_cache_tokens: got 100; at least isl + osl = 576" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "args,match",
    [
        (
            ["validate", "--serving-bench", "bad.csv", "--out", "v"],
            "bad.csv: got '1 row, none that kvsim can simulate'; at least one; row 2, ttft_ms: got '-3'",
        ),
        (
            ["calibrate", "--from-serving-bench", "bad.csv", "--out", "t.json"],
            "bad.csv: got '1 row, none that kvsim can simulate'; at least one; row 2, ttft_ms: got '-3'",
        ),
        (["validate", "--serving-bench", "good.csv", "--engine", "trtllm", "--out", "v"], "--engine: got 'trtllm'"),
        (["calibrate", "--from-serving-bench", "good.csv", "--out", "."], "--out: got '.'"),
        (["validate", "--serving-bench", "good.csv", "--terms", "good.csv", "--out", "v"], "engine.terms_file"),
        (["validate", "--serving-bench", "run.json", "--out", "v"], "--gpu: got None"),
        (["validate", "--serving-bench", "good.csv", "--clients", "drift", "--out", "v"], "--clients: got 'drift'"),
        (["calibrate", "--from-serving-bench", "good.csv", "--clients", "drift", "--out", "t.json"], "--clients"),
        (
            ["validate", "--serving-bench", "good.csv", "--logo", "--exclude-group", "llama/h100", "--out", "v"],
            f"--exclude-group: got 'llama/h100'; 'suspect' or a group of the file (model/gpu/engine): {LLAMA}/h100_sxm/vllm",
        ),
        (
            ["calibrate", "--from-serving-bench", "good.csv", "--exclude-group", "x", "--out", "t.json"],
            "--exclude-group: got 'x'",
        ),
        (
            ["validate", "--serving-bench", "good.csv", "--logo", "--own-fit", "--out", "v"],
            "--own-fit: got True; either --logo (each group predicted by the others) or --own-fit (by itself), not both",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, match):
    (tmp_path / "bad.csv").write_text(f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,2,-3,7\n")
    (tmp_path / "good.csv").write_text(f"{HEADER}\n{GOOD}\n")
    (tmp_path / "run.json").write_text(json.dumps(vllm_result()))
    r = kvsim(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and match in r.stderr, r.stderr
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "v").exists()


def test_a_row_without_weights_takes_its_checkpoints(tmp_path):
    """``weights`` left empty: the checkpoint's as its config declares them (block-scaled fp8 for
    Qwen3-32B-FP8, MXFP4 experts for gpt-oss), bf16 for a catalog model; a vLLM result JSON without ``--weights``
    reads the same way."""
    p = tmp_path / "bench.csv"
    p.write_text(
        f"{HEADER},weights\n"
        + GOOD.replace(LLAMA, "Qwen/Qwen3-32B-FP8")
        + ",\n"
        + GOOD.replace(LLAMA, "openai/gpt-oss-20b")
        + ",\n"
        + GOOD
        + ",\n"
        + GOOD.replace(LLAMA, "Qwen/Qwen3-32B-FP8")
        + ",bf16\n"
    )
    assert [r.weights for r in read_csv(p)] == ["fp8_block", "mxfp4", "bf16", "bf16"]


def kv_bound_runs(capacity: int) -> list[BenchRow]:
    """Llama-3.1-8B / TensorRT-LLM runs at 32 and 64 clients, 1024-token prompts and 128 to 2048
    output tokens, with kvsim's own TTFT and TPOT on a server holding ``capacity`` tokens of KV as the
    measurements, and no capacity recorded: what a file from such a server holds."""
    rows = [
        row(engine="trtllm", isl=1024, osl=osl, concurrency=c, kv_cache_tokens=capacity)
        for c in (32, 64)
        for osl in (128, 512, 1024, 2048)
    ]
    return [replace(r, kv_cache_tokens=None) for r in measured(rows, builtin_terms(), TINY)]


def test_runs_that_wait_for_kv_bracket_the_capacity_their_server_held():
    # 80,000 tokens hold 32 clients of 1024 + 1024 (65,536) but not 64 of 1024 + 512 (98,304): those
    # runs' TTFT multiplies, the others' stays, and the bracket holds the capacity.
    runs = kv_bound_runs(80_000)
    ttft = {(r.concurrency, r.osl): r.ttft_ms for r in runs}
    assert ttft[(32, 1024)] < 1.2 * ttft[(32, 128)] and ttft[(64, 512)] > 1.5 * ttft[(64, 128)]
    ((key, found),) = kv_capacity_evidence(runs).items()
    assert key == f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    assert (found["holds_up_to"], found["waits_from"]) == (32 * 2048, 64 * 1536)
    assert found["holds_up_to"] < 80_000 <= found["waits_from"]
    assert "1024/512 c64" in found["waiting_runs"] and "1024/2048 c32" in found["waiting_runs"]
    # What kvsim derives from an H100's memory for an 8B model is far more: said, with the numbers.
    assert found["derived"] > 300_000
    (line,) = kv_warnings({key: found})
    assert f"between {32 * 2048:,} and {64 * 1536:,} tokens" in line and f"derives {found['derived']:,}" in line
    # Derived inside the bracket: nothing to say.
    assert kv_warnings({key: {**found, "derived": 80_000}}) == []
    # Pinned, as the server logged it: the rows are left to their column.
    assert kv_capacity_evidence([replace(r, kv_cache_tokens=80_000) for r in runs]) == {}


def test_fewer_runs_than_terms_are_said_per_engine():
    """A fit on fewer runs than an engine's terms is said; the groups left out of training do not count."""
    vllm = [row(concurrency=c) for c in (2, 4)]
    trt = [row(engine="trtllm", concurrency=c) for c in (1, 2, 4, 8, 16, 32)]
    (line,) = few_runs_lines(vllm + trt, (), prior=False)
    assert line.startswith("vllm: 2 runs (4 measured means) for 6 terms: too few") and "--prior keeps" in line
    (line,) = few_runs_lines([vllm[0]] + trt, (), prior=True)
    assert line.startswith("vllm: 1 run (2 measured means)") and "the pull towards the preset (--prior)" in line
    assert few_runs_lines(trt, (), prior=False) == []
    (line,) = few_runs_lines(trt[:5], (), prior=False)
    assert line.startswith("trtllm: 5 runs")
    # Two more runs of another group, held out: the engine still has five to fit on.
    held = [row(engine="trtllm", gpu="h200_sxm", concurrency=c) for c in (1, 2)]
    (line,) = few_runs_lines(trt[:5] + held, (f"{LLAMA}/h200_sxm/trtllm",), prior=False)
    assert line.startswith("trtllm: 5 runs")


def test_ttft_growing_with_the_output_for_other_reasons_is_not_taken_for_kv():
    runs = kv_bound_runs(80_000)
    # Waiting runs needing fewer tokens than runs that fit: not a KV limit (a completion-bound TTFT).
    grows_early = [replace(r, ttft_ms=r.ttft_ms * 3) if (r.concurrency, r.osl) == (32, 512) else r for r in runs]
    assert kv_capacity_evidence(grows_early) == {}
    # The same wait at two and four GPUs, whose memory holds twice the KV: not a KV limit either.
    both = [replace(r, tp=tp) for tp in (2, 4) for r in runs]
    assert kv_capacity_evidence(both) == {}
    assert set(kv_capacity_evidence([replace(r, tp=2) for r in runs])) == {f"{LLAMA}/h100_sxm/trtllm tp2 bf16"}


def test_the_shipped_runs_bracket_the_kv_their_servers_held():
    found = kv_capacity_evidence(served_by_rows(read_bench(TRAINING_FILE), "aiconfigurator"))
    trt = found["Qwen/Qwen3-32B/h100_sxm/trtllm tp1 fp8"]
    assert (trt["holds_up_to"], trt["waits_from"]) == (64 * (4096 + 256), 128 * (2048 + 256))
    assert trt["derived"] > trt["waits_from"]
    vllm = found["Qwen/Qwen3-32B/h100_sxm/vllm tp2 bf16"]
    assert (vllm["holds_up_to"], vllm["waits_from"]) == (128 * (1024 + 1024), 64 * (4096 + 512))
    # Llama-3.1-8B / SGLang's TTFT grows with the output at 512 clients on 2, 4 and 8 GPUs alike: its
    # token stream's ceiling, not KV; Llama-3.1-8B / TensorRT-LLM's follows completions.
    assert not any("sglang tp" in k and "Llama" in k for k in found)
    assert not any("Llama-3.1-8B-Instruct/h100_sxm/trtllm" in k for k in found)


def test_cli_says_what_kv_the_runs_server_held(tmp_path):
    stdout, doc, html, warned = validate_then_calibrate(tmp_path, csv_lines(kv_bound_runs(80_000)))
    key = f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    assert list(doc["kv_capacity"]) == [key] and doc["kv_capacity"][key]["waits_from"] == 64 * 1536
    assert f"note: {key}: runs whose TTFT grows with the output length" in stdout
    assert "wait for KV" in warned and "kv_cache_tokens" in warned
    assert f"waits for KV from {64 * 1536:,} tokens at tp1" in html


def test_kv_from_runs_simulates_the_capacity_the_runs_imply(tmp_path):
    runs = kv_bound_runs(80_000)
    evidence = kv_capacity_evidence(runs)
    key = f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    treated, used = kv_from_runs(runs, evidence)
    middle = (32 * 2048 + 64 * 1536) // 2
    assert used == {key: middle} and all(r.kv_cache_tokens == middle for r in treated)
    # A row that says its capacity keeps it; a deployment with no lower bound is left as it is.
    mine = replace(runs[0], kv_cache_tokens=70_000)
    assert kv_from_runs([mine], evidence)[0] == [mine]
    no_floor = {key: {**evidence[key], "holds_up_to": None}}
    assert kv_from_runs(runs, no_floor) == (runs, {})
    # Through the CLI: the waiting runs, made with 80,000 tokens, come back close to their TTFT.
    (tmp_path / "runs.csv").write_text(f"{HEADER}\n{csv_lines(runs)}")
    docs = {}
    for flag in ([], ["--kv-from-runs"]):
        r = kvsim(
            "validate",
            "--serving-bench",
            "runs.csv",
            "--requests-per-client",
            "2",
            "--clients",
            "together",  # as kvsim made the runs
            *flag,
            "--out",
            "v",
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        docs[bool(flag)] = json.loads((tmp_path / "v" / "serving_validation.json").read_text())
    assert docs[False]["kv_from_runs"] == {} and docs[True]["kv_from_runs"] == {key: middle}
    assert "simulated with 81,920 tokens (--kv-from-runs)" in " ".join(r.stdout.split())

    def waiting_errors(doc):
        return [abs(x["ttft_rel_err"]) for x in doc["results"] if x["concurrency"] * (1024 + x["osl"]) > 80_000]

    before, after = waiting_errors(docs[False]), waiting_errors(docs[True])
    assert len(before) == 4 and all(a < b for a, b in zip(after, before)), (before, after)
    assert sum(after) < 0.35 * sum(before), (before, after)


def test_a_spreadsheets_file_reads_as_it_looks(tmp_path):
    """Rows are numbered by the file's lines, blank and empty rows skipped; the header's names may be
    padded; a row of another width, or a number as no benchmark writes one, is said."""
    p = tmp_path / "sheet.csv"
    p.write_text(
        " model , gpu ,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms\n"
        "\n"
        f"{GOOD}\n"
        ",,,,,,,,\n"
        f"{GOOD},extra\n"
        f"{LLAMA},h100_sxm,vllm,1,128,16,2,20.5\n"
        f"{LLAMA},h100_sxm,vllm,1,1_024,16,2,20.5,7.25\n"
        f"{LLAMA},h100_sxm,vllm,1,128,16,2,1e-300,7.25\n"
        f"{LLAMA},h100_sxm,vllm,1,128,16,2,\u0665\u0660,7.25\n"
    )
    problems: list[str] = []
    (r,) = read_bench(p, problems)
    assert r.origin == f"{p}: row 3" and r.ttft_ms == 20.5
    assert problems == [
        f"{p}: row 5, cells: got 10; one per column of the header: 9",
        f"{p}: row 6, cells: got 8; one per column of the header: 9",
        f"{p}: row 7, isl: got '1_024'; an integer in [1, 16777216]",
        f"{p}: row 8, ttft_ms: got '1e-300'; milliseconds, a number in [0.001, 86400000] (a day)",
        f"{p}: row 9, ttft_ms: got '\u0665\u0660'; milliseconds, a number in [0.001, 86400000] (a day)",
    ]


def test_a_misspelt_column_or_another_separator_is_said(tmp_path):
    p = tmp_path / "typo.csv"
    p.write_text(f"{HEADER},kv_cache_token\n{GOOD},2000\n")
    with pytest.raises(ConfigError, match=r"header: got 'kv_cache_token'; did you mean kv_cache_tokens\?"):
        read_bench(p)
    # A column kvsim does not read, and not like one it does, is left alone.
    p.write_text(f"{HEADER},notes\n{GOOD},warm cache\n")
    assert len(read_bench(p)) == 1
    p.write_text(HEADER.replace(",", ";") + "\n" + GOOD.replace(",", ";") + "\n")
    with pytest.raises(ConfigError, match="the header is one column holding ';': kvsim reads comma-separated files"):
        read_bench(p)


def test_a_config_json_in_the_model_column_that_is_missing_or_unreadable_names_the_row(tmp_path):
    (tmp_path / "broken_config.json").write_text('{"model_type": "llama", "hidden_size": 4096}')
    p = tmp_path / "hf.csv"
    p.write_text(
        f"{HEADER},weights\nmissing_config.json,h100_sxm,vllm,1,128,16,2,20.5,7.25,bf16\n"
        "broken_config.json,h100_sxm,vllm,1,128,16,2,20.5,7.25,bf16\n"
        f"{GOOD},bf16\n"
    )
    problems: list[str] = []
    (r,) = read_bench(p, problems)
    assert problems[0] == (
        f"{p}: row 2, model: got 'missing_config.json'; a config.json file that exists (relative paths from {tmp_path})"
    )
    assert problems[1].startswith(f"{p}: row 3, model: got 'broken_config.json'; model.hf_config: a decoder-only")


def test_rows_no_terms_can_simulate_are_said_and_left_out_before_any_fit(tmp_path):
    """A 70B model on one L40S does not fit: said with its file and row, and not fitted on (a fit
    would score it as a failure at every step and dilute the other rows' errors)."""
    p = tmp_path / "runs.csv"
    p.write_text(f"{HEADER}\n{GOOD}\nmeta-llama/Llama-3.1-70B-Instruct,l40s,vllm,1,1024,128,4,50,8\n")
    problems: list[str] = []
    (r,) = selected_rows(str(p), None, None, None, problems=problems)
    assert r.model == LLAMA
    (line,) = problems
    assert line.startswith(f"{p}: row 3: gpu: got 'L40S x TP1'; KV capacity per replica is -")
    p.write_text(f"{HEADER}\nmeta-llama/Llama-3.1-70B-Instruct,l40s,vllm,1,1024,128,4,50,8\n")
    with pytest.raises(
        ConfigError, match=r"runs.csv: got '1 row, none that kvsim can simulate'; at least one; row 2: gpu"
    ):
        selected_rows(str(p), None, None, None, problems=[])


def test_a_run_of_one_output_token_is_fitted_on_its_ttft():
    one = row(osl=1, ttft_ms=20.0, tpot_ms=7.0)
    assert objective([RowResult(one, 22.0, None)]) == pytest.approx(abs(math.log(22.0 / 20.0)))
    # Any other run without a simulated TPOT failed.
    assert objective([RowResult(row(), 22.0, None)]) == 3.0


def test_runs_longer_than_the_models_context_are_left_out_as_vllm_refuses_them(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text(
        f"{HEADER}\nQwen/Qwen3-8B,h100_sxm,vllm,1,200000,128,4,50,8\nQwen/Qwen3-8B,h100_sxm,vllm,1,1024,128,4,50,8\n"
    )
    skipped: list[str] = []
    rows = selected_rows(str(p), None, None, None, problems=skipped)
    assert [(r.isl, r.osl) for r in rows] == [(1024, 128)]
    (line,) = skipped
    assert "row 2: workload.max_model_len: got 200128; at most 40960: the context of Qwen/Qwen3-8B" in line
