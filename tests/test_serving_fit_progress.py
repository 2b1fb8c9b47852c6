"""Progress of the serving-engine fits (``kvsim calibrate --from-serving-bench``, ``kvsim validate
--serving-bench --logo``): the phases and evaluation counts a fit reports, that reporting changes no
result, and the plain lines the commands write to a stderr that is not a terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import calibration.serving_fit as sf
from calibration.fit_progress import PlainReporter
from calibration.serving_bench import BenchRow, read_csv
from calibration.serving_runs import RowResult

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HEADER = "model,gpu,engine,tp,isl,osl,concurrency,ttft_ms,tpot_ms"
CSV = (
    f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,2,16.0,7.5\n{LLAMA},h100_sxm,vllm,1,256,16,4,25.0,8.0\n"
    f"Qwen/Qwen3-32B,h100_sxm,vllm,2,128,16,2,30.0,12.0\n"
)


class Recorder:
    def __init__(self):
        self.events: list[tuple] = []

    def fold(self, index, count, label):
        self.events.append(("fold", index, count, label))

    def phase(self, label, total):
        self.events.append(("phase", label, total))

    def evals(self, done):
        self.events.append(("evals", done))


def _fake_row(row: BenchRow, clients, engine: dict, profile) -> RowResult:
    # A cheap stand-in for the simulator: the times move smoothly with the terms.
    return RowResult(
        row, row.ttft_ms * (0.5 + 100 * engine["frontend_s"]), row.tpot_ms * (0.5 + 500 * engine["host_s"])
    )


def _rows(tmp_path: Path) -> list[BenchRow]:
    p = tmp_path / "tiny.csv"
    p.write_text(CSV)
    return read_csv(p)


def test_logo_reports_folds_phases_and_evaluations(tmp_path, monkeypatch):
    monkeypatch.setattr(sf, "simulate_row", _fake_row)
    rows = _rows(tmp_path)
    rec = Recorder()
    with sf.reporting(rec):
        sf.leave_one_group_out(rows, max_evals=5, pooled_prior=True)
    folds = [e for e in rec.events if e[0] == "fold"]
    assert folds == [
        ("fold", 1, 2, "Qwen3-32B / h100_sxm / vllm"),
        ("fold", 2, 2, "Llama-3.1-8B-Instruct / h100_sxm / vllm"),
    ]
    phases = [e[1] for e in rec.events if e[0] == "phase"]
    assert phases == ["shared prior fit", "vllm fit", "predicting the held-out group"] * 2
    # Within each fit, every evaluation counted once, in order, never past --max-evals.
    counts: list[list[int]] = []
    for e in rec.events:
        if e[0] == "phase":
            counts.append([])
        elif e[0] == "evals":
            counts[-1].append(e[1])
    for c in counts:
        assert c == list(range(1, len(c) + 1)) and len(c) <= 5
    assert all(counts[i] for i in (0, 1, 3, 4))


def test_reporting_changes_no_fitted_number(tmp_path, monkeypatch):
    monkeypatch.setattr(sf, "simulate_row", _fake_row)
    rows = _rows(tmp_path)
    bare = sf.fit(rows, max_evals=12)
    with sf.reporting(Recorder()):
        watched = sf.fit(rows, max_evals=12)
    assert watched.to_json() == bare.to_json()
    assert sf.FIT_REPORTER.get() is None


def test_plain_reporter_says_each_phase_and_throttles_evaluations():
    lines: list[str] = []
    rep = PlainReporter("validate", write=lines.append, every=3600.0)
    rep.fold(3, 7, "Llama-3.1-70B / h200_sxm / trtllm")
    rep.phase("trtllm fit", 60)
    for n in range(1, 30):
        rep.evals(n)
    assert len(lines) == 1
    assert lines[0].startswith("validate: fold 3/7: Llama-3.1-70B / h200_sxm / trtllm: trtllm fit, 0/60 evaluations")
    rep.every = 0.0
    rep.evals(30)
    assert "30/60 evaluations" in lines[-1] and "elapsed" in lines[-1] and "this fit at most" in lines[-1]
    assert "all folds about" in lines[-1]


def _kvsim(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_calibrate_prints_progress_lines_to_a_captured_stderr(tmp_path):
    (tmp_path / "tiny.csv").write_text(CSV)
    r = _kvsim(
        "calibrate",
        "--from-serving-bench",
        "tiny.csv",
        "--out",
        "t.json",
        "--max-evals",
        "3",
        "--no-sensitivity",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("calibrate: ")]
    assert progress and progress[0].startswith("calibrate: vllm fit, 0/3 evaluations, ")
    assert "\x1b[" not in r.stderr  # plain lines, no terminal codes


def test_validate_logo_prints_each_fold_to_a_captured_stderr(tmp_path):
    (tmp_path / "tiny.csv").write_text(CSV)
    r = _kvsim("validate", "--serving-bench", "tiny.csv", "--logo", "--no-prior", "--max-evals", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("validate: fold ")]
    assert any(ln.startswith("validate: fold 1/2: Qwen3-32B / h100_sxm / vllm: ") for ln in progress), r.stderr
    assert any(ln.startswith("validate: fold 2/2: Llama-3.1-8B-Instruct / h100_sxm / vllm: ") for ln in progress)
