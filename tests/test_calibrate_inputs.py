"""Bad input to `kvsim validate --scenario` specs and `kvsim calibrate`: one line naming the key, the value
and what is allowed, exit 2, before any calibration starts."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.validate import load_spec
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "scenarios" / "validate-cpu.yaml").read_text())
TABLES = REPO / "calibration" / "data" / "gpu-kernels"


def kvsim(*args, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def _spec(tmp_path, change) -> Path:
    import copy

    s = copy.deepcopy(BASE)
    change(s)
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(s))
    return p


CASES = [
    (lambda s: s.update(allocators=[]), r"^validate\.allocators: got \[\]; a non-empty list"),
    (lambda s: s.update(allocators=["paged", "paged"]), r"^validate\.allocators: .*distinct"),
    (lambda s: s["kv"].update(num_blocks=0), r"^validate\.kv\.num_blocks: got 0; an integer >= 1"),
    (lambda s: s["kv"].update(block_size="x"), r"^validate\.kv\.block_size: got 'x'"),
    (lambda s: s["loads"][0].update(utilization="lots"), r"^validate\.loads\[0\]\.utilization: got 'lots'; a finite"),
    (lambda s: s["loads"][0].update(utilization=-0.3), r"^validate\.loads\[0\]\.utilization: got -0\.3"),
    (lambda s: s["loads"][1].update(rate=0, utilization=None) or s["loads"][1].pop("utilization"), r"loads\[1\]\.rate"),
    (lambda s: s.update(loads=[]), r"^validate\.loads: got \[\]; a non-empty list"),
    (lambda s: s["loads"].append({"name": "light", "rate": 1}), r"^validate\.loads\[3\]\.name: got 'light'"),
    (lambda s: s["quick"].update(loads=["nosuchload"]), r"^validate\.quick\.loads: got 'nosuchload'; a name in loads"),
    (lambda s: s["quick"].update(loads=[]), r"^validate\.quick\.loads: got \[\]"),
    (lambda s: s["quick"].update(allocators=[]), r"^validate\.quick\.allocators: got \[\]"),
    (lambda s: s["quick"].update(num_requests=0), r"^validate\.quick\.num_requests: got 0"),
    (lambda s: s.update(static_reserve=10), r"^validate\.static_reserve: got 10; at least .*\(480\)"),
    (lambda s: s.update(static_reserve=5000), r"^validate\.static_reserve: got 5000; at most"),
    (lambda s: s["workload"].update(max_model_len=100), r"^validate\.workload\.max_model_len: got 100; at least"),
    (
        lambda s: s["workload"]["lengths"].update(prompt_min=400, prompt_max=16),
        r"^validate\.workload\.lengths\.prompt_min: got 400",
    ),
    (lambda s: s["workload"].update(num_requests=0), r"^validate\.workload\.num_requests: got 0"),
    (lambda s: s["scheduler"].update(max_num_seqs=0), r"^validate\.scheduler\.max_num_seqs: got 0"),
    (lambda s: s["scheduler"].update(max_seqs=4), r"^validate\.scheduler\.max_seqs: got 4; unknown key"),
    (lambda s: s["engine"].update(dtype="fp16"), r"^validate\.engine\.dtype: got 'fp16'; one of fp32, bf16"),
    (lambda s: s["engine"].update(threads=0), r"^validate\.engine\.threads: got 0"),
    (lambda s: s.update(host_speed="guess"), r"^validate\.host_speed: got 'guess'; one of probe, fixed"),
    (lambda s: s.update(kind="scenario"), r"^validate\.kind: got 'scenario'; validation"),
    (lambda s: s.update(kv=5), r"^validate\.kv: got 5; a mapping"),
]


@pytest.mark.parametrize("change,match", CASES)
def test_bad_spec_values_name_the_spec_key(tmp_path, change, match):
    p = _spec(tmp_path, change)
    for quick in (False, True):
        with pytest.raises(ConfigError, match=match):
            load_spec(p, quick=quick)


def test_good_specs_still_load():
    for name in ("validate-cpu", "validate-cuda"):
        for quick in (False, True):
            assert load_spec(name, quick=quick).loads


def test_default_quick_loads_only_checked_when_used(tmp_path):
    # quick.loads defaults to [medium]: a spec with other load names is fine until --quick uses it
    p = tmp_path / "spec.yaml"
    p.write_text("loads: [{name: busy, utilization: 0.9}]\n")
    assert [ld.name for ld in load_spec(p).loads] == ["busy"]
    with pytest.raises(ConfigError, match=r"validate\.quick\.loads: got 'medium'; a name in loads: busy"):
        load_spec(p, quick=True)


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}\n"])
def test_empty_spec_refused(tmp_path, text):
    p = tmp_path / "empty.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"validate\.scenario: .*non-empty validation spec"):
        load_spec(p)


def test_validate_bad_spec_is_one_line_before_calibration(tmp_path):
    p = _spec(tmp_path, lambda s: s.update(allocators=[]))
    r = kvsim("validate", "--device", "cpu", "--quick", "--scenario", str(p), "--out", str(tmp_path / "v"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: validate.allocators: got []; a non-empty list of distinct paged, static"
    assert not (tmp_path / "v").exists()


def test_validate_default_spec_works_from_another_folder(tmp_path):
    # --device cuda refuses validate-cpu's cpu clocks before anything runs: the spec itself was found
    r = kvsim("validate", "--device", "cuda", "--quick", "--out", str(tmp_path / "v"), cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("error: validate.engine.clocks:"), r.stderr


def test_validate_device_error_names_validate(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    r = kvsim(
        "validate",
        "--device",
        "cuda",
        "--quick",
        "--scenario",
        "validate-cuda",
        "--out",
        str(tmp_path / "v"),
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: validate.device: got 'cuda'"), r.stderr


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["--from-tables", str(TABLES), "--system", "h100_sxm", "--model", "llama-3.1-8b", "--tp", "0"],
            "error: calibrate.tp: got 0; one of 1, 2, 4, 8",
        ),
        (
            ["--from-tables", str(TABLES), "--system", "h100_sxm", "--model", "llama-3.1-8b", "--tp", "16"],
            "error: calibrate.tp: got 16; one of 1, 2, 4, 8",
        ),
        (
            ["--device", "cpu", "--model", "tiny-llama", "--quick", "--tp", "2"],
            "error: calibrate.tp: got 2; 1 with --device",
        ),
        (
            ["--from-tables", str(TABLES), "--device", "cpu", "--model", "tiny-llama"],
            "error: calibrate.device: got 'cpu'; not with --from-tables: the two options cannot be combined",
        ),
        (["--model", "tiny-llama"], "error: calibrate.device: got None; --device cpu|cuda, or --from-tables DIR"),
    ],
)
def test_calibrate_bad_options(tmp_path, args, line):
    r = kvsim("calibrate", *args, "--out", str(tmp_path / "p.json"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(line), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("side", ["p.measurements.parquet", "p.report.html"])
def test_calibrate_sidecar_folder_refused_up_front(tmp_path, side):
    (tmp_path / side).mkdir()
    r = kvsim(
        "calibrate",
        "--device",
        "cpu",
        "--model",
        "tiny-llama",
        "--quick",
        "--out",
        str(tmp_path / "p.json"),
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        f"error: --out: got '{tmp_path / side}'; a file path (this is a folder): the "
        f"{'raw timings' if 'parquet' in side else 'fit report'} written next to --out {tmp_path / 'p.json'}"
    )
    assert not (tmp_path / "p.json").exists()
