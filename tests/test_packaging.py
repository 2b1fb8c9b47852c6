"""kvsim installs as a wheel that runs outside a checkout.

The wheel is built from a copy of the files git tracks (plus new, not ignored ones), so a file
that only exists in this working tree, or a stale ``build/`` folder, cannot make it pass. It
is installed without dependencies into a fresh virtualenv that borrows this environment's
site-packages for them (nothing is downloaded), and ``kvsim run chat-api`` runs from a
temporary directory: scenarios, traces, profiles, the guide's situations and the calibration
tables must all come from the installed package.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import tomllib

import sim

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.wheel


def _listed_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_is_listed_in_pyproject():
    # The list is explicit because sim.scenarios is mapped from scenarios/ (see pyproject.toml).
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("sim", "calibration")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found | {"sim.scenarios"} == _listed_packages()


def _checkout_copy(dest: Path) -> Path:
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():  # a file deleted but not yet staged is listed too
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh virtualenv with the wheel installed: its python, kvsim and the build's timings."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files are tracked")
    tmp = tmp_path_factory.mktemp("wheel")
    t0 = time.perf_counter()
    src = _checkout_copy(tmp / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVSIM_NATIVE")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(tmp / "dist"),
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    wheel = next((tmp / "dist").glob("kvsim-*.whl"))
    t_build = time.perf_counter() - t0
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # Dependencies from this environment, after the venv's own site-packages (which will hold kvsim).
    # A plain path line: the .pth files there (this checkout's editable install) are not run.
    deps = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    (purelib / "zz-test-deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        env=env,
    )
    return {
        "python": py,
        "kvsim": venv / "bin" / "kvsim",
        "wheel": wheel,
        "env": env,
        "cwd": tmp / "elsewhere",
        "build_s": t_build,
        "install_s": time.perf_counter() - t0 - t_build,
    }


def _run(installed: dict, *args: str) -> subprocess.CompletedProcess:
    installed["cwd"].mkdir(exist_ok=True)
    return subprocess.run(
        [str(a) for a in args], cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=300
    )


def test_wheel_holds_the_data(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for f in (
        "sim/scenarios/chat-api.yaml",
        "sim/scenarios/traces/AzureLLMInferenceTrace_conv.csv",
        "sim/scenarios/traces/SOURCES.md",
        "sim/scenarios/guide/long-context.yaml",
        "sim/scenarios/models/Qwen--Qwen3-32B_config.json",
        "sim/scenarios/models/LICENSE",
        "sim/profiles/h100-sxm.json",
        "calibration/data/gpu-kernels/h100_sxm/system.yaml",
        "calibration/data/gpu-kernels/LICENSE",
        "calibration/data/vidur-profiles/historical/a100/cpu_overheads.csv",
    ):
        assert f in names, f
    assert not [n for n in names if n.endswith(".so")], "the wheel is pure Python: no locally compiled hot path"


def test_installed_kvsim_runs_chat_api_outside_the_checkout(installed):
    where = _run(
        installed,
        installed["python"],
        "-c",
        "import sim, sim.config as c, calibration.tables as t; "
        "print(sim.__file__); print(c.SCENARIO_DIR); print(t.DEFAULT_TABLES_DIR)",
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert not Path(line).is_relative_to(ROOT), f"imported from the checkout: {line}"

    version = _run(installed, installed["kvsim"], "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"kvsim {sim.__version__}", version

    run = _run(installed, installed["kvsim"], "run", "chat-api", "--quiet", "--out", "out")
    assert run.returncode == 0, run.stderr
    s = json.loads((installed["cwd"] / "out" / "summary.json").read_text())
    assert s["scenario"] == "chat-api" and s["requests"] == 2000 and s["completed"] > 0
    assert s["kvsim_version"] == sim.__version__
    prof = json.loads((ROOT / "sim" / "profiles" / f"{s['cost_model']}.json").read_text())["provenance"]
    block = s["cost_model_profile"]
    assert {k: block[k] for k in ("name", "date", "source")} == {
        "name": s["cost_model"],
        "date": prof["date"],
        "source": prof["source"],
    }
    # The installed built-in profile, named by kind (no installation path) and told apart by its bytes' hash.
    assert block["kind"] == "builtin" and block["path"] is None and len(block["sha256"]) == 16

    # A trace scenario (its trace resolved from the package) and the other packaged data.
    trace = _run(
        installed,
        installed["kvsim"],
        "run",
        "azure-conv-replay",
        "--set",
        "workload.num_requests=30",
        "--quiet",
        "--out",
        "trace",
    )
    assert trace.returncode == 0, trace.stderr
    # A shipped Hugging Face config, by its id, from the package.
    moe = _run(
        installed,
        installed["kvsim"],
        "run",
        "chat-api",
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "--set",
        "workload.num_requests=30",
        "--quiet",
        "--out",
        "moe",
    )
    assert moe.returncode == 0, moe.stderr
    data = _run(
        installed,
        installed["python"],
        "-c",
        "from calibration.tables import list_systems; "
        "from sim.analysis.guide import situations; print(list_systems(), len(situations()))",
    )
    assert data.returncode == 0, data.stderr
    assert "h100_sxm" in data.stdout and data.stdout.split()[-1] == "13", data.stdout
