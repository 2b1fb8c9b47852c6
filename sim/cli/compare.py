"""``kvsim compare RESULT...``: replay serving benchmarks in the simulator (registered in :mod:`sim.cli.main`).

Exit status: 0 compared; 2 bad input (a malformed result file, an unknown model, a bad override).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from sim.cli.sweep import fail, stdout_console
from sim.errors import ConfigError


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def print_comparison(doc: dict) -> None:
    from rich.table import Table

    from sim.analysis.bench_compare import METRICS, THROUGHPUTS

    sim = doc["simulation"]
    cal = "" if sim["cost_model_calibrated"] else " (UNCALIBRATED roofline prior)"
    req = doc["requests"]
    t = Table(
        title=f"kvsim compare: {Path(doc['file']).name}\n{sim['model']} on {sim['gpu']} TP{sim['tensor_parallel']}, "
        f"engine {sim['engine']}, cost model {sim['cost_model']}{cal}\n{req['simulated']} requests "
        f"({req['failed_left_out']} failed in the file, left out); arrivals: {doc['arrival']}"
    )
    for c in ("metric", "stat", "measured", "simulated", "rel error"):
        t.add_column(c, justify="left" if c in ("metric", "stat") else "right")
    labels = dict(METRICS) | dict(THROUGHPUTS)
    last = None
    for r in doc["rows"]:
        label = labels[r["metric"]] if r["metric"] != last else ""
        if r["metric"] != last and last is not None and r["stat"] in ("mean", "-") and last in dict(METRICS):
            t.add_section()
        last = r["metric"]
        t.add_row(label, r["stat"], _ms(r["measured"]), _ms(r["simulated"]), _pct(r["rel_error"]))
    stdout_console().print(t)


def compare_command(
    results: list[Path] = typer.Argument(
        ..., help="Result JSON files of vllm bench serve --save-result --save-detailed, or folders of them."
    ),
    engine: str = typer.Option("vllm", "--engine", help="Serving engine preset: vllm, sglang, trtllm, reference."),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Catalog model or Hugging Face config.json (path or shipped id); default: the file's model_id.",
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name (kvsim list gpus); default H100-SXM-80GB."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree (1, 2, 4, 8)."),
    profile: str | None = typer.Option(
        None, "--profile", help="Cost-model profile (name or JSON); default: the GPU's."
    ),
    set_: list[str] | None = typer.Option(None, "--set", "-s", help="Override a scenario key: dotted.path=value."),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulation (and of Poisson/gamma send times)."),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Each file's simulation goes to RUNS/compare-<file name>/."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write every comparison into this JSON file."),
):
    """Simulate the requests of serving-benchmark results with the same arrivals; measured vs simulated latencies."""
    from sim.analysis.bench_compare import compare_result, run_name
    from sim.analysis.bench_results import read_bench_result, result_files
    from sim.config import parse_override
    from sim.engine_presets import ENGINE_KINDS

    try:
        if engine not in ENGINE_KINDS:
            raise ConfigError("--engine", engine, f"one of {', '.join(ENGINE_KINDS)}")
        overrides = dict(parse_override(i) for i in set_ or [])
        files = result_files(list(results))
        parsed = [read_bench_result(f) for f in files]  # every file checked before any simulation
        docs = []
        used: set[str] = set()
        for res in parsed:
            name = run_name(res)
            while name in used:  # files of the same name from different folders
                name += "+"
            used.add(name)
            run_dir = runs / name
            doc = compare_result(
                res,
                run_dir,
                engine=engine,
                model=model,
                gpu=gpu,
                tp=tp,
                profile=profile,
                overrides=overrides,
                seed=seed,
            )
            (run_dir / "compare.json").write_text(json.dumps(doc, indent=1) + "\n")
            docs.append(doc)
            print_comparison(doc)
            for w in doc["warnings"]:
                sys.stderr.write(f"warning: {res.name}: {w}\n")
            stdout_console().print(f"wrote {run_dir}/ (compare.json, scenario.yaml, requests.parquet, ...)")
    except ConfigError as exc:
        fail(exc)
    if out is not None:
        from sim import __version__

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"kvsim_version": __version__, "comparisons": docs}, indent=1) + "\n")
        stdout_console().print(f"wrote {out}")
