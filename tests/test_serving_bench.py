"""Reading serving benchmarks: CSV rows and ``vllm bench serve`` result files, their columns, spellings
and model ids, and the one-line errors that name the file, row and column.

Rows are tiny (a few clients, short prompts, a few requests per client) so the file runs in
seconds; the accuracy on the shipped training file is measured by ``kvsim validate --serving-bench
builtin --logo``, not here.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest

from _serving_helpers import FIXED, GOOD, HEADER, LLAMA, REPO, TINY, row, vllm_result
from calibration.serving_bench import (
    BenchRow,
    normalize_gpu,
    read_bench,
    read_csv,
    resolve_model,
)
from calibration.serving_fit import (
    builtin_terms,
    evaluate,
)
from calibration.serving_runs import row_scenario, simulate_row
from sim.config import scenario_from_dict
from sim.errors import ConfigError
from sim.hf_config import MODELS_DIR
from sim.model_ids import model_key

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
