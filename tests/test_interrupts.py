"""Interrupted runs and killed sweeps (issue 28, class 9), with real processes and real signals.

* SIGINT (Ctrl-C) or SIGTERM sent by PID to ``kvsim run`` writing into a folder that holds a
  finished run: exit 128 + signal, one ``error:`` line, and the earlier run's files byte for byte
  as they were (nothing added, nothing left half-written).
* ``kill -9`` of ``kvsim sweep`` (and ``kvsim plan``): no worker process outlives it.
* SIGINT/SIGTERM to ``kvsim sweep``: one line, workers gone, finished points readable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "chat-api.yaml"
sys.path.insert(0, str(ROOT))

from bench.hostile import alive, descendants  # noqa: E402  (process tree from /proc)


def _kvsim(cwd: Path, *args: str) -> subprocess.Popen:
    # Its own session: the signals of this test reach only the command (and its children).
    return subprocess.Popen(
        [sys.executable, "-m", "sim.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() if p.is_file() else b"<folder>" for p in sorted(folder.iterdir())}


def _wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    t0 = time.time()
    while not cond():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: {proc.communicate()[1][-800:]}")
        if time.time() - t0 > timeout_s:
            pytest.fail(f"no {what} after {timeout_s} s")
        time.sleep(0.05)


def _kill_all(pids) -> None:
    for pid in pids:  # only processes this test started
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_the_earlier_run_intact(tmp_path, sig):
    first = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", "chat-api", "-q", "--out", "out", "--set", "workload.num_requests=60"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out"
    before = _files(out)
    assert {"summary.json", "requests.parquet", "timeseries.parquet", "scenario.yaml"} <= set(before)

    p = _kvsim(
        tmp_path,
        "run",
        "chat-api",
        "-q",
        "--out",
        "out",
        "--set",
        "workload.num_requests=300000",
        "--set",
        "workload.arrival.rate=16",
    )
    try:
        # Signal once the run is writing (its staging folder exists), not during interpreter start-up.
        _wait_for(lambda: any(out.glob(".staging-*")), 120, "staging folder", p)
        time.sleep(0.5)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        _kill_all([p.pid])
    assert p.returncode == 128 + sig, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(f"error: interrupted by {sig.name}"), err
    assert "a sweep resumes" not in err  # only a sweep's line says so
    assert "Traceback" not in err
    assert _files(out) == before  # same names (no staging folder or temporary file left), same bytes
    pq.read_table(out / "requests.parquet")


def _sweep_file(tmp_path: Path) -> None:
    (tmp_path / "sw.yaml").write_text(
        f"base: {SCENARIO}\nset: {{workload.num_requests: 60000, workload.arrival.rate: 16}}\nseeds: 4\n"
    )


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_no_worker_outlives_a_killed_parent(tmp_path, command):
    _sweep_file(tmp_path)
    args = (
        ["sweep", "sw.yaml", "-q", "-w", "2", "--out", "ds"]
        if command == "sweep"
        else [
            "plan",
            "chat-api",
            "--slo",
            "ttft_p90_s=0.5",
            "-q",
            "-w",
            "2",
            "--out",
            "pl",
            "--set",
            "workload.num_requests=60000",
        ]
    )
    p = _kvsim(tmp_path, *args)
    kids: set[int] = set()
    try:
        # sweep: the forkserver and two workers (a resource tracker may come too); plan forks its
        # two workers from the command itself.
        _wait_for(lambda: len(descendants(p.pid)) >= (3 if command == "sweep" else 2), 120, "worker processes", p)
        time.sleep(1.0)
        kids = descendants(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)  # not communicate(): a surviving worker would hold its pipes open
        t0 = time.time()
        while time.time() - t0 < 10 and any(alive(k) for k in kids):
            time.sleep(0.1)
        survivors = [k for k in kids if alive(k)]
        assert not survivors, f"{len(survivors)} of {len(kids)} children alive 10 s after kill -9 of {command}"
    finally:
        _kill_all([p.pid, *kids])
        p.communicate(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sweep_is_one_line_and_stops_its_workers(tmp_path, sig):
    _sweep_file(tmp_path)
    p = _kvsim(tmp_path, "sweep", "sw.yaml", "-q", "-w", "2", "--out", "ds")
    kids: set[int] = set()
    try:
        _wait_for(lambda: len(descendants(p.pid)) >= 3, 120, "worker processes", p)
        time.sleep(1.0)
        kids = descendants(p.pid)
        p.send_signal(sig)
        p.wait(timeout=60)
        t0 = time.time()
        while time.time() - t0 < 10 and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not [k for k in kids if alive(k)]
    finally:
        _kill_all([p.pid, *kids])
        _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: interrupted by {sig.name}") and "Traceback" not in err
    assert lines[0].endswith("(a sweep resumes from its finished points)"), lines[0]
    for part in (tmp_path / "ds").glob("part-*.parquet"):  # whatever finished is whole
        pq.read_table(part)


_PLAN = ["plan", "chat-api", "--slo", "ttft_p90_s=0.5", "-q", "-w", "2", "--out", "pl"]
_PLAN += ["--set", "workload.num_requests=60000"]  # minutes of candidates: an exit soon after is the stop


def _children_gone(kids: set[int], within_s: float) -> list[int]:
    t0 = time.time()
    while time.time() - t0 < within_s and any(alive(k) for k in kids):
        time.sleep(0.1)
    return [k for k in kids if alive(k)]


def _interrupt_plan(tmp_path: Path, sigs: list[signal.Signals]) -> tuple[subprocess.Popen, str, float, list[int]]:
    """Signal a running ``kvsim plan`` (``sigs`` 0.3 s apart); (process, stderr, exit seconds, survivors)."""
    p = _kvsim(tmp_path, *_PLAN)
    kids: set[int] = set()
    try:
        _wait_for(lambda: len(descendants(p.pid)) >= 2, 120, "worker processes", p)
        time.sleep(1.5)  # the workers are running candidates
        kids = descendants(p.pid)
        t0 = time.time()
        for i, sig in enumerate(sigs):
            if i:
                time.sleep(0.3)
            if p.poll() is None:
                p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kvsim plan still running 60 s after {[s.name for s in sigs]}")
        took = time.time() - t0
        return p, err, took, _children_gone(kids, 10)
    finally:
        _kill_all([p.pid, *kids])
        if p.poll() is None:
            p.communicate(timeout=30)


def test_an_interrupted_plan_stops_at_once_and_keeps_the_earlier_plan(tmp_path):
    # An earlier plan's files in --out: the interrupted plan must leave them as they were.
    (tmp_path / "pl").mkdir()
    (tmp_path / "pl" / "plan.json").write_text('{"earlier": true}\n')
    before = _files(tmp_path / "pl")
    p, err, took, survivors = _interrupt_plan(tmp_path, [signal.SIGINT])
    assert p.returncode == 130, err
    # The workers are killed, not awaited (their candidates would take minutes).
    assert took < 15, f"exit {took:.1f} s after SIGINT"
    assert not survivors, f"{len(survivors)} worker(s) alive after the plan exited"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted by SIGINT") and "Traceback" not in err
    assert _files(tmp_path / "pl") == before


def test_a_plan_signalled_twice_exits(tmp_path):
    # The second signal lands while the first unwinds: it must not interrupt the cleanup.
    p, err, took, survivors = _interrupt_plan(tmp_path, [signal.SIGTERM, signal.SIGTERM])
    assert p.returncode == 143, err
    assert took < 15, f"exit {took:.1f} s after the first SIGTERM"
    assert not survivors
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted by SIGTERM") and "Traceback" not in err


def test_a_signal_during_start_up_is_one_line(tmp_path):
    # 0.3 s: inside the imports of the command line (typer, rich, the commands' modules).
    p = _kvsim(tmp_path, "run", "chat-api", "-q", "--out", "out")
    try:
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        _kill_all([p.pid])
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: interrupted by SIGINT"), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
