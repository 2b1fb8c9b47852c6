"""The command line: runs, writes outputs, and fails on bad input with one clear line and exit code 2."""

import json
import subprocess
import sys

import pytest


def kvsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_run_writes_outputs(tmp_path):
    r = kvsim("run", "chat-api", "--set", "workload.num_requests=200", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    for f in ("requests.parquet", "timeseries.parquet", "summary.json", "scenario.yaml"):
        assert (tmp_path / "run" / f).is_file()
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(s[key]) == {"p50", "p90", "p99", "mean"}
    for key in (
        "throughput_tokens_per_s",
        "throughput_requests_per_s",
        "completed",
        "rejected",
        "preemptions",
        "kv_token_utilization",
        "kv_memory_utilization",
        "cost_model",
    ):
        assert key in s
    assert s["cost_model"] == "h100-sxm" and s["cost_model_calibrated"] is True
    assert "TTFT" in r.stdout and "h100-sxm" in r.stdout
    # The scenario written next to the results runs again as is.
    r2 = kvsim("run", str(tmp_path / "run" / "scenario.yaml"), "-q", "--out", str(tmp_path / "again"))
    assert r2.returncode == 0, r2.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text()) == s


def test_roofline_prior_is_labelled_uncalibrated(tmp_path):
    r = kvsim(
        "run",
        "chat-api",
        "--set",
        "workload.num_requests=50",
        "--set",
        "cost_model.profile=none",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert "UNCALIBRATED" in r.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["cost_model"] == "roofline-uncalibrated"


def test_static_baseline_by_override(tmp_path):
    r = kvsim(
        "run",
        "chat-api",
        "-q",
        "--set",
        "workload.num_requests=100",
        "--set",
        "allocator.kind=static",
        "--set",
        "allocator.reserve=max_model_len",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["allocator"] == "static" and s["reserve_tokens"] == 16384


@pytest.mark.parametrize("name", ["models", "gpus", "scenarios", "allocators"])
def test_list(name):
    r = kvsim("list", name)
    assert r.returncode == 0, r.stderr
    assert {"models": "llama-3.1-8b", "gpus": "H100-SXM-80GB", "scenarios": "chat-api", "allocators": "paged"}[
        name
    ] in r.stdout


def _bad_trace(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_text(text)
    return str(p)


BAD = [
    (["--set", "model.name=llama-9"], "model.name", "llama-9"),
    (["--set", "workload.arival.rate=3"], "workload.arival", "unknown key"),
    (["--set", "workload.arrival.rate=-2"], "workload.arrival.rate", "-2"),
    (["--set", "allocator.block_size=0"], "allocator.block_size", "0"),
    (["--set", "gpu.name=L4", "--set", "workload.max_model_len=131072"], "workload.max_model_len", "131072"),
    (["--set", "gpu.name=L4", "--set", "model.name=llama-3.1-70b"], "gpu", "KV capacity"),
    (["--set", "allocator.kind=static", "--set", "allocator.reserve=p0"], "allocator.reserve", "p0"),
    (["--set", "scheduler.max_num_seqs=0"], "scheduler.max_num_seqs", "0"),
    (
        ["--set", "allocator.kind=hybrid_reserve", "--set", "allocator.reserve_fraction=1.5"],
        "allocator.reserve_fraction",
        "1.5",
    ),
    (["--set", "allocator.kind=dynamic", "--set", "allocator.chunk_tokens=20000"], "allocator.chunk_tokens", "20000"),
    (
        ["--set", "allocator.kind=hybrid_tail", "--set", "allocator.static_fraction=0.01"],
        "allocator.static_fraction",
        "0.01",
    ),
    (
        ["--set", "allocator.kind=hybrid_tail", "--set", "allocator.length_predictor=psychic"],
        "allocator.length_predictor",
        "psychic",
    ),
    (
        [
            "--set",
            "allocator.kind=static",
            "--set",
            "allocator.overflow=fallback",
            "--set",
            "allocator.fallback_fraction=0.99",
        ],
        "allocator.fallback_fraction",
        "0.99",
    ),
    (
        [
            "--set",
            "allocator.kind=static",
            "--set",
            "allocator.overflow=fallback",
            "--set",
            "allocator.fallback_fraction=1e-7",
        ],
        "allocator.fallback_fraction",
        "two blocks",
    ),
    # Neither a count nor a duration: named at validation, not an AssertionError when drawing.
    (
        ["--set", "workload.num_requests="],
        "workload.num_requests",
        "got None; an integer in [1, 10000000] (or set workload.duration_s)",
    ),
    # An empty --model is named as given, not as the working directory it resolves to.
    (["--model", ""], "--model", "got ''; a catalog model"),
]


@pytest.mark.parametrize("args,key,value", BAD)
def test_bad_input_is_one_line_exit_2(args, key, value):
    r = kvsim("run", "chat-api", "-q", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith(f"error: {key}") and value in lines[0], lines[0]


@pytest.mark.parametrize(
    "text,needle",
    [
        ("arrival_s,prompt_tokens\n0,5\n", "missing ['output_tokens']"),
        # The other layouts a CSV is read in, for a user whose Azure header is misspelt.
        ("TIMESTAMP,ContextToken,GeneratedTokens\n0,5,3\n", "read as an Azure trace (TIMESTAMP, ContextTokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5,3\n1,-5,3\n", "row 1 is -5"),
    ],
)
def test_bad_trace_is_one_line_exit_2(tmp_path, text, needle):
    path = _bad_trace(tmp_path, text)
    r = kvsim("run", "chat-api", "-q", "--set", f"workload.lengths.path={path}")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: workload.lengths.path") and needle in r.stderr, r.stderr


def test_a_scenario_key_given_twice_is_one_line_exit_2(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("workload:\n  num_requests: 20\n  num_requests: 30\n")
    r = kvsim("run", str(f), "-q", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == (
        f"error: scenario: got '{f}'; YAML with each key at most once per mapping "
        "(workload.num_requests is given twice, on lines 2 and 3)\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_validation_spec_points_to_kvsim_validate(tmp_path):
    r = kvsim("run", "validate-cpu", "--out", str(tmp_path / "v"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        "error: scenario: got 'validate-cpu'; a simulator scenario; this file is a validation spec"
    )
    assert "kvsim validate --scenario validate-cpu" in r.stderr


def test_an_empty_mapping_runs(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("{}\n")
    r = kvsim("run", str(f), "-q", "--set", "workload.num_requests=10", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["requests"] == 10


def test_truncated_requests_are_in_the_table(tmp_path):
    args = ["--set", "workload.num_requests=300", "--set", "allocator.kind=static", "--set", "allocator.reserve=p95"]
    r = kvsim("run", "chat-api", *args, "--set", "allocator.overflow=truncate", "--out", str(tmp_path / "t"))
    assert r.returncode == 0, r.stderr
    truncated = json.loads((tmp_path / "t" / "summary.json").read_text())["truncated"]
    assert truncated > 0
    row = next(line for line in r.stdout.splitlines() if "requests truncated" in line)
    assert row.split("│")[-2].strip() == str(truncated), row
    # An allocator that cannot truncate and did not: no row.
    r = kvsim("run", "chat-api", *args, "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    assert "requests truncated" not in r.stdout
