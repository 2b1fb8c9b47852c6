"""Progress on stderr (sim/output/progress.py) of ``kvsim run``, ``sweep``, ``plan`` and ``calibrate
--device``: bars on a terminal; piped to a file (CI logs, nohup, ``2> log``), plain lines at the
start, as units finish (at most every 10 s) and at the end. The ETA counts down while a unit runs."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sim.output import progress as P

ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _lines(every: float = 10.0, total: int | None = 3, **kw) -> tuple[P.Progress, list[str], FakeClock]:
    out: list[str] = []
    clock = FakeClock()
    return P.Progress("sweep s", "points", total, write=out.append, every=every, clock=clock, **kw), out, clock


# --- the module, with a fake clock ---------------------------------------------------------


def test_plain_lines_start_then_at_most_every_10_s_then_a_last_line():
    prog, out, clock = _lines(total=5)
    prog.start()
    assert out == ["sweep s: 0/5 points, 0s elapsed"]
    clock.t += 4
    prog.update(advance=1)  # 4 s after the first line: held back
    clock.t += 5
    prog.update(advance=1)  # 9 s: still held back
    assert len(out) == 1
    clock.t += 1
    prog.update(advance=1)  # 10 s: due
    assert out[-1] == "sweep s: 3/5 points, 10s elapsed, about 7s more"
    clock.t += 3
    prog.update(advance=0, extra=", 1 failed")  # nothing finished: no line, whatever the time
    clock.t += 20
    prog.update(advance=0)
    assert len(out) == 2
    prog.update(advance=1)  # 23 s after the last line
    assert out[-1] == "sweep s: 4/5 points, 1 failed, 33s elapsed, about 8s more"
    clock.t += 1
    prog.update(advance=1)  # 1 s after: held back, the last line says it
    prog.stop()
    assert len(out) == 4 and out[-1] == "sweep s: done, 5/5 points, 1 failed, 34s elapsed"
    prog.stop()  # once
    assert len(out) == 4


def test_throttle_with_a_fake_clock():
    clock = FakeClock(0.0)
    th = P.Throttle(10.0, clock)
    assert th.due()
    th.mark()
    for t, due in ((0.5, False), (9.99, False), (10.0, True), (25.0, True)):
        clock.t = t
        assert th.due() is due
    th.mark()
    clock.t = 34.9
    assert not th.due()


def test_the_eta_counts_down_while_a_unit_runs():
    prog, out, clock = _lines(every=0.0, total=4)
    prog.start()
    assert prog.eta() is None  # nothing done: no estimate
    clock.t += 10
    prog.update(1)  # 10 s per point, 3 left
    assert prog.eta() == pytest.approx(30.0)
    clock.t += 6  # the second point is running: the estimate moves with the clock
    assert prog.eta() == pytest.approx(24.0)
    clock.t += 30
    assert prog.eta() == 0.0  # slower than the estimate: 0, never negative
    prog.update(2)  # 46 s for 2: 23 s each, 2 left
    assert prog.eta() == pytest.approx(46.0)
    clock.t += 1
    assert prog.eta() == pytest.approx(45.0)
    assert out[-1].endswith(", about 46s more")
    assert P.countdown_eta(3, 3, 0.0, 9.0, 12.0) == 0.0
    assert P.countdown_eta(1, None, 0.0, 9.0, 12.0) is None


def test_the_bar_eta_column_counts_down_between_units():
    clock = FakeClock()
    term = Console(file=io.StringIO(), force_terminal=True, width=120)
    prog = P.Progress("sweep s", "points", 4, console=term, clock=clock)
    assert prog.mode == "bar"
    prog.start()
    try:
        clock.t += 10
        prog.update(1)
        eta_column = prog.bar.columns[-1]
        task = prog.bar.tasks[0]
        first = eta_column.render(task).plain
        clock.t += 7
        later = eta_column.render(task).plain
    finally:
        prog.stop()
    assert first == "eta 0:00:30" and later == "eta 0:00:23"


def test_where_a_bar_and_where_lines():
    term = Console(file=io.StringIO(), force_terminal=True)
    log = Console(file=io.StringIO(), force_terminal=False)
    assert P.Progress("x", "u", 1, console=term).mode == "bar"
    assert P.Progress("x", "u", 1, console=log).mode == "lines"
    assert P.Progress("x", "u", 1, console=term, show=False).mode == "off"
    dumb = Console(file=io.StringIO(), force_terminal=True, _environ={"TERM": "dumb"})
    assert dumb.is_dumb_terminal  # TERM=dumb: rich draws no live bar there
    assert P.Progress("x", "u", 1, console=dumb).mode == "lines"
    # Lines go whole to the console's file, flushed: no wrapping at 80 columns, no codes.
    prog = P.Progress("x" * 100, "u", 1, console=log)
    with prog:
        prog.update(1)
    text = log.file.getvalue()  # type: ignore[attr-defined]
    assert text.splitlines()[0] == "x" * 100 + ": 0/1 u, 0s elapsed" and "\x1b[" not in text


def test_an_interrupted_command_says_stopped(monkeypatch):
    prog, out, clock = _lines(total=None)
    with pytest.raises(KeyboardInterrupt), prog:
        prog.update(2, total=9, note="static done")
        raise KeyboardInterrupt
    assert out[0] == "sweep s: 0/? points, 0s elapsed"
    assert out[-1] == "sweep s: stopped, 2/9 points, 0s elapsed"


def test_the_interval_can_be_set(monkeypatch):
    monkeypatch.setenv(P.EVERY_ENV, "2.5")
    assert P.log_every() == 2.5 and P.Throttle().every == 2.5
    for bad in ("soon", "-1", "nan", ""):
        monkeypatch.setenv(P.EVERY_ENV, bad)
        assert P.log_every() == P.EVERY_S == 10.0


def test_calibrate_device_timings_print_plain_lines(capsys, monkeypatch):
    from calibration.kernels import measure

    monkeypatch.setenv(P.EVERY_ENV, "0")

    class Job:
        def __init__(self, label):
            self.label = label

    class Bench:
        def measure(self, setups, passes, on_done=None):
            for _ in range(passes):
                for i in range(len(setups)):
                    on_done(i)
            return ["t"] * len(setups)

    jobs = [Job("gemm 1"), Job("decode 2")]
    assert measure.time_jobs(Bench(), jobs, [None, None], 2, True) == ["t", "t"]
    err = capsys.readouterr().err.splitlines()
    # Lines begin once the interval (0 s here) has passed: a calibration that fails at its first
    # point (out of memory) is its one error line.
    assert err[0].startswith("calibrate: 1/4 kernel timings (pass 1/2 decode 2), ")
    assert err[1].startswith("calibrate: 2/4 kernel timings (pass 2/2 gemm 1), ")
    assert err[-1].startswith("calibrate: done, 4/4 kernel timings, ")


# --- the commands, stderr piped ------------------------------------------------------------


def _kvsim(cwd: Path, *args: str, every: str | None = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "KVSIM_NATIVE": "0", "PYTHONPATH": str(ROOT)}
    env.pop(P.EVERY_ENV, None)
    if every is not None:
        env[P.EVERY_ENV] = every
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,  # stderr a pipe, as in a CI log
        text=True,
        timeout=300,
    )


def _progress(err: str, prefix: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(prefix)]


def _sweep_file(tmp_path: Path) -> None:
    (tmp_path / "sw.yaml").write_text(
        "name: tiny\nbase: chat-api\nset: {workload.num_requests: 30}\ngrid:\n  workload.arrival.rate: [2, 4, 8]\n"
    )


def test_a_piped_sweep_prints_a_line_per_point(tmp_path):
    _sweep_file(tmp_path)
    r = _kvsim(tmp_path, "sweep", "sw.yaml", "-w", "1", "--out", "ds")
    assert r.returncode == 0, r.stderr
    lines = _progress(r.stderr, "sweep tiny: ")
    assert lines[0] == "sweep tiny: 0/3 points, 0 failed, 0s elapsed", r.stderr
    for n in (1, 2):
        assert any(ln.startswith(f"sweep tiny: {n}/3 points, 0 failed, ") and "more" in ln for ln in lines), lines
    assert lines[-1].startswith("sweep tiny: done, 3/3 points, 0 failed, ")
    assert "\x1b[" not in r.stderr and "━" not in r.stderr  # plain lines, no bar


def test_a_piped_sweep_is_quiet_between_its_first_and_last_lines_within_10_s(tmp_path):
    _sweep_file(tmp_path)
    r = _kvsim(tmp_path, "sweep", "sw.yaml", "-w", "1", "--out", "ds", every=None)
    assert r.returncode == 0, r.stderr
    lines = _progress(r.stderr, "sweep tiny: ")
    # The three points take a few seconds: the start and the end only (a slow machine, one more).
    assert lines[0].startswith("sweep tiny: 0/3 points") and lines[-1].startswith("sweep tiny: done, 3/3 points")
    assert len(lines) <= 3, lines
    q = _kvsim(tmp_path, "sweep", "sw.yaml", "-w", "1", "--out", "ds2", "-q")
    assert q.returncode == 0 and not _progress(q.stderr, "sweep"), q.stderr


def test_a_piped_plan_prints_a_line_per_candidate(tmp_path):
    args = ["plan", "chat-api", "--slo", "ttft_p90_s=0.5", "--allocators", "paged,static"]
    r = _kvsim(tmp_path, *args, "--set", "workload.num_requests=40", "-w", "1", "--out", "pl")
    assert r.returncode == 0, r.stderr
    lines = _progress(r.stderr, "plan: ")
    assert lines[0].startswith("plan: 0/? candidates (searching goodput), "), r.stderr
    assert any(ln.startswith("plan: 1/2 candidates (") for ln in lines), lines
    assert lines[-1].startswith("plan: done, 2/2 candidates, ")
    assert "\x1b[" not in r.stderr


def test_a_piped_run_prints_plain_lines_once_it_has_run_the_interval(tmp_path):
    r = _kvsim(tmp_path, "run", "chat-api", "--set", "workload.num_requests=40", "--out", "out")
    assert r.returncode == 0, r.stderr
    lines = _progress(r.stderr, "run chat-api: ")
    # No start line: a run writes lines only once it has run the interval (here 0 s).
    assert re.match(r"run chat-api: [1-9]\d*/40 requests, ", lines[0]), r.stderr
    assert any(ln.startswith("run chat-api: 20/40 requests, ") for ln in lines), lines
    assert lines[-1].startswith("run chat-api: done, 40/40 requests, ")


def test_a_short_piped_run_and_its_error_write_no_progress_line(tmp_path):
    r = _kvsim(tmp_path, "run", "chat-api", "--set", "workload.num_requests=40", "--out", "out", every="10")
    assert r.returncode == 0 and not _progress(r.stderr, "run chat-api"), r.stderr
    bad = _kvsim(tmp_path, "run", "chat-api", "--set", "gpu.kv_cache_tokens=100", "--out", "o2", every="10")
    assert bad.returncode == 2, bad.stderr
    assert [ln[:31] for ln in bad.stderr.splitlines()] == ["error: workload.max_model_len: "], bad.stderr
