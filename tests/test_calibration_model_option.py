"""``kvsim calibrate --model`` and ``kvsim profile diff --model`` take what ``kvsim run --model`` takes:
a catalog name, a Hugging Face config.json path (or a folder holding one), or a shipped config's id
(``Qwen/Qwen3-32B``, and ids naming a shape kvsim has: ``meta-llama/Llama-3.1-8B-Instruct``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.profile_diff import gemm_rows
from sim.cli.main import app
from sim.hf_config import MODELS_DIR

REPO = Path(__file__).resolve().parents[1]
TABLES = REPO / "calibration" / "data" / "gpu-kernels"
LLAMA_8B_CONFIG = MODELS_DIR / "meta-llama--Meta-Llama-3.1-8B_config.json"


def kvsim(*args, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A folder holding a Hugging Face config.json (Llama-3.1-8B's shape), as a user downloads it."""
    folder = tmp_path / "my-llama"
    folder.mkdir()
    shutil.copy(LLAMA_8B_CONFIG, folder / "config.json")
    return folder


def _rows(output: str) -> list[str]:
    """The table rows of ``kvsim profile diff`` (the lines after its header)."""
    return output.splitlines()[2:]


@pytest.mark.parametrize(
    "model,label",
    [
        (
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct (llama-3.1-8b)",
        ),  # an id of a catalog shape
        ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"),  # a shipped config's id
        ("config.json", "my-llama"),  # a config.json path (relative to the working directory)
        ("folder", "my-llama"),  # a folder holding one
    ],
)
def test_profile_diff_model_takes_what_run_takes(config_dir, monkeypatch, model, label):
    monkeypatch.chdir(config_dir.parent)
    arg = {"config.json": "my-llama/config.json", "folder": str(config_dir)}.get(model, model)
    runner = CliRunner()
    ref = runner.invoke(app, ["profile", "diff", "h100-sxm", "h200-sxm", "--model", "llama-3.1-8b"])
    r = runner.invoke(app, ["profile", "diff", "h100-sxm", "h200-sxm", "--model", arg])
    assert r.exit_code == 0, r.output + str(r.exception)
    assert label in r.output.splitlines()[0]
    # the same shape as the catalog's llama-3.1-8b: the same GEMM prices
    assert _rows(r.output) == _rows(ref.output) and len(_rows(r.output)) > 30


def test_profile_diff_json_and_library_take_a_shipped_id():
    runner = CliRunner()
    r = runner.invoke(app, ["profile", "diff", "h100-sxm", "h200-sxm", "--model", "Qwen/Qwen3-32B", "--json"])
    assert r.exit_code == 0, r.output + str(r.exception)
    doc = json.loads(r.output)
    assert doc["model"] == "Qwen/Qwen3-32B"
    assert doc["rows"] == [x.__dict__ for x in gemm_rows("h100-sxm", "h200-sxm", "qwen3-32b")]
    assert gemm_rows("h100-sxm", "h200-sxm", "Qwen/Qwen3-32B") == gemm_rows("h100-sxm", "h200-sxm", "qwen3-32b")


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "config.json"])
def test_calibrate_from_tables_model_takes_what_run_takes(config_dir, tmp_path, model):
    arg = str(config_dir / "config.json") if model == "config.json" else model
    out = tmp_path / "p.json"
    args = ["calibrate", "--from-tables", str(TABLES), "--system", "h100_sxm", "--tp", "1", "--tp", "2"]
    r = CliRunner().invoke(app, [*args, "--model", arg, "--out", str(out)])
    assert r.exit_code == 0, r.output + str(r.exception)
    name = "llama-3.1-8b" if model != "config.json" else "my-llama"  # a config.json is named after its folder
    models = json.loads(out.read_text())["models"]
    assert sorted(models) == [f"{name}@tp1", f"{name}@tp2"]
    assert models[f"{name}@tp2"]["heads"] == 32 and models[f"{name}@tp2"]["kv_heads"] == 8
    assert f"models {name}@tp1, {name}@tp2" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["profile", "diff", "h100-sxm", "h200-sxm"],
        ["calibrate", "--from-tables", str(TABLES), "--system", "h100_sxm", "--tp", "1"],
        ["calibrate", "--device", "cpu", "--quick"],
    ],
)
@pytest.mark.parametrize("model", ["no-such-org/No-Such-Model-7B", "no/such/config.json", ""])
def test_an_unknown_model_is_one_line_naming_the_option(tmp_path, args, model):
    out = tmp_path / "p.json"
    extra = ["--out", str(out)] if args[0] == "calibrate" else []
    r = kvsim(*args, "--model", model, *extra, cwd=tmp_path, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(
        f"error: --model: got {model!r}; a catalog model (kvsim list models), a Hugging Face config.json path "
        "or a folder holding one, or a shipped config's id such as Qwen/Qwen3-32B; catalog models: "
    ), r.stderr
    assert "llama-3.1-8b" in r.stderr and "tiny-llama" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_help_says_what_model_takes():
    import typer

    root = typer.main.get_command(app)
    ctx = root.make_context("kvsim", ["list", "models"])
    commands = (root.get_command(ctx, "calibrate"), root.get_command(ctx, "profile").get_command(ctx, "diff"))
    for cmd in commands:
        (opt,) = [p for p in cmd.params if "--model" in p.opts]
        assert "Hugging Face config.json path" in opt.help and "meta-llama/Llama-3.1-8B-Instruct" in opt.help
