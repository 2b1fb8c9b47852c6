"""A local sweep whose worker process dies (``kill -9``, the out-of-memory killer, a crash in native
code) fails only the point that worker ran; the others finish.

``concurrent.futures`` marks a whole process pool broken when one worker exits abruptly: every point
then running or queued got ``BrokenProcessPool`` and was recorded failed ("worker died"), and a
point that always killed its worker stopped a local sweep from ever finishing the rest.

The workers here run a stand-in for :func:`sim.analysis.sweep.run_point`: this module's functions,
put in its place with ``monkeypatch`` (the sweep looks it up when it submits; the worker imports this
module to run it). Each point's ``scenario`` tells the stand-in what to do.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sim.analysis import sweep
from sim.analysis.sweep import Point, read_dataset, run_point, run_sweep, runner as sweep_runner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and exit statuses")


def _stand_in(task: dict) -> dict:
    """What a point's ``scenario`` says: sleep, then die by a signal or an exit status, or return ok."""
    how = task["scenario"]
    time.sleep(how.get("sleep_s", 0.0))
    flag = how.get("once")
    if flag is not None:  # dies the first time only (a worker killed for memory another point held)
        if not os.path.exists(flag):
            Path(flag).touch()
            os.kill(os.getpid(), signal.SIGKILL)
    if "signal" in how:
        os.kill(os.getpid(), how["signal"])
        time.sleep(10)  # the signal ends the process before this returns
    if "exit" in how:
        os._exit(how["exit"])
    return {"status": "ok", "error": None, "metrics": {"pid": os.getpid()}, "wall_s": 0.0}


def _points(*hows: dict) -> list[Point]:
    return [Point(i, f"p{i}", None, {"i": i}, how, "/") for i, how in enumerate(hows)]


def _run(monkeypatch, points: list[Point], workers: int = 2) -> dict[str, list[dict]]:
    """point id → every result recorded for it."""
    monkeypatch.setattr(sweep_runner, "run_point", _stand_in)
    got: dict[str, list[dict]] = {}
    sweep.run_points_locally(points, workers, None, lambda p, r: got.setdefault(p.point_id, []).append(r))
    return got


def _only(got: dict[str, list[dict]], pid: str) -> dict:
    assert len(got[pid]) == 1, got[pid]  # every point is recorded exactly once
    return got[pid][0]


def test_a_point_that_kills_its_worker_fails_alone(monkeypatch):
    # Point 1 kills its worker with SIGKILL (what the out-of-memory killer sends) while point 0 runs
    # beside it and points 2-5 are queued.
    pts = _points(
        {"sleep_s": 1.0},
        {"sleep_s": 0.3, "signal": signal.SIGKILL},
        {"sleep_s": 0.1},
        {"sleep_s": 0.1},
        {},
        {},
    )
    got = _run(monkeypatch, pts)
    assert set(got) == {p.point_id for p in pts}
    bad = _only(got, "p1")
    assert bad["status"] == "failed" and bad["metrics"] == {} and bad["wall_s"] is None
    assert bad["error"].startswith("worker died: "), bad["error"]
    assert "signal 9 (SIGKILL" in bad["error"] and "out of memory" in bad["error"], bad["error"]
    assert "BrokenProcessPool" not in bad["error"]
    for pid in ("p0", "p2", "p3", "p4", "p5"):
        assert _only(got, pid)["status"] == "ok", got[pid]


def test_a_worker_that_dies_of_sigterm_is_told_apart_by_running_its_points_alone(monkeypatch):
    # The pool's own clean-up ends the surviving workers with SIGTERM too, so a worker that died of
    # SIGTERM cannot be told from them: every point then running is run again alone.
    pts = _points({"sleep_s": 1.0}, {"sleep_s": 0.3, "signal": signal.SIGTERM}, {}, {})
    got = _run(monkeypatch, pts)
    bad = _only(got, "p1")
    assert bad["status"] == "failed" and "signal 15 (SIGTERM" in bad["error"], bad["error"]
    for pid in ("p0", "p2", "p3"):
        assert _only(got, pid)["status"] == "ok", got[pid]


def test_an_exit_status_is_named(monkeypatch):
    got = _run(monkeypatch, _points({}, {"exit": 3}, {}), workers=1)
    bad = _only(got, "p1")
    assert bad["status"] == "failed" and "exited with status 3" in bad["error"], bad["error"]
    assert _only(got, "p0")["status"] == "ok" and _only(got, "p2")["status"] == "ok"


def test_a_point_whose_worker_died_once_runs_again(tmp_path, monkeypatch):
    # Its worker is killed the first time only: run again alone, it finishes and is ok.
    got = _run(monkeypatch, _points({}, {"once": str(tmp_path / "died")}, {}))
    assert all(_only(got, pid)["status"] == "ok" for pid in ("p0", "p1", "p2")), got
    assert (tmp_path / "died").exists()


def test_every_point_killing_its_worker_ends_the_sweep(monkeypatch):
    kill = {"signal": signal.SIGKILL}
    got = _run(monkeypatch, _points(kill, kill, kill))
    assert all(_only(got, pid)["status"] == "failed" for pid in ("p0", "p1", "p2")), got


# --- the whole sweep, real points -----------------------------------------------------------------


def _kills_at_rate_13(task: dict) -> dict:
    """:func:`run_point`, except that a point at 13 requests/s kills its own worker."""
    if task["scenario"]["workload"]["arrival"].get("rate") == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_point(task)


def test_a_sweep_finishes_every_point_but_the_one_that_kills_its_worker(tmp_path, monkeypatch):
    f = tmp_path / "sw.yaml"
    f.write_text(
        textwrap.dedent("""
        base: chat-api
        set: {workload.num_requests: 30}
        grid:
          workload.arrival.rate: [13, 4, 8, 16]
          allocator.kind: [static, paged]
    """)
    )
    monkeypatch.setattr(sweep_runner, "run_point", _kills_at_rate_13)
    res = run_sweep(f, workers=2, out=tmp_path / "ds", progress=False)
    assert len(res.failures) == 2, res.failures
    for fail in res.failures:
        assert fail["params"]["workload.arrival.rate"] == 13
        assert fail["error"].startswith("worker died: ") and "SIGKILL" in fail["error"], fail["error"]
    rows = read_dataset(tmp_path / "ds").to_pylist()
    assert len(rows) == 8
    for row in rows:
        want = "failed" if row["workload.arrival.rate"] == 13 else "ok"
        assert row["status"] == want, row
        if want == "ok":
            assert row["completed"] == 30
