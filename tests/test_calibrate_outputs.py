"""What ``kvsim calibrate --device`` leaves on disk and prints when things go wrong: its three files
appear together or not at all (Ctrl-C while writing), a report from an earlier run into the same
``--out`` is not left beside a profile it does not describe, a kernel that runs out of the device's
memory is one ``error:`` line, and ``kvsim profile diff`` prices a device profile's own model by default.

Fast: no kernel is timed (the writer gets a built-in profile; the out-of-memory test fails the first
point before it runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.interrupts import run_app
from sim.cost.profile import load_profile


def _result(name: str):
    from calibration.kernels import DeviceResult, Measurements

    meas = Measurements()
    meas.rows.append({"family": "gemm", "kernel": "qkv", "m": 1, "median_s": 1e-5, "min_s": 1e-5, "max_s": 1e-5})
    return DeviceResult(load_profile(name), meas, {}, 0.0)


def _fake_report(text: str):
    def write(path, *args):
        Path(path).write_text(text)
        return Path(path)

    return write


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_interrupt_while_writing_leaves_the_earlier_run(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from calibration.kernels import calibrate as C

    out = tmp_path / "cpu.json"
    monkeypatch.setattr(C, "write_report", _fake_report("first run"))
    files = C.write_outputs(_result("cpu-reference"), out, None)
    assert files["report"] and files["report"].read_text() == "first run"
    before = _snapshot(tmp_path)
    assert set(before) == {"cpu.json", "cpu.measurements.parquet", "cpu.report.html"}

    def interrupted(path, *args):
        Path(path).write_text("half a rep")
        raise KeyboardInterrupt  # Ctrl-C while the second run writes its report

    monkeypatch.setattr(C, "write_report", interrupted)
    with pytest.raises(KeyboardInterrupt):
        C.write_outputs(_result("h100-sxm"), out, None)
    assert _snapshot(tmp_path) == before  # no new profile beside the old report, no staging folder left
    assert load_profile(out).name == "cpu-reference"


def test_no_report_run_removes_the_earlier_report(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from calibration.kernels import calibrate as C

    out = tmp_path / "cpu.json"
    monkeypatch.setattr(C, "write_report", _fake_report("first run"))
    C.write_outputs(_result("cpu-reference"), out, None)
    files = C.write_outputs(_result("h100-sxm"), out, None, report=False)
    assert files["report"] is None and files["removed"] == tmp_path / "cpu.report.html"
    assert set(_snapshot(tmp_path)) == {"cpu.json", "cpu.measurements.parquet"}
    assert json.loads(out.read_text())["name"] == "h100-sxm"


def test_tables_route_interrupted_write_keeps_the_earlier_profile(tmp_path, monkeypatch, capsys):
    from sim.cli.main import app
    from sim.cost import profile as P

    out = tmp_path / "p.json"
    out.write_text("earlier\n")
    real = P.Profile.write

    def interrupted(self, path):
        Path(path).write_text('{"format": "kvsim-pro')
        raise KeyboardInterrupt

    monkeypatch.setattr(P.Profile, "write", interrupted)
    args = ["calibrate", "--from-tables", "calibration/data/gpu-kernels", "--system", "h100_sxm"]
    rc = run_app(app, [*args, "--model", "llama-3.1-8b", "--tp", "1", "--dtype", "bf16", "--out", str(out)])
    monkeypatch.setattr(P.Profile, "write", real)
    assert rc == 130
    assert out.read_text() == "earlier\n" and [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(
    ("method", "error", "said"),
    [
        # A point's buffers: the point named.
        (
            "gemm_calls",
            "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough memory: "
            "you tried to allocate 3489660928 bytes.\nmore detail",
            ("timing GEMM qkv m=1 ran out of memory", "not enough memory"),
        ),
        # The paged KV pool, reserved before any point is timed.
        (
            "reserve_paged",
            "CUDA out of memory. Tried to allocate 40.00 GiB\nmore detail",
            ("reserving the paged KV pool ran out of memory (CUDA out of memory",),
        ),
    ],
)
def test_out_of_memory_is_one_line_naming_what_ran_out(tmp_path, monkeypatch, capsys, method, error, said):
    pytest.importorskip("torch")
    from calibration.kernels import timing
    from sim.cli.main import app

    def no_memory(self, *args, **kw):
        raise RuntimeError(error)

    monkeypatch.setattr(timing.Bench, method, no_memory)
    out = tmp_path / "cpu.json"
    args = ["calibrate", "--device", "cpu", "--model", "tiny-llama", "--quick", "--no-report", "--out", str(out)]
    rc = run_app(app, args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: calibrate.model: got 'tiny-llama'; ")
    assert all(s in err[0] for s in said) and "more detail" not in err[0], err[0]
    assert not any(tmp_path.iterdir())


def test_out_of_memory_recognised():
    from calibration.kernels.measure import out_of_memory

    assert out_of_memory(MemoryError()) and out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("out of memory"))


def test_profile_diff_defaults_to_the_profiles_own_model(capsys):
    from sim.cli.main import app

    # cpu-reference holds tiny-llama only: llama-3.1-8b (the old default) was refused
    rc = run_app(app, ["profile", "diff", "cpu-reference", "cpu-reference"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.startswith("tiny-llama TP1 bf16 GEMMs")
    # several models in A: still llama-3.1-8b
    assert run_app(app, ["profile", "diff", "h100-sxm", "h200-sxm"]) == 0
    assert capsys.readouterr().out.startswith("llama-3.1-8b TP1")
