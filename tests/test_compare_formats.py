"""``kvsim compare`` on the shapes real result files take, and the id and GPU lookups it shares:
quantized variant ids run their own format (and say so), the concurrency cap holds with
``start_times``, the file's ``backend`` picks the engine, strict JSON out, several results in one
file, a ``num_prompts`` that differs from the entries, GPU names of another memory size. The
inputs are SYNTHETIC (tests/data/bench_results, edited here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sim.analysis.bench_compare import arrival_text, compare_result, scenario_dict, send_times
from sim.analysis.bench_results import read_bench_result
from sim.catalog import find_gpu, get_gpu
from sim.cli.main import app
from sim.config import scenario_from_dict
from sim.errors import ConfigError
from sim.model_ids import format_problem, model_argument, model_of_id, section_of, variant_note

DATA = Path(__file__).parent / "data" / "bench_results"
POISSON = DATA / "vllm-4.0qps-Qwen3-8B-synthetic.json"
STARTS = DATA / "vllm-3.0qps-Qwen3-8B-start-times-synthetic.json"


def _file(tmp_path: Path, name: str = "r.json", base: Path = POISSON, n: int | None = 16, **header) -> Path:
    """``base`` cut to its first ``n`` requests, with ``header`` fields set (``None``: removed)."""
    d = json.loads(base.read_text())
    if n is not None:
        total = len(d["input_lens"])
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == total:
                d[k] = v[:n]
        d["num_prompts"] = n
    for k, v in header.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _run(*args: str):
    return CliRunner().invoke(app, ["compare", *args])


def _format(ident: str) -> tuple[str, str]:
    sc = scenario_from_dict({"model": model_of_id(ident)})
    return sc.model.weight_dtype, sc.model.kv_dtype


# --- 1. quantized variant ids ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ident,fmt",
    [
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", ("fp8", "bf16")),
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8", ("fp8", "bf16")),  # not NVIDIA's fp8 KV cache
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", ("fp8", "bf16")),
        ("Qwen/Qwen3-8B-FP8-dynamic", ("fp8", "bf16")),
        ("Qwen/Qwen3-32B-FP8-Dynamic", ("fp8", "bf16")),
        ("meta-llama/Llama-3.1-8B-Instruct-FP8-block", ("fp8_block", "bf16")),
        ("neuralmagic/Meta-Llama-3-8B-Instruct-FP8-KV", ("fp8", "fp8")),  # a checkpoint with KV scales
        ("nvidia/Llama-3.1-8B-Instruct-FP4", ("nvfp4", "bf16")),
        # The same publisher's releases with the same tags: their format (NVIDIA's FP8 and NVFP4
        # checkpoints quantize the KV cache), on this shape or another.
        ("nvidia/Llama-3.1-8B-Instruct-NVFP4", ("nvfp4", "fp8")),
        ("nvidia/Llama-3.3-70B-Instruct-FP8", ("fp8", "fp8")),
        ("nvidia/Llama-3.1-405B-Instruct-FP8", ("fp8", "fp8")),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507-FP8", ("fp8_block", "bf16")),
        # Exact ids keep theirs.
        ("nvidia/Llama-3.1-8B-Instruct-FP8", ("fp8", "fp8")),
        ("Qwen/Qwen3-8B-FP8", ("fp8_block", "bf16")),
        ("meta-llama/Llama-3.1-8B-Instruct", ("bf16", "bf16")),
    ],
)
def test_a_quantized_variant_id_runs_the_format_its_name_gives(ident, fmt):
    assert _format(ident) == fmt
    assert model_argument(ident) == model_of_id(ident)


def test_a_variant_note_names_the_format_and_the_kv_cache():
    ident = "RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic"
    note = variant_note(ident, model_of_id(ident))
    assert note is not None and "fp8 weights, bf16 KV cache" in note and "meta-llama/Meta-Llama-3.1-8B" in note
    assert variant_note("nvidia/Llama-3.1-8B-Instruct-FP8", model_of_id("nvidia/Llama-3.1-8B-Instruct-FP8")) is None


@pytest.mark.parametrize("ident", ["Qwen/Qwen3-8B-AWQ", "Qwen/Qwen2.5-7B-Instruct-AWQ", "acme/Llama-3.1-8B-GPTQ-Int4"])
def test_a_format_kvsim_cannot_price_is_refused_on_one_line(ident):
    assert model_of_id(ident) is None and section_of(ident, formats=True) is None
    why = format_problem(ident)
    assert why is not None and ident in why and "nvfp4" in why and "\n" not in why


def test_a_benchmark_row_still_resolves_a_variant_to_its_shape_alone():
    """The serving-bench reader's rows carry their own weights and kv columns: the shape alone."""
    assert section_of("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic") == section_of("meta-llama/Meta-Llama-3.1-8B")
    assert section_of("acme/Llama-3.1-8B-AWQ") is None


def test_compare_runs_a_variant_in_its_format_and_prints_the_note(tmp_path):
    p = _file(tmp_path, model_id="RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic")
    assert scenario_dict(read_bench_result(p))["model"] == {
        "hf_config": "meta-llama/Meta-Llama-3.1-8B",
        "weight_dtype": "fp8",
        "kv_dtype": "bf16",
    }
    out = tmp_path / "cmp.json"
    r = _run(str(p), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "note: r.json: RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic: no config of it ships" in r.output
    doc = json.loads(out.read_text())["comparisons"][0]
    assert any("fp8 weights, bf16 KV cache" in n for n in doc["notes"])


def test_compare_refuses_an_awq_file_naming_the_id(tmp_path):
    p = _file(tmp_path, model_id="Qwen/Qwen3-8B-AWQ")
    r = _run(str(p), "--runs", str(tmp_path / "runs"))
    assert r.exit_code == 2
    line = [x for x in r.output.splitlines() if x.startswith("error:")][0]
    assert "Qwen/Qwen3-8B-AWQ: AWQ weights of qwen3-8b" in line and "cannot price" in line


# --- 2. the concurrency cap with start_times ---------------------------------------------------


def _in_flight(run_dir: Path) -> int:
    t = pq.read_table(run_dir / "requests.parquet")
    a, f = t["arrival_s"].to_numpy(), t["finish_s"].to_numpy()
    ev = sorted([(x, 1) for x in a] + [(x, -1) for x in f], key=lambda e: (e[0], e[1]))
    return int(max(np.cumsum([e[1] for e in ev])))


@pytest.mark.parametrize("rate", ["inf", 50.0])
def test_max_concurrency_caps_the_replay_of_a_file_with_start_times(tmp_path, rate):
    # Every request "sent" at once: a replay of the start times alone would have all 16 in flight.
    # They are replayed as due times under the cap, whatever the rate (the start times say more).
    p = _file(tmp_path, max_concurrency=2, request_rate=rate, start_times=[100.0] * 16)
    res = read_bench_result(p)
    assert send_times(res, 0) is res.start_s
    assert scenario_dict(res)["workload"]["arrival"] == {
        "kind": "trace",
        "path": "bench_requests.csv",
        "format": "csv",
        "max_concurrency": 2,
    }
    assert arrival_text(res) == "the file's start_times (trace), at most 2 in flight (max_concurrency)"
    doc = compare_result(res, tmp_path / "run")
    assert _in_flight(tmp_path / "run") == 2
    assert not any("start_times" in n for n in doc["notes"])


def test_start_times_under_max_concurrency_are_sent_at_the_later_of_the_time_and_a_free_slot(tmp_path):
    """The exact model of the benchmark's semaphore: a start time that finds a free slot is the
    simulated send (and TTFT runs from it); one that does not waits for the next request to end."""
    apart = [20.0 * i for i in range(16)]  # far apart: every request has ended before the next is due
    res = read_bench_result(_file(tmp_path, "apart.json", max_concurrency=1, start_times=apart))
    compare_result(res, tmp_path / "apart")
    rq = pq.read_table(tmp_path / "apart" / "requests.parquet").sort_by("id")
    assert np.array_equal(rq["arrival_s"].to_numpy(), np.asarray(apart))
    summary = json.loads((tmp_path / "apart" / "summary.json").read_text())
    assert summary["client_wait_s"]["max"] == 0.0

    close = [0.01 * i for i in range(16)]  # due faster than two slots serve them
    res = read_bench_result(_file(tmp_path, "close.json", max_concurrency=2, start_times=close))
    compare_result(res, tmp_path / "close")
    rq = pq.read_table(tmp_path / "close" / "requests.parquet").sort_by("id")
    arr, fin = rq["arrival_s"].to_numpy(), rq["finish_s"].to_numpy()
    assert _in_flight(tmp_path / "close") == 2
    assert np.all(arr >= np.asarray(close)) and np.all(np.diff(arr) >= 0)  # first due, first sent
    assert arr[0] == 0.0 and arr[1] == pytest.approx(0.01)
    # Each later request goes out the moment an earlier one ends.
    assert all(np.any(fin[:i] == arr[i]) for i in range(2, 16))


def test_a_finite_rate_with_max_concurrency_draws_due_times_under_the_cap(tmp_path):
    """No start_times: the rate's generator gives the due times (the same draw as without the cap)
    and the cap holds the sends back."""
    res = read_bench_result(_file(tmp_path, max_concurrency=2, request_rate=50.0, start_times=None))
    free = read_bench_result(_file(tmp_path, "free.json", max_concurrency=None, request_rate=50.0, start_times=None))
    due = send_times(res, 0)
    assert due is not None and np.array_equal(due, send_times(free, 0))
    assert scenario_dict(res)["workload"]["arrival"] == {
        "kind": "trace",
        "path": "bench_requests.csv",
        "format": "csv",
        "max_concurrency": 2,
    }
    assert arrival_text(res) == "Poisson at 50 requests/s, at most 2 in flight (max_concurrency)"
    doc = compare_result(res, tmp_path / "run")
    assert doc["arrival"] == arrival_text(res)
    assert _in_flight(tmp_path / "run") == 2
    arr = pq.read_table(tmp_path / "run" / "requests.parquet").sort_by("id")["arrival_s"].to_numpy()
    due = due - due[0]  # a trace's times run from its first request, with or without the cap
    assert np.all(arr >= due - 1e-12) and arr[-1] > due[-1]
    # The rate now draws the sends: a burstiness too small to draw from is refused with the cap too.
    with pytest.raises(ConfigError, match="burstiness"):
        read_bench_result(_file(tmp_path, "b.json", max_concurrency=2, request_rate=50.0, burstiness=1e-9))
    # No rate either: still a closed loop of as many clients.
    res = read_bench_result(_file(tmp_path, "inf.json", max_concurrency=3, request_rate="inf", start_times=None))
    assert send_times(res, 0) is None and arrival_text(res) == "closed loop, 3 clients"
    assert scenario_dict(res)["workload"]["arrival"]["kind"] == "closed_loop"


def test_start_times_without_max_concurrency_are_still_a_trace(tmp_path):
    res = read_bench_result(STARTS)
    assert res.max_concurrency is None and send_times(res, 0) is res.start_s
    assert scenario_dict(res)["workload"]["arrival"]["kind"] == "trace"


# --- 3. the file's backend ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend,engine,noted",
    [
        ("vllm", "vllm", False),
        ("sglang", "sglang", False),
        ("tensorrt-llm", "trtllm", False),
        ("trtllm", "trtllm", False),
        ("tgi", "vllm", True),
        ("openai-chat", "vllm", True),
    ],
)
def test_the_engine_defaults_to_the_files_backend(tmp_path, backend, engine, noted):
    p = _file(tmp_path, backend=backend)
    res = read_bench_result(p)
    assert scenario_dict(res)["engine"]["kind"] == engine
    assert scenario_dict(res, engine="vllm")["engine"]["kind"] == "vllm"  # --engine wins
    doc = compare_result(res, tmp_path / "run")
    assert doc["simulation"]["engine"] == engine
    assert any(backend in n and "simulated as vllm" in n for n in doc["notes"]) == noted


def test_the_engine_option_wins_over_the_backend_on_the_command_line(tmp_path):
    p = _file(tmp_path, backend="sglang")
    out = tmp_path / "cmp.json"
    r = _run(str(p), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["comparisons"][0]["simulation"]["engine"] == "sglang"
    r = _run(str(p), "--engine", "vllm", "--runs", str(tmp_path / "runs2"), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["comparisons"][0]["simulation"]["engine"] == "vllm"


# --- 4. strict JSON ----------------------------------------------------------------------------


def _strict_load(path: Path):
    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("field,value", [("request_rate", math.inf), ("burstiness", math.inf)])
def test_compare_json_is_strict_with_an_infinite_header_field(tmp_path, field, value):
    p = _file(tmp_path, **{field: value})
    assert "Infinity" in p.read_text()  # json.dumps writes the bare Infinity a Python client's result holds
    out = tmp_path / "cmp.json"
    r = _run(str(p), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.exit_code == 0, r.output
    doc = _strict_load(out)["comparisons"][0]
    assert doc["benchmark"][field] == "inf"
    assert _strict_load(tmp_path / "runs" / "compare-r" / "compare.json")["benchmark"][field] == "inf"


# --- 5. GPU names of another memory size ---------------------------------------------------------


@pytest.mark.parametrize(
    "name,gpu",
    [
        ("NVIDIA A100-SXM-64GB", None),
        ("NVIDIA H100 64GB HBM2e", None),
        ("H100 SXM5 94GB", None),
        ("H100 96GB", None),
        ("H200 96GB", None),
        ("H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("H100-SXM5-80GB", "H100-SXM-80GB"),
        ("NVIDIA H100", "H100-SXM-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("H200 141GB", "H200-SXM-141GB"),
        ("GB200-186GB", "GB200-186GB"),
        ("B200-SXM-180GB", "B200-SXM-180GB"),
        ("NVIDIA B200", "B200-SXM-180GB"),
    ],
)
def test_a_gpu_name_stating_another_memory_size_is_not_the_catalog_part(name, gpu):
    assert find_gpu(name) == gpu


def test_a_gpu_of_another_memory_size_is_refused_on_one_line_with_the_custom_gpu_hint():
    with pytest.raises(ConfigError) as e:
        get_gpu("NVIDIA H100 64GB HBM2e")
    msg = str(e.value)
    assert "\n" not in msg and "NVIDIA H100 64GB HBM2e" in msg and "64 GB" in msg and "H100-SXM-80GB" in msg
    assert "gpu.name=custom" in msg and "memory_gib" in msg


# --- 6. several results in one file --------------------------------------------------------------


def test_a_file_of_several_results_asks_which_and_index_picks_one(tmp_path):
    one = json.loads(_file(tmp_path, "a.json").read_text())
    two = {**one, "input_lens": [x + 1 for x in one["input_lens"]]}
    p = tmp_path / "appended.json"
    p.write_text(json.dumps(one) + "\n" + json.dumps(two) + "\n")
    with pytest.raises(ConfigError) as e:
        read_bench_result(p)
    assert "2 results, one per line" in str(e.value) and "--index" in str(e.value)
    assert "invalid JSON" not in str(e.value)
    assert read_bench_result(p, 1).prompt_tokens.tolist() == two["input_lens"]
    assert read_bench_result(p, 0).prompt_tokens.tolist() == one["input_lens"]
    with pytest.raises(ConfigError, match="0 to 1"):
        read_bench_result(p, 2)
    r = _run(str(p), "--runs", str(tmp_path / "runs"))
    assert r.exit_code == 2 and "--index K" in r.output
    out = tmp_path / "cmp.json"
    r = _run(str(p), "--index", "1", "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.exit_code == 0, r.output
    # A single result is index 0; a broken second document is still invalid JSON.
    assert read_bench_result(_file(tmp_path, "single.json"), 0).num_requests == 16
    p.write_text(json.dumps(one) + "\n{broken\n")
    with pytest.raises(ConfigError, match="invalid JSON at line 2"):
        read_bench_result(p)


# --- 7. num_prompts ------------------------------------------------------------------------------


def test_num_prompts_other_than_the_entries_is_a_warning(tmp_path):
    p = _file(tmp_path, num_prompts=1000)
    res = read_bench_result(p)
    assert len(res) == 16 and len(res.warnings) == 1 and "num_prompts is 1000" in res.warnings[0]
    r = _run(str(p), "--runs", str(tmp_path / "runs"))
    assert r.exit_code == 0, r.output
    assert sum("warning: r.json: num_prompts is 1000" in x for x in r.output.splitlines()) == 1
