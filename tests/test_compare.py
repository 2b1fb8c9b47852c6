"""``kvsim compare``: benchmark result files read and checked, replayed with the same requests and
arrivals, and measured vs simulated statistics (tests/data/bench_results: SYNTHETIC files written by
tests/data/make_bench_results.py)."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from sim.analysis.bench_compare import (
    METRICS,
    STATS,
    THROUGHPUTS,
    compare_result,
    header_check,
    measured_metrics,
    scenario_dict,
    send_times,
    simulated_itl_s,
)
from sim.analysis.bench_results import BenchResult, read_bench_result, result_files
from sim.errors import ConfigError

DATA = Path(__file__).parent / "data" / "bench_results"
CLOSED = DATA / "vllm-infqps-concurrency8-Qwen3-8B-synthetic.json"
POISSON = DATA / "vllm-4.0qps-Qwen3-8B-synthetic.json"
STARTS = DATA / "vllm-3.0qps-Qwen3-8B-start-times-synthetic.json"


def kvsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


# --- the parser ----------------------------------------------------------------------------


def test_synthetic_files_parse_with_their_arrival_process():
    c = read_bench_result(CLOSED)
    assert (c.num_requests, c.failed, len(c)) == (64, 1, 63)
    assert math.isinf(c.request_rate) and c.max_concurrency == 8 and c.start_s is None
    p = read_bench_result(POISSON)
    assert (p.request_rate, p.burstiness, p.max_concurrency, p.failed) == (4.0, 1.0, None, 0)
    s = read_bench_result(STARTS)
    assert s.burstiness == 0.5 and s.start_s is not None and s.start_s.min() == 0.0 and len(s.start_s) == 32
    raw = json.loads(CLOSED.read_text())
    ok = [i for i, e in enumerate(raw["errors"]) if not e]
    assert c.prompt_tokens.tolist() == [raw["input_lens"][i] for i in ok]  # the file's order, failures left out
    assert c.output_tokens.tolist() == [raw["output_lens"][i] for i in ok]


@pytest.mark.parametrize("path", [CLOSED, POISSON, STARTS])
def test_lists_reproduce_the_files_own_aggregates(path):
    """TPOT from the lists (sum of ITLs, or latencies − ttfts) is what vLLM reports in the header."""
    res = read_bench_result(path)
    m = measured_metrics(res)
    h = res.header
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert m[f"{metric}_ms"]["mean"] == pytest.approx(h[f"mean_{metric}_ms"], rel=1e-4)
        assert m[f"{metric}_ms"]["p50"] == pytest.approx(h[f"median_{metric}_ms"], rel=1e-4)
        assert m[f"{metric}_ms"]["p99"] == pytest.approx(h[f"p99_{metric}_ms"], rel=1e-4)
    assert header_check(res) == []
    doctored = BenchResult(**{**res.__dict__, "header": {**h, "mean_ttft_ms": h["mean_ttft_ms"] * 1.5}})
    assert [w.split()[0] for w in header_check(doctored)] == ["mean_ttft_ms"]


def test_folder_reads_every_result_and_skips_pytorch_companions(tmp_path):
    for f in DATA.glob("*.json"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "x.pytorch.json").write_text("[]")
    (tmp_path / "notes.txt").write_text("not a result")
    files = result_files([tmp_path])
    assert [f.name for f in files] == sorted(f.name for f in DATA.glob("*.json"))
    assert all(len(read_bench_result(f)) > 0 for f in files)


def _mutate(tmp_path, change, base=POISSON):
    doc = json.loads(base.read_text())
    change(doc)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return p


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


def _item(key, i, value):
    def f(d):
        d[key][i] = value

    return f


MALFORMED = [
    (lambda d: d.pop("ttfts"), "ttfts", "--save-detailed"),
    (lambda d: d.pop("input_lens"), "input_lens", "one entry per request"),
    (_set("itls", {"0": []}), "itls", "a list with one entry per request"),
    (lambda d: d["output_lens"].pop(), "output_lens", "one per request"),
    (_item("input_lens", 2, 0), "input_lens[2]", "integer token count in [1, 16777216]"),
    (_item("input_lens", 2, math.inf), "input_lens[2]", "integer token count in [1, 16777216]"),
    (_item("input_lens", 2, 2**24), "input_lens[2] + output_lens[2]", "at most 16777216 tokens in one request"),
    (_item("output_lens", 4, 12.5), "output_lens[4]", "integer token count in [0, 16777216] (0: no output token"),
    (_item("output_lens", 4, -1), "output_lens[4]", "integer token count in [0, 16777216] (0: no output token"),
    (_item("ttfts", 1, -0.1), "ttfts[1]", "> 0"),
    (_item("ttfts", 1, "0.2"), "ttfts[1]", "> 0"),
    (_item("itls", 3, [0.01, None]), "itls[3][1]", ">= 0"),
    (_item("itls", 3, 0.01), "itls[3]", "list of gaps"),
    (_item("errors", 0, 7), "errors[0]", "a string"),
    (_set("errors", ["boom"] * 48), "errors", "at least one successful request"),
    (_set("output_lens", [0] * 48), "output_lens", "at least one request with an output token"),
    (_set("request_rate", "fast"), "request_rate", '"inf"'),
    (_set("request_rate", 0), "request_rate", '"inf"'),
    (_set("request_rate", None), "request_rate", "the arrival process"),
    (_set("burstiness", -1), "burstiness", '"inf"'),
    (_set("max_concurrency", 2.5), "max_concurrency", "integer in [1, 10000000]"),
    (_set("max_concurrency", 10**9), "max_concurrency", "integer in [1, 10000000]"),
    (_set("max_concurrency", math.inf), "max_concurrency", "integer in [1, 10000000]"),
    (_set("request_rate", 1e-300), "request_rate", "within 1e+09 s"),
    (_set("burstiness", 1e-300), "burstiness", "coefficient of variation"),
    (_set("ramp_up_strategy", "linear"), "ramp_up_strategy", "start_times"),
    (_set("start_times", [0.0] * 47), "start_times", "one per request"),
    (_set("start_times", [0.0] * 47 + [2e9]), "start_times[47]", "within 1e+09 s of the first"),
    (_set("start_times", [1e308] + [0.0] * 47), "start_times[0]", "within 1e+09 s of the first"),
    (_set("latencies", [0.001] * 48), "latencies[0]", "latency >= its ttft"),
    (_set("duration", "long"), "duration", "seconds"),
    (_set("duration", math.inf), "duration", "in (0, 1e+09]"),
    # Finite but absurd per-request times: numpy's sums and products overflowed into inf and nan.
    (_item("ttfts", 2, 1e308), "ttfts[2]", "at most 1e+09"),
    (_item("itls", 3, [0.01, 1e308]), "itls[3][1]", "at most 1e+09"),
    (_set("latencies", [0.5] * 47 + [1e308]), "latencies[47]", "at most 1e+09"),
    # The header's throughputs are printed as the measured values: checked as duration is.
    (_set("request_throughput", math.nan), "request_throughput", "a number in (0, 1e+06] requests/s"),
    (_set("request_throughput", -1.0), "request_throughput", "a number in (0, 1e+06] requests/s"),
    (_set("request_throughput", "fast"), "request_throughput", "a number in (0, 1e+06] requests/s"),
    (_set("request_throughput", True), "request_throughput", "a number in (0, 1e+06] requests/s"),
    (_set("output_throughput", 0), "output_throughput", "output tokens/s"),
    (_set("total_token_throughput", 1e308), "total_token_throughput", "total tokens/s"),
    (_set("total_token_throughput", math.inf), "total_token_throughput", "computed from the per-request lists"),
]


@pytest.mark.parametrize("change,field,allowed", MALFORMED, ids=[m[1] + "-" + str(i) for i, m in enumerate(MALFORMED)])
def test_malformed_files_name_file_field_and_what_is_allowed(tmp_path, change, field, allowed):
    p = _mutate(tmp_path, change)
    with pytest.raises(ConfigError) as e:
        read_bench_result(p)
    assert e.value.key == f"{p}: {field}"
    assert allowed in e.value.allowed
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text,what", [('{"a": ', "invalid JSON at line 1"), ("[1, 2]", "list"), ("\xff\xfe", "invalid JSON")]
)
def test_unreadable_files(tmp_path, text, what):
    p = tmp_path / "r.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_bench_result(p)
    assert e.value.key == str(p) and what in str(e.value.value)


@pytest.mark.parametrize(
    "change,line",
    [
        (
            _item("output_lens", 4, -3),
            "output_lens[4]: got -3; an integer token count in [0, 16777216] (0: no output token, the request is left out)",
        ),
        # A value the replay's scenario would refuse is named as the file's field, not as the scenario's key.
        (_set("max_concurrency", 10**9), "max_concurrency: got 1000000000; null or an integer in [1, 10000000]"),
        (
            _set("request_throughput", math.nan),
            "request_throughput: got nan; a number in (0, 1e+06] requests/s (null or absent: computed from the "
            "per-request lists over duration)",
        ),
        (_item("ttfts", 2, 1e308), "ttfts[2]: got 1e+308; a finite time in seconds > 0, at most 1e+09"),
    ],
    ids=["output_lens", "max_concurrency", "request_throughput", "ttfts"],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, change, line):
    p = _mutate(tmp_path, change)
    r = kvsim("compare", str(p), "--runs", str(tmp_path / "runs"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {p}: {line}"]
    assert "Traceback" not in r.stderr


def test_a_throughput_missing_from_the_header_is_computed_from_the_lists_and_said(tmp_path):
    """One note names the header's missing throughputs and where their measured values came from."""
    p = _mutate(tmp_path, lambda d: [d.pop("request_throughput"), d.__setitem__("output_throughput", None)])
    res = read_bench_result(p)
    doc = compare_result(res, tmp_path / "run")
    notes = [n for n in doc["notes"] if "throughput" in n]
    assert notes == [
        "request_throughput, output_throughput not in the header: computed from the per-request lists "
        "over duration (12.12 s)"
    ]
    meas = {r["metric"]: r["measured"] for r in doc["rows"] if r["stat"] == "-"}
    assert meas["request_throughput"] == pytest.approx(len(res) / 12.120149)
    assert meas["output_throughput"] == pytest.approx(float(res.output_tokens.sum()) / 12.120149)
    assert meas["total_token_throughput"] == json.loads(POISSON.read_text())["total_token_throughput"]
    # Without duration either, nothing measured to compare with: said too.
    keys = ("request_throughput", "output_throughput", "total_token_throughput", "duration")
    p = _mutate(tmp_path, lambda d: [d.pop(k) for k in keys])
    doc = compare_result(read_bench_result(p), tmp_path / "run2")
    assert [n for n in doc["notes"] if "throughput" in n] == [
        "request_throughput, output_throughput, total_token_throughput not in the header, nor duration: "
        "no measured throughput to compare"
    ]
    assert all(r["measured"] is None for r in doc["rows"] if r["stat"] == "-")
    # All three in the header: no note.
    assert not [n for n in compare_result(read_bench_result(POISSON), tmp_path / "run3")["notes"] if "throughput" in n]


# --- requests without an output token -------------------------------------------------------


def _no_output(i: int, errors: str):
    """Request ``i`` as vLLM saves one that streamed nothing (0 tokens, no gaps, TTFT and latency 0);
    ``errors``: "" (it succeeded), "missing" or "null" (the file has no errors)."""

    def f(d):
        d["output_lens"][i], d["itls"][i], d["ttfts"][i] = 0, [], 0.0
        if "latencies" in d:
            d["latencies"][i] = 0.0
        if errors == "missing":
            d.pop("errors")
        elif errors == "null":
            d["errors"] = None
        else:
            d["errors"][i] = errors

    return f


@pytest.mark.parametrize("errors", ["", "missing", "null"])
@pytest.mark.parametrize("base", [POISSON, STARTS], ids=["poisson", "start_times"])
def test_a_request_without_an_output_token_is_left_out_and_counted(tmp_path, base, errors):
    res = read_bench_result(_mutate(tmp_path, _no_output(3, errors), base))
    full = read_bench_result(base)
    assert (res.num_requests, res.failed, res.no_output, len(res)) == (full.num_requests, 0, 1, len(full) - 1)
    keep = [j for j in range(len(full)) if j != 3]
    assert res.prompt_tokens.tolist() == full.prompt_tokens[keep].tolist()
    assert res.output_tokens.tolist() == full.output_tokens[keep].tolist()
    assert res.ttft_s.tolist() == full.ttft_s[keep].tolist()
    if res.start_s is not None:
        assert len(res.start_s) == len(res)


@pytest.mark.parametrize("errors", ["missing", "null"])
def test_a_failed_request_of_a_file_without_errors_is_left_out_as_without_output(tmp_path, errors):
    """The closed-loop file's request 17 failed: vLLM saved 0 tokens, TTFT 0 and no gaps for it."""
    drop = (lambda d: d.pop("errors")) if errors == "missing" else _set("errors", None)
    res = read_bench_result(_mutate(tmp_path, drop, CLOSED))
    assert (res.num_requests, res.failed, res.no_output, len(res)) == (64, 0, 1, 63)
    assert res.prompt_tokens.tolist() == read_bench_result(CLOSED).prompt_tokens.tolist()


def test_requests_without_an_output_token_are_reported_by_the_cli(tmp_path):
    p = _mutate(tmp_path, _no_output(0, ""))
    out = tmp_path / "cmp.json"
    r = kvsim("compare", str(p), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "47 requests (0 failed in the file, 1 without an output token, left out)" in " ".join(r.stdout.split())
    doc = json.loads(out.read_text())["comparisons"][0]
    assert doc["requests"] == {
        "in_file": 48,
        "failed_left_out": 0,
        "no_output_left_out": 1,
        "simulated": 47,
        "simulated_completed": 47,
    }
    # vLLM's header counts the request in TTFT and E2EL: a difference there says why.
    doctored = read_bench_result(p)
    doctored = BenchResult(**{**doctored.__dict__, "header": {**doctored.header, "mean_ttft_ms": 1.0}})
    assert "1 request without an output token left out here" in header_check(doctored)[0]


# --- several files: a bad one is named and the others are compared -------------------------------


def _folder(tmp_path, good: bool):
    d = tmp_path / "results"
    d.mkdir()
    if good:
        (d / "a_good.json").write_text(POISSON.read_text())
    (d / "b_bad.json").write_text(_mutate(tmp_path, lambda x: x["ttfts"].pop()).read_text())
    # Refused only when its replay is built, after every file was read.
    (d / "c_unknown_model.json").write_text(_mutate(tmp_path, _set("model_id", "acme/unknown")).read_text())
    return d


def test_folder_with_bad_files_compares_the_others_and_lists_the_bad_ones(tmp_path):
    d = _folder(tmp_path, good=True)
    out = tmp_path / "cmp.json"
    r = kvsim("compare", str(d), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.returncode == 1, r.stderr
    b, c = d / "b_bad.json", d / "c_unknown_model.json"
    bad_b = f"{b}: ttfts: got '47 entries'; one per request, like input_lens (48)"
    lines = r.stderr.strip().splitlines()
    assert f"error: {bad_b}" in lines
    assert any(x.startswith(f"error: {c}: model_id: got 'acme/unknown'; ") for x in lines)
    # Listed again at the end, one line each.
    assert lines[-3:-2] == ["2 of 3 result files could not be compared (the others are written):"]
    assert lines[-2] == f"not compared: {bad_b}" and lines[-1].startswith(f"not compared: {c}: model_id: ")
    assert "Traceback" not in r.stderr
    doc = json.loads(out.read_text())
    assert [Path(x["file"]).name for x in doc["comparisons"]] == ["a_good.json"]
    assert [x["file"] for x in doc["not_compared"]] == [str(b), str(c)]
    assert doc["not_compared"][0]["error"] == bad_b
    assert (tmp_path / "runs" / "compare-a_good" / "compare.json").is_file()
    assert not (tmp_path / "runs" / "compare-b_bad").exists()


def test_no_file_that_could_be_compared_is_exit_2(tmp_path):
    d = _folder(tmp_path, good=False)
    out = tmp_path / "cmp.json"
    r = kvsim("compare", str(d), str(tmp_path / "missing.json"), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert [x.split(":")[0] for x in lines] == ["error"] * 4 and len(lines) == 4
    assert lines[0] == f"error: {tmp_path / 'missing.json'}: got 'no such file or folder'; " + (
        "a result file or a folder of them (vllm bench serve --save-result --save-detailed)"
    )
    assert lines[-1] == "error: none of the 3 result files could be compared (each named above)"
    assert not out.exists()


# --- options --------------------------------------------------------------------------------


def test_engine_option_accepts_the_spellings_of_the_serving_bench_engine_column(tmp_path):
    from typer.testing import CliRunner

    from sim.cli.main import app

    out = tmp_path / "cmp.json"
    r = CliRunner().invoke(
        app, ["compare", str(POISSON), "--engine", "TensorRT-LLM", "--runs", str(tmp_path / "runs"), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["comparisons"][0]["simulation"]["engine"] == "trtllm"


@pytest.mark.parametrize(
    "args,key",
    [
        (["missing.json"], "missing.json"),
        ([str(POISSON), "--engine", "tgi"], "--engine"),
        ([str(POISSON), "--model", "acme/unknown"], "--model: got 'acme/unknown'"),
        ([str(POISSON), "--tp", "3"], "--tp: got 3; one of 1, 2, 4, 8"),
        ([str(POISSON), "--gpu", "X9"], "--gpu: got 'X9'"),
        ([str(POISSON), "--profile", "nope"], "--profile: got 'nope'"),
        # Set by --set, the key is the override's.
        ([str(POISSON), "--set", "gpu.tensor_parallel=3"], "error: gpu.tensor_parallel: got 3"),
        ([str(POISSON), "--set", "timeseries.every_s=1"], "timeseries.every_s"),
        ([str(POISSON), "--set", "workload.nope=1"], "workload.nope"),
    ],
)
def test_cli_option_errors_exit_2(tmp_path, args, key):
    from typer.testing import CliRunner

    from sim.cli.main import app

    r = CliRunner().invoke(app, ["compare", *args, "--runs", str(tmp_path / "runs")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1 and key in r.stderr, r.stderr


@pytest.mark.parametrize("which", ["--out folder", "--out under a file", "--runs file"])
def test_a_bad_out_or_runs_path_is_refused_before_any_simulation(tmp_path, which):
    """As kvsim sweep and kvsim report: the option named on one line, before any file is simulated."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    afile = tmp_path / "afile"
    afile.write_text("x")
    runs = tmp_path / "runs"
    args, line = {
        "--out folder": (
            ["--runs", str(runs), "--out", str(tmp_path)],
            f"error: --out: got '{tmp_path}'; a file path (this is a folder)",
        ),
        "--out under a file": (
            ["--runs", str(runs), "--out", str(afile / "cmp.json")],
            f"error: --out: got '{afile / 'cmp.json'}'; a folder; this path is a file",
        ),
        "--runs file": (["--runs", str(afile)], f"error: --runs: got '{afile}'; a folder; this path is a file"),
    }[which]
    r = CliRunner().invoke(app, ["compare", str(POISSON), *args])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [line]
    assert not (runs / "compare-vllm-4.0qps-Qwen3-8B-synthetic").exists() and "wrote" not in r.stdout


@pytest.mark.parametrize(
    "model_id,section",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", {"name": "llama-3.1-8b"}),
        ("Qwen/Qwen3-8B", {"hf_config": "Qwen/Qwen3-8B"}),
        # NVIDIA's FP8 recipe (nvidia/Llama-3.1-70B-Instruct-FP8's) on the 405B shape.
        (
            "nvidia/Llama-3.1-405B-Instruct-FP8",
            {"hf_config": "meta-llama/Meta-Llama-3.1-405B", "weight_dtype": "fp8", "kv_dtype": "fp8"},
        ),
    ],
)
def test_model_id_of_a_shape_kvsim_has_is_simulated_as_it(tmp_path, model_id, section):
    res = read_bench_result(_mutate(tmp_path, _set("model_id", model_id)))
    assert scenario_dict(res)["model"] == section


def test_unknown_model_id_asks_for_model(tmp_path):
    res = read_bench_result(_mutate(tmp_path, _set("model_id", "acme/unknown")))
    with pytest.raises(ConfigError) as e:
        compare_result(res, tmp_path / "run")
    assert e.value.key == f"{res.path}: model_id" and "pass --model" in e.value.allowed


# --- the replay -----------------------------------------------------------------------------


def test_send_times_follow_the_benchmarks_generator():
    base = read_bench_result(POISSON)
    t = send_times(base, seed=3)
    n = len(base)
    assert t[-1] == pytest.approx(n / 4.0) and np.all(np.diff(t) >= 0) and t[0] > 0  # rescaled to N / rate
    assert not np.array_equal(t, send_times(base, seed=4)) and np.array_equal(t, send_times(base, seed=3))
    even = BenchResult(**{**base.__dict__, "burstiness": math.inf})
    assert np.allclose(np.diff(send_times(even, 0)), 0.25)
    burst = BenchResult(
        **{**base.__dict__, "burstiness": 0.25, "num_requests": 4000, "prompt_tokens": np.ones(4000, np.int64)}
    )
    gaps = np.diff(send_times(burst, 0))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)  # gamma shape b: cv = 1 / sqrt(b)
    assert np.array_equal(send_times(BenchResult(**{**base.__dict__, "request_rate": math.inf}), 0), np.zeros(n))
    assert send_times(read_bench_result(CLOSED), 0) is None
    s = read_bench_result(STARTS)
    assert np.array_equal(send_times(s, 0), s.start_s)


def test_closed_loop_replays_the_files_requests_in_order_with_its_concurrency(tmp_path):
    res = read_bench_result(CLOSED)
    doc = compare_result(res, tmp_path)
    rq = pq.read_table(tmp_path / "requests.parquet").sort_by("id")
    assert rq["prompt_tokens"].to_pylist() == res.prompt_tokens.tolist()
    assert rq["output_tokens"].to_pylist() == res.output_tokens.tolist()
    assert set(rq["status"].to_pylist()) == {"completed"}
    arr, fin = rq["arrival_s"].to_numpy(), rq["finish_s"].to_numpy()
    in_flight = [int(((arr <= t) & (fin > t)).sum()) for t in arr]
    # 8 clients, started apart: their first requests at 8 distinct times within the first request's cycle.
    first = np.sort(arr)[:8]
    assert max(in_flight) == 8 and len(set(first.tolist())) == 8 and first[-1] < fin.min() * 1.5
    assert doc["arrival"] == "closed loop, 8 clients"
    assert doc["requests"] == {
        "in_file": 64,
        "failed_left_out": 1,
        "no_output_left_out": 0,
        "simulated": 63,
        "simulated_completed": 63,
    }
    # In step on request: all 8 at t = 0.
    compare_result(res, tmp_path / "in-step", overrides={"workload.arrival.start_spread_cycles": 0})
    arr = pq.read_table(tmp_path / "in-step" / "requests.parquet")["arrival_s"].to_numpy()
    assert np.sum(arr == 0.0) == 8


def test_a_token_stream_that_binds_holds_the_replayed_clients_back(tmp_path):
    """Eight clients of a Qwen3-8B server on one GPU with a 2 ms-per-token stream (500 tokens/s):
    the clients see their first tokens later and send slower than with no stream."""
    res = read_bench_result(CLOSED)
    ttft, end = {}, {}
    for s in (0.0, 2e-3):
        compare_result(res, tmp_path / str(s), overrides={"engine.stream_per_token_s": s})
        rq = pq.read_table(tmp_path / str(s) / "requests.parquet")
        ttft[s] = float(np.mean(rq["first_token_s"].to_numpy() - rq["arrival_s"].to_numpy()))
        end[s] = float(rq["finish_s"].to_numpy().max())
        assert set(rq["status"].to_pylist()) == {"completed"}
    tokens = int(rq["generated_tokens"].to_numpy().sum())
    assert ttft[2e-3] > 2 * ttft[0.0]
    assert end[2e-3] >= tokens * 2e-3 > end[0.0]


def test_open_loop_replays_send_times_as_a_trace(tmp_path):
    res = read_bench_result(STARTS)
    compare_result(res, tmp_path)
    rq = pq.read_table(tmp_path / "requests.parquet").sort_by("id")
    assert np.allclose(np.sort(rq["arrival_s"].to_numpy()), np.sort(res.start_s))


def test_simulated_itl_has_one_gap_per_token_in_both_engine_modes(tmp_path):
    """Step mode (the replay's default) records every iteration; fast-forward windows are spread evenly."""
    res = read_bench_result(POISSON)
    gaps = {}
    for mode in ("fast_forward", "step"):
        compare_result(res, tmp_path / mode, overrides={"engine.mode": mode})
        rq = pq.read_table(tmp_path / mode / "requests.parquet")
        itl, extra = simulated_itl_s(rq, pq.read_table(tmp_path / mode / "timeseries.parquet"))
        gen = rq["generated_tokens"].to_numpy()
        assert extra == 0 and len(itl) == int((gen - 1).sum())
        first, fin = rq["first_token_s"].to_numpy(), rq["finish_s"].to_numpy()
        # Gaps add up to first-token-to-finish of every request: the token-weighted mean is exact.
        assert itl.sum() == pytest.approx(float((fin - first).sum()), rel=1e-9)
        gaps[mode] = np.sort(itl)
    assert np.allclose(gaps["fast_forward"], gaps["step"], rtol=5e-3)
    assert (
        compare_result(res, tmp_path / "default")["rows"]
        == compare_result(res, tmp_path / "explicit", overrides={"engine.mode": "step"})["rows"]
    )


def test_compare_cli_end_to_end(tmp_path):
    out = tmp_path / "cmp.json"
    r = kvsim("compare", str(CLOSED), "--runs", str(tmp_path / "runs"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    for label in (
        "TTFT (ms)",
        "TPOT (ms)",
        "ITL (ms)",
        "requests/s",
        "rel error",
        "closed loop, 8 clients",
        "h100-sxm",
    ):
        assert label in r.stdout
    doc = json.loads(out.read_text())["comparisons"][0]
    rows = {(x["metric"], x["stat"]): x for x in doc["rows"]}
    assert set(rows) == {(m, s) for m, _ in METRICS for s in STATS} | {(k, "-") for k, _ in THROUGHPUTS}
    meas = measured_metrics(read_bench_result(CLOSED))
    for (m, s), x in rows.items():
        assert x["simulated"] > 0
        if s != "-":
            assert x["measured"] == meas[m][s]
        assert x["rel_error"] == pytest.approx((x["simulated"] - x["measured"]) / x["measured"])
    assert doc["simulation"]["engine"] == "vllm" and doc["simulation"]["cost_model_calibrated"] is True
    # The run directory's scenario runs again as is and gives the same simulated latencies.
    run_dir = Path(doc["simulation"]["run_dir"])
    assert json.loads((run_dir / "compare.json").read_text()) == doc
    r2 = kvsim("run", str(run_dir / "scenario.yaml"), "-q", "--out", str(tmp_path / "again"))
    assert r2.returncode == 0, r2.stderr
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["ttft_s"]["p50"] * 1e3 == pytest.approx(rows[("ttft_ms", "p50")]["simulated"], rel=1e-12)


def test_folder_and_engine_options(tmp_path):
    r = kvsim(
        "compare",
        str(DATA),
        "--engine",
        "sglang",
        "--model",
        "qwen3-8b",
        "--gpu",
        "H200-SXM-141GB",
        "--tp",
        "2",
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "all.json"),
    )
    assert r.returncode == 0, r.stderr
    docs = json.loads((tmp_path / "all.json").read_text())["comparisons"]
    assert [Path(d["file"]).name for d in docs] == sorted(p.name for p in DATA.glob("*.json"))
    for d in docs:
        sim = d["simulation"]
        assert (sim["engine"], sim["gpu"], sim["tensor_parallel"], sim["model"]) == (
            "sglang",
            "H200-SXM-141GB",
            2,
            "qwen3-8b",
        )


def test_same_file_and_seed_give_identical_results(tmp_path):
    res = read_bench_result(POISSON)
    a = compare_result(res, tmp_path / "a", seed=5)
    b = compare_result(res, tmp_path / "b", seed=5)
    c = compare_result(res, tmp_path / "c", seed=6)
    assert a["rows"] == b["rows"] and a["warnings"] == b["warnings"]
    assert a["rows"] != c["rows"]  # the seed draws the Poisson send times


def test_checked_in_files_are_what_the_generator_writes(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "make_bench_results", Path(__file__).parent / "data" / "make_bench_results.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "OUT", tmp_path)
    mod.main()
    made = sorted(p.name for p in tmp_path.glob("*.json"))
    assert made == sorted(p.name for p in DATA.glob("*.json"))
    for name in made:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
        assert "SYNTHETIC" in json.loads((DATA / name).read_text())["synthetic"]


def test_lengths_trace_with_a_path_replays_its_rows_in_order(tmp_path):
    from sim.config import scenario_from_dict
    from sim.workload.generator import build_workload

    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n0,20,2\n0,30,3\n")
    for arrival in ({"kind": "closed_loop", "concurrency": 2}, {"kind": "poisson", "rate": 5}):
        sc = scenario_from_dict(
            {"workload": {"num_requests": 7, "arrival": arrival, "lengths": {"kind": "trace", "path": "t.csv"}}},
            base_dir=tmp_path,
        )
        wl = build_workload(sc)
        assert wl.prompt_tokens.tolist() == [10, 20, 30, 10, 20, 30, 10]
        assert wl.output_tokens.tolist() == [1, 2, 3, 1, 2, 3, 1]
    with pytest.raises(ConfigError) as e:
        build_workload(scenario_from_dict({"workload": {"lengths": {"kind": "trace"}}}))
    assert e.value.key == "workload.lengths.kind" and "workload.lengths.path" in e.value.allowed


def _result(prompts, outputs, concurrency, rate) -> BenchResult:
    n = len(prompts)
    return BenchResult(
        path=Path("prop.json"),
        header={"model_id": "qwen3-8b"},
        request_rate=rate,
        burstiness=1.0,
        max_concurrency=concurrency,
        num_requests=n,
        failed=0,
        no_output=0,
        prompt_tokens=np.array(prompts, np.int64),
        output_tokens=np.array(outputs, np.int64),
        ttft_s=np.full(n, 0.01),
        itl_s=tuple(np.full(o - 1, 0.01) for o in outputs),
        decode_s=np.array([0.01 * (o - 1) for o in outputs]),
        start_s=None,
        duration_s=None,
    )


@settings(max_examples=20)
@given(
    lens=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 300)), min_size=1, max_size=24),
    concurrency=st.one_of(st.none(), st.integers(1, 12)),
    rate=st.sampled_from([math.inf, 2.0, 40.0]),
    kv_tokens=st.sampled_from([None, 3400]),
    engine=st.sampled_from(["vllm", "sglang"]),
)
def test_simulated_itl_invariants(tmp_path_factory, lens, concurrency, rate, kv_tokens, engine):
    """Whatever the load, engine and preemptions: one gap per token plus the iterations a request sat
    out, gaps adding up to each request's first-to-last-token time; fast-forward's evenly spread
    windows within 2 % of stepping on these lengths (a window's decode steps grow with the context)."""
    res = _result([p for p, _ in lens], [o for _, o in lens], concurrency, rate)
    # 3,400 KV tokens hold any one request (at most 3,300 tokens) but preempt under load. No token
    # stream: the gaps are the engine's iterations, and a stream's queue would move the first and
    # last token a client sees off them (docs/compare.md, limits).
    over = {"gpu.kv_cache_tokens": kv_tokens} if kv_tokens else {}
    over["engine.stream_per_token_s"] = 0.0
    sorted_gaps = []
    for mode in ("fast_forward", "step"):
        d = tmp_path_factory.mktemp(mode)
        doc = compare_result(res, d, engine=engine, overrides=over | {"engine.mode": mode})
        rq = pq.read_table(d / "requests.parquet")
        itl, extra = simulated_itl_s(rq, pq.read_table(d / "timeseries.parquet"))
        ok = np.asarray(rq["status"].to_pylist()) == "completed"
        gen = rq["generated_tokens"].to_numpy()[ok]
        span = (rq["finish_s"].to_numpy() - rq["first_token_s"].to_numpy())[ok]
        assert len(itl) == int((gen[gen > 1] - 1).sum()) + extra
        assert itl.sum() == pytest.approx(float(span[gen > 1].sum()), rel=1e-9, abs=1e-12)
        if engine == "vllm" and doc["simulation"]["preemptions"] == 0:
            assert extra == 0
        sorted_gaps.append(np.sort(itl))
    assert len(sorted_gaps[0]) == len(sorted_gaps[1])
    assert np.allclose(sorted_gaps[0], sorted_gaps[1], rtol=0.02, atol=1e-9)
