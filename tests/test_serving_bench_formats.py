"""How ``kvsim validate --serving-bench`` and ``kvsim calibrate --from-serving-bench`` read benchmark
files: CSV headers, dtype spellings, the checkpoint format of ids without a config, and the JSON
``vllm bench serve`` / SGLang ``bench_serving`` write (one run, several per file, folders, runs that
are not closed loops). Synthetic inputs only; nothing is simulated but in the command-line checks.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from _serving_helpers import kvsim
from calibration.serving_bench import read_bench, read_csv, read_vllm_result
from calibration.serving_runs import row_scenario
from sim.analysis.bench_results import parse_request_rate
from sim.config import scenario_from_dict
from sim.errors import ConfigError
from sim.model_ids import model_argument

HEADER = "model,gpu,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms"
QWEN = "Qwen/Qwen3-8B"
GOOD = f"{QWEN},h100_sxm,vllm,1,128,16,2,30,8"


def result(**kw) -> dict:
    """A ``vllm bench serve --save-result`` file's summary fields (closed loop at 4 clients)."""
    doc = {
        "date": "20250601-120000",
        "backend": "vllm",
        "model_id": QWEN,
        "tokenizer_id": QWEN,
        "num_prompts": 12,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 2.0,
        "completed": 12,
        "total_input_tokens": 12 * 128,
        "total_output_tokens": 12 * 16,
        "mean_ttft_ms": 41.0,
        "mean_tpot_ms": 8.0,
    }
    doc.update(kw)
    return {k: v for k, v in doc.items() if v is not ...}


def sglang_result(**kw) -> dict:
    """What SGLang's ``bench_serving`` writes: no model_id, ``request_rate`` a float (Infinity)."""
    doc = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": math.inf,
        "max_concurrency": 4,
        "server_info": {"model_path": QWEN, "tp_size": 1},
        "duration": 2.0,
        "completed": 12,
        "total_input_tokens": 12 * 128,
        "total_output_tokens": 12 * 16,
        "mean_ttft_ms": 41.0,
        "mean_tpot_ms": 8.0,
    }
    doc.update(kw)
    return doc


def write(p: Path, doc) -> Path:
    p.write_text(json.dumps(doc))
    return p


ON = {"gpu": "h100_sxm", "tp": 1}


# --- 1. the checkpoint format of known ids without a config -----------------------------------


@pytest.mark.parametrize(
    ("ident", "weights"),
    [
        ("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"),
        ("Qwen/Qwen3-8B-FP8", "fp8_block"),
        # A variant no config ships of: its name's tags give its format, as for `kvsim run --model`.
        ("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", "fp8"),
    ],
)
def test_a_known_quantized_id_runs_its_checkpoint_weights_where_the_row_gives_none(tmp_path, ident, weights):
    # As `kvsim run --model ID` resolves the id (sim.model_ids.model_argument).
    assert model_argument(ident)["weight_dtype"] == weights
    row = GOOD.replace(QWEN, ident)
    p = tmp_path / "b.csv"
    p.write_text(f"{HEADER},weights,kv\n{row},,\n{row},bf16,\n")
    unset, given = read_csv(p)
    assert (unset.weights, unset.kv) == (weights, "")  # the KV cache: the engine's default, as for shipped configs
    assert given.weights == "bf16"  # a row's own weights win
    assert scenario_from_dict(row_scenario(unset)).model.weight_dtype == weights
    p.write_text(f"{HEADER}\n{row}\n")  # no weights column at all
    assert read_csv(p)[0].weights == weights
    j = write(tmp_path / "r.json", result(model_id=ident))  # a vLLM result without --weights
    assert read_vllm_result(j, **ON).weights == weights
    assert read_vllm_result(j, **ON, weights="bf16").weights == "bf16"


# --- 2. rate-limited and ramped-up runs are not closed loops ----------------------------------


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("request_rate", 0.5, "request_rate: got 0.5; inf"),
        ("request_rate", "2", "request_rate: got '2'; inf"),
        ("request_rate", True, "request_rate: got True; inf"),
        ("request_rate", "+inf", "request_rate: got '+inf'; inf"),
        ("ramp_up_strategy", "linear", "ramp_up_strategy: got 'linear'; null"),
    ],
)
def test_a_rate_limited_or_ramped_run_is_refused_and_a_folder_reads_the_others(tmp_path, field, value, said):
    bad = write(tmp_path / "limited.json", result(**{field: value}))
    with pytest.raises(ConfigError, match=rf"limited\.json: result, {re.escape(said)}.*kvsim compare") as err:
        read_vllm_result(bad, **ON)
    assert "\n" not in str(err.value)
    write(tmp_path / "ok.json", result())
    problems: list[str] = []
    (r,) = read_bench(tmp_path, problems, **ON)
    assert r.source == "ok.json" and len(problems) == 1 and said in problems[0]


@pytest.mark.parametrize("rate", ["inf", "Infinity", math.inf, None, ...])
def test_a_closed_loop_has_an_infinite_or_no_request_rate(tmp_path, rate):
    p = write(tmp_path / "r.json", result(request_rate=rate))
    assert read_vllm_result(p, **ON).concurrency == 4


@pytest.mark.parametrize(
    "rate", ["inf", " INF ", "Infinity", math.inf, "+inf", "+infinity", "-inf", -math.inf, 4.0, "4", "fast", True]
)
def test_calibrate_reads_a_request_rate_as_compare_does(tmp_path, rate):
    """One rule for a result's ``request_rate`` (:func:`sim.analysis.bench_results.parse_request_rate`):
    infinite is ``"inf"`` (any case), as ``vllm bench serve`` writes it, ``"infinity"``, or JSON's
    ``Infinity`` (SGLang's float). A closed loop for calibrate is exactly a rate compare reads as
    infinite; ``"+inf"``, which no benchmark writes, is refused by both."""
    p = write(tmp_path / "r.json", result(request_rate=rate))
    try:
        infinite = parse_request_rate(p, json.loads(p.read_text()), "request_rate", None) == math.inf
    except ConfigError:
        infinite = False
    try:
        closed = read_vllm_result(p, **ON).concurrency == 4
    except ConfigError as exc:
        assert "request_rate" in str(exc)
        closed = False
    assert closed == infinite


# --- 3. a column given twice ------------------------------------------------------------------


def test_a_column_given_twice_is_refused_naming_it(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text(f"{HEADER},ttft_ms\n{GOOD},999\n")
    with pytest.raises(ConfigError, match=r"dup\.csv: header, ttft_ms: got 'ttft_ms'; each column once") as err:
        read_csv(p)
    assert "columns 8 and 10" in str(err.value)
    p.write_text(f"{HEADER},TTFT_ms\n{GOOD},999\n")  # the same column in another case
    with pytest.raises(ConfigError, match=r"header, ttft_ms: got 'TTFT_ms'"):
        read_csv(p)
    p.write_text(f"{HEADER},note,note,,\n{GOOD},a,b,,\n")  # columns kvsim does not read may repeat
    assert len(read_csv(p)) == 1


# --- 4. the result's backend ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "engine"),
    [("sglang", "sglang"), ("sglang-oai", "sglang"), ("tensorrt-llm", "trtllm"), ("vllm", "vllm"), ("VLLM", "vllm")],
)
def test_the_backend_names_the_engine_unless_the_command_line_does(tmp_path, backend, engine):
    p = write(tmp_path / "r.json", result(backend=backend))
    notes: list[str] = []
    (r,) = read_bench(p, notes=notes, **ON)
    assert (r.engine, r.engine_version, notes) == (engine, "", [])
    (r,) = read_bench(p, engine="trtllm", **ON)
    assert r.engine == "trtllm"


@pytest.mark.parametrize("backend", ["openai", "openai-chat", "tgi", ...])
def test_a_backend_that_names_no_engine_keeps_vllm_and_says_so(tmp_path, backend):
    p = write(tmp_path / "r.json", result(backend=backend))
    notes: list[str] = []
    (r,) = read_bench(p, notes=notes, **ON)
    assert (r.engine, r.engine_version) == ("vllm", "")
    (line,) = notes
    assert "simulated as vllm" in line and "--engine" in line and "r.json" in line
    notes.clear()
    read_bench(p, notes=notes, engine="sglang", **ON)
    assert notes == []  # the command line said which engine


# --- 5. several runs per file -----------------------------------------------------------------


def test_append_result_and_jsonl_files_are_one_run_per_line(tmp_path):
    # vllm bench serve --append-result: one object per line, no newline after the last.
    p = tmp_path / "runs.json"
    p.write_text(json.dumps(result()) + "\n" + json.dumps(result(max_concurrency=2)))
    a, b = read_bench(p, **ON)
    assert (a.concurrency, b.concurrency) == (4, 2)
    assert a.source != b.source and "line 2" in b.origin
    # SGLang's bench_serving appends to a .jsonl; a folder reads those too.
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "s.jsonl").write_text(
        json.dumps(sglang_result()) + "\n\n" + json.dumps(sglang_result(max_concurrency=8)) + "\n"
    )
    rows = read_bench(folder, model=QWEN, **ON)
    assert [(r.concurrency, r.engine) for r in rows] == [(4, "sglang"), (8, "sglang")]
    # An error names the file and the line.
    p.write_text(json.dumps(result()) + "\n" + json.dumps(result(max_concurrency=None)) + "\n")
    with pytest.raises(ConfigError, match=r"runs\.json: line 2, max_concurrency: got None"):
        read_bench(p, **ON)
    problems: list[str] = []
    (r,) = read_bench(p, problems, **ON)
    assert r.concurrency == 4 and len(problems) == 1
    p.write_text(json.dumps(result()) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"runs\.json: line 2: .*valid JSON") as err:
        read_bench(p, **ON)
    assert "\n" not in str(err.value)
    p.write_text(json.dumps(result()) + "\n[1, 2]\n")
    with pytest.raises(ConfigError, match=r"runs\.json: line 2"):
        read_bench(p, **ON)


def test_a_pretty_printed_result_is_still_one_run(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(result(), indent=2))
    (r,) = read_bench(p, **ON)
    assert r.source == "r.json"


# --- 6. naming the model of a result ----------------------------------------------------------


def test_model_option_fills_or_overrides_model_id(tmp_path):
    p = write(tmp_path / "s.json", sglang_result())
    with pytest.raises(ConfigError, match=r"s\.json: result, model_id: got None; .*--model") as err:
        read_vllm_result(p, **ON)
    assert "\n" not in str(err.value)
    assert read_vllm_result(p, model=QWEN, **ON).model == QWEN
    q = write(tmp_path / "v.json", result())
    assert (
        read_vllm_result(q, model="meta-llama/Llama-3.1-8B-Instruct", **ON).model == "meta-llama/Llama-3.1-8B-Instruct"
    )


def test_model_option_may_be_a_config_path_relative_to_the_working_directory(tmp_path, monkeypatch):
    from sim.hf_config import MODELS_DIR

    src = MODELS_DIR / "meta-llama--Llama-3.2-1B_config.json"
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(src.read_text())
    (tmp_path / "runs").mkdir()
    p = write(tmp_path / "runs" / "s.json", sglang_result())
    monkeypatch.chdir(tmp_path)
    r = read_vllm_result(p, model="cfg/config.json", **ON)
    assert Path(r.model).is_absolute() and Path(r.model).is_file()


# --- 7. folders -------------------------------------------------------------------------------


def test_a_folder_skips_torch_traces_and_files_that_are_not_results_in_one_note(tmp_path):
    write(tmp_path / "run.json", result())
    write(tmp_path / "run.pytorch.json", [{"benchmark": {"name": "vLLM benchmark"}, "metric": {"name": "x"}}])
    write(tmp_path / "config.json", {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096})
    write(tmp_path / "server_args.json", {"tp_size": 1, "model_path": QWEN})
    (tmp_path / "README.md").write_text("# notes\n")
    problems: list[str] = []
    notes: list[str] = []
    (r,) = read_bench(tmp_path, problems, notes=notes, **ON)
    assert r.source == "run.json" and problems == []
    (line,) = notes
    assert line.startswith("3 files of ") and "not benchmark results" in line
    for name in ("config.json", "server_args.json", "run.pytorch.json"):
        assert name in line
    # A folder of nothing else is an error that says so.
    (tmp_path / "run.json").unlink()
    with pytest.raises(ConfigError, match="not benchmark results") as err:
        read_bench(tmp_path, [], **ON)
    assert "\n" not in str(err.value)
    # A single such file given on its own is an error, not a max_concurrency complaint.
    with pytest.raises(ConfigError, match=r"config\.json: .*not a benchmark result"):
        read_bench(tmp_path / "config.json", [], **ON)


# --- 8. dtype spellings -----------------------------------------------------------------------


def test_auto_and_fp8_format_spellings(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text(
        f"{HEADER},weights,kv\n"
        f"{GOOD},auto,auto\n"
        f"{GOOD},float8_e4m3fn,fp8_e5m2\n"
        f"{GOOD},FP8,float8_e5m2\n"
        f"{GOOD},fp8_e4m3fn,fp8_e4m3\n" + f"{GOOD},auto,".replace(QWEN, "Qwen/Qwen3-8B-FP8") + "\n"
    )
    rows = read_csv(p)
    assert [(r.weights, r.kv) for r in rows] == [
        ("bf16", ""),
        ("fp8", "fp8"),
        ("fp8", "fp8"),
        ("fp8", "fp8"),
        ("fp8_block", ""),  # auto: the checkpoint's own
    ]
    p.write_text(f"{HEADER},weights\n{GOOD},int4\n")
    with pytest.raises(ConfigError, match=r"row 2, weights: got 'int4'; one of bf16, .*auto.*float8_e4m3fn"):
        read_csv(p)
    p.write_text(f"{HEADER},kv\n{GOOD},int8\n")
    with pytest.raises(ConfigError, match=r"row 2, kv: got 'int8'; one of bf16, fp16, fp8.*auto.*fp8_e5m2"):
        read_csv(p)


# --- 9. column names --------------------------------------------------------------------------


def test_headers_match_in_any_case_and_with_spaces(tmp_path):
    p = tmp_path / "u.csv"
    p.write_text(" Model , GPU,Engine,TP,ISL,OSL,Concurrency,TTFT_ms,TPOT_ms ,Weights\n" + GOOD + ",bf16\n")
    (r,) = read_csv(p)
    assert (r.model, r.tp, r.ttft_ms, r.tpot_ms, r.weights) == (QWEN, 1, 30.0, 8.0, "bf16")


@pytest.mark.parametrize(
    ("header", "missing", "near"),
    [
        (HEADER.replace("ttft_ms,tpot_ms", "TTFT (ms),TPOT (ms)"), "ttft_ms", "TTFT (ms)"),
        (HEADER.replace(",tp,", ",tensor_parallel_size,"), "tp", "tensor_parallel_size"),
        (HEADER.replace(",concurrency,", ",max_concurrency,"), "concurrency", "max_concurrency"),
    ],
)
def test_a_missing_column_with_a_near_miss_says_did_you_mean(tmp_path, header, missing, near):
    p = tmp_path / "n.csv"
    p.write_text(f"{header}\n{GOOD}\n")
    with pytest.raises(ConfigError, match=rf"missing .*{missing} \(did you mean {re.escape(near)}\?") as err:
        read_csv(p)
    assert "\n" not in str(err.value)


# --- the command lines ------------------------------------------------------------------------


def test_cli_validate_reads_a_folder_of_jsonl_runs_with_model_and_says_what_it_skipped(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "s.jsonl").write_text(json.dumps(sglang_result()) + "\n" + json.dumps(sglang_result(max_concurrency=2)))
    write(runs / "zz_limited.json", result(request_rate=0.5, max_concurrency=64))
    write(runs / "config.json", {"hidden_size": 4096})
    args = ("validate", "--serving-bench", "runs", "--gpu", "h100_sxm", "--tp", "1", "--requests-per-client", "1")
    r = kvsim(*args, "--out", "v", cwd=tmp_path)
    assert r.returncode == 2 and "--model" in r.stderr, r.stderr
    r = kvsim(*args, "--model", QWEN, "--out", "v", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = " ".join((r.stdout + r.stderr).split())
    assert "1 row left out, not simulated" in said and "request_rate: got 0.5" in said
    assert "1 file of runs is not a benchmark result" in said or "config.json" in said
    doc = json.loads((tmp_path / "v" / "serving_validation.json").read_text())
    assert [(x["engine"], x["concurrency"], x["engine_version"]) for x in doc["results"]] == [
        ("sglang", 4, ""),
        ("sglang", 2, ""),
    ]


def test_cli_calibrate_passes_model_to_json_results(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import calibration.serving_report as report
    from sim.cli.main import app

    seen: dict = {}

    def fake(path, out, **kw):
        seen.update(kw, path=path)
        raise ConfigError("stop", "here", "the test")

    monkeypatch.setattr(report, "calibrate_from_serving_bench", fake)
    r = CliRunner().invoke(
        app, ["calibrate", "--from-serving-bench", "x.json", "--model", QWEN, "--out", str(tmp_path / "t.json")]
    )
    assert seen.get("model") == QWEN and seen.get("engine") is None, (r.output, seen)
