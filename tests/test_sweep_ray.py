"""``kvsim sweep --backend ray``: a bad ``--address`` fails at once, in one line, before the
dataset folder changes; SIGTERM ends a Ray sweep as it ends a local one (one line, exit 143).

Real processes: the command runs as ``python -m sim.cli``, Ray starts locally (no cluster).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.analysis.sweep import read_dataset, run_sweep

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hostile import alive, descendants  # noqa: E402  (process tree from /proc)

FOUR = """
name: four
base: chat-api
set: {workload.num_requests: 12}
grid:
  allocator.kind: [static, paged]
  workload.arrival.rate: [RATES]
"""


def _sweep_file(folder: Path, rates: str = "4, 8", name: str = "sw.yaml") -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(FOUR.replace("RATES", rates)))
    return p


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _kvsim(cwd: Path, *args: str, prelude: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    """``kvsim ARGS`` (``prelude``: Python run first in the same process)."""
    code = f"import runpy, sys\n{prelude}\nsys.argv = ['kvsim', *sys.argv[1:]]\nrunpy.run_module('sim.cli', run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() if p.is_file() else b"<folder>" for p in sorted(folder.iterdir())}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_ray_client_address_without_ray_client_leaves_the_dataset_as_it_was(tmp_path):
    # The docs' cluster example (ray://head:10001) needs Ray Client (pip package ray[client]).
    # Without it: one line naming --address, the value and the package, exit 2, and the folder's
    # finished points untouched (it used to be a traceback after _sweep.json had been replaced
    # and the old points moved aside: the dataset then read as 0 points).
    first = _sweep_file(tmp_path)
    out = tmp_path / "ds"
    res = run_sweep(first, workers=1, out=out, progress=False)
    assert res.ok and res.ran == 4
    before = _files(out)
    other = _sweep_file(tmp_path, rates="5, 9", name="other.yaml")  # four new points
    r = _kvsim(
        tmp_path,
        "sweep",
        str(other),
        "--backend",
        "ray",
        "--address",
        "ray://head:10001",
        "--out",
        str(out),
        "-q",
        prelude="sys.modules['grpc'] = None  # as without ray[client]: Ray Client's import of grpc fails",
    )
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith("error: --address: got 'ray://head:10001'") and "pip install 'ray[client]'" in line, line
    assert _files(out) == before
    assert read_dataset(out).num_rows == 4


def test_an_unreachable_address_fails_at_once_in_one_line(tmp_path):
    # Port 1 refuses: Ray used to retry for minutes, printing its C++ warnings.
    _sweep_file(tmp_path)
    t0 = time.monotonic()
    r = _kvsim(tmp_path, "sweep", "sw.yaml", "--backend", "ray", "--address", "127.0.0.1:1", "--out", "ds", "-q")
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith("error: --address: got '127.0.0.1:1'") and "nothing answers at" in line, line
    assert not (tmp_path / "ds").exists()  # the folder this run made is gone again
    assert took < 30, took


@pytest.mark.timing
@pytest.mark.parametrize(
    "address, why",
    [
        (":6379", "the host before ':6379' is empty"),
        ("127.0.0.1:99999", "'99999' is not a port (an integer in 1-65535)"),
        ("head:", "no port after 'head:'"),
        ("ray://:10001", "the host before ':10001' is empty"),
    ],
)
def test_a_malformed_address_is_one_line_saying_what_is_wrong(tmp_path, address, why):
    # ":6379" printed Ray's logged ERROR line and a traceback, then ended in a blank "Malformed host: ".
    _sweep_file(tmp_path)
    prelude = (
        "sys.modules['grpc'] = __import__('types').ModuleType('grpc')  # Ray Client present" if "://" in address else ""
    )
    r = _kvsim(
        tmp_path, "sweep", "sw.yaml", "--backend", "ray", "--address", address, "--out", "ds", "-q", prelude=prelude
    )
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith(f"error: --address: got {address!r}; ") and line.endswith(why), line
    assert "Malformed" not in line and "ERROR" not in r.stderr
    assert not (tmp_path / "ds").exists()


def test_an_address_where_no_ray_answers_fails_within_30_s(tmp_path):
    # A port that accepts connections but is not a Ray head (the dashboard's, say): Ray's GCS
    # client waits and retries (20 attempts of ~40 s by default); bounded to one of ~20 s, and
    # Ray's C++ warnings are held back behind the one line.
    _sweep_file(tmp_path)
    with socket.socket() as server:
        server.bind(("", 0))  # every interface: Ray connects to this node's address, not 127.0.0.1
        server.listen(8)  # accepts (the kernel's backlog), never answers
        address = f"127.0.0.1:{server.getsockname()[1]}"
        t0 = time.monotonic()
        r = _kvsim(tmp_path, "sweep", "sw.yaml", "--backend", "ray", "--address", address, "--out", "ds", "-q")
        took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith(f"error: --address: got '{address}'") and "Ray could not connect" in line, line
    assert not (tmp_path / "ds").exists()
    assert took < 40, took


def _workers(pid: int) -> set[int]:
    found = set()
    for k in descendants(pid):
        try:
            if b"run_point" in Path(f"/proc/{k}/cmdline").read_bytes():
                found.add(k)
        except OSError:
            pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_ray_sweep_is_one_line_and_stops_its_workers(tmp_path, sig):
    # As the local backend (tests/test_interrupts.py): SIGTERM used to reach Ray's handlers (a
    # C++ stack dump, exit 1).
    (tmp_path / "sw.yaml").write_text(
        "base: chat-api\nset: {workload.num_requests: 600000, workload.arrival.rate: 16}\nseeds: 4\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "sweep", "sw.yaml", "--backend", "ray", "-w", "2", "--out", "ds", "-q"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_env(),
    )
    kids: set[int] = set()
    try:
        t0 = time.time()
        while len(_workers(p.pid)) < 2:
            if p.poll() is not None:
                pytest.fail(f"the sweep ended before its points ran: {p.communicate()[1][-800:]}")
            if time.time() - t0 > 120:
                pytest.fail("no Ray workers after 120 s")
            time.sleep(0.05)
        time.sleep(1.0)
        kids = descendants(p.pid)
        p.send_signal(sig)
        p.wait(timeout=60)
        t0 = time.time()
        while time.time() - t0 < 15 and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not [k for k in kids if alive(k)]
    finally:
        for pid in [p.pid, *kids]:  # only processes this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err
    assert _one_line(err).startswith(f"error: interrupted by {sig.name}"), err
    for part in (tmp_path / "ds").glob("part-*.parquet"):  # whatever finished is whole
        pq.read_table(part)
