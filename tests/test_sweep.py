"""Sweeps: expansion, resumable dataset, kill-and-resume, failed points, Ray parity, bad files."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest

from sim.analysis.sweep import load_sweep, point_id, read_dataset, run_sweep
from sim.config import load_scenario
from sim.errors import ConfigError

AZURE = {"kind": "empirical", "path": "traces/AzureLLMInferenceTrace_conv.csv"}

# 2 allocators × 2 block sizes × 6 rates × 2 length distributions = 48 points.
BIG = """
name: big
base: chat-api
set:
  workload.num_requests: 60
grid:
  allocator.kind: [static, paged]
  allocator.block_size: [16, 32]
  workload.arrival.rate: [2, 4, 8, 16, 32, 64]
  workload.lengths:
    azure: {kind: empirical, path: traces/AzureLLMInferenceTrace_conv.csv}
    fixed: {kind: fixed, prompt_tokens: 600, output_tokens: 150}
"""


def write(tmp_path, text, name="sweep.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def sweep_cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli.sweep", *map(str, args)], capture_output=True, text=True, timeout=120, **kw
    )


def test_expansion_grid_zip_seeds(tmp_path):
    f = write(
        tmp_path,
        """
        base: chat-api
        set: {workload.num_requests: 50}
        grid:
          allocator.kind: [static, paged]
        zip:
          workload.arrival.rate: [5, 10, 20]
          scheduler.max_num_seqs: [64, 128, 256]
        seeds: 2
    """,
    )
    pts = load_sweep(f).points()
    assert len(pts) == 2 * 3 * 2
    # zip pairs values: rate 10 always goes with 128 sequences.
    pairs = {(p.params["workload.arrival.rate"], p.params["scheduler.max_num_seqs"]) for p in pts}
    assert pairs == {(5, 64), (10, 128), (20, 256)}
    assert sorted({p.seed for p in pts}) == [1, 2]  # chat-api's seed is 1: seeds are 1 + i
    assert len({p.point_id for p in pts}) == len(pts)
    # The id is the hash of the resolved scenario, however the sweep spelled it.
    p = next(
        p
        for p in pts
        if p.params == {"allocator.kind": "paged", "workload.arrival.rate": 10, "scheduler.max_num_seqs": 128}
        and p.seed == 2
    )
    sc = load_scenario(
        "chat-api",
        {
            "workload.num_requests": 50,
            "allocator.kind": "paged",
            "workload.arrival.rate": 10,
            "scheduler.max_num_seqs": 128,
            "seed": 2,
        },
    )
    assert p.point_id == point_id(sc)


def test_big_sweep_killed_then_resumed(tmp_path):
    f = write(tmp_path, BIG)
    out = tmp_path / "ds"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.cli.sweep", str(f), "--workers", "2", "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 90
        while time.time() < deadline and len(list(out.glob("part-*.parquet"))) < 6:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker processes
        proc.wait()
    parts = list(out.glob("part-*.parquet"))
    k = len(parts)
    assert 6 <= k < 48, k
    for p in parts:  # a kill leaves only whole files
        assert pq.read_table(p).num_rows == 1

    res = run_sweep(f, workers=2, out=out, progress=False)
    assert (res.total, res.skipped, res.ran) == (48, k, 48 - k)
    assert res.ok and res.invalid == 0
    table = read_dataset(out)
    assert table.num_rows == 48
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert len(set(table.column("point_id").to_pylist())) == 48
    for col in (
        "allocator.kind",
        "allocator.block_size",
        "workload.arrival.rate",
        "workload.lengths",
        "seed",
        "ttft_s.p90",
        "tpot_s.p99",
        "e2e_s.mean",
        "throughput_tokens_per_s",
        "kv_token_utilization",
        "error",
    ):
        assert col in table.column_names, col
    assert set(table.column("workload.lengths").to_pylist()) == {"azure", "fixed"}
    assert all(v is not None and v > 0 for v in table.column("ttft_s.p90").to_pylist())

    again = run_sweep(f, workers=2, out=out, progress=False)
    assert (again.skipped, again.ran) == (48, 0)


def test_failed_points_are_recorded_and_exit_nonzero(tmp_path):
    f = write(
        tmp_path,
        """
        base: chat-api
        set: {workload.num_requests: 40}
        grid:
          allocator.block_size: [16, 0]          # 0 is invalid: recorded failed without running
          workload.lengths:
            azure: {kind: empirical, path: traces/AzureLLMInferenceTrace_conv.csv}
            missing: {kind: empirical, path: no-such-trace.csv}   # fails when the point runs
    """,
    )
    out = tmp_path / "ds"
    r = sweep_cli(f, "-w", "2", "--out", out, "-q")
    assert r.returncode == 1, r.stderr
    assert "3 of 4 points failed" in r.stderr
    table = read_dataset(out)
    rows = {(row["allocator.block_size"], row["workload.lengths"]): row for row in table.to_pylist()}
    assert len(rows) == 4
    good = rows[(16, "azure")]
    assert good["status"] == "ok" and good["error"] is None and good["completed"] == 40
    assert rows[(0, "azure")]["status"] == "failed" and "allocator.block_size" in rows[(0, "azure")]["error"]
    assert rows[(16, "missing")]["status"] == "failed" and "no-such-trace.csv" in rows[(16, "missing")]["error"]
    assert rows[(16, "missing")]["ttft_s.p90"] is None
    # Failed points run again on a rerun; the ok one does not.
    res = run_sweep(f, workers=1, out=out, progress=False)
    assert (res.skipped, res.ran, res.invalid, len(res.failures)) == (1, 1, 2, 3)


def test_ray_backend_matches_local(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    f = write(
        tmp_path,
        """
        base: chat-api
        set: {workload.num_requests: 50}
        grid:
          allocator.kind: [static, paged]
          workload.arrival.rate: [5, 30]
    """,
    )
    local = run_sweep(f, workers=2, out=tmp_path / "local", progress=False)
    ray_ = run_sweep(f, workers=2, backend="ray", out=tmp_path / "ray", progress=False)
    assert local.ok and ray_.ok and ray_.ran == 4
    a = {r["point_id"]: r for r in read_dataset(tmp_path / "local").to_pylist()}
    b = {r["point_id"]: r for r in read_dataset(tmp_path / "ray").to_pylist()}
    assert a.keys() == b.keys() and len(a) == 4
    for pid in a:
        ra, rb = dict(a[pid]), dict(b[pid])
        ra.pop("wall_s"), rb.pop("wall_s")  # wall-clock time is the only non-deterministic column
        assert ra == rb


BAD = [
    ("grid: {workload.arival.rate: [1, 2]}", "unknown scenario key 'arival'"),
    ("grid: {allocator.kind.x: [1]}", "is a value, not a section"),
    ("grid: {workload.arrival.rate: []}", "non-empty list"),
    ("grid: {workload.arrival.rate: 3}", "a list of values"),
    ("zip: {workload.arrival.rate: [1, 2], allocator.block_size: [16]}", "equal length"),
    ("set: {workload.num_request: 5}\ngrid: {seed: [1, 2]}", "unknown scenario key 'num_request'"),
    ("grids: {seed: [1]}", "unknown sweep key"),
    ("grid: {seed: [1, 2]}\nseeds: 2", "not together with a 'seed' axis"),
    ("seeds: 0", r"an integer in \[1, 10000\]"),
]


@pytest.mark.parametrize("body,message", BAD)
def test_bad_sweep_files_fail_before_any_point(tmp_path, body, message):
    f = write(tmp_path, "base: chat-api\n" + body + "\n")
    out = tmp_path / "ds"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        run_sweep(f, out=out, progress=False)
    assert not out.exists()


def test_unknown_base_is_one_line_exit_2(tmp_path):
    f = write(tmp_path, "base: no-such-scenario\ngrid: {workload.arrival.rate: [1, 2]}\n")
    out = tmp_path / "ds"
    r = sweep_cli(f, "--out", out)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: base: got 'no-such-scenario'")
    assert not out.exists()


def test_an_axis_the_allocator_ignores_is_refused_before_any_point(tmp_path):
    """static reads allocator.block_size only with overflow: fallback: without it, a block-size
    sweep would run one scenario three times."""
    f = write(
        tmp_path,
        """
        base: peak-vs-average          # allocator.kind static, overflow: reject
        set: {workload.num_requests: 20}
        grid:
          allocator.block_size: [16, 64, 256]
          workload.arrival.rate: [5, 10]
    """,
    )
    out = tmp_path / "ds"
    r = sweep_cli(f, "-w", "1", "--out", out, "-q")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    msg = lines[0]
    assert msg.startswith("error: sweep axis allocator.block_size: got [16, 64, 256]; a key the allocator reads"), msg
    assert "allocator.kind static with allocator.overflow: reject ignores it" in msg, msg
    assert "static reads allocator.{reserve, overflow, placement, fallback_fraction, block_size, page_reuse" in msg
    assert "(block_size only with overflow: fallback)" in msg, msg
    assert not out.exists()  # refused before any point ran or was written

    # Read at some point: another kind reads it, or the fallback region does.
    for extra in ("  allocator.kind: [static, paged]\n", "  allocator.overflow: [reject, fallback]\n"):
        g = write(tmp_path, f.read_text() + extra, name="ok.yaml")
        pts = load_sweep(g).points()
        assert len(pts) == 2 * 3 * 2
